//! The console's actions (every POST but sign-in): retry a failed delivery, cancel an
//! event's pending deliveries, move dead letters back; each audited in `console_audit`.

use super::access::{ActionForm, action_user};
use super::render::{HtmlError, Page, page, uuid};
use crate::AppState;
use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect};
use notify_core::content::escape_html as esc;
use uuid::Uuid;

/// What a `POST /console/actions/<action>/{id}` does to its target.
#[derive(Debug, Clone, Copy)]
pub(super) enum Action {
    /// `retry/{delivery id}`: a failed delivery is due again now.
    Retry,
    /// `cancel/{event id}`: cancels the event as `CancelEvent` does (the same store path):
    /// every pending delivery, and subscribers its fan-out has not planned yet.
    Cancel,
}

/// `POST /console/actions/retry/{id}` and `POST /console/actions/cancel/{id}` ([`Action`]);
/// both answer with the event's page.
pub(super) async fn on_target(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<ActionForm>,
    action: Action,
) -> Page {
    let user = action_user(&app, &headers, &f).await?;
    let id = uuid(&id)?;
    match action {
        Action::Retry => retry(&app, &user, id).await,
        Action::Cancel => {
            // An unknown event: nothing to cancel, and its page answers 404.
            match notify_store::console::cancel_event(&app.pool, &user, id).await {
                Ok(out) => {
                    notify_telemetry::metrics::count_cancel("console", out.newly_canceled);
                    tracing::info!(
                        staff = %user,
                        event_id = %id,
                        canceled = out.newly_canceled,
                        in_flight = out.in_flight,
                        not_created = out.not_created,
                        "console: cancel"
                    )
                }
                Err(notify_store::StoreError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Redirect::to(&format!("/console/events/{id}")).into_response())
        }
    }
}

async fn retry(app: &AppState, user: &str, id: Uuid) -> Page {
    let event_id: Option<Uuid> = notify_store::sqlx::query_scalar(
        "SELECT event_id FROM notification_deliveries WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&app.pool)
    .await
    .ok()
    .flatten();
    match notify_store::console::retry_delivery(&app.pool, user, id).await {
        Ok(()) => {
            tracing::info!(staff = %user, delivery_id = %id, "console: retry");
            Ok(
                Redirect::to(&format!("/console/events/{}", event_id.unwrap_or(id)))
                    .into_response(),
            )
        }
        Err(notify_store::StoreError::NotFound(_)) => Ok(page(
            "Not retried",
            Some(user),
            "<p>That delivery is not failed (any more).</p>",
        )),
        Err(e) => Err(e.into()),
    }
}

/// How many messages the dead-letter queue holds.
pub(super) async fn dead_depth(
    url: &str,
    topology: &notify_broker::Topology,
) -> Result<u32, String> {
    let conn = notify_broker::connect(url, "http-api-console")
        .await
        .map_err(|e| e.to_string())?;
    let depth = notify_broker::dead_letter_depth(&conn, topology)
        .await
        .map_err(|e| e.to_string());
    let _ = conn.close(200, "done".into()).await;
    depth
}

/// `POST /console/actions/requeue-dead`: moves up to 1,000 dead letters back to their
/// channel queues.
pub(super) async fn requeue_dead(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<ActionForm>,
) -> Page {
    let user = action_user(&app, &headers, &f).await?;
    let Some((url, topology)) = &app.console.amqp else {
        return Err(HtmlError::not_found());
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
            notify_store::console::record(
                &app.pool,
                &user,
                "requeue_dead_letters",
                "deliveries.dead",
                &detail,
            )
            .await?;
            tracing::info!(staff = %user, moved, left, "console: dead letters moved back");
            Ok(page(
                "Dead letters",
                Some(&user),
                &format!(
                    "<p>{}</p><p><a href=\"/console\">Back to the overview</a></p>",
                    esc(&detail)
                ),
            ))
        }
        Err(e) => Ok(page(
            "Dead letters",
            Some(&user),
            &format!("<p class=\"failed\">Stopped: {}</p>", esc(&e.to_string())),
        )),
    }
}
