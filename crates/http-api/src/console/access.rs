//! Who may use the console: the signed-in staff member (proxy header or session), the
//! `Origin` check of every POST, and the CSRF token of action forms.

use super::render::HtmlError;
use super::staff;
use crate::AppState;
use crate::error::ApiError;
use axum::http::HeaderMap;
use serde::Deserialize;

/// A signed-in staff member.
#[derive(Debug, Clone)]
pub(super) struct Staff {
    /// Their name.
    pub(super) name: String,
    /// What their CSRF token is bound to: the session id's hash in hex, or `proxy|name`
    /// behind an authenticating proxy.
    pub(super) binding: String,
    /// The session id's hash (`None` behind the proxy).
    pub(super) session: Option<Vec<u8>>,
}

/// The signed-in staff member, if any: the proxy's header, or an unexpired session in
/// `console_sessions` whose user is still configured.
async fn signed_in(app: &AppState, headers: &HeaderMap) -> Result<Option<Staff>, HtmlError> {
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
    let name = notify_store::console::session_staff(&app.pool, &hash).await?;
    Ok(name
        .filter(|n| cfg.users.iter().any(|(u, _)| u == n))
        .map(|name| Staff {
            name,
            binding: hex::encode(&hash),
            session: Some(hash),
        }))
}

/// The signed-in staff member, or the answer to send instead (login redirect, or 404 when
/// the console is not configured).
pub(super) async fn require_staff(app: &AppState, headers: &HeaderMap) -> Result<Staff, HtmlError> {
    if !app.console.enabled() {
        return Err(HtmlError::not_found());
    }
    signed_in(app, headers)
        .await?
        .ok_or(HtmlError(ApiError::SignInRequired))
}

/// The signed-in staff member's name, or the answer to send instead.
pub(super) async fn require(app: &AppState, headers: &HeaderMap) -> Result<String, HtmlError> {
    require_staff(app, headers).await.map(|s| s.name)
}

/// 403 unless the request comes from the console's own origin ([`staff::same_origin`]).
pub(super) fn check_origin(app: &AppState, headers: &HeaderMap) -> Result<(), HtmlError> {
    if staff::same_origin(&app.console, headers) {
        Ok(())
    } else {
        tracing::warn!("console POST from a foreign origin refused");
        Err(HtmlError(ApiError::Forbidden(
            "This form was sent from another site; open the console and try again.",
        )))
    }
}

/// The form of every console action: the CSRF token of the session.
#[derive(Deserialize)]
pub(super) struct ActionForm {
    /// [`staff::csrf`] of the staff member's binding.
    pub(super) csrf: String,
}

/// The staff member behind an action form: sent from the console's origin, signed in,
/// and the form's CSRF token that of their session.
pub(super) async fn action_staff(
    app: &AppState,
    headers: &HeaderMap,
    f: &ActionForm,
) -> Result<Staff, HtmlError> {
    check_origin(app, headers)?;
    let s = require_staff(app, headers).await?;
    if staff::csrf_valid(&app.console, &s.binding, &f.csrf) {
        Ok(s)
    } else {
        Err(HtmlError(ApiError::Forbidden(
            "The form expired; go back and try again.",
        )))
    }
}

/// The name of the staff member behind an action form ([`action_staff`]).
pub(super) async fn action_user(
    app: &AppState,
    headers: &HeaderMap,
    f: &ActionForm,
) -> Result<String, HtmlError> {
    action_staff(app, headers, f).await.map(|s| s.name)
}
