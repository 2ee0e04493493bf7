//! The operations console: server-rendered HTML under `/console`, no build step.
//!
//! Staff sign in either with configured credentials (`NOTIFY_CONSOLE_USERS` =
//! `name:<argon2id PHC string>,...`, throttled, a server-side session whose cookie is
//! HttpOnly, SameSite=Strict and Secure, 8 hours) or through an authenticating proxy that
//! sets `NOTIFY_CONSOLE_AUTH_HEADER` (e.g. `X-Forwarded-User`; only safe when the proxy is
//! the sole way in). See [`crate::staff`] for the details. End-user inbox tokens are never
//! accepted here. Without either setting the console answers 404.
//!
//! Pages: the overview (per channel: deliveries by status in the last hour and day, the
//! oldest due pending delivery, retry rate, outbox lag), search (event id, event key, user
//! id or type), an event page (recipient x channel matrix with status, attempts, next
//! attempt, deferred until, the decision trail, and per delivery the attempts with the
//! provider's status, raw answer and the content sent), and the audit log. Actions (retry
//! a failed delivery, cancel an event's pending deliveries) go through a confirmation page
//! and a CSRF token bound to the session, every POST has its `Origin` checked, and actions
//! are recorded in `console_audit`. Every value is HTML-escaped; every page carries a
//! Content-Security-Policy with `frame-ancestors 'none'`.

use crate::AppState;
use crate::staff;
// The one HTML escaper, shared with the email HTML part.
use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use notify_core::DeliveryStatus;
use notify_core::event::escape_html as esc;
use notify_store::events::{self, EventSelector};
use serde::Deserialize;
use std::time::Duration;
use uuid::Uuid;

pub use crate::staff::password_hash;

/// Console settings.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// (name, argon2id PHC string of the password).
    pub users: Vec<(String, String)>,
    /// Signs CSRF tokens (HMAC-SHA256 key).
    pub secret: String,
    /// Header an authenticating proxy sets to the staff member's name.
    pub auth_header: Option<String>,
    /// RabbitMQ URL and names, for the dead-letter queue's depth and the requeue action;
    /// `None` shows neither.
    pub amqp: Option<(String, notify_broker::Topology)>,
    /// Local development only: leave `Secure` off the session cookie so that a browser
    /// keeps it over plain `http://` (`NOTIFY_CONSOLE_INSECURE_COOKIES`, default false).
    pub insecure_cookies: bool,
    /// The console's own origin (`https://ops.example.com`) that a POST's `Origin` must
    /// be; `None`: its host and port must be the request's `Host`.
    pub origin: Option<String>,
    /// Failed sign-ins per typed name, and per client address, within
    /// [`Self::sign_in_window`] after which sign-in answers 429 (default 5).
    pub sign_in_limit: u32,
    /// The window failed sign-ins are counted in (default 15 minutes).
    pub sign_in_window: Duration,
    /// How long a session lasts from sign-in (default 8 hours).
    pub session_ttl: Duration,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            users: Vec::new(),
            secret: String::new(),
            auth_header: None,
            amqp: None,
            insecure_cookies: false,
            origin: None,
            sign_in_limit: 5,
            sign_in_window: Duration::from_secs(15 * 60),
            session_ttl: Duration::from_secs(8 * 3600),
        }
    }
}

/// Splits `NOTIFY_CONSOLE_USERS` into (name, hash) pairs. Entries are separated by commas;
/// a piece without a `:` continues the previous entry (the commas inside a PHC string's
/// parameters, `m=19456,t=2,p=1`).
fn parse_users(value: &str) -> Vec<(String, String)> {
    let mut entries: Vec<String> = Vec::new();
    for piece in value.split(',').filter(|p| !p.trim().is_empty()) {
        match entries.last_mut() {
            Some(last) if !piece.contains(':') => {
                last.push(',');
                last.push_str(piece);
            }
            _ => entries.push(piece.to_string()),
        }
    }
    entries
        .iter()
        .filter(|s| !s.trim().is_empty())
        .filter_map(|pair| {
            let (u, h) = pair.trim().split_once(':')?;
            Some((u.trim().to_string(), h.trim().to_string()))
        })
        .collect()
}

