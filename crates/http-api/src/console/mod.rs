//! The operations console: server-rendered HTML under `/console`, no build step.
//!
//! Staff sign in either with configured credentials (`NOTIFY_CONSOLE_USERS` =
//! `name:<argon2id PHC string>,...`, throttled, a server-side session whose cookie is
//! HttpOnly, SameSite=Strict and Secure, 8 hours) or through an authenticating proxy that
//! sets `NOTIFY_CONSOLE_AUTH_HEADER` (e.g. `X-Forwarded-User`; only safe when the proxy is
//! the sole way in). See [`staff`] for the details. End-user inbox tokens are never
//! accepted here. Without either setting the console answers 404.
//!
//! Pages: the overview (per channel: deliveries by status in the last hour and day, the
//! oldest due pending delivery, retry rate, outbox lag), search (event id, event key, user
//! id or type), an event page (recipient x channel matrix with status, attempts, next
//! attempt, deferred until, the decision trail, and per delivery the attempts with the
//! provider's status, raw answer and the content sent), and the audit log. Actions (retry
//! a failed delivery, cancel an event's pending deliveries) go through a confirmation page
//! and a CSRF token bound to the session, every POST has its `Origin` checked, and actions
//! are recorded in `console_audit`. The email page shows each email provider's circuit
//! breaker and the suppression list, which staff can add to and remove from. The webhooks
//! page lists every caller's status-webhook endpoint with its pending messages and latest
//! attempts, and enables a disabled one again (audited). Every value is HTML-escaped; every page carries a
//! Content-Security-Policy with `frame-ancestors 'none'`.

use crate::AppState;
use axum::Router;
use axum::routing::{get, post};
use std::time::Duration;

mod access;
mod actions;
mod email;
mod pages;
mod render;
mod session;
pub mod staff;
mod throttle;
mod webhooks;

use actions::Action;

pub use staff::password_hash;

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
    /// Sign-in attempts for one typed name from one client address within
    /// [`Self::sign_in_window`] (default 5); after that, sign-in answers 429 there.
    /// Attempts are counted before the password is checked (see `throttle.rs`).
    pub sign_in_limit: u32,
    /// The window the attempts of one name and address, and of one address, are counted
    /// in (default 15 minutes).
    pub sign_in_window: Duration,
    /// Sign-in attempts from one client address, whatever the name, within
    /// [`Self::sign_in_window`] (default 20).
    pub sign_in_address_limit: u32,
    /// Sign-in attempts for one typed name from every address within
    /// [`Self::sign_in_name_window`] (default 50); an address the name signed in from
    /// within 30 days does not count them or wait for them.
    pub sign_in_name_limit: u32,
    /// The window of [`Self::sign_in_name_limit`] (default 24 hours).
    pub sign_in_name_window: Duration,
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
            sign_in_address_limit: 20,
            sign_in_name_limit: 50,
            sign_in_name_window: Duration::from_secs(24 * 3600),
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
    /// `NOTIFY_CONSOLE_SIGN_IN_ADDRESS_LIMIT` (20), `NOTIFY_CONSOLE_SIGN_IN_NAME_LIMIT` (50),
    /// `NOTIFY_CONSOLE_SIGN_IN_NAME_WINDOW` (24h),
    /// `NOTIFY_CONSOLE_SESSION_TTL` (8h), and `NOTIFY_AMQP_URL` / `NOTIFY_AMQP_PREFIX`
    /// (optional: the dead-letter queue).
    pub fn from_env(env: &mut notify_core::config::Env) -> Self {
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
        let sign_in_address_limit =
            env.number("NOTIFY_CONSOLE_SIGN_IN_ADDRESS_LIMIT", 20, 1, 100_000);
        let sign_in_name_limit = env.number("NOTIFY_CONSOLE_SIGN_IN_NAME_LIMIT", 50, 1, 100_000);
        let duration = |env: &mut notify_core::config::Env, name: &str, default: Duration| {
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
        let sign_in_name_window = duration(
            env,
            "NOTIFY_CONSOLE_SIGN_IN_NAME_WINDOW",
            defaults.sign_in_name_window,
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
            sign_in_address_limit,
            sign_in_name_limit,
            sign_in_name_window,
            session_ttl,
        }
    }

    fn enabled(&self) -> bool {
        !self.users.is_empty() || self.auth_header.is_some()
    }
}

/// The console routes.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(pages::overview))
        .route(
            "/console/login",
            get(session::login_page).post(session::login),
        )
        .route(
            "/console/logout",
            get(session::logout_page).post(session::logout),
        )
        .route("/console/search", get(pages::search))
        .route("/console/events/{id}", get(pages::event_page))
        .route("/console/confirm", get(pages::confirm_page))
        .route(
            "/console/actions/retry/{id}",
            post(|s, h, p, f| actions::on_target(s, h, p, f, Action::Retry)),
        )
        .route(
            "/console/actions/cancel/{id}",
            post(|s, h, p, f| actions::on_target(s, h, p, f, Action::Cancel)),
        )
        .route("/console/actions/requeue-dead", post(actions::requeue_dead))
        .route("/console/audit", get(pages::audit))
        .route("/console/email", get(email::email_page))
        .route("/console/email/confirm-add", get(email::confirm_add))
        .route(
            "/console/email/confirm-remove/{id}",
            get(email::confirm_remove),
        )
        .route("/console/actions/suppressions/add", post(email::add))
        .route(
            "/console/actions/suppressions/{id}/remove",
            post(email::remove),
        )
        .route("/console/webhooks", get(webhooks::webhooks_page))
        .route(
            "/console/webhooks/confirm-enable/{id}",
            get(webhooks::confirm_enable),
        )
        .route(
            "/console/actions/webhooks/{id}/enable",
            post(webhooks::enable),
        )
        .layer(axum::middleware::map_response(staff::security_headers))
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

    #[test]
    fn the_sign_in_throttles_settings_are_read_with_their_bounds() {
        let read = |vars: &[(&str, &str)]| {
            let mut env = notify_core::config::Env::from_vars(vars.iter().copied());
            let cfg = ConsoleConfig::from_env(&mut env);
            (cfg, env.finish())
        };
        let (cfg, ok) = read(&[]);
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(
            (
                cfg.sign_in_limit,
                cfg.sign_in_window,
                cfg.sign_in_address_limit,
                cfg.sign_in_name_limit,
                cfg.sign_in_name_window
            ),
            (
                5,
                Duration::from_secs(900),
                20,
                50,
                Duration::from_secs(86400)
            )
        );
        let (cfg, ok) = read(&[
            ("NOTIFY_CONSOLE_SIGN_IN_ADDRESS_LIMIT", "40"),
            ("NOTIFY_CONSOLE_SIGN_IN_NAME_LIMIT", "10"),
            ("NOTIFY_CONSOLE_SIGN_IN_NAME_WINDOW", "1h"),
        ]);
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(
            (
                cfg.sign_in_address_limit,
                cfg.sign_in_name_limit,
                cfg.sign_in_name_window
            ),
            (40, 10, Duration::from_secs(3600))
        );
        let (_, err) = read(&[
            ("NOTIFY_CONSOLE_SIGN_IN_NAME_LIMIT", "0"),
            ("NOTIFY_CONSOLE_SIGN_IN_NAME_WINDOW", "0s"),
        ]);
        let err = err.unwrap_err();
        assert!(
            err.contains("NOTIFY_CONSOLE_SIGN_IN_NAME_LIMIT")
                && err.contains("NOTIFY_CONSOLE_SIGN_IN_NAME_WINDOW"),
            "{err}"
        );
    }
}
