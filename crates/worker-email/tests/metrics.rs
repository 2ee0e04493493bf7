//! The email provider metrics as Prometheus scrapes them (`/metrics`), after a failover:
//! each provider call by outcome, the breaker's transition and its state. Its own test
//! binary, so that the process-wide meter provider holds only these counts.

mod common;
use notify_worker::testing::{Sim, lease, sent_id};
use std::time::Duration;
use worker_email::breaker::BreakerConfig;
use worker_email::{EmailConfig, EmailSender};

/// The value of the sample of `name` whose labels include every pair of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (metric, have) = series.split_once('{').unwrap_or((series, ""));
        (metric == name
            && labels
                .iter()
                .all(|(k, v)| have.contains(&format!("{k}=\"{v}\""))))
        .then(|| value.parse().unwrap())
    })
}

#[tokio::test]
async fn a_failover_is_counted_per_provider_and_the_open_breaker_is_exported() {
    notify_telemetry::init("worker-email-metrics-test");
    let (primary, secondary) = (Sim::start().await, Sim::start().await);
    let email = EmailSender::new(EmailConfig {
        breaker: BreakerConfig {
            failures: 1,
            cooldown: Duration::from_secs(600),
            ..Default::default()
        },
        unsubscribe_secret: "metrics-test-unsubscribe-secret".into(),
        ..common::config(format!("{},{}", primary.smtp_url, secondary.smtp_url))
    })
    .unwrap();
    let p = primary.smtp_url.trim_start_matches("smtp://").to_string();
    let s = secondary.smtp_url.trim_start_matches("smtp://").to_string();
    primary
        .smtp
        .set_fault(Some("421 4.3.2 service not available"));
    let mail = common::mail_to("somchai@example.test");
    use notify_worker::ChannelSender;
    for _ in 0..2 {
        let out = email.send(&mail, &lease()).await;
        assert!(sent_id(&out).is_some(), "{out:?}");
    }

    let text = notify_telemetry::metrics::render_prometheus();
    let calls = "notify_email_provider_attempts_total";
    // The first attempt: the primary failed over, the secondary answered. The second:
    // the primary's breaker is open, so only the secondary is called.
    assert_eq!(
        sample(
            &text,
            calls,
            &[("provider", &p), ("outcome", "failed_over")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, calls, &[("provider", &s), ("outcome", "answered")]),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, calls, &[("provider", &p), ("outcome", "answered")]),
        None,
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            "notify_email_breaker_transitions_total",
            &[("provider", &p), ("to", "open")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "notify_email_breaker_state", &[("provider", &p)]),
        Some(2.0),
        "{text}"
    );
}
