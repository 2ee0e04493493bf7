//! Webhook endpoints: registered, listed, changed, rotated and deleted per caller.

use crate::{Result, StoreError};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// A registered endpoint, secrets left out (they are shown once).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Endpoint {
    /// Endpoint id.
    pub id: Uuid,
    /// The caller whose deliveries it receives.
    pub caller: String,
    /// Where messages are POSTed.
    pub url: String,
    /// Event types it receives (wire names); empty = all.
    pub event_types: Vec<String>,
    /// Whether messages are written for it.
    pub enabled: bool,
    /// Why it is disabled (by its caller, or after failing too long).
    pub disabled_reason: Option<String>,
    /// Start of its current run of failures.
    pub failing_since: Option<DateTime<Utc>>,
    /// When the previous secret stops signing (a rotation's overlap), if one still does.
    pub previous_expires_at: Option<DateTime<Utc>>,
    /// Registered.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}

pub(super) const COLUMNS: &str =
    "id, caller, url, event_types, enabled, disabled_reason, failing_since,
    CASE WHEN previous_expires_at > now() THEN previous_expires_at END AS previous_expires_at,
    created_at, updated_at";

/// Registers an endpoint of `caller` with `secret` (`whsec_...`). The URL and event types
/// must have been checked by the caller of this function.
pub async fn create_endpoint(
    db: &PgPool,
    caller: &str,
    url: &str,
    event_types: &[String],
    secret: &str,
) -> Result<Endpoint> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO webhook_endpoints (id, caller, url, event_types, secret)
         VALUES ($1, $2, $3, $4, $5) RETURNING {COLUMNS}"
    )))
    .bind(Uuid::now_v7())
    .bind(caller)
    .bind(url)
    .bind(event_types)
    .bind(secret)
    .fetch_one(db)
    .await?)
}

/// The endpoints of `caller` (every caller's for `None`), oldest first.
pub async fn list_endpoints(db: &PgPool, caller: Option<&str>) -> Result<Vec<Endpoint>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM webhook_endpoints WHERE ($1::text IS NULL OR caller = $1)
         ORDER BY created_at, id"
    )))
    .bind(caller)
    .fetch_all(db)
    .await?)
}

/// What [`update_endpoint`] changes (`None` keeps the field).
#[derive(Debug, Clone, Default)]
pub struct EndpointChange {
    /// New URL (checked by the caller).
    pub url: Option<String>,
    /// New filter (wire names; empty = all).
    pub event_types: Option<Vec<String>>,
    /// Enable (clears the failure run and the reason) or disable (reason `disabled by <who>`).
    pub enabled: Option<bool>,
}

/// Changes endpoint `id` of `caller` (any caller's for `None`). `NotFound` when there is
/// no such endpoint for it.
pub async fn update_endpoint(
    db: &PgPool,
    id: Uuid,
    caller: Option<&str>,
    change: &EndpointChange,
    who: &str,
) -> Result<Endpoint> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE webhook_endpoints SET url = coalesce($3, url),
             event_types = coalesce($4, event_types),
             enabled = coalesce($5, enabled),
             disabled_reason = CASE WHEN $5 IS NULL THEN disabled_reason
                                    WHEN $5 THEN NULL ELSE 'disabled by ' || $6 END,
             failing_since = CASE WHEN $5 THEN NULL ELSE failing_since END,
             updated_at = now()
         WHERE id = $1 AND ($2::text IS NULL OR caller = $2) RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(caller)
    .bind(&change.url)
    .bind(&change.event_types)
    .bind(change.enabled)
    .bind(who)
    .fetch_optional(db)
    .await?
    .ok_or_else(|| StoreError::NotFound(format!("webhook endpoint {id}")))
}

/// What [`rotate_secret`] did.
#[derive(Debug)]
pub enum Rotation {
    /// The new secret signs; the old one beside it until `previous_expires_at`.
    Rotated(Endpoint),
    /// Not rotated: an earlier rotation's overlap runs until `until`, and only one old
    /// secret is kept, so a second overlap would stop the oldest secret before the time
    /// the first rotation promised. Rotate with no overlap (stops every old secret now)
    /// or after `until`.
    InOverlap {
        /// When the earlier rotation's old secret stops signing.
        until: DateTime<Utc>,
    },
}

/// Replaces the secret of endpoint `id` with `secret`; the old one keeps signing beside it
/// for `overlap` (0: stops at once, and so does any older one). A non-zero `overlap` while
/// an earlier overlap runs is [`Rotation::InOverlap`], nothing changed. `NotFound` when
/// `caller` has no such endpoint.
pub async fn rotate_secret(
    db: &PgPool,
    id: Uuid,
    caller: Option<&str>,
    secret: &str,
    overlap: Duration,
) -> Result<Rotation> {
    let rotated: Option<Endpoint> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE webhook_endpoints SET previous_secret = secret, secret = $3,
             previous_expires_at = now() + $4 * interval '1 millisecond', updated_at = now()
         WHERE id = $1 AND ($2::text IS NULL OR caller = $2)
           AND ($4 = 0 OR previous_expires_at IS NULL OR previous_expires_at <= now())
         RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(caller)
    .bind(secret)
    .bind(notify_core::retry::millis(overlap))
    .fetch_optional(db)
    .await?;
    if let Some(e) = rotated {
        return Ok(Rotation::Rotated(e));
    }
    let until: Option<Option<DateTime<Utc>>> = sqlx::query_scalar(
        "SELECT previous_expires_at FROM webhook_endpoints
         WHERE id = $1 AND ($2::text IS NULL OR caller = $2)",
    )
    .bind(id)
    .bind(caller)
    .fetch_optional(db)
    .await?;
    match until {
        Some(Some(until)) => Ok(Rotation::InOverlap { until }),
        _ => Err(StoreError::NotFound(format!("webhook endpoint {id}"))),
    }
}

/// Deletes endpoint `id` of `caller` and its messages. `NotFound` when there is none.
pub async fn delete_endpoint(db: &PgPool, id: Uuid, caller: Option<&str>) -> Result<()> {
    let done = sqlx::query(
        "DELETE FROM webhook_endpoints WHERE id = $1 AND ($2::text IS NULL OR caller = $2)",
    )
    .bind(id)
    .bind(caller)
    .execute(db)
    .await?;
    if done.rows_affected() == 0 {
        return Err(StoreError::NotFound(format!("webhook endpoint {id}")));
    }
    Ok(())
}
