//! Erasure of a recipient (`EraseRecipient`, PDPA section 33): one function,
//! [`erase_recipient`], for every table that can hold the person's data. What each table
//! holds and how it is treated is listed in `docs/data.md`.
//!
//! Three steps, so that a user with many rows never holds ingest back for long:
//!
//! 1. Without any global lock, in batches of [`BATCH`] deliveries (one transaction each):
//!    the user's deliveries that are final already (sent, failed, canceled, skipped) and
//!    everything hanging off them are redacted ([`redact_batch`]): attempts' content and
//!    provider answers replaced by [`ERASED`] (outcome, status codes and times kept), the
//!    delivery's user id, address, endpoint, keys and error texts replaced, the events
//!    they belong to rewritten (user id, and the user's email, LINE id, name and tokens
//!    inside payloads and content), webhook messages and clicks of those deliveries
//!    rewritten or deleted.
//! 2. One transaction holding [`ERASURE_LOCK`] exclusively: the deliveries still pending
//!    or sending are canceled as `CancelEvent` cancels them (their own outbox rows deleted, the
//!    console counters moved by their triggers, `delivery.cancelled` webhooks written; a
//!    provider call in progress loses its lease, so its result is not recorded) and
//!    redacted; the recipient row, endpoints, preferences, quiet hours, topic
//!    subscriptions, skips, cancellations, clicks, inbox rows and counter, LINE follow
//!    state, email suppressions and feedback are deleted; console audit texts rewritten;
//!    the audit row written. Every planning transaction (the event writer, a fan-out
//!    page) holds the same lock shared from before it reads the recipients' facts until it
//!    commits ([`begin_planning`]), so an event is planned either wholly before this
//!    transaction (its deliveries are canceled here) or after it (it finds no recipient
//!    and, through the audit row, plans nothing, in-app included).
//! 3. Step 1 again for whatever a transaction that held a delivery's row committed
//!    meanwhile (a fallback recorded with a failure, an inbox row written after its
//!    lease was confirmed), then the audit row is marked complete.
//!
//! The needles (email, LINE id, display name, endpoint tokens and subscription keys) live
//! only in memory between the steps; a crash after step 2 leaves the audit row without
//! `completed_at` and the rows written during the race unredacted.

use crate::Result;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

/// What replaces personal data that is kept for counts.
pub const ERASED: &str = "[erased]";

/// The advisory lock (`pg_advisory_xact_lock`) an erasure holds exclusively in its second
/// step and every planning transaction holds shared (ASCII "notify" + "era").
pub const ERASURE_LOCK: i64 = 0x6e6f_7469_6679_0e7a;

/// Deliveries redacted per transaction.
pub const BATCH: i64 = 500;

