//! `ingest load-types FILE`: notification types from a versioned JSON file, applied at
//! deploy time like a migration.
//!
//! ```json
//! {"version": 3, "types": [{"key": "order_paid", "default_channels": ["inapp", "email"],
//!   "priority": "high", "default_locale": "en", "sample_payload": {"order_id": 1},
//!   "templates": [{"channel": "*", "locale": "th", "title": "ชำระเงินแล้ว #{{ payload.order_id }}"}]}]}
//! ```
//!
//! Each type takes the fields of `UpsertNotificationTypeRequest` and is validated by the
//! same code (templates rendered against the sample payload). The whole file is applied in
//! one transaction or not at all. A file whose version is higher than the last one loaded
//! is applied; the same version with the same content is a no-op; the same version with
//! other content, or a lower version, is refused (bump the version); "the same content"
//! compares the parsed JSON, so layout and line endings do not count. Types the file does
//! not name are left as they are. A file is at most 4 MiB and 1,000 types, and names at
//! least one type.

use notify_proto::v1 as pb;
use notify_store::PgPool;
use notify_store::catalog;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypesFile {
    /// Positive, increasing with every change.
    pub version: i32,
    /// The types.
    pub types: Vec<TypeSpec>,
}

/// One type, as in `UpsertNotificationTypeRequest`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeSpec {
    key: String,
    #[serde(default)]
    priority: String,
    default_channels: Vec<String>,
    #[serde(default)]
    critical: bool,
    #[serde(default)]
    category: String,
    #[serde(default)]
    default_locale: String,
    #[serde(default)]
    sample_payload: Option<serde_json::Value>,
    #[serde(default)]
    dedup_window_seconds: u32,
    #[serde(default)]
    over_cap: String,
    #[serde(default)]
    digest_window_seconds: u32,
    #[serde(default)]
    sensitive_data: String,
    #[serde(default)]
    fallback_channels: Vec<String>,
    #[serde(default)]
    escalations: Vec<EscalationSpec>,
    #[serde(default)]
    content_retention_seconds: u32,
    #[serde(default)]
    delivery_retention_seconds: u32,
    #[serde(default)]
    archived_inbox_retention_seconds: u32,
    #[serde(default)]
    templates: Vec<notify_core::template::Template>,
}

/// One entry of a type's `escalations`, as in `UpsertNotificationType`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscalationSpec {
    from_channel: String,
    to_channel: String,
    after_seconds: u32,
}

/// What loading did.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// The file's types were written and its version recorded.
    Applied {
        /// The file's version.
        version: i32,
        /// Types written.
        types: usize,
    },
    /// This exact file was loaded before.
    AlreadyLoaded {
        /// The file's version.
        version: i32,
    },
}

/// Why a file was refused; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not JSON of the expected shape.
    #[error("not a type file: {0}")]
    Parse(#[from] serde_json::Error),
    /// Field violations, named `types[i].field`.
    #[error("invalid types:\n{}", .0.join("\n"))]
    Invalid(Vec<String>),
    /// The version is not above the last one loaded, or reused with other content.
    #[error("{0}")]
    Version(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] notify_store::StoreError),
}

/// Most bytes in a type file.
pub const MAX_FILE_BYTES: usize = 4 * 1024 * 1024;

/// Most types in a type file.
pub const MAX_TYPES: usize = 1_000;

/// Validates and applies `text` (see the module docs).
pub async fn load(pool: &PgPool, text: &str) -> Result<Loaded, LoadError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(LoadError::Invalid(vec![format!(
            "the file is {} bytes; at most {MAX_FILE_BYTES}",
            text.len()
        )]));
    }
    let file: TypesFile = serde_json::from_str(text.trim_start_matches('\u{feff}'))?;
    // The checksum is over the parsed content (keys sorted, no layout), so re-indenting
    // the file or a CRLF checkout is not a change.
    let canonical: serde_json::Value = serde_json::from_str(text.trim_start_matches('\u{feff}'))?;
    let checksum = Sha256::digest(canonical.to_string().as_bytes()).to_vec();
    let mut problems = Vec::new();
    if file.version <= 0 {
        problems.push("version: must be a positive whole number".to_string());
    }
    if file.types.is_empty() {
        problems.push("types: must name at least one type".to_string());
    }
    if file.types.len() > MAX_TYPES {
        problems.push(format!("types: at most {MAX_TYPES} types per file"));
    }
    let mut seen = std::collections::HashSet::new();
    let mut valid = Vec::new();
    for (i, spec) in file.types.into_iter().enumerate() {
        if !seen.insert(spec.key.clone()) {
            problems.push(format!("types[{i}].key: {:?} appears twice", spec.key));
        }
        let request = pb::UpsertNotificationTypeRequest {
            key: spec.key,
            priority: spec.priority,
            default_channels: spec.default_channels,
            critical: spec.critical,
            category: spec.category,
            default_locale: spec.default_locale,
            sample_payload: spec
                .sample_payload
                .map(|p| p.to_string())
                .unwrap_or_default(),
            dedup_window_seconds: spec.dedup_window_seconds,
            over_cap: spec.over_cap,
            digest_window_seconds: spec.digest_window_seconds,
            sensitive_data: spec.sensitive_data,
            fallback_channels: spec.fallback_channels,
            escalations: spec
                .escalations
                .into_iter()
                .map(|e| pb::Escalation {
                    from_channel: e.from_channel,
                    to_channel: e.to_channel,
                    after_seconds: e.after_seconds,
                })
                .collect(),
            content_retention_seconds: spec.content_retention_seconds,
            delivery_retention_seconds: spec.delivery_retention_seconds,
            archived_inbox_retention_seconds: spec.archived_inbox_retention_seconds,
            templates: spec
                .templates
                .into_iter()
                .map(crate::convert::template_to_pb)
                .collect(),
        };
        match crate::type_validation::validate_type(request) {
            Ok(t) => valid.push(t),
            Err(violations) => problems.extend(
                violations
                    .into_iter()
                    .map(|v| format!("types[{i}].{}: {}", v.field, v.description)),
            ),
        }
    }
    if !problems.is_empty() {
        return Err(LoadError::Invalid(problems));
    }
    let mut tx = pool.begin().await.map_err(notify_store::StoreError::from)?;
    // One loader at a time: the version check and the write are atomic.
    sqlx::query("LOCK TABLE type_catalog_versions IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .map_err(notify_store::StoreError::from)?;
    if let Some((current, current_sum)) = catalog::type_catalog_version(&mut *tx).await? {
        if current == file.version && current_sum == checksum {
            return Ok(Loaded::AlreadyLoaded {
                version: file.version,
            });
        }
        if current == file.version {
            return Err(LoadError::Version(format!(
                "version {current} was already loaded with other content: bump the version"
            )));
        }
        if current > file.version {
            return Err(LoadError::Version(format!(
                "version {} is older than the loaded version {current}: refusing to go back",
                file.version
            )));
        }
    }
    for (t, templates) in &valid {
        catalog::upsert_type_with_templates(&mut tx, t, templates).await?;
    }
    catalog::record_type_catalog_version(&mut *tx, file.version, &checksum, valid.len() as i32)
        .await?;
    tx.commit().await.map_err(notify_store::StoreError::from)?;
    Ok(Loaded::Applied {
        version: file.version,
        types: valid.len(),
    })
}
