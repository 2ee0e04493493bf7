//! The console's pages (every GET): overview, search, an event, the confirmation of an
//! action, and the audit log.

use super::access::{require, require_staff};
use super::actions::dead_depth;
use super::render::{HtmlError, Page, csrf_form, page, secs, uuid};
use crate::AppState;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use notify_core::DeliveryStatus;
use notify_core::content::escape_html as esc;
use notify_store::events::{self, EventSelector};
use serde::Deserialize;

/// `GET /console`: deliveries per channel and status, outbox lag, the dead-letter queue.
pub(super) async fn overview(State(app): State<AppState>, headers: HeaderMap) -> Page {
    let user = require(&app, &headers).await?;
    let (channels, lag) = notify_store::console::overview(&app.pool).await?;
    let statuses = notify_store::console::OVERVIEW_STATUSES
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(" / ");
    let mut body = format!(
        "<table><tr><th>channel</th><th>last hour: {statuses}</th>\
         <th>last day: {statuses}</th><th>oldest due pending</th><th>retry rate (1 h)</th></tr>",
    );
    for c in &channels {
        // Each count wears its status's class (failed red, skipped grey, ...).
        let fmt = |a: &[i64]| {
            notify_store::console::OVERVIEW_STATUSES
                .iter()
                .zip(a)
                .map(|(s, n)| format!("<span class=\"{}\">{n}</span>", s.as_str()))
                .collect::<Vec<_>>()
                .join(" / ")
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
    Ok(page("Overview", Some(&user), &body))
}

#[derive(Deserialize)]
pub(super) struct SearchQuery {
    #[serde(default)]
    q: String,
}

/// `GET /console/search?q=`: events by event id, event key, user id or type.
pub(super) async fn search(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SearchQuery>,
) -> Page {
    let user = require(&app, &headers).await?;
    // NFC, as every id and key is stored (notify_core::validate::Violations::id).
    let query: String = unicode_normalization::UnicodeNormalization::nfc(q.q.trim()).collect();
    let query = query.as_str();
    if query.is_empty() {
        return Ok(page(
            "Search",
            Some(&user),
            "<p>Type an event key, event id, user id or type.</p>",
        ));
    }
    let found = notify_store::console::search(&app.pool, query).await?;
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
    Ok(page("Search", Some(&user), &body))
}

/// `GET /console/events/{id}`: the recipient x channel matrix and every attempt.
pub(super) async fn event_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Page {
    let user = require(&app, &headers).await?;
    let id = uuid(&id)?;
    // One snapshot for the matrix, its skips and every attempt.
    let mut snap = notify_store::snapshot(&app.pool).await?;
    let event = events::get_event(&mut *snap, &EventSelector::Id(id))
        .await?
        .ok_or_else(HtmlError::not_found)?;
    let deliveries = events::list_deliveries(&mut *snap, id, None, 1000).await?;
    let skips = events::list_skips(&mut *snap, id, 1000)
        .await
        .unwrap_or_default();
    let canceled = match &event.canceled_at {
        Some(at) => {
            let c = notify_store::cancel::counts(&mut snap, &[id], &[]).await?;
            format!(
                "<p class=\"canceled\">canceled {} by {} · canceled {} · sent {} · failed {} · skipped {} · in flight {} · not created {}</p>",
                at.to_rfc3339(),
                esc(event.canceled_by.as_deref().unwrap_or("")),
                c.canceled,
                c.sent,
                c.failed,
                c.skipped,
                c.in_flight,
                c.not_created
            )
        }
        None => String::new(),
    };
    let mut body = format!(
        "<p>key <b>{}</b> · type <b>{}</b> · created {} · topic {} · <a href=\"/console/confirm?action=cancel&amp;target={id}\">cancel pending deliveries…</a></p>{canceled}\
         <p>Title: {}<br>Body: {}</p>",
        esc(&event.event_key),
        esc(&event.type_key),
        event.created_at.to_rfc3339(),
        esc(event.topic.as_deref().unwrap_or("–")),
        esc(&event.content.title),
        esc(&event.content.body),
    );
    if let Some(due) = event.send_at {
        body.push_str(&format!(
            "<p>scheduled: due at <b>{}</b> (its pending deliveries wait until then)</p>",
            due.to_rfc3339()
        ));
    }
    body.push_str("<h2>Recipients x channels</h2><table><tr><th>user</th><th>channel</th><th>provider</th><th>cause</th><th>status</th><th>attempts</th><th>next attempt</th><th>deferred until</th><th>last error</th><th>decision</th><th></th></tr>");
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
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{st}\">{st}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td><td>{action}</td></tr>",
            esc(&d.user_id),
            esc(d.channel.as_str()),
            esc(d.provider.as_str()),
            // planned, or derived: fallback / escalation, with the delivery it derives from
            match d.caused_by {
                Some(parent) => format!("{} of {parent}", d.cause.as_str()),
                None => d.cause.as_str().to_string(),
            },
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
            "<tr><td>{}</td><td>{}</td><td>–</td><td>–</td><td>skipped</td><td>–</td><td>–</td><td>–</td><td>{}</td><td><pre>{}</pre></td><td></td></tr>",
            esc(&s.user_id),
            esc(s.channel.as_str()),
            esc(&s.reason),
            esc(&s.decision)
        ));
    }
    body.push_str("</table><h2>Attempts</h2>");
    for d in deliveries.iter().filter(|d| d.attempts > 0).take(100) {
        let attempts = events::attempts_of(&mut *snap, d.id)
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
    Ok(page(&format!("Event {id}"), Some(&user), &body))
}

/// `GET /console/audit`: the newest 200 actions of `console_audit`.
pub(super) async fn audit(State(app): State<AppState>, headers: HeaderMap) -> Page {
    let user = require(&app, &headers).await?;
    let rows = notify_store::console::audit_log(&app.pool, 200).await?;
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
    Ok(page("Audit log", Some(&user), &body))
}

#[derive(Deserialize)]
pub(super) struct ConfirmQuery {
    action: String,
    target: String,
}

/// `GET /console/confirm?action=&target=`: the confirmation form of an action.
pub(super) async fn confirm_page(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<ConfirmQuery>,
) -> Page {
    let s = require_staff(&app, &headers).await?;
    let user = s.name.clone();
    let target = uuid(&q.target)?;
    let what = match q.action.as_str() {
        "retry" => format!("Retry the failed delivery {target} now?"),
        "cancel" => format!("Cancel every pending delivery of event {target}?"),
        "requeue-dead" => {
            "Move up to 1,000 dead-lettered messages back to their channel queues?".to_string()
        }
        _ => return Err(HtmlError::not_found()),
    };
    let action = if q.action == "requeue-dead" {
        "/console/actions/requeue-dead".to_string()
    } else {
        format!("/console/actions/{}/{target}", q.action)
    };
    Ok(page(
        "Confirm",
        Some(&user),
        &format!(
            "<p>{}</p>{}",
            esc(&what),
            csrf_form(&app, &s.binding, &action, "Confirm")
        ),
    ))
}
