//! Topic fan-out: plans the deliveries of a topic event in the background, [`BATCH`]
//! subscribers per transaction. Each transaction writes the page's deliveries, outbox rows
//! and skipped pairs together with the checkpoint (the last subscriber planned), so a crash
//! resumes exactly after the last committed page and never duplicates. Any number of
//! ingest replicas may run it: an event is held by one replica at a time, and the
//! checkpoint update is fenced by the previous cursor. Each page takes the event row
//! `FOR KEY SHARE` first (the cancellation fence): a canceled event's fan-out stops (its
//! checkpoint kept, status `canceled`), and recipients canceled alone get no delivery.
//!
//! Two pages are in flight ([`IN_FLIGHT`]): while page k's rows are inserted, page k + 1
//! is read, planned and inserted on a second connection, so the planning in Rust and the
//! two inserts use both the ingest's and Postgres's cores. Page k + 1 moves the checkpoint
//! (from page k's last subscriber) and commits only after page k committed; if page k
//! failed or was fenced off, page k + 1 rolls back. The checkpoint therefore still moves
//! one page at a time, in order.

use crate::clock::Clock;
use crate::planning::{add_derived, count_derived, new_deliveries};
use notify_core::Channel;
use notify_core::plan::{merge_line_multicast, plan};
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
/// Pages written at once: the page being planned and inserted, and the one before it
/// finishing (see the module docs).
pub const IN_FLIGHT: usize = 2;
/// How long a replica holds an event between checkpoints.
const HOLD: Duration = Duration::from_secs(30);

