//! The inbox API for end users (`/v1/inbox/...`, described in `docs/openapi.json`).
//!
//! Every route needs `Authorization: Bearer <JWT>` whose `sub` is the user id: HS256 with
//! `NOTIFY_INBOX_JWT_SECRET`, or RS256/ES256 with a key from `NOTIFY_INBOX_JWKS_FILE` or
//! `NOTIFY_INBOX_JWKS_URL` (fetched every 10 minutes; picked by `kid`); `exp` is
//! required, `nbf` is checked when present (RFC 7519 §4.1.5; 30 s leeway for clock skew),
//! and `aud` and `iss` are required and checked when `NOTIFY_INBOX_JWT_AUDIENCE` /
//! `NOTIFY_INBOX_JWT_ISSUER` are set. `sub` is NFC-normalised and checked as ingest
//! checks a user id (not blank, at most 255 bytes, no control, invisible or bidi control
//! characters). A token over [`MAX_TOKEN_BYTES`] is refused before it is parsed. A
//! missing, expired, not yet valid, unsigned, wrongly signed or misaddressed token, or
//! one with such a `sub`, gets 401 with a JSON error. Each request acts for that user
//! only: another user's notification is 404, never shown. Each user may make `NOTIFY_INBOX_RATE` requests a second (429 with
//! `Retry-After` beyond that).
//!
//! Live updates: `GET /v1/inbox/stream` is a Server-Sent Events stream of `notification`
//! events (the changed item, its `seq` as the event id) and `unread_count` events, within
//! a second of the in-app worker's commit (Postgres `LISTEN inbox`, so any replica serves
//! any user). Reconnecting with `Last-Event-ID` replays every change after that id. The
//! id (`seq`) is a per-user position whose values commit in order, however many workers
//! write, so a stream that moved past an id never misses a change below it.

use crate::{AppState, error};
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use notify_core::InboxStatus;
use notify_store::inbox::{self, Filter, InboxItem};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Most items per page.
pub const MAX_PAGE: i64 = 100;

/// Largest bearer token accepted, in bytes. A JWT with the claims this service reads is
/// well under 1 KiB; the bound keeps a client from making every request parse and hash
/// a large header.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const TOKEN_LEEWAY_SECS: u64 = 30;

/// Inbox settings.
#[derive(Debug, Clone, Default)]
pub struct InboxConfig {
    /// HS256 secret for end-user tokens.
    pub jwt_secret: Option<String>,
    /// JWKS (RFC 7517) JSON with RS256/ES256 public keys.
    pub jwks_json: Option<String>,
    /// URL of a JWKS, fetched at start and every 10 minutes (keys rotate there).
    pub jwks_url: Option<String>,
    /// Requests per second per user.
    pub rate_per_user: u32,
    /// Required `aud` of end-user tokens (`None`: `aud` is not checked).
    pub jwt_audience: Option<String>,
    /// Required `iss` of end-user tokens (`None`: `iss` is not checked).
    pub jwt_issuer: Option<String>,
}

impl InboxConfig {
    /// Reads `NOTIFY_INBOX_JWT_SECRET`, `NOTIFY_INBOX_JWKS_FILE`, `NOTIFY_INBOX_JWKS_URL`
    /// (at least one required), `NOTIFY_INBOX_RATE` (20), and `NOTIFY_INBOX_JWT_AUDIENCE`
    /// and `NOTIFY_INBOX_JWT_ISSUER` (empty: that claim is not checked).
    pub fn from_env(env: &mut notify_telemetry::Env) -> Self {
        let secret = env.string("NOTIFY_INBOX_JWT_SECRET", "");
        let jwks_url = Some(env.string("NOTIFY_INBOX_JWKS_URL", "")).filter(|u| !u.is_empty());
        let jwks_file = env.string("NOTIFY_INBOX_JWKS_FILE", "");
        let jwks_json = if jwks_file.is_empty() {
            None
        } else {
            match std::fs::read_to_string(&jwks_file) {
                Ok(j) => Some(j),
                Err(e) => {
                    env.error(format!(
                        "NOTIFY_INBOX_JWKS_FILE={jwks_file:?} cannot be read: {e}"
                    ));
                    None
                }
            }
        };
        if secret.is_empty() && jwks_file.is_empty() && jwks_url.is_none() {
            env.error("set NOTIFY_INBOX_JWT_SECRET (HS256), NOTIFY_INBOX_JWKS_FILE or NOTIFY_INBOX_JWKS_URL (RS256/ES256) for inbox tokens".to_string());
        }
        if !secret.is_empty() && secret.len() < 32 {
            env.error("NOTIFY_INBOX_JWT_SECRET must be at least 32 characters".to_string());
        }
        Self {
            jwt_secret: Some(secret).filter(|s| !s.is_empty()),
            jwks_json,
            jwks_url,
            rate_per_user: env.number("NOTIFY_INBOX_RATE", 20, 1, 10_000),
            jwt_audience: Some(env.string("NOTIFY_INBOX_JWT_AUDIENCE", ""))
                .filter(|a| !a.is_empty()),
            jwt_issuer: Some(env.string("NOTIFY_INBOX_JWT_ISSUER", "")).filter(|i| !i.is_empty()),
        }
    }
}

