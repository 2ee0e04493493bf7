//! LINE Messaging API: push and multicast (developers.line.biz/en/reference/messaging-api/#send-push-message),
//! and the signed webhook sender of `POST /_sim/line/webhook`. Message objects are
//! checked as LINE checks them ([`rules`]: Flex `altText` and size, labels, URI schemes,
//! image URLs), answered with LINE's 400 shape `{"message", "details": [{"message",
//! "property"}]}`.

use super::{Sim, answer, apply_fault, bearer, json_body, rand_id};
use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

mod rules;

fn is_line_user_id(s: &str) -> bool {
    s.len() == 33 && s.starts_with('U') && s[1..].chars().all(|c| c.is_ascii_hexdigit())
}

/// Checks a LINE push (`to` one user id) or multicast (`to` 1 to 500 user ids) body;
/// `Err` carries LINE's 400 answer.
fn check_line_messages(multicast: bool, body: &Value) -> Result<(), Value> {
    let bad = |msg: &str, details: Value| Err(json!({"message": msg, "details": details}));
    let to: Vec<&str> = if multicast {
        match body["to"].as_array() {
            Some(ids) if (1..=500).contains(&ids.len()) => {
                ids.iter().map(|v| v.as_str().unwrap_or("")).collect()
            }
            _ => {
                return bad(
                    "The request body has 1 error(s)",
                    json!([{"message": "Size must be between 1 and 500", "property": "to"}]),
                );
            }
        }
    } else {
        match body["to"].as_str() {
            Some(to) => vec![to],
            None => {
                return bad(
                    "The request body has 1 error(s)",
                    json!([{"message": "must be specified", "property": "to"}]),
                );
            }
        }
    };
    let Some(messages) = body["messages"].as_array() else {
        return bad(
            "The request body has 1 error(s)",
            json!([{"message": "must be specified", "property": "messages"}]),
        );
    };
    if messages.is_empty() || messages.len() > 5 {
        return bad(
            "The request body has 1 error(s)",
            json!([{"message": "Size must be between 1 and 5", "property": "messages"}]),
        );
    }
    for (i, m) in messages.iter().enumerate() {
        if m["type"] != "text" {
            continue;
        }
        let Some(text) = m["text"].as_str() else {
            return bad(
                "The request body has 1 error(s)",
                json!([{"message": "must be specified", "property": format!("messages[{i}].text")}]),
            );
        };
        let units = text.encode_utf16().count();
        if units == 0 || units > 5000 {
            return bad(
                "The request body has 1 error(s)",
                json!([{"message": "Length must be between 0 and 5000", "property": format!("messages[{i}].text")}]),
            );
        }
    }
    let details: Vec<Value> = messages
        .iter()
        .enumerate()
        .flat_map(|(i, m)| rules::message_details(&format!("messages[{i}]"), m))
        .collect();
    if !details.is_empty() {
        return bad(
            &format!("The request body has {} error(s)", details.len()),
            Value::Array(details),
        );
    }
    if let Some(i) = to.iter().position(|id| !is_line_user_id(id)) {
        if multicast {
            return bad(
                "The request body has 1 error(s)",
                json!([{"message": "The value must be a valid user ID", "property": format!("to[{i}]")}]),
            );
        }
        return bad("Failed to send messages", json!([]));
    }
    Ok(())
}

