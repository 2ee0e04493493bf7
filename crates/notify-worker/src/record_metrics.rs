//! The metrics of recorded attempts.

use notify_core::AttemptLabel;
use notify_core::outcome::AttemptError;
use notify_store::deliveries::{AttemptRecord, DeliveryJob, NextState};
use std::time::Duration;

/// Counts one recorded attempt in the metrics (after its commit, so a lost lease or a
/// failed record counts nothing), on every path that records one (the record, a late
/// success, an in-app write without a claim): a sent escalation counts as one too.
pub(crate) fn count_recorded(
    job: &DeliveryJob,
    next: &NextState,
    record: &AttemptRecord,
    error: Option<&AttemptError>,
    took: Duration,
) {
    use opentelemetry::KeyValue;
    let m = notify_telemetry::metrics();
    let labels =
        notify_telemetry::metrics::channel_provider(job.channel.as_str(), job.provider.as_str());
    match next {
        NextState::Sent { .. } => {
            m.deliveries_sent.add(1, &labels);
            if job.cause == notify_core::plan::Cause::Escalation {
                m.escalations
                    .add(1, &[KeyValue::new("outcome", AttemptLabel::Sent.as_str())]);
            }
            let since = (chrono::Utc::now() - job.created_at)
                .to_std()
                .unwrap_or_default();
            m.event_to_provider.record(since.as_secs_f64(), &labels);
        }
        NextState::Retry { .. } | NextState::Paused { .. } => {
            m.deliveries_retried.add(1, &labels);
        }
        // No provider was called: not an attempt, nothing to count.
        NextState::Unavailable { .. } => return,
        NextState::Failed { .. } => {
            let reason = error.map_or("unknown", |e| e.reason.as_str());
            let mut with_reason = labels.to_vec();
            with_reason.push(KeyValue::new("reason", reason.to_string()));
            m.deliveries_failed.add(1, &with_reason);
        }
    }
    if error.is_some_and(|e| e.ambiguous) {
        m.deliveries_ambiguous.add(1, &labels);
    }
    if record.deactivate_endpoint.is_some() || record.address_undeliverable.is_some() {
        m.endpoints_deactivated.add(1, &labels);
    }
    let mut with_outcome = labels.to_vec();
    with_outcome.push(KeyValue::new("outcome", record.outcome.as_str()));
    m.attempt_duration.record(took.as_secs_f64(), &with_outcome);
}