/// Verifies end-user tokens.
pub struct Verifier {
    hs256: Option<DecodingKey>,
    /// Keys from the JWKS file, then those last fetched from the JWKS URL.
    jwks: std::sync::RwLock<Vec<(Option<String>, DecodingKey, Algorithm)>>,
    file_keys: usize,
    /// Required `aud`, if configured.
    audience: Option<String>,
    /// Required `iss`, if configured.
    issuer: Option<String>,
}

/// The RS256/ES256 keys of a JWKS document.
fn jwks_keys(text: &str) -> Result<Vec<(Option<String>, DecodingKey, Algorithm)>, String> {
    let set: jsonwebtoken::jwk::JwkSet =
        serde_json::from_str(text).map_err(|e| format!("the JWKS is not valid: {e}"))?;
    let mut keys = Vec::new();
    for k in &set.keys {
        let alg = match &k.algorithm {
            jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => Algorithm::RS256,
            jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(_) => Algorithm::ES256,
            _ => continue,
        };
        let key = DecodingKey::from_jwk(k).map_err(|e| format!("JWKS key: {e}"))?;
        keys.push((k.common.key_id.clone(), key, alg));
    }
    Ok(keys)
}

/// Fetches the JWKS at `url` into `verifier` now and every 10 minutes; a failed fetch
/// keeps the keys it had.
pub async fn refresh_jwks(verifier: Arc<InboxState>, url: String) {
    let http = reqwest::Client::new();
    loop {
        let fetched = async {
            let text = http
                .get(&url)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .error_for_status()
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            jwks_keys(&text)
        }
        .await;
        match fetched {
            Ok(keys) => {
                let v = &verifier.verifier;
                let mut slot = v.jwks.write().unwrap_or_else(|e| e.into_inner());
                slot.truncate(v.file_keys);
                slot.extend(keys);
            }
            Err(e) => {
                tracing::warn!(%url, error = %e, "JWKS fetch failed; keeping the keys I have")
            }
        }
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
}

impl Verifier {
    /// Builds the keys; `Err` names what is wrong with the JWKS.
    pub fn new(cfg: &InboxConfig) -> Result<Self, String> {
        let hs256 = cfg
            .jwt_secret
            .as_ref()
            .map(|s| DecodingKey::from_secret(s.as_bytes()))
            .transpose()
            .map_err(|e| format!("NOTIFY_INBOX_JWT_SECRET: {e}"))?;
        let jwks = match &cfg.jwks_json {
            Some(text) => jwks_keys(text)?,
            None => Vec::new(),
        };
        Ok(Self {
            hs256,
            file_keys: jwks.len(),
            jwks: std::sync::RwLock::new(jwks),
            audience: cfg.jwt_audience.clone(),
            issuer: cfg.jwt_issuer.clone(),
        })
    }

    /// The user id (`sub`, NFC-normalised) of a valid token.
    ///
    /// # Errors
    /// Why the token is refused, for the 401 answer: too large, not a JWT, an algorithm or
    /// key not accepted, wrongly signed, expired, not valid yet (`nbf`), wrong `aud` or
    /// `iss`, a required claim missing, or a `sub` that is not a valid user id.
    pub fn verify(&self, token: &str) -> Result<String, String> {
        #[derive(Deserialize)]
        struct Claims {
            sub: String,
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(format!("must be at most {MAX_TOKEN_BYTES} bytes"));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| "not a JWT".to_string())?;
        let jwks = self.jwks.read().unwrap_or_else(|e| e.into_inner());
        let key = match header.alg {
            Algorithm::HS256 => self.hs256.as_ref().map(|k| (k, Algorithm::HS256)),
            alg => jwks
                .iter()
                .find(|(kid, _, a)| *a == alg && (header.kid.is_none() || kid == &header.kid))
                .map(|(_, k, a)| (k, *a)),
        }
        .ok_or("signed with an algorithm or key this service does not accept")?;
        let mut v = Validation::new(key.1);
        v.leeway = TOKEN_LEEWAY_SECS;
        v.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        match &self.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                required.push("aud");
            }
            None => v.validate_aud = false,
        }
        if let Some(iss) = &self.issuer {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        v.set_required_spec_claims(&required);
        let data = jsonwebtoken::decode::<Claims>(token, key.0, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::ExpiredSignature => "expired".to_string(),
                ErrorKind::ImmatureSignature => "not valid yet (nbf)".to_string(),
                ErrorKind::InvalidSignature => "wrongly signed".to_string(),
                ErrorKind::InvalidAudience => "issued for another audience (aud)".to_string(),
                ErrorKind::InvalidIssuer => "from another issuer (iss)".to_string(),
                ErrorKind::MissingRequiredClaim(c) => format!("the {c} claim is required"),
                _ => "invalid".to_string(),
            }
        })?;
        let sub: String =
            unicode_normalization::UnicodeNormalization::nfc(data.claims.sub.as_str()).collect();
        // The same rule ingest applies to a recipient's user id, so a token can name only
        // a user id that can exist (and a NUL never reaches Postgres).
        let mut violations = notify_core::validate::Violations::default();
        if !violations.check_id("sub", &sub, notify_core::event::MAX_USER_ID_BYTES) {
            let why = violations.0.first().map_or("", |f| f.description.as_str());
            return Err(format!("sub {why}"));
        }
        Ok(sub)
    }
}

