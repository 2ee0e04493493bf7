//! Signing in and out of the console with configured credentials (see [`staff`]).

use super::access::{ActionForm, action_staff, check_origin, require_staff};
use super::render::{HtmlError, Page, csrf_form, page};
use super::staff;
use super::throttle::Attempt;
use crate::AppState;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect};
use serde::Deserialize;

/// `GET /console/login`: the sign-in form (404 without configured users).
pub(super) async fn login_page(State(app): State<AppState>) -> Page {
    if app.console.users.is_empty() {
        return Err(HtmlError::not_found());
    }
    Ok(page(
        "Sign in",
        None,
        "<form method=\"post\" action=\"/console/login\"><p><label>Name <input name=\"user\" autocomplete=\"username\"></label></p>\
         <p><label>Password <input name=\"password\" type=\"password\" autocomplete=\"current-password\"></label></p><button>Sign in</button></form>",
    ))
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    user: String,
    password: String,
}

/// `POST /console/login`: takes an attempt from the throttle's buckets (see
/// [`super::throttle`]; 429 with `Retry-After` and no password check when one is used up),
/// then checks the password and starts a session.
pub(super) async fn login(
    State(app): State<AppState>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    Form(f): Form<LoginForm>,
) -> Page {
    let cfg = &app.console;
    if cfg.users.is_empty() {
        return Err(HtmlError::not_found());
    }
    check_origin(&app, &headers)?;
    let addr = extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let attempt = match Attempt::take(&app.pool, cfg, &f.user, addr).await? {
        Ok(attempt) => attempt,
        Err(wait) => {
            tracing::warn!("console sign-in throttled");
            let mut r = page(
                "Sign in",
                None,
                &format!(
                    "<p class=\"failed\">Too many sign-in attempts. Try again in {} minute(s).</p>",
                    wait.div_ceil(60)
                ),
            );
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            r.headers_mut().insert(
                header::RETRY_AFTER,
                wait.to_string().parse().expect("digits"),
            );
            return Ok(r);
        }
    };
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
        attempt.failed(&app.pool).await?;
        // The typed name is never logged.
        tracing::warn!("console sign-in refused");
        let mut r = page(
            "Sign in",
            None,
            "<p class=\"failed\">Wrong name or password.</p><p><a href=\"/console/login\">Try again</a></p>",
        );
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return Ok(r);
    }
    attempt.succeeded(&app.pool).await?;
    let (id, id_hash) = staff::new_session_id();
    notify_store::console::create_session(&app.pool, &id_hash, &f.user, cfg.session_ttl).await?;
    let mut r = Redirect::to("/console").into_response();
    if let Ok(v) = staff::session_cookie(cfg, &id).parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// `GET /console/logout`: a page with the sign-out button (a GET changes nothing).
pub(super) async fn logout_page(State(app): State<AppState>, headers: HeaderMap) -> Page {
    let s = require_staff(&app, &headers).await?;
    Ok(page(
        "Sign out",
        Some(&s.name),
        &csrf_form(&app, &s.binding, "/console/logout", "Sign out"),
    ))
}

/// `POST /console/logout`: deletes the session, so its cookie is refused from now on.
pub(super) async fn logout(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Page {
    let s = action_staff(&app, &headers, &f).await?;
    if let Some(hash) = &s.session {
        notify_store::console::delete_session(&app.pool, hash).await?;
    }
    let mut r = Redirect::to("/console/login").into_response();
    if let Ok(v) = staff::clear_cookie(&app.console).parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}
