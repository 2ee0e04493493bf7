//! Local stand-in for the HTTP providers (tests and the demo only). It speaks the
//! documented request and answer shapes, checks auth headers and bodies, records every
//! request, and injects faults on demand.
//!
//! Provider endpoints:
//! - `POST /v2/bot/message/push`: LINE Messaging API push (bearer channel token,
//!   `X-Line-Retry-Key` dedup with 409 + `x-line-accepted-request-id`, 1 to 5 messages,
//!   text at most 5,000 UTF-16 units, `to` a LINE user id);
//!   `POST /v2/bot/message/multicast`: the same with `to` 1 to 500 user ids, answered `{}`.
//! - `POST /token`: Google OAuth2 JWT-bearer grant (RFC 7523) for the FCM service account;
//!   the assertion must be RS256-signed by the configured key.
//! - `POST /v1/projects/{project}/messages:send`: FCM HTTP v1 send (bearer token from
//!   `/token`); tokens starting with `unregistered` answer 404 UNREGISTERED.
//! - `POST /3/device/{token}`: APNs, HTTP/2 only (h2c here); the `authorization: bearer`
//!   provider token must be an ES256 JWT with the configured `kid` and `iss`, at most an
//!   hour old; `apns-topic`, `apns-push-type`, `apns-priority`, `apns-expiration` and
//!   `apns-collapse-id` are checked, payloads over 4,096 bytes get 413; device tokens
//!   `unregistered-<millis>-...` answer 410 with that `timestamp`, `bad-...` 400
//!   BadDeviceToken.
//! - `POST /webpush/{path}`: a Web Push service (RFC 8030) for the subscriptions issued by
//!   `POST /_sim/webpush/subscriptions` (endpoint `https://host/{path}`). It requires
//!   `Authorization: vapid t=<ES256 JWT>, k=<key>` with `aud` = the endpoint's origin,
//!   `exp` within 24 hours and a `mailto:`/`https:` `sub` (401 otherwise; 403 when `k` is
//!   not the subscription's application server key), `TTL`, a valid `Urgency` and `Topic`,
//!   `Content-Encoding: aes128gcm` and at most 4,096 bytes (413); it decrypts the body
//!   with the subscription's private key and records the plaintext. Unknown subscriptions
//!   get 404, unsubscribed ones 410; success is 201 with a `Location`.
//!
//! Control endpoints:
//! - `GET /_sim/health`; `GET /_sim/requests?provider=line|fcm|oauth|apns|webpush` (recorded
//!   requests, oldest first); `DELETE /_sim/requests`;
//! - `POST /_sim/webpush/subscriptions` `{"endpoint", "application_server_key"?}`: issues a
//!   subscription, answering `{"endpoint", "keys": {"p256dh", "auth"}}`;
//!   `POST /_sim/webpush/unsubscribe` `{"endpoint"}`: later pushes to it get 410;
//! - `POST /_sim/line/webhook` `{"url", "events": [...]}`: sends a LINE webhook to `url` as
//!   LINE does (`{"destination", "events"}`, signed with the channel secret in
//!   `X-Line-Signature`; `"signature"` in the body overrides it, for tests of forgeries),
//!   answering `{"status", "body"}` of the receiver's reply;
//! - `POST /_sim/faults` with a [`Fault`]; `DELETE /_sim/faults`;
//! - `DELETE /_sim/tokens`: revokes every FCM access token issued so far;
//! - `POST /_sim/latency` `{"provider", "min_ms", "max_ms"}`: random latency; `DELETE` clears.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

pub mod smtp;
mod webpush;

