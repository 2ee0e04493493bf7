//! The user's devices: registering an FCM/APNs token or a Web Push subscription, and
//! removing one.

use super::User;
use super::extract::{JsonBody, path_id};
use super::settings::NO_RECIPIENT;
use crate::AppState;
use crate::error::ApiError;
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::json;

/// The body of `POST /v1/inbox/devices`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeviceBody {
    platform: String,
    #[serde(default)]
    token: String,
    #[serde(default)]
    web_push: Option<WebPushBody>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebPushBody {
    endpoint: String,
    keys: WebPushKeys,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebPushKeys {
    p256dh: String,
    auth: String,
}

/// `POST /v1/inbox/devices` `{"platform": "fcm"|"apns", "token"}` or `{"platform":
/// "webpush", "web_push": <PushSubscription.toJSON()>}`: registers (or re-activates) the
/// user's device; answers 201 `{"endpoint_id"}`.
pub(super) async fn register_device(
    State(app): State<AppState>,
    User(user): User,
    JsonBody(b): JsonBody<DeviceBody>,
) -> Result<impl IntoResponse, ApiError> {
    let mut v = notify_core::validate::Violations::default();
    let web_push = b.web_push.as_ref().map(|w| {
        (
            w.endpoint.as_str(),
            w.keys.p256dh.as_str(),
            w.keys.auth.as_str(),
        )
    });
    let (token, subscription) = notify_core::push_endpoint::check_endpoint(
        &mut v,
        &app.cfg.links,
        &b.platform,
        &b.token,
        web_push,
    );
    v.into_result(()).map_err(ApiError::Violations)?;
    let id = notify_store::catalog::register_endpoint(
        &app.pool,
        &user,
        &b.platform,
        &token,
        subscription.as_ref(),
    )
    .await
    .map_err(|e| match e {
        notify_store::StoreError::NotFound(_) => NO_RECIPIENT,
        e => e.into(),
    })?;
    Ok((StatusCode::CREATED, Json(json!({"endpoint_id": id}))))
}

/// `DELETE /v1/inbox/devices/{id}`: the user's device stops getting push (idempotent).
pub(super) async fn unregister_device(
    State(app): State<AppState>,
    User(user): User,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = path_id(id, "an endpoint")?;
    notify_store::inbox::revoke_own_endpoint(&app.pool, &user, id)
        .await?
        .ok_or(ApiError::not_found("id", "no such device"))?;
    Ok(StatusCode::NO_CONTENT)
}
