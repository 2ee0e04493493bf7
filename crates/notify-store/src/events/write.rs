//! The ingest transaction's writes: events (idempotent on caller and key), their
//! deliveries with one outbox row each, and the pairs that got no delivery. Each batch is
//! one statement whatever its size.

use super::caller_of;
use crate::Result;
use crate::row::column;
use notify_core::{Channel, NewEvent, PlannedDelivery, SkippedDelivery};
use sqlx::Row;
use uuid::Uuid;

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
    /// A scheduled event's due time (`None` = sent at once), stored as `send_at`.
    pub send_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Inserts the event (sent at once) unless its key exists. Returns `None` when it was
/// inserted, or the existing event. See [`insert_events`].
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
            send_at: None,
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
    let ids = column(batch, |b| b.id);
    let keys = column(batch, |b| b.event.event_key.as_str());
    let types = column(batch, |b| b.event.type_key.as_str());
    let actors = column(batch, |b| b.event.actor_id.as_str());
    // Ragged arrays travel as JSON arrays, one per event.
    let recipients = column(batch, |b| serde_json::json!(b.event.recipients));
    let payloads = column(batch, |b| &b.event.payload);
    let contents = column(batch, |b| {
        serde_json::to_value(&b.event.content).unwrap_or_default()
    });
    let channels = column(batch, |b| {
        serde_json::json!(b.channels.iter().map(|c| c.as_str()).collect::<Vec<_>>())
    });
    let fingerprints = column(batch, |b| b.event.fingerprint().to_vec());
    let topics = column(batch, |b| b.event.topic.as_deref());
    let multicast = column(batch, |b| b.event.line_multicast);
    let caller_keys = column(batch, |b| b.event.caller_key.as_deref());
    let aggregates = column(batch, |b| b.event.aggregate_key.as_deref());
    let traces = column(batch, |b| b.event.trace_context.as_deref());
    let callers = column(batch, |b| caller_of(b.event));
    let send_at = column(batch, |b| b.send_at);
    let cancellation_keys = column(batch, |b| b.event.cancellation_key.as_deref());
    let inserted: Vec<(String, String)> = sqlx::query_as(
        "INSERT INTO notification_events
             (id, event_key, type, actor_id, recipients, payload_json, content_json, channels,
              fingerprint, topic, fanout_status, line_multicast, caller_key, aggregate_key,
              trace_context, caller, cancellation_key, send_at)
         SELECT t.id, t.key, t.type, t.actor,
                ARRAY(SELECT jsonb_array_elements_text(t.recipients)), t.payload, t.content,
                ARRAY(SELECT jsonb_array_elements_text(t.channels)), t.fingerprint, t.topic,
                CASE WHEN t.topic IS NULL THEN 'none' ELSE 'pending' END, t.multicast, t.caller_key,
                t.aggregate, t.trace, t.caller, t.cancellation_key, t.send_at
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::jsonb[],
                     $7::jsonb[], $8::jsonb[], $9::bytea[], $10::text[], $11::bool[], $12::text[],
                     $13::text[], $14::text[], $15::text[], $16::text[], $17::timestamptz[])
              WITH ORDINALITY
              AS t(id, key, type, actor, recipients, payload, content, channels, fingerprint, topic,
                   multicast, caller_key, aggregate, trace, caller, cancellation_key, send_at, n)
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
    .bind(&cancellation_keys)
    .bind(&send_at)
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
    let events = column(skipped, |(e, _)| *e);
    let users = column(skipped, |(_, s)| s.user_id.as_str());
    let channels = column(skipped, |(_, s)| s.channel.as_str());
    let reasons = column(skipped, |(_, s)| s.reason.as_str());
    let decisions = column(skipped, |(_, s)| s.decision.as_str());
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
    /// The delivery this one derives from (`plan.cause` fallback or escalation), if any.
    pub caused_by: Option<Uuid>,
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
    Ok(write_deliveries(db, deliveries, None, 1).await?.0)
}

/// [`insert_deliveries_many`] for a writer that publishes its own messages right after
/// its commit: the outbox row of each delivery due now is written already claimed, due
/// `hold` from now (as [`crate::outbox::claim_due`] leaves the rows it claims), so no
/// relay publishes it meanwhile; if the writer dies before its publish is confirmed, the
/// relay publishes the row once `hold` has passed. Rows due later are written due then,
/// as usual, one a delivery. The held deliveries of one channel share outbox rows,
/// whichever of the statement's events they belong to, up to `per_row` a row (at most one
/// broker message each, [`crate::outbox::OutboxRow::more_delivery_ids`]; 1 = one row a
/// delivery, for version-1 messages): a group commit of many small events writes one row
/// a channel per `per_row` deliveries, not one a delivery. Returns the held rows, oldest first, with each delivery's event in
/// `origins` (trace contexts unset), for [`crate::outbox::delete`] after the broker's
/// confirm or [`crate::outbox::release`] when the publish cannot be made now.
pub async fn insert_deliveries_held(
    db: &mut sqlx::PgConnection,
    deliveries: &[(Uuid, &NewDelivery)],
    hold: std::time::Duration,
    per_row: usize,
) -> Result<Vec<crate::outbox::OutboxRow>> {
    Ok(write_deliveries(db, deliveries, Some(hold), per_row)
        .await?
        .1)
}