impl ConsoleConfig {
    /// Reads `NOTIFY_CONSOLE_USERS` (argon2id PHC strings; a SHA-256 hash from an older
    /// release is an error naming the user), `NOTIFY_CONSOLE_SECRET` (32+ characters,
    /// required with users or the proxy header), `NOTIFY_CONSOLE_AUTH_HEADER`,
    /// `NOTIFY_CONSOLE_INSECURE_COOKIES` (false), `NOTIFY_CONSOLE_ORIGIN` (empty),
    /// `NOTIFY_CONSOLE_SIGN_IN_LIMIT` (5), `NOTIFY_CONSOLE_SIGN_IN_WINDOW` (15m),
    /// `NOTIFY_CONSOLE_SESSION_TTL` (8h), and `NOTIFY_AMQP_URL` / `NOTIFY_AMQP_PREFIX`
    /// (optional: the dead-letter queue).
    pub fn from_env(env: &mut notify_telemetry::Env) -> Self {
        let defaults = Self::default();
        let users = parse_users(&env.string("NOTIFY_CONSOLE_USERS", ""));
        for (user, hash) in &users {
            if let Err(e) = staff::check_hash(hash) {
                env.error(format!(
                    "NOTIFY_CONSOLE_USERS: the password hash of {user:?} {e}"
                ));
            }
        }
        let secret = env.string("NOTIFY_CONSOLE_SECRET", "");
        let auth_header = Some(env.string("NOTIFY_CONSOLE_AUTH_HEADER", ""))
            .filter(|h| !h.is_empty())
            .map(|h| h.to_ascii_lowercase());
        if (!users.is_empty() || auth_header.is_some()) && secret.len() < 32 {
            env.error("NOTIFY_CONSOLE_SECRET must be at least 32 characters when NOTIFY_CONSOLE_USERS or NOTIFY_CONSOLE_AUTH_HEADER is set".to_string());
        }
        let insecure_cookies = env.parse("NOTIFY_CONSOLE_INSECURE_COOKIES", false);
        let origin = Some(env.string("NOTIFY_CONSOLE_ORIGIN", ""))
            .map(|o| o.trim().trim_end_matches('/').to_ascii_lowercase())
            .filter(|o| !o.is_empty());
        if let Some(o) = &origin
            && !(o.starts_with("https://") || o.starts_with("http://"))
        {
            env.error(format!(
                "NOTIFY_CONSOLE_ORIGIN={o:?} is invalid: must be scheme://host[:port]"
            ));
        }
        let sign_in_limit = env.number("NOTIFY_CONSOLE_SIGN_IN_LIMIT", 5, 1, 1000);
        let duration = |env: &mut notify_telemetry::Env, name: &str, default: Duration| {
            env.parse_with(
                name,
                default,
                |s| match notify_core::retry::parse_duration(s) {
                    Ok(d)
                        if d >= Duration::from_secs(1) && d <= Duration::from_secs(30 * 86400) =>
                    {
                        Ok(d)
                    }
                    Ok(_) => Err("must be from 1s to 720h".to_string()),
                    Err(e) => Err(e.to_string()),
                },
            )
        };
        let sign_in_window = duration(
            env,
            "NOTIFY_CONSOLE_SIGN_IN_WINDOW",
            defaults.sign_in_window,
        );
        let session_ttl = duration(env, "NOTIFY_CONSOLE_SESSION_TTL", defaults.session_ttl);
        let amqp_url = env.string("NOTIFY_AMQP_URL", "");
        let amqp = (!amqp_url.is_empty()).then(|| {
            (
                amqp_url,
                notify_broker::Topology::new(env.string("NOTIFY_AMQP_PREFIX", "")),
            )
        });
        Self {
            users,
            secret,
            auth_header,
            amqp,
            insecure_cookies,
            origin,
            sign_in_limit,
            sign_in_window,
            session_ttl,
        }
    }

    fn enabled(&self) -> bool {
        !self.users.is_empty() || self.auth_header.is_some()
    }
}

/// A signed-in staff member.
#[derive(Debug, Clone)]
struct Staff {
    /// Their name.
    name: String,
    /// What their CSRF token is bound to: the session id's hash in hex, or `proxy|name`
    /// behind an authenticating proxy.
    binding: String,
    /// The session id's hash (`None` behind the proxy).
    session: Option<Vec<u8>>,
}

