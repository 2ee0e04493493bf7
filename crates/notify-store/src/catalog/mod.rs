//! Notification types and their templates (here), recipients, push endpoints and
//! preferences (`recipients.rs`) and the recipient facts the planner reads (`facts.rs`).
//! Everything is re-exported here: callers use `notify_store::catalog::*`.

use crate::Result;
use crate::row::parse;
use notify_core::fatigue::OverCap;
use notify_core::{Category, Channel, Priority, SensitiveData};
use sqlx::{PgExecutor, Row};

mod facts;
mod recipients;

pub use facts::{distinct_users, load_recipient_facts, load_recipient_facts_many};
pub use recipients::{
    MaskedEndpoint, Recipient, RecipientView, UserPreferences, deactivate_endpoint,
    get_preferences, get_recipient, mark_email_undeliverable, record_line_follow,
    register_endpoint, revoke_endpoint, set_preference, set_quiet_hours, upsert_recipient,
};

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
    /// What to do with a notification over a fatigue cap.
    pub over_cap: OverCap,
    /// What ingest does with sensitive data in its events: see [`notify_core::guard`].
    pub sensitive_data: SensitiveData,
    /// Digest window in seconds (0 = no digests).
    pub digest_window_s: i32,
    /// Fallbacks and escalations (`fallback_channels`, `escalations`).
    pub derivation: notify_core::plan::Derivation,
    /// Its own retention lengths, overriding the global ones ([`crate::retention`]).
    pub retention: crate::retention::TypeRetention,
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
            "INSERT INTO notification_templates
                 (type, channel, locale, title, body, email_subject, email_html, rich)
             SELECT $1, * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                                      $7::text[], $8::jsonb[])",
        )
        .bind(&t.key)
        .bind(col(|x| &x.channel))
        .bind(col(|x| &x.locale))
        .bind(col(|x| &x.title))
        .bind(col(|x| &x.body))
        .bind(col(|x| &x.email_subject))
        .bind(col(|x| &x.email_html))
        .bind(templates.iter().map(|t| t.rich_json()).collect::<Vec<_>>())
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
        "SELECT channel, locale, title, body, email_subject, email_html, rich
         FROM notification_templates WHERE type = $1 ORDER BY channel, locale",
    )
    .bind(type_key)
    .fetch_all(db)
    .await?;
    let mut templates = Vec::with_capacity(rows.len());
    for r in rows {
        let mut t = notify_core::template::Template {
            channel: r.get("channel"),
            locale: r.get("locale"),
            title: r.get("title"),
            body: r.get("body"),
            email_subject: r.get("email_subject"),
            email_html: r.get("email_html"),
            ..Default::default()
        };
        t.set_rich_json(r.get("rich"))
            .map_err(|e| crate::StoreError::BadValue {
                column: "notification_templates.rich",
                message: e.to_string(),
            })?;
        templates.push(t);
    }
    Ok(Some((default_locale, templates)))
}

/// Creates or replaces a type. Returns true when it was created.
pub async fn upsert_type(db: impl PgExecutor<'_>, t: &NotificationType) -> Result<bool> {
    let channels: Vec<&str> = t.default_channels.iter().map(|c| c.as_str()).collect();
    let row = sqlx::query(
        "INSERT INTO notification_types
             (key, priority, default_channels, critical, category, default_locale, sample_payload,
              dedup_window_s, over_cap, digest_window_s, sensitive_data, fallback_channels,
              escalations, content_retention_s, delivery_retention_s, archived_inbox_retention_s)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
         ON CONFLICT (key) DO UPDATE SET priority = EXCLUDED.priority,
             default_channels = EXCLUDED.default_channels, critical = EXCLUDED.critical,
             category = EXCLUDED.category, default_locale = EXCLUDED.default_locale,
             sample_payload = EXCLUDED.sample_payload, dedup_window_s = EXCLUDED.dedup_window_s,
             over_cap = EXCLUDED.over_cap, digest_window_s = EXCLUDED.digest_window_s,
             sensitive_data = EXCLUDED.sensitive_data,
             fallback_channels = EXCLUDED.fallback_channels, escalations = EXCLUDED.escalations,
             content_retention_s = EXCLUDED.content_retention_s,
             delivery_retention_s = EXCLUDED.delivery_retention_s,
             archived_inbox_retention_s = EXCLUDED.archived_inbox_retention_s,
             updated_at = now()
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
    .bind(t.over_cap.as_str())
    .bind(t.digest_window_s)
    .bind(t.sensitive_data.as_str())
    .bind(
        t.derivation
            .fallback_channels
            .iter()
            .map(|c| c.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(serde_json::to_value(&t.derivation.escalations).unwrap_or_default())
    .bind(t.retention.content_s)
    .bind(t.retention.deliveries_s)
    .bind(t.retention.archived_inbox_s)
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
                dedup_window_s, over_cap, digest_window_s, sensitive_data, fallback_channels,
                escalations, content_retention_s, delivery_retention_s, archived_inbox_retention_s
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
                over_cap: parse(r, "over_cap")?,
                sensitive_data: parse(r, "sensitive_data")?,
                digest_window_s: r.get("digest_window_s"),
                derivation: derivation_of(r)?,
                retention: crate::retention::TypeRetention {
                    content_s: r.get("content_retention_s"),
                    deliveries_s: r.get("delivery_retention_s"),
                    archived_inbox_s: r.get("archived_inbox_retention_s"),
                },
            })
        })
        .collect()
}

/// A type row's `fallback_channels` and `escalations`.
pub(crate) fn derivation_of(r: &sqlx::postgres::PgRow) -> Result<notify_core::plan::Derivation> {
    let fallback_channels = r
        .get::<Vec<String>, _>("fallback_channels")
        .iter()
        .map(|c| c.parse())
        .collect::<std::result::Result<Vec<Channel>, _>>()
        .map_err(|e| crate::StoreError::BadValue {
            column: "notification_types.fallback_channels",
            message: e.to_string(),
        })?;
    let escalations =
        serde_json::from_value(r.get("escalations")).map_err(|e| crate::StoreError::BadValue {
            column: "notification_types.escalations",
            message: e.to_string(),
        })?;
    Ok(notify_core::plan::Derivation {
        fallback_channels,
        escalations,
    })
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
