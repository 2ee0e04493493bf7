//! Unit tests of planning.

use super::*;

fn somchai() -> RecipientFacts {
    RecipientFacts {
        user_id: "somchai".into(),
        exists: true,
        email: Some("somchai@example.test".into()),
        line_user_id: Some("U0123456789abcdef0123456789abcdef".into()),
        push_endpoints: vec![
            (Uuid::from_u128(1), "fcm".into()),
            (Uuid::from_u128(2), "fcm".into()),
        ],
        ..Default::default()
    }
}

/// Every combination of the levels (critical or not; each user level unset, on or
/// off): the first level that is set decides, critical before all.
#[test]
fn preference_resolution_over_every_combination() {
    let levels = [None, Some(true), Some(false)];
    let mut seen = 0;
    for critical in [false, true] {
        for tc in levels {
            for tw in levels {
                for cw in levels {
                    let (on, source) = resolve_preference(critical, tc, tw, cw);
                    let expected = if critical {
                        (true, PreferenceSource::Critical)
                    } else if let Some(v) = tc {
                        (v, PreferenceSource::TypeChannel)
                    } else if let Some(v) = tw {
                        (v, PreferenceSource::TypeWide)
                    } else if let Some(v) = cw {
                        (v, PreferenceSource::ChannelWide)
                    } else {
                        (true, PreferenceSource::TypeDefault)
                    };
                    assert_eq!((on, source), expected, "{critical} {tc:?} {tw:?} {cw:?}");
                    seen += 1;
                }
            }
        }
    }
    assert_eq!(seen, 54);
    // Spot checks, as a reader would state them.
    assert!(
        !is_enabled(false, Some(false), Some(true), Some(true)),
        "type x channel off wins"
    );
    assert!(
        is_enabled(false, Some(true), Some(false), Some(false)),
        "type x channel on wins"
    );
    assert!(
        !is_enabled(false, None, Some(false), Some(true)),
        "type-wide beats channel-wide"
    );
    assert!(
        !is_enabled(false, None, None, Some(false)),
        "channel-wide beats the default"
    );
    assert!(
        is_enabled(true, Some(false), Some(false), Some(false)),
        "critical wins"
    );
}

#[test]
fn quiet_hours_defer_all_but_in_app_and_critical_types_and_say_why() {
    let mut r = somchai();
    r.quiet_hours = vec![crate::quiet::QuietWindow {
        start: "22:00".into(),
        end: "07:00".into(),
        channels: vec![],
    }];
    let at = "2026-11-30T16:30:00Z".parse().unwrap(); // 23:30 in Bangkok
    let end: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
    let (p, _) = plan(Uuid::nil(), false, &Channel::ALL, &[r.clone()], at, false);
    for d in &p {
        let want = (d.channel != Channel::InApp).then_some(end);
        assert_eq!(d.deferred_until, want, "{:?}", d.channel);
    }
    assert!(
        p[1].decision
            .contains("deferred until 2026-12-01T00:00:00+00:00"),
        "{}",
        p[1].decision
    );
    let (p, _) = plan(Uuid::nil(), true, &Channel::ALL, &[r], at, false);
    assert!(p.iter().all(|d| d.deferred_until.is_none()));
    assert!(p[1].decision.contains("critical type, not deferred"));
}

#[test]
fn one_delivery_per_channel_and_per_push_endpoint() {
    let ev = Uuid::from_u128(9);
    let (p, s) = plan(ev, false, &Channel::ALL, &[somchai()], Utc::now(), false);
    assert!(s.is_empty());
    let chans: Vec<_> = p.iter().map(|d| d.channel.as_str()).collect();
    assert_eq!(chans, ["inapp", "email", "push", "push", "line"]);
    let keys: std::collections::HashSet<_> = p.iter().map(|d| &d.idempotency_key).collect();
    assert_eq!(keys.len(), 5, "idempotency keys are distinct");
    assert_eq!(p[1].address.as_deref(), Some("somchai@example.test"));
    assert_eq!(p[2].endpoint_id, Some(Uuid::from_u128(1)));
}

