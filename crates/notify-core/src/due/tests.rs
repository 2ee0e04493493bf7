use super::*;
use crate::RetryPolicy;
use std::time::Duration;

fn night() -> Vec<QuietWindow> {
    vec![QuietWindow {
        start: "22:00".into(),
        end: "07:00".into(),
        channels: vec![],
    }]
}

fn facts(channel: Channel, critical: bool, w: &[QuietWindow]) -> DueFacts<'_> {
    DueFacts::new(channel, critical, Some(chrono_tz::Asia::Bangkok), w)
}

fn utc(s: &str) -> DateTime<Utc> {
    s.parse().unwrap()
}

/// The acceptance case: a delivery fails once at 21:59 Bangkok time (14:59 UTC); its
/// retry, due a few minutes later, lands inside 22:00-07:00 and waits until 07:00.
#[test]
fn a_retry_that_lands_in_quiet_hours_waits_for_their_end() {
    let w = night();
    let failed_at = utc("2026-12-01T14:59:00Z");
    let policy = RetryPolicy {
        delays: vec![Duration::from_secs(360)],
        ..Default::default()
    };
    let delay = policy.next_delay(1, None, false, 0.5).unwrap();
    let due = failed_at + chrono::Duration::from_std(delay).unwrap();
    assert_eq!(due, utc("2026-12-01T15:05:00Z")); // 22:05 Bangkok
    match check(due, facts(Channel::Email, false, &w)) {
        Due::Defer { until, why } => {
            assert_eq!(until, utc("2026-12-02T00:00:00Z")); // 07:00 Bangkok
            assert!(why.contains("quiet hours (Asia/Bangkok)"), "{why}");
        }
        other => panic!("a retry at 22:05 must not go out: {other:?}"),
    }
    // At 07:00 it goes.
    assert_eq!(
        check(
            utc("2026-12-02T00:00:00Z"),
            facts(Channel::Email, false, &w)
        ),
        Due::Now
    );
}

/// A fatigue slot or a digest's close is just another due time: the same rule holds.
#[test]
fn any_due_time_inside_the_window_is_held_but_not_in_app_or_critical() {
    let w = night();
    let slot = utc("2026-12-01T16:30:00Z"); // 23:30 Bangkok
    for channel in [Channel::Email, Channel::Push, Channel::Line] {
        assert!(matches!(
            check(slot, facts(channel, false, &w)),
            Due::Defer { until, .. } if until == utc("2026-12-02T00:00:00Z")
        ));
    }
    assert_eq!(check(slot, facts(Channel::InApp, false, &w)), Due::Now);
    assert_eq!(check(slot, facts(Channel::Email, true, &w)), Due::Now);
    assert_eq!(
        check(
            utc("2026-12-01T10:00:00Z"),
            facts(Channel::Email, false, &w)
        ),
        Due::Now
    );
}

fn off(at: &str) -> Option<Setting> {
    Some(Setting {
        on: false,
        at: utc(at),
    })
}

fn on(at: &str) -> Option<Setting> {
    Some(Setting {
        on: true,
        at: utc(at),
    })
}

fn skipped(d: Due) -> (SkipReason, String) {
    match d {
        Due::Skip { reason, why } => (reason, why),
        other => panic!("expected a skip, got {other:?}"),
    }
}

/// The case: a scheduled 09:00 email whose user turned email off at 08:40 (for
/// this type) is skipped at 09:00, and the trail line names the rule, the due time and
/// when the user changed it.
#[test]
fn a_preference_turned_off_before_the_due_time_skips_with_the_time() {
    let due = utc("2026-12-02T02:00:00Z"); // 09:00 Bangkok
    let f = DueFacts {
        preferences: Preferences {
            type_channel: off("2026-12-02T01:40:00Z"),
            ..Default::default()
        },
        ..facts(Channel::Email, false, &[])
    };
    let (reason, why) = skipped(check(due, f));
    assert_eq!(reason, SkipReason::OptedOut);
    assert_eq!(
        why,
        "preference: off at 2026-12-02T02:00:00+00:00 by the user's setting for this type on email \
         (set 2026-12-02T01:40:00+00:00); skipped when due"
    );
}

