//! The worker side of a delivery: claim with a lease, heartbeat, record the attempt
//! fenced by the lease, and the sweeper that recovers expired leases.

use crate::{Result, truncate_utf8};
use chrono::{DateTime, Utc};
use notify_core::Content;
use sqlx::{PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

/// Most bytes of a provider's raw answer kept per attempt.
pub const MAX_PROVIDER_RESPONSE_BYTES: usize = 20 * 1024;

/// Everything a channel needs to send one delivery, read in the claim's round trip.
#[derive(Debug, Clone)]
pub struct DeliveryJob {
    /// Delivery id.
    pub id: Uuid,
    /// Event id.
    pub event_id: Uuid,
    /// Caller's event key.
    pub event_key: String,
    /// Notification type key.
    pub type_key: String,
    /// Recipient.
    pub user_id: String,
    /// Channel name.
    pub channel: String,
    /// Provider name.
    pub provider: String,
    /// This attempt's number (1-based).
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Unique per channel.
    pub idempotency_key: String,
    /// LINE retry key.
    pub retry_key: Option<Uuid>,
    /// Fences every write of this attempt.
    pub lease_token: Uuid,
    /// When the claim happened (database clock).
    pub started_at: DateTime<Utc>,
    /// When the delivery was created (database clock).
    pub created_at: DateTime<Utc>,
    /// Email address or LINE user id at planning time.
    pub address: Option<String>,
    /// Recipient's display name (may be empty).
    pub display_name: String,
    /// Recipient's locale.
    pub locale: String,
    /// Recipient's time zone.
    pub timezone: String,
    /// Event payload.
    pub payload: serde_json::Value,
    /// What to say.
    pub content: Content,
    /// Push endpoint id.
    pub endpoint_id: Option<Uuid>,
    /// Push platform.
    pub endpoint_platform: Option<String>,
    /// Push token (or Web Push endpoint URL).
    pub endpoint_token: Option<String>,
    /// Web Push subscription keys.
    pub endpoint_subscription: Option<serde_json::Value>,
    /// `active` or `revoked`.
    pub endpoint_status: Option<String>,
}

/// Why a message did not lead to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Claimed: send it.
    Claimed(Box<DeliveryJob>),
    /// No such delivery: the message is poison.
    Missing,
    /// The delivery belongs to another channel than the queue it came from.
    WrongChannel(String),
    /// Already being sent under a live lease, already final, or not due yet: a duplicate
    /// or early message, to be acked without a provider call. Carries the status.
    NotClaimable(String),
}

impl PartialEq for DeliveryJob {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.lease_token == other.lease_token
    }
}
impl Eq for DeliveryJob {}

/// Claims a due `pending` delivery of `channel` for `lease`: status becomes `sending`,
/// `attempts` grows by one and a fresh lease token and expiry (database clock) are set.
/// One round trip, no transaction left open.
pub async fn claim(db: &PgPool, id: Uuid, channel: &str, lease: Duration) -> Result<ClaimOutcome> {
    let token = Uuid::new_v4();
    let row = sqlx::query(
        "WITH c AS (
             UPDATE notification_deliveries
             SET status = 'sending', attempts = attempts + 1, lease_token = $3,
                 lease_expires_at = now() + $4 * interval '1 millisecond', updated_at = now()
             WHERE id = $1 AND channel = $2 AND status = 'pending' AND next_attempt_at <= now()
             RETURNING *)
         SELECT c.id, c.event_id, c.user_id, c.channel, c.provider, c.attempts, c.max_attempts,
                c.idempotency_key, c.retry_key, c.lease_token, c.address, c.endpoint_id, now() AS started_at,
                c.created_at,
                e.event_key, e.type, e.payload_json, e.content_json,
                coalesce(r.display_name, '') AS display_name, coalesce(r.locale, 'th-TH') AS locale,
                coalesce(r.timezone, 'Asia/Bangkok') AS timezone,
                ep.platform, ep.token, ep.subscription_json, ep.status AS endpoint_status
         FROM c JOIN notification_events e ON e.id = c.event_id
              LEFT JOIN recipients r ON r.user_id = c.user_id
              LEFT JOIN notification_endpoints ep ON ep.id = c.endpoint_id",
    )
    .bind(id)
    .bind(channel)
    .bind(token)
    .bind(lease.as_millis() as i64)
    .fetch_optional(db)
    .await?;
    if let Some(r) = row {
        return Ok(ClaimOutcome::Claimed(Box::new(DeliveryJob {
            id: r.get("id"),
            event_id: r.get("event_id"),
            event_key: r.get("event_key"),
            type_key: r.get("type"),
            user_id: r.get("user_id"),
            channel: r.get("channel"),
            provider: r.get("provider"),
            attempt: r.get("attempts"),
            max_attempts: r.get("max_attempts"),
            idempotency_key: r.get("idempotency_key"),
            retry_key: r.get("retry_key"),
            lease_token: r.get("lease_token"),
            started_at: r.get("started_at"),
            created_at: r.get("created_at"),
            address: r.get("address"),
            display_name: r.get("display_name"),
            locale: r.get("locale"),
            timezone: r.get("timezone"),
            payload: r.get("payload_json"),
            content: serde_json::from_value(r.get("content_json")).unwrap_or_default(),
            endpoint_id: r.get("endpoint_id"),
            endpoint_platform: r.get("platform"),
            endpoint_token: r.get("token"),
            endpoint_subscription: r.get("subscription_json"),
            endpoint_status: r.get("endpoint_status"),
        })));
    }
    let row = sqlx::query("SELECT status, channel FROM notification_deliveries WHERE id = $1")
        .bind(id)
        .fetch_optional(db)
        .await?;
    Ok(match row {
        None => ClaimOutcome::Missing,
        Some(r) if r.get::<&str, _>("channel") != channel => {
            ClaimOutcome::WrongChannel(r.get("channel"))
        }
        Some(r) => ClaimOutcome::NotClaimable(r.get("status")),
    })
}

