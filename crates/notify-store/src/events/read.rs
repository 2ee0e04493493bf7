//! The read side of `GetEvent` and `ExplainDelivery`: an event, its deliveries, skips and
//! attempts, each row mapped once into typed values.

use crate::Result;
use crate::row::{parse, parse_text};
use chrono::{DateTime, Utc};
use notify_core::{Channel, Content, DeliveryStatus, FanoutStatus, Provider};
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

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
    /// Topic broadcast to, if any.
    pub topic: Option<String>,
    /// Where its fan-out stands (`none` for an event without a topic).
    pub fanout_status: FanoutStatus,
    /// Topic subscribers planned so far.
    pub fanout_recipients: i32,
    /// The caller that sent it (its key's name, or [`SHARED_CALLER`](super::SHARED_CALLER)); its event key is
    /// unique within this caller's events.
    pub caller: String,
    /// When it was recorded (database clock).
    pub created_at: DateTime<Utc>,
    /// A scheduled event's due time; `None` for one sent at once.
    pub send_at: Option<DateTime<Utc>>,
    /// The caller's cancellation key, if it gave one.
    pub cancellation_key: Option<String>,
    /// When the whole event was canceled (not set for cancels of some recipients).
    pub canceled_at: Option<DateTime<Utc>>,
    /// Who canceled it (the caller's or the staff member's name).
    pub canceled_by: Option<String>,
}

/// A delivery as `GetEvent` shows it.
#[derive(Debug, Clone)]
pub struct DeliveryRecord {
    /// Delivery id.
    pub id: Uuid,
    /// Recipient.
    pub user_id: String,
    /// Channel.
    pub channel: Channel,
    /// Provider.
    pub provider: Provider,
    /// Push endpoint.
    pub endpoint_id: Option<Uuid>,
    /// State.
    pub status: DeliveryStatus,
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
    /// Quiet hours held the first attempt until then.
    pub deferred_until: Option<DateTime<Utc>>,
    /// Planning decisions, one per line.
    pub decision: String,
    /// Why it exists: planned, fallback or escalation.
    pub cause: notify_core::plan::Cause,
    /// The delivery it derives from, if any.
    pub caused_by: Option<Uuid>,
}

/// A skipped recipient x channel pair.
#[derive(Debug, Clone)]
pub struct SkipRecord {
    /// Recipient.
    pub user_id: String,
    /// Channel.
    pub channel: Channel,
    /// Skip reason code.
    pub reason: String,
    /// Planning decisions, one per line.
    pub decision: String,
}

/// How to find an event.
#[derive(Debug, Clone)]
pub enum EventSelector {
    /// By id.
    Id(Uuid),
    /// By (already NFC-normalised) key, as the caller gave it (for a type with a dedup
    /// window, the newest bucket's event), within `caller`'s events.
    Key {
        /// The key.
        key: String,
        /// Whose namespace to look in.
        caller: String,
        /// Also look in every other caller's events (for callers that may manage); the
        /// caller's own event still comes first.
        any_caller: bool,
    },
}

/// Loads an event; `None` if it does not exist (or, by key, is not in the namespaces the
/// selector allows).
pub async fn get_event(
    db: impl PgExecutor<'_>,
    sel: &EventSelector,
) -> Result<Option<EventRecord>> {
    let (id, key, caller, any_caller) = match sel {
        EventSelector::Id(id) => (Some(*id), None, None, false),
        EventSelector::Key {
            key,
            caller,
            any_caller,
        } => (None, Some(key.as_str()), Some(caller.as_str()), *any_caller),
    };
    let row = sqlx::query(
        "SELECT id, event_key, type, actor_id, recipients, payload_json, content_json, topic,
                fanout_status, fanout_recipients, created_at, caller, send_at, cancellation_key,
                canceled_at, canceled_by
         FROM notification_events
         WHERE id = $1 OR ((event_key = $2 OR caller_key = $2) AND (caller = $3 OR $4))
         ORDER BY (caller = $3) DESC NULLS LAST, created_at DESC LIMIT 1",
    )
    .bind(id)
    .bind(key)
    .bind(caller)
    .bind(any_caller)
    .fetch_optional(db)
    .await?;
    row.map(|r| {
        Ok(EventRecord {
            id: r.get("id"),
            event_key: r.get("event_key"),
            type_key: r.get("type"),
            actor_id: r.get("actor_id"),
            recipients: r.get("recipients"),
            payload: r.get("payload_json"),
            content: serde_json::from_value(r.get("content_json")).unwrap_or_default(),
            topic: r.get("topic"),
            fanout_status: parse(&r, "fanout_status")?,
            fanout_recipients: r.get("fanout_recipients"),
            caller: r.get("caller"),
            created_at: r.get("created_at"),
            send_at: r.get("send_at"),
            cancellation_key: r.get("cancellation_key"),
            canceled_at: r.get("canceled_at"),
            canceled_by: r.get("canceled_by"),
        })
    })
    .transpose()
}