#[test]
fn line_deliveries_become_multicast_batches_of_at_most_500() {
    let users: Vec<RecipientFacts> = (0..1001)
        .map(|i| RecipientFacts {
            user_id: format!("u{i:04}"),
            exists: true,
            line_user_id: Some(format!("U{i:032x}")),
            ..Default::default()
        })
        .collect();
    let ev = Uuid::from_u128(9);
    let (planned, _) = plan(
        ev,
        false,
        &[Channel::InApp, Channel::Line],
        &users,
        Utc::now(),
        false,
    );
    let merged = merge_line_multicast(ev, "u0000", planned, None);
    let inapp = merged
        .iter()
        .filter(|d| d.channel == Channel::InApp)
        .count();
    let batches: Vec<_> = merged
        .iter()
        .filter(|d| d.provider == Provider::LineMulticast)
        .collect();
    assert_eq!(inapp, 1001);
    assert_eq!(batches.len(), 3);
    let sizes: Vec<usize> = batches
        .iter()
        .map(|b| b.address.as_ref().unwrap().split(',').count())
        .collect();
    assert_eq!(sizes, [500, 500, 1]);
    assert_eq!(batches[2].user_id, "line-multicast:u1000+0");
    let again = merge_line_multicast(
        ev,
        "u0000",
        plan(ev, false, &[Channel::Line], &users, Utc::now(), false).0,
        None,
    );
    assert_eq!(
        again,
        batches.into_iter().cloned().collect::<Vec<_>>(),
        "stable keys"
    );
}

#[test]
fn a_line_user_who_blocked_the_account_is_skipped_even_for_critical_types() {
    let mut r = somchai();
    r.line_unfollowed = true;
    for critical in [false, true] {
        let (p, s) = plan(
            Uuid::from_u128(9),
            critical,
            &[Channel::Line],
            &[r.clone()],
            Utc::now(),
            false,
        );
        assert!(p.is_empty());
        assert_eq!(s[0].reason, SkipReason::LineUnfollowed);
        assert_eq!(s[0].reason.as_str(), "line_unfollowed");
    }
}

#[test]
fn missing_contact_data_and_opt_outs_are_skipped_with_reasons() {
    let mut r = somchai();
    r.email = None;
    r.push_endpoints.clear();
    r.type_prefs.insert(Channel::Line, false);
    let unknown = RecipientFacts {
        user_id: "ghost".into(),
        ..Default::default()
    };
    let (p, s) = plan(
        Uuid::nil(),
        false,
        &Channel::ALL,
        &[r, unknown],
        Utc::now(),
        false,
    );
    let planned: Vec<_> = p
        .iter()
        .map(|d| (d.user_id.as_str(), d.channel.as_str()))
        .collect();
    assert_eq!(planned, [("somchai", "inapp"), ("ghost", "inapp")]);
    let why: Vec<_> = s
        .iter()
        .map(|d| (d.user_id.as_str(), d.channel.as_str(), d.reason.as_str()))
        .collect();
    assert_eq!(
        why,
        [
            ("somchai", "email", "no_email_address"),
            ("somchai", "push", "no_push_endpoint"),
            ("somchai", "line", "opted_out"),
            ("ghost", "email", "recipient_not_found"),
            ("ghost", "push", "recipient_not_found"),
            ("ghost", "line", "recipient_not_found"),
        ]
    );
}

#[test]
fn critical_types_ignore_opt_outs() {
    let mut r = somchai();
    r.channel_prefs.insert(Channel::Email, false);
    let (p, s) = plan(
        Uuid::nil(),
        true,
        &[Channel::Email],
        &[r],
        Utc::now(),
        false,
    );
    assert_eq!(p.len(), 1);
    assert!(s.is_empty());
}

#[test]
fn requested_channels_must_be_type_defaults() {
    let defaults = [Channel::InApp, Channel::Email];
    let names = vec!["email".to_string(), "line".to_string()];
    let errs =
        effective_channels(&defaults, &[Channel::Email, Channel::Line], &names, "t").unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].field, "channels[1]");
    assert_eq!(
        effective_channels(&defaults, &[], &[], "t").unwrap(),
        [Channel::InApp, Channel::Email]
    );
}

