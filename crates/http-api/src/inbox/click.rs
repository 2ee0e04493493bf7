//! `POST /v1/inbox/notifications/{id}/click`: the user opened a notification or one of
//! its actions.

use super::User;
use super::extract::{json_body_or_empty, path_id};
use super::feed::{item_json, tz_of};
use crate::AppState;
use crate::error::ApiError;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use chrono::Utc;
use notify_store::inbox::{self, ClickOutcome};
use serde::Deserialize;
use serde_json::{Value, json};

/// The body: which action was clicked (`""` or no body: the notification itself).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ClickBody {
    #[serde(default)]
    action_id: String,
}

/// Marks the item read, records which action was clicked (once per action: a double
/// click counts once) and answers `{"url", "action_id", "counted", "item"}`: the link to
/// open (`null` when the notification has none), whether this click was counted now, and
/// the item after the change. An action id the item does not have is 400 naming
/// `action_id`; another user's or an unknown item is 404.
pub(super) async fn click(
    State(app): State<AppState>,
    User(user): User,
    id: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = path_id(id, "a notification")?;
    let req: ClickBody = json_body_or_empty(body)?;
    match inbox::click(&app.pool, &user, id, &req.action_id).await? {
        None => Err(ApiError::not_found("id", "no such notification")),
        Some(ClickOutcome::UnknownAction(ids)) => Err(ApiError::invalid_body(
            "action_id",
            if ids.is_empty() {
                "this notification has no actions; use \"\" for the notification itself".to_string()
            } else {
                format!(
                    "must be \"\" (the notification itself) or one of its actions: {}",
                    ids.join(", ")
                )
            },
        )),
        Some(ClickOutcome::Opened { item, url, counted }) => {
            let tz = tz_of(&app, &user).await;
            Ok(Json(json!({
                "url": url,
                "action_id": req.action_id,
                "counted": counted,
                "item": item_json(&item, Utc::now(), tz),
            })))
        }
    }
}
