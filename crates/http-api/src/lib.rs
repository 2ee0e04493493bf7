//! The HTTP service (`http-api`): stateless, scaled like the workers. Today it serves the
//! endpoints providers and email clients call back on:
//!
//! - `POST /webhooks/line`: the LINE Messaging API webhook. The raw body must carry a
//!   valid `X-Line-Signature` (base64 HMAC-SHA256 keyed with the channel secret;
//!   developers.line.biz/en/reference/messaging-api/#signature-validation), else 401 and
//!   nothing is recorded. `follow` and `unfollow` events from users update
//!   `line_followers` (newest event timestamp wins, so redeliveries are harmless); LINE
//!   deliveries to a user who unfollowed are then skipped with `line_unfollowed`. A
//!   `postback` event whose `postback.data` is a button of a card the LINE worker built
//!   (`d=<delivery id>&a=<action id>`, [`notify_core::line::parse_postback_data`]) is
//!   recorded as a click of that action on that delivery by the event's `source.userId`
//!   (`delivery_clicks`, source `line`, once per `webhookEventId`, so LINE's redelivery
//!   changes nothing). Other postbacks and event types are acknowledged and ignored.
//!   Answers 200 `{}`.
//! - `POST /webhooks/email/ses`: Amazon SES bounce and complaint notifications through
//!   SNS, signature verified (401 and nothing written otherwise); hard bounces mark the
//!   address undeliverable, complaints and repeated soft bounces suppress
//!   ([`email_events`]).
//! - `GET /unsubscribe?token=…`: a confirmation page (a GET never changes anything, since
//!   mail scanners fetch links); `POST /unsubscribe?token=…` with the body
//!   `List-Unsubscribe=One-Click` (RFC 8058) or from that page turns the token's type off
//!   on email for its user and answers 200 JSON. A token signed more than
//!   `NOTIFY_UNSUBSCRIBE_TTL` ago (60 days) gets 410 and changes nothing: a page saying
//!   the link expired for the GET, `expired_token` JSON for the POST.
//! - `/v1/inbox/...`: the end users' inbox API ([`inbox`], `docs/openapi.json`).
//! - `/console/...`: the operations console ([`console`]).
//! - `GET /inbox-example/`: an example inbox page for integrators (`static/inbox.html`).
//! - `GET /healthz` (alive), `GET /readyz` (Postgres answers, not shutting down) and
//!   `GET /metrics` (Prometheus): see `notify_telemetry::admin`.
//!
//! Errors are JSON: `{"error": {"code", "message", "field"}}` with 400 for bad input, 401
//! for a bad signature, 413 for a body over 1 MiB; every failure goes through
//! [`error::ApiError`].

use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use error::ApiError;
use notify_core::Channel;
use notify_core::config::{Env, Missing};
use notify_core::signed::{TokenError, UnsubscribeToken, line_signature_valid};
use notify_store::PgPool;
use serde::Deserialize;
use serde_json::{Value, json};

/// Largest request body accepted, in bytes.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How long an unsubscribe link works by default: 60 days.
pub const DEFAULT_UNSUBSCRIBE_TTL: std::time::Duration =
    std::time::Duration::from_secs(60 * 86_400);

/// The shortest `NOTIFY_UNSUBSCRIBE_TTL` accepted: 30 days, since CAN-SPAM (15 U.S.C.
/// 7704(a)(3)(A)(ii)) asks that an opt-out link keep working for 30 days after sending.
pub const MIN_UNSUBSCRIBE_TTL: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

pub mod console;
pub mod email_events;
pub mod error;
pub mod inbox;

/// Settings of the HTTP service.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// LINE channel secret (verifies `X-Line-Signature`).
    pub line_channel_secret: String,
    /// Secret that signs unsubscribe tokens (shared with `worker-email`).
    pub unsubscribe_secret: String,
    /// How long an unsubscribe link works after the email was rendered
    /// (`NOTIFY_UNSUBSCRIBE_TTL`, default [`DEFAULT_UNSUBSCRIBE_TTL`], at least 30 days).
    pub unsubscribe_ttl: std::time::Duration,
    /// End-user inbox API settings.
    pub inbox: inbox::InboxConfig,
    /// Origins allowed to call the API from a browser (CORS); empty = none.
    pub cors_origins: Vec<String>,
    /// Operations console settings.
    pub console: console::ConsoleConfig,
    /// Bounce and complaint webhooks ([`email_events`]).
    pub email_events: email_events::EmailEventsConfig,
    /// Which Web Push endpoints a device registration may name
    /// ([`notify_core::links::LinkPolicy::web_push_endpoint`]).
    pub links: notify_core::links::LinkPolicy,
}