#[test]
fn a_scheduled_event_waits_for_its_due_time_and_decides_preferences_then() {
    let due: DateTime<Utc> = "2026-12-02T02:00:00Z".parse().unwrap();
    let mut r = somchai();
    r.type_prefs.insert(Channel::Email, false);
    let (p, s) = plan(Uuid::nil(), false, &Channel::ALL, &[r.clone()], due, true);
    assert!(s.is_empty(), "an opt-out is decided again when due: {s:?}");
    assert_eq!(p.len(), 5, "inapp, email, line and two push endpoints");
    // Due then, not deferred: `deferred_until` is for what holds a delivery past its due
    // time (issue 44: it was set to the due time, which the API defines as unset).
    assert!(
        p.iter()
            .all(|d| d.scheduled_for == Some(due) && d.deferred_until.is_none()),
        "{p:?}"
    );
    assert!(p.iter().all(|d| d.first_attempt_at() == Some(due)));
    assert!(p.iter().all(|d| {
        d.decision
            .contains("scheduled for 2026-12-02T02:00:00+00:00")
    }));
    let email = p.iter().find(|d| d.channel == Channel::Email).unwrap();
    assert!(
        email.decision.starts_with(
            "preference: off now; decided again when due at 2026-12-02T02:00:00+00:00 (by the user's setting for this type on email)"
        ),
        "{}",
        email.decision
    );
    // Not scheduled: the same opt-out is a planning skip.
    let (_, s) = plan(Uuid::nil(), false, &Channel::ALL, &[r.clone()], due, false);
    assert_eq!(s[0].reason, SkipReason::OptedOut);

    // An unfollow and an undeliverable mark may change before the due time too: the
    // deliveries are written and the rules at due time decide.
    let mut gone = somchai();
    gone.line_unfollowed = true;
    gone.email_undeliverable = true;
    let channels = [Channel::Email, Channel::Line];
    let (p, s) = plan(Uuid::nil(), false, &channels, &[gone.clone()], due, true);
    assert!(s.is_empty(), "{s:?}");
    assert!(
        p[0].decision
            .contains("marked undeliverable now; decided again when due")
    );
    assert!(
        p[1].decision
            .contains("unfollowed the account now; decided again when due")
    );
    let (p, s) = plan(Uuid::nil(), false, &channels, &[gone], due, false);
    assert!(p.is_empty());
    let reasons: Vec<_> = s.iter().map(|s| s.reason).collect();
    assert_eq!(
        reasons,
        [SkipReason::EmailUndeliverable, SkipReason::LineUnfollowed]
    );

    // Quiet hours are those of the due time: 08:00-10:00 Bangkok holds 02:00 UTC (09:00
    // Bangkok), so the delivery waits until 10:00 Bangkok.
    r.type_prefs.clear();
    r.quiet_hours = vec![QuietWindow {
        start: "08:00".into(),
        end: "10:00".into(),
        channels: Vec::new(),
    }];
    let (p, _) = plan(Uuid::nil(), false, &[Channel::Email], &[r], due, true);
    assert_eq!(
        p[0].deferred_until,
        Some("2026-12-02T03:00:00Z".parse().unwrap()),
        "{}",
        p[0].decision
    );
    assert_eq!(p[0].first_attempt_at(), p[0].deferred_until);
}

#[test]
fn a_scheduled_topic_page_is_multicast_at_its_due_time() {
    let due: DateTime<Utc> = "2026-12-02T02:00:00Z".parse().unwrap();
    let users: Vec<RecipientFacts> = (0..3)
        .map(|i| RecipientFacts {
            user_id: format!("u{i}"),
            exists: true,
            line_user_id: Some(format!("U{i:032x}")),
            ..Default::default()
        })
        .collect();
    let ev = Uuid::from_u128(9);
    let (planned, _) = plan(ev, false, &[Channel::Line], &users, due, true);
    let merged = merge_line_multicast(ev, "", planned, Some(due));
    assert_eq!(merged.len(), 1, "{merged:?}");
    assert_eq!(merged[0].provider, Provider::LineMulticast);
    assert_eq!(
        (merged[0].deferred_until, merged[0].scheduled_for),
        (None, Some(due))
    );
    assert!(
        merged[0]
            .decision
            .ends_with("scheduled for 2026-12-02T02:00:00+00:00")
    );
}

#[test]
fn suppressed_email_is_skipped_but_other_channels_and_critical_types_go_out() {
    let now = Utc::now();
    let mut r = somchai();
    r.email_suppressed = true;
    let channels = [Channel::Email, Channel::Line];
    let (p, s) = plan(Uuid::nil(), false, &channels, &[r.clone()], now, false);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].channel, Channel::Line);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].channel, s[0].reason.as_str()),
        (Channel::Email, "suppressed")
    );
    let (p, s) = plan(Uuid::nil(), true, &channels, &[r], now, false);
    assert_eq!(
        (p.len(), s.len()),
        (2, 0),
        "a critical type is not suppressed"
    );
}
