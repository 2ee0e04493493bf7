//! The console's webhooks page (`/console/webhooks`): every caller's status-webhook
//! endpoint (`webhook_endpoints`) with its event types, whether it is enabled and why
//! not, since when it has been failing, how many of its messages are pending, and its
//! latest 20 POSTs (`webhook_attempts`: status, latency, error, time). A disabled
//! endpoint can be enabled again through a confirmation page, a CSRF token and the audit
//! log (`webhook_enable`); enabling clears its failure run, as the caller's own
//! `UpdateWebhookEndpoint` does.

use super::access::{ActionForm, action_user, require_staff};
use super::render::{HtmlError, Page, csrf_form, page, uuid};
use crate::AppState;
use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect};
use notify_core::content::escape_html as esc;
use notify_store::webhooks::{self as store, EndpointChange};
use std::collections::HashMap;

/// How many attempts the page lists per endpoint.
const ATTEMPTS_SHOWN: i64 = 20;

/// `GET /console/webhooks`.
pub(super) async fn webhooks_page(State(app): State<AppState>, headers: HeaderMap) -> Page {
    let user = require_staff(&app, &headers).await?.name;
    let endpoints = store::list_endpoints(&app.pool, None).await?;
    let pending: HashMap<uuid::Uuid, i64> = store::pending_per_endpoint(&app.pool)
        .await?
        .into_iter()
        .collect();
    let mut body = String::from(
        "<p>Status webhook endpoints of every caller. worker-webhook disables an endpoint whose \
         every attempt failed for longer than <code>NOTIFY_WEBHOOK_DISABLE_AFTER</code>.</p>",
    );
    if endpoints.is_empty() {
        body.push_str("<p>No endpoint is registered.</p>");
    }
    for e in &endpoints {
        let id = e.id;
        let types = if e.event_types.is_empty() {
            "all".to_string()
        } else {
            e.event_types.join(", ")
        };
        let state = if e.enabled {
            "<span class=\"sent\">enabled</span>".to_string()
        } else {
            format!(
                "<span class=\"failed\">disabled</span>: {} \
                 <a href=\"/console/webhooks/confirm-enable/{id}\">Re-enable…</a>",
                esc(e.disabled_reason.as_deref().unwrap_or(""))
            )
        };
        body.push_str(&format!(
            "<h2 id=\"endpoint-{id}\">{}</h2><table>\
             <tr><th>Endpoint</th><td>{id}</td></tr><tr><th>Caller</th><td>{}</td></tr>\
             <tr><th>Event types</th><td>{}</td></tr><tr><th>State</th><td>{state}</td></tr>\
             <tr><th>Failing since</th><td>{}</td></tr><tr><th>Pending messages</th><td>{}</td></tr>\
             </table>",
            esc(&e.url),
            esc(&e.caller),
            esc(&types),
            e.failing_since.map_or("–".into(), |t| t.to_rfc3339()),
            pending.get(&id).copied().unwrap_or(0),
        ));
        let attempts = store::latest_attempts(&app.pool, id, ATTEMPTS_SHOWN).await?;
        body.push_str(
            "<table><tr><th>Started</th><th>Message</th><th>Event type</th><th>Attempt</th>\
             <th>Status</th><th>Latency</th><th>Error</th></tr>",
        );
        if attempts.is_empty() {
            body.push_str("<tr><td colspan=\"7\">No attempt yet.</td></tr>");
        }
        for a in &attempts {
            body.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td>\
                 <td>{} ms</td><td>{}</td></tr>",
                a.started_at.to_rfc3339(),
                a.message_id,
                esc(&a.event_type),
                a.attempt,
                if a.error.is_none() { "sent" } else { "failed" },
                a.status_code.map_or("–".into(), |c| c.to_string()),
                a.latency_ms,
                esc(a.error.as_deref().unwrap_or("")),
            ));
        }
        body.push_str("</table>");
    }
    Ok(page("Webhooks", Some(&user), &body))
}

/// `GET /console/webhooks/confirm-enable/{id}`.
pub(super) async fn confirm_enable(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Page {
    let s = require_staff(&app, &headers).await?;
    let id = uuid(&id)?;
    let Some(e) = store::get_endpoint(&app.pool, id).await? else {
        return Err(HtmlError::not_found());
    };
    Ok(page(
        "Confirm",
        Some(&s.name),
        &format!(
            "<p>Enable the webhook endpoint {} of {} again? It is {}. Its failure run is \
             cleared; state changes from now on are sent to it.</p>{}",
            esc(&e.url),
            esc(&e.caller),
            if e.enabled {
                "already enabled".to_string()
            } else {
                format!(
                    "disabled: {}",
                    esc(e.disabled_reason.as_deref().unwrap_or(""))
                )
            },
            csrf_form(
                &app,
                &s.binding,
                &format!("/console/actions/webhooks/{id}/enable"),
                "Confirm"
            )
        ),
    ))
}

/// `POST /console/actions/webhooks/{id}/enable`: enables a disabled endpoint, recorded in
/// the audit log with the reason it had. An endpoint already enabled is left alone.
pub(super) async fn enable(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<ActionForm>,
) -> Page {
    let staff = action_user(&app, &headers, &f).await?;
    let id = uuid(&id)?;
    let Some(before) = store::get_endpoint(&app.pool, id).await? else {
        return Err(HtmlError::not_found());
    };
    if !before.enabled {
        let change = EndpointChange {
            enabled: Some(true),
            ..Default::default()
        };
        store::update_endpoint(&app.pool, id, None, &change, &staff).await?;
        let detail = format!(
            "{} ({}; was: {})",
            before.url,
            before.caller,
            before.disabled_reason.as_deref().unwrap_or("disabled")
        );
        notify_store::console::record(
            &app.pool,
            &staff,
            "webhook_enable",
            &id.to_string(),
            &detail,
        )
        .await?;
        tracing::info!(staff = %staff, endpoint_id = %id, "console: webhook endpoint enabled");
    }
    Ok(Redirect::to(&format!("/console/webhooks#endpoint-{id}")).into_response())
}
