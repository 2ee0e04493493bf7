//! Notification types, recipients, push endpoints and preferences.

use crate::row::parse;
use crate::{Result, StoreError};
use notify_core::{Category, Channel, Priority, RecipientFacts, SensitiveData};
use sqlx::{PgExecutor, Row};
use std::collections::HashMap;
use uuid::Uuid;

/// A notification type as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationType {
    /// Key, e.g. `order_paid`.
    pub key: String,
    /// How urgent its notifications are.
    pub priority: Priority,
    /// Channels used when an event does not narrow them.
    pub default_channels: Vec<Channel>,
    /// Bypasses opt-outs.
    pub critical: bool,
    /// What its notifications are for.
    pub category: Category,
    /// Last step of the template locale fallback.
    pub default_locale: String,
    /// What the templates are validated against.
    pub sample_payload: serde_json::Value,
    /// Dedup window in seconds (0 = an event_key is unique forever).
    pub dedup_window_s: i32,
    /// `defer` or `drop` a notification over a fatigue cap.
    pub over_cap: String,
    /// What ingest does with sensitive data in its events: see [`notify_core::guard`].
    pub sensitive_data: SensitiveData,
    /// Digest window in seconds (0 = no digests).
    pub digest_window_s: i32,
}

/// Creates or replaces a type together with its templates (replacing any saved before).
/// Run it in a transaction. Returns true when the type was created.
pub async fn upsert_type_with_templates(
    tx: &mut sqlx::PgConnection,
    t: &NotificationType,
    templates: &[notify_core::template::Template],
) -> Result<bool> {
    let created = upsert_type(&mut *tx, t).await?;
    sqlx::query("DELETE FROM notification_templates WHERE type = $1")
        .bind(&t.key)
        .execute(&mut *tx)
        .await?;
    if !templates.is_empty() {
        let col = |f: fn(&notify_core::template::Template) -> &str| -> Vec<&str> {
            templates.iter().map(f).collect()
        };
        sqlx::query(
            "INSERT INTO notification_templates (type, channel, locale, title, body, email_subject, email_html)
             SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])",
        )
        .bind(&t.key)
        .bind(col(|x| &x.channel))
        .bind(col(|x| &x.locale))
        .bind(col(|x| &x.title))
        .bind(col(|x| &x.body))
        .bind(col(|x| &x.email_subject))
        .bind(col(|x| &x.email_html))
        .execute(&mut *tx)
        .await?;
    }
    Ok(created)
}

/// The highest type-file version loaded and its checksum, if any.
pub async fn type_catalog_version(db: impl PgExecutor<'_>) -> Result<Option<(i32, Vec<u8>)>> {
    Ok(sqlx::query_as(
        "SELECT version, checksum FROM type_catalog_versions ORDER BY version DESC LIMIT 1",
    )
    .fetch_optional(db)
    .await?)
}

/// Records that type-file `version` (with `checksum`, `types` types) was loaded.
pub async fn record_type_catalog_version(
    db: impl PgExecutor<'_>,
    version: i32,
    checksum: &[u8],
    types: i32,
) -> Result<()> {
    sqlx::query("INSERT INTO type_catalog_versions (version, checksum, types) VALUES ($1, $2, $3)")
        .bind(version)
        .bind(checksum)
        .bind(types)
        .execute(db)
        .await?;
    Ok(())
}

/// A type's templates and its default locale; `None` for an unknown type.
pub async fn get_templates(
    db: impl PgExecutor<'_> + Copy,
    type_key: &str,
) -> Result<Option<(String, Vec<notify_core::template::Template>)>> {
    let Some(default_locale): Option<String> =
        sqlx::query_scalar("SELECT default_locale FROM notification_types WHERE key = $1")
            .bind(type_key)
            .fetch_optional(db)
            .await?
    else {
        return Ok(None);
    };
    let rows = sqlx::query(
        "SELECT channel, locale, title, body, email_subject, email_html
         FROM notification_templates WHERE type = $1 ORDER BY channel, locale",
    )
    .bind(type_key)
    .fetch_all(db)
    .await?;
    let templates = rows
        .into_iter()
        .map(|r| notify_core::template::Template {
            channel: r.get("channel"),
            locale: r.get("locale"),
            title: r.get("title"),
            body: r.get("body"),
            email_subject: r.get("email_subject"),
            email_html: r.get("email_html"),
        })
        .collect();
    Ok(Some((default_locale, templates)))
}

