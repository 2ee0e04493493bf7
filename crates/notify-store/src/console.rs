//! What the operations console reads and the actions it takes, each action recorded in
//! `console_audit` with who and when.

use crate::row::parse;
use crate::{Result, StoreError};
use chrono::{DateTime, Utc};
use notify_core::{Channel, DeliveryStatus};
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// One channel's figures for the overview.
#[derive(Debug, Clone)]
pub struct ChannelOverview {
    /// The channel.
    pub channel: Channel,
    /// Deliveries created in the last hour, by status, in [`OVERVIEW_STATUSES`] order.
    pub last_hour: [i64; OVERVIEW_STATUSES.len()],
    /// The same for the last day.
    pub last_day: [i64; OVERVIEW_STATUSES.len()],
    /// Age in seconds of the oldest pending delivery that is due.
    pub oldest_pending_s: Option<i64>,
    /// Share of the last hour's attempts (finished since the minute an hour ago) that
    /// ended in a retry; `None` with no attempt.
    pub retry_rate: Option<f64>,
}

/// The statuses counted in [`ChannelOverview::last_hour`] and `last_day`, in that order.
pub const OVERVIEW_STATUSES: [DeliveryStatus; 6] = [
    DeliveryStatus::Pending,
    DeliveryStatus::Sending,
    DeliveryStatus::Sent,
    DeliveryStatus::Failed,
    DeliveryStatus::Canceled,
    DeliveryStatus::Skipped,
];

