//! `worker-webhook`: delivers status webhooks to callers' endpoints, at least once.
//!
//! Consumes `deliveries.webhook` (the relay publishes the outbox rows of channel
//! `webhook` that [`notify_store::webhooks::enqueue_for_deliveries`] writes with each
//! delivery state change). Per message: claim with a lease (no database connection held
//! after it) -> signed POST ([`post`]: Standard Webhooks headers, no redirects, the
//! timeout, public addresses only) -> record the attempt fenced by the lease, with a retry
//! due after a growing, capped delay (`notify_core::retry`), or the endpoint disabled when
//! it has failed for longer than `NOTIFY_WEBHOOK_DISABLE_AFTER` -> ack. An endpoint has at
//! most `NOTIFY_WEBHOOK_ENDPOINT_CONCURRENCY` POSTs in flight per worker; a message for a
//! busy endpoint is given back for a second, so a hanging endpoint takes a bounded share
//! of the worker. A sweeper task returns messages whose worker died mid-POST.

pub mod post;

use notify_broker::{DeliveryMessage, Inbound};
use notify_core::RetryPolicy;
use notify_core::config::Env;
use notify_core::links::LinkPolicy;
use notify_store::PgPool;
use notify_store::webhooks::{self as store, ClaimedMessage, MessageNext, Recorded};
use opentelemetry::KeyValue;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};
use uuid::Uuid;

/// Settings of the webhook worker (environment variables in brackets).
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Broker, queue prefix, concurrency (`NOTIFY_WORKER_CONCURRENCY`), lease
    /// (`NOTIFY_LEASE`), shutdown grace, link policy (`NOTIFY_DEV_HTTP_HOSTS`): the
    /// runtime settings every worker reads.
    pub worker: notify_worker::WorkerConfig,
    /// Total time of one POST, connect included (`NOTIFY_WEBHOOK_TIMEOUT`, 5 s; 1 s to
    /// 10 min).
    pub timeout: Duration,
    /// Continuous failure after which an endpoint is disabled
    /// (`NOTIFY_WEBHOOK_DISABLE_AFTER`, 5 days; at least 1 min).
    pub disable_after: Duration,
    /// Delays between attempts and the attempt cap (`NOTIFY_WEBHOOK_RETRY_DELAYS`, 5 s,
    /// 5 min, 30 min, 2 h, 5 h, 10 h (then 10 h), each at least 1 s; `NOTIFY_WEBHOOK_MAX_ATTEMPTS`, 20: more
    /// than five days of attempts, so the disable comes first).
    pub retry: RetryPolicy,
    /// POSTs in flight per endpoint per worker (`NOTIFY_WEBHOOK_ENDPOINT_CONCURRENCY`, 4).
    pub endpoint_concurrency: usize,
    /// How often expired leases are swept (`NOTIFY_WEBHOOK_SWEEP_EVERY`, 10 s).
    pub sweep_every: Duration,
    /// A pending message due this long with no outbox row is published again
    /// (`NOTIFY_REPUBLISH_AFTER`, 5 min, as for deliveries).
    pub republish_after: Duration,
}

/// Svix's schedule, shortened at the end (docs.svix.com/retries): 5 s, 5 min, 30 min,
/// 2 h, 5 h, 10 h.
pub const DEFAULT_RETRY_DELAYS: &str = "5s,5m,30m,2h,5h,10h";

/// Bounds of `NOTIFY_WEBHOOK_TIMEOUT`: 1 s to 10 min (as `NOTIFY_SMTP_TIMEOUT`).
pub const TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));

/// Shortest entry of `NOTIFY_WEBHOOK_RETRY_DELAYS`: 1 s, the rule of every retry schedule
/// ([`notify_core::retry::parse_retry_delays`]).
pub const MIN_RETRY_DELAY: Duration = notify_core::retry::MIN_RETRY_DELAY;

/// Shortest `NOTIFY_WEBHOOK_DISABLE_AFTER`: 1 min. Shorter, an endpoint that is down for
/// a restart (or one slow POST plus a retry) is disabled, and only an operator re-enables
/// it.
pub const MIN_DISABLE_AFTER: Duration = Duration::from_secs(60);

