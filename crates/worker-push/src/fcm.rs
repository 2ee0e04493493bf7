//! The FCM HTTP v1 `message` for a delivery, and the sorting of FCM's answers.
//!
//! Field sources: the FCM v1 REST reference, `projects.messages` (the `Message`,
//! `Notification`, `AndroidConfig`, `AndroidNotification`, `ApnsConfig` and
//! `WebpushConfig` objects; firebase.google.com/docs/reference/fcm/rest/v1/projects.messages,
//! also in googleapis' discovery document `fcm/v1/fcm-api.json`).
//!
//! What the message carries:
//! - `notification`: `title`, `body` and `image` (the content's https image; FCM: "the
//!   URL of an image that is going to be downloaded on the device and displayed").
//! - `data` (string values only): `overrides.fcm_data`, then our own keys, which win over
//!   an override of the same name: `delivery_id`, `event_id`, `type`, `url` and, when the
//!   content has actions, `actions` = the JSON text of `[{"id","label","url"}]`, so the app
//!   can draw the buttons and report the action id it was tapped with.
//! - `android.notification`: `channel_id` (the override), `tag` (the thread: "a
//!   notification with the same tag replaces the existing one in the drawer") and
//!   `notification_count` (the badge; Android launchers show it where they support
//!   badges). The click link is NOT put in `click_action`: the reference defines it as an
//!   intent action ("an activity with a matching intent filter is launched"), not a URL.
//!   The link reaches the app as `data.url`: when the user taps a notification message,
//!   the data payload is delivered in the extras of the launcher activity's intent
//!   (firebase.google.com/docs/cloud-messaging/android/receive, "Handling messages").
//! - `apns` (an FCM token may belong to an iOS app): `headers` (`apns-collapse-id`,
//!   `apns-priority`), `fcm_options.image` (the image), and `payload.aps` with `category`,
//!   `thread-id`, `sound`, `interruption-level`, `badge` and `mutable-content: 1` with an
//!   image (FCM merges `aps` with `notification`, as in the Firebase "customize a message
//!   across platforms" example); the same keys as a direct APNs send ([`crate::apns`]).
//! - `webpush`: `headers` (`Topic`, `Urgency`) and `fcm_options.link` for an https link
//!   (FCM takes only https there).

use notify_core::{ErrorClass, Priority};
use notify_worker::Job;
use serde_json::{Map, Value, json};

/// Most bytes of an FCM message (the `message` object as JSON).
pub const FCM_MAX_PAYLOAD_BYTES: usize = 4096;

/// The parts of an FCM request named when it does not fit.
pub(crate) const FCM_PARTS: &[&str] = &[
    "/message/notification/title",
    "/message/notification/body",
    "/message/notification/image",
    "/message/data",
    "/message/android",
    "/message/apns",
    "/message/webpush",
];

/// The `actions` value of push `data` and APNs custom keys: `[{"id","label","url"}]`.
pub(crate) fn actions_json(job: &Job) -> Value {
    Value::Array(
        job.content
            .actions
            .iter()
            .map(|a| json!({"id": a.id, "label": a.label, "url": a.url}))
            .collect(),
    )
}

/// The `aps` keys besides `alert` shared by direct APNs sends and FCM's `apns` block:
/// `category`, `thread-id` (override, else the thread), `sound` (override, else
/// `default`), `interruption-level`, `badge` and `mutable-content: 1` when there is an
/// image (so the app's notification service extension can download and attach it).
pub(crate) fn aps_extras(job: &Job, badge: Option<u32>) -> Map<String, Value> {
    let c = &job.content;
    let o = &c.overrides;
    let mut aps = Map::new();
    let sound = if o.apns_sound.is_empty() {
        "default"
    } else {
        &o.apns_sound
    };
    aps.insert("sound".into(), json!(sound));
    if !o.apns_category.is_empty() {
        aps.insert("category".into(), json!(o.apns_category));
    }
    let thread = if o.apns_thread_id.is_empty() {
        &c.thread
    } else {
        &o.apns_thread_id
    };
    if !thread.is_empty() {
        aps.insert("thread-id".into(), json!(thread));
    }
    if !o.apns_interruption_level.is_empty() {
        aps.insert(
            "interruption-level".into(),
            json!(o.apns_interruption_level),
        );
    }
    if let Some(n) = badge {
        aps.insert("badge".into(), json!(n));
    }
    if !c.image_url.is_empty() {
        aps.insert("mutable-content".into(), json!(1));
    }
    aps
}

