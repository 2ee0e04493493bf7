//! Local stand-in for the HTTP providers (tests and the demo only). It speaks the
//! documented request and answer shapes, checks auth headers and bodies, records every
//! request, and injects faults on demand.
//!
//! Provider endpoints:
//! - `POST /v2/bot/message/push`: LINE Messaging API push (bearer channel token,
//!   `X-Line-Retry-Key` dedup with 409 + `x-line-accepted-request-id`, 1 to 5 messages,
//!   text at most 5,000 UTF-16 units, `to` a LINE user id; Flex `altText`, bubble and
//!   carousel sizes, action labels, URI schemes and https image URLs as LINE limits them);
//!   `POST /v2/bot/message/multicast`: the same with `to` 1 to 500 user ids, answered `{}`.
//! - `POST /token`: Google OAuth2 JWT-bearer grant (RFC 7523) for the FCM service account;
//!   the assertion must be RS256-signed by the configured key.
//! - `POST /v1/projects/{project}/messages:send`: FCM HTTP v1 send (bearer token from
//!   `/token`); 400 INVALID_ARGUMENT for a non-string or reserved `data` key, a
//!   non-integer `android.notification.notification_count`, a non-object
//!   `apns.payload.aps` and a message over 4,096 bytes ("Message is too big"); tokens
//!   starting with `unregistered` answer 404 UNREGISTERED.
//! - `POST /3/device/{token}`: APNs, HTTP/2 only (h2c here); the `authorization: bearer`
//!   provider token must be an ES256 JWT with the configured `kid` and `iss`, at most an
//!   hour old; `apns-topic`, `apns-push-type`, `apns-priority`, `apns-expiration` and
//!   `apns-collapse-id` are checked, payloads over 4,096 bytes get 413, a payload without
//!   an `aps` dictionary 400 PayloadEmpty, wrongly typed `aps` keys 400 BadPayload (a
//!   simulator-only reason); device tokens
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
//! - `POST /v2/email/outbound-emails`: Amazon SES v2 `SendEmail` with a raw MIME message
//!   (SigV4 header shape and date checked, the decoded message recorded; [`ses`]).
//!
//! Control endpoints:
//! - `GET /_sim/health`; `GET /_sim/requests?provider=line|fcm|oauth|apns|webpush|ses` (recorded
//!   requests, oldest first); `DELETE /_sim/requests`;
//! - `POST /_sim/webpush/subscriptions` `{"endpoint", "application_server_key"?}`: issues a
//!   subscription, answering `{"endpoint", "keys": {"p256dh", "auth"}}`;
//!   `POST /_sim/webpush/unsubscribe` `{"endpoint"}`: later pushes to it get 410;
//! - `POST /_sim/line/webhook` `{"url", "events": [...]}`: sends a LINE webhook to `url` as
//!   LINE does (`{"destination", "events"}`, signed with the channel secret in
//!   `X-Line-Signature`; `"signature"` in the body overrides it, for tests of forgeries),
//!   answering `{"status", "body"}` of the receiver's reply;
//! - `POST /_sim/ses/notify`: sends an SNS-signed SES bounce or complaint notification to
//!   a URL, or a subscription confirmation ([`ses`]); `GET /_sim/sns/cert.pem`: the certificate it signs with; `GET /_sim/sns/confirm`: its `SubscribeURL`;
//! - `POST /_sim/faults` with a [`Fault`]; `DELETE /_sim/faults`; with the SMTP server
//!   (`SIM_SMTP_ADDR`), `POST /_sim/smtp/fault` `{"reply"}` / `DELETE` ([`router_with_smtp`]);
//! - `DELETE /_sim/tokens`: revokes every FCM access token issued so far;
//! - `POST /_sim/latency` `{"provider", "min_ms", "max_ms"}`: random latency; `DELETE` clears.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Router, body::Bytes};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use uuid::Uuid;

mod apns;
mod faults;
mod google;
mod line;
pub mod ses;
pub mod smtp;
mod webpush;

use faults::apply_fault;
pub use faults::{Fault, Recorded};

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

