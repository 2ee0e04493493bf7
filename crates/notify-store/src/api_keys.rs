//! API keys of calling services: created (the key returned once), listed, revoked, and
//! loaded whole by every ingest replica into its cache (the table is small; a change is
//! announced on the `api_keys` channel).

use crate::Result;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sqlx::{PgPool, Row};
use uuid::Uuid;

/// One caller's key, as stored (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// Row id.
    pub id: Uuid,
    /// The caller's name (`[a-z0-9][a-z0-9._-]{0,62}`), recorded on its events and matched
    /// against a client certificate's subject CN.
    pub name: String,
    /// SHA-256 of the key.
    pub key_hash: Vec<u8>,
    /// The key's first characters, for telling keys apart in lists (`nk_1a2b3c4d`).
    pub key_prefix: String,
    /// Types it may send: exact keys or prefixes ending in `*` (`order_*`); `*` = all.
    pub send_types: Vec<String>,
    /// May manage recipients, endpoints, preferences, topics and types.
    pub can_manage: bool,
    /// Most `CreateEvent` calls per second (also the burst).
    pub events_per_second: i32,
    /// Most listed recipients per event.
    pub max_recipients: i32,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// What a new key may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    /// See [`ApiKey::name`].
    pub name: String,
    /// See [`ApiKey::send_types`].
    pub send_types: Vec<String>,
    /// See [`ApiKey::can_manage`].
    pub can_manage: bool,
    /// See [`ApiKey::events_per_second`].
    pub events_per_second: i32,
    /// See [`ApiKey::max_recipients`].
    pub max_recipients: i32,
}

/// The rule of a caller's name, as told to a caller: the `api_keys.name` CHECK
/// (`^[a-z0-9][a-z0-9._-]{0,62}$`, migration `20261201000015_api_keys.sql`).
pub const NAME_RULE: &str =
    "must be 1 to 63 characters of [a-z0-9._-], starting with a letter or digit (as API key names)";

/// Whether `name` follows the rule of API key names ([`NAME_RULE`]), so it can be a
/// caller's name.
pub fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// SHA-256 of a presented key.
pub fn hash_key(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// Creates a key and returns it with its row: `nk_` + 8 hex characters of the row id +
/// `_` + 43 base64url characters (256 random bits). Only its hash is stored; the key
/// cannot be shown again. Fails on a duplicate name (unique violation).
pub async fn create(db: &PgPool, new: &NewApiKey) -> Result<(String, ApiKey)> {
    use base64::Engine;
    let id = Uuid::new_v4();
    let secret: [u8; 32] = rand::random();
    let key = format!(
        "nk_{}_{}",
        &id.simple().to_string()[..8],
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
    );
    let row = sqlx::query(
        "INSERT INTO api_keys (id, name, key_hash, key_prefix, send_types, can_manage,
                               events_per_second, max_recipients)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING *",
    )
    .bind(id)
    .bind(&new.name)
    .bind(hash_key(&key))
    .bind(&key[..11])
    .bind(&new.send_types)
    .bind(new.can_manage)
    .bind(new.events_per_second)
    .bind(new.max_recipients)
    .fetch_one(db)
    .await?;
    Ok((key, from_row(&row)))
}

fn from_row(r: &sqlx::postgres::PgRow) -> ApiKey {
    ApiKey {
        id: r.get("id"),
        name: r.get("name"),
        key_hash: r.get("key_hash"),
        key_prefix: r.get("key_prefix"),
        send_types: r.get("send_types"),
        can_manage: r.get("can_manage"),
        events_per_second: r.get("events_per_second"),
        max_recipients: r.get("max_recipients"),
        created_at: r.get("created_at"),
        revoked_at: r.get("revoked_at"),
    }
}

/// Every key, revoked ones too, by name.
pub async fn list(db: &PgPool) -> Result<Vec<ApiKey>> {
    let rows = sqlx::query("SELECT * FROM api_keys ORDER BY name")
        .fetch_all(db)
        .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// Revokes the key named `name`; `false` when there is no such active key.
pub async fn revoke(db: &PgPool, name: &str) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL",
    )
    .bind(name)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}
