//! Erasure of a recipient (`EraseRecipient`, PDPA section 33): one function,
//! [`erase_recipient`], for every table that can hold the person's data. What each table
//! holds and how it is treated is listed in `docs/data.md`.
//!
//! Needles and spellings: the user's email, LINE id, display name, endpoint tokens and
//! subscription keys, read at the start and again under the lock, are looked for in every
//! text rewritten here in each spelling `notify_core::spellings` knows (NFC or NFD, any
//! case, JSON-escaped), in Rust, on rows read [`BATCH`] at a time.
//!
//! Four steps, so that a user with many rows never holds ingest back for long:
//!
//! 1. Without any global lock, in batches of [`BATCH`] deliveries (one transaction each):
//!    the user's deliveries that are final already (sent, failed, canceled, skipped) and
//!    everything hanging off them are redacted ([`redact_batch`]): attempts' content and
//!    provider answers replaced by [`ERASED`] (outcome, status codes and times kept), the
//!    delivery's user id, address, endpoint, keys and error texts replaced, the events
//!    they belong to rewritten (user id, and the needles inside payloads and content),
//!    webhook messages and clicks of those deliveries rewritten or deleted; then, in
//!    transactions of their own, the other recipients' inbox rows and attempts of those
//!    events ([`redact_others`]).
//! 2. One transaction holding [`ERASURE_LOCK`] exclusively: the pending deliveries are
//!    canceled as `CancelEvent` cancels them (their own outbox rows deleted, the console
//!    counters moved by their triggers, `delivery.cancelled` webhooks written) and
//!    redacted. A delivery in a provider call (`sending`) is left to its lease holder,
//!    which may have reached the provider already: an `event_cancellations` row makes a
//!    retry or a requeue of it end `canceled` and keeps a fallback from being derived
//!    (`cancel::InFlight::Finish`). The recipient row, endpoints, preferences, quiet hours,
//!    topic subscriptions, skips, clicks, inbox rows and counter, LINE follow state,
//!    email suppressions and feedback are deleted; the audit row written. Every planning
//!    transaction (the event writer, a fan-out page) holds the same lock shared from
//!    before it reads the recipients' facts until it commits ([`begin_planning`]), so an
//!    event is planned either wholly before this transaction (its deliveries are canceled
//!    here) or after it (it finds no recipient and, through the audit row, plans nothing,
//!    in-app included, and writes skip rows).
//! 3. Without the lock: a wait of up to [`IN_FLIGHT_WAIT`] for the user's deliveries in a
//!    provider call to be recorded (as `sent`, `failed` or `canceled`: the record is the
//!    lease holder's, true), then step 1 again for what they and other transactions that
//!    held a delivery's row committed meanwhile (an inbox row, an attempt).
//! 4. One more short transaction holding [`ERASURE_LOCK`] exclusively: a delivery still in
//!    a provider call is canceled with [`crate::cancel::CANCELED_IN_FLIGHT`] as its error
//!    (it may have reached the user; its late record writes nothing), the rest redacted,
//!    and every event planned since step 2 (found by its skip rows naming the user id) is
//!    rewritten as in step 1 and its skips deleted, as are the `event_cancellations`
//!    rows. An event whose planning commits after this transaction is one sent after the
//!    erasure: it plans nothing for the user and keeps what its caller sent (the user
//!    id in its recipients and skip rows, its payload as given). Then the other
//!    recipients' rows, LINE multicast batches and console audit texts are rewritten and
//!    the audit row is marked complete.
//!
//! The needles live only in memory between the steps; a crash after step 2 leaves the
//! audit row without `completed_at` and the rows written during the race unredacted.

mod redact;
mod rewrite;

use crate::Result;
use crate::cancel::InFlight;
use notify_core::spellings::Spellings;
use redact::{
    redact_batch, redact_console_audit, redact_multicast, redact_others, redact_skipped_events,
};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

/// What replaces personal data that is kept for counts.
pub use notify_core::spellings::ERASED;

/// The advisory lock (`pg_advisory_xact_lock`) an erasure holds exclusively in its second
/// and fourth steps and every planning transaction holds shared (ASCII "notify" + "era").
pub const ERASURE_LOCK: i64 = 0x6e6f_7469_6679_0e7a;

/// Deliveries redacted per transaction (and rows of other recipients rewritten per
/// transaction).
pub const BATCH: i64 = 500;

