//! Events and their deliveries: the ingest transaction and the read side of `GetEvent`.

use crate::Result;
use crate::row::{parse, parse_all, parse_text};
use chrono::{DateTime, Utc};
use notify_core::{
    Channel, Content, DeliveryStatus, FanoutStatus, NewEvent, PlannedDelivery, Provider,
    SkippedDelivery,
};
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

/// The caller every event belongs to when callers are not authenticated
/// (`NOTIFY_GRPC_AUTH=off`), and the owner of events from before callers were recorded.
pub const SHARED_CALLER: &str = "anonymous";

/// The caller an event is recorded for: its authenticated caller, or [`SHARED_CALLER`].
pub fn caller_of(event: &NewEvent) -> &str {
    event.caller.as_deref().unwrap_or(SHARED_CALLER)
}

/// The database clock: `now()`, the start of the current transaction. Planning reads its
/// instant here (quiet hours, dedup buckets, fatigue windows, digest windows) so that it
/// decides on the same clock as due times, claims and leases, whatever the host's clock
/// says. Run it in the transaction that writes the plan.
pub async fn database_now(db: &mut sqlx::PgConnection) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar("SELECT now()").fetch_one(db).await?)
}

/// The stored identity of an event: enough to answer a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingEvent {
    /// Event id.
    pub id: Uuid,
    /// Fingerprint of the request that created it.
    pub fingerprint: Vec<u8>,
}

/// One event to insert with [`insert_events`].
#[derive(Debug, Clone, Copy)]
pub struct EventInsert<'a> {
    /// Id to give the event if it is new.
    pub id: Uuid,
    /// The validated request.
    pub event: &'a NewEvent,
    /// The channels it resolved to.
    pub channels: &'a [Channel],
}

/// Inserts the event unless its key exists. Returns `None` when it was inserted, or the
/// existing event. See [`insert_events`].
pub async fn insert_event_or_get_existing(
    db: &mut sqlx::PgConnection,
    id: Uuid,
    event: &NewEvent,
    channels: &[Channel],
) -> Result<Option<ExistingEvent>> {
    let mut out = insert_events(
        db,
        &[EventInsert {
            id,
            event,
            channels,
        }],
    )
    .await?;
    Ok(out.pop().flatten())
}