/// Simulator settings.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Channel access token LINE requests must carry.
    pub line_channel_token: String,
    /// Channel secret that signs the webhooks the simulator sends (`X-Line-Signature`).
    pub line_channel_secret: String,
    /// PEM public key of the FCM service account (verifies `/token` assertions).
    pub fcm_public_key_pem: String,
    /// Project id FCM sends must name.
    pub fcm_project_id: String,
    /// Service-account email the assertion's `iss` must equal.
    pub fcm_client_email: String,
    /// APNs: PEM public key matching the `.p8` signing key (empty: APNs answers 403).
    pub apns_public_key_pem: String,
    /// APNs key id the provider token's `kid` must equal.
    pub apns_key_id: String,
    /// APNs team id the provider token's `iss` must equal.
    pub apns_team_id: String,
    /// Bundle id `apns-topic` must equal.
    pub apns_topic: String,
}

/// A recorded request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recorded {
    /// `line`, `fcm`, `oauth`, `apns` or `webpush`.
    pub provider: String,
    /// Request path.
    pub path: String,
    /// Request headers (lowercase names; repeated headers joined with ", ").
    pub headers: HashMap<String, String>,
    /// JSON body, or the body text as a JSON string when it is not JSON.
    pub body: Value,
    /// Status the simulator answered.
    pub status: u16,
    /// RFC 3339 time of arrival.
    pub received_at: String,
}

/// A fault to inject: the next matching requests get this answer instead of the normal
/// one (after auth checks).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    /// `line`, `fcm`, `apns` or `webpush`.
    pub provider: String,
    /// Only requests whose target (LINE `to`, FCM `message.token`, APNs device token, Web
    /// Push endpoint URL) contains this.
    #[serde(default)]
    pub target_contains: Option<String>,
    /// HTTP status to answer.
    pub status: u16,
    /// Body to answer.
    #[serde(default)]
    pub body: Value,
    /// `Retry-After` seconds to send.
    #[serde(default)]
    pub retry_after: Option<u64>,
    /// Delay before answering, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// How many requests it applies to; `None` = until cleared.
    #[serde(default)]
    pub times: Option<u32>,
    /// Chance in `[0, 1]` that a matching request gets the fault; `None` = always.
    #[serde(default)]
    pub probability: Option<f64>,
}

/// Body of `POST /_sim/latency`: every answer of `provider` waits a random time in
/// `[min_ms, max_ms]`.
#[derive(Debug, Deserialize)]
struct LatencyRequest {
    provider: String,
    min_ms: u64,
    max_ms: u64,
}

#[derive(Default)]
struct Inner {
    requests: Vec<Recorded>,
    faults: Vec<Fault>,
    /// LINE retry keys already accepted -> the request id that accepted them.
    line_accepted: HashMap<String, String>,
    /// Access tokens handed out by `/token`.
    access_tokens: HashSet<String>,
    /// Random latency per provider.
    latency: HashMap<String, (u64, u64)>,
    /// Web Push subscriptions issued, by endpoint path.
    webpush_subscriptions: HashMap<String, webpush::Subscription>,
}

#[derive(Clone)]
struct Sim {
    cfg: Arc<SimConfig>,
    inner: Arc<Mutex<Inner>>,
}

impl Sim {
    fn record(&self, provider: &str, path: &str, headers: &HeaderMap, body: &Value, status: u16) {
        let headers = headers
            .iter()
            .fold(HashMap::<String, String>::new(), |mut m, (k, v)| {
                let v = String::from_utf8_lossy(v.as_bytes()).to_string();
                m.entry(k.as_str().to_string())
                    .and_modify(|e| {
                        e.push_str(", ");
                        e.push_str(&v)
                    })
                    .or_insert(v);
                m
            });
        self.inner
            .lock()
            .expect("sim lock")
            .requests
            .push(Recorded {
                provider: provider.into(),
                path: path.into(),
                headers,
                body: body.clone(),
                status,
                received_at: chrono::Utc::now().to_rfc3339(),
            });
    }

    fn take_fault(&self, provider: &str, target: &str) -> Option<Fault> {
        let mut inner = self.inner.lock().expect("sim lock");
        let idx = inner.faults.iter().position(|f| {
            f.provider == provider
                && f.times != Some(0)
                && f.target_contains
                    .as_deref()
                    .is_none_or(|t| target.contains(t))
                && f.probability.is_none_or(|p| rand::random::<f64>() < p)
        })?;
        let f = &mut inner.faults[idx];
        if let Some(n) = f.times.as_mut() {
            *n -= 1;
        }
        Some(f.clone())
    }
}

