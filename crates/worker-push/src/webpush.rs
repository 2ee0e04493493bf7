//! Web Push: `POST <subscription endpoint>` with the message encrypted for the
//! subscription (RFC 8291, `Content-Encoding: aes128gcm`, one record) and a VAPID
//! authorization (RFC 8292, `Authorization: vapid t=<JWT>, k=<public key>`), plus the
//! RFC 8030 headers `TTL` (required), `Urgency` and `Topic`.
//!
//! Encryption is web-push-native's (`encrypt`: a fresh ECDH key and salt per message).
//! The VAPID JWT is ES256 (jsonwebtoken) with `aud` = the push service's origin, `exp`
//! 12 hours ahead and `sub` = the configured contact; one JWT per origin is reused until
//! it has less than an hour left.
//!
//! The plaintext is the JSON of [`notification`]. A push service
//! accepts a 4,096-byte record; the aes128gcm header (86 bytes with a 65-byte key id),
//! the padding delimiter and the 16-byte tag leave at most 3,993 bytes of plaintext
//! (RFC 8291 §4); what gives way when it does not fit is [`crate::fit`]'s rule.
//!
//! Answers (RFC 8030 §5, RFC 8292 §4): 201 (or any 2xx) sent, with `Location` as the
//! message id; 404 and 410 mean the subscription is gone: the endpoint is deactivated
//! (`invalid_token`); 413 fails with `payload_too_large`; 429 waits for `Retry-After`;
//! 5xx and timeouts retry; 401/403 (VAPID rejected) and other 4xx fail.

use base64::Engine;
use base64::engine::general_purpose::{URL_SAFE, URL_SAFE_NO_PAD};
use notify_core::{AttemptOutcome, ErrorClass};
use notify_worker::{Job, Lease};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use web_push_native::p256;

/// Most bytes of plaintext in one Web Push message (RFC 8291 §4: 4,096 − 86 − 1 − 16).
pub const WEBPUSH_MAX_PLAINTEXT_BYTES: usize = 3993;

/// Lifetime of a VAPID JWT (RFC 8292 §2: at most 24 hours).
pub const VAPID_JWT_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// Web Push settings.
#[derive(Debug, Clone)]
pub struct WebPushConfig {
    /// PEM (PKCS #8) of the VAPID EC P-256 private key.
    pub vapid_key_pem: String,
    /// VAPID contact (`sub` claim): a `mailto:` or `https:` URI.
    pub vapid_subject: String,
    /// When set, requests go to this base plus the subscription endpoint's path and query
    /// instead of the endpoint's own host (a local simulator); the VAPID `aud` stays the
    /// endpoint's origin. Empty in production.
    pub base_override: String,
    /// `TTL` header: how long the push service keeps an undelivered message, in seconds.
    pub ttl: Duration,
    /// Timeout of one call.
    pub timeout: Duration,
    /// Which subscription endpoints may be sent to
    /// ([`notify_core::links::LinkPolicy::web_push_endpoint`], checked before every send;
    /// `NOTIFY_WEB_PUSH_HOSTS`).
    pub links: notify_core::links::LinkPolicy,
}

/// Why Web Push could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum WebPushSetupError {
    /// The VAPID key is not an EC P-256 PKCS #8 PEM.
    #[error("NOTIFY_VAPID_PRIVATE_KEY_FILE is not an EC (P-256) PKCS #8 PEM key: {0}")]
    Key(String),
    /// The contact is not a mailto: or https: URI.
    #[error("NOTIFY_VAPID_SUBJECT={0:?} must be a mailto: or https: URI (RFC 8292 §2.1)")]
    Subject(String),
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// A Web Push client holding the VAPID key and cached JWTs per push-service origin.
pub struct WebPush {
    http: reqwest::Client,
    key: jsonwebtoken::EncodingKey,
    /// `k` parameter: the uncompressed public key, base64url without padding.
    public_key: String,
    cfg: WebPushConfig,
    jwts: Mutex<HashMap<String, (String, i64)>>,
}