/// `POST /v2/bot/message/push` (`multicast` false) and `POST /v2/bot/message/multicast`
/// (up to 500 user ids, answered `{}` as a whole).
pub(crate) async fn send(
    sim: Sim,
    headers: HeaderMap,
    body: axum::body::Bytes,
    multicast: bool,
) -> Response {
    sim.latency("line").await;
    let body = json_body(&body);
    let request_id = Uuid::new_v4().simple().to_string();
    let mut extra = vec![("x-line-request-id", request_id.clone())];
    let path = if multicast {
        "/v2/bot/message/multicast"
    } else {
        "/v2/bot/message/push"
    };
    let (status, resp) = 'done: {
        if bearer(&headers) != Some(sim.cfg.line_channel_token.as_str()) {
            break 'done (
                401,
                json!({"message": "Authentication failed. Confirm that the access token in the authorization header is valid."}),
            );
        }
        let retry_key = headers
            .get("x-line-retry-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(k) = &retry_key {
            if Uuid::parse_str(k).is_err() {
                break 'done (
                    400,
                    json!({"message": "The value for the 'X-Line-Retry-Key' header is invalid"}),
                );
            }
            let accepted = sim
                .inner
                .lock()
                .expect("sim lock")
                .line_accepted
                .get(k)
                .cloned();
            if let Some(first) = accepted {
                extra.push(("x-line-accepted-request-id", first));
                break 'done (
                    409,
                    json!({"message": "The retry key is already accepted", "sentMessages": []}),
                );
            }
        }
        if let Err(e) = check_line_messages(multicast, &body) {
            break 'done (400, e);
        }
        let target = match &body["to"] {
            Value::Array(ids) => ids
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(","),
            to => to.as_str().unwrap_or_default().to_string(),
        };
        let fault = sim.take_fault("line", &target);
        // A (possibly slow) success accepts the retry key as soon as the request arrives.
        if fault
            .as_ref()
            .is_none_or(|f| (200..300).contains(&f.status))
            && let Some(k) = retry_key
        {
            sim.inner
                .lock()
                .expect("sim lock")
                .line_accepted
                .insert(k, request_id.clone());
        }
        if let Some(f) = fault {
            sim.record("line", path, &headers, &body, f.status);
            return apply_fault(f, extra).await;
        }
        if multicast {
            break 'done (200, json!({}));
        }
        let sent: Vec<Value> = body["messages"]
            .as_array()
            .map(|m| m.iter().map(|_| json!({"id": format!("{}", rand_id()), "quoteToken": Uuid::new_v4().to_string()})).collect())
            .unwrap_or_default();
        (200, json!({"sentMessages": sent}))
    };
    sim.record("line", path, &headers, &body, status);
    answer(status, resp, &extra)
}

/// Body of `POST /_sim/line/webhook`.
#[derive(Deserialize)]
pub(crate) struct WebhookRequest {
    url: String,
    events: Vec<Value>,
    #[serde(default)]
    signature: Option<String>,
}

/// Sends a signed LINE webhook (developers.line.biz/en/reference/messaging-api/#webhooks).
pub(crate) async fn send_webhook(
    State(sim): State<Sim>,
    Json(r): Json<WebhookRequest>,
) -> Response {
    let body =
        json!({"destination": "U00000000000000000000000000000000", "events": r.events}).to_string();
    let signature = r.signature.unwrap_or_else(|| {
        notify_core::signed::line_signature(&sim.cfg.line_channel_secret, body.as_bytes())
    });
    let sent = reqwest::Client::new()
        .post(&r.url)
        .header("content-type", "application/json; charset=utf-8")
        .header("x-line-signature", signature)
        .header("user-agent", "LineBotWebhook/2.0")
        .body(body)
        .send()
        .await;
    crate::relayed(sent).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_body_rules() {
        let ok = json!({"to": "U0123456789abcdef0123456789abcdef", "messages": [{"type": "text", "text": "สวัสดี"}]});
        assert!(check_line_messages(false, &ok).is_ok());
        let too_many = json!({"to": "U0123456789abcdef0123456789abcdef", "messages": vec![json!({"type":"text","text":"a"}); 6]});
        assert!(check_line_messages(false, &too_many).is_err());
        let long = json!({"to": "U0123456789abcdef0123456789abcdef", "messages": [{"type": "text", "text": "😀".repeat(2501)}]});
        assert!(
            check_line_messages(false, &long).is_err(),
            "5,002 UTF-16 units"
        );
        let id = "U0123456789abcdef0123456789abcdef";
        let many = json!({"to": vec![id; 500], "messages": [{"type": "text", "text": "x"}]});
        assert!(check_line_messages(true, &many).is_ok());
        let too_many = json!({"to": vec![id; 501], "messages": [{"type": "text", "text": "x"}]});
        assert!(check_line_messages(true, &too_many).is_err());
        let one_bad = json!({"to": [id, "user-1"], "messages": [{"type": "text", "text": "x"}]});
        assert_eq!(
            check_line_messages(true, &one_bad).unwrap_err()["details"][0]["property"],
            "to[1]"
        );
        let two_bad = json!({"to": id, "messages": [
            {"type": "flex", "contents": {"type": "bubble"}},
            {"type": "image", "originalContentUrl": "http://a.example/a.png", "previewImageUrl": "https://a.example/p.png"}]});
        assert_eq!(
            check_line_messages(false, &two_bad).unwrap_err(),
            json!({"message": "The request body has 2 error(s)", "details": [
                {"message": "must be specified", "property": "messages[0].altText"},
                {"message": "must be a valid HTTPS URL", "property": "messages[1].originalContentUrl"}]}),
            "every problem of every message in one 400, as LINE lists them"
        );
        let unknown = json!({"to": "user-1", "messages": [{"type": "text", "text": "x"}]});
        assert_eq!(
            check_line_messages(false, &unknown).unwrap_err()["message"],
            "Failed to send messages"
        );
    }
}
