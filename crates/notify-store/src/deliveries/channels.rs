//! Per-channel state: pauses (a spent provider quota holds the whole channel) and the
//! queue gauges sampled for the metrics.

use crate::Result;
use crate::row::parse_text;
use chrono::{DateTime, Utc};
use notify_core::Channel;
use sqlx::{PgPool, Row};
use std::time::Duration;

/// When `channel` is paused, until when (database clock).
pub async fn paused_until(db: &PgPool, channel: Channel) -> Result<Option<DateTime<Utc>>> {
    Ok(sqlx::query_scalar(
        "SELECT paused_until FROM channel_pauses WHERE channel = $1 AND paused_until > now()",
    )
    .bind(channel.as_str())
    .fetch_optional(db)
    .await?)
}

/// Pauses `channel` for `after` from now (a longer pause already in place stays).
pub async fn pause_channel(
    db: impl sqlx::PgExecutor<'_>,
    channel: Channel,
    after: Duration,
    reason: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO channel_pauses (channel, paused_until, reason)
         VALUES ($1, now() + $2 * interval '1 millisecond', $3)
         ON CONFLICT (channel) DO UPDATE
         SET paused_until = greatest(channel_pauses.paused_until, EXCLUDED.paused_until),
             reason = EXCLUDED.reason, paused_at = now()",
    )
    .bind(channel.as_str())
    .bind(notify_core::retry::millis(after))
    .bind(reason)
    .execute(db)
    .await?;
    Ok(())
}

/// Queue gauges of one channel (see [`gauges`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelGauges {
    /// The channel.
    pub channel: Channel,
    /// Deliveries in `pending`, due or not.
    pub pending: i64,
    /// Of those, not due yet (`next_attempt_at` after now): scheduled sends, escalations,
    /// deferrals and retries waiting for their backoff.
    pub scheduled: i64,
    /// Seconds since the oldest due pending delivery became due (0 if none).
    pub oldest_due_s: f64,
    /// Whether the channel is paused now.
    pub paused: bool,
}

/// Gauges sampled for the metrics: see [`gauges`].
#[derive(Debug, Clone, PartialEq)]
pub struct Gauges {
    /// Outbox rows waiting to be published.
    pub outbox_rows: i64,
    /// Seconds since the oldest due outbox row became due (0 if none).
    pub outbox_oldest_s: f64,
    /// Per channel with pending deliveries or a pause; channels absent have none.
    pub channels: Vec<ChannelGauges>,
}

/// Samples outbox size and age, pending deliveries and the oldest due one per channel,
/// and paused channels, in one statement (database clock). One pass over the partial
/// index on pending deliveries for every channel and figure (not one per channel and
/// figure: twelve passes took 3 s at a 1,000,000-delivery backlog), so its cost follows
/// the backlog, not the table.
pub async fn gauges(db: &PgPool) -> Result<Gauges> {
    let row = sqlx::query(
        "SELECT (SELECT count(*) FROM outbox) AS outbox_rows,
                (SELECT coalesce(extract(epoch FROM now() - min(available_at)), 0)::float8
                   FROM outbox WHERE available_at <= now()) AS outbox_oldest_s,
                (SELECT coalesce(jsonb_agg(jsonb_build_object(
                            'channel', c.channel, 'pending_n', c.pending, 'oldest', c.oldest,
                            'scheduled', c.scheduled, 'paused', c.paused)), '[]'::jsonb)
                   FROM (SELECT ch.channel, coalesce(b.pending, 0) AS pending,
                                coalesce(b.scheduled, 0) AS scheduled,
                                coalesce(extract(epoch FROM now() - b.oldest_at), 0)::float8 AS oldest,
                                EXISTS (SELECT 1 FROM channel_pauses p
                                         WHERE p.channel = ch.channel AND p.paused_until > now()) AS paused
                           FROM unnest(ARRAY['inapp', 'email', 'push', 'line']) AS ch(channel)
                           LEFT JOIN (SELECT d.channel, count(*) AS pending,
                                             count(*) FILTER (WHERE d.next_attempt_at > now()) AS scheduled,
                                             min(d.next_attempt_at) FILTER (WHERE d.next_attempt_at <= now()) AS oldest_at
                                        FROM notification_deliveries d WHERE d.status = 'pending'
                                       GROUP BY d.channel) b ON b.channel = ch.channel) c)
                   AS channels",
    )
    .fetch_one(db)
    .await?;
    let channels: serde_json::Value = row.get("channels");
    let channels = channels
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            Ok(ChannelGauges {
                channel: parse_text("channel", c["channel"].as_str().unwrap_or_default())?,
                pending: c["pending_n"].as_i64().unwrap_or(0),
                scheduled: c["scheduled"].as_i64().unwrap_or(0),
                oldest_due_s: c["oldest"].as_f64().unwrap_or(0.0).max(0.0),
                paused: c["paused"].as_bool().unwrap_or(false),
            })
        })
        .collect::<Result<_>>()?;
    Ok(Gauges {
        outbox_rows: row.get("outbox_rows"),
        outbox_oldest_s: row.get::<f64, _>("outbox_oldest_s").max(0.0),
        channels,
    })
}