impl Sim {
    /// Sleeps for the provider's configured random latency, if any.
    async fn latency(&self, provider: &str) {
        let range = self
            .inner
            .lock()
            .expect("sim lock")
            .latency
            .get(provider)
            .copied();
        if let Some((min, max)) = range {
            let ms = if max > min {
                min + rand::random::<u64>() % (max - min + 1)
            } else {
                min
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

/// Builds the simulator's router.
pub fn router(cfg: SimConfig) -> Router {
    let sim = Sim {
        cfg: Arc::new(cfg),
        inner: Arc::default(),
    };
    Router::new()
        .route("/_sim/health", get(|| async { "ok" }))
        .route("/_sim/requests", get(list_requests).delete(clear_requests))
        .route("/_sim/faults", post(add_fault).delete(clear_faults))
        .route("/_sim/latency", post(set_latency).delete(clear_latency))
        .route("/_sim/tokens", axum::routing::delete(revoke_tokens))
        .route("/v2/bot/message/push", post(line_push))
        .route("/v2/bot/message/multicast", post(line_multicast))
        .route("/token", post(oauth_token))
        .route("/v1/projects/{project}/messages:send", post(fcm_send))
        .route("/3/device/{token}", post(apns_send))
        .route("/_sim/webpush/subscriptions", post(webpush::subscribe))
        .route("/_sim/webpush/unsubscribe", post(webpush::unsubscribe))
        .route("/webpush/{*path}", post(webpush::push))
        .route("/_sim/line/webhook", post(send_line_webhook))
        .with_state(sim)
}

/// Serves the simulator on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cfg: SimConfig,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Without TCP_NODELAY, a reply written in two parts waits for the client's delayed
    // ACK (~40 ms), which would be counted as provider latency.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router(cfg))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[derive(Deserialize)]
struct ProviderFilter {
    provider: Option<String>,
}

async fn list_requests(
    State(sim): State<Sim>,
    Query(q): Query<ProviderFilter>,
) -> Json<Vec<Recorded>> {
    let inner = sim.inner.lock().expect("sim lock");
    Json(
        inner
            .requests
            .iter()
            .filter(|r| q.provider.as_deref().is_none_or(|p| r.provider == p))
            .cloned()
            .collect(),
    )
}

async fn clear_requests(State(sim): State<Sim>) -> StatusCode {
    let mut inner = sim.inner.lock().expect("sim lock");
    inner.requests.clear();
    inner.line_accepted.clear();
    StatusCode::NO_CONTENT
}

async fn add_fault(State(sim): State<Sim>, Json(f): Json<Fault>) -> StatusCode {
    sim.inner.lock().expect("sim lock").faults.push(f);
    StatusCode::CREATED
}

async fn set_latency(State(sim): State<Sim>, Json(l): Json<LatencyRequest>) -> StatusCode {
    if l.max_ms < l.min_ms {
        return StatusCode::BAD_REQUEST;
    }
    sim.inner
        .lock()
        .expect("sim lock")
        .latency
        .insert(l.provider, (l.min_ms, l.max_ms));
    StatusCode::CREATED
}

async fn clear_latency(State(sim): State<Sim>) -> StatusCode {
    sim.inner.lock().expect("sim lock").latency.clear();
    StatusCode::NO_CONTENT
}

/// Revokes every FCM access token handed out so far (as a key rotation would).
async fn revoke_tokens(State(sim): State<Sim>) -> StatusCode {
    sim.inner.lock().expect("sim lock").access_tokens.clear();
    StatusCode::NO_CONTENT
}

async fn clear_faults(State(sim): State<Sim>) -> StatusCode {
    sim.inner.lock().expect("sim lock").faults.clear();
    StatusCode::NO_CONTENT
}

fn json_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into()))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn answer(status: u16, body: Value, extra: &[(&'static str, String)]) -> Response {
    let mut resp = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Json(body),
    )
        .into_response();
    for (k, v) in extra {
        if let Ok(v) = HeaderValue::from_str(v) {
            resp.headers_mut().insert(*k, v);
        }
    }
    resp
}

async fn apply_fault(f: Fault, extra: Vec<(&'static str, String)>) -> Response {
    if f.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.delay_ms)).await;
    }
    let mut extra = extra;
    if let Some(s) = f.retry_after {
        extra.push(("retry-after", s.to_string()));
    }
    answer(f.status, f.body, &extra)
}

fn is_line_user_id(s: &str) -> bool {
    s.len() == 33 && s.starts_with('U') && s[1..].chars().all(|c| c.is_ascii_hexdigit())
}

/// Checks a LINE push (`to` one user id) or multicast (`to` 1 to 500 user ids) body;
/// `Err` carries LINE's 400 answer.
fn check_line_messages(multicast: bool, body: &Value) -> Result<(), Value> {
    let bad = |msg: &str, details: Value| Err(json!({"message": msg, "details": details}));
    let to: Vec<&str> = if multicast {
        match body["to"].as_array() {
            Some(ids) if (1..=500).contains(&ids.len()) => {
                ids.iter().map(|v| v.as_str().unwrap_or("")).collect()
            }
            _ => {
                return bad(
                    "The request body has 1 error(s)",
                    json!([{"message": "Size must be between 1 and 500", "property": "to"}]),
                );
            }
        }
    } else {
        match body["to"].as_str() {
            Some(to) => vec![to],
            None => {
                return bad(
                    "The request body has 1 error(s)",
                    json!([{"message": "must be specified", "property": "to"}]),
                );
            }
        }
    };
    let Some(messages) = body["messages"].as_array() else {
        return bad(
            "The request body has 1 error(s)",
            json!([{"message": "must be specified", "property": "messages"}]),
        );
    };
    if messages.is_empty() || messages.len() > 5 {
        return bad(
            "The request body has 1 error(s)",
            json!([{"message": "Size must be between 1 and 5", "property": "messages"}]),
        );
    }
    for (i, m) in messages.iter().enumerate() {
        if m["type"] != "text" {
            continue;
        }
        let Some(text) = m["text"].as_str() else {
            return bad(
                "The request body has 1 error(s)",
                json!([{"message": "must be specified", "property": format!("messages[{i}].text")}]),
            );
        };
        let units = text.encode_utf16().count();
        if units == 0 || units > 5000 {
            return bad(
                "The request body has 1 error(s)",
                json!([{"message": "Length must be between 0 and 5000", "property": format!("messages[{i}].text")}]),
            );
        }
    }
    if let Some(i) = to.iter().position(|id| !is_line_user_id(id)) {
        if multicast {
            return bad(
                "The request body has 1 error(s)",
                json!([{"message": "The value must be a valid user ID", "property": format!("to[{i}]")}]),
            );
        }
        return bad("Failed to send messages", json!([]));
    }
    Ok(())
}

async fn line_push(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    line_send(sim, headers, body, false).await
}

/// `POST /v2/bot/message/multicast`: up to 500 user ids, answered `{}` as a whole.
async fn line_multicast(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    line_send(sim, headers, body, true).await
}

async fn line_send(
    sim: Sim,
    headers: HeaderMap,
    body: axum::body::Bytes,
    multicast: bool,
) -> Response {
    sim.latency("line").await;
    let body = json_body(&body);
    let request_id = Uuid::new_v4().simple().to_string();
    let mut extra = vec![("x-line-request-id", request_id.clone())];
    let path = if multicast {
        "/v2/bot/message/multicast"
    } else {
        "/v2/bot/message/push"
    };
    let (status, resp) = 'done: {
        if bearer(&headers) != Some(sim.cfg.line_channel_token.as_str()) {
            break 'done (
                401,
                json!({"message": "Authentication failed. Confirm that the access token in the authorization header is valid."}),
            );
        }
        let retry_key = headers
            .get("x-line-retry-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(k) = &retry_key {
            if Uuid::parse_str(k).is_err() {
                break 'done (
                    400,
                    json!({"message": "The value for the 'X-Line-Retry-Key' header is invalid"}),
                );
            }
            let accepted = sim
                .inner
                .lock()
                .expect("sim lock")
                .line_accepted
                .get(k)
                .cloned();
            if let Some(first) = accepted {
                extra.push(("x-line-accepted-request-id", first));
                break 'done (
                    409,
                    json!({"message": "The retry key is already accepted", "sentMessages": []}),
                );
            }
        }
        if let Err(e) = check_line_messages(multicast, &body) {
            break 'done (400, e);
        }
        let target = match &body["to"] {
            Value::Array(ids) => ids
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","),
            to => to.as_str().unwrap_or_default().to_string(),
        };
        let fault = sim.take_fault("line", &target);
        // A (possibly slow) success accepts the retry key as soon as the request arrives.
        if fault
            .as_ref()
            .is_none_or(|f| (200..300).contains(&f.status))
            && let Some(k) = retry_key
        {
            sim.inner
                .lock()
                .expect("sim lock")
                .line_accepted
                .insert(k, request_id.clone());
        }
        if let Some(f) = fault {
            sim.record("line", path, &headers, &body, f.status);
            return apply_fault(f, extra).await;
        }
        if multicast {
            break 'done (200, json!({}));
        }
        let sent: Vec<Value> = body["messages"]
            .as_array()
            .map(|m| m.iter().map(|_| json!({"id": format!("{}", rand_id()), "quoteToken": Uuid::new_v4().to_string()})).collect())
            .unwrap_or_default();
        (200, json!({"sentMessages": sent}))
    };
    sim.record("line", path, &headers, &body, status);
    answer(status, resp, &extra)
}