/// Per-user request rate limit.
pub type UserLimiter = governor::RateLimiter<
    String,
    governor::state::keyed::HashMapStateStore<String>,
    governor::clock::QuantaClock,
>;

/// Builds the per-user limiter.
pub fn user_limiter(per_second: u32) -> UserLimiter {
    governor::RateLimiter::hashmap(governor::Quota::per_second(
        NonZeroU32::new(per_second.max(1)).expect("above 0"),
    ))
}

/// The authenticated end user.
pub(crate) struct User(pub String);

impl FromRequestParts<AppState> for User {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Response> {
        let unauthorized = |why: String| {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "Authorization",
                &format!("a valid Bearer token is required ({why})"),
            );
            r.headers_mut().insert(
                "www-authenticate",
                axum::http::HeaderValue::from_static("Bearer"),
            );
            r
        };
        let token = parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| unauthorized("missing".to_string()))?;
        let user = app
            .inbox
            .verifier
            .verify(token.trim())
            .map_err(unauthorized)?;
        if let Err(not_until) = app.inbox.limiter.check_key(&user) {
            use governor::clock::Clock;
            let wait = not_until.wait_time_from(governor::clock::QuantaClock::default().now());
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "",
                "too many requests for this user; slow down",
            );
            r.headers_mut().insert(
                "retry-after",
                axum::http::HeaderValue::from(wait.as_secs().max(1)),
            );
            return Err(r);
        }
        Ok(User(user))
    }
}

