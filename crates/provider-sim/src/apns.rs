//! APNs: HTTP/2 sends with ES256 provider tokens
//! (developer.apple.com/documentation/usernotifications/sending-notification-requests-to-apns).

use super::{Sim, SimConfig, answer, apply_fault, json_body};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

#[derive(Deserialize)]
struct ApnsClaims {
    iss: String,
    iat: i64,
}

/// Checks an APNs provider token (ES256 JWT): `Err(reason)` as APNs would name it.
fn check_apns_token(cfg: &SimConfig, token: &str) -> Result<(), &'static str> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| "InvalidProviderToken")?;
    if header.alg != Algorithm::ES256 || header.kid.as_deref() != Some(cfg.apns_key_id.as_str()) {
        return Err("InvalidProviderToken");
    }
    let key = DecodingKey::from_ec_pem(cfg.apns_public_key_pem.as_bytes())
        .map_err(|_| "InvalidProviderToken")?;
    let (signed, signature) = token.rsplit_once('.').ok_or("InvalidProviderToken")?;
    match jsonwebtoken::crypto::verify(signature, signed.as_bytes(), &key, Algorithm::ES256) {
        Ok(true) => {}
        _ => return Err("InvalidProviderToken"),
    }
    let claims = jsonwebtoken::dangerous::insecure_decode_claims::<ApnsClaims>(token)
        .map_err(|_| "InvalidProviderToken")?;
    if claims.iss != cfg.apns_team_id {
        return Err("InvalidProviderToken");
    }
    let age = chrono::Utc::now().timestamp() - claims.iat;
    if !(-60..=3600).contains(&age) {
        return Err("ExpiredProviderToken");
    }
    Ok(())
}

/// Most bytes of an APNs alert payload (Apple, "Sending notification requests to APNs":
/// 4 KB, 4,096 bytes, for a regular remote notification; 5 KB for VoIP).
pub(crate) const APNS_MAX_PAYLOAD_BYTES: usize = 4096;

/// What APNs refuses in a payload, as `(status, reason)`:
/// - over [`APNS_MAX_PAYLOAD_BYTES`]: 413 `PayloadTooLarge`;
/// - no JSON object with an `aps` dictionary: 400 `PayloadEmpty`;
/// - an `aps` key of the wrong type or value (Apple, "Generating a remote notification":
///   `badge` a non-negative number, `mutable-content` and `content-available` the number
///   1 (or 0), `interruption-level` one of `passive`, `active`, `time-sensitive`,
///   `critical`, `thread-id` / `category` strings, `sound` a string or dictionary, `alert`
///   a string or dictionary): 400 `BadPayload`. Apple's reason table has no entry for
///   these (a real APNs may drop such a notification without an error); the simulator is
///   stricter, with its own reason name, so a wrong payload fails in tests.
pub(crate) fn check_payload(bytes: &[u8]) -> Result<(), (u16, &'static str)> {
    if bytes.len() > APNS_MAX_PAYLOAD_BYTES {
        return Err((413, "PayloadTooLarge"));
    }
    let body: Value = serde_json::from_slice(bytes).map_err(|_| (400, "PayloadEmpty"))?;
    let aps = body["aps"].as_object().ok_or((400, "PayloadEmpty"))?;
    let bad = (400, "BadPayload");
    let ok = aps.iter().all(|(key, v)| match key.as_str() {
        "badge" => v.as_u64().is_some(),
        "mutable-content" | "content-available" => matches!(v.as_u64(), Some(0 | 1)),
        "interruption-level" => matches!(
            v.as_str(),
            Some("passive" | "active" | "time-sensitive" | "critical")
        ),
        "thread-id" | "category" | "target-content-id" => v.is_string(),
        "sound" | "alert" => v.is_string() || v.is_object(),
        "relevance-score" => v.is_number(),
        _ => true,
    });
    if ok { Ok(()) } else { Err(bad) }
}