/// The signed-in staff member, if any: the proxy's header, or an unexpired session in
/// `console_sessions` whose user is still configured.
async fn staff(app: &AppState, headers: &HeaderMap) -> Result<Option<Staff>, Response> {
    let cfg = &app.console;
    if let Some(h) = &cfg.auth_header
        && let Some(user) = headers.get(h.as_str()).and_then(|v| v.to_str().ok())
        && !user.trim().is_empty()
    {
        let name = user.trim().to_string();
        return Ok(Some(Staff {
            binding: format!("proxy|{name}"),
            name,
            session: None,
        }));
    }
    if cfg.users.is_empty() {
        return Ok(None);
    }
    let Some(hash) = staff::session_id_hash(headers) else {
        return Ok(None);
    };
    let name = match notify_store::console::session_staff(&app.pool, &hash).await {
        Ok(n) => n,
        Err(e) => return Err(db_error(e)),
    };
    Ok(name
        .filter(|n| cfg.users.iter().any(|(u, _)| u == n))
        .map(|name| Staff {
            name,
            binding: hex::encode(&hash),
            session: Some(hash),
        }))
}

fn page(title: &str, user: Option<&str>, body: &str) -> Response {
    let nav = match user {
        Some(u) => format!(
            "<nav><a href=\"/console\">Overview</a> · <a href=\"/console/audit\">Audit</a> · \
             <form method=\"get\" action=\"/console/search\" style=\"display:inline\"><input name=\"q\" placeholder=\"event key, event id, user id or type\" size=\"40\"> <button>Search</button></form> \
             <span style=\"float:right\">{} · <a href=\"/console/logout\">Sign out…</a></span></nav>",
            esc(u)
        ),
        None => String::new(),
    };
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · notify console</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}}table{{border-collapse:collapse;margin:.5rem 0}}\
         td,th{{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}}th{{background:#f4f4f4}}\
         .failed{{color:#b00020;font-weight:600}}.sent{{color:#137333}}.pending{{color:#a56300}}pre{{white-space:pre-wrap;max-width:60rem;margin:0}}\
         nav{{margin-bottom:1rem;padding-bottom:.5rem;border-bottom:1px solid #ddd}}</style></head>\
         <body>{nav}<h1>{}</h1>{body}</body></html>",
        esc(title),
        esc(title)
    ))
    .into_response()
}

fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Html("<!doctype html><title>Not found</title><p>Not found.</p>"),
    )
        .into_response()
}

fn db_error(e: notify_store::StoreError) -> Response {
    tracing::error!(error = %e, "database error");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Html("<!doctype html><title>Unavailable</title><p>The database is unavailable; try again.</p>"),
    )
        .into_response()
}

/// The signed-in staff member, or the answer to send instead (login redirect, or 404 when
/// the console is not configured).
async fn require_staff(app: &AppState, headers: &HeaderMap) -> Result<Staff, Box<Response>> {
    if !app.console.enabled() {
        return Err(Box::new(not_found()));
    }
    match staff(app, headers).await {
        Ok(Some(s)) => Ok(s),
        Ok(None) => Err(Box::new(Redirect::to("/console/login").into_response())),
        Err(r) => Err(Box::new(r)),
    }
}

/// The signed-in staff member's name, or the answer to send instead.
async fn require(app: &AppState, headers: &HeaderMap) -> Result<String, Box<Response>> {
    require_staff(app, headers).await.map(|s| s.name)
}

fn forbidden(message: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        Html(format!(
            "<!doctype html><title>Refused</title><p>{}</p>",
            esc(message)
        )),
    )
        .into_response()
}

/// 403 unless the request comes from the console's own origin ([`staff::same_origin`]).
fn check_origin(app: &AppState, headers: &HeaderMap) -> Result<(), Box<Response>> {
    if staff::same_origin(&app.console, headers) {
        Ok(())
    } else {
        tracing::warn!("console POST from a foreign origin refused");
        Err(Box::new(forbidden(
            "This form was sent from another site; open the console and try again.",
        )))
    }
}

