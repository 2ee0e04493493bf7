//! The decision trail of `ExplainDelivery`: one line per step, from the type's defaults
//! through planning (the decision text stored with each delivery or skip) to the
//! endpoint's state now, each attempt and the status. Pure: the caller reads the facts.

use crate::{Category, Channel, DeliveryStatus, Priority};

/// The type's settings that shaped planning.
#[derive(Debug, Clone, Copy)]
pub struct TypeFacts<'a> {
    /// Type key.
    pub key: &'a str,
    /// `low`, `normal` or `high`.
    pub priority: Priority,
    /// Critical types ignore opt-outs and quiet hours.
    pub critical: bool,
    /// `transactional` or `marketing`.
    pub category: Category,
    /// Channels used when the event names none.
    pub default_channels: &'a [Channel],
}

/// One attempt of a delivery.
#[derive(Debug, Clone, Copy)]
pub struct AttemptFacts<'a> {
    /// Attempt number, from 1.
    pub attempt: i32,
    /// Outcome (`sent`, `failed`, `retry`, …).
    pub outcome: &'a str,
    /// The provider's status code, if it answered.
    pub provider_status: Option<i32>,
    /// The error code, if any.
    pub error_code: Option<&'a str>,
}

/// One delivery of the (event, user, channel).
#[derive(Debug, Clone)]
pub struct DeliveryFacts<'a> {
    /// Planning's decision text (one step per line).
    pub decision: &'a str,
    /// The endpoint's state now (empty: no endpoint, or none to tell).
    pub endpoint: &'a str,
    /// Its attempts, in order.
    pub attempts: Vec<AttemptFacts<'a>>,
    /// Its status now.
    pub status: DeliveryStatus,
}

/// The pair's skip, if planning skipped it.
#[derive(Debug, Clone, Copy)]
pub struct SkipFacts<'a> {
    /// Skip reason (`opted_out`, `throttled`, …).
    pub reason: &'a str,
    /// Planning's decision text (one step per line).
    pub decision: &'a str,
}

