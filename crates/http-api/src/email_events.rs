//! `POST /webhooks/email/ses`: Amazon SES bounce and complaint notifications, delivered by
//! Amazon SNS to an HTTP(S) subscription.
//!
//! Verification (SNS developer guide, "Verifying the signatures of Amazon SNS messages"):
//! the body is the SNS JSON document; `SigningCertURL` must be https on
//! `sns.<region>.amazonaws.com` (or start with `NOTIFY_SNS_CERT_URL_PREFIX`, for the local
//! simulator); the certificate is fetched (cached per URL, no redirects) and must be
//! within its validity period; `Signature` (base64) is RSA PKCS #1 v1.5 over the string to
//! sign (for a `Notification`: `Message`, `MessageId`, `Subject` if present, `Timestamp`,
//! `TopicArn`, `Type`, each `name\nvalue\n`; for a `SubscriptionConfirmation`: `Message`,
//! `MessageId`, `SubscribeURL`, `Timestamp`, `Token`, `TopicArn`, `Type`), with SHA-256
//! for `SignatureVersion` 2 and SHA-1 for 1. When `NOTIFY_SNS_TOPIC_ARNS` is set, the
//! `TopicArn` must be one of them. Anything else is 401 and nothing is written.
//!
//! A verified `SubscriptionConfirmation` is confirmed by fetching its `SubscribeURL`
//! (same origin as the certificate). A verified `Notification` carries the SES event
//! (`eventType` or `notificationType`, SES "Contents of event data"):
//! - `Bounce` with `bounceType` `Permanent`: each bounced address is marked undeliverable
//!   for every recipient who has it (the store function of the SMTP 550 path, fenced by
//!   the mail's `timestamp`, so a bounce never marks an address set after the send);
//! - `Bounce` `Transient` or `Undetermined`: counted; the `NOTIFY_SOFT_BOUNCE_LIMIT`th
//!   (3) within 30 days suppresses the address for every category (`soft_bounces`);
//! - `Complaint`: suppresses marketing email for each user with that address
//!   (`complaint`). Transactional email still goes out.
//!
//! Each (SNS `MessageId`, address) is taken once (`email_feedback`): SNS redelivers.

use crate::AppState;
use crate::error::ApiError;
use axum::Json;
use axum::extract::{Path, State};
use base64::Engine;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Settings of the email event webhooks.
#[derive(Debug, Clone)]
pub struct EmailEventsConfig {
    /// Certificate URLs starting with this are trusted besides `https://sns.<region>.amazonaws.com/`
    /// (`NOTIFY_SNS_CERT_URL_PREFIX`; for the simulator, e.g. `http://127.0.0.1:58080/_sim/sns/`).
    pub sns_cert_url_prefix: Option<String>,
    /// The only topics accepted (`NOTIFY_SNS_TOPIC_ARNS`, comma-separated; empty = any).
    pub topic_arns: Vec<String>,
    /// Soft bounces within [`EmailEventsConfig::soft_bounce_window`] that suppress an
    /// address (`NOTIFY_SOFT_BOUNCE_LIMIT`, 3).
    pub soft_bounce_limit: u32,
    /// The soft-bounce window (30 days).
    pub soft_bounce_window: Duration,
}

impl Default for EmailEventsConfig {
    fn default() -> Self {
        Self {
            sns_cert_url_prefix: None,
            topic_arns: Vec::new(),
            soft_bounce_limit: 3,
            soft_bounce_window: Duration::from_secs(30 * 86_400),
        }
    }
}

impl EmailEventsConfig {
    /// Reads `NOTIFY_SNS_CERT_URL_PREFIX`, `NOTIFY_SNS_TOPIC_ARNS` and
    /// `NOTIFY_SOFT_BOUNCE_LIMIT` (a whole number from 1).
    pub fn from_env(env: &mut notify_core::config::Env) -> Self {
        let prefix = env.string("NOTIFY_SNS_CERT_URL_PREFIX", "");
        let topics = env.string("NOTIFY_SNS_TOPIC_ARNS", "");
        let limit = env.parse_with("NOTIFY_SOFT_BOUNCE_LIMIT", 3u32, |s| {
            s.parse::<u32>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| "a whole number of at least 1".to_string())
        });
        Self {
            sns_cert_url_prefix: (!prefix.is_empty()).then_some(prefix),
            topic_arns: topics
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            soft_bounce_limit: limit,
            ..Default::default()
        }
    }
}

