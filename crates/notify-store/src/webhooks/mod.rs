//! Status webhooks (migration 25): endpoints per caller (`endpoints.rs`), the message
//! written with each state change ([`enqueue_for_deliveries`], here), and the delivery of
//! messages by worker-webhook (`messages.rs`: claim with a lease, record fenced by it,
//! sweep of expired leases, disabling a failing endpoint).
//!
//! A message travels through the ordinary outbox: channel [`OUTBOX_CHANNEL`] and
//! `delivery_id` = the message id, so the relay publishes it to `deliveries.webhook`
//! without a second outbox kind.

mod endpoints;
mod messages;
mod ops;

pub use endpoints::*;
pub use messages::*;
pub use ops::*;

use crate::Result;
pub use notify_core::webhook::EventType;
use uuid::Uuid;

/// The statement of [`enqueue_for_deliveries`] (`$1` delivery ids, `$2` event type
/// names), public so a test can `EXPLAIN` its cost with no endpoint registered.
pub const ENQUEUE_SQL: &str = "WITH t AS (
             SELECT * FROM UNNEST($1::uuid[], $2::text[]) AS t(delivery_id, event_type)
             WHERE EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled)),
         m AS (
             INSERT INTO webhook_messages (id, endpoint_id, event_type, payload, delivery_id,
                                           state_version)
             SELECT gen_random_uuid(), w.id, t.event_type,
                    jsonb_build_object(
                        'type', t.event_type,
                        'timestamp', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                        'data', jsonb_build_object(
                            'event_id', e.id, 'event_key', coalesce(e.caller_key, e.event_key),
                            'delivery_id', d.id, 'user_id', d.user_id, 'channel', d.channel,
                            'status', d.status, 'state_version', d.state_version,
                            'error', d.last_error, 'attempts', d.attempts,
                            'sent_at', to_char(d.sent_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))),
                    d.id, d.state_version
             FROM t JOIN notification_deliveries d ON d.id = t.delivery_id
                    JOIN notification_events e ON e.id = d.event_id
                    JOIN webhook_endpoints w ON w.caller = e.caller AND w.enabled
                         AND (cardinality(w.event_types) = 0 OR t.event_type = ANY(w.event_types))
             RETURNING id)
         INSERT INTO outbox (delivery_id, channel) SELECT id, 'webhook' FROM m";

/// The outbox `channel` (and routing key) of webhook messages.
pub const OUTBOX_CHANNEL: &str = crate::outbox::OutboxQueue::Webhooks.as_str();

/// Writes one webhook message (and its outbox row) per enabled endpoint of the
/// delivery's caller whose filter takes the event type, for each `(delivery, type)`, with
/// the payload built from the delivery as it is now in this transaction:
/// `{type, timestamp, data: {event_id, event_key, delivery_id, user_id, channel, status,
/// state_version, error, attempts, sent_at}}`. Call it inside the transaction that made the
/// change, after the change: no change without its message, no message without its change.
///
/// One statement. When no caller has an enabled endpoint it costs one probe of the empty
/// partial index `webhook_endpoints_caller` (an uncorrelated `EXISTS`, evaluated once) and
/// inserts nothing; the outbox trigger then does not wake the relay. Returns the messages
/// written.
pub async fn enqueue_for_deliveries(
    conn: &mut sqlx::PgConnection,
    items: &[(Uuid, EventType)],
) -> Result<u64> {
    if items.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = items.iter().map(|(id, _)| *id).collect();
    let types: Vec<&str> = items.iter().map(|(_, t)| t.as_str()).collect();
    let done = sqlx::query(ENQUEUE_SQL)
        .bind(&ids)
        .bind(&types)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

/// [`enqueue_for_deliveries`] for deliveries that just reached the stored status of each
/// pair ([`EventType::of_delivery_status`]; `sending` is left out).
pub async fn enqueue_for_statuses(
    conn: &mut sqlx::PgConnection,
    items: &[(Uuid, notify_core::DeliveryStatus)],
) -> Result<u64> {
    let typed: Vec<(Uuid, EventType)> = items
        .iter()
        .filter_map(|(id, s)| EventType::of_delivery_status(*s).map(|t| (*id, t)))
        .collect();
    enqueue_for_deliveries(conn, &typed).await
}
