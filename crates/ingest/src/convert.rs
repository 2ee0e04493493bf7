//! Conversions between proto messages and the domain and store types, for the replies of
//! the gRPC services.

use chrono::{DateTime, Utc};
use notify_core::{Channel, Content, DeliveryStatus, SkippedDelivery};
use notify_proto::v1 as pb;
use notify_store::events::{self, DeliveryRecord, NewDelivery};

/// A protobuf timestamp of `t`.
pub(crate) fn ts(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// The domain content of a request (all fields empty when absent).
pub(crate) fn content_from_pb(c: Option<pb::Content>) -> Content {
    let c = c.unwrap_or_default();
    Content {
        title: c.title,
        body: c.body,
        url: c.url,
        email_subject: c.email_subject,
        email_html: c.email_html,
        email_text: c.email_text,
    }
}

/// The proto content of a stored event.
pub(crate) fn content_to_pb(c: Content) -> pb::Content {
    pb::Content {
        title: c.title,
        body: c.body,
        url: c.url,
        email_subject: c.email_subject,
        email_html: c.email_html,
        email_text: c.email_text,
    }
}

/// A stored delivery as the API shows it (`next_attempt_at` only while pending).
pub(crate) fn delivery_to_pb(d: DeliveryRecord) -> pb::Delivery {
    pb::Delivery {
        delivery_id: d.id.to_string(),
        user_id: d.user_id,
        channel: d.channel.as_str().into(),
        provider: d.provider.as_str().into(),
        endpoint_id: d.endpoint_id.map(|e| e.to_string()).unwrap_or_default(),
        next_attempt_at: (d.status == DeliveryStatus::Pending).then(|| ts(d.next_attempt_at)),
        status: d.status.as_str().into(),
        attempts: d.attempts.max(0) as u32,
        last_error: d.last_error.unwrap_or_default(),
        provider_message_id: d.provider_message_id.unwrap_or_default(),
        sent_at: d.sent_at.map(ts),
        deferred_until: d.deferred_until.map(ts),
        decision: d.decision,
    }
}

/// A stored skipped pair as the API shows it.
pub(crate) fn skip_to_pb(s: events::SkipRecord) -> pb::SkippedDelivery {
    pb::SkippedDelivery {
        user_id: s.user_id,
        channel: s.channel.as_str().into(),
        reason: s.reason,
        decision: s.decision,
    }
}

/// Stored skipped pairs as the API shows them.
pub(crate) fn skipped_to_pb(rows: Vec<events::SkipRecord>) -> Vec<pb::SkippedDelivery> {
    rows.into_iter().map(skip_to_pb).collect()
}

/// Deliveries per channel (any status), in channel order, from `(channel, status, count)`
/// rows; channels with none are left out.
pub(crate) fn channel_counts(counts: &[(Channel, DeliveryStatus, i64)]) -> Vec<pb::ChannelCount> {
    Channel::ALL
        .iter()
        .filter_map(|c| {
            let n: i64 = counts
                .iter()
                .filter(|(ch, _, _)| ch == c)
                .map(|(_, _, n)| n)
                .sum();
            (n > 0).then(|| pb::ChannelCount {
                channel: c.as_str().into(),
                count: n as u32,
            })
        })
        .collect()
}

/// A delivery just planned and committed, as the `CreateEvent` reply shows it (pending,
/// due at once or at its deferral).
pub(crate) fn new_delivery_to_pb(d: NewDelivery) -> pb::Delivery {
    pb::Delivery {
        delivery_id: d.id.to_string(),
        user_id: d.plan.user_id,
        channel: d.plan.channel.as_str().into(),
        provider: d.plan.provider.as_str().into(),
        endpoint_id: d
            .plan
            .endpoint_id
            .map(|e| e.to_string())
            .unwrap_or_default(),
        status: "pending".into(),
        next_attempt_at: d.plan.deferred_until.map(ts),
        deferred_until: d.plan.deferred_until.map(ts),
        decision: d.plan.decision,
        ..Default::default()
    }
}

/// A pair just skipped by planning, as the `CreateEvent` reply shows it.
pub(crate) fn planned_skip_to_pb(s: &SkippedDelivery) -> pb::SkippedDelivery {
    pb::SkippedDelivery {
        user_id: s.user_id.clone(),
        channel: s.channel.as_str().into(),
        reason: s.reason.as_str().into(),
        decision: s.decision.clone(),
    }
}

/// A stored attempt as `ExplainDelivery` shows it.
pub(crate) fn attempt_to_pb(a: events::AttemptRow) -> pb::Attempt {
    pb::Attempt {
        attempt: a.attempt.max(0) as u32,
        outcome: a.outcome,
        provider_status: a.provider_status.unwrap_or(0),
        error_code: a.error_code.unwrap_or_default(),
        provider_response: a.provider_response.unwrap_or_default(),
        content: a.content_json.map(|c| c.to_string()).unwrap_or_default(),
        started_at: Some(ts(a.started_at)),
        finished_at: Some(ts(a.finished_at)),
        worker_id: a.worker_id,
    }
}