impl HttpConfig {
    /// Reads `NOTIFY_LINE_CHANNEL_SECRET` and `NOTIFY_UNSUBSCRIBE_SECRET` (both required),
    /// `NOTIFY_UNSUBSCRIBE_TTL` (1440h = 60 days; 720h to 366d), the inbox settings ([`inbox::InboxConfig::from_env`]) and `NOTIFY_CORS_ORIGINS`
    /// (comma-separated origins, empty = no cross-origin calls), and the link policy
    /// ([`notify_core::links::LinkPolicy::from_env`]: `NOTIFY_WEB_PUSH_HOSTS`,
    /// `NOTIFY_DEV_HTTP_HOSTS`).
    ///
    /// # Errors
    /// [`Missing`] when a required variable is unset; every problem is also recorded in
    /// `env`, for [`Env::finish`].
    pub fn from_env(env: &mut Env) -> Result<Self, Missing> {
        let line_channel_secret = env.required("NOTIFY_LINE_CHANNEL_SECRET");
        let unsubscribe_secret = env.required("NOTIFY_UNSUBSCRIBE_SECRET");
        // Fields are evaluated in the order written: every variable is read before the
        // first `?`, so every problem is recorded.
        Ok(Self {
            unsubscribe_ttl: env.parse_with(
                "NOTIFY_UNSUBSCRIBE_TTL",
                DEFAULT_UNSUBSCRIBE_TTL,
                |s| match notify_core::retry::parse_duration(s) {
                    Ok(d)
                        if (MIN_UNSUBSCRIBE_TTL..=notify_core::retry::MAX_DURATION)
                            .contains(&d) =>
                    {
                        Ok(d)
                    }
                    Ok(_) => Err("must be from 720h (30 days) to 366d".to_string()),
                    Err(e) => Err(e.to_string()),
                },
            ),
            inbox: inbox::InboxConfig::from_env(env),
            console: console::ConsoleConfig::from_env(env),
            email_events: email_events::EmailEventsConfig::from_env(env),
            links: notify_core::links::LinkPolicy::from_env(env),
            cors_origins: env
                .string("NOTIFY_CORS_ORIGINS", "")
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            line_channel_secret: line_channel_secret?,
            unsubscribe_secret: unsubscribe_secret?,
        })
    }
}

#[derive(Clone)]
struct AppState {
    pool: PgPool,
    cfg: std::sync::Arc<HttpConfig>,
    inbox: std::sync::Arc<inbox::InboxState>,
    console: std::sync::Arc<console::ConsoleConfig>,
    /// User ids whose inbox changed, from Postgres `LISTEN inbox`.
    hub: tokio::sync::broadcast::Sender<String>,
    /// Ends live streams when the service stops, so a drain does not wait for clients.
    shutdown: tokio_util::sync::CancellationToken,
}