/// Creates or replaces a type. Returns true when it was created.
pub async fn upsert_type(db: impl PgExecutor<'_>, t: &NotificationType) -> Result<bool> {
    let channels: Vec<&str> = t.default_channels.iter().map(|c| c.as_str()).collect();
    let row = sqlx::query(
        "INSERT INTO notification_types
             (key, priority, default_channels, critical, category, default_locale, sample_payload,
              dedup_window_s, over_cap, digest_window_s, sensitive_data)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (key) DO UPDATE SET priority = EXCLUDED.priority,
             default_channels = EXCLUDED.default_channels, critical = EXCLUDED.critical,
             category = EXCLUDED.category, default_locale = EXCLUDED.default_locale,
             sample_payload = EXCLUDED.sample_payload, dedup_window_s = EXCLUDED.dedup_window_s,
             over_cap = EXCLUDED.over_cap, digest_window_s = EXCLUDED.digest_window_s,
             sensitive_data = EXCLUDED.sensitive_data, updated_at = now()
         RETURNING (xmax = 0) AS created",
    )
    .bind(&t.key)
    .bind(t.priority.as_str())
    .bind(&channels)
    .bind(t.critical)
    .bind(t.category.as_str())
    .bind(&t.default_locale)
    .bind(&t.sample_payload)
    .bind(t.dedup_window_s)
    .bind(&t.over_cap)
    .bind(t.digest_window_s)
    .bind(t.sensitive_data.as_str())
    .fetch_one(db)
    .await?;
    Ok(row.get("created"))
}

/// Loads a type by key; `None` if unknown.
pub async fn get_type(db: impl PgExecutor<'_>, key: &str) -> Result<Option<NotificationType>> {
    Ok(get_types(db, &[key]).await?.pop())
}

/// Loads the types named in `keys` (in no particular order); unknown keys are absent.
pub async fn get_types(db: impl PgExecutor<'_>, keys: &[&str]) -> Result<Vec<NotificationType>> {
    let rows = sqlx::query(
        "SELECT key, priority, default_channels, critical, category, default_locale, sample_payload,
                dedup_window_s, over_cap, digest_window_s, sensitive_data
         FROM notification_types WHERE key = ANY($1)",
    )
    .bind(keys)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(NotificationType {
                key: r.get("key"),
                priority: parse(r, "priority")?,
                default_channels: r
                    .get::<Vec<String>, _>("default_channels")
                    .iter()
                    .filter_map(|c| c.parse().ok())
                    .collect(),
                critical: r.get("critical"),
                category: parse(r, "category")?,
                default_locale: r.get("default_locale"),
                sample_payload: r.get("sample_payload"),
                dedup_window_s: r.get("dedup_window_s"),
                over_cap: r.get("over_cap"),
                sensitive_data: parse(r, "sensitive_data")?,
                digest_window_s: r.get("digest_window_s"),
            })
        })
        .collect()
}

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
              upd AS (UPDATE notification_endpoints e SET status = 'revoked', revoked_reason = $2,
                          revoked_at = now()
                      FROM target WHERE e.id = target.id AND target.status = 'active' RETURNING e.id)
         SELECT (SELECT count(*) FROM target) AS found, (SELECT count(*) FROM upd) AS revoked",
    )
    .bind(id)
    .bind(reason)
    .fetch_one(db)
    .await?;
    if row.get::<i64, _>("found") == 0 {
        return Err(StoreError::NotFound(format!("endpoint {id}")));
    }
    Ok(row.get::<i64, _>("revoked") > 0)
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

/// Loads what the planner needs for `user_ids` (in that order) and type `type_key`:
/// contact data, active push endpoints (oldest first) and preferences. Three queries,
/// whatever the number of recipients.
pub async fn load_recipient_facts(
    db: &mut sqlx::PgConnection,
    type_key: &str,
    user_ids: &[String],
) -> Result<Vec<RecipientFacts>> {
    let mut out = load_recipient_facts_many(db, &[(type_key, user_ids)]).await?;
    Ok(out.pop().unwrap_or_default())
}