/// The smallest UUIDv7 (RFC 9562) of the millisecond `t`: delivery and event ids are
/// time-ordered, so "created since t" is a range scan of the primary key.
pub fn uuid_v7_floor(t: DateTime<Utc>) -> Uuid {
    let ms = t.timestamp_millis().max(0) as u64;
    let mut b = [0u8; 16];
    b[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    b[6] = 0x70;
    b[8] = 0x80;
    Uuid::from_bytes(b)
}

/// Per-channel figures and the outbox lag (age in seconds of the oldest due outbox row).
///
/// The counts come from `delivery_counts` and the deltas not rolled up yet
/// (`delivery_count_deltas`), both kept by triggers on `notification_deliveries` and
/// `delivery_attempts` (migration `20261201000029_console_overview.sql`), read in one
/// statement: exact at any moment, by minute. "The last hour" is the deliveries created
/// (and the attempts finished) since the start of the minute an hour ago, "the last day"
/// the same from a day ago (database clock).
pub async fn overview(db: &PgPool) -> Result<(Vec<ChannelOverview>, Option<i64>)> {
    let mut out: Vec<ChannelOverview> = Channel::ALL
        .iter()
        .map(|&channel| ChannelOverview {
            channel,
            last_hour: [0; OVERVIEW_STATUSES.len()],
            last_day: [0; OVERVIEW_STATUSES.len()],
            oldest_pending_s: None,
            retry_rate: None,
        })
        .collect();
    let rows = sqlx::query(
        "SELECT channel, kind, state,
                coalesce(sum(n) FILTER (WHERE minute >= date_bin('1 minute', now() - interval '1 hour', timestamptz '2000-01-01 00:00:00+00')), 0)::bigint AS hour,
                sum(n)::bigint AS day
         FROM (SELECT minute, channel, kind, state, n FROM delivery_counts
               WHERE minute >= date_bin('1 minute', now() - interval '1 day', timestamptz '2000-01-01 00:00:00+00')
               UNION ALL
               SELECT minute, channel, kind, state, n FROM delivery_count_deltas
               WHERE minute >= date_bin('1 minute', now() - interval '1 day', timestamptz '2000-01-01 00:00:00+00')) c
         GROUP BY channel, kind, state",
    )
    .fetch_all(db)
    .await?;
    // Attempts of the last hour per channel: (retry, all).
    let mut attempts = [(0i64, 0i64); Channel::ALL.len()];
    for r in rows {
        let channel: Channel = parse(&r, "channel")?;
        let Some(c) = Channel::ALL.iter().position(|c| *c == channel) else {
            continue;
        };
        let (kind, state): (String, String) = (r.get("kind"), r.get("state"));
        let (hour, day): (i64, i64) = (r.get("hour"), r.get("day"));
        if kind == COUNT_KIND_ATTEMPT {
            attempts[c].1 += hour;
            if state == ATTEMPT_RETRY {
                attempts[c].0 += hour;
            }
            continue;
        }
        let status: DeliveryStatus = parse(&r, "state")?;
        if let Some(i) = OVERVIEW_STATUSES.iter().position(|s| *s == status) {
            out[c].last_hour[i] = hour;
            out[c].last_day[i] = day;
        }
    }
    for (o, (retry, all)) in out.iter_mut().zip(attempts) {
        o.retry_rate = (all > 0).then(|| retry as f64 / all as f64);
    }
    // The partial index `notification_deliveries_channel_due` ((channel, next_attempt_at)
    // WHERE pending): one probe per channel for its earliest pending delivery, whatever
    // the backlog (a pass over the due rows took 0.6 s with 1 M pending).
    let rows = sqlx::query(
        "SELECT ch.channel, extract(epoch FROM now() - o.at)::bigint AS age
         FROM unnest($1::text[]) AS ch(channel),
         LATERAL (SELECT min(d.next_attempt_at) AS at FROM notification_deliveries d
                  WHERE d.channel = ch.channel AND d.status = 'pending') o
         WHERE o.at <= now()",
    )
    .bind(Channel::ALL.map(Channel::as_str).as_slice())
    .fetch_all(db)
    .await?;
    for r in rows {
        let channel: Channel = parse(&r, "channel")?;
        if let Some(o) = out.iter_mut().find(|o| o.channel == channel) {
            o.oldest_pending_s = r.get("age");
        }
    }
    let lag: Option<i64> = sqlx::query_scalar(
        "SELECT extract(epoch FROM now() - min(available_at))::bigint FROM outbox WHERE available_at <= now()",
    )
    .fetch_one(db)
    .await?;
    Ok((out, lag))
}

/// `delivery_counts.kind` of attempts by outcome (the other kind is `status`).
const COUNT_KIND_ATTEMPT: &str = "attempt";
/// `delivery_attempts.outcome` of an attempt that ended in a retry.
const ATTEMPT_RETRY: &str = "retry";

/// How many days of minutes `delivery_counts` keeps: the overview reads one; the rest is
/// slack for a clock that moved and for a slow rollup.
pub const COUNTS_KEPT: chrono::Duration = chrono::Duration::days(2);

/// Folds up to `batch` deltas of `delivery_count_deltas` into `delivery_counts` in one
/// transaction and deletes the minutes older than [`COUNTS_KEPT`]; returns how many
/// deltas it folded (less than `batch`: none are left that it could take).
///
/// Safe with any number of ingest replicas at once: each takes deltas with `FOR UPDATE
/// SKIP LOCKED`, so two rollups fold disjoint rows and never wait for each other there,
/// and each adds into the summary rows in key order, so two that meet on the same
/// minutes wait in one order (no deadlock). The delete and the add commit together, so a
/// reader sees every delta exactly once, before or after.
pub async fn roll_up_counts(db: &PgPool, batch: i64) -> Result<u64> {
    let mut tx = db.begin().await?;
    let folded: i64 = sqlx::query_scalar(
        "WITH taken AS (
             DELETE FROM delivery_count_deltas
             WHERE ctid = ANY (ARRAY(SELECT ctid FROM delivery_count_deltas
                                     LIMIT $1 FOR UPDATE SKIP LOCKED))
             RETURNING minute, channel, kind, state, n),
         added AS (
             INSERT INTO delivery_counts AS c (minute, channel, kind, state, n)
             SELECT minute, channel, kind, state, sum(n) FROM taken
             GROUP BY minute, channel, kind, state
             ORDER BY minute, channel, kind, state
             ON CONFLICT (minute, channel, kind, state) DO UPDATE SET n = c.n + EXCLUDED.n)
         -- `added` runs to completion though nothing reads it (a data-modifying WITH).
         SELECT count(*) FROM taken",
    )
    .bind(batch)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM delivery_counts WHERE minute < now() - make_interval(secs => $1)")
        .bind(COUNTS_KEPT.num_seconds() as f64)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(folded.max(0) as u64)
}

/// An event in search results.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventSummary {
    /// Id.
    pub id: Uuid,
    /// Key as stored.
    pub event_key: String,
    /// Type.
    #[sqlx(rename = "type")]
    pub type_key: String,
    /// When.
    pub created_at: DateTime<Utc>,
}