/// Extends a live lease by `lease` from now (database clock). Returns false when the
/// lease was lost (expired and taken over, or the delivery finished elsewhere).
pub async fn extend_lease(
    db: &PgPool,
    id: Uuid,
    lease_token: Uuid,
    lease: Duration,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE notification_deliveries SET lease_expires_at = now() + $3 * interval '1 millisecond'
         WHERE id = $1 AND lease_token = $2 AND status = 'sending'",
    )
    .bind(id)
    .bind(lease_token)
    .bind(lease.as_millis() as i64)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// New state of a delivery after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum NextState {
    /// Accepted by the provider.
    Sent {
        /// Provider's id for it.
        provider_message_id: Option<String>,
    },
    /// Try again after the delay (an outbox row is written, due then).
    Retry {
        /// Delay from now.
        after: Duration,
        /// Error code and text for `last_error`.
        error: String,
    },
    /// Final failure.
    Failed {
        /// Error code and text for `last_error`.
        error: String,
    },
}

/// One attempt to record.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// Outcome label stored on the attempt: `sent`, `retry` or `failed`.
    pub outcome: &'static str,
    /// HTTP status or SMTP code.
    pub provider_status: Option<i32>,
    /// Normalised error code.
    pub error_code: Option<String>,
    /// Raw answer (truncated here to 20 KB).
    pub provider_response: Option<String>,
    /// What was sent.
    pub content: serde_json::Value,
    /// Endpoint to deactivate with this reason (push token gone).
    pub deactivate_endpoint: Option<(Uuid, String)>,
    /// The worker instance that made the call.
    pub worker_id: String,
}

