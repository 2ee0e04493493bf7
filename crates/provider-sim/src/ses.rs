//! Amazon SES v2 `SendEmail` (`POST /v2/email/outbound-emails`) and the bounce and
//! complaint notifications SES sends through SNS.
//!
//! `SendEmail` requires `Authorization: AWS4-HMAC-SHA256 Credential=<key>/<yyyymmdd>/<region>/ses/aws4_request,
//! SignedHeaders=<…;host;…;x-amz-date…>, Signature=<64 hex>` and an `x-amz-date` of the
//! same day within 15 minutes of now (the shape and the date only: the simulator does not
//! know the secret); otherwise 403 with `x-amzn-ErrorType: IncompleteSignatureException`
//! (or `InvalidSignatureException` for a stale date). A body without
//! `Content.Raw.Data` (base64) or `Destination.ToAddresses` is 400 `BadRequestException`.
//! The decoded MIME message is recorded as `body.raw_decoded`. Faults (`provider: "ses"`,
//! target the first recipient) whose body has a string `__type` send it as
//! `x-amzn-ErrorType`, as SES does. Success is 200 `{"MessageId"}`.
//!
//! `POST /_sim/ses/notify` `{"url", "event": "Bounce"|"Complaint", "address",
//! "bounce_type"?: "Permanent"|"Transient", "forge"?: bool}` posts to `url` an SNS HTTP
//! notification (`Type: Notification`, `SignatureVersion: "2"`, `Signature` = base64 of
//! SHA256withRSA over the documented string to sign: `Message`, `MessageId`, `Subject`
//! if present, `Timestamp`, `TopicArn`, `Type`, each as `name\nvalue\n`), whose `Message`
//! is the SES event JSON (`eventType`, `mail`, `bounce.bounceType` and
//! `bounce.bouncedRecipients`, or `complaint.complainedRecipients`), and whose
//! `SigningCertURL` is this simulator's `GET /_sim/sns/cert.pem`. `forge: true` changes
//! the signed `MessageId` after signing (the event itself intact). Answers `{"status", "body"}` of the receiver's reply.
//! `event: "SubscriptionConfirmation"` sends the message SNS sends when a subscription is
//! made (`Type: SubscriptionConfirmation`, `Token`, `SubscribeURL`; signed over
//! `Message`, `MessageId`, `SubscribeURL`, `Timestamp`, `Token`, `TopicArn`, `Type`),
//! whose `SubscribeURL` is this simulator's `GET /_sim/sns/confirm?Action=ConfirmSubscription&TopicArn=…&Token=…`,
//! recorded as provider `sns` (what a receiver that confirms calls).
//! Sources: SNS "Verifying the signatures of Amazon SNS messages"; SES "Contents of event
//! data that Amazon SES publishes to Amazon SNS".

use super::{Sim, answer, apply_fault, json_body};
use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

/// The self-signed certificate the simulator's SNS signs with (served at
/// `/_sim/sns/cert.pem`; test-only).
pub const SNS_CERT_PEM: &str = include_str!("../fixtures/sns-signing-cert.pem");
const SNS_KEY_PEM: &str = include_str!("../fixtures/sns-signing-key.pem");

/// The topic the simulated notifications come from.
pub const TOPIC_ARN: &str = "arn:aws:sns:ap-southeast-1:123456789012:ses-notifications";