/// Events matching `q`: an event id, an event key (or the caller's key of a bucketed one),
/// a user id (their latest events) or a type (its latest events); at most 50, newest first.
pub async fn search(db: &PgPool, q: &str) -> Result<Vec<EventSummary>> {
    let id = Uuid::parse_str(q).ok();
    let rows = sqlx::query_as(
        "SELECT id, event_key, type, created_at FROM notification_events
         WHERE id = $1 OR event_key = $2 OR caller_key = $2
            OR id IN (SELECT event_id FROM notification_deliveries WHERE user_id = $2
                      ORDER BY id DESC LIMIT 50)
            OR id IN (SELECT id FROM notification_events WHERE type = $2 ORDER BY id DESC LIMIT 50)
         ORDER BY created_at DESC LIMIT 50",
    )
    .bind(id)
    .bind(q)
    .fetch_all(db)
    .await?;
    Ok(rows)
}

/// Writes one audit row.
async fn audit(
    tx: &mut sqlx::PgConnection,
    staff: &str,
    action: &str,
    target: &str,
    detail: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO console_audit (staff, action, target, detail) VALUES ($1, $2, $3, $4)",
    )
    .bind(staff)
    .bind(action)
    .bind(target)
    .bind(detail)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Retries a failed delivery now: back to pending with one more attempt allowed and an
/// outbox row due now. `NotFound` when it is not failed (or does not exist), or its event
/// (or recipient) was canceled.
pub async fn retry_delivery(db: &PgPool, staff: &str, id: Uuid) -> Result<()> {
    let mut tx = db.begin().await?;
    let row: Option<(String,)> = sqlx::query_as(
        "UPDATE notification_deliveries
         SET status = 'pending', next_attempt_at = now(), max_attempts = attempts + 1,
             deferred_until = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
             state_version = state_version + 1
         WHERE id = $1 AND status = 'failed'
           -- never a delivery of a canceled event or recipient
           AND NOT EXISTS (SELECT 1 FROM notification_events e
                           WHERE e.id = notification_deliveries.event_id AND e.canceled_at IS NOT NULL)
           AND NOT EXISTS (SELECT 1 FROM event_cancellations c
                           WHERE c.event_id = notification_deliveries.event_id
                             AND c.user_id = notification_deliveries.user_id)
         RETURNING channel",
    )
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((channel,)) = row else {
        return Err(StoreError::NotFound(format!("failed delivery {id}")));
    };
    sqlx::query("INSERT INTO outbox (delivery_id, channel) VALUES ($1, $2)")
        .bind(id)
        .bind(&channel)
        .execute(&mut *tx)
        .await?;
    // Pending again: its webhook says so (`delivery.deferred`), like a scheduled retry.
    crate::webhooks::enqueue_for_deliveries(
        &mut tx,
        &[(id, crate::webhooks::EventType::DeliveryDeferred)],
    )
    .await?;
    audit(&mut tx, staff, "retry_delivery", &id.to_string(), &channel).await?;
    tx.commit().await?;
    Ok(())
}

/// Cancels an event as `CancelEvent` does, through the same path
/// ([`crate::cancel::cancel`], with `staff` as who canceled and every caller's events
/// visible): its pending deliveries and every subscriber its fan-out has not planned yet;
/// deliveries in flight are waited for. Audited with the counts. `NotFound` when the
/// event does not exist.
pub async fn cancel_event(
    db: &PgPool,
    staff: &str,
    event_id: Uuid,
) -> Result<crate::cancel::CancelOutcome> {
    let out = crate::cancel::cancel(
        db,
        &crate::cancel::CancelSelector::Id(event_id),
        &[],
        staff,
        true,
    )
    .await?;
    let mut conn = db.acquire().await?;
    audit(
        &mut conn,
        staff,
        "cancel_event",
        &event_id.to_string(),
        &format!(
            "{} pending deliveries canceled; canceled {}, sent {}, failed {}, skipped {}, in flight {}, not created {}",
            out.newly_canceled,
            out.canceled,
            out.sent,
            out.failed,
            out.skipped,
            out.in_flight,
            out.not_created
        ),
    )
    .await?;
    Ok(out)
}

/// Records an action taken outside Postgres (e.g. on RabbitMQ) in the audit log.
pub async fn record(
    db: &PgPool,
    staff: &str,
    action: &str,
    target: &str,
    detail: &str,
) -> Result<()> {
    let mut conn = db.acquire().await?;
    audit(&mut conn, staff, action, target, detail).await
}