/// Inserts a batch of events in one statement, each unless its caller already has an
/// event with its key (keys are scoped to the caller, [`caller_of`]: another caller's
/// event with the same key is neither found nor touched). (key, caller) pairs must be
/// distinct within the batch (callers sort them by key then caller, the unique index's
/// order, so that concurrent batches lock it in one order). Returns, per input in order,
/// `None` when it was inserted or the caller's existing event. Concurrent inserts of one
/// pair serialise on the unique index: the loser waits for the winner's commit and then
/// sees its row, never an error. A topic event starts with fan-out `pending`. Two round
/// trips at most, whatever the batch size.
pub async fn insert_events(
    db: &mut sqlx::PgConnection,
    batch: &[EventInsert<'_>],
) -> Result<Vec<Option<ExistingEvent>>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = batch.iter().map(|b| b.id).collect();
    let keys: Vec<&str> = batch.iter().map(|b| b.event.event_key.as_str()).collect();
    let types: Vec<&str> = batch.iter().map(|b| b.event.type_key.as_str()).collect();
    let actors: Vec<&str> = batch.iter().map(|b| b.event.actor_id.as_str()).collect();
    // Ragged arrays travel as JSON arrays, one per event.
    let recipients: Vec<serde_json::Value> = batch
        .iter()
        .map(|b| serde_json::json!(b.event.recipients))
        .collect();
    let payloads: Vec<&serde_json::Value> = batch.iter().map(|b| &b.event.payload).collect();
    let contents: Vec<serde_json::Value> = batch
        .iter()
        .map(|b| serde_json::to_value(&b.event.content).unwrap_or_default())
        .collect();
    let channels: Vec<serde_json::Value> = batch
        .iter()
        .map(|b| serde_json::json!(b.channels.iter().map(|c| c.as_str()).collect::<Vec<_>>()))
        .collect();
    let fingerprints: Vec<Vec<u8>> = batch
        .iter()
        .map(|b| b.event.fingerprint().to_vec())
        .collect();
    let topics: Vec<Option<&str>> = batch.iter().map(|b| b.event.topic.as_deref()).collect();
    let multicast: Vec<bool> = batch.iter().map(|b| b.event.line_multicast).collect();
    let caller_keys: Vec<Option<&str>> = batch
        .iter()
        .map(|b| b.event.caller_key.as_deref())
        .collect();
    let aggregates: Vec<Option<&str>> = batch
        .iter()
        .map(|b| b.event.aggregate_key.as_deref())
        .collect();
    let traces: Vec<Option<&str>> = batch
        .iter()
        .map(|b| b.event.trace_context.as_deref())
        .collect();
    let callers: Vec<&str> = batch.iter().map(|b| caller_of(b.event)).collect();
    let inserted: Vec<(String, String)> = sqlx::query_as(
        "INSERT INTO notification_events
             (id, event_key, type, actor_id, recipients, payload_json, content_json, channels,
              fingerprint, topic, fanout_status, line_multicast, caller_key, aggregate_key,
              trace_context, caller)
         SELECT t.id, t.key, t.type, t.actor,
                ARRAY(SELECT jsonb_array_elements_text(t.recipients)), t.payload, t.content,
                ARRAY(SELECT jsonb_array_elements_text(t.channels)), t.fingerprint, t.topic,
                CASE WHEN t.topic IS NULL THEN 'none' ELSE 'pending' END, t.multicast, t.caller_key,
                t.aggregate, t.trace, t.caller
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[],
                     $7::jsonb[], $8::jsonb[], $9::bytea[], $10::text[], $11::bool[], $12::text[],
                     $13::text[], $14::text[], $15::text[])
              WITH ORDINALITY
              AS t(id, key, type, actor, recipients, payload, content, channels, fingerprint, topic,
                   multicast, caller_key, aggregate, trace, caller, n)
         ORDER BY t.n
         ON CONFLICT (event_key, caller) DO NOTHING
         RETURNING event_key, caller",
    )
    .bind(&ids)
    .bind(&keys)
    .bind(&types)
    .bind(&actors)
    .bind(&recipients)
    .bind(&payloads)
    .bind(&contents)
    .bind(&channels)
    .bind(&fingerprints)
    .bind(&topics)
    .bind(&multicast)
    .bind(&caller_keys)
    .bind(&aggregates)
    .bind(&traces)
    .bind(&callers)
    .fetch_all(&mut *db)
    .await?;
    if inserted.len() == batch.len() {
        return Ok(vec![None; batch.len()]);
    }
    let inserted: std::collections::HashSet<(String, String)> = inserted.into_iter().collect();
    let (existing_keys, existing_callers): (Vec<&str>, Vec<&str>) = keys
        .iter()
        .zip(&callers)
        .filter(|(k, c)| !inserted.contains(&(k.to_string(), c.to_string())))
        .map(|(k, c)| (*k, *c))
        .unzip();
    let rows = sqlx::query(
        "SELECT e.event_key, e.caller, e.id, e.fingerprint
         FROM notification_events e
         JOIN UNNEST($1::text[], $2::text[]) AS t(key, caller)
           ON e.event_key = t.key AND e.caller = t.caller",
    )
    .bind(&existing_keys)
    .bind(&existing_callers)
    .fetch_all(&mut *db)
    .await?;
    let mut existing: std::collections::HashMap<(String, String), ExistingEvent> = rows
        .into_iter()
        .map(|r| {
            (
                (r.get("event_key"), r.get("caller")),
                ExistingEvent {
                    id: r.get("id"),
                    fingerprint: r.get("fingerprint"),
                },
            )
        })
        .collect();
    Ok(keys
        .iter()
        .zip(&callers)
        .map(|(k, c)| existing.remove(&(k.to_string(), c.to_string())))
        .collect())
}

/// Records recipient x channel pairs that got no delivery (idempotent).
pub async fn insert_skips(
    db: &mut sqlx::PgConnection,
    event_id: Uuid,
    skipped: &[SkippedDelivery],
) -> Result<()> {
    let rows: Vec<(Uuid, &SkippedDelivery)> = skipped.iter().map(|s| (event_id, s)).collect();
    insert_skips_many(db, &rows).await
}