/// Runs until `shutdown`: wakes on `LISTEN notify_fanout` or every `poll`. Plans at
/// `clock`'s instant (the database's `now()` in production).
pub async fn run(
    pool: PgPool,
    max_attempts: i32,
    caps: std::collections::BTreeMap<Channel, u32>,
    clock: Clock,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
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
                if let Err(e) = fan_out(&pool, &job, max_attempts, &caps, &clock, &shutdown).await {
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

/// What a page's write task reports: whether it committed (false: fenced off by another
/// replica's checkpoint, or the page before it did not commit).
type PageWrite = JoinHandle<notify_store::Result<bool>>;

async fn fan_out(
    pool: &PgPool,
    job: &FanoutJob,
    max_attempts: i32,
    caps: &std::collections::BTreeMap<Channel, u32>,
    clock: &Clock,
    shutdown: &CancellationToken,
) -> notify_store::Result<()> {
    let mut inflight: VecDeque<PageWrite> = VecDeque::with_capacity(IN_FLIGHT);
    let outcome = plan_pages(
        pool,
        job,
        max_attempts,
        caps,
        clock,
        shutdown,
        &mut inflight,
    )
    .await;
    // Every page started is finished (committed or rolled back) before this returns.
    let mut all_committed = true;
    let mut first_error = None;
    while let Some(page) = inflight.pop_front() {
        match join(page).await {
            Ok(committed) => all_committed &= committed,
            Err(e) => {
                all_committed = false;
                first_error.get_or_insert(e);
            }
        }
    }
    outcome?;
    if let Some(e) = first_error {
        return Err(e);
    }
    if !all_committed {
        warn!(event_id = %job.event_id, "fan-out checkpoint moved by another replica; leaving it");
    }
    Ok(())
}

async fn join(page: PageWrite) -> notify_store::Result<bool> {
    page.await.map_err(|e| notify_store::StoreError::Batch {
        message: format!("fan-out page task ended: {e}"),
        transient: true,
    })?
}

/// Plans page after page, each written by a task of its own (at most [`IN_FLIGHT`]).
/// Returns when the last page is started, the event is canceled, a page did not commit,
/// or on `shutdown`.
async fn plan_pages(
    pool: &PgPool,
    job: &FanoutJob,
    max_attempts: i32,
    caps: &std::collections::BTreeMap<Channel, u32>,
    clock: &Clock,
    shutdown: &CancellationToken,
    inflight: &mut VecDeque<PageWrite>,
) -> notify_store::Result<()> {
    let Some(ty) = notify_store::catalog::get_type(pool, &job.type_key).await? else {
        return Err(notify_store::StoreError::NotFound(format!(
            "notification type {:?}",
            job.type_key
        )));
    };
    let ty = std::sync::Arc::new(ty);
    let channels: Vec<Channel> = job.channels.clone();
    let mut cursor = job.cursor.clone();
    // Page k + 1 commits only after page k reported it committed.
    let mut before: Option<oneshot::Receiver<bool>> = None;
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
        let mut tx = pool.begin().await?;
        // The cancellation fence: the event row FOR KEY SHARE before anything is planned,
        // so a cancel either waits for this page or this page sees it (and writes nothing).
        if events::lock_for_page(&mut tx, job.event_id).await? {
            tx.rollback().await?;
            info!(event_id = %job.event_id, "fan-out stopped: the event was canceled");
            return Ok(());
        }
        let mut users = events::subscribers_page(&mut tx, &job.topic, &cursor, BATCH).await?;
        let done = (users.len() as i64) < BATCH;
        let next = users.last().cloned().unwrap_or_else(|| cursor.clone());
        let page_len = users.len() as i32;
        let canceled = events::canceled_recipients(&mut tx, job.event_id, &users).await?;
        users.retain(|u| !canceled.contains(u));
        let facts = notify_store::catalog::load_recipient_facts(&mut tx, &ty.key, &users).await?;
        // The database clock in production, like due times and leases (never the host's).
        let now = clock.now(&mut tx).await?;
        // A scheduled event is planned at its due time (the fan-out itself runs at once).
        let now = job.send_at.map_or(now, |t| t.max(now));
        let scheduled = job.send_at.is_some();
        let (mut planned, mut skipped) =
            plan(job.event_id, ty.critical, &channels, &facts, now, scheduled);
        add_derived(
            job.event_id,
            ty.critical,
            &ty.derivation,
            &facts,
            (now, scheduled),
            &mut planned,
            &mut skipped,
        );
        drop(facts);
        if !caps.is_empty() {
            // This page's users are not in the page still being written: the counts it
            // reads are not changed by that page.
            let page: Vec<&str> = users.iter().map(String::as_str).collect();
            let mut counted = events::counted_toward_caps(&mut tx, &page).await?;
            let over = ty.over_cap;
            planned = notify_core::fatigue::apply_caps(
                planned,
                &mut skipped,
                caps,
                ty.critical,
                over,
                now,
                &mut counted,
            );
        }
        if job.line_multicast {
            let due = scheduled.then_some(now);
            planned = merge_line_multicast(job.event_id, &cursor, planned, due);
        }
        let planned = new_deliveries(planned, max_attempts);
        let (committed, after) = oneshot::channel();
        let page = Page {
            event_id: job.event_id,
            from: std::mem::replace(&mut cursor, next),
            to: cursor.clone(),
            page_len,
            done,
            planned,
            skipped,
            ty: ty.clone(),
        };
        inflight.push_back(tokio::spawn(page.write(
            tx,
            before.replace(after),
            committed,
        )));
        if done {
            return Ok(());
        }
    }
}

/// One planned page, written by its own task.
struct Page {
    event_id: uuid::Uuid,
    from: String,
    to: String,
    page_len: i32,
    done: bool,
    planned: Vec<notify_store::events::NewDelivery>,
    skipped: Vec<notify_core::SkippedDelivery>,
    ty: std::sync::Arc<notify_store::catalog::NotificationType>,
}

impl Page {
    /// Inserts the page's rows in `tx` (taken under the fence), waits for the page before
    /// it (`before`: None for the first), then moves the checkpoint and commits. Sends
    /// whether it committed on `committed`; a failure drops it (the next page rolls back).
    async fn write(
        self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        before: Option<oneshot::Receiver<bool>>,
        committed: oneshot::Sender<bool>,
    ) -> notify_store::Result<bool> {
        events::insert_deliveries(&mut tx, self.event_id, &self.planned).await?;
        events::insert_skips(&mut tx, self.event_id, &self.skipped).await?;
        let before_committed = match before {
            Some(rx) => rx.await.unwrap_or(false),
            None => true,
        };
        if !before_committed {
            tx.rollback().await?;
            let _ = committed.send(false);
            return Ok(false);
        }
        if !events::advance_fanout(
            &mut tx,
            self.event_id,
            &self.from,
            &self.to,
            self.page_len,
            self.done,
            HOLD,
        )
        .await?
        {
            tx.rollback().await?;
            let _ = committed.send(false);
            return Ok(false);
        }
        tx.commit().await?;
        let _ = committed.send(true);
        count_derived(&self.ty.derivation, &self.planned, &self.skipped);
        if self.done {
            info!(event_id = %self.event_id, "fan-out done");
        }
        Ok(true)
    }
}