impl WebhookConfig {
    /// Reads the settings; every problem is recorded in `env`. `None` when a required one
    /// is missing.
    pub fn from_env(env: &mut Env) -> Option<Self> {
        let worker = notify_worker::WorkerConfig::from_env(env).ok();
        let dur = |s: &str| notify_core::retry::parse_duration(s).map_err(|e| e.to_string());
        // Each delay at least 1 s: a 0 s delay retries a failing endpoint in a tight loop.
        let durs = notify_core::retry::parse_retry_delays;
        // As NOTIFY_SMTP_TIMEOUT: a timeout of 0 fails every POST, one of 11 min holds
        // a lease and a per-endpoint slot for longer than any receiver needs.
        let timeout = env.duration(
            "NOTIFY_WEBHOOK_TIMEOUT",
            Duration::from_secs(5),
            TIMEOUT_RANGE.0,
            TIMEOUT_RANGE.1,
        );
        let disable_after = env.duration(
            "NOTIFY_WEBHOOK_DISABLE_AFTER",
            Duration::from_secs(5 * 86_400),
            MIN_DISABLE_AFTER,
            notify_core::retry::MAX_DURATION,
        );
        let delays = env.parse_with(
            "NOTIFY_WEBHOOK_RETRY_DELAYS",
            notify_core::retry::parse_durations(DEFAULT_RETRY_DELAYS).expect("valid defaults"),
            durs,
        );
        let max_attempts = env.number("NOTIFY_WEBHOOK_MAX_ATTEMPTS", 20, 1, 1000) as u32;
        let endpoint_concurrency =
            env.number("NOTIFY_WEBHOOK_ENDPOINT_CONCURRENCY", 4, 1, 1000) as usize;
        let sweep_every =
            env.parse_with("NOTIFY_WEBHOOK_SWEEP_EVERY", Duration::from_secs(10), dur);
        let republish_after =
            env.parse_with("NOTIFY_REPUBLISH_AFTER", Duration::from_secs(300), dur);
        let worker = worker?;
        if worker.lease <= timeout + Duration::from_secs(2) {
            env.error("NOTIFY_LEASE must be longer than NOTIFY_WEBHOOK_TIMEOUT plus 2s");
        }
        Some(Self {
            worker,
            timeout,
            disable_after,
            retry: RetryPolicy {
                delays,
                max_attempts,
                ..RetryPolicy::default()
            },
            endpoint_concurrency,
            sweep_every,
            republish_after,
        })
    }
}