/// Up to `limit` deliveries of an event in id order, after `after` (for paging).
pub async fn list_deliveries(
    db: impl PgExecutor<'_>,
    event_id: Uuid,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<DeliveryRecord>> {
    let rows = sqlx::query(
        "SELECT id, user_id, channel, provider, endpoint_id, status, attempts, next_attempt_at,
                last_error, provider_message_id, sent_at, deferred_until, decision, cause, caused_by
         FROM notification_deliveries WHERE event_id = $1 AND ($2::uuid IS NULL OR id > $2)
         ORDER BY id LIMIT $3",
    )
    .bind(event_id)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    rows.iter().map(delivery_record).collect()
}

fn delivery_record(r: &sqlx::postgres::PgRow) -> Result<DeliveryRecord> {
    {
        Ok(DeliveryRecord {
            id: r.get("id"),
            user_id: r.get("user_id"),
            channel: parse(r, "channel")?,
            provider: parse(r, "provider")?,
            endpoint_id: r.get("endpoint_id"),
            status: parse(r, "status")?,
            attempts: r.get("attempts"),
            next_attempt_at: r.get("next_attempt_at"),
            last_error: r.get("last_error"),
            provider_message_id: r.get("provider_message_id"),
            sent_at: r.get("sent_at"),
            deferred_until: r.get("deferred_until"),
            decision: r.get("decision"),
            cause: parse(r, "cause")?,
            caused_by: r.get("caused_by"),
        })
    }
}

fn skip_record(r: &sqlx::postgres::PgRow) -> Result<SkipRecord> {
    Ok(SkipRecord {
        user_id: r.get("user_id"),
        channel: parse(r, "channel")?,
        reason: r.get("reason"),
        decision: r.get("decision"),
    })
}

/// One user's deliveries of an event on one channel (several for push endpoints).
pub async fn deliveries_of(
    db: impl PgExecutor<'_>,
    event_id: Uuid,
    user_id: &str,
    channel: Channel,
) -> Result<Vec<DeliveryRecord>> {
    let rows = sqlx::query(
        "SELECT id, user_id, channel, provider, endpoint_id, status, attempts, next_attempt_at,
                last_error, provider_message_id, sent_at, deferred_until, decision, cause, caused_by
         FROM notification_deliveries
         WHERE event_id = $1 AND channel = $3
           AND (user_id = $2 OR (provider = 'line_multicast' AND $2 = ANY(
                 SELECT r.user_id FROM recipients r
                 WHERE r.line_user_id = ANY(string_to_array(address, ',')))))
         ORDER BY id",
    )
    .bind(event_id)
    .bind(user_id)
    .bind(channel.as_str())
    .fetch_all(db)
    .await?;
    rows.iter().map(delivery_record).collect()
}

/// The skip of one user on one channel for an event, if any.
pub async fn skip_of(
    db: impl PgExecutor<'_>,
    event_id: Uuid,
    user_id: &str,
    channel: Channel,
) -> Result<Option<SkipRecord>> {
    sqlx::query(
        "SELECT user_id, channel, reason, decision FROM delivery_skips
         WHERE event_id = $1 AND user_id = $2 AND channel = $3",
    )
    .bind(event_id)
    .bind(user_id)
    .bind(channel.as_str())
    .fetch_optional(db)
    .await?
    .as_ref()
    .map(skip_record)
    .transpose()
}

/// One provider call as recorded.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptRow {
    /// Attempt number, from 1.
    pub attempt: i32,
    /// `sent`, `retry` or `failed`.
    pub outcome: String,
    /// HTTP status or SMTP code.
    pub provider_status: Option<i32>,
    /// Normalised error code.
    pub error_code: Option<String>,
    /// Raw answer (truncated).
    pub provider_response: Option<String>,
    /// What was sent.
    pub content_json: Option<serde_json::Value>,
    /// When the call started.
    pub started_at: DateTime<Utc>,
    /// When it was recorded.
    pub finished_at: DateTime<Utc>,
    /// Worker instance.
    pub worker_id: String,
}

/// A delivery's attempts, oldest first.
pub async fn attempts_of(db: impl PgExecutor<'_>, delivery_id: Uuid) -> Result<Vec<AttemptRow>> {
    Ok(sqlx::query_as(
        "SELECT attempt, outcome, provider_status, error_code, provider_response, content_json,
                started_at, finished_at, worker_id
         FROM delivery_attempts WHERE delivery_id = $1 ORDER BY attempt",
    )
    .bind(delivery_id)
    .fetch_all(db)
    .await?)
}

/// A push endpoint's state as text: `fcm active`, `apns revoked (invalid_token) at …`.
pub async fn endpoint_state(db: impl PgExecutor<'_>, endpoint_id: Uuid) -> Result<String> {
    type EndpointRow = (String, String, Option<String>, Option<DateTime<Utc>>);
    let row: Option<EndpointRow> = sqlx::query_as(
        "SELECT platform, status, revoked_reason, revoked_at FROM notification_endpoints WHERE id = $1",
    )
    .bind(endpoint_id)
    .fetch_optional(db)
    .await?;
    Ok(match row {
        None => "endpoint gone".into(),
        Some((platform, status, reason, at)) => match (reason, at) {
            (Some(reason), Some(at)) => {
                format!("{platform} {status} ({reason}) at {}", at.to_rfc3339())
            }
            _ => format!("{platform} {status}"),
        },
    })
}

/// Number of an event's deliveries per (channel, status), ordered by their stored names.
pub async fn delivery_counts(
    db: impl PgExecutor<'_>,
    event_id: Uuid,
) -> Result<Vec<(Channel, DeliveryStatus, i64)>> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT channel, status, count(*) FROM notification_deliveries WHERE event_id = $1
         GROUP BY channel, status ORDER BY channel, status",
    )
    .bind(event_id)
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|(channel, status, n)| {
            Ok((
                parse_text("channel", &channel)?,
                parse_text("status", &status)?,
                n,
            ))
        })
        .collect()
}

/// Up to `limit` skipped pairs of an event, by user then channel.
pub async fn list_skips(
    db: impl PgExecutor<'_>,
    event_id: Uuid,
    limit: i64,
) -> Result<Vec<SkipRecord>> {
    sqlx::query(
        "SELECT user_id, channel, reason, decision FROM delivery_skips WHERE event_id = $1
         ORDER BY user_id, channel LIMIT $2",
    )
    .bind(event_id)
    .bind(limit)
    .fetch_all(db)
    .await?
    .iter()
    .map(skip_record)
    .collect()
}
