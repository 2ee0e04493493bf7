//! Events and their deliveries: the ingest transaction and the read side of `GetEvent`.

use crate::Result;
use chrono::{DateTime, Utc};
use notify_core::{Channel, Content, NewEvent, PlannedDelivery, SkippedDelivery};
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

/// The stored identity of an event: enough to answer a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingEvent {
    /// Event id.
    pub id: Uuid,
    /// Fingerprint of the request that created it.
    pub fingerprint: Vec<u8>,
}

/// Inserts the event unless its key exists. Returns `None` when it was inserted, or the
/// existing event. Concurrent inserts of one key serialise on the unique index: the loser
/// waits for the winner's commit and then sees its row, never an error.
pub async fn insert_event_or_get_existing(
    db: &mut sqlx::PgConnection,
    id: Uuid,
    event: &NewEvent,
    channels: &[Channel],
    skipped: &[SkippedDelivery],
) -> Result<Option<ExistingEvent>> {
    let channel_names: Vec<&str> = channels.iter().map(|c| c.as_str()).collect();
    let skipped_json: Vec<serde_json::Value> = skipped
        .iter()
        .map(|s| {
            serde_json::json!({"user_id": s.user_id, "channel": s.channel.as_str(), "reason": s.reason.as_str()})
        })
        .collect();
    let inserted = sqlx::query(
        "INSERT INTO notification_events
             (id, event_key, type, actor_id, recipients, payload_json, content_json, channels,
              fingerprint, skipped_json)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (event_key) DO NOTHING",
    )
    .bind(id)
    .bind(&event.event_key)
    .bind(&event.type_key)
    .bind(&event.actor_id)
    .bind(&event.recipients)
    .bind(&event.payload)
    .bind(serde_json::to_value(&event.content).unwrap_or_default())
    .bind(&channel_names)
    .bind(event.fingerprint().as_slice())
    .bind(serde_json::Value::Array(skipped_json))
    .execute(&mut *db)
    .await?;
    if inserted.rows_affected() == 1 {
        return Ok(None);
    }
    let row = sqlx::query("SELECT id, fingerprint FROM notification_events WHERE event_key = $1")
        .bind(&event.event_key)
        .fetch_one(&mut *db)
        .await?;
    Ok(Some(ExistingEvent {
        id: row.get("id"),
        fingerprint: row.get("fingerprint"),
    }))
}

/// A delivery to insert: the plan plus its ids.
#[derive(Debug, Clone)]
pub struct NewDelivery {
    /// Delivery id.
    pub id: Uuid,
    /// What the planner decided.
    pub plan: PlannedDelivery,
    /// LINE retry key, fixed before the first call.
    pub retry_key: Option<Uuid>,
    /// Attempts allowed.
    pub max_attempts: i32,
}

/// Inserts deliveries and one outbox row each (due now), in one statement each, whatever
/// their number. Run it in the transaction that inserted the event.
pub async fn insert_deliveries(
    db: &mut sqlx::PgConnection,
    event_id: Uuid,
    deliveries: &[NewDelivery],
) -> Result<()> {
    if deliveries.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = deliveries.iter().map(|d| d.id).collect();
    let users: Vec<&str> = deliveries.iter().map(|d| d.plan.user_id.as_str()).collect();
    let channels: Vec<&str> = deliveries.iter().map(|d| d.plan.channel.as_str()).collect();
    let providers: Vec<&str> = deliveries
        .iter()
        .map(|d| d.plan.provider.as_str())
        .collect();
    let endpoints: Vec<Option<Uuid>> = deliveries.iter().map(|d| d.plan.endpoint_id).collect();
    let addresses: Vec<Option<&str>> = deliveries
        .iter()
        .map(|d| d.plan.address.as_deref())
        .collect();
    let keys: Vec<&str> = deliveries
        .iter()
        .map(|d| d.plan.idempotency_key.as_str())
        .collect();
    let retry_keys: Vec<Option<Uuid>> = deliveries.iter().map(|d| d.retry_key).collect();
    let max_attempts: Vec<i32> = deliveries.iter().map(|d| d.max_attempts).collect();
    sqlx::query(
        "WITH d AS (
             INSERT INTO notification_deliveries
                 (id, event_id, user_id, channel, provider, endpoint_id, address, idempotency_key,
                  retry_key, max_attempts)
             SELECT t.id, $1, t.user_id, t.channel, t.provider, t.endpoint_id, t.address, t.key,
                    t.retry_key, t.max_attempts
             FROM UNNEST($2::uuid[], $3::text[], $4::text[], $5::text[], $6::uuid[], $7::text[],
                         $8::text[], $9::uuid[], $10::int[])
                  AS t(id, user_id, channel, provider, endpoint_id, address, key, retry_key, max_attempts)
             RETURNING id, channel, next_attempt_at)
         INSERT INTO outbox (delivery_id, channel, available_at)
         SELECT id, channel, next_attempt_at FROM d",
    )
    .bind(event_id)
    .bind(&ids)
    .bind(&users)
    .bind(&channels)
    .bind(&providers)
    .bind(&endpoints)
    .bind(&addresses)
    .bind(&keys)
    .bind(&retry_keys)
    .bind(&max_attempts)
    .execute(&mut *db)
    .await?;
    Ok(())
}

