//! Amazon SES v2 `SendEmail` with the raw MIME message we build, signed with AWS Signature
//! Version 4.
//!
//! Request (SES API v2 reference, `SendEmail`): `POST /v2/email/outbound-emails` with
//! `{"FromEmailAddress", "Destination": {"ToAddresses": [..]}, "Content": {"Raw": {"Data":
//! <base64 of the MIME message>}}}`; success is 200 `{"MessageId"}`. Errors carry the type
//! in `x-amzn-ErrorType` (maybe followed by `:` and a URL) and `{"message"}`:
//! `MessageRejected`, `MailFromDomainNotVerifiedException`, `BadRequestException`,
//! `NotFoundException`, `AccountSuspendedException` (400, permanent),
//! `SendingPausedException` / `AccountSendingPausedException` (400, the account is paused:
//! transient, so another provider takes over), `TooManyRequestsException` (429) and
//! `LimitExceededException` (transient), 5xx (transient). Error names from the
//! `aws-sdk-sesv2` `SendEmailError` enum.
//!
//! Signing (AWS SigV4, "Create a signed AWS API request"): canonical request of method,
//! path, query, the signed headers `content-type;host;x-amz-date` and the hex SHA-256 of
//! the body; string to sign `AWS4-HMAC-SHA256\n<amz date>\n<date>/<region>/ses/aws4_request\n<hex
//! SHA-256 of the canonical request>`; the key derived by HMAC-SHA256 chaining `"AWS4" +
//! secret`, date, region, `ses`, `aws4_request`.

use crate::attempt::{Outgoing, Verdict};
use base64::Engine;
use hmac::{Hmac, Mac};
use notify_core::{AttemptOutcome, ErrorClass};
use notify_worker::Lease;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// Where and as whom to call SES.
#[derive(Clone)]
pub struct SesConfig {
    /// `https://email.<region>.amazonaws.com` or the simulator's `http://127.0.0.1:port`.
    pub base: String,
    /// The host the signature names (the base URL's `host[:port]`).
    pub host: String,
    /// AWS region, e.g. `ap-southeast-1`.
    pub region: String,
    /// Access key id (`NOTIFY_SES_ACCESS_KEY_ID`).
    pub access_key: String,
    /// Secret access key (`NOTIFY_SES_SECRET_ACCESS_KEY`); never logged.
    pub secret_key: String,
}

impl std::fmt::Debug for SesConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SesConfig")
            .field("base", &self.base)
            .field("region", &self.region)
            .finish()
    }
}

impl SesConfig {
    /// Parses `ses+https://host[:port]?region=…`; `ses+http://` only to a loopback
    /// address (`127.0.0.0/8`, `[::1]`, `localhost`: the simulator), so signed requests
    /// and the mail they carry never cross a network in the clear.
    pub fn parse(url: &str, access_key: String, secret_key: String) -> Result<Self, String> {
        let rest = url.strip_prefix("ses+").ok_or("not an ses+ URL")?;
        let u = url::Url::parse(rest).map_err(|e| format!("not a URL: {e}"))?;
        let loopback = match u.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            None => false,
        };
        match u.scheme() {
            "https" => {}
            "http" if loopback => {}
            "http" => {
                return Err(
                    "SES URL must be ses+https:// (ses+http:// only to a loopback address, for the simulator)"
                        .into(),
                );
            }
            _ => return Err("SES URL must be ses+https://".into()),
        }
        let host = u.host_str().ok_or("no host")?.to_string();
        let host = match u.port() {
            Some(p) => format!("{host}:{p}"),
            None => host,
        };
        let region = u
            .query_pairs()
            .find(|(k, _)| k == "region")
            .map(|(_, v)| v.to_string())
            .filter(|r| !r.is_empty())
            .ok_or("no ?region=")?;
        Ok(Self {
            base: format!("{}://{host}", u.scheme()),
            host,
            region,
            access_key,
            secret_key,
        })
    }

    /// The provider's name: `ses:<host>`.
    pub fn name(&self) -> String {
        format!("ses:{}", self.host)
    }
}

/// An SES v2 client.
pub struct SesClient {
    cfg: SesConfig,
    http: reqwest::Client,
}

impl SesClient {
    /// A client whose calls end after `timeout`.
    pub fn new(cfg: SesConfig, timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("SES client: {e}"))?;
        Ok(Self { cfg, http })
    }

    /// Sends `msg` (the lease is confirmed first: the request is the point of no return).
    pub async fn send(
        &self,
        msg: &Outgoing<'_>,
        lease: &Lease,
        content: Value,
    ) -> (AttemptOutcome, Verdict) {
        let body = json!({
            "FromEmailAddress": msg.from.as_ref().map(|a| a.to_string()),
            "Destination": {"ToAddresses": msg.to.iter().map(|a| a.to_string()).collect::<Vec<_>>()},
            "Content": {"Raw": {"Data": base64::engine::general_purpose::STANDARD.encode(msg.bytes)}},
        })
        .to_string();
        if let Err(lost) = lease.confirm().await {
            return (lost.outcome(content), Verdict::Neutral);
        }
        let path = "/v2/email/outbound-emails";
        let now = chrono::Utc::now();
        let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
        let auth = authorization(
            &self.cfg,
            "ses",
            "POST",
            path,
            "",
            &[
                ("content-type", "application/json"),
                ("host", &self.cfg.host),
                ("x-amz-date", &amz_date),
            ],
            body.as_bytes(),
            &amz_date,
        );
        let resp = self
            .http
            .post(format!("{}{path}", self.cfg.base))
            .header("content-type", "application/json")
            .header("x-amz-date", &amz_date)
            .header("authorization", auth)
            .body(body)
            .send()
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                // Without an answer the message may have been accepted.
                let code = if e.is_timeout() {
                    "ses_timeout"
                } else {
                    "ses_connection"
                };
                let sent = !e.is_connect();
                let out = AttemptOutcome::failed(ErrorClass::Transient, code, content)
                    .with_response(e.to_string());
                return if sent {
                    (out.ambiguous(), Verdict::Ambiguous)
                } else {
                    (out, Verdict::FailOver)
                };
            }
        };
        let status = resp.status().as_u16();
        let kind = resp
            .headers()
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(':').next().unwrap_or("").to_string());
        let text = resp.text().await.unwrap_or_default();
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status == 200 {
            let id = json["MessageId"].as_str().map(str::to_string);
            let out = AttemptOutcome::sent(id.or(Some(msg.message_id.clone())), content)
                .with_status(200)
                .with_response(text);
            return (out, Verdict::Answered);
        }
        let (class, code, verdict) = classify(status, kind.as_deref().unwrap_or(""));
        let out = AttemptOutcome::failed(class, code, content)
            .with_status(i32::from(status))
            .with_response(text);
        (out, verdict)
    }
}

