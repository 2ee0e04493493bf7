//! Topic fan-out: claiming a topic event whose fan-out is pending, paging its
//! subscribers, and moving its checkpoint.

use crate::Result;
use crate::row::parse_all;
use notify_core::Channel;
use sqlx::Row;
use uuid::Uuid;

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
    /// A scheduled event's due time: its deliveries are planned at it.
    pub send_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The event's W3C `traceparent`, when its request carried or started a trace.
    pub trace_context: Option<String>,
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
         RETURNING e.id, e.type, e.topic, e.channels, e.fanout_cursor, e.line_multicast, e.send_at,
                   e.trace_context",
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
            send_at: r.get("send_at"),
            trace_context: r.get("trace_context"),
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

/// The cancellation fence of a fan-out page: takes the event row `FOR SHARE` until the
/// page's transaction ends (a cancel's `FOR UPDATE` waits for the page, and the page for
/// a cancel that came first) and returns whether the whole event is canceled; then the
/// caller writes nothing and stops. Call it in the page's transaction before it writes.
pub async fn lock_for_page(db: &mut sqlx::PgConnection, event_id: Uuid) -> Result<bool> {
    let canceled: Option<bool> = sqlx::query_scalar(
        "SELECT canceled_at IS NOT NULL OR fanout_status = 'canceled'
         FROM notification_events WHERE id = $1 FOR SHARE",
    )
    .bind(event_id)
    .fetch_optional(&mut *db)
    .await?;
    Ok(canceled.unwrap_or(true))
}

/// Which of `users` were canceled for this event alone (`event_cancellations`): the page
/// writes no delivery for them. Read under [`lock_for_page`]'s lock.
pub async fn canceled_recipients(
    db: &mut sqlx::PgConnection,
    event_id: Uuid,
    users: &[String],
) -> Result<std::collections::HashSet<String>> {
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT user_id FROM event_cancellations WHERE event_id = $1 AND user_id = ANY($2)",
    )
    .bind(event_id)
    .bind(users)
    .fetch_all(&mut *db)
    .await?;
    Ok(rows.into_iter().collect())
}
