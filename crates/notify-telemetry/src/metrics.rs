//! The platform's metric instruments (OpenTelemetry API; exported over OTLP and on the
//! Prometheus `/metrics` endpoint). Names below are the Prometheus names; base units
//! (seconds), `_total` on counters, labels limited to channel, provider, reason, outcome.
//! `deploy/monitoring/metrics.txt` lists the same names for the alert rules and the
//! dashboard, and a test keeps the two in step.
//!
//! Counters are per process (sum them across replicas); the gauges are sampled from the
//! database by every ingest replica (take the max across replicas).

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram};
use std::sync::OnceLock;

/// Bucket bounds (seconds) of the attempt duration histogram: 5 ms to 60 s.
const ATTEMPT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Bucket bounds (seconds) of the event-to-provider histogram: 10 ms to a day (deliveries
/// deferred by quiet hours or digests land in the top buckets).
const LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
    21600.0, 86400.0,
];

/// Every instrument. Get it with [`metrics`].
pub struct Metrics {
    /// `notify_deliveries_sent_total{channel,provider}`: deliveries the provider accepted.
    pub deliveries_sent: Counter<u64>,
    /// `notify_deliveries_failed_total{channel,provider,reason}`: deliveries failed for
    /// good; `reason` is the attempt error's `notify_core::outcome::Reason` (the error
    /// code with statuses folded to classes), or the runtime's own `attempts_spent` /
    /// `record_failed`.
    pub deliveries_failed: Counter<u64>,
    /// `notify_deliveries_failure_withdrawn_total{channel,provider}`: deliveries counted in
    /// `notify_deliveries_failed_total` (and alerted `delivery_failed`) that were then
    /// recorded sent: the provider accepted a call whose worker had frozen past its lease
    /// on the last attempt allowed. Subtract it from the failures to get what stayed failed.
    pub deliveries_failure_withdrawn: Counter<u64>,
    /// `notify_deliveries_retried_total{channel,provider}`: attempts that failed with a
    /// retry scheduled.
    pub deliveries_retried: Counter<u64>,
    /// `notify_deliveries_ambiguous_total{channel,provider}`: attempts whose outcome is
    /// unknown (the call timed out after the request was sent; the provider may have
    /// accepted it). Also counted as retried or failed.
    pub deliveries_ambiguous: Counter<u64>,
    /// `notify_deliveries_skipped_total{channel,reason}`: deliveries ended `skipped` when
    /// due, without a provider call; `reason` is the skip reason code (`opted_out`,
    /// `line_unfollowed`, `endpoint_revoked`, `email_undeliverable`, `no_push_endpoint`).
    pub deliveries_skipped: Counter<u64>,
    /// `notify_attempt_duration_seconds{channel,provider,outcome}`: provider call time,
    /// rate-limit wait included; outcome is `sent`, `retry` or `failed`.
    pub attempt_duration: Histogram<f64>,
    /// `notify_event_to_provider_seconds{channel,provider}`: from the delivery's creation
    /// (the event's acceptance) to the provider's acceptance.
    pub event_to_provider: Histogram<f64>,
    /// `notify_endpoints_deactivated_total{channel,provider}`: push tokens, subscriptions
    /// and addresses turned off because the provider said they are gone.
    pub endpoints_deactivated: Counter<u64>,
    /// `notify_lease_recoveries_total`: expired leases returned to pending by the sweeper.
    pub lease_recoveries: Counter<u64>,
    /// `notify_outbox_messages`: outbox rows waiting to be published.
    pub outbox_messages: Gauge<u64>,
    /// `notify_outbox_oldest_age_seconds`: age of the oldest due outbox row (0 if none).
    pub outbox_oldest_age: Gauge<f64>,
    /// `notify_deliveries_pending{channel}`: deliveries waiting to be sent (due or not).
    pub deliveries_pending: Gauge<u64>,
    /// `notify_oldest_pending_age_seconds{channel}`: how long the oldest due pending
    /// delivery has been due (0 if none).
    pub oldest_pending_age: Gauge<f64>,
    /// `notify_dead_letter_messages`: messages in the dead-letter queue.
    pub dead_letter_messages: Gauge<u64>,
    /// `notify_channel_paused{channel}`: 1 while the channel is paused, else 0.
    pub channel_paused: Gauge<u64>,
    /// `notify_fallbacks_total{from,to,cause}`: fallback deliveries created, from the
    /// channel that could not reach the user to the one tried instead; `cause` is
    /// `unreachable` (found at planning), `failed`, `worker_lost`, `attempts_spent` or the
    /// skip reason found at due time. Counted after the creating transaction commits.
    pub fallbacks: Counter<u64>,
    /// `notify_escalations_total{outcome}`: escalations `created` (at planning),
    /// `skipped_read` (the notification was read or clicked in time) and `sent`.
    pub escalations: Counter<u64>,
    /// `notify_deliveries_scheduled{channel}`: pending deliveries not due yet (scheduled
    /// sends, escalations, quiet-hours deferrals, retries waiting for their backoff). With
    /// `notify_oldest_pending_age_seconds` (how late the most overdue one is) this is the
    /// scheduled backlog.
    pub deliveries_scheduled: Gauge<u64>,
    /// `notify_cancellations_total{target}`: `CancelEvent` calls and console cancels that
    /// committed; `target` is `event_id`, `event_key`, `cancellation_key` or `console`.
    pub cancellations: Counter<u64>,
    /// `notify_deliveries_canceled_total{target}`: deliveries those cancels moved to
    /// `canceled` (a repeated cancel adds nothing).
    pub deliveries_canceled: Counter<u64>,
    /// `notify_webhook_attempts_total{outcome}`: status webhook POSTs by worker-webhook,
    /// by what follows: `sent` (2xx), `retry`, `failed` (attempts spent).
    pub webhook_attempts: Counter<u64>,
    /// `notify_webhook_attempt_duration_seconds{outcome}`: one webhook POST, from the
    /// start of the request to the answer's head (or the failure: a timeout lands at
    /// `NOTIFY_WEBHOOK_TIMEOUT`); outcome as [`Self::webhook_attempts`].
    pub webhook_attempt_duration: Histogram<f64>,
    /// `notify_webhook_endpoints_disabled_total`: endpoints worker-webhook disabled
    /// because every attempt failed for longer than `NOTIFY_WEBHOOK_DISABLE_AFTER`.
    pub webhook_endpoints_disabled: Counter<u64>,
    /// `notify_webhook_messages_pending`: webhook messages still `pending` more than a
    /// minute after they were written (sampled from Postgres by ingest, like the outbox).
    pub webhook_messages_pending: Gauge<u64>,
    /// `notify_email_breaker_state{provider}`: the email provider's circuit breaker in
    /// this worker-email process: 0 closed, 1 half-open, 2 open (take the max across
    /// replicas).
    pub email_breaker_state: Gauge<u64>,
    /// `notify_email_breaker_transitions_total{provider,to}`: breaker state changes, by
    /// the state entered (`closed`, `half_open`, `open`).
    pub email_breaker_transitions: Counter<u64>,
    /// `notify_email_provider_attempts_total{provider,outcome}`: calls to one email
    /// provider (an attempt that fails over calls several); outcome `answered` (accepted
    /// or refused for good), `failed_over` (transient, nothing accepted: the next provider
    /// is tried), `ambiguous` (transient, maybe accepted), `interrupted` (lease lost).
    pub email_provider_attempts: Counter<u64>,
    /// `notify_email_suppressions_added_total{reason}`: rows added to
    /// `email_suppressions`, by reason: `complaint` and `soft_bounces` (the provider's
    /// event feed), `console` (added by staff). Counted after the adding commit.
    pub email_suppressions_added: Counter<u64>,
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The instruments, created on first use from the global meter provider (so call
/// [`crate::init`] first; before it, or in tests without it, they record nothing).
pub fn metrics() -> &'static Metrics {
    METRICS.get_or_init(|| {
        let m = opentelemetry::global::meter("notify");
        Metrics {
            deliveries_sent: m
                .u64_counter("notify_deliveries_sent")
                .with_description("Deliveries the provider accepted.")
                .build(),
            deliveries_failed: m
                .u64_counter("notify_deliveries_failed")
                .with_description("Deliveries failed for good, by reason.")
                .build(),
            deliveries_failure_withdrawn: m
                .u64_counter("notify_deliveries_failure_withdrawn")
                .with_description(
                    "Deliveries counted failed that were then recorded sent (a late success).",
                )
                .build(),
            deliveries_retried: m
                .u64_counter("notify_deliveries_retried")
                .with_description("Attempts that failed with a retry scheduled.")
                .build(),
            deliveries_ambiguous: m
                .u64_counter("notify_deliveries_ambiguous")
                .with_description("Attempts whose outcome is unknown (timed out after sending).")
                .build(),
            deliveries_skipped: m
                .u64_counter("notify_deliveries_skipped")
                .with_description("Deliveries skipped when due, by reason; no provider call.")
                .build(),
            attempt_duration: m
                .f64_histogram("notify_attempt_duration")
                .with_description("Provider call time per attempt, rate-limit wait included.")
                .with_unit("s")
                .with_boundaries(ATTEMPT_BUCKETS.to_vec())
                .build(),
            event_to_provider: m
                .f64_histogram("notify_event_to_provider")
                .with_description("From the event's acceptance to the provider's acceptance.")
                .with_unit("s")
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build(),
            endpoints_deactivated: m
                .u64_counter("notify_endpoints_deactivated")
                .with_description("Push tokens, subscriptions and addresses turned off.")
                .build(),
            lease_recoveries: m
                .u64_counter("notify_lease_recoveries")
                .with_description("Expired leases returned to pending by the sweeper.")
                .build(),
            outbox_messages: m
                .u64_gauge("notify_outbox_messages")
                .with_description("Outbox rows waiting to be published.")
                .build(),
            outbox_oldest_age: m
                .f64_gauge("notify_outbox_oldest_age")
                .with_description("Age of the oldest due outbox row.")
                .with_unit("s")
                .build(),
            deliveries_pending: m
                .u64_gauge("notify_deliveries_pending")
                .with_description("Deliveries waiting to be sent, due or not.")
                .build(),
            oldest_pending_age: m
                .f64_gauge("notify_oldest_pending_age")
                .with_description("How long the oldest due pending delivery has waited.")
                .with_unit("s")
                .build(),
            dead_letter_messages: m
                .u64_gauge("notify_dead_letter_messages")
                .with_description("Messages in the dead-letter queue.")
                .build(),
            channel_paused: m
                .u64_gauge("notify_channel_paused")
                .with_description("1 while the channel is paused, else 0.")
                .build(),
            fallbacks: m
                .u64_counter("notify_fallbacks")
                .with_description("Fallback deliveries created, by channels and cause.")
                .build(),
            escalations: m
                .u64_counter("notify_escalations")
                .with_description("Escalations created, skipped as read, and sent.")
                .build(),
            deliveries_scheduled: m
                .u64_gauge("notify_deliveries_scheduled")
                .with_description(
                    "Pending deliveries not due yet (scheduled, deferred, backing off).",
                )
                .build(),
            cancellations: m
                .u64_counter("notify_cancellations")
                .with_description("Cancels that committed, by what they named.")
                .build(),
            deliveries_canceled: m
                .u64_counter("notify_deliveries_canceled")
                .with_description("Deliveries canceled before any provider call.")
                .build(),
            webhook_attempts: m
                .u64_counter("notify_webhook_attempts")
                .with_description("Webhook POSTs, by outcome.")
                .build(),
            webhook_attempt_duration: m
                .f64_histogram("notify_webhook_attempt_duration")
                .with_description("Webhook POST time, by outcome.")
                .with_unit("s")
                .with_boundaries(ATTEMPT_BUCKETS.to_vec())
                .build(),
            webhook_endpoints_disabled: m
                .u64_counter("notify_webhook_endpoints_disabled")
                .with_description("Webhook endpoints disabled after failing too long.")
                .build(),
            webhook_messages_pending: m
                .u64_gauge("notify_webhook_messages_pending")
                .with_description("Webhook messages pending for more than a minute.")
                .build(),
            email_breaker_state: m
                .u64_gauge("notify_email_breaker_state")
                .with_description("Email provider circuit breaker: 0 closed, 1 half-open, 2 open.")
                .build(),
            email_breaker_transitions: m
                .u64_counter("notify_email_breaker_transitions")
                .with_description(
                    "Email provider circuit breaker state changes, by the state entered.",
                )
                .build(),
            email_provider_attempts: m
                .u64_counter("notify_email_provider_attempts")
                .with_description("Calls to one email provider, by outcome.")
                .build(),
            email_suppressions_added: m
                .u64_counter("notify_email_suppressions_added")
                .with_description("Email suppressions added, by reason.")
                .build(),
        }
    })
}

/// Labels `channel` and `provider`.
pub fn channel_provider(channel: &str, provider: &str) -> [KeyValue; 2] {
    [
        KeyValue::new("channel", channel.to_string()),
        KeyValue::new("provider", provider.to_string()),
    ]
}

/// A delivery ended `failed` by the platform rather than by a provider's verdict (a worker
/// lost during the last attempt allowed, attempts spent at the claim, a record the
/// database refused, a channel not the queue's): counts it in
/// `notify_deliveries_failed_total{channel,provider,reason}` and writes its error line
/// with `alert = "delivery_failed"`, `reason` and `attempt` as fields and `why` in the
/// message (`delivery failed: <why>`). The delivery id comes from the enclosing span.
pub fn delivery_failed(
    channel: notify_core::Channel,
    provider: notify_core::Provider,
    attempt: i32,
    reason: notify_core::FailReason,
    why: &str,
) {
    let [c, p] = channel_provider(channel.as_str(), provider.as_str());
    metrics()
        .deliveries_failed
        .add(1, &[c, p, KeyValue::new("reason", reason.as_str())]);
    tracing::error!(
        attempt,
        reason = reason.as_str(),
        alert = "delivery_failed",
        "delivery failed: {why}"
    );
}

/// Labels `from`, `to` and `cause` of [`Metrics::fallbacks`].
pub fn fallback_labels(from: &str, to: &str, cause: &str) -> [KeyValue; 3] {
    [
        KeyValue::new("from", from.to_string()),
        KeyValue::new("to", to.to_string()),
        KeyValue::new("cause", cause.to_string()),
    ]
}

/// Counts one fallback delivery created (`notify_fallbacks_total{from,to,cause}`).
pub fn count_fallback(from: &str, to: &str, cause: &str) {
    metrics()
        .fallbacks
        .add(1, &fallback_labels(from, to, cause));
}

/// Counts one committed cancel (`notify_cancellations_total{target}`) and the deliveries
/// it canceled (`notify_deliveries_canceled_total{target}`).
pub fn count_cancel(target: &'static str, newly_canceled: u64) {
    let m = metrics();
    let label = [KeyValue::new("target", target)];
    m.cancellations.add(1, &label);
    m.deliveries_canceled.add(newly_canceled, &label);
}

/// Counts one committed email suppression
/// (`notify_email_suppressions_added_total{reason}`).
pub fn count_suppression_added(reason: &'static str) {
    metrics()
        .email_suppressions_added
        .add(1, &[KeyValue::new("reason", reason)]);
}

/// The text exposition of every metric, for `/metrics` (Prometheus text format 0.0.4).
pub fn render_prometheus() -> String {
    use prometheus::Encoder;
    let Some(i) = crate::otel::INSTALLED.get() else {
        return String::new();
    };
    let mut buf = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(&i.registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `deploy/monitoring/metrics.txt` (what alerts and dashboards use) lists exactly the
    /// series `/metrics` exposes, with their types and label names.
    #[test]
    fn the_exposition_matches_the_metric_contract() {
        use std::collections::BTreeMap;
        crate::otel::install(
            "contract-test",
            &crate::otel::OtelSettings {
                export_traces: false,
                export_metrics: false,
            },
        )
        .unwrap();
        let m = metrics();
        let cp = channel_provider("line", "line");
        let with = |extra: KeyValue| {
            let mut v = cp.to_vec();
            v.push(extra);
            v
        };
        let ch = [KeyValue::new("channel", "line")];
        m.deliveries_sent.add(1, &cp);
        m.deliveries_failed
            .add(1, &with(KeyValue::new("reason", "line_4xx")));
        m.deliveries_failure_withdrawn.add(1, &cp);
        m.deliveries_retried.add(1, &cp);
        m.deliveries_ambiguous.add(1, &cp);
        m.deliveries_skipped.add(
            1,
            &[
                KeyValue::new("channel", "line"),
                KeyValue::new("reason", "line_unfollowed"),
            ],
        );
        m.attempt_duration
            .record(0.2, &with(KeyValue::new("outcome", "sent")));
        m.event_to_provider.record(1.5, &cp);
        m.endpoints_deactivated.add(1, &cp);
        m.lease_recoveries.add(1, &[]);
        m.outbox_messages.record(3, &[]);
        m.outbox_oldest_age.record(2.0, &[]);
        m.deliveries_pending.record(4, &ch);
        m.oldest_pending_age.record(5.0, &ch);
        m.dead_letter_messages.record(0, &[]);
        m.channel_paused.record(0, &ch);
        m.deliveries_scheduled.record(6, &ch);
        count_cancel("cancellation_key", 3);
        m.fallbacks
            .add(1, &fallback_labels("line", "email", "unreachable"));
        m.escalations.add(1, &[KeyValue::new("outcome", "created")]);
        let outcome = [KeyValue::new("outcome", "sent")];
        m.webhook_attempts.add(1, &outcome);
        m.webhook_attempt_duration.record(0.1, &outcome);
        m.webhook_endpoints_disabled.add(1, &[]);
        m.webhook_messages_pending.record(2, &[]);
        let provider = KeyValue::new("provider", "primary");
        m.email_breaker_state
            .record(2, std::slice::from_ref(&provider));
        m.email_breaker_transitions
            .add(1, &[provider.clone(), KeyValue::new("to", "open")]);
        m.email_provider_attempts
            .add(1, &[provider, KeyValue::new("outcome", "failed_over")]);
        m.email_suppressions_added
            .add(1, &[KeyValue::new("reason", "complaint")]);

        let text = render_prometheus();
        let mut exposed: BTreeMap<String, (String, String)> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                exposed.insert(name.to_string(), (kind.to_string(), String::new()));
            } else if !line.starts_with('#') && line.starts_with("notify_") {
                let (series, _) = line.rsplit_once(' ').unwrap();
                let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| exposed.contains_key(*b)))
                    .unwrap_or(name);
                let mut names: Vec<&str> = labels
                    .trim_end_matches('}')
                    .split(',')
                    .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
                    .filter(|k| *k != "le")
                    .collect();
                names.sort();
                let joined = if names.is_empty() {
                    "-".to_string()
                } else {
                    names.join(",")
                };
                exposed.get_mut(base).unwrap().1 = joined;
            }
        }
        let contract = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/monitoring/metrics.txt"
        ))
        .unwrap();
        let mut listed: BTreeMap<String, (String, String)> = BTreeMap::new();
        for line in contract
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let mut labels: Vec<&str> = parts[2].split(',').collect();
            labels.sort();
            listed.insert(parts[0].into(), (parts[1].into(), labels.join(",")));
        }
        assert_eq!(exposed, listed, "exposition:\n{text}");
    }
}
