//! Conversions between proto messages and the domain and store types, for the replies of
//! the gRPC services.

use chrono::{DateTime, Utc};
use notify_core::template::Template;
use notify_core::{
    Action, Badge, Channel, Content, DeliveryStatus, FieldViolation, Overrides, SkippedDelivery,
};
use notify_proto::v1 as pb;
use notify_store::events::{self, DeliveryRecord, NewDelivery};

/// A count as a proto `uint32`, saturating at `u32::MAX` (the API's counts fit; a count
/// beyond that is shown as the most it can say, never wrapped).
pub(crate) fn count32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// A protobuf timestamp of `t`.
pub(crate) fn ts(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// Most bytes of `content.overrides.line_messages_json` (LINE allows 2 MB per request; a
/// Flex bubble is at most 30 KB, so five messages fit well within this).
pub(crate) const MAX_LINE_MESSAGES_JSON_BYTES: usize = 256 * 1024;

/// The domain actions of proto actions.
fn actions_from_pb(actions: Vec<pb::Action>) -> Vec<Action> {
    actions
        .into_iter()
        .map(|a| Action {
            id: a.id,
            label: a.label,
            url: a.url,
        })
        .collect()
}

fn actions_to_pb(actions: Vec<Action>) -> Vec<pb::Action> {
    actions
        .into_iter()
        .map(|a| pb::Action {
            id: a.id,
            label: a.label,
            url: a.url,
        })
        .collect()
}

/// The badge policy, with a violation at `field` for a value the enum does not have.
fn badge_from_pb(policy: i32, count: u32, field: &str, bad: &mut Vec<FieldViolation>) -> Badge {
    match pb::BadgePolicy::try_from(policy) {
        Ok(pb::BadgePolicy::UnreadCount) => Badge::UnreadCount,
        Ok(pb::BadgePolicy::Count) => Badge::Count(count),
        Ok(pb::BadgePolicy::Unspecified) => Badge::Unchanged,
        Err(_) => {
            bad.push(FieldViolation::new(
                field,
                "must be BADGE_POLICY_UNSPECIFIED, BADGE_POLICY_UNREAD_COUNT or BADGE_POLICY_COUNT",
            ));
            Badge::Unchanged
        }
    }
}

fn badge_to_pb(badge: Badge) -> (i32, u32) {
    match badge {
        Badge::Unchanged => (pb::BadgePolicy::Unspecified as i32, 0),
        Badge::UnreadCount => (pb::BadgePolicy::UnreadCount as i32, 0),
        Badge::Count(n) => (pb::BadgePolicy::Count as i32, n),
    }
}

/// The domain overrides of proto overrides, with a violation at `field` when the LINE
/// messages are not a JSON array of objects (or too large).
fn overrides_from_pb(
    o: Option<pb::ChannelOverrides>,
    field: &str,
    bad: &mut Vec<FieldViolation>,
) -> Overrides {
    let o = o.unwrap_or_default();
    let line_messages = if o.line_messages_json.trim().is_empty() {
        Vec::new()
    } else if o.line_messages_json.len() > MAX_LINE_MESSAGES_JSON_BYTES {
        bad.push(FieldViolation::new(
            field,
            format!("must be at most {MAX_LINE_MESSAGES_JSON_BYTES} bytes of JSON"),
        ));
        Vec::new()
    } else {
        match serde_json::from_str::<Vec<serde_json::Map<String, serde_json::Value>>>(
            &o.line_messages_json,
        ) {
            Ok(list) if list.is_empty() => {
                bad.push(FieldViolation::new(
                    field,
                    "must hold 1 to 5 LINE message objects (or be empty)",
                ));
                Vec::new()
            }
            Ok(list) => list.into_iter().map(serde_json::Value::Object).collect(),
            Err(e) => {
                bad.push(FieldViolation::new(
                    field,
                    format!("must be a JSON array of LINE message objects: {e}"),
                ));
                Vec::new()
            }
        }
    };
    Overrides {
        line_messages,
        fcm_data: o.fcm_data.into_iter().collect(),
        android_channel_id: o.android_channel_id,
        apns_category: o.apns_category,
        apns_thread_id: o.apns_thread_id,
        apns_sound: o.apns_sound,
        apns_interruption_level: o.apns_interruption_level,
        webpush_icon: o.webpush_icon,
        webpush_image: o.webpush_image,
        webpush_actions: actions_from_pb(o.webpush_actions),
    }
}

fn overrides_to_pb(o: Overrides) -> Option<pb::ChannelOverrides> {
    if o.is_empty() {
        return None;
    }
    Some(pb::ChannelOverrides {
        line_messages_json: if o.line_messages.is_empty() {
            String::new()
        } else {
            serde_json::Value::Array(o.line_messages).to_string()
        },
        fcm_data: o.fcm_data.into_iter().collect(),
        android_channel_id: o.android_channel_id,
        apns_category: o.apns_category,
        apns_thread_id: o.apns_thread_id,
        apns_sound: o.apns_sound,
        apns_interruption_level: o.apns_interruption_level,
        webpush_icon: o.webpush_icon,
        webpush_image: o.webpush_image,
        webpush_actions: actions_to_pb(o.webpush_actions),
    })
}

/// The domain content of a request (all fields empty when absent), and the violations
/// found while converting (LINE messages that are not a JSON array of objects), to be
/// reported with those of [`notify_core::NewEvent::parse`].
pub(crate) fn content_from_pb(c: Option<pb::Content>) -> (Content, Vec<FieldViolation>) {
    let c = c.unwrap_or_default();
    let mut bad = Vec::new();
    let overrides = overrides_from_pb(
        c.overrides,
        "content.overrides.line_messages_json",
        &mut bad,
    );
    let content = Content {
        title: c.title,
        body: c.body,
        url: c.url,
        email_subject: c.email_subject,
        email_html: c.email_html,
        email_text: c.email_text,
        image_url: c.image_url,
        actions: actions_from_pb(c.actions),
        badge: badge_from_pb(c.badge, c.badge_count, "content.badge", &mut bad),
        thread: c.thread,
        overrides,
    };
    (content, bad)
}

/// The proto content of a stored event.
pub(crate) fn content_to_pb(c: Content) -> pb::Content {
    let (badge, badge_count) = badge_to_pb(c.badge);
    pb::Content {
        title: c.title,
        body: c.body,
        url: c.url,
        email_subject: c.email_subject,
        email_html: c.email_html,
        email_text: c.email_text,
        image_url: c.image_url,
        actions: actions_to_pb(c.actions),
        badge,
        badge_count,
        thread: c.thread,
        overrides: overrides_to_pb(c.overrides),
    }
}

/// The domain template of the `i`-th proto template, with a violation when its LINE
/// messages are not a JSON array of objects.
pub(crate) fn template_from_pb(
    i: usize,
    t: pb::Template,
    bad: &mut Vec<FieldViolation>,
) -> Template {
    Template {
        channel: t.channel,
        locale: t.locale,
        title: t.title,
        body: t.body,
        email_subject: t.email_subject,
        email_html: t.email_html,
        url: t.url,
        image_url: t.image_url,
        thread: t.thread,
        actions: actions_from_pb(t.actions),
        badge: badge_from_pb(
            t.badge,
            t.badge_count,
            &format!("templates[{i}].badge"),
            bad,
        ),
        overrides: overrides_from_pb(
            t.overrides,
            &format!("templates[{i}].overrides.line_messages_json"),
            bad,
        ),
    }
}

/// The proto form of a domain template (the type file's templates are sent this way).
pub(crate) fn template_to_pb(t: Template) -> pb::Template {
    let (badge, badge_count) = badge_to_pb(t.badge);
    pb::Template {
        channel: t.channel,
        locale: t.locale,
        title: t.title,
        body: t.body,
        email_subject: t.email_subject,
        email_html: t.email_html,
        url: t.url,
        image_url: t.image_url,
        thread: t.thread,
        actions: actions_to_pb(t.actions),
        badge,
        badge_count,
        overrides: overrides_to_pb(t.overrides),
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
        cause: d.cause.as_str().into(),
        caused_by: d.caused_by.map(|c| c.to_string()).unwrap_or_default(),
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
    let first_attempt_at = d.plan.first_attempt_at();
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
        next_attempt_at: first_attempt_at.map(ts),
        deferred_until: d.plan.deferred_until.map(ts),
        decision: d.plan.decision,
        cause: d.plan.cause.as_str().into(),
        caused_by: d.caused_by.map(|c| c.to_string()).unwrap_or_default(),
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
