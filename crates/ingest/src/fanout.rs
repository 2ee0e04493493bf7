//! Topic fan-out: plans the deliveries of a topic event in the background, 1,000
//! subscribers per transaction. Each transaction writes the batch's deliveries, outbox rows
//! and skipped pairs together with the checkpoint (the last subscriber planned), so a crash
//! resumes exactly after the last committed batch and never duplicates. Any number of
//! ingest replicas may run it: an event is held by one replica at a time, and the
//! checkpoint update is fenced by the previous cursor. Each page takes the event row
//! `FOR SHARE` first: a canceled event's fan-out stops (its checkpoint kept, status
//! `canceled`), and recipients canceled alone get no delivery.

use crate::clock::Clock;
use crate::planning::{add_derived, count_derived, new_deliveries};
use notify_core::Channel;
use notify_core::plan::{merge_line_multicast, plan};
use notify_store::PgPool;
use notify_store::events::{self, FanoutJob};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Subscribers planned per transaction.
pub const BATCH: i64 = 1_000;
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

async fn fan_out(
    pool: &PgPool,
    job: &FanoutJob,
    max_attempts: i32,
    caps: &std::collections::BTreeMap<Channel, u32>,
    clock: &Clock,
    shutdown: &CancellationToken,
) -> notify_store::Result<()> {
    let Some(ty) = notify_store::catalog::get_type(pool, &job.type_key).await? else {
        return Err(notify_store::StoreError::NotFound(format!(
            "notification type {:?}",
            job.type_key
        )));
    };
    let channels: Vec<Channel> = job.channels.clone();
    let mut cursor = job.cursor.clone();
    loop {
        if shutdown.is_cancelled() {
            return Ok(());
        }
        let mut tx = pool.begin().await?;
        // The cancellation fence: the event row FOR SHARE before anything is planned, so a
        // cancel either waits for this page or this page sees it (and writes nothing).
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
        if !caps.is_empty() {
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
        events::insert_deliveries(&mut tx, job.event_id, &planned).await?;
        events::insert_skips(&mut tx, job.event_id, &skipped).await?;
        if !events::advance_fanout(&mut tx, job.event_id, &cursor, &next, page_len, done, HOLD)
            .await?
        {
            tx.rollback().await?;
            warn!(event_id = %job.event_id, "fan-out checkpoint moved by another replica; leaving it");
            return Ok(());
        }
        tx.commit().await?;
        count_derived(&ty.derivation, &planned, &skipped);
        cursor = next;
        if done {
            info!(event_id = %job.event_id, topic = %job.topic, "fan-out done");
            return Ok(());
        }
    }
}