/// `POST /3/device/{token}`: APNs over HTTP/2 only. Device tokens starting with
/// `unregistered-<millis>-` answer 410 with that timestamp, `bad-` 400 BadDeviceToken.
pub(crate) async fn apns_send(
    State(sim): State<Sim>,
    Path(device): Path<String>,
    request: axum::extract::Request,
) -> Response {
    sim.latency("apns").await;
    let version = request.version();
    let headers = request.headers().clone();
    let bytes = axum::body::to_bytes(request.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let body = json_body(&bytes);
    let path = format!("/3/device/{device}");
    let apns_id = headers
        .get("apns-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| Uuid::new_v4().to_string().to_uppercase());
    let extra = vec![("apns-id", apns_id.clone())];
    let reason = |r: &str| json!({"reason": r});
    let (status, resp) = 'done: {
        if version != axum::http::Version::HTTP_2 {
            break 'done (505, json!({"reason": "APNs speaks HTTP/2 only"}));
        }
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("bearer ")
                    .or_else(|| v.strip_prefix("Bearer "))
            });
        let Some(token) = token else {
            break 'done (403, reason("MissingProviderToken"));
        };
        if let Err(r) = check_apns_token(&sim.cfg, token) {
            break 'done (403, reason(r));
        }
        let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
        match header("apns-topic") {
            None => break 'done (400, reason("MissingTopic")),
            Some(t) if t != sim.cfg.apns_topic => break 'done (400, reason("BadTopic")),
            _ => {}
        }
        if !matches!(
            header("apns-push-type"),
            Some(
                "alert"
                    | "background"
                    | "voip"
                    | "complication"
                    | "fileprovider"
                    | "mdm"
                    | "liveactivity"
            )
        ) {
            break 'done (400, reason("InvalidPushType"));
        }
        if header("apns-priority").is_some_and(|p| !matches!(p, "5" | "10" | "1")) {
            break 'done (400, reason("BadPriority"));
        }
        if header("apns-expiration").is_some_and(|e| e.parse::<i64>().is_err()) {
            break 'done (400, reason("BadExpirationDate"));
        }
        if header("apns-collapse-id").is_some_and(|c| c.len() > 64) {
            break 'done (400, reason("BadCollapseId"));
        }
        if let Err((status, r)) = check_payload(&bytes) {
            break 'done (status, reason(r));
        }
        if let Some(f) = sim.take_fault("apns", &device) {
            sim.record("apns", &path, &headers, &body, f.status);
            return apply_fault(f, extra).await;
        }
        if let Some(rest) = device.strip_prefix("unregistered-") {
            let ts: i64 = rest
                .split('-')
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
            break 'done (410, json!({"reason": "Unregistered", "timestamp": ts}));
        }
        if device.starts_with("bad-") {
            break 'done (400, reason("BadDeviceToken"));
        }
        (200, Value::Null)
    };
    sim.record("apns", &path, &headers, &body, status);
    if status == 200 {
        return (StatusCode::OK, [("apns-id", apns_id)]).into_response();
    }
    answer(status, resp, &extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(v: Value) -> Result<(), (u16, &'static str)> {
        check_payload(&serde_json::to_vec(&v).unwrap())
    }

    #[test]
    fn apns_accepts_a_rich_alert() {
        assert_eq!(
            check(
                json!({"aps": {"alert": {"title": "t", "body": "b"}, "badge": 3, "sound": "default",
                "category": "ORDER", "thread-id": "order-1001", "mutable-content": 1,
                "interruption-level": "time-sensitive"}, "image_url": "https://cdn.example.test/a.png"})
            ),
            Ok(())
        );
    }

    #[test]
    fn apns_rejects_a_payload_over_4096_bytes_with_413() {
        let pad = |n: usize| json!({"aps": {"alert": "x".repeat(n)}});
        let base = serde_json::to_vec(&pad(0)).unwrap().len();
        assert_eq!(check(pad(APNS_MAX_PAYLOAD_BYTES - base)), Ok(()));
        assert_eq!(
            check(pad(APNS_MAX_PAYLOAD_BYTES - base + 1)),
            Err((413, "PayloadTooLarge"))
        );
    }

    #[test]
    fn apns_rejects_malformed_aps() {
        assert_eq!(check_payload(b"not json"), Err((400, "PayloadEmpty")));
        assert_eq!(check(json!({"url": "x"})), Err((400, "PayloadEmpty")));
        assert_eq!(check(json!({"aps": "alert"})), Err((400, "PayloadEmpty")));
        for aps in [
            json!({"badge": "3"}),
            json!({"badge": -1}),
            json!({"mutable-content": true}),
            json!({"interruption-level": "urgent"}),
            json!({"thread-id": 7}),
            json!({"alert": ["t"]}),
        ] {
            assert_eq!(
                check(json!({"aps": aps})),
                Err((400, "BadPayload")),
                "{aps}"
            );
        }
    }
}
