//! Recipients as callers and users maintain them: contact data, push endpoints,
//! preferences and quiet hours, and what providers report about them (LINE follows,
//! undeliverable email).

use crate::{Result, StoreError};
use notify_core::{Channel, EndpointStatus};
use sqlx::{PgExecutor, Row};
use uuid::Uuid;

/// A recipient's contact data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recipient {
    /// User id.
    pub user_id: String,
    /// Name for the email To header.
    pub display_name: String,
    /// Email address.
    pub email: Option<String>,
    /// LINE user id.
    pub line_user_id: Option<String>,
    /// BCP 47 tag.
    pub locale: String,
    /// IANA time zone.
    pub timezone: String,
}

/// Creates or replaces a recipient. Returns true when it was created.
pub async fn upsert_recipient(db: impl PgExecutor<'_>, r: &Recipient) -> Result<bool> {
    let row = sqlx::query(
        "INSERT INTO recipients (user_id, display_name, email, line_user_id, locale, timezone)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (user_id) DO UPDATE SET display_name = EXCLUDED.display_name,
             email = EXCLUDED.email, line_user_id = EXCLUDED.line_user_id,
             email_undeliverable_at = CASE WHEN recipients.email IS DISTINCT FROM EXCLUDED.email
                 THEN NULL ELSE recipients.email_undeliverable_at END,
             email_undeliverable_reason = CASE WHEN recipients.email IS DISTINCT FROM EXCLUDED.email
                 THEN NULL ELSE recipients.email_undeliverable_reason END,
             locale = EXCLUDED.locale, timezone = EXCLUDED.timezone, updated_at = now()
         RETURNING (xmax = 0) AS created",
    )
    .bind(&r.user_id)
    .bind(&r.display_name)
    .bind(&r.email)
    .bind(&r.line_user_id)
    .bind(&r.locale)
    .bind(&r.timezone)
    .fetch_one(db)
    .await?;
    Ok(row.get("created"))
}

/// Registers a push endpoint; an existing (platform, token) is re-activated and moved to
/// `user_id`, keeping its id. Fails with [`StoreError::NotFound`] for an unknown user.
pub async fn register_endpoint(
    db: impl PgExecutor<'_>,
    user_id: &str,
    platform: &str,
    token: &str,
    subscription: Option<&serde_json::Value>,
) -> Result<Uuid> {
    let row = sqlx::query(
        "INSERT INTO notification_endpoints (id, user_id, platform, token, subscription_json)
         SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM recipients WHERE user_id = $2)
         ON CONFLICT (platform, token) DO UPDATE SET user_id = EXCLUDED.user_id,
             subscription_json = EXCLUDED.subscription_json, status = 'active',
             revoked_reason = NULL, revoked_at = NULL, registered_at = now(), last_seen_at = now()
         RETURNING id",
    )
    .bind(Uuid::new_v4())
    .bind(user_id)
    .bind(platform)
    .bind(token)
    .bind(subscription)
    .fetch_optional(db)
    .await?;
    row.map(|r| r.get("id"))
        .ok_or_else(|| StoreError::NotFound(format!("recipient {user_id:?}")))
}

/// Revokes an endpoint with `reason`. Returns false when it was already revoked;
/// [`StoreError::NotFound`] when it does not exist.
pub async fn revoke_endpoint(db: &sqlx::PgPool, id: Uuid, reason: &str) -> Result<bool> {
    let row = sqlx::query(
        "WITH target AS (SELECT id, status FROM notification_endpoints WHERE id = $1),
              upd AS (UPDATE notification_endpoints e SET status = $3, revoked_reason = $2,
                          revoked_at = now()
                      FROM target WHERE e.id = target.id AND target.status = $4 RETURNING e.id)
         SELECT (SELECT count(*) FROM target) AS found, (SELECT count(*) FROM upd) AS changed",
    )
    .bind(id)
    .bind(reason)
    .bind(EndpointStatus::Revoked.as_str())
    .bind(EndpointStatus::Active.as_str())
    .fetch_one(db)
    .await?;
    if row.get::<i64, _>("found") == 0 {
        return Err(StoreError::NotFound(format!("endpoint {id}")));
    }
    Ok(row.get::<i64, _>("changed") > 0)
}

/// Marks an endpoint revoked because the provider said the token is gone, unless it was
/// registered again after `not_after` (the moment the attempt started). Returns whether
/// it was revoked.
pub async fn deactivate_endpoint(
    db: impl PgExecutor<'_>,
    id: Uuid,
    reason: &str,
    not_after: chrono::DateTime<chrono::Utc>,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE notification_endpoints SET status = 'revoked', revoked_reason = $2, revoked_at = now()
         WHERE id = $1 AND status = 'active' AND registered_at <= $3",
    )
    .bind(id)
    .bind(reason)
    .bind(not_after)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Sets one preference (type `*` = channel-wide).
pub async fn set_preference(
    db: impl PgExecutor<'_>,
    user_id: &str,
    type_key: &str,
    channel: Option<Channel>,
    enabled: bool,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO notification_preferences (user_id, type, channel, enabled) VALUES ($1, $2, $3, $4)
         ON CONFLICT (user_id, type, channel) DO UPDATE SET enabled = EXCLUDED.enabled, updated_at = now()",
    )
    .bind(user_id)
    .bind(type_key)
    .bind(channel.map_or("*", |c| c.as_str()))
    .bind(enabled)
    .execute(db)
    .await?;
    Ok(())
}

