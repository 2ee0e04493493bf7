//! Derived deliveries created after planning: the fallback on the next channel of the
//! type's `fallback_channels` when a delivery ends `failed` (worker record, the sweeper's
//! last `worker_lost`, the claim's spent attempt budget) or is skipped at due time for an
//! unreachable reason. Always called inside the transaction that ends the delivery, so the
//! fallback exists exactly when the failure does; its key `<event>/<user>/<channel>` and
//! the insert's `ON CONFLICT DO NOTHING` keep it single across crashes, replays and a
//! channel that also had a planned delivery.

use crate::Result;
use crate::events::{self, NewDelivery};
use notify_core::Channel;
use notify_core::plan::Cause;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

/// A fallback delivery just created (for the metrics, counted after the commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackMade {
    /// The new delivery's id.
    pub id: Uuid,
    /// The channel that failed.
    pub from: Channel,
    /// The channel of the new delivery.
    pub to: Channel,
}

/// [`fallback_after_made`]'s id alone.
///
/// # Errors
/// The database failed, or a stored name (channel) is unreadable.
pub async fn fallback_after(
    conn: &mut PgConnection,
    delivery_id: Uuid,
    cause: &str,
) -> Result<Option<Uuid>> {
    Ok(fallback_after_made(conn, delivery_id, cause)
        .await?
        .first()
        .map(|m| m.id))
}

/// Creates the fallback of delivery `delivery_id`, which this transaction just ended
/// (`cause`: `failed`, `worker_lost`, `attempts_spent`, or the skip reason found at due
/// time): the next channel after its own in its type's `fallback_channels` that can reach
/// the recipient (facts read now), `pending` with an outbox row due now (or at the end of
/// the quiet hours), cause `fallback`, `caused_by` the delivery, its trail starting
/// "fallback: LINE delivery <id> failed: <last_error>; fallback to email". Channels in
/// between that cannot reach the user get skip rows. Nothing for a canceled event or
/// recipient, a channel not in the list, the list's last channel, an opted-out next
/// channel, or a next channel that already has a delivery (same key). A failed LINE
/// multicast batch gives each of its users (found by LINE user id) their own fallback.
/// Returns what was created.
///
/// # Errors
/// The database failed, or a stored name (channel) is unreadable.
pub async fn fallback_after_made(
    conn: &mut PgConnection,
    delivery_id: Uuid,
    cause: &str,
) -> Result<Vec<FallbackMade>> {
    let Some(row) = sqlx::query(
        "SELECT d.event_id, d.user_id, d.channel, d.provider, d.address, d.last_error,
                d.max_attempts, e.type, coalesce(t.critical, false) AS critical,
                coalesce(t.fallback_channels, '{}') AS fallback_channels, now() AS now
         FROM notification_deliveries d
              JOIN notification_events e ON e.id = d.event_id
              LEFT JOIN notification_types t ON t.key = e.type
         WHERE d.id = $1",
    )
    .bind(delivery_id)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(Vec::new());
    };
    let list: Vec<Channel> = row
        .get::<Vec<String>, _>("fallback_channels")
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect();
    let from: Channel = crate::row::parse(&row, "channel")?;
    if list
        .iter()
        .position(|&c| c == from)
        .is_none_or(|i| i + 1 >= list.len())
    {
        return Ok(Vec::new());
    }
    let event_id: Uuid = row.get("event_id");
    // A LINE multicast batch stands for every user whose LINE id it carries: each gets
    // their own fallback (the batch's `user_id` names no recipient).
    let users: Vec<String> = if row.get::<String, _>("provider") == "line_multicast" {
        sqlx::query_scalar(
            "SELECT user_id FROM recipients
             WHERE line_user_id = ANY(string_to_array($1, ',')) ORDER BY user_id",
        )
        .bind(row.get::<Option<String>, _>("address").unwrap_or_default())
        .fetch_all(&mut *conn)
        .await?
    } else {
        vec![row.get("user_id")]
    };
    let type_key: String = row.get("type");
    let label = if from == Channel::Line {
        "LINE".to_string()
    } else {
        from.to_string()
    };
    let last_error: Option<String> = row.get("last_error");
    use notify_core::FailReason;
    let what = match cause.parse() {
        Ok(FailReason::AttemptFailed | FailReason::WorkerLost | FailReason::AttemptsSpent) => {
            format!("failed: {}", last_error.as_deref().unwrap_or(cause))
        }
        _ => format!("skipped when due: {cause}"),
    };
    let max_attempts: i32 = row.get("max_attempts");
    let mut made = Vec::new();
    for user_id in users {
        if crate::cancel::is_canceled(conn, event_id, &user_id).await? {
            continue;
        }
        let facts =
            crate::catalog::load_recipient_facts(conn, &type_key, std::slice::from_ref(&user_id))
                .await?
                .pop()
                .unwrap_or_default();
        let (planned, skipped) = notify_core::plan::fallback_after(
            event_id,
            row.get("critical"),
            &list,
            from,
            &format!("{label} delivery {delivery_id} {what}"),
            &facts,
            row.get("now"),
        );
        events::insert_skips(&mut *conn, event_id, &skipped).await?;
        let Some(first) = planned.first() else {
            continue;
        };
        let to = first.channel;
        let news: Vec<NewDelivery> = planned
            .into_iter()
            .map(|p| NewDelivery {
                id: Uuid::now_v7(),
                retry_key: matches!(p.provider, notify_core::Provider::Line).then(Uuid::new_v4),
                caused_by: Some(delivery_id),
                plan: notify_core::PlannedDelivery {
                    cause: Cause::Fallback,
                    ..p
                },
                max_attempts,
            })
            .collect();
        let first_id = news[0].id;
        if events::insert_deliveries(&mut *conn, event_id, &news).await? > 0 {
            made.push(FallbackMade {
                id: first_id,
                from,
                to,
            });
        }
    }
    Ok(made)
}

