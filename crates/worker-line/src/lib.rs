//! The LINE channel: Messaging API push message
//! (`POST {base}/v2/bot/message/push`, developers.line.biz/en/reference/messaging-api).
//!
//! Every attempt of a delivery carries the same `X-Line-Retry-Key` (a UUID stored with the
//! delivery before the first call), so LINE itself drops a resend of an accepted request
//! and answers 409 with `x-line-accepted-request-id`: we count that as sent.
//!
//! What is sent ([`messages`]): the content's `overrides.line_messages` when set; else a
//! Flex Message card when the content has an image or actions (hero image, title, body,
//! one button per action: a `uri` action for a link, a `postback` naming the delivery
//! and action for an app deep link, recorded as a click by the webhook); else text, split
//! at grapheme-cluster boundaries into up to five text objects of one push (LINE allows 1
//! to 5 messages per push); longer text fails permanently with `content_too_long`. The
//! messages are checked against LINE's documented limits ([`notify_core::line`]) before
//! the call: a card over a limit fails permanently with `content_invalid`, naming the
//! field and the rule, and LINE is not called.
//!
//! A delivery of provider `line_multicast` (a topic event sent with `line_multicast`)
//! holds up to 500 LINE user ids and goes to `POST {base}/v2/bot/message/multicast` with
//! `"to": [ids]` and its own retry key. LINE answers `{}` for the whole batch: it states
//! no per-recipient result, so the batch is sent or failed as one delivery.

use notify_core::{AttemptOutcome, Channel, ErrorClass};
use notify_worker::{ChannelSender, Job, Lease};
use serde_json::json;
use std::time::Duration;

pub mod messages;

/// Most UTF-16 code units in one LINE text message object (LINE text-character-count).
pub const MAX_TEXT_UTF16: usize = notify_core::line::MAX_TEXT_UTF16;

/// Most message objects in one push request (LINE Messaging API, push message: 1 to 5).
pub const MAX_MESSAGES: usize = notify_core::line::MAX_MESSAGES;

/// Settings of the LINE channel.
#[derive(Debug, Clone)]
pub struct LineConfig {
    /// API base URL, `https://api.line.me` in production.
    pub api_base: String,
    /// Channel access token (long-lived or v2.1).
    pub channel_token: String,
    /// Timeout of one HTTP call.
    pub timeout: Duration,
}

impl LineConfig {
    /// Reads `NOTIFY_LINE_API_BASE` (https://api.line.me), `NOTIFY_LINE_CHANNEL_TOKEN`
    /// (required), `NOTIFY_HTTP_TIMEOUT` (10s).
    ///
    /// # Errors
    /// [`Missing`](notify_core::config::Missing) without the channel token; every problem
    /// is also recorded in `env`.
    pub fn from_env(
        env: &mut notify_core::config::Env,
    ) -> Result<Self, notify_core::config::Missing> {
        Ok(Self {
            api_base: env.base_url("NOTIFY_LINE_API_BASE", "https://api.line.me"),
            timeout: env.duration(
                "NOTIFY_HTTP_TIMEOUT",
                Duration::from_secs(10),
                Duration::from_secs(1),
                Duration::from_secs(600),
            ),
            channel_token: env.required("NOTIFY_LINE_CHANNEL_TOKEN")?,
        })
    }
}

/// Sender for LINE push messages.
pub struct LineSender {
    http: reqwest::Client,
    cfg: LineConfig,
}

impl LineSender {
    /// Builds the HTTP client (rustls, HTTP/2 when offered).
    pub fn new(cfg: LineConfig) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .user_agent(concat!("notify-worker-line/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { http, cfg })
    }
}

/// Retries must start within this long of a delivery's creation: LINE honours a retry
/// key for 24 hours (developers.line.biz/en/docs/messaging-api/retrying-api-request), and
/// the hour of margin covers clock skew and a slow last call.
pub const RETRY_HORIZON: Duration = Duration::from_secs(23 * 3600);

impl ChannelSender for LineSender {
    fn channel(&self) -> Channel {
        Channel::Line
    }

    fn retry_horizon(&self) -> Option<Duration> {
        Some(RETRY_HORIZON)
    }

    /// `NOTIFY_HTTP_TIMEOUT` (10 s): the whole request, answer body included.
    fn call_deadline(&self) -> Duration {
        self.cfg.timeout
    }