/// The console routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(overview))
        .route("/console/login", get(login_page).post(login))
        .route("/console/logout", get(logout_page).post(logout))
        .route("/console/search", get(search))
        .route("/console/events/{id}", get(event_page))
        .route("/console/confirm", get(confirm_page))
        .route("/console/actions/retry/{id}", post(retry))
        .route("/console/actions/cancel/{id}", post(cancel))
        .route("/console/actions/requeue-dead", post(requeue_dead))
        .route("/console/audit", get(audit))
        .layer(axum::middleware::map_response(staff::security_headers))
}

async fn login_page(State(app): State<AppState>) -> Response {
    if app.console.users.is_empty() {
        return not_found();
    }
    page(
        "Sign in",
        None,
        "<form method=\"post\" action=\"/console/login\"><p><label>Name <input name=\"user\" autocomplete=\"username\"></label></p>\
         <p><label>Password <input name=\"password\" type=\"password\" autocomplete=\"current-password\"></label></p><button>Sign in</button></form>",
    )
}

#[derive(Deserialize)]
struct LoginForm {
    user: String,
    password: String,
}

async fn login(
    State(app): State<AppState>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    Form(f): Form<LoginForm>,
) -> Response {
    let cfg = &app.console;
    if cfg.users.is_empty() {
        return not_found();
    }
    if let Err(r) = check_origin(&app, &headers) {
        return *r;
    }
    let addr = extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let keys = staff::throttle_keys(&f.user, addr);
    match notify_store::console::sign_in_blocked_for(
        &app.pool,
        &keys,
        cfg.sign_in_limit,
        cfg.sign_in_window,
    )
    .await
    {
        Ok(None) => {}
        Ok(Some(wait)) => {
            tracing::warn!("console sign-in throttled");
            let mut r = page(
                "Sign in",
                None,
                &format!(
                    "<p class=\"failed\">Too many failed sign-ins. Try again in {} minute(s).</p>",
                    wait.div_ceil(60)
                ),
            );
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            r.headers_mut().insert(
                header::RETRY_AFTER,
                wait.to_string().parse().expect("digits"),
            );
            return r;
        }
        Err(e) => return db_error(e),
    }
    // Unknown names are checked against a dummy hash, so they take as long as known ones.
    let hash = cfg
        .users
        .iter()
        .find(|(u, _)| u == &f.user)
        .map(|(_, h)| h.clone());
    let known = hash.is_some();
    let hash = hash.unwrap_or_else(|| staff::dummy_hash().to_string());
    let password = f.password.clone();
    let ok = tokio::task::spawn_blocking(move || staff::password_matches(&hash, &password))
        .await
        .unwrap_or(false)
        && known;
    if !ok {
        if let Err(e) =
            notify_store::console::record_sign_in_failure(&app.pool, &keys, cfg.sign_in_window)
                .await
        {
            return db_error(e);
        }
        // The typed name is never logged.
        tracing::warn!("console sign-in refused");
        let mut r = page(
            "Sign in",
            None,
            "<p class=\"failed\">Wrong name or password.</p><p><a href=\"/console/login\">Try again</a></p>",
        );
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return r;
    }
    if let Err(e) = notify_store::console::clear_sign_in_failures(&app.pool, &keys[0]).await {
        return db_error(e);
    }
    let (id, id_hash) = staff::new_session_id();
    if let Err(e) =
        notify_store::console::create_session(&app.pool, &id_hash, &f.user, cfg.session_ttl).await
    {
        return db_error(e);
    }
    let mut r = Redirect::to("/console").into_response();
    if let Ok(v) = staff::session_cookie(cfg, &id).parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `GET /console/logout`: a page with the sign-out button (a GET changes nothing).
async fn logout_page(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let s = match require_staff(&app, &headers).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    page(
        "Sign out",
        Some(&s.name),
        &format!(
            "<form method=\"post\" action=\"/console/logout\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button>Sign out</button> <a href=\"/console\">Back</a></form>",
            esc(&staff::csrf(&app.console, &s.binding))
        ),
    )
}

/// `POST /console/logout`: deletes the session, so its cookie is refused from now on.
async fn logout(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Response {
    let s = match action_staff(&app, &headers, &f).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    if let Some(hash) = &s.session
        && let Err(e) = notify_store::console::delete_session(&app.pool, hash).await
    {
        return db_error(e);
    }
    let mut r = Redirect::to("/console/login").into_response();
    if let Ok(v) = staff::clear_cookie(&app.console).parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn secs(s: Option<i64>) -> String {
    s.map_or("–".into(), |s| format!("{s} s"))
}

async fn overview(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let user = match require(&app, &headers).await {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let (channels, lag) = match notify_store::console::overview(&app.pool).await {
        Ok(o) => o,
        Err(e) => return db_error(e),
    };
    let mut body = String::from(
        "<table><tr><th>channel</th><th>last hour: pending / sending / sent / failed</th>\
         <th>last day: pending / sending / sent / failed</th><th>oldest due pending</th><th>retry rate (1 h)</th></tr>",
    );
    for c in &channels {
        let fmt = |a: &[i64; 4]| {
            format!(
                "{} / {} / {} / <span class=\"failed\">{}</span>",
                a[0], a[1], a[2], a[3]
            )
        };
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(c.channel.as_str()),
            fmt(&c.last_hour),
            fmt(&c.last_day),
            secs(c.oldest_pending_s),
            c.retry_rate
                .map_or("–".into(), |r| format!("{:.1} %", r * 100.0)),
        ));
    }
    let dead = match &app.console.amqp {
        None => "not configured (set NOTIFY_AMQP_URL)".to_string(),
        Some((url, topology)) => match dead_depth(url, topology).await {
            Ok(0) => "0".to_string(),
            Ok(n) => format!(
                "<b class=\"failed\">{n}</b> · <a href=\"/console/confirm?action=requeue-dead&amp;target=00000000-0000-0000-0000-000000000000\">move them back to their queues…</a>"
            ),
            Err(e) => format!("unknown ({})", esc(&e)),
        },
    };
    body.push_str(&format!(
        "</table><p>Outbox lag (oldest due row): {}.</p><p>Dead-letter queue: {dead}</p>",
        secs(lag)
    ));
    page("Overview", Some(&user), &body)
}

#[derive(Deserialize)]
struct SearchQuery {
    #[serde(default)]
    q: String,
}

async fn search(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SearchQuery>,
) -> Response {
    let user = match require(&app, &headers).await {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let query = q.q.trim();
    if query.is_empty() {
        return page(
            "Search",
            Some(&user),
            "<p>Type an event key, event id, user id or type.</p>",
        );
    }
    let found = match notify_store::console::search(&app.pool, query).await {
        Ok(f) => f,
        Err(e) => return db_error(e),
    };
    let mut body = format!(
        "<p>{} events for <b>{}</b>.</p><table><tr><th>event</th><th>key</th><th>type</th><th>created</th></tr>",
        found.len(),
        esc(query)
    );
    for e in &found {
        body.push_str(&format!(
            "<tr><td><a href=\"/console/events/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&e.event_key),
            esc(&e.type_key),
            e.created_at.to_rfc3339(),
            id = e.id
        ));
    }
    body.push_str("</table>");
    page("Search", Some(&user), &body)
}

async fn event_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let user = match require(&app, &headers).await {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let Ok(id) = Uuid::parse_str(&id) else {
        return not_found();
    };
    let event = match events::get_event(&app.pool, &EventSelector::Id(id)).await {
        Ok(Some(e)) => e,
        Ok(None) => return not_found(),
        Err(e) => return db_error(e),
    };
    let deliveries = match events::list_deliveries(&app.pool, id, None, 1000).await {
        Ok(d) => d,
        Err(e) => return db_error(e),
    };
    let skips = events::list_skips(&app.pool, id, 1000)
        .await
        .unwrap_or_default();
    let mut body = format!(
        "<p>key <b>{}</b> · type <b>{}</b> · created {} · topic {} · <a href=\"/console/confirm?action=cancel&amp;target={id}\">cancel pending deliveries…</a></p>\
         <p>Title: {}<br>Body: {}</p>",
        esc(&event.event_key),
        esc(&event.type_key),
        event.created_at.to_rfc3339(),
        esc(event.topic.as_deref().unwrap_or("–")),
        esc(&event.content.title),
        esc(&event.content.body),
    );
    body.push_str("<h2>Recipients x channels</h2><table><tr><th>user</th><th>channel</th><th>provider</th><th>status</th><th>attempts</th><th>next attempt</th><th>deferred until</th><th>last error</th><th>decision</th><th></th></tr>");
    for d in &deliveries {
        let action = if d.status == DeliveryStatus::Failed {
            format!(
                "<a href=\"/console/confirm?action=retry&amp;target={}\">retry now…</a>",
                d.id
            )
        } else {
            String::new()
        };
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{st}\">{st}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td><td>{action}</td></tr>",
            esc(&d.user_id),
            esc(d.channel.as_str()),
            esc(d.provider.as_str()),
            d.attempts,
            if d.status == DeliveryStatus::Pending { d.next_attempt_at.to_rfc3339() } else { "–".into() },
            d.deferred_until.map_or("–".into(), |t| t.to_rfc3339()),
            esc(d.last_error.as_deref().unwrap_or("")),
            esc(&d.decision),
            st = esc(d.status.as_str()),
        ));
    }
    for s in &skips {
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>–</td><td>skipped</td><td>–</td><td>–</td><td>–</td><td>{}</td><td><pre>{}</pre></td><td></td></tr>",
            esc(&s.user_id),
            esc(s.channel.as_str()),
            esc(&s.reason),
            esc(&s.decision)
        ));
    }
    body.push_str("</table><h2>Attempts</h2>");
    for d in deliveries.iter().filter(|d| d.attempts > 0).take(100) {
        let attempts = events::attempts_of(&app.pool, d.id)
            .await
            .unwrap_or_default();
        body.push_str(&format!("<h3>{} · {} · {}</h3><table><tr><th>#</th><th>outcome</th><th>provider status</th><th>error</th><th>provider's answer</th><th>content sent</th><th>started</th><th>worker</th></tr>", esc(&d.user_id), esc(d.channel.as_str()), d.id));
        for a in attempts {
            body.push_str(&format!(
                "<tr><td>{}</td><td class=\"{o}\">{o}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td><td><pre>{}</pre></td><td>{}</td><td>{}</td></tr>",
                a.attempt,
                a.provider_status.map_or("–".into(), |s| s.to_string()),
                esc(a.error_code.as_deref().unwrap_or("")),
                esc(a.provider_response.as_deref().unwrap_or("")),
                esc(&a.content_json.map(|c| serde_json::to_string_pretty(&c).unwrap_or_default()).unwrap_or_default()),
                a.started_at.to_rfc3339(),
                esc(&a.worker_id),
                o = esc(&a.outcome),
            ));
        }
        body.push_str("</table>");
    }
    page(&format!("Event {id}"), Some(&user), &body)
}