/// The service's routes, and the sender that wakes inbox streams (fed by
/// [`inbox::listen`]). `Err` when the inbox keys cannot be used.
pub fn router(
    pool: PgPool,
    cfg: HttpConfig,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(Router, tokio::sync::broadcast::Sender<String>), String> {
    router_parts(pool, cfg, shutdown).map(|(r, h, _)| (r, h))
}

type Parts = (
    Router,
    tokio::sync::broadcast::Sender<String>,
    std::sync::Arc<inbox::InboxState>,
);

fn router_parts(
    pool: PgPool,
    cfg: HttpConfig,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<Parts, String> {
    let (hub, _) = tokio::sync::broadcast::channel(1024);
    let inbox_state = inbox::state(&cfg.inbox)?;
    let readiness = {
        let pool = pool.clone();
        notify_telemetry::admin::Readiness::new().with_check("postgres", move || {
            let pool = pool.clone();
            async move { notify_store::ping(&pool).await.map_err(|e| e.to_string()) }
        })
    };
    {
        let (readiness, shutdown) = (readiness.clone(), shutdown.clone());
        tokio::spawn(async move {
            shutdown.cancelled().await;
            readiness.start_draining();
        });
    }
    let state = AppState {
        inbox: inbox_state.clone(),
        console: std::sync::Arc::new(cfg.console.clone()),
        pool,
        cfg: std::sync::Arc::new(cfg),
        hub: hub.clone(),
        shutdown,
    };
    let origins: Vec<axum::http::HeaderValue> = state
        .cfg
        .cors_origins
        .iter()
        .filter_map(|o| o.parse().ok())
        .collect();
    let cors = tower_http::cors::CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([
            axum::http::Method::GET,
            axum::http::Method::POST,
            axum::http::Method::PUT,
            axum::http::Method::DELETE,
        ])
        .allow_headers([
            axum::http::header::AUTHORIZATION,
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderName::from_static("last-event-id"),
        ])
        .max_age(std::time::Duration::from_secs(600));
    let router = Router::new()
        .route("/inbox-example/", get(inbox_example))
        .route("/webhooks/line", post(line_webhook))
        .route(
            "/webhooks/email/{provider}",
            post(email_events::email_webhook),
        )
        .route(
            "/unsubscribe",
            get(unsubscribe_page)
                .post(unsubscribe)
                .layer(axum::middleware::map_response(
                    console::staff::security_headers,
                )),
        )
        .merge(inbox::routes())
        .merge(console::routes())
        .fallback(|| async { ApiError::not_found("path", "no such route") })
        .layer(cors)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
        .merge(notify_telemetry::admin::routes(readiness));
    Ok((router, hub, inbox_state))
}

/// `GET /inbox-example/`: a static page showing how an app uses the inbox API (open it
/// with `#token=<JWT>`).
async fn inbox_example() -> Response {
    (
        [
            (axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                axum::http::header::CONTENT_SECURITY_POLICY,
                // Notification images are https links on the sender's hosts.
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' https: data:",
            ),
        ],
        include_str!("../static/inbox.html"),
    )
        .into_response()
}

/// Serves on `listener` until `shutdown` is cancelled, with the inbox's `LISTEN` task,
/// whose connection comes from the `session` pool of `pools` (one `PgPool` is both).
pub async fn serve(
    listener: tokio::net::TcpListener,
    pools: impl Into<notify_store::Pools>,
    cfg: HttpConfig,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let notify_store::Pools {
        main: pool,
        session,
    } = pools.into();
    let jwks_url = cfg.inbox.jwks_url.clone();
    let (router, hub, inbox_state) =
        router_parts(pool.clone(), cfg, shutdown.clone()).map_err(std::io::Error::other)?;
    let router_jwks = jwks_url.map(|u| (inbox_state, u));
    let listen = tokio::spawn(inbox::listen(session, hub));
    // JWKS by URL: the keys are fetched in the background (first fetch at once).
    let jwks = router_jwks.map(|(state, url)| tokio::spawn(inbox::refresh_jwks(state, url)));
    // The peer address reaches the console's sign-in throttle.
    let served = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move { shutdown.cancelled().await })
    .await;
    listen.abort();
    if let Some(j) = jwks {
        j.abort();
    }
    served
}

/// `POST /webhooks/line`.
async fn line_webhook(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body?;
    let signature = headers
        .get("x-line-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !line_signature_valid(&app.cfg.line_channel_secret, &body, signature) {
        tracing::warn!("LINE webhook with a missing or invalid signature");
        return Err(ApiError::INVALID_LINE_SIGNATURE);
    }
    let parsed: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid_body("body", format!("must be JSON: {e}")))?;
    let Some(events) = parsed["events"].as_array() else {
        return Err(ApiError::invalid_body("events", "must be an array"));
    };
    for (i, ev) in events.iter().enumerate() {
        let following = match ev["type"].as_str() {
            Some("follow") => true,
            Some("unfollow") => false,
            Some("postback") => {
                line_postback(&app, ev).await?;
                continue;
            }
            _ => continue,
        };
        let (Some("user"), Some(user)) = (
            ev["source"]["type"].as_str(),
            ev["source"]["userId"].as_str(),
        ) else {
            continue;
        };
        let Some(at) = ev["timestamp"]
            .as_i64()
            .and_then(chrono::DateTime::from_timestamp_millis)
        else {
            return Err(ApiError::invalid_body(
                format!("events[{i}].timestamp"),
                "must be milliseconds since the epoch",
            ));
        };
        let event_id = ev["webhookEventId"].as_str().unwrap_or("");
        let changed =
            notify_store::catalog::record_line_follow(&app.pool, user, following, at, event_id)
                .await?;
        // The LINE user id is not logged (logs hold no addresses).
        tracing::info!(
            following,
            changed,
            webhook_event_id = event_id,
            "LINE follow state"
        );
    }
    Ok(Json(json!({})))
}

/// Records a LINE `postback` event from a card's button as a click (see the module docs);
/// postbacks that are not of our format, name no LINE delivery of that user, name an
/// action its card did not have, or come without a user or event id, are ignored.
async fn line_postback(app: &AppState, ev: &Value) -> Result<(), ApiError> {
    let data = ev["postback"]["data"].as_str().unwrap_or("");
    let Some((delivery_id, action_id)) = notify_core::line::parse_postback_data(data) else {
        return Ok(());
    };
    let (Some(user), Some(event_id)) = (
        ev["source"]["userId"].as_str().filter(|u| !u.is_empty()),
        ev["webhookEventId"].as_str().filter(|e| !e.is_empty()),
    ) else {
        return Ok(());
    };
    // Namespaced, so a LINE event id can never meet another source's dedup key.
    let dedup = format!("line:{event_id}");
    // The click and its `notification.clicked` webhook message in one transaction.
    let mut tx = app
        .pool
        .begin()
        .await
        .map_err(notify_store::StoreError::from)?;
    let recorded = notify_store::clicks::record_line_postback(
        &mut *tx,
        delivery_id,
        &action_id,
        data,
        user,
        &dedup,
    )
    .await?;
    if recorded {
        notify_store::webhooks::enqueue_for_deliveries(
            &mut tx,
            &[(
                delivery_id,
                notify_store::webhooks::EventType::NotificationClicked,
            )],
        )
        .await?;
    }
    tx.commit().await.map_err(notify_store::StoreError::from)?;
    // The LINE user id is not logged (logs hold no addresses).
    tracing::info!(
        %delivery_id,
        action_id,
        recorded,
        webhook_event_id = event_id,
        "LINE postback click"
    );
    Ok(())
}

