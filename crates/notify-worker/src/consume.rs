//! The worker runtime shared by `worker-email`, `worker-push`, `worker-line` and
//! `worker-inapp`. A channel implements [`ChannelSender`]; the runtime does the rest:
//!
//! 1. consume the channel's queue with prefetch = concurrency and manual acks;
//! 2. claim the delivery row with a lease (database clock); a message whose delivery is
//!    already claimed, final or not due yet is acked without a provider call;
//! 3. call the provider with no transaction open, extending the lease while it runs; the
//!    adapter confirms the lease ([`Lease::confirm`]) at the call's point of no return and
//!    abandons a call whose lease is gone (nothing is written, the message is acked); the
//!    call has a total deadline ([`ChannelSender::call_deadline`]), after which it ends as
//!    an ambiguous `<provider>_timeout`, retried per policy;
//! 4. record the attempt and the new state in one transaction fenced by the lease token;
//! 5. ack only after that commit. Unparseable messages and messages naming a delivery that
//!    does not exist (or belongs to another channel) are rejected to the dead-letter queue.

pub mod batch;
pub mod http;
pub mod lease;
pub mod limit;
pub mod templates;

use batch::Batcher;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicRejectOptions,
};
use lapin::types::FieldTable;
use notify_broker::{DeliveryMessage, Topology, lapin};
use notify_core::outcome::{AttemptOutcome, AttemptResult, ErrorClass};
use notify_core::{Channel, RetryPolicy};
use notify_store::PgPool;
use notify_store::deliveries::{self, AttemptRecord, ClaimOutcome, DeliveryJob, NextState};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};

pub use lease::{Lease, LeaseLost};
pub use notify_store::deliveries::DeliveryJob as Job;

/// [`ChannelSender::call_deadline`] of a channel that does not state its own.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(30);

/// Whether this process's worker consumes from RabbitMQ now (for `/readyz`). One worker
/// runtime per process in production; in-process tests do not read it.
static CONSUMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One channel's provider adapter. It sorts every provider answer into an
/// [`AttemptOutcome`]; it never touches the delivery state itself.
pub trait ChannelSender: Send + Sync + 'static {
    /// The channel this sender serves (its queue is `deliveries.<channel>`).
    fn channel(&self) -> Channel;

    /// How long after a delivery's creation a retry may still start, if the provider limits
    /// it (LINE: a retry key is honoured for 24 hours). `None`: no limit beyond the policy.
    fn retry_horizon(&self) -> Option<Duration> {
        None
    }

    /// The total deadline of one [`ChannelSender::send`], from its start to the provider's
    /// final answer. The runtime ends a call still running then, as an ambiguous
    /// `<provider>_timeout` (the provider may have accepted it), retried per policy.
    /// Adapters enforce their own timeouts within it, so they can say which step hung.
    fn call_deadline(&self) -> Duration {
        DEFAULT_CALL_DEADLINE
    }

    /// Makes one provider call for `job` and reports what happened. Must not panic on
    /// provider errors. Right before its point of no return (SMTP `DATA`, writing the HTTP
    /// request, the inbox insert) it must call [`Lease::confirm`] on `lease` and, when
    /// that fails, make no call and return [`LeaseLost::outcome`].
    fn send(&self, job: &DeliveryJob, lease: &Lease)
    -> impl Future<Output = AttemptOutcome> + Send;
}

/// Settings of a worker process.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// AMQP URL.
    pub amqp_url: String,
    /// Names of exchanges and queues.
    pub topology: Topology,
    /// Deliveries worked on at once; also the consumer prefetch.
    pub concurrency: u16,
    /// Lease length; the lease is extended every third of it while a call runs.
    pub lease: Duration,
    /// Retry schedule for transient failures.
    pub retry: RetryPolicy,
    /// How long to wait for in-flight deliveries after shutdown was requested.
    pub shutdown_grace: Duration,
    /// This instance's name, recorded on every attempt.
    pub worker_id: String,
    /// Most provider calls per second of this process, per provider (`line`, `fcm`,
    /// `apns`, `webpush`, `smtp`, `inbox`); providers not named are not limited.
    pub rate_limits: std::collections::BTreeMap<String, u32>,
}

/// Default [`WorkerConfig::rate_limits`]: LINE allows 2,000 push requests a second per
/// channel (LINE Messaging API reference, rate limits), so one process takes half; FCM's
/// default quota is 600,000 messages a minute per project (10,000/s), so one process takes
/// half of that.
pub const DEFAULT_RATE_LIMITS: &str = "line=1000,fcm=5000";

/// Parses `provider=per_second,...` (e.g. `line=1000,fcm=5000`; empty = no limits).
pub fn parse_rate_limits(s: &str) -> Result<std::collections::BTreeMap<String, u32>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, n) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not provider=per_second"))?;
            match n.trim().parse::<u32>() {
                Ok(n) if n > 0 => Ok((name.trim().to_string(), n)),
                _ => Err(format!("{pair:?}: the rate must be a whole number above 0")),
            }
        })
        .collect()
}

