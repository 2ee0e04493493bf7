//! Delivering webhook messages (worker-webhook): claim with a lease, record each POST
//! fenced by it, sweep leases whose worker died, disable an endpoint failing too long.

use crate::{Result, truncate_utf8};
use chrono::{DateTime, Utc};
use notify_core::MessageStatus;
use sqlx::{PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

/// Bytes of an endpoint's answer kept per attempt.
pub const MAX_RESPONSE_EXCERPT_BYTES: usize = 1024;

/// A message claimed for one POST.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedMessage {
    /// Message id (the `webhook-id` is [`notify_core::webhook::message_id`] of it).
    pub id: Uuid,
    /// Endpoint it goes to.
    pub endpoint_id: Uuid,
    /// Endpoint URL.
    pub url: String,
    /// Secrets to sign with: the current one, then the previous one during an overlap.
    pub secrets: Vec<String>,
    /// Whether the endpoint is enabled (a disabled one's messages fail unsent).
    pub endpoint_enabled: bool,
    /// The body, exactly as it is sent.
    pub body: String,
    /// This attempt's number (1 for the first).
    pub attempt: i32,
    /// The lease's fence.
    pub lease_token: Uuid,
    /// The claim's database time.
    pub started_at: DateTime<Utc>,
}

/// Claims message `id` for `lease`: `pending` and due -> `sending`, attempts + 1. `None`
/// when it is missing, not pending, or not due yet (a duplicate message; its own outbox
/// row brings it when due).
pub async fn claim_message(
    db: &PgPool,
    id: Uuid,
    lease: Duration,
) -> Result<Option<ClaimedMessage>> {
    let token = Uuid::new_v4();
    let row = sqlx::query(
        "WITH m AS (
             UPDATE webhook_messages SET status = 'sending', attempts = attempts + 1,
                 lease_token = $2, lease_expires_at = now() + $3 * interval '1 millisecond'
             WHERE id = $1 AND status = 'pending' AND next_attempt_at <= now()
             RETURNING id, endpoint_id, payload, attempts)
         SELECT m.id, m.endpoint_id, m.payload::text AS body, m.attempts, now() AS started_at,
                w.url, w.secret, w.enabled,
                CASE WHEN w.previous_expires_at > now() THEN w.previous_secret END AS previous
         FROM m JOIN webhook_endpoints w ON w.id = m.endpoint_id",
    )
    .bind(id)
    .bind(token)
    .bind(notify_core::retry::millis(lease))
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| {
        let mut secrets = vec![r.get::<String, _>("secret")];
        if let Some(p) = r.get::<Option<String>, _>("previous") {
            secrets.push(p);
        }
        ClaimedMessage {
            id: r.get("id"),
            endpoint_id: r.get("endpoint_id"),
            url: r.get("url"),
            secrets,
            endpoint_enabled: r.get("enabled"),
            body: r.get("body"),
            attempt: r.get("attempts"),
            lease_token: token,
            started_at: r.get("started_at"),
        }
    }))
}

/// The answer of one POST.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostResult {
    /// HTTP status, when an answer came.
    pub status_code: Option<i32>,
    /// From the start of the request to the answer's head (or the failure).
    pub latency: Duration,
    /// What went wrong (`timeout`, `http_500`, `refused: private address` ...); `None` on 2xx.
    pub error: Option<String>,
    /// The start of the body of the answer.
    pub response_excerpt: Option<String>,
}

/// What to do with the message after a POST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageNext {
    /// A 2xx: done.
    Sent,
    /// Try again after this delay (an outbox row due then is written).
    Retry(Duration),
    /// Give up (attempts spent, or the endpoint is disabled).
    Failed,
}

/// What [`record_post`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The lease was lost: nothing written (whoever holds the message now decides).
    LeaseLost,
    /// Written; `endpoint_disabled`: this failure ended a run longer than the disable
    /// period and disabled the endpoint (its pending messages fail when claimed).
    Written {
        /// The endpoint was disabled by this record.
        endpoint_disabled: bool,
    },
}

