//! Retention: what old data goes, and when (docs/data.md, "Retention").
//!
//! One purge pass ([`purge`]) does, for every notification type with its own lengths or
//! the global ones ([`Retention`]):
//!
//! 1. **Content.** Attempts that finished more than `content` ago lose what was sent and
//!    the provider's raw answer (`content_json`, `provider_response` set to NULL); the
//!    attempt row (outcome, status code, error code, times) stays with its delivery.
//! 2. **Deliveries and events.** A delivery in a final state (`sent`, `failed`,
//!    `canceled`, `skipped`) whose last change is more than `deliveries` ago is deleted
//!    with its attempts, clicks, digest links, inbox row and final status-webhook
//!    messages. `pending` and `sending` deliveries are never deleted, whatever their age.
//!    An event goes (with its skips and recipient cancellations) once it is older than
//!    `deliveries` and none of its deliveries is left, so its `event_key` stays a
//!    duplicate as long as any of its deliveries is kept; a key replayed after that is a
//!    new event.
//! 3. **Archived inbox items** go `archived_inbox` after their last change (archiving,
//!    or a click after it). An inbox item that is never archived goes with its delivery.
//!
//! Every statement deletes or updates at most `batch` rows in its own short transaction,
//! with a pause between batches, so no lock is held long and the rows it touches are
//! old rows nobody else writes: the writer, the fan-out, the workers and the relay never
//! wait for it. Vacuum makes the freed space reusable (the hot tables autovacuum at 2 %
//! dead rows, migrations/20261202000032_retention.sql).
//!
//! Safe with any number of ingest replicas: a pass runs only while it holds a session
//! advisory lock ([`PURGE_LOCK`]), so one replica purges at a time and the others skip
//! their turn; every batch also locks its events and deliveries `FOR UPDATE SKIP
//! LOCKED`, so even two passes at once would delete disjoint rows and never wait for
//! each other (or for a fan-out page holding its event, a cancel, or a worker's record).
//!
//! Console counts: a deleted delivery leaves the counts (the delete trigger of
//! migrations/20261201000029 appends its -1), so the overview always equals the rows
//! held. With retention longer than the overview's day nothing it shows changes; attempts'
//! counts are not decreased (there is no delete trigger on attempts).

use crate::Result;
use chrono::{DateTime, Utc};
use notify_core::DeliveryStatus;
use sqlx::{PgExecutor, Row};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The advisory lock key of a purge pass (`pg_try_advisory_lock`): "retention" in ASCII.
pub const PURGE_LOCK: i64 = 0x7265_7465_6e74_696f;

/// Delivery states a purge may delete: the final ones ([`DeliveryStatus::is_final`]).
/// `pending` and `sending` are never in it.
pub const FINAL_STATES: &[DeliveryStatus] = &[
    DeliveryStatus::Sent,
    DeliveryStatus::Failed,
    DeliveryStatus::Canceled,
    DeliveryStatus::Skipped,
];

/// How long data is kept: the global setting (`NOTIFY_RETENTION_*`), or a type's
/// lengths after its overrides ([`TypeRetention::over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long an attempt keeps the content it sent and the provider's raw answer,
    /// counted from the attempt's end. Default 30 days.
    pub content: Duration,
    /// How long a final delivery (and its attempts) is kept after its last change; an
    /// event is kept until all its deliveries went, and at least this long. Default 180
    /// days.
    pub deliveries: Duration,
    /// How long an archived inbox item is kept after its last change. Default 90 days.
    pub archived_inbox: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            content: Duration::from_secs(30 * 86_400),
            deliveries: Duration::from_secs(180 * 86_400),
            archived_inbox: Duration::from_secs(90 * 86_400),
        }
    }
}

/// A notification type's own retention lengths, in seconds; `None` = the global one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TypeRetention {
    /// Overrides [`Retention::content`].
    pub content_s: Option<i32>,
    /// Overrides [`Retention::deliveries`].
    pub deliveries_s: Option<i32>,
    /// Overrides [`Retention::archived_inbox`].
    pub archived_inbox_s: Option<i32>,
}

