//! The gauges sampler: backlog, age and pause gauges from Postgres and the dead-letter
//! queue's depth from RabbitMQ, for the metrics endpoint.

use crate::{IngestConfig, relay};
use notify_store::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Samples the gauges every `cfg.metrics_interval`: outbox size and age, pending
/// deliveries and the oldest due one per channel, paused channels, webhook messages
/// pending for over a minute (from Postgres) and the
/// dead-letter queue's depth (from RabbitMQ). Every replica samples the same values.
pub(crate) async fn sample_gauges(
    pool: PgPool,
    cfg: IngestConfig,
    relay: Arc<relay::RelayStats>,
    stop: CancellationToken,
) {
    use notify_core::Channel;
    use opentelemetry::KeyValue;
    let m = notify_telemetry::metrics();
    let mut amqp: Option<notify_broker::lapin::Connection> = None;
    loop {
        match notify_store::deliveries::gauges(&pool).await {
            Ok(g) => {
                m.outbox_messages.record(g.outbox_rows as u64, &[]);
                m.outbox_oldest_age.record(g.outbox_oldest_s, &[]);
                for c in Channel::ALL {
                    let label = [KeyValue::new("channel", c.as_str())];
                    let row = g.channels.iter().find(|r| r.channel == c);
                    m.deliveries_pending
                        .record(row.map_or(0, |r| r.pending as u64), &label);
                    m.oldest_pending_age
                        .record(row.map_or(0.0, |r| r.oldest_due_s), &label);
                    m.deliveries_scheduled
                        .record(row.map_or(0, |r| r.scheduled as u64), &label);
                    m.channel_paused
                        .record(u64::from(row.is_some_and(|r| r.paused)), &label);
                }
            }
            Err(e) => warn!(error = %e, "metrics: database gauges not sampled"),
        }
        match notify_store::webhooks::pending_backlog(&pool).await {
            Ok(n) => m.webhook_messages_pending.record(n.max(0) as u64, &[]),
            Err(e) => warn!(error = %e, "metrics: webhook backlog not sampled"),
        }
        // The relay declares the queues when it connects; before that the dead-letter
        // queue may not exist yet.
        let declared = relay.connected.load(std::sync::atomic::Ordering::SeqCst);
        if declared && amqp.as_ref().is_none_or(|c| !c.status().connected()) {
            amqp = notify_broker::connect(&cfg.relay.amqp_url, "ingest-metrics")
                .await
                .ok();
        }
        if let Some(conn) = &amqp {
            match notify_broker::dead_letter_depth(conn, &cfg.relay.topology).await {
                Ok(n) => m.dead_letter_messages.record(u64::from(n), &[]),
                Err(e) => warn!(error = %e, "metrics: dead-letter depth not sampled"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(cfg.metrics_interval) => {}
        }
    }
    if let Some(conn) = amqp {
        let _ = conn.close(200, "ingest stopping".into()).await;
    }
}