/// The inbox routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/inbox/notifications", get(list))
        .route("/v1/inbox/unread-count", get(unread_count))
        .route(
            "/v1/inbox/notifications/{id}/read",
            post(|s, u, p| change(s, u, p, InboxStatus::Read)),
        )
        .route(
            "/v1/inbox/notifications/{id}/unread",
            post(|s, u, p| change(s, u, p, InboxStatus::Unread)),
        )
        .route(
            "/v1/inbox/notifications/{id}/archive",
            post(|s, u, p| change(s, u, p, InboxStatus::Archived)),
        )
        .route(
            "/v1/inbox/notifications/{id}/unarchive",
            post(|s, u, p| change(s, u, p, InboxStatus::Read)),
        )
        .route("/v1/inbox/read-all", post(read_all))
        .route("/v1/inbox/stream", get(stream))
        .route(
            "/v1/inbox/preferences",
            get(get_preferences).put(put_preference),
        )
        .route("/v1/inbox/quiet-hours", axum::routing::put(put_quiet_hours))
        .route("/v1/inbox/devices", post(register_device))
        .route(
            "/v1/inbox/devices/{id}",
            axum::routing::delete(unregister_device),
        )
        .method_not_allowed_fallback(method_not_allowed)
}

/// A known inbox path asked with a method it does not serve: 405 naming the methods it
/// does (axum adds the `Allow` header to every 405).
async fn method_not_allowed(
    method: axum::http::Method,
    path: Option<axum::extract::MatchedPath>,
) -> Response {
    let path = path.as_ref().map_or("", |p| p.as_str());
    let allowed: Vec<String> = ROUTES
        .iter()
        .filter(|(_, p)| *p == path)
        .map(|(m, _)| m.to_uppercase())
        .collect();
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method",
        &format!(
            "{method} is not served here; use {}",
            if allowed.is_empty() {
                "another method".to_string()
            } else {
                allowed.join(" or ")
            }
        ),
    )
}

/// The query parameters of a request, each given at most once. Unknown parameters are
/// ignored; a repeated one, or a query that is not `application/x-www-form-urlencoded`
/// UTF-8, is a JSON 400 naming it.
pub(crate) struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                error(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    "query",
                    &format!(
                        "must be a URL-encoded UTF-8 query string: {}",
                        e.body_text()
                    ),
                )
            })?;
        let mut params = HashMap::with_capacity(pairs.len());
        for (name, value) in pairs {
            if params.contains_key(&name) {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    &name,
                    "must be given at most once",
                ));
            }
            params.insert(name, value);
        }
        Ok(Params(params))
    }
}

impl Params {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// The `{id}` path segment as a UUID, or the JSON 400 naming `id`.
fn path_id(id: Result<Path<String>, PathRejection>, what: &str) -> Result<Uuid, Box<Response>> {
    id.ok()
        .and_then(|Path(id)| Uuid::parse_str(&id).ok())
        .ok_or_else(|| {
            Box::new(error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "id",
                &format!("must be {what} id (UUID)"),
            ))
        })
}

/// Every inbox route as (method, path), as `docs/openapi.json` must list them.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/inbox/notifications"),
    ("get", "/v1/inbox/unread-count"),
    ("post", "/v1/inbox/notifications/{id}/read"),
    ("post", "/v1/inbox/notifications/{id}/unread"),
    ("post", "/v1/inbox/notifications/{id}/archive"),
    ("post", "/v1/inbox/notifications/{id}/unarchive"),
    ("post", "/v1/inbox/read-all"),
    ("get", "/v1/inbox/stream"),
    ("get", "/v1/inbox/preferences"),
    ("put", "/v1/inbox/preferences"),
    ("put", "/v1/inbox/quiet-hours"),
    ("post", "/v1/inbox/devices"),
    ("delete", "/v1/inbox/devices/{id}"),
];

/// Parses a JSON body into `T`, or the JSON 400/413 answer naming the problem.
fn json_body<T: serde::de::DeserializeOwned>(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<T, Box<Response>> {
    let body = body.map_err(|e| Box::new(crate::body_error(e)))?;
    parse_json(&body)
}

/// Parses `body` into `T`. Text that is not JSON is reported as `body`; a value of the
/// wrong type, a missing field or an unknown one by its path (`enabled`,
/// `windows[0].start`, `web_push.keys.auth`).
fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response>> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = serde_path_to_error::deserialize::<_, T>(&mut de)
        .map_err(|e| (e.path().to_string(), e.into_inner()))
        .and_then(|v| de.end().map(|()| v).map_err(|e| (".".to_string(), e)));
    parsed.map_err(|(path, e)| {
        if !e.is_data() {
            return Box::new(error(
                StatusCode::BAD_REQUEST,
                "invalid_body",
                "body",
                &format!("must be JSON of the documented shape: {e}"),
            ));
        }
        let message = e.to_string();
        // serde names a missing or unknown field in the message, at its parent's path.
        let named = ["missing field `", "unknown field `"].iter().find_map(|p| {
            message
                .strip_prefix(p)
                .and_then(|rest| rest.split_once('`'))
                .map(|(name, _)| name.to_string())
        });
        let field = match (path.as_str(), named) {
            (".", Some(name)) => name,
            (parent, Some(name)) if !parent.ends_with(&name) => format!("{parent}.{name}"),
            (".", None) => "body".to_string(),
            (path, _) => path.to_string(),
        };
        let rule = message
            .rsplit_once(" at line ")
            .map_or(message.as_str(), |(m, _)| m);
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            &field,
            rule,
        ))
    })
}