/// How long step 3 waits for the user's deliveries in a provider call to be recorded
/// before step 4 cancels those still in one (a provider call's deadline is shorter).
pub const IN_FLIGHT_WAIT: Duration = Duration::from_secs(15);
/// How often it looks while it waits.
pub const IN_FLIGHT_POLL: Duration = Duration::from_millis(50);

/// Events whose other recipients' rows are read in one pass (each pass reads their
/// delivery ids, then rewrites [`BATCH`] deliveries' rows per transaction).
const EVENTS_PER_PASS: usize = 20;

/// What an erasure did, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErasureOutcome {
    /// Whether a `recipients` row existed.
    pub recipient_found: bool,
    /// Deliveries canceled: pending ones, those whose provider call in progress ended in a
    /// retry (ended `canceled`), and those still in a call when the wait ended.
    pub deliveries_canceled: u64,
    /// Of those, the ones canceled during a provider call: they may have reached the user
    /// (`last_error` says so).
    pub canceled_in_flight: u64,
    /// Deliveries kept with their personal data replaced.
    pub deliveries_redacted: u64,
    /// Attempts whose content and provider answer were replaced.
    pub attempts_redacted: u64,
    /// Inbox rows deleted.
    pub inbox_deleted: u64,
    /// Push endpoints deleted.
    pub endpoints_deleted: u64,
    /// SHA-256 of the user id (UTF-8), as the audit row holds it.
    pub user_sha256: [u8; 32],
}

/// SHA-256 of a user id's UTF-8 bytes: the only trace of the user an erasure keeps.
pub fn user_sha256(user_id: &str) -> [u8; 32] {
    Sha256::digest(user_id.as_bytes()).into()
}

/// Starts a planning transaction on `conn`, in one statement: takes [`ERASURE_LOCK`]
/// shared until the transaction ends, plans the rest of the transaction's prepared
/// statements generically (`set_config('plan_cache_mode', 'force_generic_plan', true)`,
/// what `SET LOCAL` does), and returns the transaction's `now()`, the planning instant in
/// production (one round trip for the three).
///
/// The lock: planning transactions call this before they read recipients' facts, in a
/// statement of its own, so the facts are read with a snapshot taken after the lock was
/// granted (one lock per transaction, kept in memory by Postgres, no row written).
///
/// The plans: what [`crate::PoolConfig::generic_plans`] does for a whole connection, for
/// one transaction, and behind a transaction pooler too. The planning lookups find rows by
/// key with plans that do not depend on how many keys they are given; otherwise Postgres
/// plans anew, on every run, a statement joined from `unnest($1)` of a few keys, since its
/// estimate for a few known elements undercuts the generic plan's ten (`make bench`,
/// `pg_stat_statements.track_planning`: the recipient lookups were planned on a third to
/// three quarters of their runs, 0.24 to 0.31 ms a plan against 0.13 to 0.16 ms a run).
/// Errors are the database's.
pub async fn begin_planning(conn: &mut PgConnection) -> Result<chrono::DateTime<chrono::Utc>> {
    let (now,): (chrono::DateTime<chrono::Utc>,) = sqlx::query_as(
        "SELECT now(), pg_advisory_xact_lock_shared($1)::text,
                set_config('plan_cache_mode', 'force_generic_plan', true)",
    )
    .bind(ERASURE_LOCK)
    .fetch_one(&mut *conn)
    .await?;
    Ok(now)
}