/// What is wrong with a SigV4 `Authorization` header, if anything.
fn check_sigv4(headers: &HeaderMap) -> Result<(), (&'static str, String)> {
    let get = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
    let auth = get("authorization");
    let amz_date = get("x-amz-date");
    let incomplete = |why: &str| ("IncompleteSignatureException", why.to_string());
    let rest = auth
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(|| incomplete("Authorization must start with AWS4-HMAC-SHA256"))?;
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for part in rest.split(", ") {
        match part.split_once('=') {
            Some(("Credential", v)) => credential = Some(v),
            Some(("SignedHeaders", v)) => signed = Some(v),
            Some(("Signature", v)) => signature = Some(v),
            _ => return Err(incomplete("unknown Authorization part")),
        }
    }
    let (credential, signed, signature) = match (credential, signed, signature) {
        (Some(c), Some(h), Some(s)) => (c, h, s),
        _ => {
            return Err(incomplete(
                "Credential, SignedHeaders and Signature are required",
            ));
        }
    };
    let scope: Vec<&str> = credential.split('/').collect();
    if scope.len() != 5 || scope[3] != "ses" || scope[4] != "aws4_request" || scope[0].is_empty() {
        return Err(incomplete(
            "Credential must be key/date/region/ses/aws4_request",
        ));
    }
    let headers_signed: Vec<&str> = signed.split(';').collect();
    if !headers_signed.contains(&"host") || !headers_signed.contains(&"x-amz-date") {
        return Err(incomplete("SignedHeaders must include host and x-amz-date"));
    }
    if signature.len() != 64 || !signature.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(incomplete("Signature must be 64 hex digits"));
    }
    let when = chrono::NaiveDateTime::parse_from_str(amz_date, "%Y%m%dT%H%M%SZ")
        .map_err(|_| incomplete("x-amz-date must be yyyymmddThhmmssZ"))?
        .and_utc();
    if !amz_date.starts_with(scope[1]) {
        return Err(incomplete("the credential's date is not x-amz-date's day"));
    }
    if (chrono::Utc::now() - when).num_seconds().abs() > 15 * 60 {
        return Err((
            "InvalidSignatureException",
            "Signature expired: x-amz-date is more than 15 minutes from now".into(),
        ));
    }
    Ok(())
}

/// `POST /v2/email/outbound-emails`.
pub(crate) async fn send_email(
    State(sim): State<Sim>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    sim.latency("ses").await;
    let path = "/v2/email/outbound-emails";
    let mut json = json_body(&body);
    if let Err((kind, message)) = check_sigv4(&headers) {
        sim.record("ses", path, &headers, &json, 403);
        return answer(
            403,
            json!({"message": message}),
            &[("x-amzn-errortype", kind.into())],
        );
    }
    let raw = json["Content"]["Raw"]["Data"]
        .as_str()
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok());
    let to: Vec<String> = json["Destination"]["ToAddresses"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let (Some(raw), false) = (raw, to.is_empty()) else {
        sim.record("ses", path, &headers, &json, 400);
        return answer(
            400,
            json!({"message": "Content.Raw.Data (base64) and Destination.ToAddresses are required"}),
            &[("x-amzn-errortype", "BadRequestException".into())],
        );
    };
    json["raw_decoded"] = Value::String(String::from_utf8_lossy(&raw).into_owned());
    if let Some(f) = sim.take_fault("ses", &to[0]) {
        sim.record("ses", path, &headers, &json, f.status);
        let kind = f.body["__type"].as_str().map(str::to_string);
        let extra = kind
            .map(|k| vec![("x-amzn-errortype", k)])
            .unwrap_or_default();
        return apply_fault(f, extra).await;
    }
    sim.record("ses", path, &headers, &json, 200);
    answer(
        200,
        json!({"MessageId": format!("{}-000000", Uuid::new_v4())}),
        &[],
    )
}

/// `GET /_sim/sns/confirm`: the `SubscribeURL` of a subscription confirmation; recorded
/// (provider `sns`, the query as the body) and answered with SNS's
/// `ConfirmSubscriptionResponse`.
pub(crate) async fn sns_confirm(
    State(sim): State<Sim>,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let query = json!(q);
    sim.record("sns", "/_sim/sns/confirm", &headers, &query, 200);
    (
        [("content-type", "text/xml")],
        format!(
            "<ConfirmSubscriptionResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><ConfirmSubscriptionResult><SubscriptionArn>{TOPIC_ARN}:{}</SubscriptionArn></ConfirmSubscriptionResult></ConfirmSubscriptionResponse>",
            Uuid::new_v4()
        ),
    )
        .into_response()
}

/// `GET /_sim/sns/cert.pem`.
pub(crate) async fn sns_cert() -> Response {
    ([("content-type", "application/x-pem-file")], SNS_CERT_PEM).into_response()
}