/// Body of `POST /_sim/line/webhook`.
#[derive(Deserialize)]
struct WebhookRequest {
    url: String,
    events: Vec<Value>,
    #[serde(default)]
    signature: Option<String>,
}

/// Sends a signed LINE webhook (developers.line.biz/en/reference/messaging-api/#webhooks).
async fn send_line_webhook(State(sim): State<Sim>, Json(r): Json<WebhookRequest>) -> Response {
    let body =
        json!({"destination": "U00000000000000000000000000000000", "events": r.events}).to_string();
    let signature = r.signature.unwrap_or_else(|| {
        notify_core::signed::line_signature(&sim.cfg.line_channel_secret, body.as_bytes())
    });
    let sent = reqwest::Client::new()
        .post(&r.url)
        .header("content-type", "application/json; charset=utf-8")
        .header("x-line-signature", signature)
        .header("user-agent", "LineBotWebhook/2.0")
        .body(body)
        .send()
        .await;
    match sent {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            answer(200, json!({"status": status, "body": text}), &[])
        }
        Err(e) => answer(502, json!({"error": e.to_string()}), &[]),
    }
}

fn rand_id() -> u64 {
    let u = Uuid::new_v4().as_u128();
    (u as u64) % 10_000_000_000_000_000
}

#[derive(Deserialize)]
struct GrantClaims {
    iss: String,
    scope: String,
    iat: i64,
    exp: i64,
}