/// Records a POST of `msg` fenced by its lease, in one transaction: the attempt row, the
/// message's new state (+ an outbox row for a retry), and the endpoint's failure run: a
/// success clears `failing_since`; a failure starts it (at the claim's time) or, when it
/// started more than `disable_after` ago, disables the endpoint and fails the message.
pub async fn record_post(
    db: &PgPool,
    msg: &ClaimedMessage,
    result: &PostResult,
    next: MessageNext,
    disable_after: Duration,
) -> Result<Recorded> {
    let mut tx = db.begin().await?;
    let success = next == MessageNext::Sent;
    let endpoint_disabled = if success || !msg.endpoint_enabled {
        sqlx::query(
            "UPDATE webhook_endpoints SET failing_since = NULL
             WHERE id = $1 AND failing_since IS NOT NULL AND $2",
        )
        .bind(msg.endpoint_id)
        .bind(success)
        .execute(&mut *tx)
        .await?;
        false
    } else {
        let disabled: Option<bool> = sqlx::query_scalar(
            "UPDATE webhook_endpoints SET
                 failing_since = coalesce(failing_since, $2),
                 enabled = enabled AND coalesce(failing_since, $2) > now() - $3 * interval '1 millisecond',
                 disabled_reason = CASE WHEN coalesce(failing_since, $2) > now() - $3 * interval '1 millisecond'
                     THEN disabled_reason
                     ELSE format('failing since %s: every attempt failed for longer than %s', coalesce(failing_since, $2), $3 * interval '1 millisecond') END,
                 updated_at = now()
             -- an endpoint its caller disabled meanwhile is left alone (no second alert)
             WHERE id = $1 AND enabled RETURNING NOT enabled",
        )
        .bind(msg.endpoint_id)
        .bind(msg.started_at)
        .bind(notify_core::retry::millis(disable_after))
        .fetch_optional(&mut *tx)
        .await?;
        disabled.unwrap_or(false)
    };
    let (status, retry_ms) = match next {
        _ if endpoint_disabled => (MessageStatus::Failed, None),
        MessageNext::Sent => (MessageStatus::Sent, None),
        MessageNext::Retry(d) => (MessageStatus::Pending, Some(notify_core::retry::millis(d))),
        MessageNext::Failed => (MessageStatus::Failed, None),
    };
    let done = sqlx::query(
        "UPDATE webhook_messages SET status = $3, last_error = $4,
             next_attempt_at = CASE WHEN $5::bigint IS NULL THEN next_attempt_at
                                    ELSE now() + $5 * interval '1 millisecond' END,
             lease_token = NULL, lease_expires_at = NULL
         WHERE id = $1 AND lease_token = $2 AND status = $6",
    )
    .bind(msg.id)
    .bind(msg.lease_token)
    .bind(status.as_str())
    .bind(&result.error)
    .bind(retry_ms)
    .bind(MessageStatus::Sending.as_str())
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(Recorded::LeaseLost);
    }
    sqlx::query(
        "INSERT INTO webhook_attempts (message_id, attempt, status_code, latency_ms, error,
                                       response_excerpt, started_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (message_id, attempt) DO NOTHING",
    )
    .bind(msg.id)
    .bind(msg.attempt)
    .bind(result.status_code)
    .bind(result.latency.as_millis().min(i32::MAX as u128) as i32)
    .bind(&result.error)
    .bind(
        result
            .response_excerpt
            .as_deref()
            .map(|s| truncate_utf8(s, MAX_RESPONSE_EXCERPT_BYTES)),
    )
    .bind(msg.started_at)
    .execute(&mut *tx)
    .await?;
    if retry_ms.is_some() {
        sqlx::query(
            "INSERT INTO outbox (delivery_id, channel, available_at)
             SELECT id, 'webhook', next_attempt_at FROM webhook_messages WHERE id = $1",
        )
        .bind(msg.id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(Recorded::Written { endpoint_disabled })
}

/// Takes up to `limit` messages whose lease expired (their worker died or froze between
/// its claim and its record, before or during the POST) back to `pending`, due now, with an attempt row `worker_lost` and a new outbox
/// row; the receiver may have got it, so it gets it again with the same `webhook-id`
/// (at-least-once). Safe from several replicas (`SKIP LOCKED`). Returns how many.
pub async fn requeue_expired_messages(db: &PgPool, limit: i64) -> Result<u64> {
    let done = sqlx::query(
        "WITH expired AS (
             SELECT id FROM webhook_messages WHERE status = 'sending' AND lease_expires_at < now()
             ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED),
         upd AS (
             UPDATE webhook_messages m SET status = 'pending', lease_token = NULL,
                 lease_expires_at = NULL, next_attempt_at = now(),
                 last_error = 'worker_lost: the lease expired before the POST was recorded (the worker died or froze; the receiver may or may not have got it)'
             FROM expired WHERE m.id = expired.id RETURNING m.id, m.attempts),
         a AS (
             INSERT INTO webhook_attempts (message_id, attempt, latency_ms, error, started_at)
             SELECT id, attempts, 0, 'worker_lost', now() FROM upd
             ON CONFLICT (message_id, attempt) DO NOTHING)
         INSERT INTO outbox (delivery_id, channel) SELECT id, 'webhook' FROM upd",
    )
    .bind(limit)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Republishes up to `limit` pending messages due for longer than `stale` with no outbox
/// row: their queue message was lost after the broker confirmed it (a purged queue, a
/// lost node), or still waits in a long queue (then the duplicate is acked by the claim).
/// Each gets a new outbox row and waits `stale` again before the next republish. Nothing
/// is republished while the relay is behind (as [`crate::deliveries::republish_stale`]):
/// the outbox then holds the messages it has not published, and the look-up of every
/// stale message's row would repeat on each sweep. Safe from several replicas. Returns
/// how many.
pub async fn republish_stale_messages(db: &PgPool, stale: Duration, limit: i64) -> Result<u64> {
    // Only a constant is spliced in.
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH stale AS (
             SELECT id FROM webhook_messages m
             WHERE NOT {RELAY_BEHIND}
               AND status = 'pending' AND next_attempt_at < now() - $1 * interval '1 millisecond'
               AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = m.id)
             ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED),
         upd AS (
             UPDATE webhook_messages m SET next_attempt_at = now()
             FROM stale WHERE m.id = stale.id RETURNING m.id)
         INSERT INTO outbox (delivery_id, channel) SELECT id, 'webhook' FROM upd",
        RELAY_BEHIND = crate::outbox::RELAY_BEHIND,
    )))
    .bind(notify_core::retry::millis(
        stale.max(Duration::from_secs(1)),
    ))
    .bind(limit)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// One stored attempt of a message (for tests and the console).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct WebhookAttempt {
    /// Attempt number.
    pub attempt: i32,
    /// HTTP status of the answer.
    pub status_code: Option<i32>,
    /// Milliseconds to the answer.
    pub latency_ms: i32,
    /// What went wrong.
    pub error: Option<String>,
    /// When it started.
    pub started_at: DateTime<Utc>,
}