/// Whether `url` may serve an SNS signing certificate.
fn trusted_cert_url(cfg: &EmailEventsConfig, url: &str) -> bool {
    let Ok(u) = url::Url::parse(url) else {
        return false;
    };
    // Compared after parsing, so `..` segments cannot step out of the prefix.
    if cfg
        .sns_cert_url_prefix
        .as_deref()
        .is_some_and(|p| u.as_str().starts_with(p))
    {
        return true;
    }
    u.scheme() == "https"
        && u.port().is_none()
        && u.host_str().is_some_and(is_sns_host)
        && u.path().ends_with(".pem")
}

/// `sns.<region>.amazonaws.com` (or `.amazonaws.com.cn`) where `<region>` has the shape
/// of an AWS Region code (`us-east-1`, `ap-southeast-1`, `us-gov-west-1`: two letters,
/// one or more words, a number). AWS's own suggestion for `SigningCertURL`
/// (`^sns\.[a-zA-Z0-9-]+\.amazonaws\.com(\.cn)?$`, "Verifying the signatures of Amazon
/// SNS messages") still admits `sns.s3.amazonaws.com`, S3's address of a bucket named
/// `sns`, whose wildcard certificate is valid: a forger's certificate could be served
/// there. The region's shape keeps it out.
fn is_sns_host(host: &str) -> bool {
    let rest = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"));
    let Some(region) = rest.and_then(|r| r.strip_prefix("sns.")) else {
        return false;
    };
    let parts: Vec<&str> = region.split('-').collect();
    let (number, words) = parts.split_last().expect("split yields one part at least");
    parts.len() >= 3
        && words[0].len() == 2
        && words
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
}

/// The RSA public key (PKCS #1 DER) of the certificate at `url`, fetched once.
async fn cert_key(url: &str) -> Result<Vec<u8>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Vec<u8>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(k) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(url) {
        return Ok(k.clone());
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let resp = http.get(url).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("certificate fetch answered {}", resp.status()));
    }
    let pem = resp.bytes().await.map_err(|e| e.to_string())?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).map_err(|e| e.to_string())?;
    let cert = pem.parse_x509().map_err(|e| e.to_string())?;
    if !cert.validity().is_valid() {
        return Err("the certificate is outside its validity period".into());
    }
    let key = cert.public_key().subject_public_key.data.to_vec();
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(url.to_string(), key.clone());
    Ok(key)
}

/// Verifies an SNS message (see the module); `Err` says why not (logged, never answered).
pub async fn verify_sns(cfg: &EmailEventsConfig, n: &Value) -> Result<(), String> {
    let to_sign = notify_core::signed::sns_string_to_sign(n).ok_or("unknown Type")?;
    let alg: &'static dyn ring::signature::VerificationAlgorithm =
        match n["SignatureVersion"].as_str() {
            Some("2") => &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            Some("1") => &ring::signature::RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
            _ => return Err("SignatureVersion must be 1 or 2".into()),
        };
    let cert_url = n["SigningCertURL"].as_str().unwrap_or("");
    if !trusted_cert_url(cfg, cert_url) {
        return Err(format!("untrusted SigningCertURL {cert_url:?}"));
    }
    if !cfg.topic_arns.is_empty()
        && !cfg
            .topic_arns
            .iter()
            .any(|t| Some(t.as_str()) == n["TopicArn"].as_str())
    {
        return Err("unexpected TopicArn".into());
    }
    let sig = base64::engine::general_purpose::STANDARD
        .decode(n["Signature"].as_str().unwrap_or(""))
        .map_err(|_| "Signature is not base64")?;
    let key = cert_key(cert_url).await?;
    ring::signature::UnparsedPublicKey::new(alg, key)
        .verify(to_sign.as_bytes(), &sig)
        .map_err(|_| "the signature does not match".to_string())
}