/// Records the skipped pairs of several events, `(event id, pair)`, in one statement.
pub async fn insert_skips_many(
    db: &mut sqlx::PgConnection,
    skipped: &[(Uuid, &SkippedDelivery)],
) -> Result<()> {
    if skipped.is_empty() {
        return Ok(());
    }
    let events: Vec<Uuid> = skipped.iter().map(|(e, _)| *e).collect();
    let users: Vec<&str> = skipped.iter().map(|(_, s)| s.user_id.as_str()).collect();
    let channels: Vec<&str> = skipped.iter().map(|(_, s)| s.channel.as_str()).collect();
    let reasons: Vec<&str> = skipped.iter().map(|(_, s)| s.reason.as_str()).collect();
    let decisions: Vec<&str> = skipped.iter().map(|(_, s)| s.decision.as_str()).collect();
    sqlx::query(
        "INSERT INTO delivery_skips (event_id, user_id, channel, reason, decision)
         SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
         ON CONFLICT DO NOTHING",
    )
    .bind(&events)
    .bind(&users)
    .bind(&channels)
    .bind(&reasons)
    .bind(&decisions)
    .execute(&mut *db)
    .await?;
    Ok(())
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

/// Inserts deliveries of one event and one outbox row each (due now). See
/// [`insert_deliveries_many`].
pub async fn insert_deliveries(
    db: &mut sqlx::PgConnection,
    event_id: Uuid,
    deliveries: &[NewDelivery],
) -> Result<u64> {
    let rows: Vec<(Uuid, &NewDelivery)> = deliveries.iter().map(|d| (event_id, d)).collect();
    insert_deliveries_many(db, &rows).await
}

/// Inserts deliveries, `(event id, delivery)`, and one outbox row each (due when the
/// delivery is), in one statement whatever their number. A delivery whose idempotency key
/// exists is skipped (with no outbox row), so a resumed fan-out never duplicates. Run it
/// in the transaction that records the event or the fan-out checkpoint. Returns how many
/// were inserted.
pub async fn insert_deliveries_many(
    db: &mut sqlx::PgConnection,
    deliveries: &[(Uuid, &NewDelivery)],
) -> Result<u64> {
    if deliveries.is_empty() {
        return Ok(0);
    }
    let events: Vec<Uuid> = deliveries.iter().map(|(e, _)| *e).collect();
    let ids: Vec<Uuid> = deliveries.iter().map(|(_, d)| d.id).collect();
    let users: Vec<&str> = deliveries
        .iter()
        .map(|(_, d)| d.plan.user_id.as_str())
        .collect();
    let channels: Vec<&str> = deliveries
        .iter()
        .map(|(_, d)| d.plan.channel.as_str())
        .collect();
    let providers: Vec<&str> = deliveries
        .iter()
        .map(|(_, d)| d.plan.provider.as_str())
        .collect();
    let endpoints: Vec<Option<Uuid>> = deliveries.iter().map(|(_, d)| d.plan.endpoint_id).collect();
    let addresses: Vec<Option<&str>> = deliveries
        .iter()
        .map(|(_, d)| d.plan.address.as_deref())
        .collect();
    let keys: Vec<&str> = deliveries
        .iter()
        .map(|(_, d)| d.plan.idempotency_key.as_str())
        .collect();
    let retry_keys: Vec<Option<Uuid>> = deliveries.iter().map(|(_, d)| d.retry_key).collect();
    let max_attempts: Vec<i32> = deliveries.iter().map(|(_, d)| d.max_attempts).collect();
    let deferred: Vec<Option<chrono::DateTime<chrono::Utc>>> = deliveries
        .iter()
        .map(|(_, d)| d.plan.deferred_until)
        .collect();
    let decisions: Vec<&str> = deliveries
        .iter()
        .map(|(_, d)| d.plan.decision.as_str())
        .collect();
    let throttle: Vec<Option<chrono::DateTime<chrono::Utc>>> =
        deliveries.iter().map(|(_, d)| d.plan.throttle_at).collect();
    let digests: Vec<Option<&str>> = deliveries
        .iter()
        .map(|(_, d)| d.plan.digest_key.as_deref())
        .collect();
    sqlx::query(
        "WITH d AS (
             INSERT INTO notification_deliveries
                 (id, event_id, user_id, channel, provider, endpoint_id, address, idempotency_key,
                  retry_key, max_attempts, deferred_until, next_attempt_at, decision, throttle_at,
                  digest_key)
             SELECT t.id, t.event_id, t.user_id, t.channel, t.provider, t.endpoint_id, t.address,
                    t.key, t.retry_key, t.max_attempts, t.deferred,
                    greatest(now(), coalesce(t.deferred, now())), t.decision, t.throttle, t.digest
             FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::uuid[],
                         $7::text[], $8::text[], $9::uuid[], $10::int[], $11::timestamptz[],
                         $12::text[], $13::timestamptz[], $14::text[])
                  AS t(event_id, id, user_id, channel, provider, endpoint_id, address, key,
                       retry_key, max_attempts, deferred, decision, throttle, digest)
             ON CONFLICT (channel, idempotency_key) DO NOTHING
             RETURNING id, channel, next_attempt_at)
         INSERT INTO outbox (delivery_id, channel, available_at)
         SELECT id, channel, next_attempt_at FROM d",
    )
    .bind(&events)
    .bind(&ids)
    .bind(&users)
    .bind(&channels)
    .bind(&providers)
    .bind(&endpoints)
    .bind(&addresses)
    .bind(&keys)
    .bind(&retry_keys)
    .bind(&max_attempts)
    .bind(&deferred)
    .bind(&decisions)
    .bind(&throttle)
    .bind(&digests)
    .execute(&mut *db)
    .await
    .map(|done| done.rows_affected())
    .map_err(Into::into)
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
    /// Topic broadcast to, if any.
    pub topic: Option<String>,
    /// Where its fan-out stands (`none` for an event without a topic).
    pub fanout_status: FanoutStatus,
    /// Topic subscribers planned so far.
    pub fanout_recipients: i32,
    /// The caller that sent it (its key's name, or [`SHARED_CALLER`]); its event key is
    /// unique within this caller's events.
    pub caller: String,
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
                fanout_status, fanout_recipients, created_at, caller
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
                last_error, provider_message_id, sent_at, deferred_until, decision
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
                last_error, provider_message_id, sent_at, deferred_until, decision
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

