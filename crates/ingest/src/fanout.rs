//! Topic fan-out: plans the deliveries of a topic event in the background, [`BATCH`]
//! subscribers per transaction. Each transaction writes the page's deliveries, outbox rows
//! and skipped pairs together with the checkpoint (the last subscriber planned), so a crash
//! resumes exactly after the last committed page and never duplicates. Any number of
//! ingest replicas may run it: an event is held by one replica at a time, and the
//! checkpoint update is fenced by the previous cursor. Each page takes the event row
//! `FOR SHARE` before it writes (the cancellation fence): a canceled event's fan-out stops
//! (its checkpoint kept, status `canceled`), and recipients canceled alone get no delivery.
//!
//! Two pages are in flight ([`IN_FLIGHT`]): while page k holds the fence and inserts its
//! rows, page k + 1 reads its subscribers and their facts and plans them in a transaction
//! of its own (plain reads, no lock). It takes the fence only after page k committed, then
//! drops recipients canceled meanwhile, applies fatigue caps, inserts, moves the checkpoint
//! and commits; if page k failed or was fenced off, page k + 1 rolls back. Only one page
//! holds the fence at a time and there is a moment between two pages where none does, so
//! a waiting cancel gets the row (two overlapping share-lock holders would starve its
//! `FOR UPDATE`, so the inserts of two pages never overlap). The checkpoint moves one page
//! at a time. Each committed page's deliveries due now are handed to this replica's relay
//! ([`crate::relay::Direct::publish_paced`]); while the relay is behind, the page waits for
//! room (back-pressure) rather than releasing its rows, so the fan-out writes no faster
//! than the relay publishes and its memory stays bounded.

use crate::clock::Clock;
use crate::planning::{EventPlan, Grouping, count_derived, insert_planned};
use notify_core::Channel;
use notify_store::PgPool;
use notify_store::events::{self, FanoutJob};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Subscribers planned per transaction (one page). 2,000 halves the per-page statements
/// and commits of the former 1,000 and keeps a page's memory small (about 1 MiB of plans).
pub const BATCH: i64 = 2_000;
/// Pages in flight: the one holding the fence and writing, and the next one planning
/// (see the module docs).
pub const IN_FLIGHT: usize = 2;
/// How long a replica holds an event between checkpoints.
const HOLD: Duration = Duration::from_secs(30);