/// The first line of the trail: the type's defaults, or that `type_key` is no longer
/// defined.
pub fn type_defaults(type_key: &str, t: Option<TypeFacts<'_>>) -> String {
    match t {
        Some(t) => format!(
            "type {}: priority {}, {}, {}, default channels {}",
            t.key,
            t.priority,
            if t.critical {
                "critical (ignores opt-outs and quiet hours)"
            } else {
                "not critical"
            },
            t.category,
            t.default_channels
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => format!("type {type_key}: no longer defined"),
    }
}

/// The whole trail: `type_defaults`, then the skip's decision and reason, then per
/// delivery its decision, endpoint, attempts and status. With neither a skip nor a
/// delivery, why: the topic fan-out has not reached the user yet (`fanout_pending`), or
/// the user or channel was not part of the event. A derived delivery (its decision starts
/// with `fallback:` or `escalation:`) starts the trail with that cause ("why was this
/// email sent": "fallback: LINE unreachable: unfollowed at ...; fallback to email").
pub fn trail(
    type_defaults: &str,
    skip: Option<SkipFacts<'_>>,
    deliveries: &[DeliveryFacts<'_>],
    fanout_pending: bool,
) -> Vec<String> {
    let causes = deliveries.iter().filter_map(|d| {
        d.decision
            .lines()
            .next()
            .filter(|l| l.starts_with("fallback: ") || l.starts_with("escalation: "))
    });
    let mut trail: Vec<String> = causes.map(str::to_string).collect();
    trail.dedup();
    trail.push(type_defaults.to_string());
    if let Some(s) = skip {
        trail.extend(s.decision.lines().map(str::to_string));
        trail.push(format!("skipped: {}", s.reason));
    }
    for d in deliveries {
        let mut lines = d.decision.lines().peekable();
        if lines
            .peek()
            .is_some_and(|l| l.starts_with("fallback: ") || l.starts_with("escalation: "))
        {
            lines.next();
        }
        trail.extend(lines.map(str::to_string));
        if !d.endpoint.is_empty() {
            trail.push(format!("endpoint now: {}", d.endpoint));
        }
        for a in &d.attempts {
            trail.push(format!(
                "attempt {}: {}{}{}",
                a.attempt,
                a.outcome,
                a.provider_status
                    .map(|s| format!(", provider status {s}"))
                    .unwrap_or_default(),
                a.error_code.map(|c| format!(", {c}")).unwrap_or_default(),
            ));
        }
        trail.push(match d.status {
            // The line above it (from the decision) says which rule and since when.
            DeliveryStatus::Skipped => {
                "status: skipped when due, not sent (no provider call)".into()
            }
            status => format!("status: {status}"),
        });
    }
    if skip.is_none() && deliveries.is_empty() {
        trail.push(if fanout_pending {
            "not planned yet: the topic fan-out has not reached this user".into()
        } else {
            "no delivery and no skip: the user was not a recipient, or the channel was not used"
                .into()
        });
    }
    trail
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPE: TypeFacts<'static> = TypeFacts {
        key: "order_paid",
        priority: Priority::High,
        critical: false,
        category: Category::Transactional,
        default_channels: &[Channel::Email, Channel::Line],
    };

    #[test]
    fn type_defaults_name_the_settings_or_a_missing_type() {
        assert_eq!(
            type_defaults("order_paid", Some(TYPE)),
            "type order_paid: priority high, not critical, transactional, default channels email, line"
        );
        let critical = TypeFacts {
            critical: true,
            ..TYPE
        };
        assert!(type_defaults("x", Some(critical)).contains("critical (ignores opt-outs"));
        assert_eq!(type_defaults("gone", None), "type gone: no longer defined");
    }

    /// "Why was this email sent?": a derived delivery's cause comes first.
    #[test]
    fn a_derived_delivery_starts_the_trail_with_its_cause() {
        let d = DeliveryFacts {
            decision: "fallback: LINE unreachable: unfollowed at 2026-12-01T09:00:00Z; fallback to email\npreference: on",
            endpoint: "",
            attempts: vec![],
            status: crate::DeliveryStatus::Sent,
        };
        assert_eq!(
            trail("type t", None, &[d], false),
            [
                "fallback: LINE unreachable: unfollowed at 2026-12-01T09:00:00Z; fallback to email",
                "type t",
                "preference: on",
                "status: sent",
            ]
        );
    }

    #[test]
    fn a_skip_adds_its_decision_lines_then_the_reason() {
        let skip = SkipFacts {
            reason: "opted_out",
            decision: "channel email: from the type's defaults\npreference: off (user, type)",
        };
        assert_eq!(
            trail("type t", Some(skip), &[], false),
            [
                "type t",
                "channel email: from the type's defaults",
                "preference: off (user, type)",
                "skipped: opted_out",
            ]
        );
    }

    #[test]
    fn a_delivery_adds_decision_endpoint_attempts_and_status() {
        let d = DeliveryFacts {
            decision: "planned: email via smtp",
            endpoint: "active",
            attempts: vec![
                AttemptFacts {
                    attempt: 1,
                    outcome: "retry",
                    provider_status: Some(451),
                    error_code: Some("smtp_transient"),
                },
                AttemptFacts {
                    attempt: 2,
                    outcome: "sent",
                    provider_status: None,
                    error_code: None,
                },
            ],
            status: DeliveryStatus::Sent,
        };
        let no_endpoint = DeliveryFacts {
            decision: "planned: inapp",
            endpoint: "",
            attempts: vec![],
            status: DeliveryStatus::Pending,
        };
        assert_eq!(
            trail("type t", None, &[d, no_endpoint], false),
            [
                "type t",
                "planned: email via smtp",
                "endpoint now: active",
                "attempt 1: retry, provider status 451, smtp_transient",
                "attempt 2: sent",
                "status: sent",
                "planned: inapp",
                "status: pending",
            ]
        );
    }

    /// "Why was this not sent": the decision's due-time line, then the final status.
    #[test]
    fn a_delivery_skipped_when_due_says_why_and_that_it_was_not_sent() {
        let d = DeliveryFacts {
            decision: "preference: on by the type's default channels (nothing set by the user)\n\
                       preference: off at 2026-12-02T02:00:00+00:00 by the user's setting for this type on email (set 2026-12-02T01:40:00+00:00); skipped when due",
            endpoint: "",
            attempts: vec![],
            status: DeliveryStatus::Skipped,
        };
        let t = trail("type t", None, &[d], false);
        assert_eq!(
            &t[2..],
            [
                "preference: off at 2026-12-02T02:00:00+00:00 by the user's setting for this type on email (set 2026-12-02T01:40:00+00:00); skipped when due",
                "status: skipped when due, not sent (no provider call)",
            ]
        );
    }

    #[test]
    fn nothing_planned_says_why() {
        assert_eq!(
            trail("type t", None, &[], true)[1],
            "not planned yet: the topic fan-out has not reached this user"
        );
        assert!(trail("type t", None, &[], false)[1].starts_with("no delivery and no skip"));
    }
}