/// Records an attempt and the delivery's new state in one transaction fenced by the
/// lease token. Returns false, writing nothing, when the lease was lost.
pub async fn record_attempt(
    db: &PgPool,
    job: &DeliveryJob,
    next: &NextState,
    attempt: &AttemptRecord,
) -> Result<bool> {
    let mut tx = db.begin().await?;
    let (status, pmid, retry_ms, last_error) = match next {
        NextState::Sent {
            provider_message_id,
        } => ("sent", provider_message_id.clone(), None, None),
        NextState::Retry { after, error } => (
            "pending",
            None,
            Some(after.as_millis() as i64),
            Some(error.clone()),
        ),
        NextState::Failed { error } => ("failed", None, None, Some(error.clone())),
    };
    let done = sqlx::query(
        "UPDATE notification_deliveries SET status = $3, provider_message_id = coalesce($4, provider_message_id),
             next_attempt_at = CASE WHEN $5::bigint IS NULL THEN next_attempt_at
                                    ELSE now() + $5 * interval '1 millisecond' END,
             last_error = $6, sent_at = CASE WHEN $3 = 'sent' THEN now() ELSE sent_at END,
             lease_token = NULL, lease_expires_at = NULL, updated_at = now()
         WHERE id = $1 AND lease_token = $2 AND status = 'sending'",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .bind(status)
    .bind(&pmid)
    .bind(retry_ms)
    .bind(&last_error)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, provider_status,
             error_code, provider_response, content_json, worker_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(job.id)
    .bind(job.attempt)
    .bind(job.started_at)
    .bind(attempt.outcome)
    .bind(attempt.provider_status)
    .bind(&attempt.error_code)
    .bind(
        attempt
            .provider_response
            .as_deref()
            .map(|s| truncate_utf8(s, MAX_PROVIDER_RESPONSE_BYTES)),
    )
    .bind(&attempt.content)
    .bind(&attempt.worker_id)
    .execute(&mut *tx)
    .await?;
    if let Some(ms) = retry_ms {
        sqlx::query(
            "INSERT INTO outbox (delivery_id, channel, available_at)
             VALUES ($1, $2, now() + $3 * interval '1 millisecond')",
        )
        .bind(job.id)
        .bind(&job.channel)
        .bind(ms)
        .execute(&mut *tx)
        .await?;
    }
    if let Some((endpoint, reason)) = &attempt.deactivate_endpoint {
        crate::catalog::deactivate_endpoint(&mut *tx, *endpoint, reason, job.started_at).await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Marks a delivery `failed` with `error` outside the claim protocol: for a message that
/// reached the wrong queue or cannot be sent at all. Only a `pending` delivery changes.
pub async fn fail_unclaimed(db: &PgPool, id: Uuid, error: &str) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE notification_deliveries SET status = 'failed', last_error = $2, updated_at = now()
         WHERE id = $1 AND status = 'pending'",
    )
    .bind(id)
    .bind(error)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Returns up to `limit` deliveries whose lease expired (their worker died or froze) to
/// `pending`, due now, with a fresh outbox row each. Safe to run from several replicas.
/// Returns how many were recovered.
pub async fn requeue_expired_leases(db: &PgPool, limit: i64) -> Result<u64> {
    let done = sqlx::query(
        "WITH expired AS (
             SELECT id FROM notification_deliveries
             WHERE status = 'sending' AND lease_expires_at < now()
             ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED),
         upd AS (
             UPDATE notification_deliveries d
             SET status = 'pending', lease_token = NULL, lease_expires_at = NULL,
                 next_attempt_at = now(), last_error = 'lease_expired', updated_at = now()
             FROM expired WHERE d.id = expired.id
             RETURNING d.id, d.channel)
         INSERT INTO outbox (delivery_id, channel) SELECT id, channel FROM upd",
    )
    .bind(limit)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Republishes up to `limit` deliveries that have been due for longer than `stale` with
/// no outbox row: their message was lost after the broker confirmed it (a purged or
/// deleted queue, a lost node) or sits unconsumed. Each gets a new outbox row and its
/// `next_attempt_at` moves to now, so it is republished at most once per `stale` period.
/// A duplicate message is harmless: the claim lets only one through. Returns how many.
pub async fn republish_stale(db: &PgPool, stale: Duration, limit: i64) -> Result<u64> {
    let done = sqlx::query(
        "WITH stale AS (
             SELECT id FROM notification_deliveries d
             WHERE status = 'pending' AND next_attempt_at < now() - $1 * interval '1 millisecond'
               AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
             ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED),
         upd AS (
             UPDATE notification_deliveries d SET next_attempt_at = now(), updated_at = now()
             FROM stale WHERE d.id = stale.id
             RETURNING d.id, d.channel)
         INSERT INTO outbox (delivery_id, channel) SELECT id, channel FROM upd",
    )
    .bind(stale.as_millis() as i64)
    .bind(limit)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Writes the in-app notification of a delivery; idempotent on the delivery id.
/// Returns false when the row already existed.
pub async fn insert_inbox_notification(db: &PgPool, job: &DeliveryJob) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO notifications (id, delivery_id, event_id, user_id, type, title, body, url, data_json)
         VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, ''), $9)
         ON CONFLICT (delivery_id) DO NOTHING",
    )
    .bind(Uuid::new_v4())
    .bind(job.id)
    .bind(job.event_id)
    .bind(&job.user_id)
    .bind(&job.type_key)
    .bind(&job.content.title)
    .bind(&job.content.body)
    .bind(&job.content.url)
    .bind(&job.payload)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}
