//! One signed POST to an endpoint, and the HTTP client that makes it: no redirects
//! followed, one total timeout, and a resolver that refuses names resolving to private,
//! loopback or link-local addresses (checked when connecting, so a name that changes its
//! answer after registration is still refused), except the development hosts.

use notify_core::links::LinkPolicy;
use notify_core::webhook;
use notify_store::webhooks::{ClaimedMessage, PostResult};
use notify_worker::http::PublicOnly;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of the answer's body read (the rest is dropped unread).
pub const MAX_BODY_READ: usize = 1024;

/// The HTTP client of the worker: `timeout` per request (connect included), redirects
/// never followed (a 3xx is a failed attempt), addresses filtered by [`PublicOnly`].
///
/// # Errors
/// reqwest's, when the TLS backend cannot be set up.
pub fn client(policy: &LinkPolicy, timeout: Duration) -> reqwest::Result<reqwest::Client> {
    notify_telemetry::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Arc::new(PublicOnly::new(policy.clone())))
        .user_agent(concat!("notify-webhook/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The three Standard Webhooks headers for `msg` sent at `timestamp` (Unix seconds).
pub fn headers(msg: &ClaimedMessage, timestamp: i64) -> [(&'static str, String); 3] {
    let id = webhook::message_id(msg.id);
    let secrets: Vec<&str> = msg.secrets.iter().map(String::as_str).collect();
    let signature = webhook::signature_header(&secrets, &id, timestamp, msg.body.as_bytes());
    [
        ("webhook-id", id),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
    ]
}

/// POSTs `msg` (the URL checked again against `policy` first, with
/// [`webhook::endpoint_url`]: an IP-address host must be public unless a development
/// host, else `refused: ...` and no connection is made) and sorts the answer: a 2xx
/// is success (`error` None); anything else names what went wrong (`http_<status>`,
/// `timeout`, `connect: ...`, `refused: ...`).
pub async fn post(http: &reqwest::Client, policy: &LinkPolicy, msg: &ClaimedMessage) -> PostResult {
    let started = Instant::now();
    // Parsed with the parser reqwest uses and that parsed URL connected to: a host
    // that is an IP address (however spelt: `127.1`, `0x7f000001`) never reaches the
    // resolver, so it is judged here, before any connection.
    let url = match webhook::endpoint_url(policy, &msg.url) {
        Ok(url) => url,
        Err(why) => {
            return PostResult {
                error: Some(format!("refused: the endpoint URL {why}")),
                latency: started.elapsed(),
                ..Default::default()
            };
        }
    };
    let mut req = http.post(url).header("content-type", "application/json");
    for (name, value) in headers(msg, chrono::Utc::now().timestamp()) {
        req = req.header(name, value);
    }
    match req.body(msg.body.clone()).send().await {
        Ok(mut resp) => {
            let status = resp.status();
            let latency = started.elapsed();
            let mut excerpt = Vec::new();
            // Read at most MAX_BODY_READ bytes, within the same timeout.
            while excerpt.len() < MAX_BODY_READ {
                match resp.chunk().await {
                    Ok(Some(c)) => excerpt.extend_from_slice(&c),
                    _ => break,
                }
            }
            excerpt.truncate(MAX_BODY_READ);
            PostResult {
                status_code: Some(i32::from(status.as_u16())),
                latency,
                error: (!status.is_success()).then(|| format!("http_{}", status.as_u16())),
                response_excerpt: Some(String::from_utf8_lossy(&excerpt).into_owned()),
            }
        }
        Err(e) => PostResult {
            status_code: None,
            latency: started.elapsed(),
            error: Some(describe(&e)),
            response_excerpt: None,
        },
    }
}

/// A transport error in a few words: `timeout`, `connect: <cause>`, or the error's text.
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timeout".into();
    }
    let mut cause = String::new();
    let mut src: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = src {
        cause = s.to_string();
        src = s.source();
    }
    if e.is_connect() {
        format!("connect: {cause}")
    } else {
        format!("request: {cause}")
    }
}