async fn oauth_token(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let form: HashMap<String, String> = url_decode(&String::from_utf8_lossy(&body));
    let recorded = json!(
        form.iter()
            .map(|(k, v)| (
                k.clone(),
                Value::String(if k == "assertion" {
                    format!("{}...", &v[..v.len().min(16)])
                } else {
                    v.clone()
                })
            ))
            .collect::<serde_json::Map<_, _>>()
    );
    let (status, resp) = 'done: {
        if form.get("grant_type").map(String::as_str)
            != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
        {
            break 'done (400, json!({"error": "unsupported_grant_type"}));
        }
        let Some(assertion) = form.get("assertion") else {
            break 'done (
                400,
                json!({"error": "invalid_request", "error_description": "assertion missing"}),
            );
        };
        // Google accepts base64url with or without padding (gcp_auth pads); jsonwebtoken
        // wants none. The signature covers the segments exactly as sent.
        let Some((message, signature)) = assertion.rsplit_once('.') else {
            break 'done (
                400,
                json!({"error": "invalid_grant", "error_description": "malformed JWT"}),
            );
        };
        let key = match DecodingKey::from_rsa_pem(sim.cfg.fcm_public_key_pem.as_bytes()) {
            Ok(key) => key,
            Err(e) => {
                break 'done (
                    500,
                    json!({"error": "server_error", "error_description": e.to_string()}),
                );
            }
        };
        match jsonwebtoken::crypto::verify(
            signature.trim_end_matches('='),
            message.as_bytes(),
            &key,
            Algorithm::RS256,
        ) {
            Ok(true) => {}
            Ok(false) => {
                break 'done (
                    400,
                    json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
                );
            }
            Err(e) => {
                break 'done (
                    400,
                    json!({"error": "invalid_grant", "error_description": format!("Invalid JWT: {e}")}),
                );
            }
        }
        let unpadded = assertion
            .split('.')
            .map(|p| p.trim_end_matches('='))
            .collect::<Vec<_>>()
            .join(".");
        let claims = match jsonwebtoken::dangerous::insecure_decode_claims::<GrantClaims>(&unpadded)
        {
            Ok(c) => c,
            Err(e) => {
                break 'done (
                    400,
                    json!({"error": "invalid_grant", "error_description": format!("Invalid JWT claims: {e}")}),
                );
            }
        };
        let now = chrono::Utc::now().timestamp();
        if claims.exp < now || claims.iat > now + 60 || claims.exp - claims.iat > 3600 {
            break 'done (
                400,
                json!({"error": "invalid_grant", "error_description": "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe."}),
            );
        }
        if claims.iss != sim.cfg.fcm_client_email {
            break 'done (
                400,
                json!({"error": "invalid_grant", "error_description": "Invalid issuer"}),
            );
        }
        if !claims
            .scope
            .split(' ')
            .any(|s| s == "https://www.googleapis.com/auth/firebase.messaging")
        {
            break 'done (400, json!({"error": "invalid_scope"}));
        }
        let token = format!("ya29.sim-{}", Uuid::new_v4().simple());
        sim.inner
            .lock()
            .expect("sim lock")
            .access_tokens
            .insert(token.clone());
        (
            200,
            json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}),
        )
    };
    sim.record("oauth", "/token", &headers, &recorded, status);
    answer(status, resp, &[])
}

