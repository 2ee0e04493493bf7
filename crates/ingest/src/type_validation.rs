//! Validation of a notification type (`UpsertNotificationType` and `ingest load-types`):
//! the request's fields, its templates rendered against the sample payload, and no
//! sensitive data in either.

use notify_core::fatigue::OverCap;
use notify_core::validate::{self, FieldViolation, Violations};
use notify_core::{Category, Channel, Priority, SensitiveData};
use notify_proto::v1 as pb;
use notify_store::catalog::NotificationType;

/// A type ready to store, with its templates.
pub type ValidType = (NotificationType, Vec<notify_core::template::Template>);

/// Validates an `UpsertNotificationType` request (also used by `ingest load-types`): the
/// type to store and its templates, or every violation at once (templates are rendered
/// against the sample payload).
pub fn validate_type(
    r: pb::UpsertNotificationTypeRequest,
) -> Result<ValidType, Vec<FieldViolation>> {
    let mut v = Violations::default();
    if !validate::is_type_key(&r.key) {
        v.add(
            "key",
            "must be 1 to 64 characters of [a-z0-9_.-] starting with a letter",
        );
    }
    let priority: Priority = named_or_default(
        &mut v,
        "priority",
        &r.priority,
        "must be low, normal or high",
    );
    let category: Category = named_or_default(
        &mut v,
        "category",
        &r.category,
        "must be transactional or marketing",
    );
    if r.default_channels.is_empty() {
        v.add("default_channels", "must name at least one channel");
    }
    let mut channels = Vec::new();
    for (i, c) in r.default_channels.iter().enumerate() {
        match c.parse::<Channel>() {
            Ok(ch) if !channels.contains(&ch) => channels.push(ch),
            Ok(_) => {}
            Err(e) => v.add(format!("default_channels[{i}]"), e.to_string()),
        }
    }
    let default_locale = if r.default_locale.trim().is_empty() {
        "th".to_string()
    } else {
        r.default_locale.trim().to_string()
    };
    if default_locale.len() > 35
        || !default_locale
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        v.add("default_locale", "must be a BCP 47 tag such as th or en-US");
    }
    let sample_payload = if r.sample_payload.trim().is_empty() {
        serde_json::json!({})
    } else {
        match serde_json::from_str::<serde_json::Value>(&r.sample_payload) {
            Ok(p) if p.is_object() => p,
            _ => {
                v.add("sample_payload", "must be a JSON object");
                serde_json::json!({})
            }
        }
    };
    let over_cap: OverCap =
        named_or_default(&mut v, "over_cap", &r.over_cap, "must be defer or drop");
    if r.digest_window_seconds > 86_400 {
        v.add("digest_window_seconds", "must be at most 1 day (86400)");
    }
    let sensitive_data: SensitiveData = named_or_default(
        &mut v,
        "sensitive_data",
        &r.sensitive_data,
        "must be reject or mask",
    );
    let dedup_window_s = r.dedup_window_seconds;
    if dedup_window_s > 31 * 86_400 {
        v.add("dedup_window_seconds", "must be at most 31 days (2678400)");
    }
    let derivation = derivation(&mut v, &r.fallback_channels, &r.escalations);
    let mut retention_s = |field: &str, s: u32| -> Option<i32> {
        match s {
            0 => None,
            s if u64::from(s) > notify_core::retry::MAX_DURATION.as_secs() => {
                v.add(
                    field,
                    format!(
                        "must be 0 (the global setting) or 1 to {} seconds (366 days)",
                        notify_core::retry::MAX_DURATION.as_secs()
                    ),
                );
                None
            }
            s => i32::try_from(s).ok(),
        }
    };
    let retention = notify_store::retention::TypeRetention {
        content_s: retention_s("content_retention_seconds", r.content_retention_seconds),
        deliveries_s: retention_s("delivery_retention_seconds", r.delivery_retention_seconds),
        archived_inbox_s: retention_s(
            "archived_inbox_retention_seconds",
            r.archived_inbox_retention_seconds,
        ),
    };
    if r.templates.len() > 100 {
        v.add("templates", "at most 100 templates per type");
    }
    let mut bad_json = Vec::new();
    let templates: Vec<notify_core::template::Template> = r
        .templates
        .into_iter()
        .enumerate()
        .map(|(i, t)| crate::convert::template_from_pb(i, t, &mut bad_json))
        .collect();
    v.0.append(&mut bad_json);
    let mut seen = std::collections::HashSet::new();
    for (i, t) in templates.iter().enumerate() {
        if !seen.insert((t.channel.clone(), t.locale.to_ascii_lowercase())) {
            v.add(
                format!("templates[{i}]"),
                format!(
                    "a template for channel {:?} and locale {:?} is already given",
                    t.channel, t.locale
                ),
            );
        }
        for (field, text) in template_texts(t) {
            if text.len() > notify_core::template::MAX_TEMPLATE_BYTES {
                v.add(
                    format!("templates[{i}].{field}"),
                    format!(
                        "must be at most {} bytes",
                        notify_core::template::MAX_TEMPLATE_BYTES
                    ),
                );
            }
        }
    }
    // A type's sample payload and templates are stored and shown: no sensitive data.
    for f in notify_core::guard::scan_json("sample_payload", &sample_payload) {
        v.add(
            f.path,
            format!("{}; types may not carry it", f.kind.describe()),
        );
    }
    for (i, t) in templates.iter().enumerate() {
        for (field, text) in template_texts(t) {
            for kind in notify_core::guard::scan_text(&text) {
                v.add(
                    format!("templates[{i}].{field}"),
                    format!("{}; types may not carry it", kind.describe()),
                );
            }
        }
    }
    if !v.0.is_empty() {
        return Err(v.0);
    }
    for f in notify_core::template::validate(&r.key, &templates, &sample_payload) {
        v.add(f.field, f.description);
    }
    let t = v.into_result(NotificationType {
        key: r.key,
        priority,
        default_channels: channels,
        critical: r.critical,
        category,
        default_locale,
        sample_payload,
        dedup_window_s: dedup_window_s as i32,
        over_cap,
        digest_window_s: r.digest_window_seconds as i32,
        sensitive_data,
        derivation,
        retention,
    })?;
    Ok((t, templates))
}