/// Body of `POST /_sim/ses/notify`.
#[derive(Deserialize)]
pub(crate) struct NotifyRequest {
    url: String,
    event: String,
    address: String,
    #[serde(default)]
    bounce_type: Option<String>,
    #[serde(default)]
    forge: bool,
    /// Where the receiver fetches the certificate (this simulator's by default).
    #[serde(default)]
    cert_url: Option<String>,
}

/// `POST /_sim/ses/notify`: sends a signed SES event notification (see the module).
pub(crate) async fn notify(
    State(_sim): State<Sim>,
    headers: HeaderMap,
    Json(r): Json<NotifyRequest>,
) -> Response {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mail = json!({"timestamp": now, "messageId": Uuid::new_v4().to_string(),
        "source": "noreply@example.test", "destination": [r.address]});
    let event = match r.event.as_str() {
        "Bounce" => json!({"eventType": "Bounce", "mail": mail, "bounce": {
            "bounceType": r.bounce_type.as_deref().unwrap_or("Permanent"),
            "bounceSubType": "General",
            "bouncedRecipients": [{"emailAddress": r.address, "action": "failed",
                "status": "5.1.1", "diagnosticCode": "smtp; 550 5.1.1 user unknown"}],
            "timestamp": now, "feedbackId": Uuid::new_v4().to_string()}}),
        "Complaint" => json!({"eventType": "Complaint", "mail": mail, "complaint": {
            "complainedRecipients": [{"emailAddress": r.address}],
            "complaintFeedbackType": "abuse",
            "timestamp": now, "feedbackId": Uuid::new_v4().to_string()}}),
        "SubscriptionConfirmation" => Value::Null,
        other => {
            return answer(
                400,
                json!({"error": format!("unknown event {other:?}")}),
                &[],
            );
        }
    };
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let cert_url = r
        .cert_url
        .unwrap_or_else(|| format!("http://{host}/_sim/sns/cert.pem"));
    let mut n = if event.is_null() {
        let token = Uuid::new_v4().simple().to_string();
        json!({
            "Type": "SubscriptionConfirmation",
            "MessageId": Uuid::new_v4().to_string(),
            "Token": token,
            "TopicArn": TOPIC_ARN,
            "Message": format!("You have chosen to subscribe to the topic {TOPIC_ARN}.\nTo confirm the subscription, visit the SubscribeURL included in this message."),
            "SubscribeURL": format!("http://{host}/_sim/sns/confirm?Action=ConfirmSubscription&TopicArn={TOPIC_ARN}&Token={token}"),
            "Timestamp": now,
            "SignatureVersion": "2",
            "SigningCertURL": cert_url,
        })
    } else {
        json!({
            "Type": "Notification",
            "MessageId": Uuid::new_v4().to_string(),
            "TopicArn": TOPIC_ARN,
            "Message": event.to_string(),
            "Timestamp": now,
            "SignatureVersion": "2",
            "SigningCertURL": cert_url,
            "UnsubscribeURL": format!("http://{host}/_sim/sns/unsubscribe"),
        })
    };
    let kind = n["Type"].as_str().unwrap_or_default().to_string();
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(SNS_KEY_PEM.as_bytes()).expect("fixture key");
    let sig = jsonwebtoken::crypto::sign(
        notify_core::signed::sns_string_to_sign(&n)
            .expect("a Type SNS signs")
            .as_bytes(),
        &key,
        jsonwebtoken::Algorithm::RS256,
    )
    .expect("sign");
    let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(sig)
        .expect("base64url");
    n["Signature"] = Value::String(base64::engine::general_purpose::STANDARD.encode(sig));
    if r.forge {
        // A signed field changes after signing; the event itself is intact, so a receiver
        // that does not verify would act on it.
        n["MessageId"] = Value::String(Uuid::new_v4().to_string());
    }
    let sent = reqwest::Client::new()
        .post(&r.url)
        .header("content-type", "text/plain; charset=UTF-8")
        .header("x-amz-sns-message-type", kind)
        .header("x-amz-sns-topic-arn", TOPIC_ARN)
        .body(n.to_string())
        .send()
        .await;
    crate::relayed(sent).await
}