/// [`load_recipient_facts`] for several `(type key, user ids)` requests at once: one
/// result per request, in order, from the same three queries.
pub async fn load_recipient_facts_many(
    db: &mut sqlx::PgConnection,
    requests: &[(&str, &[String])],
) -> Result<Vec<Vec<RecipientFacts>>> {
    #[derive(Default)]
    struct Known {
        email: Option<String>,
        line_user_id: Option<String>,
        line_unfollowed: bool,
        email_undeliverable: bool,
        timezone: Option<chrono_tz::Tz>,
        quiet_hours: Vec<notify_core::quiet::QuietWindow>,
        exists: bool,
        push_endpoints: Vec<(uuid::Uuid, String)>,
        // (type or "*", channel) -> enabled
        // channel None = '*' (the type on every channel)
        prefs: Vec<(String, Option<Channel>, bool)>,
    }
    let mut users: Vec<&str> = requests
        .iter()
        .flat_map(|(_, u)| u.iter().map(String::as_str))
        .collect();
    users.sort_unstable();
    users.dedup();
    let mut types: Vec<&str> = requests.iter().map(|(t, _)| *t).collect();
    types.push("*");
    types.sort_unstable();
    types.dedup();
    let mut known: HashMap<String, Known> = HashMap::with_capacity(users.len());

    let rows =
        sqlx::query(
            "SELECT r.user_id, r.email, r.line_user_id, coalesce(NOT lf.following, false) AS line_unfollowed,
                    r.email_undeliverable_at IS NOT NULL AS email_undeliverable,
                    r.timezone, r.quiet_hours_json
             FROM recipients r LEFT JOIN line_followers lf ON lf.line_user_id = r.line_user_id
             WHERE r.user_id = ANY($1)",
        )
        .bind(&users)
        .fetch_all(&mut *db)
        .await?;
    for r in rows {
        let k = known.entry(r.get("user_id")).or_default();
        k.exists = true;
        k.email = r
            .get::<Option<String>, _>("email")
            .filter(|s| !s.is_empty());
        k.line_user_id = r
            .get::<Option<String>, _>("line_user_id")
            .filter(|s| !s.is_empty());
        k.line_unfollowed = r.get("line_unfollowed");
        k.email_undeliverable = r.get("email_undeliverable");
        k.timezone = notify_core::validate::parse_timezone(r.get("timezone"));
        k.quiet_hours = r
            .get::<Option<serde_json::Value>, _>("quiet_hours_json")
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
    }

    let rows = sqlx::query(
        "SELECT user_id, id, platform FROM notification_endpoints
         WHERE user_id = ANY($1) AND status = 'active' ORDER BY registered_at, id",
    )
    .bind(&users)
    .fetch_all(&mut *db)
    .await?;
    for r in rows {
        known
            .entry(r.get("user_id"))
            .or_default()
            .push_endpoints
            .push((r.get("id"), r.get("platform")));
    }

    let rows = sqlx::query(
        "SELECT user_id, type, channel, enabled FROM notification_preferences
         WHERE user_id = ANY($1) AND type = ANY($2)",
    )
    .bind(&users)
    .bind(&types)
    .fetch_all(&mut *db)
    .await?;
    for r in rows {
        let channel = match r.get::<&str, _>("channel") {
            "*" => None,
            c => match c.parse::<Channel>() {
                Ok(c) => Some(c),
                Err(_) => continue,
            },
        };
        known.entry(r.get("user_id")).or_default().prefs.push((
            r.get("type"),
            channel,
            r.get("enabled"),
        ));
    }

    Ok(requests
        .iter()
        .map(|(type_key, user_ids)| {
            user_ids
                .iter()
                .map(|u| {
                    let mut f = RecipientFacts {
                        user_id: u.clone(),
                        ..Default::default()
                    };
                    if let Some(k) = known.get(u) {
                        f.exists = k.exists;
                        f.email = k.email.clone();
                        f.line_user_id = k.line_user_id.clone();
                        f.line_unfollowed = k.line_unfollowed;
                        f.email_undeliverable = k.email_undeliverable;
                        f.timezone = k.timezone;
                        f.quiet_hours = k.quiet_hours.clone();
                        f.push_endpoints = k.push_endpoints.clone();
                        for (t, channel, enabled) in &k.prefs {
                            match (t == "*", channel) {
                                (true, Some(c)) => {
                                    f.channel_prefs.insert(*c, *enabled);
                                }
                                (false, Some(c)) if t == type_key => {
                                    f.type_prefs.insert(*c, *enabled);
                                }
                                (false, None) if t == type_key => f.type_wide_pref = Some(*enabled),
                                _ => {}
                            }
                        }
                    }
                    f
                })
                .collect()
        })
        .collect())
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

/// The `sensitive_data` policy of the type `key`; `None` when there is no such type.
pub async fn sensitive_data_policy(db: &sqlx::PgPool, key: &str) -> Result<Option<SensitiveData>> {
    sqlx::query("SELECT sensitive_data FROM notification_types WHERE key = $1")
        .bind(key)
        .fetch_optional(db)
        .await?
        .map(|r| parse(&r, "sensitive_data"))
        .transpose()
}