fn url_decode(s: &str) -> HashMap<String, String> {
    fn dec(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                        out.push(b);
                        i += 2;
                    } else {
                        out.push(b'%');
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into()
    }
    s.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (dec(k), dec(v)))
        .collect()
}

fn fcm_error(status: u16, rpc_status: &str, message: &str, error_code: &str) -> Value {
    json!({"error": {"code": status, "message": message, "status": rpc_status, "details": [
        {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": error_code}
    ]}})
}

async fn fcm_send(
    State(sim): State<Sim>,
    Path(project): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    sim.latency("fcm").await;
    let body = json_body(&body);
    let path = format!("/v1/projects/{project}/messages:send");
    let (status, resp) = 'done: {
        let authed = bearer(&headers).is_some_and(|t| {
            sim.inner
                .lock()
                .expect("sim lock")
                .access_tokens
                .contains(t)
        });
        if !authed {
            break 'done (
                401,
                json!({"error": {"code": 401, "message": "Request had invalid authentication credentials.", "status": "UNAUTHENTICATED"}}),
            );
        }
        if project != sim.cfg.fcm_project_id {
            break 'done (
                403,
                fcm_error(
                    403,
                    "PERMISSION_DENIED",
                    "Permission denied on project",
                    "SENDER_ID_MISMATCH",
                ),
            );
        }
        let msg = &body["message"];
        let Some(token) = msg["token"].as_str().filter(|t| !t.is_empty()) else {
            break 'done (
                400,
                json!({"error": {"code": 400, "message": "The registration token is not a valid FCM registration token", "status": "INVALID_ARGUMENT", "details": [
                {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field": "message.token", "description": "Invalid registration token"}]}]}}),
            );
        };
        if let Some(data) = msg["data"].as_object()
            && data.values().any(|v| !v.is_string())
        {
            break 'done (
                400,
                fcm_error(
                    400,
                    "INVALID_ARGUMENT",
                    "Invalid value at 'message.data': values must be strings",
                    "INVALID_ARGUMENT",
                ),
            );
        }
        if serde_json::to_vec(msg).map(|b| b.len()).unwrap_or(0) > 4096 {
            break 'done (
                400,
                fcm_error(
                    400,
                    "INVALID_ARGUMENT",
                    "Message is too big",
                    "INVALID_ARGUMENT",
                ),
            );
        }
        if let Some(f) = sim.take_fault("fcm", token) {
            sim.record("fcm", &path, &headers, &body, f.status);
            return apply_fault(f, vec![]).await;
        }
        if token.starts_with("unregistered") {
            break 'done (
                404,
                fcm_error(
                    404,
                    "NOT_FOUND",
                    "Requested entity was not found.",
                    "UNREGISTERED",
                ),
            );
        }
        (
            200,
            json!({"name": format!("projects/{project}/messages/0:{}", rand_id())}),
        )
    };
    sim.record("fcm", &path, &headers, &body, status);
    answer(status, resp, &[])
}