/// What an erasure did, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErasureOutcome {
    /// Whether a `recipients` row existed.
    pub recipient_found: bool,
    /// Deliveries canceled (pending or sending).
    pub deliveries_canceled: u64,
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

    // Step 1: what is final already, in batches, no global lock.
    loop {
        let mut tx = db.begin().await?;
        let n = redact_batch(&mut tx, user_id, &needles, true, &mut out).await?;
        tx.commit().await?;
        if n < BATCH as u64 {
            break;
        }
    }

    // Step 2: under the exclusive lock.
    let mut tx = db.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(ERASURE_LOCK)
        .execute(&mut *tx)
        .await?;
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
    out.deliveries_canceled +=
        crate::cancel::cancel_for_erasure(&mut tx, user_id, line.as_deref()).await?;
    loop {
        let n = redact_batch(&mut tx, user_id, &needles, false, &mut out).await?;
        if n < BATCH as u64 {
            break;
        }
    }
    let skipped_events: Vec<Uuid> = sqlx::query_scalar(
        "WITH s AS (DELETE FROM delivery_skips WHERE user_id = $1 RETURNING event_id)
         SELECT DISTINCT event_id FROM s",
    )
    .bind(user_id)
    .fetch_all(&mut *tx)
    .await?;
    redact_events(&mut tx, user_id, &needles, &skipped_events).await?;
    for q in [
        "DELETE FROM notification_preferences WHERE user_id = $1",
        "DELETE FROM topic_subscriptions WHERE user_id = $1",
        "DELETE FROM event_cancellations WHERE user_id = $1",
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
    // Staff actions name addresses (suppressions) and users (searches, cancels).
    let mut audit_needles = needles.clone();
    audit_needles.push(user_id.to_string());
    sqlx::query(
        "UPDATE console_audit SET target = erase_text(target, $1), detail = erase_text(detail, $1)
         WHERE target = ANY($1)
            OR erase_text(target, $1) IS DISTINCT FROM target
            OR erase_text(detail, $1) IS DISTINCT FROM detail",
    )
    .bind(&audit_needles)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM recipients WHERE user_id = $1")
        .bind(user_id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;

    // Step 3: what a transaction holding a delivery's row committed during step 2.
    loop {
        let mut tx = db.begin().await?;
        out.deliveries_canceled +=
            crate::cancel::cancel_for_erasure(&mut tx, user_id, line.as_deref()).await?;
        let n = redact_batch(&mut tx, user_id, &needles, false, &mut out).await?;
        out.inbox_deleted += sqlx::query("DELETE FROM notifications WHERE user_id = $1")
            .bind(user_id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        if n < BATCH as u64 {
            break;
        }
    }
    if let Some(line) = &line {
        redact_multicast(db, user_id, line, &needles).await?;
    }
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

/// The strings that identify the user inside texts: email (as written and lowercased),
/// LINE id, display name, every endpoint token and every string of a Web Push
/// subscription. Empty ones left out; `erase_text` ignores those under 3 characters.
async fn load_needles(db: impl sqlx::PgExecutor<'_>, user_id: &str) -> Result<Vec<String>> {
    let found: Vec<Option<String>> = sqlx::query_scalar(
        "SELECT x FROM recipients r,
                LATERAL unnest(ARRAY[r.email, lower(r.email), r.line_user_id, r.display_name]) x
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

/// Redacts up to [`BATCH`] of the user's deliveries (only final ones when `final_only`),
/// with their attempts, webhook messages, clicks, inbox rows and events. Returns how many
/// deliveries it took.
async fn redact_batch(
    tx: &mut PgConnection,
    user_id: &str,
    needles: &[String],
    final_only: bool,
    out: &mut ErasureOutcome,
) -> Result<u64> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM notification_deliveries
         WHERE user_id = $1 AND (NOT $2 OR status IN ('sent', 'failed', 'canceled', 'skipped'))
         ORDER BY id LIMIT $3 FOR UPDATE",
    )
    .bind(user_id)
    .bind(final_only)
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    out.attempts_redacted += sqlx::query(
        "UPDATE delivery_attempts
         SET content_json = CASE WHEN content_json IS NULL THEN NULL
                 ELSE jsonb_build_object('erased', true)
                      || jsonb_strip_nulls(jsonb_build_object('provider', content_json->'provider')) END,
             provider_response = CASE WHEN provider_response IS NULL THEN NULL ELSE $2 END
         WHERE delivery_id = ANY($1)",
    )
    .bind(&ids)
    .bind(ERASED)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query(
        "WITH m AS (
             UPDATE webhook_messages
             SET payload = jsonb_set(erase_json(payload, $2), '{data,user_id}', to_jsonb($3::text))
             WHERE delivery_id = ANY($1)
             RETURNING id)
         UPDATE webhook_attempts a SET response_excerpt = erase_text(a.response_excerpt, $2),
                error = erase_text(a.error, $2)
         FROM m WHERE a.message_id = m.id",
    )
    .bind(&ids)
    .bind(needles)
    .bind(ERASED)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM delivery_clicks WHERE delivery_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    out.inbox_deleted += sqlx::query("DELETE FROM notifications WHERE delivery_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let events: Vec<Uuid> = sqlx::query_scalar(
        "SELECT DISTINCT event_id FROM notification_deliveries WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    redact_events(tx, user_id, needles, &events).await?;
    let n = sqlx::query(
        "UPDATE notification_deliveries
         SET user_id = $2, address = NULL, endpoint_id = NULL, idempotency_key = 'erased/' || id,
             digest_key = NULL, last_error = erase_text(last_error, $3),
             decision = erase_text(decision, $3), updated_at = now()
         WHERE id = ANY($1)",
    )
    .bind(&ids)
    .bind(ERASED)
    .bind(needles)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    out.deliveries_redacted += n;
    Ok(ids.len() as u64)
}

/// Rewrites the events `ids`: the user id in `recipients` and `actor_id` becomes
/// [`ERASED`]; the payload of an event sent to this user alone is replaced by
/// `{"erased": true}`; other payloads and every content keep their shape with the needles
/// replaced. Event keys and cancellation keys are the caller's and stay (dedup holds).
/// The other recipients' inbox rows and attempts of an event with listed recipients (at
/// most a key's recipient limit) have the needles replaced too; topic broadcasts are left
/// out.
async fn redact_events(
    tx: &mut PgConnection,
    user_id: &str,
    needles: &[String],
    ids: &[Uuid],
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE notification_events
         SET recipients = array_replace(recipients, $2, $4),
             actor_id = CASE WHEN actor_id = $2 THEN $4 ELSE actor_id END,
             payload_json = CASE WHEN recipients = ARRAY[$2]::text[] THEN '{\"erased\": true}'::jsonb
                                 ELSE erase_json(payload_json, $3) END,
             content_json = erase_json(content_json, $3)
         WHERE id = ANY($1)",
    )
    .bind(ids)
    .bind(user_id)
    .bind(needles)
    .bind(ERASED)
    .execute(&mut *tx)
    .await?;
    // The other recipients of an event with listed recipients (at most a key's recipient
    // limit) got what its payload said: their inbox rows and attempts lose the needles
    // too. Topic broadcasts are left out (one text for every subscriber, not the user's).
    sqlx::query(
        "WITH others AS (
             SELECT d.id FROM notification_deliveries d
             JOIN notification_events e ON e.id = d.event_id AND e.topic IS NULL
             WHERE d.event_id = ANY($1)),
         inbox AS (
             UPDATE notifications n
             SET title = erase_text(n.title, $2), body = erase_text(n.body, $2),
                 url = erase_text(n.url, $2), data_json = erase_json(n.data_json, $2)
             FROM others o
             WHERE n.delivery_id = o.id
               AND (erase_json(n.data_json, $2) IS DISTINCT FROM n.data_json
                    OR erase_text(n.title || n.body || coalesce(n.url, ''), $2)
                       IS DISTINCT FROM n.title || n.body || coalesce(n.url, '')))
         UPDATE delivery_attempts a
         SET content_json = erase_json(a.content_json, $2),
             provider_response = erase_text(a.provider_response, $2)
         FROM others o
         WHERE a.delivery_id = o.id
           AND (erase_json(a.content_json, $2) IS DISTINCT FROM a.content_json
                OR erase_text(a.provider_response, $2) IS DISTINCT FROM a.provider_response)",
    )
    .bind(ids)
    .bind(needles)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// LINE multicast batches naming the user's LINE id (any state): the id taken out of the
/// batch's address, the user out of its `line-multicast:<first user>+n` name, the needles
/// out of its attempts. Found by a scan of the multicast deliveries (erasure is rare; no
/// index is kept for it on the write path).
async fn redact_multicast(
    db: &PgPool,
    user_id: &str,
    line: &str,
    needles: &[String],
) -> Result<()> {
    sqlx::query(
        "WITH m AS (
             UPDATE notification_deliveries
             SET address = array_to_string(array_remove(string_to_array(address, ','), $2), ','),
                 user_id = replace(user_id, 'line-multicast:' || $1 || '+', 'line-multicast:' || $4 || '+'),
                 updated_at = now()
             WHERE provider = 'line_multicast' AND $2 = ANY(string_to_array(address, ','))
             RETURNING id)
         UPDATE delivery_attempts a
         SET content_json = erase_json(a.content_json, $3),
             provider_response = erase_text(a.provider_response, $3)
         FROM m WHERE a.delivery_id = m.id",
    )
    .bind(user_id)
    .bind(line)
    .bind(needles)
    .bind(ERASED)
    .execute(db)
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
