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

/// Parses an HTTP `Retry-After` value (RFC 9110 §10.2.3) in either form: delay-seconds
/// (`120`), or an HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`, and the obsolete RFC 850
/// and asctime forms, §5.6.7), which is turned into the wait from `now`; a date in the
/// past means no wait. Garbage gives `None`.
pub fn parse_retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_seconds_or_as_an_http_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_000); // 07:20:00 GMT
        assert_eq!(
            parse_retry_after(" 120 ", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(480))
        );
        assert_eq!(
            parse_retry_after("Wednesday, 21-Oct-15 07:28:00 GMT", now),
            Some(Duration::from_secs(480))
        );
        assert_eq!(
            parse_retry_after("Wed Oct 21 07:28:00 2015", now),
            Some(Duration::from_secs(480))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
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
