//! What planning reads and locks inside the transaction that writes the plan: the
//! deliveries that count toward fatigue caps (under per-user advisory locks) and the digest
//! a new event joins, and the events a digest delivery lists when it is sent.

use crate::Result;
use chrono::{DateTime, Utc};
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

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