    async fn send(&self, job: &Job, lease: &Lease) -> AttemptOutcome {
        let retry_key = job.retry_key.unwrap_or(job.id);
        let messages = match messages::build(&job.content, job.id) {
            Ok(m) => m,
            Err(too_long) => {
                let content = json!({"retry_key": retry_key, "text": job.content.chat_text()});
                return AttemptOutcome::failed(ErrorClass::Permanent, "content_too_long", content)
                    .with_response(too_long.to_string());
            }
        };
        let mut limits = notify_core::validate::Violations::default();
        notify_core::line::check_messages("messages", &messages, &mut limits);
        if !limits.0.is_empty() {
            let listed: Vec<String> = limits
                .0
                .iter()
                .map(|f| format!("{}: {}", f.field, f.description))
                .collect();
            let content = json!({
                "retry_key": retry_key,
                "fields": limits.0.iter().map(|f| &f.field).collect::<Vec<_>>(),
                "messages": messages,
            });
            return AttemptOutcome::failed(ErrorClass::Permanent, "content_invalid", content)
                .with_response(listed.join("; "))
                .quoting_response();
        }
        let multicast = matches!(job.provider, notify_core::Provider::LineMulticast);
        let body = if multicast {
            let to: Vec<&str> = job
                .address
                .as_deref()
                .unwrap_or("")
                .split(',')
                .filter(|id| !id.is_empty())
                .collect();
            json!({"to": to, "messages": messages})
        } else {
            json!({"to": job.address, "messages": messages})
        };
        let content = json!({"retry_key": retry_key, "request": body});
        if job.address.as_deref().unwrap_or("").is_empty() {
            return AttemptOutcome::failed(ErrorClass::Permanent, "no_line_user_id", content);
        }
        let url = format!(
            "{}/v2/bot/message/{}",
            self.cfg.api_base.trim_end_matches('/'),
            if multicast { "multicast" } else { "push" }
        );
        let request = self
            .http
            .post(url)
            .bearer_auth(&self.cfg.channel_token)
            .header("X-Line-Retry-Key", retry_key.to_string())
            .json(&body);
        let answer = match notify_worker::http::send(request, "line", lease).await {
            Ok(a) => a,
            Err(e) => return e.into_outcome(content),
        };
        let (status, retry_after) = (answer.status, answer.retry_after);
        let request_id = answer.header("x-line-request-id").map(str::to_string);
        let accepted_id = answer
            .header("x-line-accepted-request-id")
            .map(str::to_string);
        let out = match status {
            200 => {
                let sent_id = answer.json()["sentMessages"][0]["id"]
                    .as_str()
                    .map(str::to_string);
                AttemptOutcome::sent(sent_id.or(request_id), content)
            }
            // The retry key was already accepted: an earlier attempt went through.
            409 => AttemptOutcome::sent(accepted_id.or(request_id), content),
            // The monthly message quota, not a rate limit: pause LINE until the month ends.
            429 if is_monthly_quota(&answer.json()) => {
                let until = next_quota_month(chrono::Utc::now());
                let wait = (until - chrono::Utc::now()).to_std().unwrap_or_default();
                AttemptOutcome::failed(ErrorClass::QuotaExhausted, "line_monthly_quota", content)
                    .with_retry_after(Some(wait))
            }
            429 => AttemptOutcome::failed(ErrorClass::RateLimited, "line_rate_limited", content)
                .with_retry_after(retry_after),
            500..=599 => {
                AttemptOutcome::failed(ErrorClass::Transient, format!("line_{status}"), content)
                    .with_retry_after(retry_after)
            }
            // 400 (bad request, unknown user), 401 (token), 403 (not allowed), 413 (too large).
            _ => AttemptOutcome::failed(ErrorClass::Permanent, format!("line_{status}"), content),
        };
        out.with_status(status as i32).with_response(answer.body)
    }
}

/// Whether a 429 answer is LINE's monthly-quota refusal (`"You have reached your monthly
/// limit."`, LINE Messaging API reference, status codes) rather than a rate limit.
pub fn is_monthly_quota(body: &serde_json::Value) -> bool {
    body["message"]
        .as_str()
        .is_some_and(|m| m.to_ascii_lowercase().contains("monthly limit"))
}

/// When LINE's message quota starts again after `now`: the first moment of the next
/// calendar month in Japan time (LINE counts the month in JST; an operator can end the
/// pause earlier by deleting the `channel_pauses` row).
pub fn next_quota_month(now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    use chrono::{Datelike, TimeZone};
    let jst = now.with_timezone(&chrono_tz::Asia::Tokyo);
    let (year, month) = if jst.month() == 12 {
        (jst.year() + 1, 1)
    } else {
        (jst.year(), jst.month() + 1)
    };
    chrono_tz::Asia::Tokyo
        .with_ymd_and_hms(year, month, 1, 0, 0, 0)
        .single()
        .map(|t| t.with_timezone(&chrono::Utc))
        .unwrap_or(now + chrono::Duration::days(31))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_quota_month_ends_at_midnight_japan_time() {
        let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        // 2026-11-30 16:00 UTC is already 1 December 01:00 in Japan.
        assert_eq!(
            next_quota_month(at("2026-11-30T16:00:00Z")),
            at("2026-12-31T15:00:00Z")
        );
        assert_eq!(
            next_quota_month(at("2026-11-30T14:59:59Z")),
            at("2026-11-30T15:00:00Z")
        );
        assert_eq!(
            next_quota_month(chrono::Utc.with_ymd_and_hms(2026, 12, 20, 0, 0, 0).unwrap()),
            at("2026-12-31T15:00:00Z"),
            "December rolls into January of the next year"
        );
    }

    #[test]
    fn only_the_monthly_limit_message_is_a_quota() {
        assert!(is_monthly_quota(
            &serde_json::json!({"message": "You have reached your monthly limit."})
        ));
        assert!(!is_monthly_quota(
            &serde_json::json!({"message": "The API rate limit has been exceeded. Try again later."})
        ));
    }
}
