//! The Web Push stand-in: a push service (RFC 8030) that issues subscriptions, checks the
//! VAPID authorization (RFC 8292) and decrypts each message (RFC 8291, aes128gcm) with the
//! subscription keys it issued, recording the plaintext.

use super::{Sim, answer, apply_fault};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;
use web_push_native::p256;

/// A subscription the simulator issued.
pub(crate) struct Subscription {
    /// The endpoint URL as handed to the browser (its origin is the VAPID `aud`).
    endpoint: String,
    /// The user agent's private key (decrypts messages).
    secret: p256::SecretKey,
    /// The authentication secret.
    auth: [u8; 16],
    /// `k` a message must carry, when the subscriber named an application server key.
    application_server_key: Option<String>,
    /// Unsubscribed: pushes get 410 Gone.
    gone: bool,
}

/// Body of `POST /_sim/webpush/subscriptions` and `POST /_sim/webpush/unsubscribe`.
#[derive(Deserialize)]
pub(crate) struct SubscribeRequest {
    /// Endpoint URL to issue, e.g. `https://push.example.test/sub/E`; the simulator
    /// serves it at `/webpush` + its path.
    endpoint: String,
    /// Base64url VAPID public key the subscription is bound to (PushManager.subscribe's
    /// `applicationServerKey`); optional.
    #[serde(default)]
    application_server_key: Option<String>,
}

/// The path under `/webpush` that serves `endpoint`.
fn endpoint_path(endpoint: &str) -> Option<String> {
    let rest = endpoint.split_once("://")?.1;
    let path = &rest[rest.find('/')?..];
    Some(path.to_string())
}

/// `POST /_sim/webpush/subscriptions`: issues keys for an endpoint (as a browser's
/// `PushManager.subscribe` would) and answers the PushSubscription JSON.
pub(crate) async fn subscribe(State(sim): State<Sim>, Json(r): Json<SubscribeRequest>) -> Response {
    let Some(path) = endpoint_path(&r.endpoint) else {
        return answer(
            400,
            json!({"error": "endpoint must be an absolute URL with a path"}),
            &[],
        );
    };
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    let secret = p256::SecretKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
    let auth: [u8; 16] = rand::random();
    let p256dh = URL_SAFE_NO_PAD.encode(secret.public_key().to_encoded_point(false).as_bytes());
    let sub = Subscription {
        endpoint: r.endpoint.clone(),
        secret,
        auth,
        application_server_key: r.application_server_key,
        gone: false,
    };
    sim.inner
        .lock()
        .expect("sim lock")
        .webpush_subscriptions
        .insert(path, sub);
    (
        StatusCode::CREATED,
        Json(json!({
            "endpoint": r.endpoint,
            "keys": {"p256dh": p256dh, "auth": URL_SAFE_NO_PAD.encode(auth)},
        })),
    )
        .into_response()
}

/// `POST /_sim/webpush/unsubscribe`: the user unsubscribed; pushes now get 410.
pub(crate) async fn unsubscribe(
    State(sim): State<Sim>,
    Json(r): Json<SubscribeRequest>,
) -> StatusCode {
    let path = endpoint_path(&r.endpoint).unwrap_or_default();
    match sim
        .inner
        .lock()
        .expect("sim lock")
        .webpush_subscriptions
        .get_mut(&path)
    {
        Some(s) => {
            s.gone = true;
            StatusCode::NO_CONTENT
        }
        None => StatusCode::NOT_FOUND,
    }
}

#[derive(Deserialize)]
struct VapidClaims {
    aud: String,
    exp: i64,
    sub: String,
}

/// Checks `Authorization: vapid t=<JWT>, k=<key>` (RFC 8292 §3) for a push to `endpoint`:
/// `Err((status, reason))` on failure.
fn check_vapid(
    headers: &HeaderMap,
    endpoint: &str,
    bound_key: Option<&str>,
) -> Result<(), (u16, String)> {
    let unauthorized = |r: &str| (401, r.to_string());
    let value = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| unauthorized("missing Authorization"))?;
    let params = value
        .strip_prefix("vapid ")
        .ok_or_else(|| unauthorized("Authorization scheme must be vapid"))?;
    let (mut t, mut k) = (None, None);
    for part in params.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = Some(v.trim()),
            Some(("k", v)) => k = Some(v.trim()),
            _ => {}
        }
    }
    let (t, k) = t
        .zip(k)
        .ok_or_else(|| unauthorized("vapid needs t= and k="))?;
    if bound_key.is_some_and(|b| b.trim_end_matches('=') != k.trim_end_matches('=')) {
        return Err((
            403,
            "k is not the key this subscription was created with".into(),
        ));
    }
    let point = URL_SAFE_NO_PAD
        .decode(k.trim_end_matches('='))
        .map_err(|_| unauthorized("k is not base64url"))?;
    if point.len() != 65 || point[0] != 4 {
        return Err(unauthorized("k is not an uncompressed P-256 point"));
    }
    let key = DecodingKey::from_ec_components(
        &URL_SAFE_NO_PAD.encode(&point[1..33]),
        &URL_SAFE_NO_PAD.encode(&point[33..]),
    )
    .map_err(|_| unauthorized("k is not a P-256 key"))?;
    let header = jsonwebtoken::decode_header(t).map_err(|_| unauthorized("t is not a JWT"))?;
    if header.alg != Algorithm::ES256 {
        return Err(unauthorized("the JWT must be ES256"));
    }
    let (signed, signature) = t
        .rsplit_once('.')
        .ok_or_else(|| unauthorized("t is not a JWT"))?;
    if !jsonwebtoken::crypto::verify(signature, signed.as_bytes(), &key, Algorithm::ES256)
        .unwrap_or(false)
    {
        return Err(unauthorized("the JWT signature does not verify with k"));
    }
    let claims = jsonwebtoken::dangerous::insecure_decode_claims::<VapidClaims>(t)
        .map_err(|_| unauthorized("the JWT needs aud, exp and sub"))?;
    let origin_len = endpoint.find("://").map_or(0, |i| {
        i + 3
            + endpoint[i + 3..]
                .find('/')
                .unwrap_or(endpoint.len() - i - 3)
    });
    if claims.aud != endpoint[..origin_len] {
        return Err(unauthorized("aud is not the push service's origin"));
    }
    let now = chrono::Utc::now().timestamp();
    if claims.exp <= now || claims.exp > now + 24 * 3600 {
        return Err(unauthorized("exp must be in the next 24 hours"));
    }
    if !(claims.sub.starts_with("mailto:") || claims.sub.starts_with("https:")) {
        return Err(unauthorized("sub must be a mailto: or https: URI"));
    }
    Ok(())
}

