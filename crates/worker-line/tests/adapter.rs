//! The LINE adapter called directly (no broker, no database) against the provider
//! simulator on port 0, through a table of answers: each maps to one typed outcome.

use notify_core::ErrorClass;
use notify_worker::ChannelSender;
use notify_worker::testing::{LINE_TOKEN, Sim, failure, job, lease, sent_id};
use serde_json::json;
use std::time::Duration;
use worker_line::{LineConfig, LineSender};

/// The adapter's HTTP timeout here; the timeout row answers later than it.
const TIMEOUT: Duration = Duration::from_millis(500);

fn sender(sim: &Sim) -> LineSender {
    LineSender::new(LineConfig {
        api_base: sim.url.clone(),
        channel_token: LINE_TOKEN.into(),
        timeout: TIMEOUT,
    })
    .unwrap()
}

fn line_job() -> notify_worker::Job {
    let mut j = job("line", "line");
    j.address = Some(format!("U{}", "0123456789abcdef".repeat(2)));
    j
}

/// What one failed row must come out as.
struct Failed {
    class: ErrorClass,
    code: &'static str,
    reason: &'static str,
    ambiguous: bool,
    status: Option<i32>,
    retry_after: Option<Duration>,
}

#[tokio::test]
async fn every_answer_maps_to_its_typed_outcome() {
    let sim = Sim::start().await;
    let line = sender(&sim);
    let fault = |status: u16, extra: serde_json::Value| {
        let mut f = json!({"provider": "line", "status": status, "times": 1});
        f.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        f
    };
    let table: Vec<(&str, serde_json::Value, Failed)> = vec![
        (
            "429 with Retry-After",
            fault(
                429,
                json!({"retry_after": 7, "body": {"message": "Too many requests"}}),
            ),
            Failed {
                class: ErrorClass::RateLimited,
                code: "line_rate_limited",
                reason: "line_rate_limited",
                ambiguous: false,
                status: Some(429),
                retry_after: Some(Duration::from_secs(7)),
            },
        ),
        (
            "429 monthly quota",
            fault(
                429,
                json!({"body": {"message": "You have reached your monthly limit."}}),
            ),
            Failed {
                class: ErrorClass::QuotaExhausted,
                code: "line_monthly_quota",
                reason: "line_monthly_quota",
                ambiguous: false,
                status: Some(429),
                retry_after: None, // checked below: the wait to the next month
            },
        ),
        (
            "5xx",
            fault(503, json!({"body": {"message": "unavailable"}})),
            Failed {
                class: ErrorClass::Transient,
                code: "line_503",
                reason: "line_5xx",
                ambiguous: false,
                status: Some(503),
                retry_after: None,
            },
        ),
        (
            "4xx",
            fault(
                400,
                json!({"body": {"message": "The request body has 1 error(s)"}}),
            ),
            Failed {
                class: ErrorClass::Permanent,
                code: "line_400",
                reason: "line_4xx",
                ambiguous: false,
                status: Some(400),
                retry_after: None,
            },
        ),
        (
            "malformed body on an error status",
            fault(500, json!({"body": "<html>oops"})),
            Failed {
                class: ErrorClass::Transient,
                code: "line_500",
                reason: "line_5xx",
                ambiguous: false,
                status: Some(500),
                retry_after: None,
            },
        ),
        (
            "timeout (answer later than the call's timeout)",
            fault(200, json!({"delay_ms": 2 * TIMEOUT.as_millis() as u64})),
            Failed {
                class: ErrorClass::Transient,
                code: "line_timeout",
                reason: "line_timeout",
                ambiguous: true,
                status: None,
                retry_after: None,
            },
        ),
    ];
    for (row, f, want) in table {
        sim.fault(f).await;
        let out = line.send(&line_job(), &lease()).await;
        let got = failure(&out);
        assert_eq!(got.class, want.class, "{row}: {out:?}");
        assert_eq!(got.code, want.code, "{row}");
        assert_eq!(got.reason.as_str(), want.reason, "{row}");
        assert_eq!(got.ambiguous, want.ambiguous, "{row}");
        assert_eq!(out.provider_status, want.status, "{row}");
        if want.class == ErrorClass::QuotaExhausted {
            assert!(got.retry_after.is_some_and(|d| d > Duration::ZERO), "{row}");
        } else {
            assert_eq!(got.retry_after, want.retry_after, "{row}");
        }
        sim.clear_faults().await;
    }
}

#[tokio::test]
async fn a_success_and_a_resent_retry_key_are_both_sent() {
    let sim = Sim::start().await;
    let line = sender(&sim);
    let j = line_job();
    // 200: the id of the first message sent.
    let first = line.send(&j, &lease()).await;
    assert!(sent_id(&first).is_some_and(|id| id.is_some()), "{first:?}");
    assert_eq!(first.provider_status, Some(200));
    // 409, the same retry key again: LINE already accepted it, so it counts as sent.
    let again = line.send(&j, &lease()).await;
    assert!(sent_id(&again).is_some_and(|id| id.is_some()), "{again:?}");
    assert_eq!(again.provider_status, Some(409));
    // A 200 whose body is not LINE's shape is still a success, named by the request id.
    sim.fault(json!({"provider": "line", "status": 200, "body": "not json{", "times": 1}))
        .await;
    let odd = line.send(&line_job(), &lease()).await;
    assert!(sent_id(&odd).is_some(), "{odd:?}");
}
