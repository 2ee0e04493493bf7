//! Derived deliveries: a delivery on another channel because one channel of the type's
//! `fallback_channels` cannot reach the user (fallback), or because the notification was
//! not read or clicked in time (escalation). Each has the key a planned delivery on its
//! channel would have (`<event>/<user>/<channel>`), so the insert's `ON CONFLICT DO
//! NOTHING` keeps one delivery per channel whatever the path, crash or replay.
//!
//! Pure: the planning of the derived channel is [`plan`] itself, for that one channel and
//! recipient, so preferences, reachability and quiet hours hold as for any delivery.

use super::{PlannedDelivery, RecipientFacts, SkipReason, SkippedDelivery, plan};
use crate::channel::Channel;
use crate::named::named_enum;
use chrono::{DateTime, Utc};
use uuid::Uuid;

named_enum! {
    /// Why a delivery exists (`notification_deliveries.cause`).
    #[derive(Default)]
    pub enum Cause("delivery cause") {
        /// Planned for one of the event's channels. The default (the column's).
        #[default]
        Planned = "planned",
        /// Another channel of the type's fallback list could not reach the user.
        Fallback = "fallback",
        /// The notification on another channel was not read (or clicked) in time.
        Escalation = "escalation",
    }
}

/// One escalation of a type: when the delivery on `from` is still unread (in-app) or not
/// clicked (LINE, push) `after_seconds` after planning, send on `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Escalation {
    /// The channel whose notification must be read or clicked: in-app, LINE or push.
    pub from: Channel,
    /// The channel sent on otherwise.
    pub to: Channel,
    /// Seconds after planning (1 s .. 7 days).
    pub after_seconds: u32,
}

/// Longest escalation delay: 7 days, in seconds.
pub const MAX_ESCALATION_SECONDS: u32 = 7 * 24 * 3600;

/// What a type declares about derived deliveries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Derivation {
    /// Ordered: when a channel cannot reach the user, the next one is tried.
    pub fallback_channels: Vec<Channel>,
    /// Escalations, in the type's order.
    pub escalations: Vec<Escalation>,
}

impl Derivation {
    /// True when the type declares neither fallbacks nor escalations.
    pub fn is_empty(&self) -> bool {
        self.fallback_channels.is_empty() && self.escalations.is_empty()
    }
}

/// How trails name a channel.
fn label(c: Channel) -> &'static str {
    match c {
        Channel::InApp => "in-app",
        Channel::Email => "email",
        Channel::Push => "push",
        Channel::Line => "LINE",
    }
}