impl TypeRetention {
    /// The lengths that apply to the type: each override, or the global value.
    pub fn over(&self, global: &Retention) -> Retention {
        let or = |s: Option<i32>, d: Duration| {
            s.map_or(d, |s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
        };
        Retention {
            content: or(self.content_s, global.content),
            deliveries: or(self.deliveries_s, global.deliveries),
            archived_inbox: or(self.archived_inbox_s, global.archived_inbox),
        }
    }
}

/// How a pass goes about it.
#[derive(Debug, Clone, Copy)]
pub struct PurgeLimits {
    /// Most rows one statement deletes or clears (and most events one batch looks at).
    pub batch: i64,
    /// Pause after each batch's commit, leaving the database to the hot path.
    pub pause: Duration,
}

impl Default for PurgeLimits {
    fn default() -> Self {
        Self {
            batch: 1_000,
            pause: Duration::from_millis(20),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    /// Attempts whose content and provider answer were cleared.
    pub attempts_cleared: u64,
    /// Deliveries deleted.
    pub deliveries: u64,
    /// Attempts deleted with their deliveries.
    pub attempts: u64,
    /// Events deleted.
    pub events: u64,
    /// Inbox items deleted (with their delivery, or archived long ago).
    pub inbox: u64,
    /// Batches committed.
    pub batches: u64,
    /// Batches given up because a row they needed stayed locked past
    /// [`LOCK_TIMEOUT`] (a user acting on an old inbox item at that moment): their rows
    /// are taken by the next pass.
    pub batches_skipped: u64,
}

impl Purged {
    /// Whether the pass deleted and cleared nothing.
    pub fn is_nothing(&self) -> bool {
        self.attempts_cleared + self.deliveries + self.attempts + self.events + self.inbox == 0
    }
}

/// Longest a purge statement waits for a row lock another transaction holds, so a
/// purge never makes anyone wait longer than this either (the batch gives way).
pub const LOCK_TIMEOUT: &str = "100ms";

/// Whether `e` is Postgres giving up on a lock (SQLSTATE 55P03, `lock_timeout`).
fn is_lock_timeout(e: &crate::StoreError) -> bool {
    matches!(e, crate::StoreError::Db(sqlx::Error::Database(d)) if d.code().as_deref() == Some("55P03"))
}

/// Runs one purge pass at the instant `now` (the database's `now()` in production; a
/// test passes a later instant instead of waiting). Returns `None` without touching
/// anything when another pass holds [`PURGE_LOCK`]. Stops between batches once
/// `shutdown` is cancelled (what was committed stays; the next pass goes on).
///
/// # Errors
/// `StoreError::Db` when a statement fails; batches committed before it stay.
pub async fn purge(
    db: &sqlx::PgPool,
    global: &Retention,
    limits: PurgeLimits,
    now: DateTime<Utc>,
    shutdown: &CancellationToken,
) -> Result<Option<Purged>> {
    let mut conn = db.acquire().await?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(PURGE_LOCK)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        return Ok(None);
    }
    let result = purge_locked(&mut conn, global, limits, now, shutdown).await;
    // A connection that failed mid-pass may not answer; closing it releases the lock.
    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(PURGE_LOCK)
        .execute(&mut *conn)
        .await;
    if unlocked.is_err() {
        let _ = conn.close().await;
    }
    result.map(Some)
}

/// The types' lengths after their overrides.
pub async fn type_retentions(
    db: impl PgExecutor<'_>,
    global: &Retention,
) -> Result<Vec<(String, Retention)>> {
    let rows = sqlx::query(
        "SELECT key, content_retention_s, delivery_retention_s, archived_inbox_retention_s
         FROM notification_types ORDER BY key",
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let t = TypeRetention {
                content_s: r.get("content_retention_s"),
                deliveries_s: r.get("delivery_retention_s"),
                archived_inbox_s: r.get("archived_inbox_retention_s"),
            };
            (r.get("key"), t.over(global))
        })
        .collect())
}