/// Records a LINE `follow` (`following = true`) or `unfollow` webhook event for
/// `line_user_id` at `at` (the event's own timestamp). An event older than the one already
/// recorded changes nothing, so redelivered or out-of-order webhooks are harmless.
/// Returns whether the state changed.
pub async fn record_line_follow(
    db: impl PgExecutor<'_>,
    line_user_id: &str,
    following: bool,
    at: chrono::DateTime<chrono::Utc>,
    webhook_event_id: &str,
) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO line_followers (line_user_id, following, changed_at, webhook_event_id)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (line_user_id) DO UPDATE SET following = EXCLUDED.following,
             changed_at = EXCLUDED.changed_at, webhook_event_id = EXCLUDED.webhook_event_id,
             updated_at = now()
         WHERE line_followers.changed_at < EXCLUDED.changed_at",
    )
    .bind(line_user_id)
    .bind(following)
    .bind(at)
    .bind(webhook_event_id)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Marks `user_id`'s email `address` undeliverable (the receiving server said the mailbox
/// does not exist) unless the address changed since `not_after` (the attempt's start), so a
/// late bounce never marks a newer address. Returns whether it marked.
pub async fn mark_email_undeliverable(
    db: impl PgExecutor<'_>,
    user_id: &str,
    address: &str,
    reason: &str,
    not_after: chrono::DateTime<chrono::Utc>,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE recipients SET email_undeliverable_at = now(), email_undeliverable_reason = $3
         WHERE user_id = $1 AND email = $2 AND email_undeliverable_at IS NULL
           AND updated_at <= $4",
    )
    .bind(user_id)
    .bind(address)
    .bind(reason)
    .bind(not_after)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Replaces `user_id`'s quiet hours. Fails with [`StoreError::NotFound`] for an unknown
/// user.
pub async fn set_quiet_hours(
    db: impl PgExecutor<'_>,
    user_id: &str,
    windows: &[notify_core::quiet::QuietWindow],
) -> Result<()> {
    let json = (!windows.is_empty()).then(|| serde_json::json!(windows));
    let done = sqlx::query(
        "UPDATE recipients SET quiet_hours_json = $2, updated_at = now() WHERE user_id = $1",
    )
    .bind(user_id)
    .bind(json)
    .execute(db)
    .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("recipient {user_id:?}")));
    }
    Ok(())
}

/// What a user has set: preferences, quiet hours, time zone.
#[derive(Debug, Clone)]
pub struct UserPreferences {
    /// (type or `*`, channel or `*`, enabled), by type then channel.
    pub preferences: Vec<(String, String, bool)>,
    /// Quiet hours.
    pub quiet_hours: Vec<notify_core::quiet::QuietWindow>,
    /// IANA time zone.
    pub timezone: String,
}

/// A user's preferences, quiet hours and time zone; `None` for an unknown user.
pub async fn get_preferences(db: &sqlx::PgPool, user_id: &str) -> Result<Option<UserPreferences>> {
    let Some((quiet, timezone)): Option<(Option<serde_json::Value>, String)> =
        sqlx::query_as("SELECT quiet_hours_json, timezone FROM recipients WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(db)
            .await?
    else {
        return Ok(None);
    };
    let prefs: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT type, channel, enabled FROM notification_preferences WHERE user_id = $1
         ORDER BY type, channel",
    )
    .bind(user_id)
    .fetch_all(db)
    .await?;
    let quiet = quiet
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    Ok(Some(UserPreferences {
        preferences: prefs,
        quiet_hours: quiet,
        timezone,
    }))
}

/// A push endpoint as `GetRecipient` shows it: the token masked (SQL `mask_token`: the
/// first 4 and last 4 characters kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskedEndpoint {
    /// Endpoint id.
    pub id: Uuid,
    /// `fcm`, `apns` or `webpush`.
    pub platform: String,
    /// The token (the push service URL for Web Push), masked.
    pub token_masked: String,
    /// `active` or `revoked`.
    pub status: String,
    /// Why it was revoked.
    pub revoked_reason: Option<String>,
    /// When it was (last) registered.
    pub registered_at: chrono::DateTime<chrono::Utc>,
}

/// A recipient's row as `GetRecipient` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipientView {
    /// Contact data.
    pub recipient: Recipient,
    /// Set by a hard bounce (cleared when the address changes).
    pub email_undeliverable_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Created.
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// Every endpoint, revoked ones included, oldest first.
    pub endpoints: Vec<MaskedEndpoint>,
}

/// The recipient `user_id` with its endpoints (tokens masked); `None` when there is no
/// recipients row.
pub async fn get_recipient(db: &sqlx::PgPool, user_id: &str) -> Result<Option<RecipientView>> {
    let Some(r) = sqlx::query(
        "SELECT user_id, display_name, email, line_user_id, locale, timezone,
                email_undeliverable_at, created_at, updated_at
         FROM recipients WHERE user_id = $1",
    )
    .bind(user_id)
    .fetch_optional(db)
    .await?
    else {
        return Ok(None);
    };
    let endpoints = sqlx::query(
        "SELECT id, platform, mask_token(token) AS token_masked, status, revoked_reason,
                registered_at
         FROM notification_endpoints WHERE user_id = $1 ORDER BY registered_at, id",
    )
    .bind(user_id)
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|e| MaskedEndpoint {
        id: e.get("id"),
        platform: e.get("platform"),
        token_masked: e.get("token_masked"),
        status: e.get("status"),
        revoked_reason: e.get("revoked_reason"),
        registered_at: e.get("registered_at"),
    })
    .collect();
    Ok(Some(RecipientView {
        recipient: Recipient {
            user_id: r.get("user_id"),
            display_name: r.get("display_name"),
            email: r.get("email"),
            line_user_id: r.get("line_user_id"),
            locale: r.get("locale"),
            timezone: r.get("timezone"),
        },
        email_undeliverable_at: r.get("email_undeliverable_at"),
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
        endpoints,
    }))
}
