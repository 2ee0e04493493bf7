//! Google: the OAuth2 JWT-bearer grant (RFC 7523) that issues FCM access tokens, and
//! FCM HTTP v1 send (firebase.google.com/docs/reference/fcm/rest/v1/projects.messages/send).

use super::{Sim, answer, apply_fault, bearer, json_body, rand_id};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use uuid::Uuid;

#[derive(Deserialize)]
struct GrantClaims {
    iss: String,
    scope: String,
    iat: i64,
    exp: i64,
}

/// `POST /token`: the JWT-bearer grant; an RS256 assertion by the configured service
/// account gets a one-hour access token.
pub(crate) async fn oauth_token(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let form: HashMap<String, String> = url_decode(&String::from_utf8_lossy(&body));
    let recorded = json!(
        form.iter()
            .map(|(k, v)| (
                k.clone(),
                Value::String(if k == "assertion" {
                    format!("{}...", &v[..v.len().min(16)])
                } else {
                    v.clone()
                })
            ))
            .collect::<serde_json::Map<_, _>>()
    );
    let (status, resp) = 'done: {
        if form.get("grant_type").map(String::as_str)
            != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
        {
            break 'done (400, json!({"error": "unsupported_grant_type"}));
        }
        let Some(assertion) = form.get("assertion") else {
            break 'done (
                400,
                json!({"error": "invalid_request", "error_description": "assertion missing"}),
            );
        };
        // Google accepts base64url with or without padding (gcp_auth pads); jsonwebtoken
        // wants none. The signature covers the segments exactly as sent.
        let Some((message, signature)) = assertion.rsplit_once('.') else {
            break 'done (
                400,
                json!({"error": "invalid_grant", "error_description": "malformed JWT"}),
            );
        };
        let key = match DecodingKey::from_rsa_pem(sim.cfg.fcm_public_key_pem.as_bytes()) {
            Ok(key) => key,
            Err(e) => {
                break 'done (
                    500,
                    json!({"error": "server_error", "error_description": e.to_string()}),
                );
            }
        };
        match jsonwebtoken::crypto::verify(
            signature.trim_end_matches('='),
            message.as_bytes(),
            &key,
            Algorithm::RS256,
        ) {
            Ok(true) => {}
            Ok(false) => {
                break 'done (
                    400,
                    json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
                );
            }
            Err(e) => {
                break 'done (
                    400,
                    json!({"error": "invalid_grant", "error_description": format!("Invalid JWT: {e}")}),
                );
            }
        }
        let unpadded = assertion
            .split('.')
            .map(|p| p.trim_end_matches('='))
            .collect::<Vec<_>>()
            .join(".");
        let claims = match jsonwebtoken::dangerous::insecure_decode_claims::<GrantClaims>(&unpadded)
        {
            Ok(c) => c,
            Err(e) => {
                break 'done (
                    400,
                    json!({"error": "invalid_grant", "error_description": format!("Invalid JWT claims: {e}")}),
                );
            }
        };
        let now = chrono::Utc::now().timestamp();
        if claims.exp < now || claims.iat > now + 60 || claims.exp - claims.iat > 3600 {
            break 'done (
                400,
                json!({"error": "invalid_grant", "error_description": "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe."}),
            );
        }
        if claims.iss != sim.cfg.fcm_client_email {
            break 'done (
                400,
                json!({"error": "invalid_grant", "error_description": "Invalid issuer"}),
            );
        }
        if !claims
            .scope
            .split(' ')
            .any(|s| s == "https://www.googleapis.com/auth/firebase.messaging")
        {
            break 'done (400, json!({"error": "invalid_scope"}));
        }
        let token = format!("ya29.sim-{}", Uuid::new_v4().simple());
        sim.inner
            .lock()
            .expect("sim lock")
            .access_tokens
            .insert(token.clone());
        (
            200,
            json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}),
        )
    };
    sim.record("oauth", "/token", &headers, &recorded, status);
    answer(status, resp, &[])
}

fn url_decode(s: &str) -> HashMap<String, String> {
    fn dec(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                        out.push(b);
                        i += 2;
                    } else {
                        out.push(b'%');
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into()
    }
    s.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (dec(k), dec(v)))
        .collect()
}