/// The request body (`{"message": ...}`) for `job` to `token` with `text` as the body.
pub(crate) fn message(job: &Job, token: &str, badge: Option<u32>) -> impl Fn(&str) -> Value {
    let c = &job.content;
    let collapse = job.event_id.to_string();
    let (android_priority, apns_priority, urgency) = match job.priority {
        Priority::High => ("high", "10", "high"),
        Priority::Low => ("normal", "5", "low"),
        Priority::Normal => ("normal", "10", "normal"),
    };
    let mut data: Map<String, Value> = c
        .overrides
        .fcm_data
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    data.insert("delivery_id".into(), json!(job.id.to_string()));
    data.insert("event_id".into(), json!(job.event_id.to_string()));
    data.insert("type".into(), json!(job.type_key));
    data.insert("url".into(), json!(c.url));
    if !c.actions.is_empty() {
        data.insert("actions".into(), json!(actions_json(job).to_string()));
    }
    let mut android_notification = Map::new();
    if !c.overrides.android_channel_id.is_empty() {
        android_notification.insert("channel_id".into(), json!(c.overrides.android_channel_id));
    }
    if !c.thread.is_empty() {
        android_notification.insert("tag".into(), json!(c.thread));
    }
    if let Some(n) = badge {
        android_notification.insert("notification_count".into(), json!(n));
    }
    let mut android = json!({"collapse_key": collapse, "priority": android_priority});
    if !android_notification.is_empty() {
        android["notification"] = Value::Object(android_notification);
    }
    let mut apns = json!({
        "headers": {"apns-collapse-id": collapse, "apns-priority": apns_priority},
        "payload": {"aps": aps_extras(job, badge)},
    });
    if !c.image_url.is_empty() {
        apns["fcm_options"] = json!({"image": c.image_url});
    }
    let mut webpush = json!({
        "headers": {"Topic": job.event_id.simple().to_string(), "Urgency": urgency},
    });
    if c.url.starts_with("https://") {
        webpush["fcm_options"] = json!({"link": c.url});
    }
    let mut notification = json!({"title": c.title});
    if !c.image_url.is_empty() {
        notification["image"] = json!(c.image_url);
    }
    let token = token.to_string();
    move |text: &str| {
        let mut notification = notification.clone();
        notification["body"] = json!(text);
        json!({
            "message": {
                "token": token,
                "notification": notification,
                "data": data,
                "android": android,
                "apns": apns,
                "webpush": webpush,
            }
        })
    }
}