#[derive(Deserialize)]
struct ConfirmQuery {
    action: String,
    target: String,
}

async fn confirm_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ConfirmQuery>,
) -> Response {
    let s = match require_staff(&app, &headers).await {
        Ok(s) => s,
        Err(r) => return *r,
    };
    let user = s.name.clone();
    let Ok(target) = Uuid::parse_str(&q.target) else {
        return not_found();
    };
    let what = match q.action.as_str() {
        "retry" => format!("Retry the failed delivery {target} now?"),
        "cancel" => format!("Cancel every pending delivery of event {target}?"),
        "requeue-dead" => {
            "Move up to 1,000 dead-lettered messages back to their channel queues?".to_string()
        }
        _ => return not_found(),
    };
    page(
        "Confirm",
        Some(&user),
        &format!(
            "<p>{}</p><form method=\"post\" action=\"{}\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button>Confirm</button> <a href=\"/console\">Back</a></form>",
            esc(&what),
            esc(&if q.action == "requeue-dead" {
                "/console/actions/requeue-dead".to_string()
            } else {
                format!("/console/actions/{}/{target}", q.action)
            }),
            esc(&staff::csrf(&app.console, &s.binding))
        ),
    )
}

#[derive(Deserialize)]
struct ActionForm {
    csrf: String,
}

