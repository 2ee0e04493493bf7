//! The user's own settings: preferences per type and channel, and quiet hours.

use super::User;
use super::extract::JsonBody;
use crate::AppState;
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

/// The 404 of a user id that is no recipient.
pub(super) const NO_RECIPIENT: ApiError = ApiError::NotFound {
    field: "user",
    message: "no recipient with this id",
};

/// `GET /v1/inbox/preferences`: the user's settings, quiet hours and time zone.
pub(super) async fn get_preferences(
    State(app): State<AppState>,
    User(user): User,
) -> Result<Json<Value>, ApiError> {
    let p = notify_store::catalog::get_preferences(&app.pool, &user)
        .await?
        .ok_or(NO_RECIPIENT)?;
    Ok(Json(json!({
        "preferences": p.preferences.iter().map(|(t, c, on)| json!({"type": t, "channel": c, "enabled": on})).collect::<Vec<_>>(),
        "quiet_hours": p.quiet_hours,
        "timezone": p.timezone,
    })))
}

/// The body of `PUT /v1/inbox/preferences`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PreferenceBody {
    #[serde(rename = "type")]
    type_key: String,
    channel: String,
    enabled: bool,
}

/// `PUT /v1/inbox/preferences` `{"type", "channel", "enabled"}` (`*` for every type or
/// every channel, not both).
pub(super) async fn put_preference(
    State(app): State<AppState>,
    User(user): User,
    JsonBody(b): JsonBody<PreferenceBody>,
) -> Result<Json<Value>, ApiError> {
    let mut v = notify_core::validate::Violations::default();
    let channel = notify_core::validate::check_preference(&mut v, &b.type_key, &b.channel);
    v.into_result(()).map_err(ApiError::Violations)?;
    if b.type_key != "*" {
        notify_store::catalog::get_type(&app.pool, &b.type_key)
            .await?
            .ok_or(ApiError::not_found("type", "no such notification type"))?;
    }
    notify_store::catalog::set_preference(&app.pool, &user, &b.type_key, channel, b.enabled)
        .await?;
    get_preferences(State(app), User(user)).await
}

/// The body of `PUT /v1/inbox/quiet-hours`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct QuietBody {
    windows: Vec<notify_core::quiet::QuietWindow>,
}

/// `PUT /v1/inbox/quiet-hours` `{"windows": [{"start": "22:00", "end": "07:00",
/// "channels": []}]}` (an empty list removes them).
pub(super) async fn put_quiet_hours(
    State(app): State<AppState>,
    User(user): User,
    JsonBody(b): JsonBody<QuietBody>,
) -> Result<Json<Value>, ApiError> {
    let mut v = notify_core::validate::Violations::default();
    notify_core::quiet::check_windows(&mut v, &b.windows);
    v.into_result(()).map_err(ApiError::Violations)?;
    notify_store::catalog::set_quiet_hours(&app.pool, &user, &b.windows)
        .await
        .map_err(|e| match e {
            notify_store::StoreError::NotFound(_) => NO_RECIPIENT,
            e => e.into(),
        })?;
    get_preferences(State(app), User(user)).await
}