/// Runs until `shutdown`: wakes on `LISTEN notify_fanout` or every `poll`. Plans at
/// `clock`'s instant (the database's `now()` in production). The `LISTEN` connection
/// comes from `listen_pool` (`notify_store::Pools::session`).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    pool: PgPool,
    listen_pool: PgPool,
    max_attempts: i32,
    caps: std::collections::BTreeMap<Channel, u32>,
    clock: Clock,
    poll: Duration,
    direct: Option<(crate::relay::Direct, Duration)>,
    shutdown: CancellationToken,
) {
    let mut listener = match sqlx::postgres::PgListener::connect_with(&listen_pool).await {
        Ok(mut l) => match l.listen("notify_fanout").await {
            Ok(()) => Some(l),
            Err(e) => {
                warn!(error = %e, "fan-out cannot LISTEN; polling only");
                None
            }
        },
        Err(e) => {
            warn!(error = %e, "fan-out cannot LISTEN; polling only");
            None
        }
    };
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        match events::claim_fanout(&pool, HOLD).await {
            Ok(Some(job)) => {
                if let Err(e) =
                    fan_out(&pool, &job, max_attempts, &caps, &clock, &direct, &shutdown).await
                {
                    warn!(event_id = %job.event_id, error = %e, "fan-out interrupted; it resumes from its checkpoint");
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => warn!(error = %e, "fan-out claim failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
            _ = async {
                match listener.as_mut() {
                    // recv reconnects by itself; while Postgres is down it fails at once.
                    Some(l) => if l.recv().await.is_err() { tokio::time::sleep(poll).await },
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

/// What a page's task reports: whether it committed (false: the event was canceled, the
/// checkpoint was moved by another replica, or the page before did not commit).
type PageWrite = JoinHandle<notify_store::Result<bool>>;

async fn fan_out(
    pool: &PgPool,
    job: &FanoutJob,
    max_attempts: i32,
    caps: &std::collections::BTreeMap<Channel, u32>,
    clock: &Clock,
    direct: &Option<(crate::relay::Direct, Duration)>,
    shutdown: &CancellationToken,
) -> notify_store::Result<()> {
    let Some(ty) = notify_store::catalog::get_type(pool, &job.type_key).await? else {
        return Err(notify_store::StoreError::NotFound(format!(
            "notification type {:?}",
            job.type_key
        )));
    };
    let ctx = std::sync::Arc::new(PageContext {
        pool: pool.clone(),
        job: job.clone(),
        ty,
        max_attempts,
        caps: caps.clone(),
        clock: clock.clone(),
        direct: direct.clone(),
    });
    let mut inflight: VecDeque<PageWrite> = VecDeque::with_capacity(IN_FLIGHT);
    let mut cursor = job.cursor.clone();
    // Page k + 1 takes the fence only after page k reported it committed.
    let mut before: Option<oneshot::Receiver<bool>> = None;
    let outcome: notify_store::Result<()> = async {
        loop {
            while inflight.len() >= IN_FLIGHT {
                let oldest = inflight.pop_front().expect("len checked");
                if !join(oldest).await? {
                    return Ok(());
                }
            }
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let (committed, after) = oneshot::channel();
            let (read, page_read) = oneshot::channel();
            let page = ctx
                .clone()
                .page(cursor.clone(), before.replace(after), committed, read);
            inflight.push_back(tokio::spawn(page));
            // The page's subscribers tell where the next one starts (a failed read: the
            // page's task reports the error when joined).
            let Ok((next, done)) = page_read.await else {
                return Ok(());
            };
            if done {
                return Ok(());
            }
            cursor = next;
        }
    }
    .await;
    // Every page started is finished (committed or rolled back) before this returns.
    let mut first_error = None;
    while let Some(page) = inflight.pop_front() {
        if let Err(e) = join(page).await {
            first_error.get_or_insert(e);
        }
    }
    outcome?;
    first_error.map_or(Ok(()), Err)
}

async fn join(page: PageWrite) -> notify_store::Result<bool> {
    page.await.map_err(|e| notify_store::StoreError::Batch {
        message: format!("fan-out page task ended: {e}"),
        transient: true,
    })?
}

/// What every page of one fan-out shares.
struct PageContext {
    pool: PgPool,
    job: FanoutJob,
    ty: notify_store::catalog::NotificationType,
    max_attempts: i32,
    caps: std::collections::BTreeMap<Channel, u32>,
    clock: Clock,
    /// The relay each committed page's deliveries due now are handed to, and their hold.
    direct: Option<(crate::relay::Direct, Duration)>,
}

impl PageContext {
    /// Plans and writes the page after `cursor` in one transaction: reads its subscribers
    /// (sends `(last subscriber, last page)` on `read`), their facts and plans them; waits
    /// for the page before (`before`: None for the first); then takes the fence, leaves out
    /// recipients canceled meanwhile, applies fatigue caps, inserts, moves the checkpoint
    /// and commits. Sends whether it committed on `committed` (dropped on an error: the
    /// next page rolls back).
    async fn page(
        self: std::sync::Arc<Self>,
        cursor: String,
        before: Option<oneshot::Receiver<bool>>,
        committed: oneshot::Sender<bool>,
        read: oneshot::Sender<(String, bool)>,
    ) -> notify_store::Result<bool> {
        let job = &self.job;
        let ty = &self.ty;
        let mut tx = self.pool.begin().await?;
        let users = events::subscribers_page(&mut tx, &job.topic, &cursor, BATCH).await?;
        let done = (users.len() as i64) < BATCH;
        let next = users.last().cloned().unwrap_or_else(|| cursor.clone());
        let page_len = users.len() as i32;
        let _ = read.send((next.clone(), done));
        // Held until the commit: an erasure happens wholly before or after this page.
        // The lookups below find rows by key: a plan per statement, not per run.
        let database_now = notify_store::erasure::begin_planning(&mut tx).await?;
        let facts = notify_store::catalog::load_recipient_facts(&mut tx, &ty.key, &users).await?;
        // The database clock in production, like due times and leases (never the host's).
        let now = self.clock.at(database_now);
        let event = EventPlan {
            event_id: job.event_id,
            channels: &job.channels,
            critical: ty.critical,
            over_cap: ty.over_cap,
            derivation: &ty.derivation,
            // A scheduled event is planned at its due time (the fan-out itself runs at once).
            send_at: job.send_at,
            grouping: if job.line_multicast {
                Grouping::LineMulticast { page: &cursor }
            } else {
                Grouping::Alone
            },
            max_attempts: self.max_attempts,
        };
        let mut draft = event.draft(&facts, now);
        drop(facts);
        let before_committed = match before {
            Some(rx) => rx.await.unwrap_or(false),
            None => true,
        };
        // The cancellation fence: the event row FOR SHARE before anything is written, so a
        // cancel either waits for this page or this page sees it (and writes nothing).
        if !before_committed || events::lock_for_page(&mut tx, job.event_id).await? {
            tx.rollback().await?;
            let _ = committed.send(false);
            if before_committed {
                info!(event_id = %job.event_id, "fan-out stopped: the event was canceled");
            }
            return Ok(false);
        }
        let canceled = events::canceled_recipients(&mut tx, job.event_id, &users).await?;
        draft.without(&canceled);
        let mut counted = if self.caps.is_empty() {
            notify_core::fatigue::Counted::new()
        } else {
            let page: Vec<&str> = users
                .iter()
                .filter(|u| !canceled.contains(*u))
                .map(String::as_str)
                .collect();
            events::counted_toward_caps(&mut tx, &page).await?
        };
        let (planned, skipped) = event.finish(draft, &self.caps, &mut counted);
        let rows: Vec<(uuid::Uuid, &notify_store::events::NewDelivery)> =
            planned.iter().map(|d| (job.event_id, d)).collect();
        let mut held = insert_planned(&mut tx, &rows, &self.direct).await?;
        drop(rows);
        events::insert_skips(&mut tx, job.event_id, &skipped).await?;
        if !events::advance_fanout(&mut tx, job.event_id, &cursor, &next, page_len, done, HOLD)
            .await?
        {
            tx.rollback().await?;
            let _ = committed.send(false);
            warn!(event_id = %job.event_id, "fan-out checkpoint moved by another replica; leaving it");
            return Ok(false);
        }
        tx.commit().await?;
        let _ = committed.send(true);
        if let Some((direct, hold)) = &self.direct {
            let trace: Option<std::sync::Arc<str>> = job.trace_context.as_deref().map(Into::into);
            for origin in held.iter_mut().flat_map(|row| row.origins.iter_mut()) {
                origin.trace_context.clone_from(&trace);
            }
            // Back-pressure: while this page waits for room in the relay, the next one
            // may write, and the one after waits for this task (IN_FLIGHT).
            direct.publish_paced(held, *hold / 4).await;
        }
        count_derived(&ty.derivation, &planned, &skipped);
        if done {
            info!(event_id = %job.event_id, topic = %job.topic, "fan-out done");
        }
        Ok(true)
    }
}
