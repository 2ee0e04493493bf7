//! The one consume runtime ([`serve`]): connect, declare, consume with prefetch =
//! concurrency, hand each message to a task, drain on shutdown, reconnect with backoff;
//! the channel workers' use of it ([`run`]).

use crate::db::DbBatches;
use crate::reconnect::Reconnect;
use crate::{ChannelSender, Readiness, WorkerConfig, limit, templates};
use notify_broker::{Consumer, Inbound, Pointers, lapin};
use notify_store::PgPool;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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
/// each delivery through `sender` ([`serve`] with the channel workers' message handling).
/// On shutdown it stops taking messages, lets the deliveries in hand finish (up to the
/// grace period), then closes the channel, which returns unstarted prefetched messages to
/// the queue.
///
/// A lost or refused broker connection is retried with backoff (up to 10 s between
/// tries) until shutdown; deliveries in hand when it dropped are still recorded, and their
/// messages, unacked, come back from the broker and are skipped by the claim.
///
/// `readiness` is set while the consumer is open (for `/readyz`); pass
/// `Readiness::default()` when nobody reads it.
///
/// # Errors
/// None today: broker failures are retried until shutdown.
pub async fn run<S: ChannelSender>(
    cfg: WorkerConfig,
    pool: PgPool,
    sender: Arc<S>,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    let channel = sender.channel();
    let ctx = Arc::new(Ctx {
        db: DbBatches::start(&pool, channel, cfg.lease),
        limits: Arc::new(limit::RateLimits::new(&cfg.rate_limits)),
        templates: Arc::new(templates::TemplateCache::new(cfg.links.clone())),
        pool,
        sender,
        cfg: cfg.clone(),
    });
    serve(&cfg, channel.as_str(), ctx, &readiness, &shutdown).await
}

/// The messages of one queue as [`serve`] hands them to their tasks.
pub trait Handler: Send + Sync + 'static {
    /// What is read from a message before its task starts (the pointers it carries).
    type Parsed: Send + 'static;

    /// Reads a message before its permits are taken.
    fn parse(&self, msg: &Inbound) -> Self::Parsed;

    /// Deliveries the message names: one permit each is taken before its task starts
    /// (at least 1, at most the concurrency). One by default.
    fn permits(&self, _parsed: &Self::Parsed) -> usize {
        1
    }

    /// Handles one message to its settle (ack, reject or requeue). `permits` are the
    /// message's share of the concurrency; once `stop` is cancelled (shutdown, or the
    /// connection failed) no further delivery of it should start.
    fn handle(
        self: Arc<Self>,
        msg: Inbound,
        parsed: Self::Parsed,
        permits: OwnedSemaphorePermit,
        stop: CancellationToken,
    ) -> impl Future<Output = ()> + Send;
}

/// The one consume runtime, until `shutdown`: connect, declare the topology of `channel`,
/// consume its queue (`deliveries.<channel>`) with prefetch = concurrency and manual acks,
/// each message in a task of its own under a semaphore of `cfg.concurrency` permits
/// ([`Handler::permits`] per message), and on shutdown or a failed connection stop taking
/// messages, drain the tasks in hand for up to `cfg.shutdown_grace` (logged when it runs
/// out) and close, so that unstarted prefetched messages go back to the queue. A lost or
/// refused connection is tried again with [`Reconnect`]'s backoff. `readiness` is set
/// while the consumer is open.
///
/// # Errors
/// None today: broker failures are retried until shutdown.
pub async fn serve<H: Handler>(
    cfg: &WorkerConfig,
    channel: &str,
    handler: Arc<H>,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> Result<(), WorkerError> {
    let mut reconnect = Reconnect::new("broker connection failed", shutdown);
    while let Err(e) = serve_connected(cfg, channel, &handler, readiness, shutdown).await {
        readiness.set_consuming(false);
        if !reconnect.wait_after(&e).await {
            break;
        }
    }
    Ok(())
}

/// One broker connection's life: consume until shutdown or until the connection fails.
async fn serve_connected<H: Handler>(
    cfg: &WorkerConfig,
    channel: &str,
    handler: &Arc<H>,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> Result<(), WorkerError> {
    let conn = notify_broker::connect(&cfg.amqp_url, &format!("worker-{channel}")).await?;
    let setup = conn.create_channel().await?;
    cfg.topology.declare(&setup, &[channel]).await?;
    let _ = setup.close(200, "topology declared".into()).await;

    let queue = cfg.topology.queue(channel);
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
            Some(Ok(msg)) => {
                let parsed = handler.parse(&msg);
                let wanted = handler
                    .permits(&parsed)
                    .clamp(1, cfg.concurrency.max(1) as usize);
                // Not started yet: at a shutdown, closing the channel returns it to the queue.
                let permit = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    p = permits.clone().acquire_many_owned(wanted as u32) => p.expect("semaphore never closed"),
                };
                tasks.spawn(handler.clone().handle(msg, parsed, permit, stop.clone()));
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

impl<S: ChannelSender> Handler for Ctx<S> {
    type Parsed = Option<Pointers>;

    fn parse(&self, msg: &Inbound) -> Option<Pointers> {
        Pointers::parse(msg.body(), &msg.headers())
    }

    fn permits(&self, pointers: &Option<Pointers>) -> usize {
        pointers.as_ref().map_or(1, |p| p.deliveries.len())
    }

    async fn handle(
        self: Arc<Self>,
        msg: Inbound,
        pointers: Option<Pointers>,
        permits: OwnedSemaphorePermit,
        stop: CancellationToken,
    ) {
        self.handle_message(msg, pointers, permits, &stop).await;
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
