//! Group commit for `CreateEvent`.
//!
//! Each request is validated in its own handler, then handed to the event writer. Its
//! writer tasks (`NOTIFY_INGEST_WRITERS`, one by default) each take whatever requests are
//! waiting (up to a batch limit) and write them in one transaction with multi-row
//! statements: types and topics looked up once, the events
//! inserted in one statement (keys sorted, so concurrent batches lock the unique index in
//! one order), recipient facts read with one statement, all deliveries with their outbox
//! rows in one statement and all skipped pairs in another. One commit (one WAL flush)
//! then answers the whole batch. Under light load a batch is a single request and adds no
//! wait; under heavy load the batch grows with the queue.
//!
//! Failure isolation: a request that fails validation against the catalogue (unknown
//! type or topic, a channel the type does not allow) is answered on its own and left out
//! of the batch. If the batch transaction fails on a statement, each request is retried in
//! a transaction of its own, so one bad request cannot fail its neighbours. A request
//! whose caller has gone (deadline passed, cancelled) before the commit is left out: the
//! batch is rolled back and written again without it, so a passed deadline writes nothing.
//!
//! The writer tasks run on a thread of their own ("event-writer", a single-threaded tokio
//! runtime) over connections of their own: a batch is a dozen round trips one after
//! another, and on the server's runtime each reply waited its turn behind the gRPC tasks
//! of every caller. Alternating runs of one build at 128 clients on 2 cores: 3,619 to
//! 4,842 events/s on the writer's thread, 2,278 to 3,774 on the server's runtime
//! (docs/scaling.md, 2026-12-05).

mod batch;
mod digests;
mod supervisor;

use crate::clock::Clock;
use crate::error::ApiError;
use notify_core::{Channel, NewEvent, SkippedDelivery};
use notify_store::events::{ExistingEvent, NewDelivery};
use notify_store::{PgPool, StoreError};
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};
use uuid::Uuid;

/// What writing one event produced.
#[derive(Debug)]
pub enum Written {
    /// The event is new and committed, with its deliveries and skipped pairs.
    New {
        /// The new event's id.
        event_id: Uuid,
        /// Deliveries written (empty for a topic event, which the fan-out plans).
        deliveries: Vec<NewDelivery>,
        /// Recipient x channel pairs that got no delivery.
        skipped: Vec<SkippedDelivery>,
        /// A scheduled event's due time (`None`: sent at once).
        send_at: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// The key exists: the stored event's id and fingerprint.
    Existing(ExistingEvent),
}

/// One `CreateEvent` waiting for its batch, with where its answer goes.
struct Job {
    event: NewEvent,
    requested_channels: Vec<String>,
    reply: oneshot::Sender<Result<Written, ApiError>>,
}

/// Settings of the event writer.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Writer tasks (transactions in flight at once).
    pub writers: usize,
    /// Most events per transaction.
    pub max_batch: usize,
    /// Attempts each new delivery gets.
    pub max_attempts: i32,
    /// Fatigue caps: most non-critical notifications per user per rolling hour, per
    /// channel (empty = no caps).
    pub fatigue_caps: std::collections::BTreeMap<Channel, u32>,
    /// The planning instant's source: the database's `now()` in production.
    pub clock: Clock,
    /// Furthest a scheduled event may be due after the planning instant
    /// (`NOTIFY_SCHEDULE_HORIZON`).
    pub horizon: std::time::Duration,
    /// The relay to hand new deliveries due now to after each commit, and how long their
    /// outbox rows are held for it ([`crate::relay::RelayConfig::hold`]); `None`: every
    /// row is left to the relay's claim.
    pub direct: Option<(crate::relay::Direct, std::time::Duration)>,
}

/// Handle to the writer tasks; cheap to clone. The tasks, their thread and their
/// connections stop when every handle is gone.
#[derive(Clone)]
pub struct EventWriter {
    tx: mpsc::Sender<Job>,
}

/// Connections of the writer's own pool for each writer task: one for its batch
/// transaction, and up to [`ALONE_AT_ONCE`] while a failed batch's events are written one
/// by one. Ingest opens these besides its `NOTIFY_DB_POOL_SIZE`.
pub const CONNECTIONS_PER_WRITER: usize = batch::ALONE_AT_ONCE;

impl EventWriter {
    /// Starts `cfg.writers` writer tasks on a new thread, "event-writer", with a
    /// single-threaded runtime and a pool of `cfg.writers` x [`CONNECTIONS_PER_WRITER`]
    /// connections opened there, with `pool`'s settings (URL, timeouts, pooler, the idle
    /// ping and the refusal of a standby).
    ///
    /// # Errors
    /// The operating system's, when it cannot start the thread or its runtime.
    pub fn start(pool: &PgPool, cfg: WriterConfig) -> std::io::Result<Self> {
        let writers = cfg.writers.max(1);
        let (tx, rx) = mpsc::channel::<Job>(cfg.max_batch * writers * 4);
        let rx = Arc::new(Mutex::new(rx));
        let options = pool
            .options()
            .clone()
            .max_connections(u32::try_from(writers * CONNECTIONS_PER_WRITER).unwrap_or(u32::MAX));
        let connect = (*pool.connect_options()).clone();
        let (started, start_result) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("event-writer".into())
            .spawn(move || {
                // Built here: a runtime may not be dropped on the caller's, should this
                // thread fail to start.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => {
                        let _ = started.send(Ok(()));
                        rt
                    }
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // Opened lazily, on this runtime: each connection's socket is then
                    // driven by this thread, not the server's.
                    let pool = options.connect_lazy_with(connect);
                    let tasks: Vec<_> = (0..writers)
                        .map(|_| {
                            let (pool, cfg, rx) = (pool.clone(), cfg.clone(), rx.clone());
                            tokio::spawn(supervisor::restart_on_panic("event writer", move || {
                                batch::writer_loop(pool.clone(), cfg.clone(), rx.clone())
                            }))
                        })
                        .collect();
                    for task in tasks {
                        let _ = task.await;
                    }
                    pool.close().await;
                });
            })?;
        start_result
            .recv()
            .map_err(|_| std::io::Error::other("the event writer's thread ended at start"))??;
        Ok(Self { tx })
    }

    /// Writes one validated event (with the channel names the caller asked for, to name
    /// them in errors) and waits for its commit.
    ///
    /// # Errors
    /// `NotFound` for an unknown type or topic, `Invalid` for a channel the type does not
    /// allow, `Store` when the database failed.
    pub async fn write(
        &self,
        event: NewEvent,
        requested_channels: Vec<String>,
    ) -> Result<Written, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Job {
                event,
                requested_channels,
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> ApiError {
    ApiError::Store(StoreError::Db(sqlx::Error::PoolClosed))
}
