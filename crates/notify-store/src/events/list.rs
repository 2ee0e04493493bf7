//! `ListEvents`: a caller's events, newest first, filtered and paged by event id (ids are
//! UUIDv7, so id order is creation order).

use crate::Result;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// What `ListEvents` filters by; every `None` is "any".
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Only this caller's events; `None` = every caller's (a caller that may manage).
    pub caller: Option<String>,
    /// Only this type.
    pub type_key: Option<String>,
    /// Created at or after.
    pub created_after: Option<DateTime<Utc>>,
    /// Created before.
    pub created_before: Option<DateTime<Utc>>,
    /// Only events naming this user: a listed recipient, or a delivery for them (a topic
    /// subscriber's).
    pub recipient: Option<String>,
}

/// One listed event.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventSummary {
    /// Event id.
    pub id: Uuid,
    /// The caller's key (the dedup bucket suffix left out).
    pub event_key: String,
    /// Type key.
    #[sqlx(rename = "type")]
    pub type_key: String,
    /// The caller that sent it.
    pub caller: String,
    /// Listed recipients.
    pub recipients: Vec<String>,
    /// Topic, if any.
    pub topic: Option<String>,
    /// Recorded (database clock).
    pub created_at: DateTime<Utc>,
    /// Due time of a scheduled event.
    pub send_at: Option<DateTime<Utc>>,
    /// When the whole event was canceled.
    pub canceled_at: Option<DateTime<Utc>>,
}

/// Up to `limit` events matching `f` with an id below `before` (None = the newest first),
/// newest first.
pub async fn list_events(
    db: &sqlx::PgPool,
    f: &EventFilter,
    before: Option<Uuid>,
    limit: i64,
) -> Result<Vec<EventSummary>> {
    let rows = sqlx::query_as(
        "SELECT id, coalesce(caller_key, event_key) AS event_key, type,
                coalesce(caller, $7) AS caller, recipients, topic, created_at, send_at, canceled_at
         FROM notification_events e
         WHERE ($1::text IS NULL OR coalesce(e.caller, $7) = $1)
           AND ($2::text IS NULL OR e.type = $2)
           AND ($3::timestamptz IS NULL OR e.created_at >= $3)
           AND ($4::timestamptz IS NULL OR e.created_at < $4)
           AND ($5::text IS NULL OR e.recipients @> ARRAY[$5]::text[]
                OR e.id IN (SELECT d.event_id FROM notification_deliveries d WHERE d.user_id = $5))
           AND ($6::uuid IS NULL OR e.id < $6)
         ORDER BY e.id DESC LIMIT $8",
    )
    .bind(&f.caller)
    .bind(&f.type_key)
    .bind(f.created_after)
    .bind(f.created_before)
    .bind(&f.recipient)
    .bind(before)
    .bind(super::SHARED_CALLER)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows)
}