#[derive(serde::Serialize)]
struct VapidClaims<'a> {
    aud: &'a str,
    exp: i64,
    sub: &'a str,
}

/// The subscription's keys from the endpoint row (`{"p256dh", "auth"}`, base64url).
fn subscription_keys(
    sub: Option<&Value>,
) -> Result<(p256::PublicKey, web_push_native::Auth), String> {
    let decode = |field: &str| -> Result<Vec<u8>, String> {
        let text = sub
            .and_then(|s| s[field].as_str())
            .ok_or_else(|| format!("the subscription has no {field}"))?;
        URL_SAFE_NO_PAD
            .decode(text.trim_end_matches('='))
            .or_else(|_| URL_SAFE.decode(text))
            .map_err(|e| format!("{field} is not base64url: {e}"))
    };
    let p256dh = decode("p256dh")?;
    let auth = decode("auth")?;
    let public = p256::PublicKey::from_sec1_bytes(&p256dh)
        .map_err(|_| "p256dh is not a P-256 public key".to_string())?;
    let auth: [u8; 16] = auth
        .try_into()
        .map_err(|a: Vec<u8>| format!("auth is {} bytes, not 16", a.len()))?;
    Ok((public, web_push_native::Auth::from(auth)))
}

/// `scheme://host[:port]` of `url`.
fn origin(url: &str) -> Option<&str> {
    let (scheme, rest) = url.split_once("://")?;
    let host_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    (!scheme.is_empty() && host_len > 0).then(|| &url[..scheme.len() + 3 + host_len])
}

impl WebPush {
    /// Parses the key and builds the client.
    pub fn new(cfg: WebPushConfig) -> Result<Self, WebPushSetupError> {
        use p256::pkcs8::DecodePrivateKey;
        let secret = p256::SecretKey::from_pkcs8_pem(&cfg.vapid_key_pem)
            .map_err(|e| WebPushSetupError::Key(e.to_string()))?;
        let key = jsonwebtoken::EncodingKey::from_ec_pem(cfg.vapid_key_pem.as_bytes())
            .map_err(|e| WebPushSetupError::Key(e.to_string()))?;
        if !(cfg.vapid_subject.starts_with("mailto:") || cfg.vapid_subject.starts_with("https:")) {
            return Err(WebPushSetupError::Subject(cfg.vapid_subject.clone()));
        }
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        let public_key =
            URL_SAFE_NO_PAD.encode(secret.public_key().to_encoded_point(false).as_bytes());
        // The endpoint is the end user's to choose: no redirect is followed (one could
        // lead anywhere) and names resolve to public addresses only.
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(std::sync::Arc::new(notify_worker::http::PublicOnly::new(
                cfg.links.clone(),
            )))
            .user_agent(concat!("notify-worker-push/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            http,
            key,
            public_key,
            cfg,
            jwts: Mutex::new(HashMap::new()),
        })
    }

