//! Clicks and taps on delivered notifications: an inbox action, a LINE postback from a
//! card's button, a push or email link. Each is recorded once against its delivery (a
//! redelivered callback with the same dedup key changes nothing).

use crate::Result;
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

/// Where a click came from (the `source` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClickSource {
    /// The in-app inbox.
    InApp,
    /// A LINE postback (the webhook's `postback` event).
    Line,
    /// A push notification action.
    Push,
    /// An email link.
    Email,
}

impl ClickSource {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ClickSource::InApp => "inapp",
            ClickSource::Line => "line",
            ClickSource::Push => "push",
            ClickSource::Email => "email",
        }
    }
}

/// One click to record.
#[derive(Debug, Clone)]
pub struct NewClick<'a> {
    /// The delivery clicked.
    pub delivery_id: Uuid,
    /// Who clicked.
    pub user_id: &'a str,
    /// The action's id; empty for a tap on the notification itself.
    pub action_id: &'a str,
    /// Where it came from.
    pub source: ClickSource,
    /// A key that makes a redelivered callback harmless (LINE `webhookEventId`); `None`
    /// records every call.
    pub dedup_key: Option<&'a str>,
}

/// A recorded click.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Click {
    /// Who clicked.
    pub user_id: String,
    /// The action's id ('' for the notification itself).
    pub action_id: String,
    /// `inapp`, `line`, `push` or `email`.
    pub source: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// Records `click`. Returns false, writing nothing, when its dedup key was recorded before
/// or the delivery does not exist (a forged or stale callback).
pub async fn record_click(db: impl PgExecutor<'_>, click: &NewClick<'_>) -> Result<bool> {
    let written = sqlx::query(
        "INSERT INTO delivery_clicks (delivery_id, user_id, action_id, source, dedup_key)
         SELECT $1, $2, $3, $4, $5 WHERE EXISTS
             (SELECT 1 FROM notification_deliveries WHERE id = $1)
         ON CONFLICT (dedup_key) DO NOTHING",
    )
    .bind(click.delivery_id)
    .bind(click.user_id)
    .bind(click.action_id)
    .bind(click.source.as_str())
    .bind(click.dedup_key)
    .execute(db)
    .await?;
    Ok(written.rows_affected() == 1)
}

/// Records a LINE postback tap as a click, only when it is one of ours: `delivery_id` is
/// a LINE delivery addressed to `line_user_id` (for a multicast batch, one of its users),
/// and one of its sent attempts carried a postback action with exactly `data` (so the
/// action id is one the card had). `dedup_key` (the webhook event id) makes LINE's
/// redelivery harmless. Returns false, writing nothing, otherwise.
pub async fn record_line_postback(
    db: impl PgExecutor<'_>,
    delivery_id: Uuid,
    action_id: &str,
    data: &str,
    line_user_id: &str,
    dedup_key: &str,
) -> Result<bool> {
    let written = sqlx::query(
        "INSERT INTO delivery_clicks (delivery_id, user_id, action_id, source, dedup_key)
         SELECT d.id, $4, $2, 'line', $5 FROM notification_deliveries d
         WHERE d.id = $1 AND d.channel = 'line'
           AND $4 = ANY(string_to_array(coalesce(d.address, ''), ','))
           AND EXISTS (SELECT 1 FROM delivery_attempts a
                       WHERE a.delivery_id = d.id AND a.outcome = 'sent'
                         AND jsonb_path_exists(a.content_json, '$.** ? (@.type == \"postback\" && @.data == $d)',
                                               jsonb_build_object('d', $3::text)))
         ON CONFLICT (dedup_key) DO NOTHING",
    )
    .bind(delivery_id)
    .bind(action_id)
    .bind(data)
    .bind(line_user_id)
    .bind(dedup_key)
    .execute(db)
    .await?;
    Ok(written.rows_affected() == 1)
}

/// Every click on `delivery_id`, oldest first.
pub async fn clicks_of(db: impl PgExecutor<'_>, delivery_id: Uuid) -> Result<Vec<Click>> {
    Ok(sqlx::query_as(
        "SELECT user_id, action_id, source, at FROM delivery_clicks
         WHERE delivery_id = $1 ORDER BY id",
    )
    .bind(delivery_id)
    .fetch_all(db)
    .await?)
}