fn fcm_error(status: u16, rpc_status: &str, message: &str, error_code: &str) -> Value {
    json!({"error": {"code": status, "message": message, "status": rpc_status, "details": [
        {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": error_code}
    ]}})
}

/// `POST /v1/projects/{project}/messages:send`: one FCM message, with a token from
/// `/token`.
pub(crate) async fn fcm_send(
    State(sim): State<Sim>,
    Path(project): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    sim.latency("fcm").await;
    let body = json_body(&body);
    let path = format!("/v1/projects/{project}/messages:send");
    let (status, resp) = 'done: {
        let authed = bearer(&headers).is_some_and(|t| {
            sim.inner
                .lock()
                .expect("sim lock")
                .access_tokens
                .contains(t)
        });
        if !authed {
            break 'done (
                401,
                json!({"error": {"code": 401, "message": "Request had invalid authentication credentials.", "status": "UNAUTHENTICATED"}}),
            );
        }
        if project != sim.cfg.fcm_project_id {
            break 'done (
                403,
                fcm_error(
                    403,
                    "PERMISSION_DENIED",
                    "Permission denied on project",
                    "SENDER_ID_MISMATCH",
                ),
            );
        }
        let msg = &body["message"];
        let Some(token) = msg["token"].as_str().filter(|t| !t.is_empty()) else {
            break 'done (
                400,
                json!({"error": {"code": 400, "message": "The registration token is not a valid FCM registration token", "status": "INVALID_ARGUMENT", "details": [
                {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field": "message.token", "description": "Invalid registration token"}]}]}}),
            );
        };
        if let Some(rejected) = check_message(msg) {
            break 'done rejected;
        }
        if let Some(f) = sim.take_fault("fcm", token) {
            sim.record("fcm", &path, &headers, &body, f.status);
            return apply_fault(f, vec![]).await;
        }
        if token.starts_with("unregistered") {
            break 'done (
                404,
                fcm_error(
                    404,
                    "NOT_FOUND",
                    "Requested entity was not found.",
                    "UNREGISTERED",
                ),
            );
        }
        (
            200,
            json!({"name": format!("projects/{project}/messages/0:{}", rand_id())}),
        )
    };
    sim.record("fcm", &path, &headers, &body, status);
    answer(status, resp, &[])
}

/// Most bytes of an FCM message (firebase.google.com/docs/cloud-messaging/concept-options:
/// "Maximum payload for both message types is 4096 bytes").
pub(crate) const FCM_MAX_MESSAGE_BYTES: usize = 4096;

/// The answer FCM gives a proto-JSON value of the wrong type: the parse error names the
/// field path (`message.data[0].value`) and the expected type.
fn invalid_value(path: &str, proto_type: &str, got: &Value) -> (u16, Value) {
    let text = format!("Invalid value at '{path}' ({proto_type}), {got}");
    (
        400,
        json!({"error": {"code": 400, "message": text, "status": "INVALID_ARGUMENT", "details": [
            {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field": path, "description": text}]}]}}),
    )
}

/// What FCM refuses in a `message` (besides the token and auth), as `(status, body)`:
/// - a `data` value that is not a string (`Message.data` is `map<string, string>`), and
///   the same for `android.data`;
/// - a reserved `data` key: "from", "message_type", "notification" or any key starting
///   with "google" or "gcm" (FCM v1 reference, `Message.data`: "The key should not be a
///   reserved word"); FCM's own wording of this answer is not documented, the simulator
///   says `Invalid data key: <key> is reserved`;
/// - `android.notification.notification_count` that is not an integer (int32), and
///   `channel_id` / `tag` / `click_action` / `image` that are not strings;
/// - `apns.payload.aps` that is present but not an object;
/// - a `message` over [`FCM_MAX_MESSAGE_BYTES`] as JSON: "Message is too big".
pub(crate) fn check_message(msg: &Value) -> Option<(u16, Value)> {
    for (path, data) in [
        ("message.data", &msg["data"]),
        ("message.android.data", &msg["android"]["data"]),
    ] {
        let Some(data) = data.as_object() else {
            continue;
        };
        for (i, (key, value)) in data.iter().enumerate() {
            if !value.is_string() {
                return Some(invalid_value(
                    &format!("{path}[{i}].value"),
                    "TYPE_STRING",
                    value,
                ));
            }
            let lower = key.to_ascii_lowercase();
            if matches!(lower.as_str(), "from" | "message_type" | "notification")
                || lower.starts_with("google")
                || lower.starts_with("gcm")
            {
                let text = format!("Invalid data key: {key} is reserved");
                return Some((
                    400,
                    json!({"error": {"code": 400, "message": "Request contains an invalid argument.", "status": "INVALID_ARGUMENT", "details": [
                        {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "INVALID_ARGUMENT"},
                        {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": [{"field": path, "description": text}]}]}}),
                ));
            }
        }
    }
    let notification = &msg["android"]["notification"];
    let count = &notification["notification_count"];
    if !count.is_null() && count.as_i64().is_none_or(|n| i32::try_from(n).is_err()) {
        return Some(invalid_value(
            "message.android.notification.notification_count",
            "TYPE_INT32",
            count,
        ));
    }
    for key in ["channel_id", "tag", "click_action", "image"] {
        let v = &notification[key];
        if !v.is_null() && !v.is_string() {
            return Some(invalid_value(
                &format!("message.android.notification.{key}"),
                "TYPE_STRING",
                v,
            ));
        }
    }
    let aps = &msg["apns"]["payload"]["aps"];
    if !aps.is_null() && !aps.is_object() {
        return Some((
            400,
            fcm_error(
                400,
                "INVALID_ARGUMENT",
                "Request contains an invalid argument.",
                "INVALID_ARGUMENT",
            ),
        ));
    }
    if serde_json::to_vec(msg).map(|b| b.len()).unwrap_or(0) > FCM_MAX_MESSAGE_BYTES {
        return Some((
            400,
            fcm_error(
                400,
                "INVALID_ARGUMENT",
                "Message is too big",
                "INVALID_ARGUMENT",
            ),
        ));
    }
    None
}

/// Revokes every FCM access token handed out so far (as a key rotation would).
pub(crate) async fn revoke_tokens(State(sim): State<Sim>) -> StatusCode {
    sim.inner.lock().expect("sim lock").access_tokens.clear();
    StatusCode::NO_CONTENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_decoding() {
        let m = url_decode(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=a.b.c&x=1+2",
        );
        assert_eq!(
            m["grant_type"],
            "urn:ietf:params:oauth:grant-type:jwt-bearer"
        );
        assert_eq!(m["assertion"], "a.b.c");
        assert_eq!(m["x"], "1 2");
    }

    fn rejected(msg: Value) -> (u16, String) {
        let (status, body) = check_message(&msg).expect("rejected");
        (
            status,
            body["error"]["message"].as_str().unwrap().to_string(),
        )
    }

    #[test]
    fn fcm_accepts_a_rich_message_within_the_limit() {
        let msg = json!({"token": "t", "notification": {"title": "ชำระเงินแล้ว", "body": "ขอบคุณ", "image": "https://cdn.example.test/a.png"},
            "data": {"url": "https://shop.example.test/o/1", "actions": "[]"},
            "android": {"notification": {"channel_id": "orders", "tag": "order-1001", "notification_count": 3}},
            "apns": {"payload": {"aps": {"badge": 3, "mutable-content": 1}}}});
        assert_eq!(check_message(&msg), None);
    }

    #[test]
    fn fcm_rejects_a_non_string_data_value_naming_its_path() {
        let (status, text) = rejected(json!({"token": "t", "data": {"a": "x", "count": 3}}));
        assert_eq!(status, 400);
        assert_eq!(
            text,
            "Invalid value at 'message.data[1].value' (TYPE_STRING), 3"
        );
    }

    #[test]
    fn fcm_rejects_reserved_data_keys() {
        for key in [
            "from",
            "message_type",
            "google.sent_time",
            "gcm.notification.title",
            "Notification",
        ] {
            let msg = json!({"token": "t", "data": {key: "x"}});
            let (status, body) = check_message(&msg).expect(key);
            assert_eq!(status, 400, "{key}");
            assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{key}");
            assert_eq!(
                body["error"]["details"][1]["fieldViolations"][0]["description"],
                format!("Invalid data key: {key} is reserved")
            );
        }
    }

    #[test]
    fn fcm_rejects_a_badge_that_is_not_an_int32() {
        let (status, text) = rejected(
            json!({"token": "t", "android": {"notification": {"notification_count": "3"}}}),
        );
        assert_eq!(status, 400);
        assert!(text.contains("notification_count' (TYPE_INT32)"), "{text}");
    }

    #[test]
    fn fcm_rejects_a_message_over_4096_bytes_as_too_big() {
        let pad = |n: usize| json!({"token": "t", "notification": {"body": "x".repeat(n)}});
        let base = serde_json::to_vec(&pad(0)).unwrap().len();
        assert_eq!(
            check_message(&pad(FCM_MAX_MESSAGE_BYTES - base)),
            None,
            "exactly 4,096 bytes"
        );
        assert_eq!(
            rejected(pad(FCM_MAX_MESSAGE_BYTES - base + 1)),
            (400, "Message is too big".to_string())
        );
    }
}
