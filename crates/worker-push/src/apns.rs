//! APNs: `POST {base}/3/device/<token>` over HTTP/2 with token-based authentication
//! (developer.apple.com/documentation/usernotifications/sending-notification-requests-to-apns,
//! "Establishing a token-based connection to APNs").
//!
//! The provider token is an ES256 JWT (`kid` = key id, `iss` = team id, `iat`) signed with
//! the `.p8` key. Apple rejects tokens older than an hour and answers
//! `TooManyProviderTokenUpdates` when they change more often than every 20 minutes, so one
//! token is reused for [`TOKEN_LIFETIME`] (40 minutes) and never minted per request.
//!
//! Answers (Apple's "Handling notification responses from APNs" table): 200 sent with
//! `apns-id`; 410 `Unregistered` deactivates the endpoint unless it was registered again
//! after the answer's `timestamp`; 400 `BadDeviceToken` / `DeviceTokenNotForTopic`
//! deactivate it; 413 `PayloadTooLarge` fails; 429 and 5xx retry; 403
//! `ExpiredProviderToken` retries with a new token; other 4xx fail.

use notify_core::{AttemptOutcome, ErrorClass};
use notify_worker::{Job, Lease};
use serde_json::{Value, json};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How long one provider token is used (Apple: refresh between 20 and 60 minutes).
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(40 * 60);

/// Most bytes of an APNs payload for an alert notification.
pub const APNS_MAX_PAYLOAD_BYTES: usize = 4096;

/// APNs settings.
#[derive(Debug, Clone)]
pub struct ApnsConfig {
    /// `https://api.push.apple.com`, or `https://api.sandbox.push.apple.com` for
    /// development builds. A plain `http://` base (the simulator) is spoken as HTTP/2
    /// with prior knowledge.
    pub api_base: String,
    /// PEM (PKCS #8) of the `.p8` signing key.
    pub key_pem: String,
    /// The key's 10-character id (JWT `kid`).
    pub key_id: String,
    /// The developer team id (JWT `iss`).
    pub team_id: String,
    /// The app's bundle id (`apns-topic`).
    pub topic: String,
    /// Timeout of one call.
    pub timeout: Duration,
}