/// What [`withdraw_fallbacks`] did to the fallbacks of a failure that turned out not to be
/// one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Withdrawn {
    /// Fallbacks (and their own fallbacks) that were still `pending`: now `canceled`,
    /// their outbox rows gone, nothing sent.
    pub canceled: Vec<Uuid>,
    /// Fallbacks already past `pending` (in a provider call, sent, failed): the user may
    /// get both; they are left as they are, for the caller to log.
    pub past_pending: Vec<Uuid>,
}

/// Takes back the fallbacks of `delivery_id` (of event `event_id`) because the failure
/// that caused them is no longer true: a late success recorded the delivery `sent` after
/// the sweeper (or the claim's spent budget) had failed it. Every fallback derived from it,
/// and from those, still `pending` becomes `canceled` ("canceled: delivery <id> was sent
/// after all"), with its own outbox rows deleted (a row naming other deliveries too stays:
/// its claim skips the canceled one) and its `delivery.cancelled` webhook message. Call it
/// in the transaction that records the success, so the fallback exists exactly when the
/// failure does.
///
/// # Errors
/// The database failed.
pub async fn withdraw_fallbacks(
    conn: &mut PgConnection,
    event_id: Uuid,
    delivery_id: Uuid,
) -> Result<Withdrawn> {
    // Within the event (its index): `caused_by` has none, and the path is rare.
    let rows: Vec<(Uuid, bool)> = sqlx::query_as(
        "WITH RECURSIVE chain AS (
             SELECT d.id, d.status FROM notification_deliveries d
             WHERE d.event_id = $1 AND d.caused_by = $2 AND d.cause = 'fallback'
             UNION
             SELECT d.id, d.status FROM notification_deliveries d JOIN chain ON d.caused_by = chain.id
             WHERE d.event_id = $1 AND d.cause = 'fallback'),
         c AS (
             UPDATE notification_deliveries d
             SET status = 'canceled', lease_token = NULL, lease_expires_at = NULL,
                 last_error = $3, updated_at = now(), state_version = d.state_version + 1,
                 decision = CASE WHEN d.decision = '' THEN $3 ELSE d.decision || E'\\n' || $3 END
             FROM chain WHERE d.id = chain.id AND d.status = 'pending'
             RETURNING d.id),
         gone AS (
             DELETE FROM outbox o USING c
             WHERE o.delivery_id = c.id
               AND (o.more_delivery_ids IS NULL
                    OR NOT EXISTS (SELECT 1 FROM unnest(o.more_delivery_ids) AS m(id)
                                   WHERE NOT m.id IN (SELECT id FROM c))))
         SELECT chain.id, chain.id IN (SELECT id FROM c) FROM chain",
    )
    .bind(event_id)
    .bind(delivery_id)
    .bind(format!(
        "canceled: delivery {delivery_id}, whose failure caused this fallback, was sent after all (its provider accepted the call after its lease was given up)"
    ))
    .fetch_all(&mut *conn)
    .await?;
    let mut out = Withdrawn::default();
    for (id, canceled) in rows {
        if canceled {
            out.canceled.push(id);
        } else {
            out.past_pending.push(id);
        }
    }
    let typed: Vec<(Uuid, crate::webhooks::EventType)> = out
        .canceled
        .iter()
        .map(|id| (*id, crate::webhooks::EventType::DeliveryCancelled))
        .collect();
    crate::webhooks::enqueue_for_deliveries(conn, &typed).await?;
    Ok(out)
}