/// The type's `fallback_channels` and `escalations`. A fallback list names known channels
/// (not only the type's defaults: the fallback is often a channel the type does not use
/// otherwise, such as email after LINE), each at most once, and at least two (a list of
/// one has nothing to fall back to). An escalation goes from `inapp`, `line` or `push`
/// (the channels that report a read or a click) to another channel, after 1 s to 7 days;
/// one per (from, to) pair. Violations name the field: `fallback_channels[1]`,
/// `escalations[0].after_seconds`.
fn derivation(
    v: &mut Violations,
    fallback: &[String],
    escalations: &[pb::Escalation],
) -> notify_core::plan::Derivation {
    use notify_core::plan::{Escalation, MAX_ESCALATION_SECONDS};
    let mut d = notify_core::plan::Derivation::default();
    for (i, c) in fallback.iter().enumerate() {
        match c.parse::<Channel>() {
            Ok(ch) if d.fallback_channels.contains(&ch) => v.add(
                format!("fallback_channels[{i}]"),
                format!("channel {ch} is already in the list: each channel at most once"),
            ),
            Ok(ch) => d.fallback_channels.push(ch),
            Err(e) => v.add(format!("fallback_channels[{i}]"), e.to_string()),
        }
    }
    if fallback.len() == 1 {
        v.add(
            "fallback_channels",
            "must name at least two channels (a channel and its fallback), or none",
        );
    }
    for (i, e) in escalations.iter().enumerate() {
        let from = match e.from_channel.parse::<Channel>() {
            Ok(c @ (Channel::InApp | Channel::Line | Channel::Push)) => Some(c),
            Ok(c) => {
                v.add(
                    format!("escalations[{i}].from_channel"),
                    format!("must be inapp, line or push (channels that report a read or click), not {c}"),
                );
                None
            }
            Err(err) => {
                v.add(format!("escalations[{i}].from_channel"), err.to_string());
                None
            }
        };
        let to = match e.to_channel.parse::<Channel>() {
            Ok(c) if Some(c) == from => {
                v.add(
                    format!("escalations[{i}].to_channel"),
                    "must differ from from_channel",
                );
                None
            }
            Ok(c) => Some(c),
            Err(err) => {
                v.add(format!("escalations[{i}].to_channel"), err.to_string());
                None
            }
        };
        if !(1..=MAX_ESCALATION_SECONDS).contains(&e.after_seconds) {
            v.add(
                format!("escalations[{i}].after_seconds"),
                format!("must be 1 to {MAX_ESCALATION_SECONDS} seconds (7 days)"),
            );
        }
        if let (Some(from), Some(to)) = (from, to) {
            if d.escalations.iter().any(|x| x.from == from && x.to == to) {
                v.add(
                    format!("escalations[{i}]"),
                    format!("an escalation from {from} to {to} is already given"),
                );
            } else {
                d.escalations.push(Escalation {
                    from,
                    to,
                    after_seconds: e.after_seconds,
                });
            }
        }
    }
    d
}

/// A stored name of a type setting (`priority`, `category`, …), case-insensitive; the
/// setting's default when `value` is empty; a violation of `rule` on `field` (and the
/// default) when it names nothing.
fn named_or_default<T: std::str::FromStr + Default>(
    v: &mut Violations,
    field: &str,
    value: &str,
    rule: &str,
) -> T {
    if value.is_empty() {
        return T::default();
    }
    value.to_ascii_lowercase().parse().unwrap_or_else(|_| {
        v.add(field, rule);
        T::default()
    })
}

/// A template's texts by field name (its rich content as JSON under `overrides`), as the
/// size rule and the sensitive-data scan read them.
fn template_texts(
    t: &notify_core::template::Template,
) -> [(&'static str, std::borrow::Cow<'_, str>); 5] {
    [
        ("title", t.title.as_str().into()),
        ("body", t.body.as_str().into()),
        ("email_subject", t.email_subject.as_str().into()),
        ("email_html", t.email_html.as_str().into()),
        ("overrides", t.rich_json().to_string().into()),
    ]
}