/// Why APNs could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ApnsSetupError {
    /// The key is not an EC P-256 PKCS #8 PEM.
    #[error("NOTIFY_APNS_KEY_FILE is not an EC (P-256) PKCS #8 PEM key: {0}")]
    Key(#[from] jsonwebtoken::errors::Error),
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// An APNs client with a cached provider token.
pub struct Apns {
    http: reqwest::Client,
    key: jsonwebtoken::EncodingKey,
    cfg: ApnsConfig,
    token: RwLock<Option<(String, Instant)>>,
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    iss: &'a str,
    iat: i64,
}

impl Apns {
    /// Parses the key and builds an HTTP/2 client.
    pub fn new(cfg: ApnsConfig) -> Result<Self, ApnsSetupError> {
        let key = jsonwebtoken::EncodingKey::from_ec_pem(cfg.key_pem.as_bytes())?;
        let mut http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .user_agent(concat!("notify-worker-push/", env!("CARGO_PKG_VERSION")));
        if cfg.api_base.starts_with("http://") {
            http = http.http2_prior_knowledge();
        }
        Ok(Self {
            http: http.build()?,
            key,
            cfg,
            token: RwLock::new(None),
        })
    }

    /// The current provider token, minted when there is none or it is older than
    /// [`TOKEN_LIFETIME`] (or `renew` asks for a new one and the current one is at least
    /// 20 minutes old, so Apple never sees tokens change faster than it allows).
    fn provider_token(&self, renew: bool) -> Result<String, jsonwebtoken::errors::Error> {
        if let Ok(slot) = self.token.read()
            && let Some((token, minted)) = slot.as_ref()
            && minted.elapsed() < TOKEN_LIFETIME
            && !(renew && minted.elapsed() >= Duration::from_secs(20 * 60))
        {
            return Ok(token.clone());
        }
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        header.kid = Some(self.cfg.key_id.clone());
        let claims = Claims {
            iss: &self.cfg.team_id,
            iat: chrono::Utc::now().timestamp(),
        };
        let token = jsonwebtoken::encode(&header, &claims, &self.key)?;
        if let Ok(mut slot) = self.token.write() {
            *slot = Some((token.clone(), Instant::now()));
        }
        Ok(token)
    }

    /// Sends `job` to the device `device_token` with `badge` as `aps.badge` (none when
    /// `None`).
    pub async fn send(
        &self,
        job: &Job,
        device_token: &str,
        badge: Option<u32>,
        lease: &Lease,
    ) -> AttemptOutcome {
        let fit = crate::fit::Fit {
            provider: "APNs",
            limit: APNS_MAX_PAYLOAD_BYTES,
            build: payload(job, badge),
            parts: APNS_PARTS,
        };
        let body = match fit.fit_json(&job.content.body) {
            Ok(body) => body,
            Err(too_large) => return *too_large,
        };
        // Kept by APNs for a day at most when the device is offline.
        let expiration = (job.created_at + chrono::Duration::days(1)).timestamp();
        let collapse_id = job.event_id.to_string();
        // 10 = deliver at once; 5 = at a time that saves the device's power.
        let priority = if job.priority == notify_core::Priority::Low {
            "5"
        } else {
            "10"
        };
        let content = json!({
            "headers": {
                "apns-topic": self.cfg.topic,
                "apns-push-type": "alert",
                "apns-priority": priority,
                "apns-expiration": expiration.to_string(),
                "apns-collapse-id": collapse_id,
                "apns-id": job.id.to_string(),
            },
            "payload": body,
        });
        let token = match self.provider_token(false) {
            Ok(t) => t,
            Err(e) => {
                return AttemptOutcome::failed(ErrorClass::Permanent, "apns_key", content)
                    .with_response(e.to_string());
            }
        };
        let url = format!(
            "{}/3/device/{device_token}",
            self.cfg.api_base.trim_end_matches('/')
        );
        let request = self
            .http
            .post(url)
            .header("authorization", format!("bearer {token}"))
            .header("apns-topic", &self.cfg.topic)
            .header("apns-push-type", "alert")
            .header("apns-priority", priority)
            .header("apns-expiration", expiration.to_string())
            .header("apns-collapse-id", collapse_id)
            .header("apns-id", job.id.to_string())
            .json(&body);
        let answer = match notify_worker::http::send(request, "apns", lease).await {
            Ok(a) => a,
            Err(e) => return e.into_outcome(content),
        };
        let status = answer.status;
        let out = if status == 200 {
            let apns_id = answer.header("apns-id").map(str::to_string);
            AttemptOutcome::sent(apns_id, content)
        } else {
            let parsed = answer.json();
            let (class, code) = classify_apns_error(status, &parsed);
            if code == "apns_expired_provider_token" {
                let _ = self.provider_token(true);
            }
            let invalid_since = (status == 410)
                .then(|| parsed["timestamp"].as_i64())
                .flatten()
                .and_then(chrono::DateTime::from_timestamp_millis);
            AttemptOutcome::failed(class, code, content)
                .with_retry_after(answer.retry_after)
                .with_invalid_since(invalid_since)
        };
        out.with_status(status as i32).with_response(answer.body)
    }
}

/// The parts of an APNs payload named when it does not fit.
const APNS_PARTS: &[&str] = &[
    "/aps/alert/title",
    "/aps/alert/body",
    "/aps",
    "/actions",
    "/image_url",
    "/url",
];

/// The APNs payload for `job` with `text` as the body (Apple, "Generating a remote
/// notification": the `aps` dictionary keys; custom keys sit beside `aps`):
/// `aps.alert` (`title`, `body`) plus [`crate::fcm::aps_extras`] (`category`,
/// `thread-id`, `sound`, `interruption-level`, `badge`, `mutable-content`), and the
/// custom keys `url`, `delivery_id`, `event_id`, `type`, `image_url` (for the app's
/// notification service extension, which downloads and attaches it: that is what
/// `mutable-content: 1` lets it do) and `actions` (`[{"id","label","url"}]`: the buttons
/// come from the category the app registered; this maps each button's action id to its
/// link).
pub(crate) fn payload(job: &Job, badge: Option<u32>) -> impl Fn(&str) -> Value {
    let c = &job.content;
    let extras = crate::fcm::aps_extras(job, badge);
    let mut custom = json!({
        "url": c.url,
        "delivery_id": job.id.to_string(),
        "event_id": job.event_id.to_string(),
        "type": job.type_key,
    });
    if !c.image_url.is_empty() {
        custom["image_url"] = json!(c.image_url);
    }
    if !c.actions.is_empty() {
        custom["actions"] = crate::fcm::actions_json(job);
    }
    let title = c.title.clone();
    move |text: &str| {
        let mut aps = extras.clone();
        aps.insert("alert".into(), json!({"title": title, "body": text}));
        let mut body = custom.clone();
        body["aps"] = Value::Object(aps);
        body
    }
}

/// Sorts an APNs error answer (status + `{"reason": ...}`) into a class and a code.
pub fn classify_apns_error(status: u16, body: &Value) -> (ErrorClass, String) {
    let reason = body["reason"].as_str().unwrap_or("");
    match (status, reason) {
        (410, _) => (ErrorClass::InvalidEndpoint, "invalid_token".into()),
        (400, "BadDeviceToken" | "DeviceTokenNotForTopic") => {
            (ErrorClass::InvalidEndpoint, "invalid_token".into())
        }
        (413, _) => (ErrorClass::Permanent, "payload_too_large".into()),
        (429, _) => (ErrorClass::RateLimited, "apns_too_many_requests".into()),
        (403, "ExpiredProviderToken") => {
            (ErrorClass::Transient, "apns_expired_provider_token".into())
        }
        (500..=599, _) => (ErrorClass::Transient, format!("apns_{status}")),
        (_, "") => (ErrorClass::Permanent, format!("apns_{status}")),
        (_, r) => (ErrorClass::Permanent, format!("apns_{}", snake(r))),
    }
}

/// `BadTopic` -> `bad_topic`.
fn snake(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    for (i, c) in s.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apns_answers_are_sorted_per_apples_table() {
        let cases = [
            (
                410,
                "Unregistered",
                ErrorClass::InvalidEndpoint,
                "invalid_token",
            ),
            (
                400,
                "BadDeviceToken",
                ErrorClass::InvalidEndpoint,
                "invalid_token",
            ),
            (
                400,
                "DeviceTokenNotForTopic",
                ErrorClass::InvalidEndpoint,
                "invalid_token",
            ),
            (400, "BadTopic", ErrorClass::Permanent, "apns_bad_topic"),
            (
                413,
                "PayloadTooLarge",
                ErrorClass::Permanent,
                "payload_too_large",
            ),
            (
                429,
                "TooManyRequests",
                ErrorClass::RateLimited,
                "apns_too_many_requests",
            ),
            (
                403,
                "ExpiredProviderToken",
                ErrorClass::Transient,
                "apns_expired_provider_token",
            ),
            (
                403,
                "InvalidProviderToken",
                ErrorClass::Permanent,
                "apns_invalid_provider_token",
            ),
            (
                500,
                "InternalServerError",
                ErrorClass::Transient,
                "apns_500",
            ),
            (503, "ServiceUnavailable", ErrorClass::Transient, "apns_503"),
        ];
        for (status, reason, class, code) in cases {
            assert_eq!(
                classify_apns_error(status, &json!({"reason": reason})),
                (class, code.to_string()),
                "{status} {reason}"
            );
        }
    }
}