/// A stored event.
#[derive(Debug, Clone)]
pub struct EventRecord {
    /// Event id.
    pub id: Uuid,
    /// NFC-normalised key.
    pub event_key: String,
    /// Type key.
    pub type_key: String,
    /// Who caused it.
    pub actor_id: String,
    /// Distinct recipients.
    pub recipients: Vec<String>,
    /// Payload object.
    pub payload: serde_json::Value,
    /// Content as sent by the caller.
    pub content: Content,
    /// Skipped recipient x channel pairs: `[{user_id, channel, reason}]`.
    pub skipped: serde_json::Value,
    /// When it was recorded (database clock).
    pub created_at: DateTime<Utc>,
}

/// A delivery as `GetEvent` shows it.
#[derive(Debug, Clone)]
pub struct DeliveryRecord {
    /// Delivery id.
    pub id: Uuid,
    /// Recipient.
    pub user_id: String,
    /// Channel name.
    pub channel: String,
    /// Provider name.
    pub provider: String,
    /// Push endpoint.
    pub endpoint_id: Option<Uuid>,
    /// State.
    pub status: String,
    /// Provider calls made.
    pub attempts: i32,
    /// When the next attempt may start.
    pub next_attempt_at: DateTime<Utc>,
    /// Last error code and text.
    pub last_error: Option<String>,
    /// Provider's message id.
    pub provider_message_id: Option<String>,
    /// When it was accepted.
    pub sent_at: Option<DateTime<Utc>>,
}

/// How to find an event.
#[derive(Debug, Clone)]
pub enum EventSelector {
    /// By id.
    Id(Uuid),
    /// By (already NFC-normalised) key.
    Key(String),
}

/// Loads an event; `None` if it does not exist.
pub async fn get_event(
    db: impl PgExecutor<'_>,
    sel: &EventSelector,
) -> Result<Option<EventRecord>> {
    let (id, key) = match sel {
        EventSelector::Id(id) => (Some(*id), None),
        EventSelector::Key(k) => (None, Some(k.as_str())),
    };
    let row = sqlx::query(
        "SELECT id, event_key, type, actor_id, recipients, payload_json, content_json, skipped_json,
                created_at
         FROM notification_events WHERE id = $1 OR event_key = $2",
    )
    .bind(id)
    .bind(key)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| EventRecord {
        id: r.get("id"),
        event_key: r.get("event_key"),
        type_key: r.get("type"),
        actor_id: r.get("actor_id"),
        recipients: r.get("recipients"),
        payload: r.get("payload_json"),
        content: serde_json::from_value(r.get("content_json")).unwrap_or_default(),
        skipped: r.get("skipped_json"),
        created_at: r.get("created_at"),
    }))
}

/// Every delivery of an event, by user then channel.
pub async fn list_deliveries(
    db: impl PgExecutor<'_>,
    event_id: Uuid,
) -> Result<Vec<DeliveryRecord>> {
    let rows = sqlx::query(
        "SELECT id, user_id, channel, provider, endpoint_id, status, attempts, next_attempt_at,
                last_error, provider_message_id, sent_at
         FROM notification_deliveries WHERE event_id = $1
         ORDER BY created_at, user_id, channel, endpoint_id",
    )
    .bind(event_id)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| DeliveryRecord {
            id: r.get("id"),
            user_id: r.get("user_id"),
            channel: r.get("channel"),
            provider: r.get("provider"),
            endpoint_id: r.get("endpoint_id"),
            status: r.get("status"),
            attempts: r.get("attempts"),
            next_attempt_at: r.get("next_attempt_at"),
            last_error: r.get("last_error"),
            provider_message_id: r.get("provider_message_id"),
            sent_at: r.get("sent_at"),
        })
        .collect())
}