/// `POST /webhooks/email/{provider}` (only `ses`).
pub(crate) async fn email_webhook(
    State(app): State<AppState>,
    Path(provider): Path<String>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    if provider != "ses" {
        return Err(ApiError::not_found("provider", "no such email provider"));
    }
    let body = body?;
    let n: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid_body("body", format!("must be JSON: {e}")))?;
    let cfg = &app.cfg.email_events;
    if let Err(why) = verify_sns(cfg, &n).await {
        tracing::warn!(%why, "SNS notification refused");
        return Err(ApiError::INVALID_SNS_SIGNATURE);
    }
    match n["Type"].as_str() {
        Some("SubscriptionConfirmation") => {
            confirm_subscription(&n).await;
            return Ok(Json(json!({})));
        }
        Some("Notification") => {}
        _ => return Ok(Json(json!({}))),
    }
    let event: Value = serde_json::from_str(n["Message"].as_str().unwrap_or(""))
        .map_err(|_| ApiError::invalid_body("Message", "must be an SES event JSON"))?;
    let message_id = n["MessageId"].as_str().unwrap_or("");
    take_event(&app.pool, cfg, message_id, &event).await?;
    Ok(Json(json!({})))
}

/// Confirms an SNS subscription by fetching its `SubscribeURL` when it has the
/// certificate's origin.
async fn confirm_subscription(n: &Value) {
    let (Some(sub), Some(cert)) = (n["SubscribeURL"].as_str(), n["SigningCertURL"].as_str()) else {
        return;
    };
    let origin = |s: &str| url::Url::parse(s).ok().map(|u| u.origin());
    if origin(sub).is_none() || origin(sub) != origin(cert) {
        tracing::warn!(%sub, "SNS SubscribeURL not on the certificate's origin; not confirmed");
        return;
    }
    match reqwest::get(sub).await {
        Ok(r) => tracing::info!(status = %r.status(), "SNS subscription confirmed"),
        Err(e) => tracing::warn!(error = %e, "SNS subscription confirmation failed"),
    }
}

/// Applies one verified SES event (see the module), in one transaction.
async fn take_event(
    pool: &sqlx::PgPool,
    cfg: &EmailEventsConfig,
    message_id: &str,
    event: &Value,
) -> Result<(), ApiError> {
    let kind = event["eventType"]
        .as_str()
        .or(event["notificationType"].as_str())
        .unwrap_or("");
    let (kind, list) = match kind {
        "Bounce" if event["bounce"]["bounceType"] == "Permanent" => {
            ("bounce_permanent", &event["bounce"]["bouncedRecipients"])
        }
        "Bounce" => ("bounce_transient", &event["bounce"]["bouncedRecipients"]),
        "Complaint" => ("complaint", &event["complaint"]["complainedRecipients"]),
        _ => return Ok(()),
    };
    let sent_at = event["mail"]["timestamp"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc))
        .unwrap_or_else(chrono::Utc::now);
    let mut tx = pool.begin().await.map_err(notify_store::StoreError::from)?;
    // Suppressions added, by reason, counted once the transaction commits.
    let mut added: Vec<&'static str> = Vec::new();
    for r in list.as_array().into_iter().flatten() {
        let Some(address) = r["emailAddress"].as_str() else {
            continue;
        };
        let address = bare_address(address);
        let first = sqlx::query(
            "INSERT INTO email_feedback (message_id, provider, kind, address) VALUES ($1, 'ses', $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(format!("{message_id}/{address}"))
        .bind(kind)
        .bind(&address)
        .execute(&mut *tx)
        .await
        .map_err(notify_store::StoreError::from)?;
        if first.rows_affected() == 0 {
            continue;
        }
        let users: Vec<(String, String)> =
            sqlx::query_as("SELECT user_id, email FROM recipients WHERE lower(email) = lower($1)")
                .bind(&address)
                .fetch_all(&mut *tx)
                .await
                .map_err(notify_store::StoreError::from)?;
        match kind {
            "bounce_permanent" => {
                for (user, email) in &users {
                    notify_store::catalog::mark_email_undeliverable(
                        &mut *tx,
                        user,
                        email,
                        "ses_bounce",
                        sent_at,
                    )
                    .await?;
                }
            }
            "bounce_transient" => {
                let window = chrono::Duration::from_std(cfg.soft_bounce_window)
                    .unwrap_or(chrono::Duration::days(30));
                let (count,): (i64,) = sqlx::query_as(
                    "SELECT count(*) FROM email_feedback WHERE kind = 'bounce_transient'
                       AND lower(address) = lower($1) AND received_at > now() - $2::interval",
                )
                .bind(&address)
                .bind(format!("{} seconds", window.num_seconds()))
                .fetch_one(&mut *tx)
                .await
                .map_err(notify_store::StoreError::from)?;
                if count >= i64::from(cfg.soft_bounce_limit)
                    && suppress(&mut tx, None, Some(&address), "all", "soft_bounces", "ses").await?
                {
                    added.push("soft_bounces");
                }
            }
            _ => {
                for (user, _) in &users {
                    if suppress(
                        &mut tx,
                        Some(user),
                        Some(&address),
                        "marketing",
                        "complaint",
                        "ses",
                    )
                    .await?
                    {
                        added.push("complaint");
                    }
                }
            }
        }
    }
    tx.commit().await.map_err(notify_store::StoreError::from)?;
    for reason in added {
        notify_telemetry::metrics::count_suppression_added(reason);
    }
    Ok(())
}