/// Builds the simulator's router.
pub fn router(cfg: SimConfig) -> Router {
    router_with_smtp(cfg, None)
}

/// [`router`], plus `POST /_sim/smtp/fault` `{"reply": "421 4.3.2 service not available"}`
/// (every later `MAIL FROM` of `smtp` gets that reply, [`smtp::SmtpSim::set_fault`]) and
/// `DELETE /_sim/smtp/fault` when the SMTP server runs.
pub fn router_with_smtp(cfg: SimConfig, smtp: Option<smtp::SmtpSim>) -> Router {
    let smtp_routes = smtp.map(|smtp| {
        #[derive(serde::Deserialize)]
        struct SmtpFault {
            reply: String,
        }
        let (a, b) = (smtp.clone(), smtp);
        Router::new().route(
            "/_sim/smtp/fault",
            post(move |Json(f): Json<SmtpFault>| async move {
                a.set_fault(Some(&f.reply));
                StatusCode::CREATED
            })
            .delete(move || async move {
                b.set_fault(None);
                StatusCode::NO_CONTENT
            }),
        )
    });
    let sim = Sim {
        cfg: Arc::new(cfg),
        inner: Arc::default(),
    };
    Router::new()
        .route("/_sim/health", get(|| async { "ok" }))
        .route(
            "/_sim/requests",
            get(faults::list_requests).delete(faults::clear_requests),
        )
        .route(
            "/_sim/faults",
            post(faults::add_fault).delete(faults::clear_faults),
        )
        .route(
            "/_sim/latency",
            post(faults::set_latency).delete(faults::clear_latency),
        )
        .route("/_sim/tokens", delete(google::revoke_tokens))
        .route(
            "/v2/bot/message/push",
            post(|State(sim): State<Sim>, headers: HeaderMap, body: Bytes| {
                line::send(sim, headers, body, false)
            }),
        )
        .route(
            "/v2/bot/message/multicast",
            post(|State(sim): State<Sim>, headers: HeaderMap, body: Bytes| {
                line::send(sim, headers, body, true)
            }),
        )
        .route("/token", post(google::oauth_token))
        .route(
            "/v1/projects/{project}/messages:send",
            post(google::fcm_send),
        )
        .route("/3/device/{token}", post(apns::apns_send))
        .route("/_sim/webpush/subscriptions", post(webpush::subscribe))
        .route("/_sim/webpush/unsubscribe", post(webpush::unsubscribe))
        .route("/webpush/{*path}", post(webpush::push))
        .route("/_sim/line/webhook", post(line::send_webhook))
        .route("/v2/email/outbound-emails", post(ses::send_email))
        .route("/_sim/sns/cert.pem", get(ses::sns_cert))
        .route("/_sim/sns/confirm", get(ses::sns_confirm))
        .route("/_sim/ses/notify", post(ses::notify))
        .with_state(sim)
        .merge(smtp_routes.unwrap_or_default())
}

/// Serves the simulator on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    cfg: SimConfig,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    serve_with_smtp(listener, cfg, None, shutdown).await
}

/// [`serve`] with the SMTP fault control of [`router_with_smtp`].
pub async fn serve_with_smtp(
    listener: tokio::net::TcpListener,
    cfg: SimConfig,
    smtp: Option<smtp::SmtpSim>,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Without TCP_NODELAY, a reply written in two parts waits for the client's delayed
    // ACK (~40 ms), which would be counted as provider latency.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router_with_smtp(cfg, smtp))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
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

/// The simulator's answer to a `_sim` call that sent a webhook on: 200 with the
/// receiver's status and body text, or 502 with the error when it could not be reached.
async fn relayed(sent: reqwest::Result<reqwest::Response>) -> Response {
    match sent {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            answer(200, json!({"status": status, "body": text}), &[])
        }
        Err(e) => answer(502, json!({"error": e.to_string()}), &[]),
    }
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

fn rand_id() -> u64 {
    let u = Uuid::new_v4().as_u128();
    (u as u64) % 10_000_000_000_000_000
}
