//! The consume loop: connect, declare, consume with prefetch = concurrency, hand each
//! message to a task, drain on shutdown, reconnect with backoff.

use crate::db::DbBatches;
use crate::{ChannelSender, Readiness, WorkerConfig, limit, templates};
use notify_broker::{Consumer, Pointers, lapin};
use notify_store::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

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
///
/// `readiness` is set while the consumer is open (for `/readyz`); pass
/// `Readiness::default()` when nobody reads it.
pub async fn run<S: ChannelSender>(
    cfg: WorkerConfig,
    pool: PgPool,
    sender: Arc<S>,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    let mut backoff = Duration::from_millis(200);
    let ctx = Arc::new(Ctx {
        db: DbBatches::start(&pool, sender.channel(), cfg.lease),
        limits: Arc::new(limit::RateLimits::new(&cfg.rate_limits)),
        templates: Arc::new(templates::TemplateCache::new(cfg.links.clone())),
        pool,
        sender,
        cfg,
    });
    loop {
        match run_connected(&ctx, &readiness, &shutdown).await {
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

/// One broker connection's life: consume until shutdown or until the connection fails.
async fn run_connected<S: ChannelSender>(
    ctx: &Arc<Ctx<S>>,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> Result<(), WorkerError> {
    let cfg = &ctx.cfg;
    let channel = ctx.sender.channel();
    let conn = notify_broker::connect(&cfg.amqp_url, &format!("worker-{channel}")).await?;
    let setup = conn.create_channel().await?;
    cfg.topology.declare(&setup, &[channel.as_str()]).await?;
    let _ = setup.close(200, "topology declared".into()).await;

    let queue = cfg.topology.queue(channel.as_str());
    let tag = format!("worker-{channel}-{}", uuid::Uuid::new_v4());
    let mut consumer = Consumer::start(&conn, &queue, &tag, cfg.concurrency)
        .await
        .map_err(amqp_first)?;
    info!(%channel, %queue, concurrency = cfg.concurrency, "consuming");
    readiness.set_consuming(true);

    // One permit per delivery in progress: a message naming several deliveries
    // (a version-2 batch) takes one for each, up to the whole concurrency, before its task
    // starts, and never waits for more once started, so messages cannot starve each other.
    let permits = Arc::new(Semaphore::new(cfg.concurrency as usize));
    // Stops the tasks from starting further deliveries of their messages, at shutdown and
    // when this connection fails (their messages come back from the broker anyway).
    let stop = shutdown.child_token();
    let mut tasks = JoinSet::new();
    let mut failure = None;
    let mut ended = false;
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            n = consumer.next() => n,
        };
        match next {
            Some(Ok(delivery)) => {
                let pointers = Pointers::parse(delivery.body(), &delivery.headers());
                let wanted = pointers
                    .as_ref()
                    .map_or(1, |p| p.deliveries.len())
                    .clamp(1, cfg.concurrency.max(1) as usize);
                // Not started yet: at a shutdown, closing the channel returns it to the queue.
                let permit = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    p = permits.clone().acquire_many_owned(wanted as u32) => p.expect("semaphore never closed"),
                };
                let ctx = ctx.clone();
                let stop = stop.clone();
                tasks.spawn(async move {
                    ctx.handle(delivery, pointers, permit, &stop).await;
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
    stop.cancel();
    readiness.set_consuming(false);
    info!(in_flight = tasks.len(), "stopping: no new messages");
    consumer.cancel().await;
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
    consumer.close("worker stopping").await;
    let _ = conn.close(200, "worker stopping".into()).await;
    match failure {
        Some(e) => Err(amqp_first(e)),
        // Not asked to stop: reconnect.
        None if ended && !shutdown.is_cancelled() => Err(WorkerError::ConsumerEnded),
        None => {
            info!("stopped");
            Ok(())
        }
    }
}

/// What every message's task shares.
pub(crate) struct Ctx<S> {
    pub(crate) pool: PgPool,
    pub(crate) sender: Arc<S>,
    pub(crate) cfg: WorkerConfig,
    pub(crate) db: DbBatches,
    pub(crate) limits: Arc<limit::RateLimits>,
    pub(crate) templates: Arc<templates::TemplateCache>,
}

/// A broker error as the worker reports it: a protocol error as [`WorkerError::Amqp`] (as
/// from a direct lapin call), anything else as [`WorkerError::Broker`].
fn amqp_first(e: notify_broker::BrokerError) -> WorkerError {
    match e {
        notify_broker::BrokerError::Amqp(e) => WorkerError::Amqp(e),
        other => WorkerError::Broker(other),
    }
}