/// The staff member behind an action form: sent from the console's origin, signed in,
/// and the form's CSRF token that of their session.
async fn action_staff(
    app: &AppState,
    headers: &HeaderMap,
    f: &ActionForm,
) -> Result<Staff, Box<Response>> {
    check_origin(app, headers)?;
    let s = require_staff(app, headers).await?;
    if staff::csrf_valid(&app.console, &s.binding, &f.csrf) {
        Ok(s)
    } else {
        Err(Box::new(forbidden(
            "The form expired; go back and try again.",
        )))
    }
}

/// The name of the staff member behind an action form ([`action_staff`]).
async fn action_user(
    app: &AppState,
    headers: &HeaderMap,
    f: &ActionForm,
) -> Result<String, Box<Response>> {
    action_staff(app, headers, f).await.map(|s| s.name)
}

async fn retry(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    let user = match action_user(&app, &headers, &f).await {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let Ok(id) = Uuid::parse_str(&id) else {
        return not_found();
    };
    let event_id: Option<Uuid> = notify_store::sqlx::query_scalar(
        "SELECT event_id FROM notification_deliveries WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&app.pool)
    .await
    .ok()
    .flatten();
    match notify_store::console::retry_delivery(&app.pool, &user, id).await {
        Ok(()) => {
            tracing::info!(staff = %user, delivery_id = %id, "console: retry");
            Redirect::to(&format!("/console/events/{}", event_id.unwrap_or(id))).into_response()
        }
        Err(notify_store::StoreError::NotFound(_)) => page(
            "Not retried",
            Some(&user),
            "<p>That delivery is not failed (any more).</p>",
        ),
        Err(e) => db_error(e),
    }
}

async fn cancel(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    let user = match action_user(&app, &headers, &f).await {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let Ok(id) = Uuid::parse_str(&id) else {
        return not_found();
    };
    match notify_store::console::cancel_event(&app.pool, &user, id).await {
        Ok(n) => {
            tracing::info!(staff = %user, event_id = %id, canceled = n, "console: cancel");
            Redirect::to(&format!("/console/events/{id}")).into_response()
        }
        Err(e) => db_error(e),
    }
}

async fn dead_depth(url: &str, topology: &notify_broker::Topology) -> Result<u32, String> {
    let conn = notify_broker::connect(url, "http-api-console")
        .await
        .map_err(|e| e.to_string())?;
    let depth = notify_broker::dead_letter_depth(&conn, topology)
        .await
        .map_err(|e| e.to_string());
    let _ = conn.close(200, "done".into()).await;
    depth
}

async fn requeue_dead(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Response {
    let user = match action_user(&app, &headers, &f).await {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let Some((url, topology)) = &app.console.amqp else {
        return not_found();
    };
    let result = async {
        let conn = notify_broker::connect(url, "http-api-console").await?;
        let r = notify_broker::requeue_dead_letters(&conn, topology, 1000).await;
        let _ = conn.close(200, "done".into()).await;
        r
    }
    .await;
    match result {
        Ok((moved, left)) => {
            let detail = format!("{moved} moved back, {left} left (not delivery pointers)");
            if let Err(e) = notify_store::console::record(
                &app.pool,
                &user,
                "requeue_dead_letters",
                "deliveries.dead",
                &detail,
            )
            .await
            {
                return db_error(e);
            }
            tracing::info!(staff = %user, moved, left, "console: dead letters moved back");
            page(
                "Dead letters",
                Some(&user),
                &format!(
                    "<p>{}</p><p><a href=\"/console\">Back to the overview</a></p>",
                    esc(&detail)
                ),
            )
        }
        Err(e) => page(
            "Dead letters",
            Some(&user),
            &format!("<p class=\"failed\">Stopped: {}</p>", esc(&e.to_string())),
        ),
    }
}

async fn audit(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let user = match require(&app, &headers).await {
        Ok(u) => u,
        Err(r) => return *r,
    };
    let rows = match notify_store::console::audit_log(&app.pool, 200).await {
        Ok(r) => r,
        Err(e) => return db_error(e),
    };
    let mut body = String::from(
        "<table><tr><th>when</th><th>who</th><th>action</th><th>target</th><th>detail</th></tr>",
    );
    for (at, staff, action, target, detail) in rows {
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            at.to_rfc3339(),
            esc(&staff),
            esc(&action),
            esc(&target),
            esc(&detail)
        ));
    }
    body.push_str("</table>");
    page("Audit log", Some(&user), &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_split_on_commas_outside_phc_parameters() {
        let a = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaA";
        let b = "$argon2id$v=19$m=65536,t=3,p=4$b3RoZXI$aGFzaDI";
        assert_eq!(
            parse_users(&format!("ops:{a}, lead:{b},")),
            vec![("ops".into(), a.into()), ("lead".into(), b.into())]
        );
        assert!(parse_users("").is_empty());
    }
}