/// A 400 naming the first bad field, with every violation listed.
fn violations(v: Vec<notify_core::validate::FieldViolation>) -> Response {
    let first = &v[0];
    let all: Vec<Value> = v
        .iter()
        .map(|f| json!({"field": f.field, "message": f.description}))
        .collect();
    let body = json!({"error": {
        "code": "invalid_argument",
        "message": first.description,
        "field": first.field,
        "violations": all,
    }});
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

/// `GET /v1/inbox/preferences`: the user's settings, quiet hours and time zone.
async fn get_preferences(State(app): State<AppState>, User(user): User) -> Response {
    match notify_store::catalog::get_preferences(&app.pool, &user).await {
        Ok(Some(p)) => Json(json!({
            "preferences": p.preferences.iter().map(|(t, c, on)| json!({"type": t, "channel": c, "enabled": on})).collect::<Vec<_>>(),
            "quiet_hours": p.quiet_hours,
            "timezone": p.timezone,
        }))
        .into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "not_found", "user", "no recipient with this id"),
        Err(e) => db_error(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PreferenceBody {
    #[serde(rename = "type")]
    type_key: String,
    channel: String,
    enabled: bool,
}

/// `PUT /v1/inbox/preferences` `{"type", "channel", "enabled"}` (`*` for every type or
/// every channel, not both).
async fn put_preference(
    State(app): State<AppState>,
    User(user): User,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let b: PreferenceBody = match json_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let mut v = notify_core::validate::Violations::default();
    let channel = notify_core::validate::check_preference(&mut v, &b.type_key, &b.channel);
    if let Err(v) = v.into_result(()) {
        return violations(v);
    }
    if b.type_key != "*" {
        match notify_store::catalog::get_type(&app.pool, &b.type_key).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                return error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "type",
                    "no such notification type",
                );
            }
            Err(e) => return db_error(e),
        }
    }
    match notify_store::catalog::set_preference(&app.pool, &user, &b.type_key, channel, b.enabled)
        .await
    {
        Ok(()) => get_preferences(State(app), User(user)).await,
        Err(e) => db_error(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QuietBody {
    windows: Vec<notify_core::quiet::QuietWindow>,
}

/// `PUT /v1/inbox/quiet-hours` `{"windows": [{"start": "22:00", "end": "07:00",
/// "channels": []}]}` (an empty list removes them).
async fn put_quiet_hours(
    State(app): State<AppState>,
    User(user): User,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let b: QuietBody = match json_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let mut v = notify_core::validate::Violations::default();
    notify_core::quiet::check_windows(&mut v, &b.windows);
    if let Err(v) = v.into_result(()) {
        return violations(v);
    }
    match notify_store::catalog::set_quiet_hours(&app.pool, &user, &b.windows).await {
        Ok(()) => get_preferences(State(app), User(user)).await,
        Err(notify_store::StoreError::NotFound(_)) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "user",
            "no recipient with this id",
        ),
        Err(e) => db_error(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceBody {
    platform: String,
    #[serde(default)]
    token: String,
    #[serde(default)]
    web_push: Option<WebPushBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebPushBody {
    endpoint: String,
    keys: WebPushKeys,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebPushKeys {
    p256dh: String,
    auth: String,
}

/// `POST /v1/inbox/devices` `{"platform": "fcm"|"apns", "token"}` or `{"platform":
/// "webpush", "web_push": <PushSubscription.toJSON()>}`: registers (or re-activates) the
/// user's device; answers `{"endpoint_id"}`.
async fn register_device(
    State(app): State<AppState>,
    User(user): User,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let b: DeviceBody = match json_body(body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let mut v = notify_core::validate::Violations::default();
    let web_push = b.web_push.as_ref().map(|w| {
        (
            w.endpoint.as_str(),
            w.keys.p256dh.as_str(),
            w.keys.auth.as_str(),
        )
    });
    let (token, subscription) =
        notify_core::validate::check_endpoint(&mut v, &b.platform, &b.token, web_push);
    if let Err(v) = v.into_result(()) {
        return violations(v);
    }
    match notify_store::catalog::register_endpoint(
        &app.pool,
        &user,
        &b.platform,
        &token,
        subscription.as_ref(),
    )
    .await
    {
        Ok(id) => (StatusCode::CREATED, Json(json!({"endpoint_id": id}))).into_response(),
        Err(notify_store::StoreError::NotFound(_)) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "user",
            "no recipient with this id",
        ),
        Err(e) => db_error(e),
    }
}

/// `DELETE /v1/inbox/devices/{id}`: the user's device stops getting push (idempotent).
async fn unregister_device(
    State(app): State<AppState>,
    User(user): User,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    let id = match path_id(id, "an endpoint") {
        Ok(id) => id,
        Err(r) => return *r,
    };
    match inbox::revoke_own_endpoint(&app.pool, &user, id).await {
        Ok(Some(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "not_found", "id", "no such device"),
        Err(e) => db_error(e),
    }
}

fn db_error(e: notify_store::StoreError) -> Response {
    tracing::error!(error = %e, "database error");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "",
        "the database is unavailable; try again",
    )
}

/// "Today", "Yesterday" or "Earlier" for `at`, in `tz`, seen at `now`.
pub fn group_label(at: DateTime<Utc>, now: DateTime<Utc>, tz: chrono_tz::Tz) -> &'static str {
    let day = at.with_timezone(&tz).date_naive();
    let today = now.with_timezone(&tz).date_naive();
    if day >= today {
        "Today"
    } else if Some(day) == today.pred_opt() {
        "Yesterday"
    } else {
        "Earlier"
    }
}

fn item_json(i: &InboxItem, now: DateTime<Utc>, tz: chrono_tz::Tz) -> Value {
    let mut v = serde_json::to_value(i).unwrap_or_default();
    v["seq"] = json!(i.seq);
    v["group"] = json!(group_label(i.created_at, now, tz));
    v
}

fn encode_cursor(i: &InboxItem) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{}", i.created_at.timestamp_micros(), i.id))
}

fn decode_cursor(c: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(c).ok()?).ok()?;
    let (micros, id) = text.split_once(':')?;
    Some((
        DateTime::from_timestamp_micros(micros.parse().ok()?)?,
        Uuid::parse_str(id).ok()?,
    ))
}

async fn tz_of(app: &AppState, user: &str) -> chrono_tz::Tz {
    inbox::timezone_of(&app.pool, user)
        .await
        .ok()
        .and_then(|t| notify_core::validate::parse_timezone(&t))
        .unwrap_or(chrono_tz::Asia::Bangkok)
}

/// `GET /v1/inbox/notifications?status=unread|read|archived&limit=1..100&cursor=`.
async fn list(State(app): State<AppState>, User(user): User, q: Params) -> Response {
    let filter = match q.get("status") {
        None | Some("") => Filter::Inbox,
        Some("unread") => Filter::Unread,
        Some("read") => Filter::Read,
        Some("archived") => Filter::Archived,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "status",
                "must be unread, read or archived",
            );
        }
    };
    let limit = match q.get("limit").map(str::parse::<i64>) {
        None => 20,
        Some(Ok(n)) if (1..=MAX_PAGE).contains(&n) => n,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "limit",
                "must be a whole number from 1 to 100",
            );
        }
    };
    let after = match q.get("cursor") {
        None | Some("") => None,
        Some(c) => match decode_cursor(c) {
            Some(k) => Some(k),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_argument",
                    "cursor",
                    "must be a next_cursor from this API",
                );
            }
        },
    };
    let items = match inbox::list(&app.pool, &user, filter, after, limit + 1).await {
        Ok(i) => i,
        Err(e) => return db_error(e),
    };
    let more = items.len() as i64 > limit;
    let items = &items[..items.len().min(limit as usize)];
    let (now, tz) = (Utc::now(), tz_of(&app, &user).await);
    Json(json!({
        "items": items.iter().map(|i| item_json(i, now, tz)).collect::<Vec<_>>(),
        "next_cursor": if more { items.last().map(encode_cursor) } else { None },
    }))
    .into_response()
}