/// A topic event whose fan-out this replica holds.
#[derive(Debug, Clone)]
pub struct FanoutJob {
    /// Event id.
    pub event_id: Uuid,
    /// Notification type key.
    pub type_key: String,
    /// Topic.
    pub topic: String,
    /// Channels to plan.
    pub channels: Vec<Channel>,
    /// Last subscriber planned.
    pub cursor: String,
    /// LINE by multicast batches.
    pub line_multicast: bool,
}

/// Claims the oldest topic event whose fan-out is pending and not held by a live replica,
/// holding it for `hold`.
pub async fn claim_fanout(
    db: &sqlx::PgPool,
    hold: std::time::Duration,
) -> Result<Option<FanoutJob>> {
    let row = sqlx::query(
        "UPDATE notification_events e SET fanout_locked_until = now() + $1 * interval '1 millisecond'
         FROM (SELECT id FROM notification_events
               WHERE fanout_status = 'pending' AND (fanout_locked_until IS NULL OR fanout_locked_until < now())
               ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) due
         WHERE e.id = due.id
         RETURNING e.id, e.type, e.topic, e.channels, e.fanout_cursor, e.line_multicast",
    )
    .bind(notify_core::retry::millis(hold))
    .fetch_optional(db)
    .await?;
    row.map(|r| {
        Ok(FanoutJob {
            event_id: r.get("id"),
            type_key: r.get("type"),
            topic: r.get("topic"),
            channels: parse_all(&r, "channels")?,
            cursor: r.get("fanout_cursor"),
            line_multicast: r.get("line_multicast"),
        })
    })
    .transpose()
}

/// Subscribers of `topic` after `after` in user_id order, at most `limit`.
pub async fn subscribers_page(
    db: &mut sqlx::PgConnection,
    topic: &str,
    after: &str,
    limit: i64,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT user_id FROM topic_subscriptions WHERE topic = $1 AND user_id > $2 ORDER BY user_id LIMIT $3",
    )
    .bind(topic)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Moves a fan-out checkpoint from `from` to `to` (adding `planned` recipients), marking
