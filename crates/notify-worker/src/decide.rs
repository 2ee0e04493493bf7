//! Turning an attempt's outcome into the delivery's next state and the attempt record.

use notify_core::outcome::{AttemptError, AttemptOutcome, AttemptResult, ErrorClass};
use notify_core::{AttemptLabel, Channel, RetryPolicy};
use notify_store::deliveries::{AttemptRecord, DeliveryJob, NextState};
use std::time::Duration;

/// Turns an attempt's outcome into the delivery's next state and the attempt record,
/// using the retry policy, the delivery's attempt budget and the provider's retry horizon
/// (measured from the delivery's creation to the next attempt, on the database clock).
/// Pure: `jitter` (uniform in `[0, 1)`, the caller draws it) spreads a retry's delay as
/// [`RetryPolicy::next_delay`] does.
pub fn decide(
    policy: &RetryPolicy,
    horizon: Option<Duration>,
    job: &DeliveryJob,
    outcome: AttemptOutcome,
    jitter: f64,
) -> (NextState, AttemptRecord) {
    let mut record = AttemptRecord {
        // Set from the next state below.
        outcome: AttemptLabel::Sent,
        provider_status: outcome.provider_status,
        error_code: None,
        provider_response: outcome.provider_response,
        content: outcome.content,
        deactivate_endpoint: None,
        address_undeliverable: None,
        endpoint_invalid_since: outcome.invalid_since,
        worker_id: String::new(),
        call_took: Duration::ZERO,
    };
    let next = match outcome.result {
        AttemptResult::Sent {
            provider_message_id,
        } => NextState::Sent {
            provider_message_id,
        },
        AttemptResult::Failed(AttemptError {
            class,
            code,
            retry_after,
            quote_response,
            ..
        }) => {
            record.error_code = Some(code.clone());
            // A provider's status, or for a failure before any call (a template error)
            // the reason itself, which names what to fix.
            let status = match (record.provider_status, &record.provider_response) {
                (Some(s), _) => format!(" (provider status {s})"),
                (None, Some(why)) if quote_response => format!(": {why}"),
                _ => String::new(),
            };
            match class {
                ErrorClass::Permanent => NextState::Failed {
                    error: format!("{code}{status}"),
                },
                ErrorClass::InvalidEndpoint => {
                    if let Some(ep) = job.endpoint_id {
                        record.deactivate_endpoint = Some((ep, code.clone()));
                    } else if job.channel == Channel::Email
                        && let Some(address) = &job.address
                    {
                        record.address_undeliverable = Some((address.clone(), code.clone()));
                    }
                    NextState::Failed {
                        error: format!("{code}{status}"),
                    }
                }
                ErrorClass::QuotaExhausted => {
                    NextState::Paused {
                        // Without a stated end, look again in an hour.
                        after: retry_after.unwrap_or(Duration::from_secs(3600)),
                        error: format!("{code}{status}"),
                    }
                }
                ErrorClass::Unavailable => {
                    // Not an attempt (no provider was called): nothing is recorded as one.
                    NextState::Unavailable {
                        after: retry_after.unwrap_or(Duration::from_secs(1)),
                        error: format!("{code}{status}"),
                    }
                }
                ErrorClass::Transient | ErrorClass::RateLimited => {
                    let budget = RetryPolicy {
                        max_attempts: job.max_attempts.max(1) as u32,
                        ..policy.clone()
                    };
                    let age = (job.started_at - job.first_attempt_at)
                        .to_std()
                        .unwrap_or_default();
                    let delay = budget
                        .next_delay(
                            job.attempt.max(1) as u32,
                            retry_after,
                            class == ErrorClass::RateLimited,
                            jitter,
                        )
                        .filter(|d| horizon.is_none_or(|h| age.saturating_add(*d) < h));
                    match delay {
                        Some(after) => NextState::Retry {
                            after,
                            error: format!("{code}{status}"),
                        },
                        None => NextState::Failed {
                            error: format!(
                                "{code}{status}; gave up after {} attempts (attempt budget or retry horizon spent)",
                                job.attempt
                            ),
                        },
                    }
                }
            }
        }
    };
    record.outcome = next.attempt_label();
    (next, record)
}

#[cfg(test)]
mod tests;