/// `GET /v1/inbox/unread-count`.
async fn unread_count(State(app): State<AppState>, User(user): User) -> Response {
    match inbox::unread_count(&app.pool, &user).await {
        Ok(n) => Json(json!({"unread": n})).into_response(),
        Err(e) => db_error(e),
    }
}

async fn change(
    State(app): State<AppState>,
    User(user): User,
    id: Result<Path<String>, PathRejection>,
    status: InboxStatus,
) -> Response {
    let id = match path_id(id, "a notification") {
        Ok(id) => id,
        Err(r) => return *r,
    };
    match inbox::set_status(&app.pool, &user, id, status).await {
        Ok(Some(item)) => {
            let tz = tz_of(&app, &user).await;
            Json(item_json(&item, Utc::now(), tz)).into_response()
        }
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            "id",
            "no such notification",
        ),
        Err(e) => db_error(e),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReadAll {
    #[serde(default)]
    up_to_seq: Option<i64>,
}

/// `POST /v1/inbox/read-all` `{"up_to_seq": N}` (optional): marks read every unread item
/// up to the newest change the client has seen, so one that arrives meanwhile stays
/// unread.
async fn read_all(
    State(app): State<AppState>,
    User(user): User,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return crate::body_error(e),
    };
    let req: ReadAll = if body.iter().all(u8::is_ascii_whitespace) {
        ReadAll::default()
    } else {
        match parse_json(&body) {
            Ok(r) => r,
            Err(r) => return *r,
        }
    };
    let marked = match inbox::read_all(&app.pool, &user, req.up_to_seq).await {
        Ok(n) => n,
        Err(e) => return db_error(e),
    };
    match inbox::unread_count(&app.pool, &user).await {
        Ok(unread) => Json(json!({"marked_read": marked, "unread": unread})).into_response(),
        Err(e) => db_error(e),
    }
}

