use super::*;
use serde_json::json;

fn job(attempt: i32) -> DeliveryJob {
    let mut job = crate::testing::job("push", "fcm");
    job.attempt = attempt;
    job
}

#[test]
fn transient_failures_retry_until_the_budget_is_spent() {
    let p = RetryPolicy::default();
    let out = || {
        AttemptOutcome::failed(ErrorClass::Transient, "fcm_unavailable", json!({})).with_status(503)
    };
    // Jitter 0.5: the middle of the band, the base delay of 30 s itself.
    let (next, rec) = decide(&p, None, &job(1), out(), 0.5);
    assert!(matches!(next, NextState::Retry { after, .. } if after == Duration::from_secs(30)));
    assert_eq!(rec.outcome, AttemptLabel::Retry);
    let (next, rec) = decide(&p, None, &job(5), out(), 0.5);
    assert!(matches!(&next, NextState::Failed { error } if error.contains("gave up after 5")));
    assert_eq!(rec.outcome, AttemptLabel::Failed);
}

#[test]
fn invalid_endpoint_fails_at_once_and_deactivates_that_endpoint() {
    let (next, rec) = decide(
        &RetryPolicy::default(),
        None,
        &job(1),
        AttemptOutcome::failed(ErrorClass::InvalidEndpoint, "unregistered", json!({}))
            .with_status(404),
        0.5,
    );
    assert_eq!(
        next,
        NextState::Failed {
            error: "unregistered (provider status 404)".into()
        }
    );
    assert_eq!(
        rec.deactivate_endpoint,
        Some((uuid::Uuid::from_u128(7), "unregistered".into()))
    );
}

#[test]
fn no_retry_is_scheduled_past_the_provider_horizon() {
    let mut j = job(2);
    j.first_attempt_at = j.started_at - chrono::Duration::hours(20);
    let out = AttemptOutcome::failed(ErrorClass::RateLimited, "line_rate_limited", json!({}))
        .with_retry_after(Some(Duration::from_secs(5 * 3600)));
    let horizon = Some(Duration::from_secs(23 * 3600));
    let (next, _) = decide(&RetryPolicy::default(), horizon, &j, out.clone(), 0.5);
    assert!(
        matches!(&next, NextState::Failed { error } if error.contains("retry horizon")),
        "{next:?}"
    );
    let (next, _) = decide(&RetryPolicy::default(), None, &j, out, 0.5);
    assert!(matches!(next, NextState::Retry { .. }));
}

#[test]
fn rate_limited_waits_for_retry_after() {
    let out = AttemptOutcome::failed(ErrorClass::RateLimited, "line_rate_limited", json!({}))
        .with_retry_after(Some(Duration::from_secs(120)));
    let (next, _) = decide(&RetryPolicy::default(), None, &job(1), out, 0.5);
    assert!(matches!(next, NextState::Retry { after, .. } if after == Duration::from_secs(120)));
}

#[test]
fn the_jitter_given_places_the_delay_in_its_band() {
    let p = RetryPolicy::default();
    let out = AttemptOutcome::failed(ErrorClass::Transient, "fcm_unavailable", json!({}));
    let after = |jitter: f64| match decide(&p, None, &job(1), out.clone(), jitter).0 {
        NextState::Retry { after, .. } => after,
        other => panic!("{other:?}"),
    };
    // 30 s +-20 %: 0 gives the shortest, towards 1 the longest; the same jitter the same.
    assert_eq!(after(0.0), Duration::from_secs(24));
    assert_eq!(after(0.25), Duration::from_secs(27));
    assert!(after(0.999_999) > Duration::from_millis(35_999));
    assert_eq!(after(0.75), after(0.75));
}

#[test]
fn a_failure_that_names_its_fix_is_quoted_in_the_error() {
    let p = RetryPolicy::default();
    let template = AttemptOutcome::failed(ErrorClass::Permanent, "template_error", json!({}))
        .with_response("template t/push/th:body line 1: unknown field")
        .quoting_response();
    let (next, _) = decide(&p, None, &job(1), template, 0.5);
    assert_eq!(
        next,
        NextState::Failed {
            error: "template_error: template t/push/th:body line 1: unknown field".into()
        }
    );
    // A provider's text is never quoted: only its status.
    let provider = AttemptOutcome::failed(ErrorClass::Permanent, "line_400", json!({}))
        .with_response("{\"message\":\"bad\"}");
    let (next, _) = decide(&p, None, &job(1), provider, 0.5);
    assert_eq!(
        next,
        NextState::Failed {
            error: "line_400".into()
        }
    );
}

#[test]
fn no_provider_called_is_not_an_attempt_even_on_the_last_one() {
    let out = AttemptOutcome::failed(ErrorClass::Unavailable, "email_providers_open", json!({}))
        .with_retry_after(Some(Duration::from_secs(7)));
    // On the last attempt allowed too: nothing was called, so nothing gives up.
    let mut last = job(5);
    last.max_attempts = 5;
    let (next, _) = decide(&RetryPolicy::default(), None, &last, out, 0.5);
    assert_eq!(
        next,
        NextState::Unavailable {
            after: Duration::from_secs(7),
            error: "email_providers_open".into()
        }
    );
}
