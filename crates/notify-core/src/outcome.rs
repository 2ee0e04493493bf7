//! Typed result of one provider call. Adapters sort provider answers into these; the
//! worker runtime never parses provider text.

use std::time::Duration;

/// How a failed attempt should be treated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorClass {
    /// Temporary (5xx, timeout, connection error): retry with backoff.
    Transient,
    /// The provider asked us to slow down (429): retry no sooner than the rate-limit floor.
    RateLimited,
    /// Will never succeed (bad request, bad credentials, rejected address): fail now.
    Permanent,
    /// The push token, subscription or address is gone: fail now and deactivate the
    /// endpoint.
    InvalidEndpoint,
    /// The account's quota for the period is spent (LINE's monthly message limit): pause
    /// the whole channel until `retry_after`, without spending this delivery's attempt.
    QuotaExhausted,
}

/// The provider's verdict on one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// Accepted by the provider (or already accepted earlier, e.g. LINE 409).
    Sent {
        /// Provider's message or request id, if it gave one.
        provider_message_id: Option<String>,
    },
    /// Not accepted.
    Failed {
        /// How to treat it.
        class: ErrorClass,
        /// Normalised snake_case error code, e.g. `smtp_transient`, `line_429`, `unregistered`.
        code: String,
        /// Provider's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
}

/// Everything recorded about one provider call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptOutcome {
    /// The verdict.
    pub result: AttemptResult,
    /// HTTP status or SMTP reply code, if the provider answered.
    pub provider_status: Option<i32>,
    /// The provider's raw answer (truncated by the store to 20 KB).
    pub provider_response: Option<String>,
    /// What was sent, as JSON (rendered content, addressing, headers that matter).
    pub content: serde_json::Value,
    /// For an invalid endpoint: since when the provider says it has been invalid (APNs
    /// 410 `timestamp`). An endpoint registered again after this moment is kept.
    pub invalid_since: Option<chrono::DateTime<chrono::Utc>>,
}

impl AttemptOutcome {
    /// A successful attempt.
    pub fn sent(provider_message_id: Option<String>, content: serde_json::Value) -> Self {
        Self {
            result: AttemptResult::Sent {
                provider_message_id,
            },
            provider_status: None,
            provider_response: None,
            content,
            invalid_since: None,
        }
    }

    /// A failed attempt of `class` with `code`.
    pub fn failed(class: ErrorClass, code: impl Into<String>, content: serde_json::Value) -> Self {
        Self {
            result: AttemptResult::Failed {
                class,
                code: code.into(),
                retry_after: None,
            },
            provider_status: None,
            provider_response: None,
            content,
            invalid_since: None,
        }
    }

    /// Sets since when the endpoint has been invalid (see [`AttemptOutcome::invalid_since`]).
    pub fn with_invalid_since(mut self, at: Option<chrono::DateTime<chrono::Utc>>) -> Self {
        self.invalid_since = at;
        self
    }

    /// Sets the provider's status code.
    pub fn with_status(mut self, status: i32) -> Self {
        self.provider_status = Some(status);
        self
    }

    /// Sets the provider's raw answer.
    pub fn with_response(mut self, response: impl Into<String>) -> Self {
        self.provider_response = Some(response.into());
        self
    }

    /// Sets the provider's `Retry-After` on a failed attempt (no effect on success).
    pub fn with_retry_after(mut self, after: Option<Duration>) -> Self {
        if let AttemptResult::Failed { retry_after, .. } = &mut self.result {
            *retry_after = after;
        }
        self
    }
}

/// Parses an HTTP `Retry-After` value given in delay-seconds (RFC 9110 §10.2.3).
/// HTTP-dates and garbage give `None`.
pub fn parse_retry_after_seconds(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_seconds_only() {
        assert_eq!(
            parse_retry_after_seconds(" 120 "),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT"),
            None
        );
        assert_eq!(parse_retry_after_seconds("-1"), None);
    }

    #[test]
    fn retry_after_only_applies_to_failures() {
        let ok = AttemptOutcome::sent(None, serde_json::Value::Null)
            .with_retry_after(Some(Duration::from_secs(5)));
        assert_eq!(
            ok.result,
            AttemptResult::Sent {
                provider_message_id: None
            }
        );
        let f = AttemptOutcome::failed(ErrorClass::RateLimited, "x", serde_json::Value::Null)
            .with_retry_after(Some(Duration::from_secs(5)));
        assert!(
            matches!(f.result, AttemptResult::Failed { retry_after: Some(d), .. } if d.as_secs() == 5)
        );
    }
}