impl WorkerConfig {
    /// Reads `NOTIFY_AMQP_URL` (required), `NOTIFY_AMQP_PREFIX` (""),
    /// `NOTIFY_WORKER_CONCURRENCY` (16), `NOTIFY_LEASE` (60s), `NOTIFY_RETRY_DELAYS`
    /// (30s,2m,10m,1h,6h), `NOTIFY_SHUTDOWN_GRACE` (30s), `NOTIFY_WORKER_ID` (`$HOSTNAME-pid`),
    /// `NOTIFY_RATE_LIMITS` ([`DEFAULT_RATE_LIMITS`]; calls per second per process). The attempt budget is the
    /// delivery's own `max_attempts`, set by ingest.
    pub fn from_env(env: &mut notify_telemetry::Env) -> Self {
        let dur = |s: &str| notify_core::retry::parse_duration(s).map_err(|e| e.to_string());
        let durs = |s: &str| notify_core::retry::parse_durations(s).map_err(|e| e.to_string());
        let amqp_url = env.url("NOTIFY_AMQP_URL", &["amqp", "amqps"]);
        let prefix = env.string("NOTIFY_AMQP_PREFIX", "");
        let concurrency = env.parse_with("NOTIFY_WORKER_CONCURRENCY", 16u16, |s| {
            match s.parse::<u16>() {
                Ok(n) if (1..=1000).contains(&n) => Ok(n),
                _ => Err("must be a whole number from 1 to 1000".into()),
            }
        });
        let lease = env.parse_with("NOTIFY_LEASE", Duration::from_secs(60), dur);
        if lease < Duration::from_secs(3) {
            env.error("NOTIFY_LEASE must be at least 3s");
        }
        let mut retry = RetryPolicy::default();
        retry.delays = env.parse_with("NOTIFY_RETRY_DELAYS", retry.delays.clone(), durs);
        let shutdown_grace = env.parse_with("NOTIFY_SHUTDOWN_GRACE", Duration::from_secs(30), dur);
        let default_id = format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into()),
            std::process::id()
        );
        let worker_id = env.string("NOTIFY_WORKER_ID", &default_id);
        let rate_limits = env.parse_with(
            "NOTIFY_RATE_LIMITS",
            parse_rate_limits(DEFAULT_RATE_LIMITS).expect("valid defaults"),
            parse_rate_limits,
        );
        Self {
            rate_limits,
            amqp_url,
            topology: Topology::new(prefix),
            concurrency,
            lease,
            retry,
            shutdown_grace,
            worker_id,
        }
    }
}

/// Errors that stop a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The broker could not be reached or the consumer failed.
    #[error(transparent)]
    Broker(#[from] notify_broker::BrokerError),
    /// AMQP error.
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
    /// The broker ended the consumer (channel or connection closed) without an error.
    #[error("the broker ended the consumer")]
    ConsumerEnded,
}

