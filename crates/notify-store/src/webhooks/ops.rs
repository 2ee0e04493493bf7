//! What operators look at: the pending backlog (a gauge sampled by ingest) and, per
//! endpoint, its pending messages and latest attempts (the console's webhooks page).

use crate::Result;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// Webhook messages still `pending` whose row was written more than a minute ago
/// (database clock): messages waiting for a retry's delay, for a busy endpoint, or for a
/// worker. Reads pending messages only (through their partial index).
pub async fn pending_backlog(db: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM webhook_messages
          WHERE status = 'pending' AND created_at < now() - interval '1 minute'",
    )
    .fetch_one(db)
    .await?)
}

/// Pending (or in-flight) messages per endpoint, for the endpoints that have any.
pub async fn pending_per_endpoint(db: &PgPool) -> Result<Vec<(Uuid, i64)>> {
    Ok(sqlx::query_as(
        "SELECT endpoint_id, count(*) FROM webhook_messages
          WHERE status IN ('pending', 'sending') GROUP BY endpoint_id",
    )
    .fetch_all(db)
    .await?)
}

/// One POST to an endpoint, as the console lists it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EndpointAttempt {
    /// The message POSTed.
    pub message_id: Uuid,
    /// Its event type (`delivery.sent` ...).
    pub event_type: String,
    /// Attempt number of that message (1 = first).
    pub attempt: i32,
    /// HTTP status of the answer; `None` when none came (timeout, refused, policy).
    pub status_code: Option<i32>,
    /// Milliseconds from the request to the answer's head (or the failure).
    pub latency_ms: i32,
    /// What went wrong; `None` on 2xx.
    pub error: Option<String>,
    /// When the POST started.
    pub started_at: DateTime<Utc>,
}

/// The newest `limit` attempts to endpoint `id`, newest first.
pub async fn latest_attempts(db: &PgPool, id: Uuid, limit: i64) -> Result<Vec<EndpointAttempt>> {
    Ok(sqlx::query_as(
        "SELECT a.message_id, m.event_type, a.attempt, a.status_code, a.latency_ms, a.error,
                a.started_at
           FROM webhook_messages m JOIN webhook_attempts a ON a.message_id = m.id
          WHERE m.endpoint_id = $1
          ORDER BY a.started_at DESC, a.id DESC LIMIT $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Endpoint `id` of any caller, if there is one.
pub async fn get_endpoint(db: &PgPool, id: Uuid) -> Result<Option<super::Endpoint>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {} FROM webhook_endpoints WHERE id = $1",
        super::endpoints::COLUMNS
    )))
    .bind(id)
    .fetch_optional(db)
    .await?)
}