async fn purge_locked(
    conn: &mut sqlx::PgConnection,
    global: &Retention,
    limits: PurgeLimits,
    now: DateTime<Utc>,
    shutdown: &CancellationToken,
) -> Result<Purged> {
    let batch = limits.batch.max(1);
    let types = type_retentions(&mut *conn, global).await?;
    let mut done = Purged::default();
    let pause = |done: &mut Purged| {
        done.batches += 1;
        tokio::time::sleep(limits.pause)
    };

    // 1. Content, once per distinct length in use.
    let lengths: BTreeSet<u64> = types
        .iter()
        .map(|(_, r)| r.content.as_secs())
        .chain([global.content.as_secs()])
        .collect();
    for length in lengths {
        let cutoff = before(now, Duration::from_secs(length));
        loop {
            if shutdown.is_cancelled() {
                return Ok(done);
            }
            let (scanned, cleared) =
                clear_content_batch(conn, global, &types, length, cutoff, batch).await?;
            done.attempts_cleared += cleared;
            pause(&mut done).await;
            if scanned < batch as u64 {
                break;
            }
        }
    }

    // 2. Deliveries and events, type by type, walking the type's events in id order.
    // Events have a few deliveries each (a broadcast has more: its deliveries still go
    // `batch` at a time).
    let event_batch = (batch / 2).max(1);
    for (key, r) in &types {
        let cutoff = before(now, r.deliveries);
        let mut after = Uuid::nil();
        loop {
            if shutdown.is_cancelled() {
                return Ok(done);
            }
            let events: Vec<Uuid> = sqlx::query_scalar(
                "SELECT id FROM notification_events
                 WHERE type = $1 AND id > $2 AND id < $3 AND created_at < $4
                   AND fanout_status <> 'pending'
                 ORDER BY id LIMIT $5",
            )
            .bind(key)
            .bind(after)
            .bind(crate::console::uuid_v7_floor(cutoff))
            .bind(cutoff)
            .bind(event_batch)
            .fetch_all(&mut *conn)
            .await?;
            let Some(last) = events.last().copied() else {
                break;
            };
            // The deliveries of these events, `batch` at a time; then the events left
            // with none.
            loop {
                let (deliveries, n) =
                    match purge_deliveries_batch(conn, &events, cutoff, batch).await {
                        Ok(done) => done,
                        Err(e) if is_lock_timeout(&e) => {
                            done.batches_skipped += 1;
                            break;
                        }
                        Err(e) => return Err(e),
                    };
                done.deliveries += deliveries;
                done.attempts += n.attempts;
                done.inbox += n.inbox;
                done.events += n.events;
                pause(&mut done).await;
                if deliveries < batch as u64 || shutdown.is_cancelled() {
                    break;
                }
            }
            after = last;
            if (events.len() as i64) < event_batch {
                break;
            }
        }
    }

    // 3. Archived inbox items.
    for (key, r) in &types {
        let cutoff = before(now, r.archived_inbox);
        loop {
            if shutdown.is_cancelled() {
                return Ok(done);
            }
            let n = sqlx::query(
                "DELETE FROM notifications WHERE id IN (
                     SELECT id FROM notifications
                     WHERE type = $1 AND status = 'archived' AND updated_at < $2
                     LIMIT $3 FOR UPDATE SKIP LOCKED)",
            )
            .bind(key)
            .bind(cutoff)
            .bind(batch)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            done.inbox += n;
            pause(&mut done).await;
            if n < batch as u64 {
                break;
            }
        }
    }
    Ok(done)
}

