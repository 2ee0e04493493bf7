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
//! Items carry their image and actions (`[{id, label, url}]`); `POST
//! /v1/inbox/notifications/{id}/click` marks one read, records which action was clicked
//! (`clicked_action`, and a row in `delivery_clicks`, once per action) and answers the
//! link to open.
//!
//! Live updates: `GET /v1/inbox/stream` is a Server-Sent Events stream of `notification`
//! events (the changed item, its `seq` as the event id) and `unread_count` events, within
//! a second of the in-app worker's commit (Postgres `LISTEN inbox`, so any replica serves
//! any user). Reconnecting with `Last-Event-ID` replays every change after that id; a
//! page of the list carries `feed_seq`, the feed position when it was read, so a client
//! that opens the stream with it misses nothing that arrived in between. The
//! id (`seq`) is a per-user position whose values commit in order, however many workers
//! write, so a stream that moved past an id never misses a change below it.

use crate::AppState;
use crate::error::ApiError;
use axum::Router;
use axum::extract::FromRequestParts;
use axum::http::Method;
use axum::http::request::Parts;
use axum::routing::{MethodRouter, delete, get, post, put};
use feed::Change;
use std::sync::Arc;

mod click;
mod devices;
mod extract;
mod feed;
mod jwt;
mod rate_limit;
mod settings;
mod stream;

pub use feed::group_label;
pub use jwt::{MAX_TOKEN_BYTES, TOKEN_LEEWAY_SECS, Verifier, refresh_jwks};
pub use rate_limit::{UserLimiter, user_limiter};
pub use stream::listen;

/// Most items per page.
pub const MAX_PAGE: i64 = 100;

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
    pub fn from_env(env: &mut notify_core::config::Env) -> Self {
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

/// The authenticated end user: a valid token ([`Verifier::verify`]) within the user's
/// rate ([`rate_limit`]).
pub(crate) struct User(pub String);

impl FromRequestParts<AppState> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let token = parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| ApiError::Unauthenticated("missing".to_string()))?;
        let user = app
            .inbox
            .verifier
            .verify(token.trim())
            .map_err(ApiError::Unauthenticated)?;
        rate_limit::check(&app.inbox.limiter, &user)?;
        Ok(User(user))
    }
}

/// One inbox route: what [`routes`] serves and `docs/openapi.json` must describe.
pub struct Route {
    /// The HTTP method.
    pub method: Method,
    /// The path, with `{id}` for a path parameter (as OpenAPI writes it).
    pub path: &'static str,
    /// The handler.
    handler: fn() -> MethodRouter<AppState>,
}

/// Every inbox route. The router is built from this table, so a route cannot be served
/// without being listed here (and the OpenAPI test compares this list with
/// `docs/openapi.json`).
pub const ROUTES: &[Route] = &[
    Route {
        method: Method::GET,
        path: "/v1/inbox/notifications",
        handler: || get(feed::list),
    },
    Route {
        method: Method::GET,
        path: "/v1/inbox/unread-count",
        handler: || get(feed::unread_count),
    },
    Route {
        method: Method::POST,
        path: "/v1/inbox/notifications/{id}/read",
        handler: || post(|s, u, p| feed::change(s, u, p, Change::Read)),
    },
    Route {
        method: Method::POST,
        path: "/v1/inbox/notifications/{id}/unread",
        handler: || post(|s, u, p| feed::change(s, u, p, Change::Unread)),
    },
    Route {
        method: Method::POST,
        path: "/v1/inbox/notifications/{id}/archive",
        handler: || post(|s, u, p| feed::change(s, u, p, Change::Archive)),
    },
    Route {
        method: Method::POST,
        path: "/v1/inbox/notifications/{id}/unarchive",
        handler: || post(|s, u, p| feed::change(s, u, p, Change::Unarchive)),
    },
    Route {
        method: Method::POST,
        path: "/v1/inbox/notifications/{id}/click",
        handler: || post(click::click),
    },
    Route {
        method: Method::POST,
        path: "/v1/inbox/read-all",
        handler: || post(feed::read_all),
    },
    Route {
        method: Method::GET,
        path: "/v1/inbox/stream",
        handler: || get(stream::stream),
    },
    Route {
        method: Method::GET,
        path: "/v1/inbox/preferences",
        handler: || get(settings::get_preferences),
    },
    Route {
        method: Method::PUT,
        path: "/v1/inbox/preferences",
        handler: || put(settings::put_preference),
    },
    Route {
        method: Method::PUT,
        path: "/v1/inbox/quiet-hours",
        handler: || put(settings::put_quiet_hours),
    },
    Route {
        method: Method::POST,
        path: "/v1/inbox/devices",
        handler: || post(devices::register_device),
    },
    Route {
        method: Method::DELETE,
        path: "/v1/inbox/devices/{id}",
        handler: || delete(devices::unregister_device),
    },
];

/// The inbox routes, built from [`ROUTES`].
pub(crate) fn routes() -> Router<AppState> {
    ROUTES
        .iter()
        .fold(Router::new(), |r, route| {
            r.route(route.path, (route.handler)())
        })
        .method_not_allowed_fallback(method_not_allowed)
}

/// A known inbox path asked with a method it does not serve: 405 naming the methods it
/// does (axum adds the `Allow` header to every 405).
async fn method_not_allowed(method: Method, path: Option<axum::extract::MatchedPath>) -> ApiError {
    let path = path.as_ref().map_or("", |p| p.as_str());
    let allowed: Vec<&str> = ROUTES
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.method.as_str())
        .collect();
    ApiError::MethodNotAllowed(format!(
        "{method} is not served here; use {}",
        if allowed.is_empty() {
            "another method".to_string()
        } else {
            allowed.join(" or ")
        }
    ))
}