/// Attempts of message `id`, in order.
pub async fn attempts_of(db: &PgPool, id: Uuid) -> Result<Vec<WebhookAttempt>> {
    Ok(sqlx::query_as(
        "SELECT attempt, status_code, latency_ms, error, started_at FROM webhook_attempts
         WHERE message_id = $1 ORDER BY attempt",
    )
    .bind(id)
    .fetch_all(db)
    .await?)
}

/// Gives a claimed message back without a POST because its endpoint already has as many
/// requests in flight as allowed: `pending` again, the claim's attempt returned, due after
/// `delay` with an outbox row due then. Fenced by the lease; false when it was lost.
pub async fn release_busy(db: &PgPool, msg: &ClaimedMessage, delay: Duration) -> Result<bool> {
    let done = sqlx::query(
        "WITH m AS (
             UPDATE webhook_messages SET status = 'pending', attempts = attempts - 1,
                 lease_token = NULL, lease_expires_at = NULL,
                 next_attempt_at = now() + $3 * interval '1 millisecond'
             WHERE id = $1 AND lease_token = $2 AND status = 'sending'
             RETURNING id, next_attempt_at)
         INSERT INTO outbox (delivery_id, channel, available_at)
         SELECT id, 'webhook', next_attempt_at FROM m",
    )
    .bind(msg.id)
    .bind(msg.lease_token)
    .bind(notify_core::retry::millis(delay))
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}