/// Erases `user_id`, recording `erased_by` (the caller's key name or a staff name) in
/// `recipient_erasures`. An unknown user id is erased too (inbox rows and deliveries
/// may exist without a recipients row) and gets its audit row. See the module docs for
/// the steps; errors are the database's, and a failed call can simply be repeated.
pub async fn erase_recipient(
    db: &PgPool,
    user_id: &str,
    erased_by: &str,
) -> Result<ErasureOutcome> {
    let hash = user_sha256(user_id);
    let mut out = ErasureOutcome {
        user_sha256: hash,
        ..Default::default()
    };
    let needles = load_needles(db, user_id).await?;
    let spelt = Spellings::new(&needles);

    // Step 1: what is final already, in batches, no global lock.
    loop {
        let mut tx = db.begin().await?;
        let (n, events) = redact_batch(&mut tx, user_id, &spelt, &mut out).await?;
        tx.commit().await?;
        redact_others(db, &spelt, &events).await?;
        if n < BATCH as u64 {
            break;
        }
    }

    // Step 2: under the exclusive lock.
    let mut tx = db.begin().await?;
    hold_erasure_lock_exclusively(&mut tx).await?;
    let audit_id: i64 = sqlx::query_scalar(
        "INSERT INTO recipient_erasures (user_sha256, erased_by) VALUES ($1, $2) RETURNING id",
    )
    .bind(&hash[..])
    .bind(erased_by)
    .fetch_one(&mut *tx)
    .await?;
    // Contact data as it is now (it may have changed since the needles were read).
    let contact =
        sqlx::query("SELECT email, line_user_id FROM recipients WHERE user_id = $1 FOR UPDATE")
            .bind(user_id)
            .fetch_optional(&mut *tx)
            .await?;
    out.recipient_found = contact.is_some();
    let (email, line): (Option<String>, Option<String>) = contact
        .map(|r| (r.get("email"), r.get("line_user_id")))
        .unwrap_or_default();
    let needles = merge(needles, load_needles(&mut *tx, user_id).await?);
    let spelt = Spellings::new(&needles);
    let (canceled, _) =
        crate::cancel::cancel_for_erasure(&mut tx, user_id, line.as_deref(), InFlight::Finish)
            .await?;
    out.deliveries_canceled += canceled;
    // In a provider call now (no call can start: nothing is pending any more); their
    // records decide, and those that end canceled are counted after the wait.
    let in_call: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM notification_deliveries WHERE user_id = $1 AND status = 'sending'",
    )
    .bind(user_id)
    .fetch_all(&mut *tx)
    .await?;
    let mut touched = Vec::new();
    loop {
        let (n, events) = redact_batch(&mut tx, user_id, &spelt, &mut out).await?;
        touched.extend(events);
        if n < BATCH as u64 {
            break;
        }
    }
    touched.extend(redact_skipped_events(&mut tx, user_id, &spelt).await?);
    for q in [
        "DELETE FROM notification_preferences WHERE user_id = $1",
        "DELETE FROM topic_subscriptions WHERE user_id = $1",
        "DELETE FROM delivery_clicks WHERE user_id = $1",
        "DELETE FROM inbox_user_seq WHERE user_id = $1",
    ] {
        sqlx::query(q).bind(user_id).execute(&mut *tx).await?;
    }
    out.inbox_deleted += sqlx::query("DELETE FROM notifications WHERE user_id = $1")
        .bind(user_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    // Endpoints last among the user's rows: deliveries no longer point at them.
    out.endpoints_deleted += sqlx::query("DELETE FROM notification_endpoints WHERE user_id = $1")
        .bind(user_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if let Some(line) = &line {
        sqlx::query("DELETE FROM line_followers WHERE line_user_id = $1")
            .bind(line)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(
        "DELETE FROM email_suppressions
         WHERE user_id = $1 OR ($2::text IS NOT NULL AND lower(address) = lower($2))",
    )
    .bind(user_id)
    .bind(&email)
    .execute(&mut *tx)
    .await?;
    if let Some(email) = &email {
        sqlx::query("DELETE FROM email_feedback WHERE lower(address) = lower($1)")
            .bind(email)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("DELETE FROM recipients WHERE user_id = $1")
        .bind(user_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    redact_others(db, &spelt, &touched).await?;

    // Step 3: the calls in progress are recorded by their lease holders; then what they
    // (and any transaction holding a delivery's row) committed meanwhile.
    wait_for_calls(db, user_id).await?;
    // A retry of those calls (or a requeue of a lost lease) ended canceled.
    let ended_canceled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM notification_deliveries WHERE id = ANY($1) AND status = 'canceled'",
    )
    .bind(&in_call)
    .fetch_one(db)
    .await?;
    out.deliveries_canceled += ended_canceled as u64;
    loop {
        let mut tx = db.begin().await?;
        let (canceled, _) =
            crate::cancel::cancel_for_erasure(&mut tx, user_id, line.as_deref(), InFlight::Finish)
                .await?;
        out.deliveries_canceled += canceled;
        let (n, events) = redact_batch(&mut tx, user_id, &spelt, &mut out).await?;
        out.inbox_deleted += sqlx::query("DELETE FROM notifications WHERE user_id = $1")
            .bind(user_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        redact_others(db, &spelt, &events).await?;
        if n < BATCH as u64 {
            break;
        }
    }

    // Step 4: under the exclusive lock again, briefly: what is left in a call, and the
    // events planned since step 2.
    let mut tx = db.begin().await?;
    hold_erasure_lock_exclusively(&mut tx).await?;
    let (canceled, in_flight) =
        crate::cancel::cancel_for_erasure(&mut tx, user_id, line.as_deref(), InFlight::Cancel)
            .await?;
    out.deliveries_canceled += canceled;
    out.canceled_in_flight += in_flight;
    let mut touched = Vec::new();
    loop {
        let (n, events) = redact_batch(&mut tx, user_id, &spelt, &mut out).await?;
        touched.extend(events);
        if n < BATCH as u64 {
            break;
        }
    }
    touched.extend(redact_skipped_events(&mut tx, user_id, &spelt).await?);
    sqlx::query("DELETE FROM event_cancellations WHERE user_id = $1")
        .bind(user_id)
        .execute(&mut *tx)
        .await?;
    out.inbox_deleted += sqlx::query("DELETE FROM notifications WHERE user_id = $1")
        .bind(user_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    redact_others(db, &spelt, &touched).await?;

    if let Some(line) = &line {
        redact_multicast(db, user_id, line, &spelt).await?;
    }
    // Staff actions name addresses (suppressions) and users (searches, cancels).
    let mut audit_needles = needles;
    audit_needles.push(user_id.to_string());
    redact_console_audit(db, &Spellings::new(&audit_needles)).await?;
    sqlx::query(
        "UPDATE recipient_erasures SET completed_at = now(), deliveries_canceled = $2,
             deliveries_redacted = $3, attempts_redacted = $4, inbox_deleted = $5,
             endpoints_deleted = $6
         WHERE id = $1",
    )
    .bind(audit_id)
    .bind(out.deliveries_canceled as i64)
    .bind(out.deliveries_redacted as i64)
    .bind(out.attempts_redacted as i64)
    .bind(out.inbox_deleted as i64)
    .bind(out.endpoints_deleted as i64)
    .execute(db)
    .await?;
    Ok(out)
}

/// Waits until none of `user_id`'s deliveries is in a provider call (`sending`), or
/// [`IN_FLIGHT_WAIT`] passed.
async fn wait_for_calls(db: &PgPool, user_id: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + IN_FLIGHT_WAIT;
    loop {
        let sending: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM notification_deliveries
                            WHERE user_id = $1 AND status = 'sending')",
        )
        .bind(user_id)
        .fetch_one(db)
        .await?;
        if !sending || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(IN_FLIGHT_POLL).await;
    }
}

/// The strings that identify the user inside texts: email, LINE id, display name, every
/// endpoint token and every string of a Web Push subscription. Empty ones left out;
/// [`Spellings`] ignores those under 3 characters and finds every other spelling.
async fn load_needles(db: impl sqlx::PgExecutor<'_>, user_id: &str) -> Result<Vec<String>> {
    let found: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT x FROM recipients r,
                LATERAL unnest(ARRAY[r.email, r.line_user_id, r.display_name]) x
         WHERE r.user_id = $1
         UNION
         SELECT x FROM notification_endpoints e,
                LATERAL (SELECT e.token UNION ALL
                         SELECT v FROM jsonb_each_text(coalesce(e.subscription_json, '{}')) s(k, v)
                         UNION ALL
                         SELECT v FROM jsonb_each_text(coalesce(e.subscription_json->'keys', '{}'))
                                       s(k, v)) t(x)
         WHERE e.user_id = $1",
    )
    .bind(user_id)
    .fetch_all(db)
    .await?;
    Ok(merge(Vec::new(), found.into_iter().flatten().collect()))
}

fn merge(mut a: Vec<String>, b: Vec<String>) -> Vec<String> {
    a.extend(b);
    a.retain(|s| !s.trim().is_empty());
    a.sort_unstable();
    a.dedup();
    a
}

/// Takes [`ERASURE_LOCK`] exclusively until `tx` ends: every planning transaction, which
/// holds it shared ([`begin_planning`]), waits, and the erasure waits for those running.
async fn hold_erasure_lock_exclusively(tx: &mut PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(ERASURE_LOCK)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_hash_is_sha256_of_the_utf8_user_id() {
        let h = user_sha256("abc");
        assert_eq!(
            h[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "SHA-256(\"abc\") starts ba7816bf (FIPS 180-2, appendix B.1)"
        );
    }

    #[test]
    fn needles_are_deduplicated_and_blank_ones_dropped() {
        let n = merge(
            vec!["a@x.th".into(), " ".into()],
            vec!["a@x.th".into(), "Somchai".into()],
        );
        assert_eq!(n, vec!["Somchai".to_string(), "a@x.th".to_string()]);
    }
}
