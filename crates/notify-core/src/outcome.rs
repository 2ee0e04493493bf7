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
    /// The provider answered that the channel cannot take calls for a known period: the
    /// account's quota for the period is spent (LINE's monthly message limit). Pause the
    /// whole channel until `retry_after`; the call is recorded as an attempt, and this
    /// delivery's budget grows by one so the pause spends none of it.
    QuotaExhausted,
    /// No provider was called: none can take a call for a known period (every email
    /// provider's circuit breaker is open, or half-open with its probe out). Nothing left
    /// the worker, so this is not an attempt: the claim is given back (no attempt row, no
    /// status webhook, `attempts` as before the claim) and the channel pauses until
    /// `retry_after`.
    Unavailable,
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
    Failed(AttemptError),
}

/// Why an attempt failed, set where the failure is found (the adapter, or the runtime
/// for its own deadline and template failures): metrics and alerts read these fields and
/// never parse [`AttemptError::code`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptError {
    /// How to treat it.
    pub class: ErrorClass,
    /// Normalised snake_case error code, e.g. `smtp_transient`, `line_429`, `unregistered`:
    /// the text stored with the attempt and on the delivery.
    pub code: String,
    /// The code as a metric label and log field (statuses folded to classes, no provider
    /// text).
    pub reason: Reason,
    /// The provider may have accepted the call (it timed out after the request went out).
    pub ambiguous: bool,
    /// The delivery's error quotes the attempt's response, because it is our own account of
    /// what to fix (a template that does not render), not a provider's text.
    pub quote_response: bool,
    /// Provider's `Retry-After`, if it sent one.
    pub retry_after: Option<Duration>,
}

/// A low-cardinality failure reason, safe for a metric label or a log field: a short
/// snake_case word list (at most 40 bytes) with numbers folded to classes (`line_503` ->
/// `line_5xx`), so a provider's new status does not make a new series and provider text
/// (tokens, ids) never reaches a label.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reason(String);

impl Reason {
    /// The reason of error code `code`. A code that is not a short snake_case word list
    /// (some embed a provider's own error name, `fcm_<errorCode>`) becomes
    /// `<first word>_other`, or `other`.
    pub fn of_code(code: &str) -> Self {
        let well_formed = !code.is_empty()
            && code.len() <= 40
            && code
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !well_formed {
            let first: String = code
                .split(|c: char| !c.is_ascii_alphanumeric())
                .next()
                .unwrap_or("")
                .chars()
                .filter(char::is_ascii_alphabetic)
                .take(16)
                .collect::<String>()
                .to_ascii_lowercase();
            return Self(if first.is_empty() {
                "other".to_string()
            } else {
                format!("{first}_other")
            });
        }
        let mut out = String::with_capacity(code.len());
        for part in code.split('_') {
            if !out.is_empty() {
                out.push('_');
            }
            match part.as_bytes() {
                [d, rest @ ..] if d.is_ascii_digit() && rest.iter().all(u8::is_ascii_digit) => {
                    out.push(*d as char);
                    out.push_str("xx");
                }
                _ => out.push_str(part),
            }
        }
        Self(out.chars().take(40).collect())
    }

    /// The label value.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
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

    /// A failed attempt of `class` with `code`; its [`Reason`] is derived from the code,
    /// and it is not ambiguous (see [`AttemptOutcome::ambiguous`]).
    pub fn failed(class: ErrorClass, code: impl Into<String>, content: serde_json::Value) -> Self {
        let code = code.into();
        Self {
            result: AttemptResult::Failed(AttemptError {
                class,
                reason: Reason::of_code(&code),
                code,
                ambiguous: false,
                quote_response: false,
                retry_after: None,
            }),
            provider_status: None,
            provider_response: None,
            content,
            invalid_since: None,
        }
    }

    /// The failure, if the attempt failed.
    pub fn error(&self) -> Option<&AttemptError> {
        match &self.result {
            AttemptResult::Failed(e) => Some(e),
            AttemptResult::Sent { .. } => None,
        }
    }

    /// Marks a failed attempt ambiguous: the provider may have accepted it (a timeout after
    /// the request went out). No effect on success.
    pub fn ambiguous(mut self) -> Self {
        if let AttemptResult::Failed(e) = &mut self.result {
            e.ambiguous = true;
        }
        self
    }

    /// Marks a failed attempt's response as our own account of what to fix, to be quoted
    /// in the delivery's error (see [`AttemptError::quote_response`]). No effect on success.
    pub fn quoting_response(mut self) -> Self {
        if let AttemptResult::Failed(e) = &mut self.result {
            e.quote_response = true;
        }
        self
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
        if let AttemptResult::Failed(e) = &mut self.result {
            e.retry_after = after;
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
        let secs = |s| Some(Duration::from_secs(s));
        for (value, wait) in [
            (" 120 ", secs(120)),
            ("Wed, 21 Oct 2015 07:28:00 GMT", secs(480)),
            ("Wednesday, 21-Oct-15 07:28:00 GMT", secs(480)),
            ("Wed Oct 21 07:28:00 2015", secs(480)),
            ("Wed, 21 Oct 2015 07:00:00 GMT", Some(Duration::ZERO)),
        ] {
            assert_eq!(parse_retry_after(value, now), wait, "{value}");
        }
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
        assert_eq!(f.error().unwrap().retry_after, Some(Duration::from_secs(5)));
        assert!(!f.error().unwrap().ambiguous);
        assert!(f.ambiguous().error().unwrap().ambiguous);
    }

    #[test]
    fn reasons_fold_statuses_into_classes() {
        let r = |code: &str| Reason::of_code(code).as_str().to_string();
        assert_eq!(r("line_400"), "line_4xx");
        assert_eq!(r("invalid_token"), "invalid_token");
        assert_eq!(r("fcm_503_unavailable"), "fcm_5xx_unavailable");
        // Provider text with tokens or ids in it never becomes a label.
        assert_eq!(r("fcm_Token qafcm86c5c6703 bad"), "fcm_other");
        assert_eq!(r("apns_bad_thing user=qa-push-1"), "apns_other");
        assert_eq!(r(&"x".repeat(60)), "xxxxxxxxxxxxxxxx_other");
        assert_eq!(r(""), "other");
    }
}