/// it done when `done`, and extends the hold. Fenced by the old cursor: returns false when
/// another replica moved it meanwhile (then the caller rolls back).
pub async fn advance_fanout(
    db: &mut sqlx::PgConnection,
    event_id: Uuid,
    from: &str,
    to: &str,
    planned: i32,
    done: bool,
    hold: std::time::Duration,
) -> Result<bool> {
    let r = sqlx::query(
        "UPDATE notification_events
         SET fanout_cursor = $3, fanout_recipients = fanout_recipients + $4,
             fanout_status = CASE WHEN $5 THEN 'done' ELSE 'pending' END,
             fanout_locked_until = now() + $6 * interval '1 millisecond'
         WHERE id = $1 AND fanout_cursor = $2 AND fanout_status = 'pending'",
    )
    .bind(event_id)
    .bind(from)
    .bind(to)
    .bind(planned)
    .bind(done)
    .bind(notify_core::retry::millis(hold))
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// What already counts toward fatigue caps for `users`: the scheduled times of their
/// capped deliveries from the last hour on (future ones included), once per event and
/// channel.
///
/// Call it inside the transaction that writes the new deliveries: it first takes a
/// transaction-scoped advisory lock per user (in one order, so concurrent writers cannot
/// deadlock on them), held until that transaction ends. A concurrent group commit, fan-out
/// page or replica planning for the same user waits, then reads what this one committed,
/// so "at most N per user per channel per rolling hour" is exact with several writers.
pub async fn counted_toward_caps(
    db: &mut sqlx::PgConnection,
    users: &[&str],
) -> Result<notify_core::fatigue::Counted> {
    let mut counted = notify_core::fatigue::Counted::new();
    if users.is_empty() {
        return Ok(counted);
    }
    sqlx::query(
        "SELECT pg_advisory_xact_lock(k) FROM (
             SELECT DISTINCT hashtextextended('notify.fatigue:' || u, 0) AS k
             FROM unnest($1::text[]) AS u ORDER BY k) locks",
    )
    .bind(users)
    .execute(&mut *db)
    .await?;
    let rows: Vec<(String, String, DateTime<Utc>)> = sqlx::query_as(
        "SELECT DISTINCT ON (user_id, channel, event_id) user_id, channel, throttle_at
         FROM notification_deliveries
         WHERE user_id = ANY($1) AND throttle_at IS NOT NULL
           AND throttle_at > now() - interval '1 hour'",
    )
    .bind(users)
    .fetch_all(&mut *db)
    .await?;
    for (user, channel, at) in rows {
        if let Ok(channel) = channel.parse() {
            counted.entry((user, channel)).or_default().push(at);
        }
    }
    Ok(counted)
}

/// Attaches events to their digest deliveries: for each `(event id, channel, idempotency
/// key)`, the digest delivery with that key, if it is still pending (locked against a
/// concurrent claim, so an event never joins a digest already being sent). Returns, per
/// input, the delivery it joined, or `None` when the digest had closed.
pub async fn attach_digest_items(
    db: &mut sqlx::PgConnection,
    items: &[(Uuid, &str, &str)],
) -> Result<Vec<Option<Uuid>>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(i64, Uuid)> = sqlx::query_as(
        "WITH target AS (
             SELECT t.n, t.event_id, d.id
             FROM UNNEST($1::uuid[], $2::text[], $3::text[]) WITH ORDINALITY AS t(event_id, channel, key, n)
             JOIN notification_deliveries d ON d.channel = t.channel AND d.idempotency_key = t.key
             WHERE d.status = 'pending'
             FOR SHARE OF d),
         ins AS (
             INSERT INTO digest_items (delivery_id, event_id)
             SELECT id, event_id FROM target ON CONFLICT DO NOTHING)
         SELECT n, id FROM target",
    )
    .bind(items.iter().map(|i| i.0).collect::<Vec<_>>())
    .bind(items.iter().map(|i| i.1).collect::<Vec<_>>())
    .bind(items.iter().map(|i| i.2).collect::<Vec<_>>())
    .fetch_all(&mut *db)
    .await?;
    let mut out = vec![None; items.len()];
    for (n, id) in rows {
        out[(n - 1) as usize] = Some(id);
    }
    Ok(out)
}

/// The events a digest delivery lists, oldest first.
pub async fn digest_items_of(
    db: impl PgExecutor<'_>,
    delivery_id: Uuid,
) -> Result<Vec<notify_core::template::DigestItem>> {
    let rows = sqlx::query(
        "SELECT e.event_key, e.payload_json, e.content_json
         FROM digest_items i JOIN notification_events e ON e.id = i.event_id
         WHERE i.delivery_id = $1 ORDER BY i.added_at, e.id",
    )
    .bind(delivery_id)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| notify_core::template::DigestItem {
            event_key: r.get("event_key"),
            payload: r.get("payload_json"),
            content: serde_json::from_value(r.get("content_json")).unwrap_or_default(),
        })
        .collect())
}