/// The one statement of [`insert_deliveries_many`] and [`insert_deliveries_held`]: how
/// many were inserted, and the outbox rows held (none when `hold` is `None`), each naming
/// up to `per_row` deliveries of one channel.
async fn write_deliveries(
    db: &mut sqlx::PgConnection,
    deliveries: &[(Uuid, &NewDelivery)],
    hold: Option<std::time::Duration>,
    per_row: usize,
) -> Result<(u64, Vec<crate::outbox::OutboxRow>)> {
    if deliveries.is_empty() {
        return Ok((0, Vec::new()));
    }
    let events = column(deliveries, |(e, _)| *e);
    let ids = column(deliveries, |(_, d)| d.id);
    let users = column(deliveries, |(_, d)| d.plan.user_id.as_str());
    let channels = column(deliveries, |(_, d)| d.plan.channel.as_str());
    let providers = column(deliveries, |(_, d)| d.plan.provider.as_str());
    let endpoints = column(deliveries, |(_, d)| d.plan.endpoint_id);
    let addresses = column(deliveries, |(_, d)| d.plan.address.as_deref());
    let keys = column(deliveries, |(_, d)| d.plan.idempotency_key.as_str());
    let retry_keys = column(deliveries, |(_, d)| d.retry_key);
    let max_attempts = column(deliveries, |(_, d)| d.max_attempts);
    let deferred = column(deliveries, |(_, d)| d.plan.deferred_until);
    let scheduled = column(deliveries, |(_, d)| d.plan.scheduled_for);
    let decisions = column(deliveries, |(_, d)| d.plan.decision.as_str());
    let throttle = column(deliveries, |(_, d)| d.plan.throttle_at);
    let digests = column(deliveries, |(_, d)| d.plan.digest_key.as_deref());
    let causes = column(deliveries, |(_, d)| d.plan.cause.as_str());
    let caused_by = column(deliveries, |(_, d)| d.caused_by);
    let rows = sqlx::query(
        "WITH d AS (
             INSERT INTO notification_deliveries
                 (id, event_id, user_id, channel, provider, endpoint_id, address, idempotency_key,
                  retry_key, max_attempts, deferred_until, next_attempt_at, decision, throttle_at,
                  digest_key, cause, caused_by)
             SELECT t.id, t.event_id, t.user_id, t.channel, t.provider, t.endpoint_id, t.address,
                    t.key, t.retry_key, t.max_attempts, t.deferred,
                    greatest(now(), t.deferred, t.scheduled), t.decision, t.throttle, t.digest,
                    t.cause, t.caused_by
             FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::uuid[],
                         $7::text[], $8::text[], $9::uuid[], $10::int[], $11::timestamptz[],
                         $12::text[], $13::timestamptz[], $14::text[], $15::text[], $16::uuid[],
                         $19::timestamptz[])
                  AS t(event_id, id, user_id, channel, provider, endpoint_id, address, key,
                       retry_key, max_attempts, deferred, decision, throttle, digest, cause,
                       caused_by, scheduled)
             ON CONFLICT (channel, idempotency_key) DO NOTHING
             RETURNING id, event_id, channel, next_attempt_at,
                       $17::bigint IS NOT NULL AND next_attempt_at <= now() AS held),
         -- Held deliveries share a row per channel and up to $18 of them, in event order;
         -- every other delivery has a row of its own.
         g AS (
             SELECT id, event_id, channel, held, next_attempt_at,
                    CASE WHEN held
                         THEN (row_number() OVER (PARTITION BY held, channel ORDER BY event_id, id) - 1) / $18
                    END AS chunk
             FROM d),
         o AS (
             INSERT INTO outbox (delivery_id, channel, available_at, more_delivery_ids)
             SELECT (array_agg(id ORDER BY event_id, id))[1], channel,
                    CASE WHEN held THEN now() + $17 * interval '1 millisecond'
                         ELSE min(next_attempt_at) END,
                    CASE WHEN count(*) > 1 THEN (array_agg(id ORDER BY event_id, id))[2:] END
             FROM g
             GROUP BY channel, held, chunk, CASE WHEN held THEN NULL ELSE id END
             RETURNING id, delivery_id, more_delivery_ids)
         SELECT o.id, o.delivery_id, o.more_delivery_ids, d.channel, d.held
         FROM o JOIN d ON d.id = o.delivery_id",
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
    .bind(&causes)
    .bind(&caused_by)
    .bind(hold.map(notify_core::retry::millis))
    .bind(i64::try_from(per_row.max(1)).unwrap_or(i64::MAX))
    .bind(&scheduled)
    .fetch_all(&mut *db)
    .await?;
    let event_of: std::collections::HashMap<Uuid, Uuid> = if hold.is_some() {
        deliveries.iter().map(|(e, d)| (d.id, *e)).collect()
    } else {
        Default::default()
    };
    let mut inserted = 0;
    let mut held: Vec<crate::outbox::OutboxRow> = rows
        .into_iter()
        .map(|r| {
            let more: Vec<Uuid> = r
                .get::<Option<Vec<Uuid>>, _>("more_delivery_ids")
                .unwrap_or_default();
            inserted += 1 + more.len() as u64;
            (r, more)
        })
        .filter(|(r, _)| r.get::<bool, _>("held"))
        .map(|(r, more)| {
            let mut row = crate::outbox::OutboxRow {
                id: r.get("id"),
                delivery_id: r.get("delivery_id"),
                more_delivery_ids: more,
                queue: crate::row::parse(&r, "channel")?,
                origins: Vec::new(),
            };
            row.origins = row
                .delivery_ids()
                .map(|id| crate::outbox::Origin {
                    event_id: event_of.get(&id).copied(),
                    trace_context: None,
                })
                .collect();
            Ok(row)
        })
        .collect::<Result<_>>()?;
    held.sort_by_key(|r| r.id);
    Ok((inserted, held))
}