/// `now - d`, saturating.
fn before(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(d)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// One batch of content clearing for the retention length `length_s`: the next `batch`
/// attempts after this length's cursor, in id order; those that finished before `cutoff`
/// and whose type keeps content for exactly this length are cleared; the cursor moves up
/// to the first attempt not yet old enough. Returns (attempts passed, attempts cleared).
async fn clear_content_batch(
    conn: &mut sqlx::PgConnection,
    global: &Retention,
    types: &[(String, Retention)],
    length_s: u64,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<(u64, u64)> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    // One pass per length at a time (a concurrent pass waits here, then reads the moved
    // cursor).
    let cursor: i64 = sqlx::query_scalar(
        "INSERT INTO retention_cursors (duration_s, last_attempt_id) VALUES ($1, 0)
         ON CONFLICT (duration_s) DO UPDATE SET duration_s = EXCLUDED.duration_s
         RETURNING last_attempt_id",
    )
    .bind(length_s as i64)
    .fetch_one(&mut *tx)
    .await?;
    let rows = sqlx::query(
        "SELECT a.id, a.finished_at < $3 AS old,
                (a.content_json IS NOT NULL OR a.provider_response IS NOT NULL) AS kept,
                e.type
         FROM (SELECT id, delivery_id, finished_at, content_json, provider_response
               FROM delivery_attempts WHERE id > $1 ORDER BY id LIMIT $2) a
         LEFT JOIN notification_deliveries d ON d.id = a.delivery_id
         LEFT JOIN notification_events e ON e.id = d.event_id
         ORDER BY a.id",
    )
    .bind(cursor)
    .bind(batch)
    .bind(cutoff)
    .fetch_all(&mut *tx)
    .await?;
    let content: std::collections::HashMap<&str, Duration> =
        types.iter().map(|(k, r)| (k.as_str(), r.content)).collect();
    let mut clear = Vec::new();
    let mut passed = cursor;
    let mut scanned = 0u64;
    for r in &rows {
        if !r.get::<bool, _>("old") {
            break;
        }
        scanned += 1;
        passed = r.get("id");
        let ty: Option<String> = r.get("type");
        let length = ty
            .and_then(|t| content.get(t.as_str()).copied())
            .unwrap_or(global.content);
        if r.get::<bool, _>("kept") && length.as_secs() == length_s {
            clear.push(r.get::<i64, _>("id"));
        }
    }
    let cleared = if clear.is_empty() {
        0
    } else {
        sqlx::query(
            "UPDATE delivery_attempts SET content_json = NULL, provider_response = NULL
             WHERE id = ANY($1)",
        )
        .bind(&clear)
        .execute(&mut *tx)
        .await?
        .rows_affected()
    };
    sqlx::query(
        "UPDATE retention_cursors SET last_attempt_id = $2, updated_at = now()
         WHERE duration_s = $1",
    )
    .bind(length_s as i64)
    .bind(passed)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok((scanned, cleared))
}

/// Rows deleted with a batch of deliveries.
#[derive(Debug, Default)]
struct Deleted {
    attempts: u64,
    inbox: u64,
    events: u64,
}

/// One transaction: up to `batch` final deliveries of `events` last changed before
/// `cutoff` (none with a status webhook still to send), with their children, then the
/// events of the list that are left without deliveries or digest links. Returns the
/// deliveries deleted.
async fn purge_deliveries_batch(
    conn: &mut sqlx::PgConnection,
    events: &[Uuid],
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<(u64, Deleted)> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(LOCK_TIMEOUT)
        .execute(&mut *tx)
        .await?;
    let mut n = Deleted::default();
    // The events first (a fan-out page or a cancel holding one is skipped, and waits for
    // nothing here), in id order.
    let held: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM notification_events
         WHERE id = ANY($1) AND fanout_status <> 'pending'
         ORDER BY id FOR UPDATE SKIP LOCKED",
    )
    .bind(events)
    .fetch_all(&mut *tx)
    .await?;
    // Final rows only; FOR UPDATE re-checks the status of a row changed meanwhile (a
    // console retry back to pending is not taken).
    let deliveries: Vec<Uuid> = sqlx::query_scalar(
        "SELECT d.id FROM notification_deliveries d
         WHERE d.event_id = ANY($1) AND d.status = ANY($2) AND d.updated_at < $3
           AND NOT EXISTS (SELECT 1 FROM webhook_messages m
                           WHERE m.delivery_id = d.id AND m.status IN ('pending', 'sending'))
         ORDER BY d.id LIMIT $4 FOR UPDATE OF d SKIP LOCKED",
    )
    .bind(&held)
    .bind(FINAL_STATES.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    .bind(cutoff)
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    if !deliveries.is_empty() {
        // Children first: clicks and digest links hold foreign keys to the delivery; the
        // attempts, inbox rows and webhook messages carry none (migration 028).
        n.attempts = sqlx::query("DELETE FROM delivery_attempts WHERE delivery_id = ANY($1)")
            .bind(&deliveries)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        for statement in [
            "DELETE FROM delivery_clicks WHERE delivery_id = ANY($1)",
            "DELETE FROM digest_items WHERE delivery_id = ANY($1)",
            // Their webhook_attempts go with them (ON DELETE CASCADE).
            "DELETE FROM webhook_messages WHERE delivery_id = ANY($1)",
        ] {
            sqlx::query(statement)
                .bind(&deliveries)
                .execute(&mut *tx)
                .await?;
        }
        n.inbox = sqlx::query("DELETE FROM notifications WHERE delivery_id = ANY($1)")
            .bind(&deliveries)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM notification_deliveries WHERE id = ANY($1)")
            .bind(&deliveries)
            .execute(&mut *tx)
            .await?;
    }
    let gone: Vec<Uuid> = sqlx::query_scalar(
        "SELECT e.id FROM unnest($1::uuid[]) AS e (id)
         WHERE NOT EXISTS (SELECT 1 FROM notification_deliveries d WHERE d.event_id = e.id)
           AND NOT EXISTS (SELECT 1 FROM digest_items i WHERE i.event_id = e.id)",
    )
    .bind(&held)
    .fetch_all(&mut *tx)
    .await?;
    if !gone.is_empty() {
        for statement in [
            "DELETE FROM delivery_skips WHERE event_id = ANY($1)",
            "DELETE FROM event_cancellations WHERE event_id = ANY($1)",
        ] {
            sqlx::query(statement).bind(&gone).execute(&mut *tx).await?;
        }
        n.events = sqlx::query("DELETE FROM notification_events WHERE id = ANY($1)")
            .bind(&gone)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    tx.commit().await?;
    Ok((deliveries.len() as u64, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_types_overrides_replace_only_the_lengths_it_sets() {
        let global = Retention::default();
        let t = TypeRetention {
            deliveries_s: Some(60),
            ..Default::default()
        };
        let r = t.over(&global);
        assert_eq!(r.deliveries, Duration::from_secs(60));
        assert_eq!(r.content, global.content);
        assert_eq!(r.archived_inbox, global.archived_inbox);
    }
}