/// Sorts an FCM v1 error answer (HTTP status + `google.rpc.Status` body with an
/// `FcmError.errorCode` detail) into a class and a normalised code.
pub fn classify_fcm_error(status: u16, body: &Value) -> (ErrorClass, String) {
    let details = body["error"]["details"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let fcm_code = details
        .iter()
        .find_map(|d| d["errorCode"].as_str())
        .or_else(|| body["error"]["status"].as_str())
        .unwrap_or("")
        .to_string();
    let bad_token = details.iter().any(|d| {
        d["fieldViolations"].as_array().is_some_and(|v| {
            v.iter()
                .any(|f| f["field"].as_str() == Some("message.token"))
        })
    });
    // FCM answers a message over its size limit with a plain INVALID_ARGUMENT whose text
    // says so ("Message is too big", "Android message is too big"; FCM v1 ErrorCode
    // reference, INVALID_ARGUMENT: "message too big"), in the status message or a
    // BadRequest field violation.
    let too_big = |text: &str| text.to_ascii_lowercase().contains("too big");
    let message_too_big = body["error"]["message"].as_str().is_some_and(too_big)
        || details.iter().any(|d| {
            d["fieldViolations"].as_array().is_some_and(|v| {
                v.iter()
                    .any(|f| f["description"].as_str().is_some_and(too_big))
            })
        });
    let name = if fcm_code.is_empty() {
        format!("fcm_{status}")
    } else {
        format!("fcm_{}", fcm_code.to_ascii_lowercase())
    };
    match (status, fcm_code.as_str()) {
        // One code for every dead token, as for APNs; the FCM error code stays in the raw
        // answer kept with the attempt.
        (_, "UNREGISTERED" | "SENDER_ID_MISMATCH") => {
            (ErrorClass::InvalidEndpoint, "invalid_token".into())
        }
        (400, "INVALID_ARGUMENT") if bad_token => {
            (ErrorClass::InvalidEndpoint, "invalid_token".into())
        }
        // The same code as when the adapter itself finds the payload too large.
        (400, "INVALID_ARGUMENT") if message_too_big => {
            (ErrorClass::Permanent, "payload_too_large".into())
        }
        (429, _) | (_, "QUOTA_EXCEEDED") => (ErrorClass::RateLimited, "fcm_quota_exceeded".into()),
        // A stale or revoked access token: retried with a fresh one.
        (401, "UNAUTHENTICATED") | (401, "") => {
            (ErrorClass::Transient, "fcm_unauthenticated".into())
        }
        (500..=599, _) | (_, "UNAVAILABLE") | (_, "INTERNAL") => (ErrorClass::Transient, name),
        _ => (ErrorClass::Permanent, name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(status: u16, code: &str, detail: Value) -> Value {
        json!({"error": {"code": status, "status": code, "message": "x", "details": [detail]}})
    }

    #[test]
    fn fcm_errors_are_sorted_per_the_error_code_table() {
        let fcm = |c: &str| json!({"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": c});
        let cases = [
            (
                404,
                err(404, "NOT_FOUND", fcm("UNREGISTERED")),
                ErrorClass::InvalidEndpoint,
                "invalid_token",
            ),
            (
                403,
                err(403, "PERMISSION_DENIED", fcm("SENDER_ID_MISMATCH")),
                ErrorClass::InvalidEndpoint,
                "invalid_token",
            ),
            (
                400,
                err(
                    400,
                    "INVALID_ARGUMENT",
                    json!({"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field": "message.token", "description": "bad"}]}),
                ),
                ErrorClass::InvalidEndpoint,
                "invalid_token",
            ),
            (
                400,
                err(400, "INVALID_ARGUMENT", fcm("INVALID_ARGUMENT")),
                ErrorClass::Permanent,
                "fcm_invalid_argument",
            ),
            (
                400,
                json!({"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "Android message is too big", "details": [fcm("INVALID_ARGUMENT")]}}),
                ErrorClass::Permanent,
                "payload_too_large",
            ),
            (
                400,
                err(
                    400,
                    "INVALID_ARGUMENT",
                    json!({"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field": "message", "description": "Message is too big. Limit is 4096 bytes."}]}),
                ),
                ErrorClass::Permanent,
                "payload_too_large",
            ),
            (
                429,
                err(429, "RESOURCE_EXHAUSTED", fcm("QUOTA_EXCEEDED")),
                ErrorClass::RateLimited,
                "fcm_quota_exceeded",
            ),
            (
                503,
                err(503, "UNAVAILABLE", fcm("UNAVAILABLE")),
                ErrorClass::Transient,
                "fcm_unavailable",
            ),
            (500, Value::Null, ErrorClass::Transient, "fcm_500"),
            (
                401,
                json!({"error": {"code": 401, "status": "UNAUTHENTICATED"}}),
                ErrorClass::Transient,
                "fcm_unauthenticated",
            ),
            (
                401,
                err(401, "UNAUTHENTICATED", fcm("THIRD_PARTY_AUTH_ERROR")),
                ErrorClass::Permanent,
                "fcm_third_party_auth_error",
            ),
        ];
        for (status, body, class, code) in cases {
            assert_eq!(
                classify_fcm_error(status, &body),
                (class, code.to_string()),
                "status {status}"
            );
        }
    }
}
