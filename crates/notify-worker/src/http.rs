//! HTTP plumbing shared by the HTTP provider adapters (LINE, FCM, ...): a transport
//! failure becomes a transient outcome, an answer is read whole with its headers and its
//! `Retry-After`.

use notify_core::links::LinkPolicy;
use notify_core::outcome::parse_retry_after;
use notify_core::{AttemptOutcome, ErrorClass};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::net::SocketAddr;
use std::time::Duration;

/// A resolver for clients that connect to URLs someone else supplied (status webhook
/// endpoints, Web Push subscriptions): names are resolved with the system resolver and
/// only public addresses kept ([`notify_core::webhook::is_public`]), so a name that
/// resolves (or starts resolving after registration) to a private, loopback or
/// link-local address is refused when connecting, and what was checked is what is
/// connected to. A name with none left is an error. Development hosts
/// ([`LinkPolicy::http_hosts`]) resolve unfiltered. IP-address hosts never reach a
/// resolver: check them first with [`notify_core::webhook::endpoint_url`].
#[derive(Debug, Clone)]
pub struct PublicOnly {
    policy: LinkPolicy,
}

impl PublicOnly {
    /// A resolver exempting `policy`'s development hosts.
    pub fn new(policy: LinkPolicy) -> Self {
        Self { policy }
    }
}

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_ascii_lowercase();
        let dev = notify_core::webhook::dev_host(&self.policy, &host);
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| dev || notify_core::webhook::is_public(a.ip()))
                .collect();
            if found.is_empty() {
                return Err(format!(
                    "refused: {host} resolves to no public address (private, loopback or link-local)"
                )
                .into());
            }
            let addrs: Addrs = Box::new(found.into_iter());
            Ok(addrs)
        })
    }
}

/// A provider's complete HTTP answer.
#[derive(Debug)]
pub struct HttpAnswer {
    /// HTTP status code.
    pub status: u16,
    /// Response headers.
    pub headers: reqwest::header::HeaderMap,
    /// Body as text (empty if unreadable).
    pub body: String,
    /// `Retry-After` (delay-seconds, or an HTTP-date turned into the wait from now), if sent.
    pub retry_after: Option<Duration>,
}

impl HttpAnswer {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// The request never got an answer (timeout, refused or reset connection, TLS failure).
#[derive(Debug)]
pub struct TransportError {
    /// `<provider>_timeout` or `<provider>_connection`.
    pub code: String,
    /// The client's error text.
    pub detail: String,
    /// The request may have reached the provider (it timed out waiting for the answer).
    pub ambiguous: bool,
}

impl TransportError {
    /// A transient failed attempt carrying `content`, ambiguous after a timeout.
    pub fn into_outcome(self, content: serde_json::Value) -> AttemptOutcome {
        let out = AttemptOutcome::failed(ErrorClass::Transient, self.code, content)
            .with_response(self.detail);
        if self.ambiguous { out.ambiguous() } else { out }
    }
}

/// Confirms `lease` ([`crate::Lease::confirm`]: the point of no return is writing the
/// request), then sends `request` and reads the whole answer. `provider` prefixes the
/// error codes; a lease found lost is `lease_lost`, with no request sent.
pub async fn send(
    request: reqwest::RequestBuilder,
    provider: &str,
    lease: &crate::Lease,
) -> Result<HttpAnswer, TransportError> {
    if let Err(lost) = lease.confirm().await {
        return Err(TransportError {
            code: "lease_lost".into(),
            detail: lost.to_string(),
            ambiguous: false,
        });
    }
    let resp = request.send().await.map_err(|e| TransportError {
        code: format!(
            "{provider}_{}",
            if e.is_timeout() {
                "timeout"
            } else {
                "connection"
            }
        ),
        detail: e.to_string(),
        ambiguous: e.is_timeout(),
    })?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let retry_after = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
    let body = resp.text().await.unwrap_or_default();
    Ok(HttpAnswer {
        status,
        headers,
        body,
        retry_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn no_request_is_sent_under_a_lease_that_cannot_be_confirmed() {
        // Answers anything that connects; a request that got through would be answered.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/v2/bot/message/push",
            listener.local_addr().unwrap()
        );
        let lease = crate::Lease::held_for(Duration::from_secs(3));
        tokio::time::advance(Duration::from_secs(3)).await;
        notify_telemetry::install_crypto_provider();
        let request = reqwest::Client::new().post(url).body("{}");
        let err = send(request, "line", &lease).await.unwrap_err();
        assert_eq!(err.code, "lease_lost");
        assert!(lease.abandoned());
        let accepted = tokio::time::timeout(Duration::from_millis(10), listener.accept()).await;
        assert!(accepted.is_err(), "nothing connected to the provider");
    }
}