/// The levels resolve as in planning: type x channel over type-wide over channel-wide;
/// a user who turned the channel back on before the due time gets it.
#[test]
fn preference_levels_resolve_as_in_planning_at_due_time() {
    let due = utc("2026-12-02T02:00:00Z");
    let with = |p: Preferences, ch: Channel| {
        check(
            due,
            DueFacts {
                preferences: p,
                ..facts(ch, false, &[])
            },
        )
    };
    // Back on for this type wins over the channel-wide off.
    let p = Preferences {
        type_channel: on("2026-12-02T01:50:00Z"),
        channel_wide: off("2026-12-02T01:40:00Z"),
        ..Default::default()
    };
    assert_eq!(with(p, Channel::Email), Due::Now);
    // The type-wide switch off, nothing per channel: skipped on every channel, in-app too.
    let p = Preferences {
        type_wide: off("2026-12-01T00:00:00Z"),
        channel_wide: on("2026-12-01T00:00:00Z"),
        ..Default::default()
    };
    for ch in Channel::ALL {
        let (reason, why) = skipped(with(p, ch));
        assert_eq!(reason, SkipReason::OptedOut);
        assert!(
            why.contains("by the user's switch for this type on every channel (set 2026-12-01T00:00:00+00:00)"),
            "{why}"
        );
    }
    // The channel-wide switch alone.
    let p = Preferences {
        channel_wide: off("2026-12-01T00:00:00Z"),
        ..Default::default()
    };
    let (_, why) = skipped(with(p, Channel::Line));
    assert!(
        why.contains("by the user's switch for line on every type"),
        "{why}"
    );
    assert_eq!(with(Preferences::default(), Channel::Line), Due::Now);
}

/// A critical type ignores opt-outs (as in planning) but not an unreachable channel.
#[test]
fn a_critical_type_ignores_opt_outs_but_not_unreachability() {
    let due = utc("2026-12-01T16:30:00Z"); // 23:30 Bangkok, inside quiet hours too
    let w = night();
    let f = DueFacts {
        preferences: Preferences {
            type_channel: off("2026-12-01T16:00:00Z"),
            ..Default::default()
        },
        ..facts(Channel::Email, true, &w)
    };
    assert_eq!(check(due, f), Due::Now);
    let f = DueFacts {
        email_undeliverable_at: Some(utc("2026-12-01T15:00:00Z")),
        ..f
    };
    assert_eq!(skipped(check(due, f)).0, SkipReason::EmailUndeliverable);
}

/// Unreachable channels at due time, each with its reason and a trail line naming since
/// when. The facts of another channel do not matter.
#[test]
fn unreachable_channels_skip_with_their_reason_and_time() {
    let due = utc("2026-12-02T02:00:00Z");
    let at = utc("2026-12-02T01:30:00Z");
    let line = DueFacts {
        line_unfollowed_at: Some(at),
        ..facts(Channel::Line, false, &[])
    };
    let (reason, why) = skipped(check(due, line));
    assert_eq!(reason, SkipReason::LineUnfollowed);
    assert_eq!(
        why,
        "LINE: unfollowed at 2026-12-02T01:30:00+00:00 (the user blocked the official account); \
         skipped when due at 2026-12-02T02:00:00+00:00"
    );
    let push = DueFacts {
        endpoint: Endpoint::Revoked {
            at: Some(at),
            reason: Some("app_uninstalled"),
        },
        ..facts(Channel::Push, false, &[])
    };
    let (reason, why) = skipped(check(due, push));
    assert_eq!(
        (reason, reason.as_str()),
        (SkipReason::EndpointRevoked, "endpoint_revoked")
    );
    assert_eq!(
        why,
        "endpoint: revoked at 2026-12-02T01:30:00+00:00 (app_uninstalled); skipped when due at \
         2026-12-02T02:00:00+00:00"
    );
    let gone = DueFacts {
        endpoint: Endpoint::Gone,
        ..facts(Channel::Push, false, &[])
    };
    assert_eq!(skipped(check(due, gone)).0, SkipReason::NoPushEndpoint);
    let email = DueFacts {
        email_undeliverable_at: Some(at),
        ..facts(Channel::Email, false, &[])
    };
    let (reason, why) = skipped(check(due, email));
    assert_eq!(reason, SkipReason::EmailUndeliverable);
    assert!(
        why.starts_with("email: the address was marked undeliverable at 2026-12-02T01:30:00+00:00"),
        "{why}"
    );
    // An unfollow says nothing about email.
    let email = DueFacts {
        line_unfollowed_at: Some(at),
        ..facts(Channel::Email, false, &[])
    };
    assert_eq!(check(due, email), Due::Now);
}

