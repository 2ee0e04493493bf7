//! Live updates: `GET /v1/inbox/stream` (Server-Sent Events; see the [`super`] module
//! docs) and the Postgres `LISTEN inbox` task that wakes the streams.

use super::User;
use super::extract::Params;
use super::feed::{item_json, tz_of};
use crate::AppState;
use crate::error::ApiError;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use notify_store::inbox;
use serde_json::json;
use std::time::Duration;

/// Fans Postgres `inbox` notifications out to the streams of this replica: one per
/// statement that wrote notifications, a line `"<user> <seq>"` per user it changed
/// (`migrations/20261203000035_inbox_seq_per_statement.sql`). Runs until the process ends; the listener reconnects by itself.
pub async fn listen(pool: notify_store::PgPool, hub: tokio::sync::broadcast::Sender<String>) {
    loop {
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "inbox LISTEN failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(e) = listener.listen("inbox").await {
            tracing::warn!(error = %e, "inbox LISTEN failed; retrying");
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        loop {
            match listener.recv().await {
                Ok(n) => {
                    for user in users_of(n.payload()) {
                        let _ = hub.send(user.to_string());
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "inbox LISTEN lost; reconnecting");
                    // Streams catch up on their own timer meanwhile.
                    break;
                }
            }
        }
    }
}

/// Changes read per round of a stream.
const STREAM_PAGE: i64 = 500;

/// The user ids of an `inbox` notification's payload: the part of each line before its
/// last space (a user id may hold spaces; it holds no control characters).
fn users_of(payload: &str) -> impl Iterator<Item = &str> {
    payload
        .lines()
        .filter_map(|line| line.rsplit_once(' ').map(|(user, _)| user))
}

/// `GET /v1/inbox/stream`: Server-Sent Events (see the module docs).
pub(super) async fn stream(
    State(app): State<AppState>,
    User(user): User,
    headers: HeaderMap,
    q: Params,
) -> Result<Response, ApiError> {
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .or(q.get("last_event_id"))
        .map(str::to_string);
    let mut last = match resume.as_deref().map(str::parse::<i64>) {
        Some(Ok(n)) if n >= 0 => n,
        Some(_) => {
            return Err(ApiError::invalid(
                "Last-Event-ID",
                "must be an event id from this stream",
            ));
        }
        None => inbox::latest_seq(&app.pool, &user).await?,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, std::convert::Infallible>>(64);
    let mut hub = app.hub.subscribe();
    let app2 = app.clone();
    tokio::spawn(async move {
        let tz = tz_of(&app2, &user).await;
        // Whether changes went out since the last unread count (the first round sends one).
        let mut uncounted = true;
        loop {
            let changes = inbox::changes_since(&app2.pool, &user, last, STREAM_PAGE)
                .await
                .unwrap_or_default();
            // A full page may have more behind it (one read-all changes every row but
            // announces once): read on at once instead of waiting for the next wake-up.
            let full = changes.len() == STREAM_PAGE as usize;
            uncounted |= !changes.is_empty();
            for item in changes {
                last = item.seq;
                let ev = Event::default()
                    .id(item.seq.to_string())
                    .event("notification")
                    .json_data(item_json(&item, Utc::now(), tz))
                    .unwrap_or_default();
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            if full {
                continue;
            }
            if uncounted {
                uncounted = false;
                let n = inbox::unread_count(&app2.pool, &user).await.unwrap_or(0);
                let ev = Event::default()
                    .event("unread_count")
                    .json_data(json!({"unread": n}))
                    .unwrap_or_default();
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            // Wake on this user's change, or every 15 s to catch up after a lost LISTEN.
            let deadline = tokio::time::sleep(Duration::from_secs(15));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    _ = &mut deadline => break,
                    _ = tx.closed() => return,
                    _ = app2.shutdown.cancelled() => return,
                    m = hub.recv() => match m {
                        Ok(u) if u == user => break,
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        }
    });
    Ok(Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::users_of;

    #[test]
    fn every_line_of_a_payload_names_a_user_and_a_space_in_an_id_is_kept() {
        let users: Vec<&str> = users_of("u-1 5\nสมชาย ใจดี 12\nu 3").collect();
        assert_eq!(users, ["u-1", "สมชาย ใจดี", "u"]);
        assert_eq!(users_of("").count(), 0);
    }
}