/// Runs a worker until `shutdown` is cancelled: consumes the channel's queue and sends
/// each delivery through `sender`. On shutdown it stops taking messages, lets the
/// deliveries in hand finish (up to the grace period), then closes the channel, which
/// returns unstarted prefetched messages to the queue.
///
/// A lost or refused broker connection is retried with backoff (up to 10 s between
/// tries) until shutdown; deliveries in hand when it dropped are still recorded, and their
/// messages, unacked, come back from the broker and are skipped by the claim.
pub async fn run<S: ChannelSender>(
    cfg: WorkerConfig,
    pool: PgPool,
    sender: Arc<S>,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    let mut backoff = Duration::from_millis(200);
    let db = DbBatches::start(&pool, sender.channel(), cfg.lease);
    let limits = Arc::new(limit::RateLimits::new(&cfg.rate_limits));
    let templates = Arc::new(templates::TemplateCache::default());
    loop {
        match run_connected(&cfg, &pool, &sender, &db, &limits, &templates, &shutdown).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                error!(error = %e, retry_in_ms = backoff.as_millis() as u64, "broker connection failed; reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

async fn run_connected<S: ChannelSender>(
    cfg: &WorkerConfig,
    pool: &PgPool,
    sender: &Arc<S>,
    db: &DbBatches,
    limits: &Arc<limit::RateLimits>,
    templates: &Arc<templates::TemplateCache>,
    shutdown: &CancellationToken,
) -> Result<(), WorkerError> {
    let channel = sender.channel();
    let conn = notify_broker::connect(&cfg.amqp_url, &format!("worker-{channel}")).await?;
    let setup = conn.create_channel().await?;
    cfg.topology.declare(&setup, &[channel.as_str()]).await?;
    let _ = setup.close(200, "topology declared".into()).await;

    let amqp = notify_broker::consumer_channel(&conn, cfg.concurrency).await?;
    let tag = format!("worker-{channel}-{}", uuid::Uuid::new_v4());
    let mut consumer = amqp
        .basic_consume(
            cfg.topology.queue(channel.as_str()).into(),
            tag.clone().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    info!(%channel, queue = %cfg.topology.queue(channel.as_str()), concurrency = cfg.concurrency, "consuming");
    CONSUMING.store(true, std::sync::atomic::Ordering::SeqCst);

    let permits = Arc::new(Semaphore::new(cfg.concurrency as usize));
    let mut tasks = JoinSet::new();
    let ctx = Arc::new(Ctx {
        pool: pool.clone(),
        sender: sender.clone(),
        cfg: cfg.clone(),
        db: db.clone(),
        limits: limits.clone(),
        templates: templates.clone(),
    });
    let mut failure = None;
    let mut ended = false;
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => p.expect("semaphore never closed"),
        };
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            n = consumer.next() => n,
        };
        match next {
            Some(Ok(delivery)) => {
                let ctx = ctx.clone();
                tasks.spawn(async move {
                    ctx.handle(delivery).await;
                    drop(permit);
                });
            }
            Some(Err(e)) => {
                failure = Some(e);
                break;
            }
            None => {
                warn!("consumer stream ended");
                ended = true;
                break;
            }
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.try_join_next().is_some() {}
    CONSUMING.store(false, std::sync::atomic::Ordering::SeqCst);
    info!(in_flight = tasks.len(), "stopping: no new messages");
    let _ = amqp
        .basic_cancel(tag.into(), BasicCancelOptions::default())
        .await;
    let drained = tokio::time::timeout(cfg.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            left = tasks.len(),
            "grace period over; unfinished deliveries keep their lease and are recovered by the sweeper"
        );
    }
    let _ = amqp.close(200, "worker stopping".into()).await;
    let _ = conn.close(200, "worker stopping".into()).await;
    match failure {
        Some(e) => Err(e.into()),
        // Not asked to stop: reconnect.
        None if ended && !shutdown.is_cancelled() => Err(WorkerError::ConsumerEnded),
        None => {
            info!("stopped");
            Ok(())
        }
    }
}

struct Ctx<S> {
    pool: PgPool,
    sender: Arc<S>,
    cfg: WorkerConfig,
    db: DbBatches,
    limits: Arc<limit::RateLimits>,
    templates: Arc<templates::TemplateCache>,
}

/// The worker's batched database calls: claims of one channel, and attempt records.
#[derive(Clone)]
struct DbBatches {
    claims: Batcher<uuid::Uuid, ClaimOutcome>,
    records: Batcher<(Arc<DeliveryJob>, NextState, AttemptRecord), bool>,
}

/// Most claims or records in one statement or transaction.
const DB_BATCH: usize = 100;

impl DbBatches {
    fn start(pool: &PgPool, channel: Channel, lease: Duration) -> Self {
        let p = pool.clone();
        let claims = Batcher::start(2, DB_BATCH, move |ids: Vec<uuid::Uuid>| {
            let p = p.clone();
            async move { deliveries::claim_many(&p, &ids, channel.as_str(), lease).await }
        });
        let p = pool.clone();
        let records = Batcher::start(
            2,
            DB_BATCH,
            move |batch: Vec<(Arc<DeliveryJob>, NextState, AttemptRecord)>| {
                let p = p.clone();
                async move {
                    let refs: Vec<(&DeliveryJob, &NextState, &AttemptRecord)> =
                        batch.iter().map(|(j, n, r)| (&**j, n, r)).collect();
                    deliveries::record_attempts(&p, &refs).await
                }
            },
        );
        Self { claims, records }
    }
}

/// How a database call of the worker ended after [`with_db_retry`].
enum DbCall<T> {
    /// It succeeded.
    Done(T),
    /// The database stayed unreachable through every retry: give the message back.
    Unreachable,
    /// The database refused the call for a reason retrying cannot change (see
    /// [`notify_store::StoreError::is_transient`]).
    Refused(notify_store::StoreError),
}

/// Retries a database operation with backoff while it fails for a transient reason, for
/// up to about 100 s (10 tries); an error that retrying cannot change ends it at once.
async fn with_db_retry<T, F, Fut>(what: &str, mut f: F) -> DbCall<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = notify_store::Result<T>>,
{
    let mut delay = Duration::from_millis(200);
    for attempt in 1..=10 {
        match f().await {
            Ok(v) => return DbCall::Done(v),
            Err(e) if !e.is_transient() => {
                error!(error = %e, what, "the database refused the call; not retrying");
                return DbCall::Refused(e);
            }
            Err(e) => {
                warn!(error = %e, attempt, what, "database call failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
    error!(
        what,
        "database unreachable; giving the message back to the broker"
    );
    DbCall::Unreachable
}

impl<S: ChannelSender> Ctx<S> {
    async fn handle(&self, msg: lapin::message::Delivery) {
        let channel = self.sender.channel();
        let Some(pointer) = DeliveryMessage::parse(&msg.data) else {
            warn!(%channel, bytes = msg.data.len(), "unparseable message: dead-lettered");
            reject(&msg).await;
            return;
        };
        let span = self.consumer_span(&msg, &pointer);
        let s = span.clone();
        async {
            if pointer.channel != channel.as_str() {
                warn!(message_channel = %pointer.channel, "message for another channel: dead-lettered");
                let _ = deliveries::fail_unclaimed(&self.pool, pointer.delivery_id, "unsupported_channel").await;
                reject(&msg).await;
                return;
            }
            // Asked before the claim: the lease is held at least until then + its length.
            let asked = tokio::time::Instant::now();
            let claimed = with_db_retry("claim", || self.db.claims.call(pointer.delivery_id)).await;
            let job = match claimed {
                DbCall::Unreachable => return nack_requeue(&msg).await,
                DbCall::Refused(_) => {
                    // Nothing was claimed, so no call was made; the delivery stays as it is
                    // and the sweeper republishes it later (with growing spacing).
                    warn!("claim refused by the database: dead-lettered");
                    return reject(&msg).await;
                }
                DbCall::Done(ClaimOutcome::Missing) => {
                    warn!("message names no delivery: dead-lettered");
                    return reject(&msg).await;
                }
                DbCall::Done(ClaimOutcome::WrongChannel(actual)) => {
                    warn!(%actual, "delivery belongs to another channel: dead-lettered");
                    let _ = deliveries::fail_unclaimed(&self.pool, pointer.delivery_id, "unsupported_channel").await;
                    return reject(&msg).await;
                }
                DbCall::Done(ClaimOutcome::NotClaimable(status)) => {
                    info!(%status, "duplicate or early message: acked without sending");
                    return ack(&msg).await;
                }
                DbCall::Done(ClaimOutcome::Exhausted { provider, attempts, .. }) => {
                    // Every attempt was spent, the last ones by workers that died during the
                    // call: the claim failed it instead of calling the provider again.
                    let m = notify_telemetry::metrics();
                    let [c, p] = notify_telemetry::metrics::channel_provider(channel.as_str(), &provider);
                    m.deliveries_failed.add(1, &[c, p, opentelemetry::KeyValue::new("reason", "attempts_spent")]);
                    error!(attempts, reason = "attempts_spent", alert = "delivery_failed",
                        "delivery failed: its attempt budget was spent (workers died during the calls); no further call");
                    return ack(&msg).await;
                }
                DbCall::Done(ClaimOutcome::Claimed(job)) => job,
            };
            // The rules that decide whether a delivery may go out now are checked here,
            // when it is due, whatever made it due (first send, retry, fatigue slot,
            // digest close, recovery), on the database clock of the claim.
            if let Some(channel) = job.channel.parse::<Channel>().ok()
                && let notify_core::due::Due::Defer { until, why } = notify_core::due::check(
                    job.started_at,
                    notify_core::due::DueFacts {
                        channel,
                        critical: job.critical,
                        timezone: notify_core::validate::parse_timezone(&job.timezone),
                        quiet_hours: &job.quiet_hours,
                    },
                )
            {
                match with_db_retry("defer", || deliveries::defer_claimed(&self.pool, &job, until, &why)).await {
                    DbCall::Unreachable => return nack_requeue(&msg).await,
                    DbCall::Done(true) => info!(until = %until.to_rfc3339(), "due inside the recipient's quiet hours: deferred without a call"),
                    DbCall::Done(false) => warn!("lease lost before deferring; nothing written"),
                    DbCall::Refused(_) => {}
                }
                return ack(&msg).await;
            }
            let mut job = job;
            s.record("notify.event_id", tracing::field::display(job.event_id));
            s.record("notify.attempt", job.attempt);
            s.record("notify.provider", job.provider.as_str());
            let lease = lease::Lease::new(self.pool.clone(), job.id, job.lease_token, self.cfg.lease, asked);
            let started = std::time::Instant::now();
            let outcome = match self.templates.apply(&self.pool, &mut job).await {
                Ok(()) => self.send_with_heartbeat(&job, &lease).await,
                Err(failed) => failed,
            };
            let took = started.elapsed();
            if lease.abandoned() {
                // No provider call was made after the lease was found gone; whoever holds
                // the delivery now (or the sweeper) sends it. Any record would match nothing.
                warn!(attempt = job.attempt, "lease lost before the provider call: call abandoned, nothing written");
                return ack(&msg).await;
            }
            let (next, mut record) = decide(&self.cfg.retry, self.sender.retry_horizon(), &job, outcome);
            record.worker_id = self.cfg.worker_id.clone();
            // A retry's delay counts from the provider's answer.
            record.call_took = took;
            // Logs name the failure's class and the provider status only: the full error
            // (which can quote payload values or provider text) goes to Postgres, where
            // the console shows it.
            let reason = record
                .error_code
                .as_deref()
                .map(notify_telemetry::metrics::reason_of)
                .unwrap_or_default();
            let status = record.provider_status.unwrap_or(0);
            match &next {
                NextState::Sent { .. } => info!(attempt = job.attempt, "sent"),
                NextState::Retry { after, .. } => {
                    warn!(attempt = job.attempt, retry_in_ms = after.as_millis() as u64, %reason, provider_status = status, "attempt failed; retry scheduled")
                }
                NextState::Failed { .. } => {
                    error!(attempt = job.attempt, %reason, provider_status = status, alert = "delivery_failed", "delivery failed; the full error is on the delivery (GetEvent, console)")
                }
                NextState::Paused { after, .. } => {
                    error!(%reason, paused_for_s = after.as_secs(), alert = "channel_paused",
                        "provider quota spent: channel paused; its deliveries wait without spending attempts")
                }
            }
            let job = Arc::new(*job);
            let recorded = with_db_retry("record attempt", || {
                self.db.records.call((job.clone(), next.clone(), record.clone()))
            })
            .await;
            match recorded {
                DbCall::Unreachable => nack_requeue(&msg).await,
                DbCall::Refused(e) => {
                    // The full record cannot be stored (and never will be): end the
                    // delivery visibly rather than let its lease expire and call again.
                    let sent = match &next {
                        NextState::Sent { provider_message_id } => Some(provider_message_id.clone()),
                        _ => None,
                    };
                    let why = format!(
                        "record_failed: the attempt's record was refused by the database ({}); the delivery was ended instead of being sent again",
                        notify_store::truncate_utf8(&e.to_string(), 300)
                    );
                    let ended = with_db_retry("record fallback", || {
                        deliveries::record_fallback(&self.pool, &job, sent.clone(), &why)
                    })
                    .await;
                    if matches!(ended, DbCall::Unreachable) {
                        return nack_requeue(&msg).await;
                    }
                    if sent.is_none() {
                        let m = notify_telemetry::metrics();
                        let labels = notify_telemetry::metrics::channel_provider(&job.channel, &job.provider);
                        let [c, p] = labels;
                        m.deliveries_failed.add(1, &[c, p, opentelemetry::KeyValue::new("reason", "record_failed")]);
                        error!(attempt = job.attempt, reason = "record_failed", alert = "delivery_failed",
                            "delivery failed: its attempt could not be recorded; ended without another call");
                    }
                    ack(&msg).await
                }
                DbCall::Done(false) if matches!(next, NextState::Sent { .. }) => {
                    // The provider accepted after the lease was taken. If the sweeper put the
                    // delivery back and nobody claimed it again, this success is the truth:
                    // record it rather than sending a second time.
                    let late = with_db_retry("record late success", || {
                        deliveries::record_late_success(&self.pool, &job, &next, &record)
                    })
                    .await;
                    match late {
                        DbCall::Done(true) => {
                            warn!(attempt = job.attempt, "lease lost during the call, but the provider accepted and nobody claimed the delivery again: success recorded");
                            count_recorded(&job, &next, &record, took);
                        }
                        DbCall::Done(false) => warn!("lease lost before recording: another worker owns this delivery now; nothing written"),
                        DbCall::Unreachable | DbCall::Refused(_) => {}
                    }
                    ack(&msg).await
                }
                DbCall::Done(false) => {
                    warn!("lease lost before recording: another worker owns this delivery now; nothing written");
                    ack(&msg).await
                }
                DbCall::Done(true) => {
                    count_recorded(&job, &next, &record, took);
                    ack(&msg).await
                }
            }
        }
        .instrument(span)
        .await
    }

    /// The consumer span of one message (OpenTelemetry messaging semantic conventions),
    /// a child of the relay's producer span named by the message's `traceparent` header.
    fn consumer_span(
        &self,
        msg: &lapin::message::Delivery,
        pointer: &DeliveryMessage,
    ) -> tracing::Span {
        let channel = self.sender.channel();
        let queue = self.cfg.topology.queue(channel.as_str());
        let span = info_span!(
            "process",
            otel.name = %format!("{queue} process"),
            otel.kind = "consumer",
            otel.status_code = tracing::field::Empty,
            messaging.system = "rabbitmq",
            messaging.operation.type = "process",
            messaging.operation.name = "process",
            messaging.destination.name = %queue,
            messaging.message.id = %pointer.delivery_id,
            messaging.rabbitmq.message.delivery_tag = msg.delivery_tag,
            notify.delivery_id = %pointer.delivery_id,
            notify.channel = %channel,
            notify.event_id = tracing::field::Empty,
            notify.attempt = tracing::field::Empty,
            notify.provider = tracing::field::Empty,
        );
        let headers = notify_broker::string_headers(&msg.properties);
        notify_telemetry::propagation::continue_trace(
            &span,
            headers.get("traceparent").map(String::as_str),
            headers.get("tracestate").map(String::as_str),
        );
        span
    }

    async fn send_with_heartbeat(&self, job: &DeliveryJob, lease: &Lease) -> AttemptOutcome {
        // The wait for the provider's rate limit counts as part of the call, under the
        // same lease heartbeat; the call's deadline starts after it.
        let client = info_span!(
            "provider call",
            otel.name = %format!("{} send", job.provider),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            notify.provider = %job.provider,
            notify.channel = %job.channel,
            notify.delivery_id = %job.id,
            notify.event_id = %job.event_id,
            notify.attempt = job.attempt,
            http.response.status_code = tracing::field::Empty,
            smtp.response.code = tracing::field::Empty,
            notify.error = tracing::field::Empty,
        );
        let send = async {
            self.limits.wait(&job.provider).await;
            let deadline = self.sender.call_deadline();
            let out = match tokio::time::timeout(deadline, self.sender.send(job, lease)).await {
                Ok(out) => out,
                Err(_) => AttemptOutcome::failed(
                    ErrorClass::Transient,
                    format!("{}_timeout", job.provider),
                    serde_json::json!({}),
                )
                .with_response(format!(
                    "no final answer within the call deadline of {} ms",
                    deadline.as_millis()
                )),
            };
            let span = tracing::Span::current();
            if let Some(status) = out.provider_status {
                let key = if job.channel == "email" {
                    "smtp.response.code"
                } else {
                    "http.response.status_code"
                };
                span.record(key, status);
            }
            if let AttemptResult::Failed { code, .. } = &out.result {
                span.record("notify.error", code.as_str());
                span.record("otel.status_code", "ERROR");
            }
            out
        }
        .instrument(client);
        tokio::pin!(send);
        let mut beat = tokio::time::interval(self.cfg.lease / 3);
        beat.tick().await;
        loop {
            tokio::select! {
                out = &mut send => return out,
                _ = beat.tick(), if !lease.is_lost() => {
                    let asked = tokio::time::Instant::now();
                    match deliveries::extend_lease(&self.pool, job.id, job.lease_token, self.cfg.lease).await {
                        Ok(true) => lease.extended(asked),
                        Ok(false) => {
                            lease.lost();
                            warn!("lease lost while the provider call runs");
                        }
                        Err(e) => warn!(error = %e, "could not extend the lease"),
                    }
                }
            }
        }
    }
}

/// Turns an attempt's outcome into the delivery's next state and the attempt record,
/// using the retry policy, the delivery's attempt budget and the provider's retry horizon
/// (measured from the delivery's creation to the next attempt, on the database clock).
/// Pure.
pub fn decide(
    policy: &RetryPolicy,
    horizon: Option<Duration>,
    job: &DeliveryJob,
    outcome: AttemptOutcome,
) -> (NextState, AttemptRecord) {
    let mut record = AttemptRecord {
        outcome: "sent",
        provider_status: outcome.provider_status,
        error_code: None,
        provider_response: outcome.provider_response,
        content: outcome.content,
        deactivate_endpoint: None,
        address_undeliverable: None,
        endpoint_invalid_since: outcome.invalid_since,
        worker_id: String::new(),
        call_took: Duration::ZERO,
    };
    let next = match outcome.result {
        AttemptResult::Sent {
            provider_message_id,
        } => NextState::Sent {
            provider_message_id,
        },
        AttemptResult::Failed {
            class,
            code,
            retry_after,
        } => {
            record.error_code = Some(code.clone());
            // A provider's status, or for a failure before any call (a template error)
            // the reason itself, which names what to fix.
            let status = match (record.provider_status, &record.provider_response) {
                (Some(s), _) => format!(" (provider status {s})"),
                (None, Some(why)) if code == "template_error" => format!(": {why}"),
                _ => String::new(),
            };
            match class {
                ErrorClass::Permanent => {
                    record.outcome = "failed";
                    NextState::Failed {
                        error: format!("{code}{status}"),
                    }
                }
                ErrorClass::InvalidEndpoint => {
                    record.outcome = "failed";
                    if let Some(ep) = job.endpoint_id {
                        record.deactivate_endpoint = Some((ep, code.clone()));
                    } else if job.channel == "email"
                        && let Some(address) = &job.address
                    {
                        record.address_undeliverable = Some((address.clone(), code.clone()));
                    }
                    NextState::Failed {
                        error: format!("{code}{status}"),
                    }
                }
                ErrorClass::QuotaExhausted => {
                    record.outcome = "retry";
                    NextState::Paused {
                        // Without a stated end, look again in an hour.
                        after: retry_after.unwrap_or(Duration::from_secs(3600)),
                        error: format!("{code}{status}"),
                    }
                }
                ErrorClass::Transient | ErrorClass::RateLimited => {
                    let budget = RetryPolicy {
                        max_attempts: job.max_attempts.max(1) as u32,
                        ..policy.clone()
                    };
                    let jitter: f64 = rand::random();
                    let age = (job.started_at - job.created_at)
                        .to_std()
                        .unwrap_or_default();
                    let delay = budget
                        .next_delay(
                            job.attempt.max(1) as u32,
                            retry_after,
                            class == ErrorClass::RateLimited,
                            jitter,
                        )
                        .filter(|d| horizon.is_none_or(|h| age.saturating_add(*d) < h));
                    match delay {
                        Some(after) => {
                            record.outcome = "retry";
                            NextState::Retry {
                                after,
                                error: format!("{code}{status}"),
                            }
                        }
                        None => {
                            record.outcome = "failed";
                            NextState::Failed {
                                error: format!(
                                    "{code}{status}; gave up after {} attempts (attempt budget or retry horizon spent)",
                                    job.attempt
                                ),
                            }
                        }
                    }
                }
            }
        }
    };
    (next, record)
}

/// Counts one recorded attempt in the metrics (after its commit, so a lost lease or a
/// failed record counts nothing).
fn count_recorded(job: &DeliveryJob, next: &NextState, record: &AttemptRecord, took: Duration) {
    use opentelemetry::KeyValue;
    let m = notify_telemetry::metrics();
    let labels = notify_telemetry::metrics::channel_provider(&job.channel, &job.provider);
    let outcome = match next {
        NextState::Sent { .. } => {
            m.deliveries_sent.add(1, &labels);
            let since = (chrono::Utc::now() - job.created_at)
                .to_std()
                .unwrap_or_default();
            m.event_to_provider.record(since.as_secs_f64(), &labels);
            "sent"
        }
        NextState::Retry { .. } | NextState::Paused { .. } => {
            m.deliveries_retried.add(1, &labels);
            "retry"
        }
        NextState::Failed { .. } => {
            let reason = notify_telemetry::metrics::reason_of(
                record.error_code.as_deref().unwrap_or("unknown"),
            );
            let mut with_reason = labels.to_vec();
            with_reason.push(KeyValue::new("reason", reason));
            m.deliveries_failed.add(1, &with_reason);
            "failed"
        }
    };
    if record
        .error_code
        .as_deref()
        .is_some_and(notify_telemetry::metrics::is_ambiguous)
    {
        m.deliveries_ambiguous.add(1, &labels);
    }
    if record.deactivate_endpoint.is_some() || record.address_undeliverable.is_some() {
        m.endpoints_deactivated.add(1, &labels);
    }
    let mut with_outcome = labels.to_vec();
    with_outcome.push(KeyValue::new("outcome", outcome));
    m.attempt_duration.record(took.as_secs_f64(), &with_outcome);
}

async fn ack(msg: &lapin::message::Delivery) {
    if let Err(e) = msg.acker.ack(BasicAckOptions::default()).await {
        warn!(error = %e, "ack failed; the message will be redelivered and its claim will skip it");
    }
}

async fn reject(msg: &lapin::message::Delivery) {
    // requeue = false: the queue's dead-letter exchange takes it.
    if let Err(e) = msg
        .acker
        .reject(BasicRejectOptions { requeue: false })
        .await
    {
        warn!(error = %e, "reject failed");
    }
}

async fn nack_requeue(msg: &lapin::message::Delivery) {
    if let Err(e) = msg
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
    {
        warn!(error = %e, "nack failed");
    }
}

/// Standard `main` body of a worker binary: reads the configuration (exit 64 listing every
/// bad variable), sets up logging, builds the sender with `build` (given the environment
/// reader and the database pool), and runs until SIGTERM.
pub async fn main_with<S, F>(service: &str, build: F) -> anyhow::Result<()>
where
    S: ChannelSender,
    F: FnOnce(&mut notify_telemetry::Env, Option<&PgPool>) -> Option<S>,
{
    notify_telemetry::exit_if_help(&format!(
        "usage: {service}\n  consumes its channel's queue and delivers until SIGTERM; /healthz, /readyz and\n  /metrics on NOTIFY_ADMIN_ADDR when set.\nConfiguration: environment variables, see README."
    ));
    notify_telemetry::init(service);
    let mut env = notify_telemetry::Env::new();
    let mut pool_cfg =
        notify_store::PoolConfig::new(env.url("NOTIFY_DATABASE_URL", &["postgres", "postgresql"]));
    pool_cfg.max_connections = env.number("NOTIFY_DB_POOL_SIZE", 10, 1, 1000);
    let cfg = WorkerConfig::from_env(&mut env);
    notify_telemetry::admin::check_env(&mut env);
    let pool = match notify_store::connect(&pool_cfg) {
        Ok(pool) => Some(pool),
        Err(e) if !pool_cfg.url.is_empty() => {
            env.error(format!("NOTIFY_DATABASE_URL is invalid: {e}"));
            None
        }
        Err(_) => None,
    };
    // The sender reads its own variables even when others are bad, so every problem is
    // reported in one go.
    let sender = build(&mut env, pool.as_ref());
    if let Err(problems) = env.finish() {
        notify_telemetry::exit_bad_config(service, &problems);
    }
    let (Some(pool), Some(sender)) = (pool, sender) else {
        notify_telemetry::exit_bad_config(service, "the channel sender could not be built");
    };
    let shutdown = notify_telemetry::shutdown_on_signal();
    let readiness = {
        let pool = pool.clone();
        notify_telemetry::admin::Readiness::new()
            .with_check("postgres", move || {
                let pool = pool.clone();
                async move { notify_store::ping(&pool).await.map_err(|e| e.to_string()) }
            })
            .with_check("rabbitmq", || async {
                if CONSUMING.load(std::sync::atomic::Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("not consuming from its queue (starting, draining, or RabbitMQ unreachable; see the log)".to_string())
                }
            })
    };
    // The admin endpoint outlives the drain: `/readyz` answers 503 while in-flight
    // deliveries finish, `/healthz` stays 200.
    let admin_stop = CancellationToken::new();
    notify_telemetry::admin::spawn_from_env(service, readiness.clone(), admin_stop.clone()).await;
    {
        let (readiness, shutdown) = (readiness.clone(), shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            readiness.start_draining();
        });
    }
    let result = run(cfg, pool, Arc::new(sender), shutdown).await;
    admin_stop.cancel();
    notify_telemetry::shutdown();
    result?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(attempt: i32) -> DeliveryJob {
        DeliveryJob {
            id: uuid::Uuid::nil(),
            event_id: uuid::Uuid::nil(),
            event_key: "k".into(),
            type_key: "t".into(),
            priority: "normal".into(),
            category: "transactional".into(),
            digest_key: None,
            user_id: "u".into(),
            channel: "push".into(),
            provider: "fcm".into(),
            attempt,
            max_attempts: 5,
            idempotency_key: "k".into(),
            retry_key: None,
            lease_token: uuid::Uuid::nil(),
            started_at: chrono::Utc::now(),
            created_at: chrono::Utc::now(),
            address: None,
            display_name: String::new(),
            locale: "th-TH".into(),
            timezone: "Asia/Bangkok".into(),
            payload: json!({}),
            content: Default::default(),
            endpoint_id: Some(uuid::Uuid::from_u128(7)),
            endpoint_platform: Some("fcm".into()),
            endpoint_token: Some("tok".into()),
            endpoint_subscription: None,
            endpoint_status: Some("active".into()),
            critical: false,
            quiet_hours: Vec::new(),
        }
    }

    #[test]
    fn transient_failures_retry_until_the_budget_is_spent() {
        let p = RetryPolicy::default();
        let out = || {
            AttemptOutcome::failed(ErrorClass::Transient, "fcm_unavailable", json!({}))
                .with_status(503)
        };
        let (next, rec) = decide(&p, None, &job(1), out());
        // 30 s +-20 %.
        assert!(matches!(next, NextState::Retry { after, .. }
            if after >= Duration::from_secs(24) && after <= Duration::from_secs(36)));
        assert_eq!(rec.outcome, "retry");
        let (next, rec) = decide(&p, None, &job(5), out());
        assert!(matches!(&next, NextState::Failed { error } if error.contains("gave up after 5")));
        assert_eq!(rec.outcome, "failed");
    }

    #[test]
    fn invalid_endpoint_fails_at_once_and_deactivates_that_endpoint() {
        let (next, rec) = decide(
            &RetryPolicy::default(),
            None,
            &job(1),
            AttemptOutcome::failed(ErrorClass::InvalidEndpoint, "unregistered", json!({}))
                .with_status(404),
        );
        assert_eq!(
            next,
            NextState::Failed {
                error: "unregistered (provider status 404)".into()
            }
        );
        assert_eq!(
            rec.deactivate_endpoint,
            Some((uuid::Uuid::from_u128(7), "unregistered".into()))
        );
    }

    #[test]
    fn no_retry_is_scheduled_past_the_provider_horizon() {
        let mut j = job(2);
        j.created_at = j.started_at - chrono::Duration::hours(20);
        let out = AttemptOutcome::failed(ErrorClass::RateLimited, "line_rate_limited", json!({}))
            .with_retry_after(Some(Duration::from_secs(5 * 3600)));
        let horizon = Some(Duration::from_secs(23 * 3600));
        let (next, _) = decide(&RetryPolicy::default(), horizon, &j, out.clone());
        assert!(
            matches!(&next, NextState::Failed { error } if error.contains("retry horizon")),
            "{next:?}"
        );
        let (next, _) = decide(&RetryPolicy::default(), None, &j, out);
        assert!(matches!(next, NextState::Retry { .. }));
    }

    #[test]
    fn rate_limited_waits_for_retry_after() {
        let out = AttemptOutcome::failed(ErrorClass::RateLimited, "line_rate_limited", json!({}))
            .with_retry_after(Some(Duration::from_secs(120)));
        let (next, _) = decide(&RetryPolicy::default(), None, &job(1), out);
        assert!(
            matches!(next, NextState::Retry { after, .. } if after == Duration::from_secs(120))
        );
    }
}