/// The latest audit rows: (when, staff, action, target, detail).
pub async fn audit_log(
    db: &PgPool,
    limit: i64,
) -> Result<Vec<(DateTime<Utc>, String, String, String, String)>> {
    Ok(sqlx::query_as(
        "SELECT at, staff, action, target, detail FROM console_audit ORDER BY id DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Records a new staff session whose cookie id hashes to `id_hash` (SHA-256), valid for
/// `ttl` from now (database clock); also deletes sessions that have expired.
pub async fn create_session(
    db: &PgPool,
    id_hash: &[u8],
    staff: &str,
    ttl: std::time::Duration,
) -> Result<()> {
    let mut tx = db.begin().await?;
    sqlx::query("DELETE FROM console_sessions WHERE expires_at < now()")
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO console_sessions (id_hash, staff, expires_at) \
         VALUES ($1, $2, now() + make_interval(secs => $3))",
    )
    .bind(id_hash)
    .bind(staff)
    .bind(ttl.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// The staff member of the unexpired session whose cookie id hashes to `id_hash`.
pub async fn session_staff(db: &PgPool, id_hash: &[u8]) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT staff FROM console_sessions WHERE id_hash = $1 AND expires_at > now()",
    )
    .bind(id_hash)
    .fetch_optional(db)
    .await?)
}

/// Ends the session whose cookie id hashes to `id_hash` (sign-out); `false` when there
/// was none.
pub async fn delete_session(db: &PgPool, id_hash: &[u8]) -> Result<bool> {
    let r = sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
        .bind(id_hash)
        .execute(db)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// One count a console sign-in attempt is taken from (table `console_sign_in_counts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignInBucket {
    /// What is counted: `pair:<sha256 hex of the typed name>:<address>`,
    /// `addr:<address>` or `name:<sha256 hex>`; never a typed name.
    pub key: String,
    /// Attempts allowed within one window (at least 1).
    pub limit: u32,
    /// How long a window lasts from the first attempt taken after the previous one ended.
    pub window: std::time::Duration,
}

/// Takes one sign-in attempt from every bucket in `buckets`, all or none, before the
/// password is checked: `None` when taken (the caller may check the password now), else
/// `Some(seconds)` (at least 1) until the window of the fullest bucket that has no attempt
/// left ends, and nothing is taken from any bucket.
///
/// A read without locks refuses at once when a bucket is already full. Otherwise one
/// transaction: the statement that creates the buckets' rows (or restarts a row whose
/// window ended, database clock) locks them in key order until the commit, so sign-ins
/// sharing a bucket, on any replica, take from it one at a time: within one window a
/// bucket never gives more than `limit` attempts, whatever the burst. Refused attempts
/// take nothing, so an attempt refused by one bucket does not use up another.
pub async fn take_sign_in_attempt(db: &PgPool, buckets: &[SignInBucket]) -> Result<Option<u64>> {
    let mut buckets: Vec<&SignInBucket> = buckets.iter().collect();
    buckets.sort_by(|a, b| a.key.cmp(&b.key));
    buckets.dedup_by(|a, b| a.key == b.key);
    let keys: Vec<&str> = buckets.iter().map(|b| b.key.as_str()).collect();
    let windows: Vec<f64> = buckets.iter().map(|b| b.window.as_secs_f64()).collect();
    let full = |rows: &[(String, i32, f64)]| {
        rows.iter()
            .filter(|(key, count, _)| {
                buckets
                    .iter()
                    .any(|b| &b.key == key && i64::from(*count) >= i64::from(b.limit))
            })
            .map(|(_, _, left)| *left)
            .reduce(f64::max)
            .map(|left| left.ceil().max(1.0) as u64)
    };
    // Without locks first: a bucket already full refuses at once, so a flood of refused
    // attempts does not queue on the rows the others lock.
    let rows: Vec<(String, i32, f64)> = sqlx::query_as(
        "SELECT key, count, extract(epoch FROM ends_at - now())::float8 \
         FROM console_sign_in_counts WHERE key = ANY($1) AND ends_at > now()",
    )
    .bind(&keys)
    .fetch_all(db)
    .await?;
    if let Some(wait) = full(&rows) {
        return Ok(Some(wait));
    }
    let mut tx = db.begin().await?;
    let rows: Vec<(String, i32, f64)> = sqlx::query_as(
        "INSERT INTO console_sign_in_counts AS c (key, ends_at, count) \
         SELECT key, now() + make_interval(secs => secs), 0 \
         FROM unnest($1::text[], $2::float8[]) AS b(key, secs) ORDER BY key \
         ON CONFLICT (key) DO UPDATE SET \
           count = CASE WHEN c.ends_at <= now() THEN 0 ELSE c.count END, \
           ends_at = CASE WHEN c.ends_at <= now() THEN excluded.ends_at ELSE c.ends_at END \
         RETURNING key, count, extract(epoch FROM ends_at - now())::float8",
    )
    .bind(&keys)
    .bind(&windows)
    .fetch_all(&mut *tx)
    .await?;
    if let Some(wait) = full(&rows) {
        tx.commit().await?;
        return Ok(Some(wait));
    }
    let r = sqlx::query("UPDATE console_sign_in_counts SET count = count + 1 WHERE key = ANY($1)")
        .bind(&keys)
        .execute(&mut *tx)
        .await?;
    if r.rows_affected() != keys.len() as u64 {
        return Err(StoreError::NotFound(format!(
            "{} of {} sign-in buckets",
            keys.len() as u64 - r.rows_affected(),
            keys.len()
        )));
    }
    tx.commit().await?;
    Ok(None)
}

/// After a wrong password: deletes the buckets whose window has ended, skipping rows a
/// sign-in holds right now (the attempt itself stays taken).
pub async fn forget_ended_sign_in_windows(db: &PgPool) -> Result<()> {
    sqlx::query(
        "DELETE FROM console_sign_in_counts WHERE key IN ( \
           SELECT key FROM console_sign_in_counts WHERE ends_at < now() \
           FOR UPDATE SKIP LOCKED)",
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Whether the staff name and address of the `pair` key signed in within the last
/// `known_for` (database clock).
pub async fn sign_in_address_known(
    db: &PgPool,
    pair: &str,
    known_for: std::time::Duration,
) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM console_sign_in_addresses \
         WHERE key = $1 AND signed_in_at > now() - make_interval(secs => $2))",
    )
    .bind(pair)
    .bind(known_for.as_secs_f64())
    .fetch_one(db)
    .await?)
}