/// Fans Postgres `inbox` notifications (`"<user> <seq>"`) out to the streams of this
/// replica. Runs until the process ends; the listener reconnects by itself.
pub async fn listen(pool: notify_store::PgPool, hub: tokio::sync::broadcast::Sender<String>) {
    loop {
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "inbox LISTEN failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(e) = listener.listen("inbox").await {
            tracing::warn!(error = %e, "inbox LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        loop {
            match listener.recv().await {
                Ok(n) => {
                    let user = n
                        .payload()
                        .rsplit_once(' ')
                        .map_or("", |(u, _)| u)
                        .to_string();
                    let _ = hub.send(user);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "inbox LISTEN lost; reconnecting");
                    // Streams catch up on their own timer meanwhile.
                    break;
                }
            }
        }
    }
}

/// `GET /v1/inbox/stream`: Server-Sent Events (see the module docs).
async fn stream(
    State(app): State<AppState>,
    User(user): User,
    headers: HeaderMap,
    q: Params,
) -> Response {
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .or(q.get("last_event_id"))
        .map(str::to_string);
    let mut last = match resume.as_deref().map(str::parse::<i64>) {
        Some(Ok(n)) if n >= 0 => n,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "Last-Event-ID",
                "must be an event id from this stream",
            );
        }
        None => match inbox::latest_seq(&app.pool, &user).await {
            Ok(n) => n,
            Err(e) => return db_error(e),
        },
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(64);
    let mut hub = app.hub.subscribe();
    let app2 = app.clone();
    tokio::spawn(async move {
        let tz = tz_of(&app2, &user).await;
        let mut first = true;
        loop {
            let changes = inbox::changes_since(&app2.pool, &user, last, 500)
                .await
                .unwrap_or_default();
            let any = !changes.is_empty();
            for item in changes {
                last = item.seq;
                let ev = Event::default()
                    .id(item.seq.to_string())
                    .event("notification")
                    .json_data(item_json(&item, Utc::now(), tz))
                    .unwrap_or_default();
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            if any || first {
                first = false;
                let n = inbox::unread_count(&app2.pool, &user).await.unwrap_or(0);
                let ev = Event::default()
                    .event("unread_count")
                    .json_data(json!({"unread": n}))
                    .unwrap_or_default();
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            // Wake on this user's change, or every 15 s to catch up after a lost LISTEN.
            let deadline = tokio::time::sleep(Duration::from_secs(15));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut deadline => break,
                    _ = tx.closed() => return,
                    _ = app2.shutdown.cancelled() => return,
                    m = hub.recv() => match m {
                        Ok(u) if u == user => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        }
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Shared state for the inbox.
pub struct InboxState {
    /// Token verification.
    pub verifier: Verifier,
    /// Per-user rate limit.
    pub limiter: UserLimiter,
}

/// Builds [`InboxState`] from settings.
pub fn state(cfg: &InboxConfig) -> Result<Arc<InboxState>, String> {
    Ok(Arc::new(InboxState {
        verifier: Verifier::new(cfg)?,
        limiter: user_limiter(cfg.rate_per_user),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_labels_follow_the_users_calendar() {
        let bkk = chrono_tz::Asia::Bangkok;
        let now: DateTime<Utc> = "2026-11-30T18:00:00Z".parse().unwrap(); // 01:00 Dec 1 in Bangkok
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        assert_eq!(group_label(at("2026-11-30T17:30:00Z"), now, bkk), "Today"); // 00:30 Dec 1
        assert_eq!(
            group_label(at("2026-11-30T16:30:00Z"), now, bkk),
            "Yesterday"
        ); // 23:30 Nov 30
        assert_eq!(group_label(at("2026-11-29T16:30:00Z"), now, bkk), "Earlier");
        // The same instants in UTC would all be "Today" or "Yesterday" differently.
        assert_eq!(
            group_label(at("2026-11-30T16:30:00Z"), now, chrono_tz::UTC),
            "Today"
        );
    }

    fn bad_field(body: &str) -> String {
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Outer {
            enabled: bool,
            #[serde(default)]
            windows: Vec<Inner>,
        }
        #[derive(Deserialize, Debug)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Inner {
            start: String,
        }
        let r = *parse_json::<Outer>(body.as_bytes()).unwrap_err();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = rt
            .block_on(axum::body::to_bytes(r.into_body(), 1 << 16))
            .unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        v["error"]["field"].as_str().unwrap().to_string()
    }

    #[test]
    fn json_errors_name_the_field_by_its_path() {
        assert_eq!(bad_field("{not json"), "body");
        assert_eq!(bad_field(r#"{"enabled": true} x"#), "body");
        assert_eq!(bad_field(r#"{"enabled": "yes"}"#), "enabled");
        assert_eq!(bad_field(r#"{}"#), "enabled");
        assert_eq!(bad_field(r#"{"enabled": true, "colour": 1}"#), "colour");
        assert_eq!(
            bad_field(r#"{"enabled": true, "windows": [{"start": "x"}, {"start": 1}]}"#),
            "windows[1].start"
        );
        assert_eq!(
            bad_field(r#"{"enabled": true, "windows": [{}]}"#),
            "windows[0].start"
        );
        assert_eq!(
            bad_field(r#"{"enabled": true, "windows": [{"start": "x", "end": 1}]}"#),
            "windows[0].end"
        );
        assert_eq!(bad_field("[]"), "body");
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let i = InboxItem {
            id: Uuid::from_u128(7),
            type_key: "t".into(),
            title: String::new(),
            body: String::new(),
            url: None,
            data: json!({}),
            status: InboxStatus::Unread,
            created_at: "2026-11-30T18:00:00.123456Z".parse().unwrap(),
            updated_at: Utc::now(),
            item_count: 1,
            seq: 1,
        };
        assert_eq!(
            decode_cursor(&encode_cursor(&i)),
            Some((i.created_at, i.id))
        );
        assert_eq!(decode_cursor("nope"), None);
        assert_eq!(decode_cursor(""), None);
    }
}