    /// The VAPID JWT for `aud`, reused while it has more than an hour left.
    fn vapid_jwt(&self, aud: &str) -> Result<String, jsonwebtoken::errors::Error> {
        let now = chrono::Utc::now().timestamp();
        let mut jwts = self.jwts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((jwt, exp)) = jwts.get(aud)
            && *exp - now > 3600
        {
            return Ok(jwt.clone());
        }
        let exp = now + VAPID_JWT_LIFETIME.as_secs() as i64;
        let claims = VapidClaims {
            aud,
            exp,
            sub: &self.cfg.vapid_subject,
        };
        let jwt = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256),
            &claims,
            &self.key,
        )?;
        jwts.insert(aud.to_string(), (jwt.clone(), exp));
        Ok(jwt)
    }

    /// Where the request goes: the endpoint itself, or the override base plus its path.
    fn target_url(&self, endpoint: &str, origin: &str) -> String {
        if self.cfg.base_override.is_empty() {
            endpoint.to_string()
        } else {
            format!(
                "{}{}",
                self.cfg.base_override.trim_end_matches('/'),
                &endpoint[origin.len()..]
            )
        }
    }

    /// Sends `job` to the subscription at `endpoint`, if the link policy allows the
    /// endpoint (else `webpush_endpoint_refused`, an invalid endpoint: it is revoked and
    /// nothing is connected to).
    pub async fn send(&self, job: &Job, endpoint: &str, lease: &Lease) -> AttemptOutcome {
        let fit = crate::fit::Fit {
            provider: "Web Push",
            limit: WEBPUSH_MAX_PLAINTEXT_BYTES,
            build: notification(job),
            parts: WEBPUSH_PARTS,
        };
        let payload = match fit.fit_json(&job.content.body) {
            Ok(p) => p,
            Err(too_large) => return *too_large,
        };
        let plaintext = payload.to_string();
        let urgency = match job.priority {
            notify_core::Priority::High => "high",
            notify_core::Priority::Low => "low",
            notify_core::Priority::Normal => "normal",
        };
        // RFC 8030 §5.4: at most 32 characters of the base64url alphabet; a newer message
        // with the same topic replaces an undelivered one.
        let topic = job.event_id.simple().to_string();
        let ttl = self.cfg.ttl.as_secs().to_string();
        let content = json!({
            "endpoint": endpoint,
            "headers": {"TTL": ttl, "Urgency": urgency, "Topic": topic},
            "payload": payload,
        });
        // Checked again here: a row written around the registration's check (by hand, by
        // an older release) is never connected to.
        if let Err(why) = self.cfg.links.web_push_endpoint(endpoint) {
            return AttemptOutcome::failed(
                ErrorClass::InvalidEndpoint,
                "webpush_endpoint_refused",
                content,
            )
            .with_response(format!("refused: the subscription endpoint {why}"));
        }
        let (ua_public, ua_auth) = match subscription_keys(job.endpoint_subscription.as_ref()) {
            Ok(k) => k,
            Err(e) => {
                return AttemptOutcome::failed(
                    ErrorClass::InvalidEndpoint,
                    "invalid_token",
                    content,
                )
                .with_response(e);
            }
        };
        let Some(aud) = origin(endpoint) else {
            return AttemptOutcome::failed(ErrorClass::InvalidEndpoint, "invalid_token", content)
                .with_response(format!("{endpoint:?} is not a URL"));
        };
        let jwt = match self.vapid_jwt(aud) {
            Ok(t) => t,
            Err(e) => {
                return AttemptOutcome::failed(ErrorClass::Permanent, "vapid_key", content)
                    .with_response(e.to_string());
            }
        };
        let body = match web_push_native::encrypt(plaintext.into_bytes(), &ua_public, &ua_auth) {
            Ok(b) => b,
            Err(e) => {
                return AttemptOutcome::failed(
                    ErrorClass::Permanent,
                    "webpush_encryption",
                    content,
                )
                .with_response(e.to_string());
            }
        };
        let request = self
            .http
            .post(self.target_url(endpoint, aud))
            .header(
                "authorization",
                format!("vapid t={jwt}, k={}", self.public_key),
            )
            .header("ttl", ttl)
            .header("urgency", urgency)
            .header("topic", topic)
            .header("content-encoding", "aes128gcm")
            .header("content-type", "application/octet-stream")
            .body(body);
        let answer = match notify_worker::http::send(request, "webpush", lease).await {
            Ok(a) => a,
            Err(e) => return e.into_outcome(content),
        };
        let status = answer.status;
        let out = if (200..300).contains(&status) {
            AttemptOutcome::sent(answer.header("location").map(str::to_string), content)
        } else {
            let (class, code) = classify_webpush_status(status);
            AttemptOutcome::failed(class, code, content).with_retry_after(answer.retry_after)
        };
        out.with_status(status as i32).with_response(answer.body)
    }
}

/// The parts of a Web Push message named when it does not fit.
const WEBPUSH_PARTS: &[&str] = &[
    "/title", "/body", "/icon", "/image", "/actions", "/data", "/url",
];