#[derive(Deserialize)]
struct ApnsClaims {
    iss: String,
    iat: i64,
}

/// Checks an APNs provider token (ES256 JWT): `Err(reason)` as APNs would name it.
fn check_apns_token(cfg: &SimConfig, token: &str) -> Result<(), &'static str> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| "InvalidProviderToken")?;
    if header.alg != Algorithm::ES256 || header.kid.as_deref() != Some(cfg.apns_key_id.as_str()) {
        return Err("InvalidProviderToken");
    }
    let key = DecodingKey::from_ec_pem(cfg.apns_public_key_pem.as_bytes())
        .map_err(|_| "InvalidProviderToken")?;
    let (signed, signature) = token.rsplit_once('.').ok_or("InvalidProviderToken")?;
    match jsonwebtoken::crypto::verify(signature, signed.as_bytes(), &key, Algorithm::ES256) {
        Ok(true) => {}
        _ => return Err("InvalidProviderToken"),
    }
    let claims = jsonwebtoken::dangerous::insecure_decode_claims::<ApnsClaims>(token)
        .map_err(|_| "InvalidProviderToken")?;
    if claims.iss != cfg.apns_team_id {
        return Err("InvalidProviderToken");
    }
    let age = chrono::Utc::now().timestamp() - claims.iat;
    if !(-60..=3600).contains(&age) {
        return Err("ExpiredProviderToken");
    }
    Ok(())
}