/// The class, code and verdict of an SES error answer.
pub fn classify(status: u16, kind: &str) -> (ErrorClass, &'static str, Verdict) {
    match (status, kind) {
        (429, _)
        | (_, "TooManyRequestsException" | "LimitExceededException" | "ThrottlingException") => {
            (ErrorClass::Transient, "ses_throttled", Verdict::FailOver)
        }
        (_, "SendingPausedException" | "AccountSendingPausedException") => (
            ErrorClass::Transient,
            "ses_sending_paused",
            Verdict::FailOver,
        ),
        (_, "MessageRejected") => (ErrorClass::Permanent, "ses_rejected", Verdict::Answered),
        (s, _) if s >= 500 => (ErrorClass::Transient, "ses_unavailable", Verdict::FailOver),
        _ => (ErrorClass::Permanent, "ses_bad_request", Verdict::Answered),
    }
}

fn hex_sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// The AWS Signature Version 4 `Authorization` header of a request to `service` (`ses`
/// for SES). `headers` are the signed ones, lowercase names, sorted by name; `query` is
/// the canonical query string; `amz_date` the `X-Amz-Date` value (`YYYYMMDDTHHMMSSZ`).
/// Source: docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv.html.
#[allow(clippy::too_many_arguments)]
pub fn authorization(
    cfg: &SesConfig,
    service: &str,
    method: &str,
    path: &str,
    query: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    amz_date: &str,
) -> String {
    let date = &amz_date[..8];
    let canonical_headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim()))
        .collect();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| *k).collect();
    let signed = signed.join(";");
    let canonical = format!(
        "{method}\n{path}\n{query}\n{canonical_headers}\n{signed}\n{}",
        hex_sha256(body)
    );
    let scope = format!("{date}/{}/{service}/aws4_request", cfg.region);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex_sha256(canonical.as_bytes())
    );
    let k = hmac(
        format!("AWS4{}", cfg.secret_key).as_bytes(),
        date.as_bytes(),
    );
    let k = hmac(&k, cfg.region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    let k = hmac(&k, b"aws4_request");
    let signature = hex::encode(hmac(&k, to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        cfg.access_key
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of the AWS SigV4 documentation (IAM `ListUsers`, 2015-08-30).
    #[test]
    fn signs_as_the_documented_example() {
        let cfg = SesConfig {
            base: String::new(),
            host: "iam.amazonaws.com".into(),
            region: "us-east-1".into(),
            access_key: "AKIDEXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
        };
        let auth = authorization(
            &cfg,
            "iam",
            "GET",
            "/",
            "Action=ListUsers&Version=2010-05-08",
            &[
                (
                    "content-type",
                    "application/x-www-form-urlencoded; charset=utf-8",
                ),
                ("host", "iam.amazonaws.com"),
                ("x-amz-date", "20150830T123600Z"),
            ],
            b"",
            "20150830T123600Z",
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn errors_are_classified_as_ses_documents_them() {
        assert_eq!(classify(400, "MessageRejected").2, Verdict::Answered);
        assert_eq!(
            classify(429, "TooManyRequestsException").2,
            Verdict::FailOver
        );
        assert_eq!(classify(400, "SendingPausedException").2, Verdict::FailOver);
        assert_eq!(classify(503, "").2, Verdict::FailOver);
        assert_eq!(
            classify(400, "BadRequestException").0,
            ErrorClass::Permanent
        );
    }

    #[test]
    fn ses_urls_name_host_and_region() {
        let c = SesConfig::parse(
            "ses+https://email.ap-southeast-1.amazonaws.com?region=ap-southeast-1",
            "AKIDEXAMPLE".into(),
            "topsecret".into(),
        )
        .unwrap();
        assert_eq!(c.base, "https://email.ap-southeast-1.amazonaws.com");
        assert_eq!(c.name(), "ses:email.ap-southeast-1.amazonaws.com");
        assert!(SesConfig::parse("ses+https://h", "k".into(), "s".into()).is_err());
        // Plain http only to the loopback simulator.
        let k = || ("k".to_string(), "s".to_string());
        assert!(SesConfig::parse("ses+http://127.0.0.1:58080?region=r", k().0, k().1).is_ok());
        assert!(SesConfig::parse("ses+http://[::1]:58080?region=r", k().0, k().1).is_ok());
        let err = SesConfig::parse(
            "ses+http://email.ap-southeast-1.amazonaws.com?region=ap-southeast-1",
            k().0,
            k().1,
        )
        .unwrap_err();
        assert!(err.contains("ses+https://"), "{err}");
        assert!(!format!("{c:?}").contains("topsecret"));
    }
}
