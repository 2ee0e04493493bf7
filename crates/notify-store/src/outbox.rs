//! The transactional outbox: rows written with deliveries, published by the relay and
//! deleted only after the broker confirmed them.

use crate::Result;
use crate::row::parse;
use notify_core::Channel;
use sqlx::{PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

/// One message waiting to be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// Outbox row id.
    pub id: i64,
    /// The delivery the message points at (the first, when it names several).
    pub delivery_id: Uuid,
    /// The deliveries the row names after `delivery_id`, of the same channel (and of one
    /// or several events written in one transaction): the relay publishes them in
    /// version-2 batch messages, with other rows of the channel when the row fits whole,
    /// cut at the message limit otherwise. Empty for a row naming one delivery.
    pub more_delivery_ids: Vec<Uuid>,
    /// Where the message goes (stored as `outbox.channel`, its routing key).
    pub queue: OutboxQueue,
    /// Where each delivery the row names comes from, in [`Self::delivery_ids`] order, for
    /// the relay's producer spans; shorter (or empty) when not known. Not stored in the
    /// table: the writer that hands rows over fills it, and [`read_origins`] reads it
    /// back from the deliveries and their events for rows [`claim_due`] claims.
    pub origins: Vec<Origin>,
}

/// The queue an outbox row's message is published to: one channel's deliveries, or the
/// status webhooks. Stored in `outbox.channel` as its routing key (a CHECK constraint lists
/// the names); read back with [`str::parse`], which refuses any other name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxQueue {
    /// The deliveries of a channel (`deliveries.<channel>`).
    Deliveries(Channel),
    /// The status webhooks (`deliveries.webhook`, [`crate::webhooks::OUTBOX_CHANNEL`]).
    Webhooks,
}

impl OutboxQueue {
    /// The routing key, as stored in `outbox.channel`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OutboxQueue::Deliveries(channel) => channel.as_str(),
            OutboxQueue::Webhooks => "webhook",
        }
    }

    /// Whether several of its deliveries may travel in one (version-2) message: a status
    /// webhook goes one a message.
    pub const fn batches(self) -> bool {
        matches!(self, OutboxQueue::Deliveries(_))
    }
}

impl std::fmt::Display for OutboxQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for OutboxQueue {
    type Err = String;

    /// A channel's name, or `webhook`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == OutboxQueue::Webhooks.as_str() {
            return Ok(OutboxQueue::Webhooks);
        }
        s.parse::<Channel>()
            .map(OutboxQueue::Deliveries)
            .map_err(|_| format!("{s:?} is not an outbox queue (a channel or `webhook`)"))
    }
}

/// The event a delivery belongs to, and that event's trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// The delivery's event; `None` when the delivery is gone (erased, or deleted by
    /// retention) or not known.
    pub event_id: Option<Uuid>,
    /// The event's W3C `traceparent`, when its request carried or started a trace.
    pub trace_context: Option<std::sync::Arc<str>>,
}

impl OutboxRow {
    /// The deliveries the row's message names, `delivery_id` first.
    pub fn delivery_ids(&self) -> impl Iterator<Item = Uuid> + '_ {
        std::iter::once(self.delivery_id).chain(self.more_delivery_ids.iter().copied())
    }

    /// How many deliveries the row's message names (at least 1).
    pub fn deliveries(&self) -> usize {
        1 + self.more_delivery_ids.len()
    }

    /// Where the `i`-th delivery of [`Self::delivery_ids`] comes from, when known.
    pub fn origin(&self, i: usize) -> Option<&Origin> {
        self.origins.get(i)
    }
}

/// Claims due rows, oldest first, for `hold`, naming up to `limit` deliveries in all (at
/// least one row, however many it names; a row that would go past `limit` waits for the
/// next claim): their `available_at` moves forward so other
/// relays skip them, and a relay that dies mid-publish leaves them to be published again
/// when `hold` runs out. `FOR UPDATE SKIP LOCKED` lets several relays claim disjoint
/// batches at once. [`OutboxRow::origins`] is left empty: [`read_origins`] fills it. No
/// transaction stays open after this returns.
pub async fn claim_due(db: &PgPool, limit: i64, hold: Duration) -> Result<Vec<OutboxRow>> {
    let rows = sqlx::query(
        // The running count of deliveries bounds the batch, not the count of rows: a row
        // written by a group commit or a fan-out page names up to 500.
        // Rows locked but past the limit are left as they are (and unlocked at commit).
        "WITH locked AS (
             SELECT id, available_at, 1 + coalesce(cardinality(more_delivery_ids), 0) AS n
             FROM outbox WHERE available_at <= now()
             ORDER BY available_at, id LIMIT $1 FOR UPDATE SKIP LOCKED),
         picked AS (
             SELECT id FROM (SELECT id, n, sum(n) OVER (ORDER BY available_at, id) - n AS before
                             FROM locked) w
             WHERE before = 0 OR before + n <= $1)
         UPDATE outbox o SET available_at = now() + $2 * interval '1 millisecond'
         FROM picked WHERE o.id = picked.id
         RETURNING o.id, o.delivery_id, o.more_delivery_ids, o.channel",
    )
    .bind(limit.max(1))
    .bind(notify_core::retry::millis(hold))
    .fetch_all(db)
    .await?;
    let mut out: Vec<OutboxRow> = rows
        .into_iter()
        .map(|r| {
            Ok(OutboxRow {
                id: r.get("id"),
                delivery_id: r.get("delivery_id"),
                more_delivery_ids: r
                    .get::<Option<Vec<Uuid>>, _>("more_delivery_ids")
                    .unwrap_or_default(),
                queue: parse(&r, "channel")?,
                origins: Vec::new(),
            })
        })
        .collect::<Result<_>>()?;
    out.sort_by_key(|r| r.id);
    Ok(out)
}