/// `a@b` out of `Name <a@b>`.
fn bare_address(s: &str) -> String {
    match (s.rfind('<'), s.rfind('>')) {
        (Some(a), Some(b)) if b > a => s[a + 1..b].trim().to_string(),
        _ => s.trim().to_string(),
    }
}

/// Adds a suppression unless the same one exists. Returns whether it added.
pub async fn suppress(
    db: &mut sqlx::PgConnection,
    user_id: Option<&str>,
    address: Option<&str>,
    category: &str,
    reason: &str,
    source: &str,
) -> Result<bool, ApiError> {
    let done = sqlx::query(
        "INSERT INTO email_suppressions (user_id, address, category, reason, source)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(user_id)
    .bind(address)
    .bind(category)
    .bind(reason)
    .bind(source)
    .execute(db)
    .await
    .map_err(notify_store::StoreError::from)?;
    Ok(done.rows_affected() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_to_sign_is_the_documented_one() {
        let n = json!({"Type": "Notification", "MessageId": "m", "TopicArn": "t",
            "Message": "{\"a\":1}", "Timestamp": "2026-12-01T00:00:00.000Z", "Signature": "x"});
        assert_eq!(
            notify_core::signed::sns_string_to_sign(&n).unwrap(),
            "Message\n{\"a\":1}\nMessageId\nm\nTimestamp\n2026-12-01T00:00:00.000Z\nTopicArn\nt\nType\nNotification\n"
        );
        assert!(notify_core::signed::sns_string_to_sign(&json!({"Type": "Other"})).is_none());
    }

    #[test]
    fn only_sns_hosts_or_the_configured_prefix_serve_certificates() {
        let cfg = EmailEventsConfig {
            sns_cert_url_prefix: Some("http://127.0.0.1:9/_sim/sns/".into()),
            ..Default::default()
        };
        assert!(trusted_cert_url(
            &cfg,
            "https://sns.ap-southeast-1.amazonaws.com/SimpleNotificationService-abc.pem"
        ));
        assert!(trusted_cert_url(
            &cfg,
            "http://127.0.0.1:9/_sim/sns/cert.pem"
        ));
        assert!(!trusted_cert_url(&cfg, "https://sns.evil.example/x.pem"));
        // S3's address of a bucket named `sns` (a valid wildcard certificate).
        assert!(!trusted_cert_url(
            &cfg,
            "https://sns.s3.amazonaws.com/x.pem"
        ));
        assert!(!trusted_cert_url(
            &cfg,
            "https://sns.s3-website-us-east-1.amazonaws.com/x.pem"
        ));
        assert!(trusted_cert_url(
            &cfg,
            "https://sns.us-gov-west-1.amazonaws.com/SimpleNotificationService-abc.pem"
        ));
        assert!(trusted_cert_url(
            &cfg,
            "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-abc.pem"
        ));
        // The prefix is compared after `..` is resolved.
        assert!(!trusted_cert_url(
            &cfg,
            "http://127.0.0.1:9/_sim/sns/../../evil/cert.pem"
        ));
        assert!(!trusted_cert_url(
            &cfg,
            "http://sns.us-east-1.amazonaws.com/x.pem"
        ));
        assert!(!trusted_cert_url(
            &cfg,
            "https://sns.us-east-1.amazonaws.com.evil.example/x.pem"
        ));
        assert_eq!(bare_address("Somchai <s@example.test>"), "s@example.test");
    }
}