/// Why the webhook worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The HTTP client could not be built (the TLS backend could not be set up).
    #[error("webhook HTTP client: {0}")]
    HttpClient(#[from] reqwest::Error),
    /// The consume runtime stopped with an error.
    #[error(transparent)]
    Worker(#[from] notify_worker::WorkerError),
}

/// What the tasks share.
struct Ctx {
    pool: PgPool,
    cfg: WebhookConfig,
    http: reqwest::Client,
    links: LinkPolicy,
    /// In-flight POSTs per endpoint.
    busy: Mutex<HashMap<Uuid, Arc<Semaphore>>>,
}

/// Runs until `shutdown`: the consumer of `deliveries.webhook` and the lease sweeper.
/// A lost broker connection is retried with backoff.
///
/// # Errors
/// [`WebhookError::HttpClient`]: the HTTP client could not be built.
pub async fn run(
    cfg: WebhookConfig,
    pool: PgPool,
    shutdown: CancellationToken,
) -> Result<(), WebhookError> {
    run_with_readiness(cfg, pool, notify_worker::Readiness::new(), shutdown).await
}

/// [`run`], telling `consuming` whether the consumer of `deliveries.webhook` is open
/// (false while connecting to RabbitMQ, after the connection is lost and while
/// draining), for `/readyz` as the channel workers do. The consumer is the channel
/// workers' runtime ([`notify_worker::serve`] on channel [`store::OUTBOX_CHANNEL`]).
///
/// # Errors
/// [`WebhookError::HttpClient`]: the HTTP client could not be built.
pub async fn run_with_readiness(
    cfg: WebhookConfig,
    pool: PgPool,
    consuming: notify_worker::Readiness,
    shutdown: CancellationToken,
) -> Result<(), WebhookError> {
    // Exported from the start at 0, so that the first disabled endpoint is an increase
    // (an alert on increase() does not see a series that appears at 1).
    notify_telemetry::metrics()
        .webhook_endpoints_disabled
        .add(0, &[]);
    let links = cfg.worker.links.clone();
    let ctx = Arc::new(Ctx {
        http: post::client(&links, cfg.timeout)?,
        links,
        pool,
        cfg,
        busy: Mutex::new(HashMap::new()),
    });
    let sweeper = tokio::spawn(sweep(ctx.clone(), shutdown.clone()));
    let worker = ctx.cfg.worker.clone();
    let served =
        notify_worker::serve(&worker, store::OUTBOX_CHANNEL, ctx, &consuming, &shutdown).await;
    let _ = sweeper.await;
    Ok(served?)
}

async fn sweep(ctx: Arc<Ctx>, shutdown: CancellationToken) {
    loop {
        match store::requeue_expired_messages(&ctx.pool, 500).await {
            Ok(0) => {}
            Ok(n) => warn!(
                recovered = n,
                "webhook messages whose worker was lost during the POST are due again"
            ),
            Err(e) => warn!(error = %e, "webhook lease sweep failed"),
        }
        match store::republish_stale_messages(&ctx.pool, ctx.cfg.republish_after, 500).await {
            Ok(0) => {}
            Ok(n) => warn!(
                republished = n,
                "pending webhook messages with no queued message were published again"
            ),
            Err(e) => warn!(error = %e, "webhook republish sweep failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(ctx.cfg.sweep_every) => {}
        }
    }
}

/// A webhook message names one message row (a version-1 pointer: the relay never
/// batches channel `webhook`), so it takes one permit.
impl notify_worker::Handler for Ctx {
    type Parsed = Option<DeliveryMessage>;

    fn parse(&self, msg: &Inbound) -> Option<DeliveryMessage> {
        DeliveryMessage::parse(msg.body())
    }

    /// One message from claim to settle. A database error leaves the message unacked for
    /// redelivery (nack + requeue); an unreadable one (not a version-1 pointer) goes to
    /// the dead-letter queue.
    async fn handle(
        self: Arc<Self>,
        m: Inbound,
        parsed: Option<DeliveryMessage>,
        _permit: OwnedSemaphorePermit,
        _stop: CancellationToken,
    ) {
        let Some(msg) = parsed else {
            warn!("unreadable webhook message; dead-lettered");
            m.reject().await;
            return;
        };
        match deliver(&self, msg.delivery_id).await {
            Ok(()) => m.ack().await,
            Err(e) if e.is_transient() => {
                warn!(error = %e, message_id = %msg.delivery_id, "database unavailable; message requeued");
                m.nack_requeue().await;
            }
            Err(e) => {
                error!(error = %e, message_id = %msg.delivery_id, "webhook message cannot be handled; dead-lettered");
                m.reject().await;
            }
        }
    }
}

async fn deliver(ctx: &Ctx, id: Uuid) -> notify_store::Result<()> {
    let Some(msg) = store::claim_message(&ctx.pool, id, ctx.cfg.worker.lease).await? else {
        // Missing (endpoint deleted), done, in flight elsewhere, or not due yet: the
        // message that brings it when due is its own outbox row.
        return Ok(());
    };
    if !msg.endpoint_enabled {
        let result = store::PostResult {
            error: Some("endpoint_disabled".into()),
            ..Default::default()
        };
        store::record_post(
            &ctx.pool,
            &msg,
            &result,
            MessageNext::Failed,
            ctx.cfg.disable_after,
        )
        .await?;
        return Ok(());
    }
    let sem = ctx
        .busy
        .lock()
        .expect("busy map")
        .entry(msg.endpoint_id)
        .or_insert_with(|| Arc::new(Semaphore::new(ctx.cfg.endpoint_concurrency)))
        .clone();
    let Ok(_slot) = sem.try_acquire_owned() else {
        store::release_busy(&ctx.pool, &msg, Duration::from_secs(1)).await?;
        return Ok(());
    };
    let result = post::post(&ctx.http, &ctx.links, &msg).await;
    let next = next_step(&ctx.cfg.retry, &msg, &result, rand::random::<f64>());
    let outcome = match next {
        MessageNext::Sent => "sent",
        MessageNext::Retry(_) => "retry",
        MessageNext::Failed => "failed",
    };
    let m = notify_telemetry::metrics();
    let label = [KeyValue::new("outcome", outcome)];
    m.webhook_attempts.add(1, &label);
    m.webhook_attempt_duration
        .record(result.latency.as_secs_f64(), &label);
    match store::record_post(&ctx.pool, &msg, &result, next, ctx.cfg.disable_after).await? {
        Recorded::LeaseLost => {
            warn!(message_id = %msg.id, "lease lost during the POST; nothing recorded");
        }
        Recorded::Written { endpoint_disabled } => {
            if endpoint_disabled {
                notify_telemetry::metrics()
                    .webhook_endpoints_disabled
                    .add(1, &[]);
                error!(
                    alert = "webhook_endpoint_disabled",
                    endpoint_id = %msg.endpoint_id,
                    url = %msg.url,
                    failing_for_s = ctx.cfg.disable_after.as_secs(),
                    last_error = result.error.as_deref().unwrap_or(""),
                    "webhook endpoint disabled: every attempt failed for longer than NOTIFY_WEBHOOK_DISABLE_AFTER"
                );
            }
        }
    }
    Ok(())
}

/// What follows a POST: 2xx sent; otherwise a retry after the schedule's delay for this
/// attempt (jitter in `[0, 1)`, a 429's `Retry-After` not read: Standard Webhooks leaves
/// it to the sender) while attempts remain, else failed.
pub fn next_step(
    retry: &RetryPolicy,
    msg: &ClaimedMessage,
    result: &store::PostResult,
    jitter: f64,
) -> MessageNext {
    if result.error.is_none() {
        return MessageNext::Sent;
    }
    let rate_limited = result.status_code == Some(429);
    match retry.next_delay(msg.attempt.max(0) as u32, None, rate_limited, jitter) {
        Some(d) => MessageNext::Retry(d),
        None => MessageNext::Failed,
    }
}

#[cfg(test)]
mod tests;
