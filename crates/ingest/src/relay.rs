//! The outbox relay: publishes due outbox rows to RabbitMQ with publisher confirms and
//! deletes each row only after its confirm. Wakes on `LISTEN notify_outbox`, at the due
//! time of the next row written for later (retries, deferrals), and polls as a fallback, and runs safely in any number of ingest replicas (claims use SKIP LOCKED).

use notify_broker::{DeliveryMessage, PublishOutcome, Publisher, Topology};
use notify_core::Channel;
use notify_store::PgPool;
use notify_store::outbox;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Relay settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// AMQP URL.
    pub amqp_url: String,
    /// Exchange and queue names.
    pub topology: Topology,
    /// Rows claimed and published per round.
    pub batch: i64,
    /// Poll interval when no notification arrives.
    pub poll: Duration,
    /// How long claimed rows are hidden from other relays while being published.
    pub hold: Duration,
    /// Longest wait for a batch's confirms.
    pub confirm_timeout: Duration,
    /// Delay before a failed publish is tried again.
    pub retry_in: Duration,
}

/// Counters of the relay, for logs and tests.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Messages confirmed by the broker.
    pub published: AtomicU64,
    /// Messages the broker returned as unroutable.
    pub unroutable: AtomicU64,
    /// Messages nacked or with an unknown outcome.
    pub failed: AtomicU64,
    /// Whether the relay holds a broker connection now (readiness).
    pub connected: std::sync::atomic::AtomicBool,
}

/// Runs the relay until `shutdown`; reconnects to the broker after failures.
pub async fn run(
    pool: PgPool,
    cfg: RelayConfig,
    stats: Arc<RelayStats>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(200);
    while !shutdown.is_cancelled() {
        let result = run_connected(&pool, &cfg, &stats, &shutdown).await;
        stats.connected.store(false, Ordering::SeqCst);
        match result {
            Ok(()) => return,
            Err(e) => {
                error!(error = %e, retry_in_ms = backoff.as_millis() as u64, "relay failed; reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

async fn run_connected(
    pool: &PgPool,
    cfg: &RelayConfig,
    stats: &RelayStats,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let conn = notify_broker::connect(&cfg.amqp_url, "ingest-relay").await?;
    let setup = conn.create_channel().await?;
    // Webhook messages share the outbox (channel `webhook`) and so the exchange.
    let mut names: Vec<&str> = Channel::ALL.iter().map(|c| c.as_str()).collect();
    names.push(notify_store::webhooks::OUTBOX_CHANNEL);
    cfg.topology.declare(&setup, &names).await?;
    let _ = setup.close(200, "topology declared".into()).await;
    let publisher = Publisher::new(&conn, &cfg.topology, cfg.confirm_timeout).await?;
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen("notify_outbox").await?;
    info!("relay connected");
    stats.connected.store(true, Ordering::SeqCst);
    loop {
        if shutdown.is_cancelled() {
            let _ = conn.close(200, "ingest stopping".into()).await;
            return Ok(());
        }
        let rows = outbox::claim_due(pool, cfg.batch, cfg.hold).await?;
        if rows.is_empty() {
            // Sleep until the next row is due (a retry written by a worker is announced
            // when written, but due later), a new row is announced, or the poll interval.
            let wait = outbox::next_due_in(pool)
                .await?
                .map_or(cfg.poll, |d| d.min(cfg.poll));
            tokio::select! {
                _ = shutdown.cancelled() => {}
                n = listener.recv() => { n?; }
                _ = tokio::time::sleep(wait) => {}
            }
            continue;
        }
        let messages: Vec<DeliveryMessage> = rows
            .iter()
            .map(|r| DeliveryMessage {
                v: 1,
                delivery_id: r.delivery_id,
                channel: r.channel.clone(),
            })
            .collect();
        // One producer span per message, a child of the event's stored trace context;
        // its own context travels in the message headers to the worker.
        let spans: Vec<tracing::Span> = rows.iter().map(|r| producer_span(cfg, r)).collect();
        let headers: Vec<_> = spans
            .iter()
            .map(notify_telemetry::propagation::headers_of)
            .collect();
        let outcomes = publisher
            .publish_batch_with_headers(&messages, &headers)
            .await;
        for (span, outcome) in spans.iter().zip(&outcomes) {
            if *outcome != PublishOutcome::Confirmed {
                span.record("otel.status_code", "ERROR");
                span.record("notify.publish_outcome", format!("{outcome:?}"));
            }
        }
        drop(spans);
        let mut done = Vec::new();
        let mut unroutable = Vec::new();
        let mut failed = Vec::new();
        let mut last_error = String::new();
        for (row, outcome) in rows.iter().zip(outcomes) {
            match outcome {
                PublishOutcome::Confirmed => done.push(row.id),
                PublishOutcome::Unroutable => unroutable.push(row.id),
                PublishOutcome::Nacked => {
                    last_error = "nacked by broker".into();
                    failed.push(row.id)
                }
                PublishOutcome::Unknown(e) => {
                    last_error = e;
                    failed.push(row.id)
                }
            }
        }
        outbox::delete(pool, &done).await?;
        stats
            .published
            .fetch_add(done.len() as u64, Ordering::Relaxed);
        if !unroutable.is_empty() {
            stats
                .unroutable
                .fetch_add(unroutable.len() as u64, Ordering::Relaxed);
            error!(
                count = unroutable.len(),
                "unroutable: no queue bound for the routing key; kept in the outbox"
            );
            outbox::publish_failed(pool, &unroutable, "unroutable", cfg.retry_in).await?;
        }
        if !failed.is_empty() {
            stats
                .failed
                .fetch_add(failed.len() as u64, Ordering::Relaxed);
            warn!(count = failed.len(), error = %last_error, "publish not confirmed; kept in the outbox");
            outbox::publish_failed(pool, &failed, &last_error, cfg.retry_in).await?;
            if !publisher.is_healthy() {
                anyhow::bail!("publisher channel closed: {last_error}");
            }
        }
    }
}

/// The producer span of one publish (OpenTelemetry messaging semantic conventions:
/// `messaging.system = rabbitmq`, operation `publish`).
fn producer_span(cfg: &RelayConfig, row: &outbox::OutboxRow) -> tracing::Span {
    let queue = cfg.topology.queue(&row.channel);
    let span = tracing::info_span!(
        "publish",
        otel.name = %format!("{queue} publish"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "rabbitmq",
        messaging.operation.type = "publish",
        messaging.operation.name = "publish",
        messaging.destination.name = %queue,
        messaging.rabbitmq.destination.routing_key = %row.channel,
        messaging.message.id = %row.delivery_id,
        notify.delivery_id = %row.delivery_id,
        notify.event_id = tracing::field::Empty,
        notify.channel = %row.channel,
        notify.publish_outcome = tracing::field::Empty,
    );
    if let Some(id) = row.event_id {
        span.record("notify.event_id", tracing::field::display(id));
    }
    notify_telemetry::propagation::continue_trace(&span, row.trace_context.as_deref(), None);
    span
}