/// The trail text for a channel that cannot reach the user ("LINE unreachable:
/// unfollowed at 2026-12-01T09:00:00Z"), or `None` when `reason` is not about reaching
/// the user (opted out, throttled, digested, read).
pub fn unreachable_line(
    channel: Channel,
    reason: SkipReason,
    r: &RecipientFacts,
) -> Option<String> {
    let why = match reason {
        SkipReason::RecipientNotFound => "no recipient record".to_string(),
        SkipReason::NoEmailAddress => "no email address".into(),
        SkipReason::EmailUndeliverable => "address undeliverable".into(),
        SkipReason::NoLineUserId => "no LINE user id".into(),
        SkipReason::LineUnfollowed => match r.line_unfollowed_at {
            Some(t) => format!(
                "unfollowed at {}",
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
            None => "unfollowed".into(),
        },
        SkipReason::NoPushEndpoint => "no active push endpoint".into(),
        _ => return None,
    };
    Some(format!("{} unreachable: {why}", label(channel)))
}

/// Plans the fallback after `from` for one recipient: the channels after `from` in `list`,
/// in order, each planned alone; an unreachable one is skipped (its skip kept, its cause
/// added to the trail) and the next tried; the first that gets a delivery ends the walk,
/// as does one skipped for another reason (opted out). `cause` starts the trail ("LINE
/// delivery <id> failed: ..."). `taken` tells whether a channel already has a delivery
/// or skip for the recipient (then the walk stops there, or goes on past an unreachable
/// skip when `skipped_unreachable` says so). Returns the new deliveries (several for
/// push: one per endpoint) and skips.
#[allow(clippy::too_many_arguments)]
fn walk(
    event_id: Uuid,
    critical: bool,
    list: &[Channel],
    from: Channel,
    mut cause: String,
    r: &RecipientFacts,
    (now, scheduled): (DateTime<Utc>, bool),
    taken: &dyn Fn(Channel) -> Taken,
) -> (Vec<PlannedDelivery>, Vec<SkippedDelivery>) {
    let mut skips = Vec::new();
    let Some(at) = list.iter().position(|&c| c == from) else {
        return (Vec::new(), skips);
    };
    for &next in &list[at + 1..] {
        match taken(next) {
            Taken::Delivered | Taken::Skipped => return (Vec::new(), skips),
            Taken::Unreachable(why) => {
                cause.push_str(&format!("; {why}"));
                continue;
            }
            Taken::Free => {}
        }
        let (planned, skipped) = plan(
            event_id,
            critical,
            &[next],
            std::slice::from_ref(r),
            now,
            scheduled,
        );
        let head = format!("fallback: {cause}; fallback to {}", label(next));
        if !planned.is_empty() {
            let planned = planned
                .into_iter()
                .map(|mut d| {
                    d.cause = Cause::Fallback;
                    d.decision = format!("{head}\n{}", d.decision);
                    d
                })
                .collect();
            return (planned, skips);
        }
        let Some(mut s) = skipped.into_iter().next() else {
            return (Vec::new(), skips);
        };
        s.decision = format!("{head}\n{}", s.decision);
        let why = unreachable_line(next, s.reason, r);
        skips.push(s);
        match why {
            Some(why) => cause.push_str(&format!("; {why}")),
            None => return (Vec::new(), skips),
        }
    }
    (Vec::new(), skips)
}

/// What a recipient already has on a channel.
enum Taken {
    Free,
    Delivered,
    Skipped,
    Unreachable(String),
}

fn taken_in(
    planned: &[PlannedDelivery],
    skipped: &[SkippedDelivery],
    r: &RecipientFacts,
    c: Channel,
) -> Taken {
    if planned
        .iter()
        .any(|d| d.user_id == r.user_id && d.channel == c)
    {
        return Taken::Delivered;
    }
    match skipped
        .iter()
        .find(|s| s.user_id == r.user_id && s.channel == c)
    {
        Some(s) => match unreachable_line(c, s.reason, r) {
            Some(why) => Taken::Unreachable(why),
            None => Taken::Skipped,
        },
        None => Taken::Free,
    }
}

/// Adds the derived deliveries of one planning run to `planned` and `skipped` (the output
/// of [`plan`] for the same event, recipients and `now`):
/// - fallback: for each channel of `d.fallback_channels` skipped as unreachable, the next
///   channel of the list that has neither a delivery nor a skip gets one, cause
///   [`Cause::Fallback`], its trail starting "fallback: LINE unreachable: no LINE user
///   id; fallback to email"; an unreachable next channel passes on to the one after it;
/// - escalation: for each escalation whose `from` channel got a delivery, a delivery on
///   `to` (unless it has one or a skip), cause [`Cause::Escalation`], `parent_key` the
///   `from` delivery's key, planned as not due yet (its opt-out decided when due), due at
///   `now + after_seconds` (or the end of the quiet hours
///   then), its trail starting "escalation: if the in-app notification is still unread
///   at <time>".
///
/// The unreachable channel's skip stays. Skips of derived channels (opted out, say) are
/// added with the same trail.
pub fn derive(
    event_id: Uuid,
    critical: bool,
    d: &Derivation,
    recipients: &[RecipientFacts],
    (now, scheduled): (DateTime<Utc>, bool),
    planned: &mut Vec<PlannedDelivery>,
    skipped: &mut Vec<SkippedDelivery>,
) {
    if d.is_empty() {
        return;
    }
    for r in recipients {
        for &c in &d.fallback_channels {
            let Taken::Unreachable(why) = taken_in(planned, skipped, r, c) else {
                continue;
            };
            let (p, s) = {
                let (pl, sk) = (&*planned, &*skipped);
                walk(
                    event_id,
                    critical,
                    &d.fallback_channels,
                    c,
                    why,
                    r,
                    (now, scheduled),
                    &|n| taken_in(pl, sk, r, n),
                )
            };
            planned.extend(p);
            skipped.extend(s);
        }
        for e in &d.escalations {
            let Some(parent) = planned
                .iter()
                .find(|p| {
                    p.user_id == r.user_id && p.channel == e.from && p.cause != Cause::Escalation
                })
                .map(|p| p.idempotency_key.clone())
            else {
                continue;
            };
            if !matches!(taken_in(planned, skipped, r, e.to), Taken::Free) {
                continue;
            }
            let due = now + chrono::Duration::seconds(i64::from(e.after_seconds));
            let state = if e.from == Channel::InApp {
                "unread"
            } else {
                "not clicked"
            };
            let head = format!(
                "escalation: if the {} notification is still {state} at {}",
                label(e.from),
                due.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            );
            // Not due yet: like a scheduled send, its opt-out is decided when due.
            let (p, s) = plan(
                event_id,
                critical,
                &[e.to],
                std::slice::from_ref(r),
                due,
                true,
            );
            planned.extend(p.into_iter().map(|mut x| {
                x.cause = Cause::Escalation;
                x.parent_key = Some(parent.clone());
                // Due then (planned as scheduled for `due`), held later by quiet hours.
                x.scheduled_for = Some(due);
                x.decision = format!("{head}\n{}", x.decision);
                x
            }));
            skipped.extend(s.into_iter().map(|mut x| {
                x.decision = format!("{head}\n{}", x.decision);
                x
            }));
        }
    }
}

/// The fallback after a delivery on `from` ended `failed` (or was skipped at due time for
/// an unreachable reason): the next channel of `list` after `from` that can reach `r`,
/// planned at `now` with `cause` starting its trail ("LINE delivery <id> failed: 400").
/// Channels in between that cannot reach the user get skips. Returns the deliveries (empty
/// when no channel is left or the next one is opted out) and the skips.
pub fn fallback_after(
    event_id: Uuid,
    critical: bool,
    list: &[Channel],
    from: Channel,
    cause: &str,
    r: &RecipientFacts,
    now: DateTime<Utc>,
) -> (Vec<PlannedDelivery>, Vec<SkippedDelivery>) {
    walk(
        event_id,
        critical,
        list,
        from,
        cause.to_string(),
        r,
        (now, false),
        &|_| Taken::Free,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> RecipientFacts {
        RecipientFacts {
            user_id: "u1".into(),
            exists: true,
            email: Some("u1@example.test".into()),
            ..Default::default()
        }
    }

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn line_then_email() -> Derivation {
        Derivation {
            fallback_channels: vec![Channel::Line, Channel::Email],
            escalations: vec![],
        }
    }

    fn run(
        d: &Derivation,
        channels: &[Channel],
        r: &RecipientFacts,
    ) -> (Vec<PlannedDelivery>, Vec<SkippedDelivery>) {
        let now = at("2026-12-01T10:00:00Z");
        let ev = Uuid::from_u128(7);
        let (mut p, mut s) = plan(ev, false, channels, std::slice::from_ref(r), now, false);
        derive(
            ev,
            false,
            d,
            std::slice::from_ref(r),
            (now, false),
            &mut p,
            &mut s,
        );
        (p, s)
    }

    #[test]
    fn no_line_id_gives_the_email_with_the_cause_and_keeps_the_skip() {
        let (p, s) = run(&line_then_email(), &[Channel::Line], &user());
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].channel, Channel::Email);
        assert_eq!(p[0].cause, Cause::Fallback);
        assert_eq!(
            p[0].idempotency_key,
            format!("{}/u1/email", Uuid::from_u128(7))
        );
        assert!(
            p[0].decision
                .starts_with("fallback: LINE unreachable: no LINE user id; fallback to email\n"),
            "{}",
            p[0].decision
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].reason, SkipReason::NoLineUserId);
    }

    #[test]
    fn an_unfollow_is_named_with_its_time() {
        let mut r = user();
        r.line_user_id = Some("U1".into());
        r.line_unfollowed = true;
        r.line_unfollowed_at = Some(at("2026-12-01T09:00:00Z"));
        let (p, _) = run(&line_then_email(), &[Channel::Line], &r);
        assert!(p[0].decision.starts_with(
            "fallback: LINE unreachable: unfollowed at 2026-12-01T09:00:00Z; fallback to email"
        ));
    }

    #[test]
    fn a_reachable_channel_or_one_already_planned_derives_nothing() {
        let mut r = user();
        r.line_user_id = Some("U1".into());
        let (p, _) = run(&line_then_email(), &[Channel::Line], &r);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].cause, Cause::Planned);
        // Email is one of the event's channels: it is planned once, as planned.
        let (p, _) = run(
            &line_then_email(),
            &[Channel::Email, Channel::Line],
            &user(),
        );
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].cause, Cause::Planned);
    }

    #[test]
    fn an_opted_out_fallback_is_skipped_with_its_reason() {
        let mut r = user();
        r.channel_prefs.insert(Channel::Email, false);
        let (p, s) = run(&line_then_email(), &[Channel::Line], &r);
        assert!(p.is_empty());
        let email = s.iter().find(|s| s.channel == Channel::Email).unwrap();
        assert_eq!(email.reason, SkipReason::OptedOut);
        assert!(email.decision.starts_with("fallback: LINE unreachable"));
    }

    #[test]
    fn an_unreachable_middle_channel_passes_on_to_the_next() {
        let d = Derivation {
            fallback_channels: vec![Channel::Line, Channel::Push, Channel::Email],
            escalations: vec![],
        };
        let (p, s) = run(&d, &[Channel::Line], &user());
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].channel, Channel::Email);
        assert!(p[0].decision.starts_with(
            "fallback: LINE unreachable: no LINE user id; push unreachable: no active push endpoint; fallback to email"
        ), "{}", p[0].decision);
        assert_eq!(s.iter().filter(|s| s.channel == Channel::Push).count(), 1);
    }

    #[test]
    fn an_escalation_waits_and_names_its_parent() {
        let d = Derivation {
            fallback_channels: vec![],
            escalations: vec![Escalation {
                from: Channel::InApp,
                to: Channel::Email,
                after_seconds: 3600,
            }],
        };
        let (p, _) = run(&d, &[Channel::InApp], &user());
        assert_eq!(p.len(), 2);
        let e = &p[1];
        assert_eq!(e.cause, Cause::Escalation);
        assert_eq!(e.parent_key.as_deref(), Some(p[0].idempotency_key.as_str()));
        assert_eq!(e.scheduled_for, Some(at("2026-12-01T11:00:00Z")));
        assert_eq!(e.deferred_until, None, "due then, not held by quiet hours");
        assert!(e.decision.starts_with(
            "escalation: if the in-app notification is still unread at 2026-12-01T11:00:00Z\n"
        ));
        // No in-app delivery (not one of the event's channels): no escalation.
        let (p, _) = run(&d, &[Channel::Email], &user());
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].cause, Cause::Planned);
    }

    #[test]
    fn after_a_failure_the_next_channel_is_planned_once() {
        let r = user();
        let (p, s) = fallback_after(
            Uuid::from_u128(7),
            false,
            &[Channel::Line, Channel::Email],
            Channel::Line,
            "LINE delivery x failed: 400",
            &r,
            at("2026-12-01T10:00:00Z"),
        );
        assert!(s.is_empty());
        assert_eq!(p.len(), 1);
        assert!(
            p[0].decision
                .starts_with("fallback: LINE delivery x failed: 400; fallback to email")
        );
        // The last channel of the list has no fallback.
        let (p, _) = fallback_after(
            Uuid::from_u128(7),
            false,
            &[Channel::Line, Channel::Email],
            Channel::Email,
            "x",
            &r,
            at("2026-12-01T10:00:00Z"),
        );
        assert!(p.is_empty());
    }
}