/// Most bytes of an encrypted Web Push body a push service must accept (RFC 8030 §7.2:
/// "a push service MUST support a message body of at least 4096 octets"; services such
/// as FCM and Mozilla's answer larger ones with 413).
pub(crate) const WEBPUSH_MAX_RECORD_BYTES: usize = 4096;

/// 413 for an encrypted body over [`WEBPUSH_MAX_RECORD_BYTES`] (RFC 8030 §5: 413 Payload
/// Too Large).
pub(crate) fn check_record_size(len: usize) -> Result<(), (u16, Value)> {
    if len > WEBPUSH_MAX_RECORD_BYTES {
        return Err((
            413,
            json!({"reason": format!("payload of {len} bytes is larger than {WEBPUSH_MAX_RECORD_BYTES}")}),
        ));
    }
    Ok(())
}

/// `POST /webpush/{*path}`: a push message to a subscription the simulator issued.
pub(crate) async fn push(
    State(sim): State<Sim>,
    Path(path): Path<String>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Response {
    sim.latency("webpush").await;
    let path = format!("/{path}");
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let message_id = Uuid::new_v4().simple().to_string();
    let mut endpoint = String::new();
    let mut recorded = json!({"record_bytes": bytes.len()});
    let (status, resp) = 'done: {
        let (ep, secret, auth, bound, gone) = {
            let inner = sim.inner.lock().expect("sim lock");
            match inner.webpush_subscriptions.get(&path) {
                Some(s) => (
                    s.endpoint.clone(),
                    s.secret.clone(),
                    s.auth,
                    s.application_server_key.clone(),
                    s.gone,
                ),
                None => break 'done (404, json!({"reason": "no such subscription"})),
            }
        };
        endpoint = ep;
        if let Err((status, reason)) = check_vapid(&headers, &endpoint, bound.as_deref()) {
            break 'done (status, json!({"reason": reason}));
        }
        if header("ttl").and_then(|t| t.parse::<u64>().ok()).is_none() {
            break 'done (
                400,
                json!({"reason": "TTL header is required (RFC 8030 §5.2)"}),
            );
        }
        if header("urgency").is_some_and(|u| !matches!(u, "very-low" | "low" | "normal" | "high")) {
            break 'done (
                400,
                json!({"reason": "Urgency must be very-low, low, normal or high"}),
            );
        }
        if header("topic").is_some_and(|t| {
            t.len() > 32
                || !t
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        }) {
            break 'done (
                400,
                json!({"reason": "Topic must be at most 32 base64url characters"}),
            );
        }
        if header("content-encoding") != Some("aes128gcm") {
            break 'done (400, json!({"reason": "Content-Encoding must be aes128gcm"}));
        }
        if let Err(rejected) = check_record_size(bytes.len()) {
            break 'done rejected;
        }
        let auth = web_push_native::Auth::from(auth);
        let plaintext = match web_push_native::decrypt(bytes.to_vec(), &secret, &auth) {
            Ok(p) => p,
            Err(e) => break 'done (400, json!({"reason": format!("cannot decrypt: {e}")})),
        };
        let text = String::from_utf8_lossy(&plaintext).to_string();
        recorded["payload"] = serde_json::from_str(&text).unwrap_or(Value::Null);
        recorded["plaintext"] = Value::String(text);
        if gone {
            break 'done (
                410,
                json!({"reason": "subscription expired or unsubscribed"}),
            );
        }
        if let Some(f) = sim.take_fault("webpush", &endpoint) {
            recorded["endpoint"] = Value::String(endpoint.clone());
            sim.record(
                "webpush",
                &format!("/webpush{path}"),
                &headers,
                &recorded,
                f.status,
            );
            return apply_fault(f, vec![]).await;
        }
        (201, Value::Null)
    };
    recorded["endpoint"] = Value::String(endpoint);
    sim.record(
        "webpush",
        &format!("/webpush{path}"),
        &headers,
        &recorded,
        status,
    );
    if status == 201 {
        let location = format!("/_sim/webpush/messages/{message_id}");
        return answer(201, Value::Null, &[("location", location)]);
    }
    answer(status, resp, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_push_rejects_a_body_over_4096_bytes_with_413() {
        assert!(check_record_size(WEBPUSH_MAX_RECORD_BYTES).is_ok());
        let (status, body) = check_record_size(WEBPUSH_MAX_RECORD_BYTES + 1).unwrap_err();
        assert_eq!(status, 413);
        assert_eq!(body["reason"], "payload of 4097 bytes is larger than 4096");
    }
}