/// `POST /3/device/{token}`: APNs over HTTP/2 only. Device tokens starting with
/// `unregistered-<millis>-` answer 410 with that timestamp, `bad-` 400 BadDeviceToken.
async fn apns_send(
    State(sim): State<Sim>,
    Path(device): Path<String>,
    request: axum::extract::Request,
) -> Response {
    sim.latency("apns").await;
    let version = request.version();
    let headers = request.headers().clone();
    let bytes = axum::body::to_bytes(request.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let body = json_body(&bytes);
    let path = format!("/3/device/{device}");
    let apns_id = headers
        .get("apns-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| Uuid::new_v4().to_string().to_uppercase());
    let extra = vec![("apns-id", apns_id.clone())];
    let reason = |r: &str| json!({"reason": r});
    let (status, resp) = 'done: {
        if version != axum::http::Version::HTTP_2 {
            break 'done (505, json!({"reason": "APNs speaks HTTP/2 only"}));
        }
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("bearer ")
                    .or_else(|| v.strip_prefix("Bearer "))
            });
        let Some(token) = token else {
            break 'done (403, reason("MissingProviderToken"));
        };
        if let Err(r) = check_apns_token(&sim.cfg, token) {
            break 'done (403, reason(r));
        }
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        match header("apns-topic") {
            None => break 'done (400, reason("MissingTopic")),
            Some(t) if t != sim.cfg.apns_topic => break 'done (400, reason("BadTopic")),
            _ => {}
        }
        if !matches!(
            header("apns-push-type"),
            Some(
                "alert"
                    | "background"
                    | "voip"
                    | "complication"
                    | "fileprovider"
                    | "mdm"
                    | "liveactivity"
            )
        ) {
            break 'done (400, reason("InvalidPushType"));
        }
        if header("apns-priority").is_some_and(|p| !matches!(p, "5" | "10" | "1")) {
            break 'done (400, reason("BadPriority"));
        }
        if header("apns-expiration").is_some_and(|e| e.parse::<i64>().is_err()) {
            break 'done (400, reason("BadExpirationDate"));
        }
        if header("apns-collapse-id").is_some_and(|c| c.len() > 64) {
            break 'done (400, reason("BadCollapseId"));
        }
        if bytes.len() > 4096 {
            break 'done (413, reason("PayloadTooLarge"));
        }
        if !body["aps"].is_object() {
            break 'done (400, reason("PayloadEmpty"));
        }
        if let Some(f) = sim.take_fault("apns", &device) {
            sim.record("apns", &path, &headers, &body, f.status);
            return apply_fault(f, extra).await;
        }
        if let Some(rest) = device.strip_prefix("unregistered-") {
            let ts: i64 = rest
                .split('-')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
            break 'done (410, json!({"reason": "Unregistered", "timestamp": ts}));
        }
        if device.starts_with("bad-") {
            break 'done (400, reason("BadDeviceToken"));
        }
        (200, Value::Null)
    };
    sim.record("apns", &path, &headers, &body, status);
    if status == 200 {
        return (StatusCode::OK, [("apns-id", apns_id)]).into_response();
    }
    answer(status, resp, &extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_body_rules() {
        let ok = json!({"to": "U0123456789abcdef0123456789abcdef", "messages": [{"type": "text", "text": "สวัสดี"}]});
        assert!(check_line_messages(false, &ok).is_ok());
        let too_many = json!({"to": "U0123456789abcdef0123456789abcdef", "messages": vec![json!({"type":"text","text":"a"}); 6]});
        assert!(check_line_messages(false, &too_many).is_err());
        let long = json!({"to": "U0123456789abcdef0123456789abcdef", "messages": [{"type": "text", "text": "😀".repeat(2501)}]});
        assert!(
            check_line_messages(false, &long).is_err(),
            "5,002 UTF-16 units"
        );
        let id = "U0123456789abcdef0123456789abcdef";
        let many = json!({"to": vec![id; 500], "messages": [{"type": "text", "text": "x"}]});
        assert!(check_line_messages(true, &many).is_ok());
        let too_many = json!({"to": vec![id; 501], "messages": [{"type": "text", "text": "x"}]});
        assert!(check_line_messages(true, &too_many).is_err());
        let one_bad = json!({"to": [id, "user-1"], "messages": [{"type": "text", "text": "x"}]});
        assert_eq!(
            check_line_messages(true, &one_bad).unwrap_err()["details"][0]["property"],
            "to[1]"
        );
        let unknown = json!({"to": "user-1", "messages": [{"type": "text", "text": "x"}]});
        assert_eq!(
            check_line_messages(false, &unknown).unwrap_err()["message"],
            "Failed to send messages"
        );
    }

    #[test]
    fn form_decoding() {
        let m = url_decode(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=a.b.c&x=1+2",
        );
        assert_eq!(
            m["grant_type"],
            "urn:ietf:params:oauth:grant-type:jwt-bearer"
        );
        assert_eq!(m["assertion"], "a.b.c");
        assert_eq!(m["x"], "1 2");
    }
}