/// After the right password, in one transaction: the attempt taken from each of
/// `buckets` is given back (a successful sign-in is not counted, so each bucket's window
/// counts only wrong passwords and the ones being checked), and the `pair` key is
/// remembered as a known address for [`sign_in_address_known`]; pairs not seen within
/// `known_for` are forgotten.
pub async fn sign_in_succeeded(
    db: &PgPool,
    pair: &str,
    buckets: &[String],
    known_for: std::time::Duration,
) -> Result<()> {
    let mut tx = db.begin().await?;
    // Locked in key order, as `take_sign_in_attempt` locks them, so the two never
    // deadlock.
    sqlx::query(
        "UPDATE console_sign_in_counts SET count = count - 1 \
         WHERE key IN (SELECT key FROM console_sign_in_counts WHERE key = ANY($1) \
                       ORDER BY key FOR UPDATE) \
           AND count > 0 AND ends_at > now()",
    )
    .bind(buckets)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO console_sign_in_addresses (key, signed_in_at) VALUES ($1, now()) \
         ON CONFLICT (key) DO UPDATE SET signed_in_at = excluded.signed_in_at",
    )
    .bind(pair)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "DELETE FROM console_sign_in_addresses \
         WHERE signed_in_at < now() - make_interval(secs => $1)",
    )
    .bind(known_for.as_secs_f64())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v7_floor_sorts_before_every_id_of_that_millisecond_and_after_earlier_ones() {
        let t: DateTime<Utc> = "2026-11-30T18:00:00.123Z".parse().unwrap();
        let floor = uuid_v7_floor(t);
        assert_eq!(floor.get_version_num(), 7);
        let ts = uuid::Timestamp::from_unix(
            uuid::NoContext,
            t.timestamp() as u64,
            t.timestamp_subsec_nanos(),
        );
        for _ in 0..100 {
            assert!(Uuid::new_v7(ts) >= floor);
        }
        let earlier = uuid::Timestamp::from_unix(
            uuid::NoContext,
            t.timestamp() as u64,
            t.timestamp_subsec_nanos() - 1_000_000,
        );
        assert!(Uuid::new_v7(earlier) < floor);
    }
}
