//! The rules checked when a delivery becomes due, whatever made it due: its first send, a
//! retry, a fatigue-cap slot, a digest's close, the end of a channel pause, recovery after
//! a crash. Planning decides when a delivery should go out; this decides, at that moment
//! and on the database clock, whether it may go out now. The worker runtime applies it to
//! every claimed delivery before the provider call, so no path can skip it.
//!
//! Today's rule is quiet hours: a non-critical delivery on a noisy channel (everything but
//! in-app) that becomes due inside the recipient's quiet window waits until the window
//! ends. Pure: the instant is passed in.

use crate::channel::Channel;
use crate::quiet::{QuietWindow, quiet_until};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;

/// What the rules say about a delivery that is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// Send it now.
    Now,
    /// Not now: due again at `until`, for the reason `why` (one line for the decision
    /// trail).
    Defer {
        /// When the delivery becomes due again.
        until: DateTime<Utc>,
        /// The trail line.
        why: String,
    },
    /// Not at all: the delivery ends `skipped` with `reason` (its code goes to
    /// `last_error`) and `why` appended to its trail.
    Skip {
        /// Why it may not go out.
        reason: crate::plan::SkipReason,
        /// The trail line.
        why: String,
    },
}

/// The facts about one due delivery that the rules read, as they are at the moment it is
/// due (read with its claim).
#[derive(Debug, Clone, Copy)]
pub struct DueFacts<'a> {
    /// The delivery's channel.
    pub channel: Channel,
    /// The type is critical (security alert, OTP): quiet hours do not hold it.
    pub critical: bool,
    /// The recipient's time zone (IANA); unknown means Asia/Bangkok, as in planning.
    pub timezone: Option<Tz>,
    /// The recipient's quiet hours.
    pub quiet_hours: &'a [QuietWindow],
    /// For an escalation: when the notification it escalates was read (in-app) or first
    /// clicked (LINE, push), if it was; `None` otherwise and for every other delivery.
    pub escalation_answered: Option<DateTime<Utc>>,
}

/// Whether a delivery that is due at `now` (database clock) may be sent now.
pub fn check(now: DateTime<Utc>, facts: DueFacts<'_>) -> Due {
    if let Some(at) = facts.escalation_answered {
        return Due::Skip {
            reason: crate::plan::SkipReason::Read,
            why: format!(
                "escalation: not sent, the notification it escalates was read or clicked at {}",
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        };
    }
    if facts.critical || facts.channel == Channel::InApp {
        return Due::Now;
    }
    let tz = facts.timezone.unwrap_or(chrono_tz::Asia::Bangkok);
    match quiet_until(now, tz, facts.quiet_hours, facts.channel) {
        Some(until) => Due::Defer {
            until,
            why: format!(
                "quiet hours ({tz}): due at {} inside the window; deferred until {}",
                now.to_rfc3339(),
                until.to_rfc3339()
            ),
        },
        None => Due::Now,
    }
}

#[cfg(test)]
mod tests {
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
        DueFacts {
            channel,
            critical,
            timezone: Some(chrono_tz::Asia::Bangkok),
            quiet_hours: w,
            escalation_answered: None,
        }
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
}