/// Fills [`OutboxRow::origins`] of claimed rows from the deliveries they name and their
/// events, in one statement; one trace context is shared by all the deliveries of its
/// event. A delivery gone since gets an empty origin. On an error the rows are unchanged
/// (they can still be published, without their traces).
pub async fn read_origins(db: &PgPool, rows: &mut [OutboxRow]) -> Result<()> {
    let ids: Vec<Uuid> = rows.iter().flat_map(OutboxRow::delivery_ids).collect();
    if ids.is_empty() {
        return Ok(());
    }
    let found: Vec<(Uuid, Uuid, Option<String>)> = sqlx::query_as(
        "SELECT d.id, d.event_id, e.trace_context
         FROM unnest($1::uuid[]) AS u(id)
         JOIN notification_deliveries d ON d.id = u.id
         JOIN notification_events e ON e.id = d.event_id",
    )
    .bind(&ids)
    .fetch_all(db)
    .await?;
    let mut traces: std::collections::HashMap<Uuid, Option<std::sync::Arc<str>>> =
        std::collections::HashMap::new();
    let of: std::collections::HashMap<Uuid, Origin> = found
        .into_iter()
        .map(|(id, event_id, trace)| {
            let trace_context = traces
                .entry(event_id)
                .or_insert_with(|| trace.map(Into::into))
                .clone();
            (
                id,
                Origin {
                    event_id: Some(event_id),
                    trace_context,
                },
            )
        })
        .collect();
    for row in rows {
        row.origins = row
            .delivery_ids()
            .map(|id| of.get(&id).cloned().unwrap_or_default())
            .collect();
    }
    Ok(())
}

/// How long until the earliest outbox row not due yet becomes due (a retry, a quiet-hours
/// deferral, a fatigue slot, a digest's close), by the database clock; `None` when the
/// outbox holds nothing for later. One probe of the `(available_at, id)` index.
pub async fn next_due_in(db: &PgPool) -> Result<Option<Duration>> {
    let ms: Option<f64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM min(available_at) - now()) * 1000)::float8 FROM outbox
         WHERE available_at > now()",
    )
    .fetch_one(db)
    .await?;
    Ok(ms.map(|ms| Duration::from_millis(ms.max(0.0) as u64)))
}

/// Deletes rows whose messages the broker confirmed.
pub async fn delete(db: &PgPool, ids: &[i64]) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query("DELETE FROM outbox WHERE id = ANY($1)")
        .bind(ids)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}

/// Makes held rows ([`crate::events::insert_deliveries_held`]) due now, for the relay's
/// next claim: their writer could not hand them to its publisher (it is not connected,
/// or too far behind, or stopping). Rows already published and deleted are not touched.
pub async fn release(db: &PgPool, ids: &[i64]) -> Result<u64> {
    if ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query("UPDATE outbox SET available_at = now() WHERE id = ANY($1)")
        .bind(ids)
        .execute(db)
        .await?;
    Ok(done.rows_affected())
}

/// Keeps rows whose publish failed (nack, unroutable, channel error), counts the failure,
/// records the error and makes them due again after `retry_in`.
pub async fn publish_failed(
    db: &PgPool,
    ids: &[i64],
    error: &str,
    retry_in: Duration,
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE outbox SET publish_failures = publish_failures + 1, last_error = $2,
             available_at = now() + $3 * interval '1 millisecond'
         WHERE id = ANY($1)",
    )
    .bind(ids)
    .bind(error)
    .bind(notify_core::retry::millis(retry_in))
    .execute(db)
    .await?;
    Ok(())
}

/// [`crate::deliveries::relay_behind`]'s condition on `$1` (milliseconds) and `$2` (rows):
/// one bounded range scan of `outbox_available`, oldest first. The stale sweeps of
/// deliveries and of webhook messages wait while it holds.
pub(crate) const RELAY_BEHIND: &str = "EXISTS (SELECT 1 FROM outbox
                                    WHERE available_at < now() - $1 * interval '1 millisecond'
                                    ORDER BY available_at, id OFFSET $2 LIMIT 1)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queue_reads_back_as_itself_and_other_names_are_refused() {
        let all = Channel::ALL
            .iter()
            .map(|&c| OutboxQueue::Deliveries(c))
            .chain([OutboxQueue::Webhooks]);
        for q in all {
            assert_eq!(q.as_str().parse::<OutboxQueue>(), Ok(q));
            assert_eq!(q.batches(), q != OutboxQueue::Webhooks);
        }
        assert_eq!("webhook".parse::<OutboxQueue>(), Ok(OutboxQueue::Webhooks));
        assert!("sms".parse::<OutboxQueue>().is_err());
        assert!("Webhook".parse::<OutboxQueue>().is_err());
    }
}