/// The plaintext JSON for `job` with `text` as the body: the shape a service worker
/// hands to `showNotification(msg.title, msg)` (WHATWG Notifications API,
/// `NotificationOptions`: `body`, `icon`, `image`, `tag`, `data`, `actions` of
/// `{action, title}`): `title`, `body`, `url`, `tag` (the thread), `icon` (override),
/// `image` (override, else the content's image), `actions` (override, else the
/// content's, as `{"action": id, "title": label}`; actions with an app deep link are
/// left out, a browser cannot open them) and `data` with `delivery_id`,
/// `event_id`, `type`, `url` and `actions` (`{id: url}`: where each button goes; the
/// `notificationclick` handler gets the pressed button's id as `event.action`).
pub(crate) fn notification(job: &Job) -> impl Fn(&str) -> Value {
    let c = &job.content;
    let o = &c.overrides;
    // A browser cannot open an app's deep link: such actions are left out.
    let actions: Vec<&notify_core::Action> = if o.webpush_actions.is_empty() {
        &c.actions
    } else {
        &o.webpush_actions
    }
    .iter()
    .filter(|a| a.is_web_link())
    .collect();
    let mut data = json!({
        "delivery_id": job.id.to_string(),
        "event_id": job.event_id.to_string(),
        "type": job.type_key,
        "url": c.url,
    });
    let mut base = json!({"title": c.title, "url": c.url});
    if !actions.is_empty() {
        data["actions"] = Value::Object(
            actions
                .iter()
                .map(|a| (a.id.clone(), json!(a.url)))
                .collect(),
        );
        base["actions"] = actions
            .iter()
            .map(|a| json!({"action": a.id, "title": a.label}))
            .collect();
    }
    base["data"] = data;
    let image = if o.webpush_image.is_empty() {
        &c.image_url
    } else {
        &o.webpush_image
    };
    for (key, value) in [
        ("tag", &c.thread),
        ("icon", &o.webpush_icon),
        ("image", image),
    ] {
        if !value.is_empty() {
            base[key] = json!(value);
        }
    }
    move |text: &str| {
        let mut msg = base.clone();
        msg["body"] = json!(text);
        msg
    }
}

/// Sorts a push service's error status (RFC 8030 §5, RFC 8292 §4) into a class and code.
pub fn classify_webpush_status(status: u16) -> (ErrorClass, &'static str) {
    match status {
        404 | 410 => (ErrorClass::InvalidEndpoint, "invalid_token"),
        413 => (ErrorClass::Permanent, "payload_too_large"),
        429 => (ErrorClass::RateLimited, "webpush_rate_limited"),
        401 | 403 => (ErrorClass::Permanent, "webpush_vapid_rejected"),
        500..=599 => (ErrorClass::Transient, "webpush_unavailable"),
        _ => (ErrorClass::Permanent, "webpush_rejected"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_is_scheme_and_host() {
        assert_eq!(
            origin("https://push.example.test/sub/E?x=1"),
            Some("https://push.example.test")
        );
        assert_eq!(
            origin("https://fcm.googleapis.com:443/fcm/send/abc"),
            Some("https://fcm.googleapis.com:443")
        );
        assert_eq!(origin("not a url"), None);
    }

    #[test]
    fn statuses_are_sorted_per_rfc_8030() {
        assert_eq!(classify_webpush_status(410).1, "invalid_token");
        assert_eq!(classify_webpush_status(404).0, ErrorClass::InvalidEndpoint);
        assert_eq!(classify_webpush_status(413).1, "payload_too_large");
        assert_eq!(classify_webpush_status(429).0, ErrorClass::RateLimited);
        assert_eq!(classify_webpush_status(503).0, ErrorClass::Transient);
        assert_eq!(classify_webpush_status(403).0, ErrorClass::Permanent);
        assert_eq!(classify_webpush_status(400).0, ErrorClass::Permanent);
    }
}