/// Skip rules come before quiet hours: an opted-out delivery due inside the window is
/// skipped, not deferred to the window's end (and then skipped).
#[test]
fn skip_rules_come_before_quiet_hours() {
    let w = night();
    let due = utc("2026-12-01T16:30:00Z"); // 23:30 Bangkok
    let f = DueFacts {
        preferences: Preferences {
            channel_wide: off("2026-12-01T10:00:00Z"),
            ..Default::default()
        },
        ..facts(Channel::Push, false, &w)
    };
    assert_eq!(skipped(check(due, f)).0, SkipReason::OptedOut);
}

/// A LINE multicast batch is not skipped per user (its users were checked when the batch
/// was planned); quiet hours still hold it.
#[test]
fn a_line_multicast_batch_is_not_skipped_per_user() {
    let w = night();
    let f = DueFacts {
        batch: true,
        preferences: Preferences {
            channel_wide: off("2026-12-01T10:00:00Z"),
            ..Default::default()
        },
        line_unfollowed_at: Some(utc("2026-12-01T10:00:00Z")),
        ..facts(Channel::Line, false, &w)
    };
    assert_eq!(check(utc("2026-12-02T02:00:00Z"), f), Due::Now);
    assert!(matches!(
        check(utc("2026-12-01T16:30:00Z"), f),
        Due::Defer { .. }
    ));
}

/// An escalation whose parent was read before it was due is skipped, whatever the
/// channel and quiet hours.
#[test]
fn an_answered_escalation_is_skipped_as_read() {
    let w = night();
    let mut f = facts(Channel::Email, false, &w);
    f.escalation_answered = Some(utc("2026-12-01T10:00:00Z"));
    match check(utc("2026-12-01T16:30:00Z"), f) {
        Due::Skip { reason, why } => {
            assert_eq!(reason.as_str(), "read_before_escalation");
            assert!(
                why.contains("read or clicked at 2026-12-01T10:00:00Z"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// A recipient who left the event's topic is skipped when due, critical type or not;
/// a multicast batch is not skipped per user.
#[test]
fn a_recipient_who_left_the_topic_is_skipped_when_due() {
    let w = night();
    let f = DueFacts {
        unsubscribed: true,
        ..facts(Channel::InApp, true, &w)
    };
    match check(utc("2026-12-01T10:00:00Z"), f) {
        Due::Skip { reason, why } => {
            assert_eq!(reason, SkipReason::Unsubscribed);
            assert!(why.contains("unsubscribed from the event's topic"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    let batch = DueFacts { batch: true, ..f };
    assert_eq!(check(utc("2026-12-01T10:00:00Z"), batch), Due::Now);
}

#[test]
fn suppressed_email_is_skipped_when_due_unless_the_type_is_critical() {
    let due = utc("2026-12-02T02:00:00Z");
    let at = utc("2026-12-02T01:00:00Z");
    let email = DueFacts {
        email_suppressed_at: Some(at),
        ..facts(Channel::Email, false, &[])
    };
    let (reason, why) = skipped(check(due, email));
    assert_eq!(reason, SkipReason::Suppressed);
    assert!(
        why.starts_with("email: suppressed since 2026-12-02T01:00:00+00:00"),
        "{why}"
    );
    let critical = DueFacts {
        email_suppressed_at: Some(at),
        ..facts(Channel::Email, true, &[])
    };
    assert_eq!(check(due, critical), Due::Now);
}