#[derive(Deserialize)]
struct TokenQuery {
    #[serde(default)]
    token: String,
}

/// The token, verified and unexpired; else 400 `invalid_token` for a missing, malformed
/// or forged token, or [`ApiError::ExpiredToken`] (410) for an expired one.
fn check_token(app: &AppState, token: &str) -> Result<UnsubscribeToken, ApiError> {
    let invalid = |message: String| ApiError::Invalid {
        code: "invalid_token",
        field: "token".to_string(),
        message,
    };
    if token.is_empty() {
        return Err(invalid("is required".to_string()));
    }
    let now = chrono::Utc::now().timestamp();
    UnsubscribeToken::verify_fresh(
        token,
        &app.cfg.unsubscribe_secret,
        now,
        app.cfg.unsubscribe_ttl,
    )
    .map_err(|e| match e {
        TokenError::Expired => ApiError::ExpiredToken,
        e => invalid(e.to_string()),
    })
}

/// The page a GET of an expired unsubscribe link gets (410): nothing changed.
const EXPIRED_PAGE: &str = "<!doctype html><html lang=\"th\"><meta charset=\"utf-8\"><title>ลิงก์หมดอายุ / Link expired</title>\
     <p>ลิงก์ยกเลิกการรับอีเมลนี้หมดอายุแล้ว ไม่มีการเปลี่ยนแปลงใด ๆ \
     ใช้ลิงก์ในอีเมลฉบับล่าสุดแทน</p>\
     <p>This unsubscribe link has expired; nothing was changed. \
     Use the link in a more recent email instead.</p></html>";

/// `GET /unsubscribe?token=…`: asks for confirmation; changes nothing.
async fn unsubscribe_page(State(app): State<AppState>, Query(q): Query<TokenQuery>) -> Response {
    let t = match check_token(&app, &q.token) {
        Ok(t) => t,
        Err(ApiError::ExpiredToken) => {
            return (StatusCode::GONE, Html(EXPIRED_PAGE)).into_response();
        }
        Err(e) => return e.into_response(),
    };
    Html(format!(
        "<!doctype html><html lang=\"th\"><meta charset=\"utf-8\"><title>ยกเลิกการรับอีเมล</title>\
         <p>ยกเลิกการรับอีเมลประเภท <b>{}</b>? / Stop emails of type <b>{}</b>?</p>\
         <form method=\"post\" action=\"/unsubscribe?token={}\">\
         <input type=\"hidden\" name=\"List-Unsubscribe\" value=\"One-Click\">\
         <button type=\"submit\">ยืนยัน / Unsubscribe</button></form></html>",
        notify_core::content::escape_html(&t.type_key),
        notify_core::content::escape_html(&t.type_key),
        notify_core::content::escape_html(&q.token),
    ))
    .into_response()
}

/// `POST /unsubscribe?token=…`: RFC 8058 one-click unsubscribe.
async fn unsubscribe(
    State(app): State<AppState>,
    Query(q): Query<TokenQuery>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = String::from_utf8_lossy(&body?).into_owned();
    let t = check_token(&app, &q.token)?;
    if !body
        .split('&')
        .any(|kv| kv.trim() == "List-Unsubscribe=One-Click")
    {
        return Err(ApiError::invalid_body(
            "body",
            "must be List-Unsubscribe=One-Click (RFC 8058)",
        ));
    }
    let Ok(channel) = t.channel.parse::<Channel>() else {
        return Err(ApiError::Invalid {
            code: "invalid_token",
            field: "token".to_string(),
            message: "names an unknown channel".to_string(),
        });
    };
    notify_store::catalog::set_preference(&app.pool, &t.user_id, &t.type_key, Some(channel), false)
        .await?;
    tracing::info!(user_id = %t.user_id, r#type = %t.type_key, channel = %t.channel, "unsubscribed");
    Ok(Json(json!({
        "unsubscribed": true,
        "user_id": t.user_id,
        "type": t.type_key,
        "channel": t.channel,
    })))
}
