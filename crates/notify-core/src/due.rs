//! The rules checked when a delivery becomes due, whatever made it due: its first send, a
//! scheduled send, a retry, a fatigue-cap slot, a digest's close, the end of a channel
//! pause, recovery after a crash. Planning decides when a delivery should go out; this
//! decides, at that moment and on the database clock, whether it may go out now. The
//! worker runtime applies it to every claimed delivery before the provider call, so no
//! path can skip it.
//!
//! The rules, in order:
//! 1. **Preference** (skip, `opted_out`): resolved as planning resolves it
//!    ([`crate::plan::resolve_preference`]) from the settings as they are now; a critical
//!    type ignores opt-outs. For a scheduled event planning leaves the preference to this
//!    check ("decided again when due").
//! 2. **Reachability** (skip): the LINE user unfollowed (`line_unfollowed`), the push
//!    endpoint was revoked (`endpoint_revoked`) or is gone (`no_push_endpoint`), the email
//!    address was marked undeliverable (`email_undeliverable`); the email is suppressed for
//!    its category (`suppressed`: a complaint, soft bounces, the console; not for critical
//!    types). These hold for critical
//!    types too: nothing can reach the user there.
//! 3. **Quiet hours** (defer): a non-critical delivery on a noisy channel (everything but
//!    in-app) that becomes due inside the recipient's quiet window waits until it ends.
//!
//! A LINE multicast batch (one call for up to 500 users) is not skipped per user: rules 1
//! and 2 were applied to each user when planning made the batch, and one user's change
//! cannot take that user out of a batch without a new call. Quiet hours still hold it.
//!
//! Pure: the instant and the facts are passed in.

use crate::channel::Channel;
use crate::plan::{PreferenceSource, SkipReason, preference_line, resolve_preference};
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
    /// Never: the delivery ends `skipped` without a provider call.
    Skip {
        /// The reason code (stored in `last_error`).
        reason: SkipReason,
        /// The trail line: which rule, since when, and that it was decided when due.
        why: String,
    },
}

/// One preference setting as stored now: on or off, and when the user last set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The channel is on.
    pub on: bool,
    /// When the setting was last written (`notification_preferences.updated_at`).
    pub at: DateTime<Utc>,
}

/// The recipient's preference settings that apply to one delivery, as they are at its
/// due time; `None` where the user set nothing at that level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Preferences {
    /// This type on this channel.
    pub type_channel: Option<Setting>,
    /// This type on every channel (channel `*`).
    pub type_wide: Option<Setting>,
    /// This channel for every type (type `*`).
    pub channel_wide: Option<Setting>,
}

/// The state of a push delivery's endpoint at due time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Endpoint<'a> {
    /// Active, or the delivery is not a push delivery.
    #[default]
    Usable,
    /// Revoked by the app or because the provider said the token is gone.
    Revoked {
        /// `revoked_at`, when known.
        at: Option<DateTime<Utc>>,
        /// `revoked_reason`, when known.
        reason: Option<&'a str>,
    },
    /// The endpoint row no longer exists, or its token was registered again by another
    /// user since planning (it is not this recipient's device any more).
    Gone,
}

/// The facts about one due delivery that the rules read, as they are at the moment it is
/// due (read with its claim, in the claim's statement).
#[derive(Debug, Clone, Copy)]
pub struct DueFacts<'a> {
    /// The delivery's channel.
    pub channel: Channel,
    /// The type is critical (security alert, OTP): opt-outs and quiet hours do not hold
    /// it.
    pub critical: bool,
    /// The recipient's time zone (IANA); unknown means Asia/Bangkok, as in planning.
    pub timezone: Option<Tz>,
    /// The recipient's quiet hours.
    pub quiet_hours: &'a [QuietWindow],
    /// A LINE multicast batch: the per-user rules (preference, follower state) do not
    /// apply to it.
    pub batch: bool,
    /// The recipient's preference settings for the delivery's type and channel.
    pub preferences: Preferences,
    /// LINE: when the user unfollowed (blocked) the official account, if their last
    /// follow event was an unfollow (`line_followers.changed_at`).
    pub line_unfollowed_at: Option<DateTime<Utc>>,
    /// Push: the endpoint's state.
    pub endpoint: Endpoint<'a>,
    /// Email: when the delivery's address was marked undeliverable (SMTP 550 5.1.1), if it
    /// is still the recipient's address and still marked. An address changed since
    /// planning has no mark (changing the address clears it, as planning reads it).
    pub email_undeliverable_at: Option<DateTime<Utc>>,
    /// Email: since when email of the delivery's category is suppressed for the user or
    /// the address (`email_suppressions`: a complaint, soft bounces, the console), if it
    /// is; never set for a critical type.
    pub email_suppressed_at: Option<DateTime<Utc>>,
    /// For an escalation: when the notification it escalates was read (in-app) or first
    /// clicked (LINE, push), if it was; `None` otherwise and for every other delivery.
    pub escalation_answered: Option<DateTime<Utc>>,
    /// Email: the recipient has no email address any more (removed since planning).
    pub email_address_gone: bool,
    /// A topic event's delivery whose recipient is no longer subscribed to the topic.
    pub unsubscribed: bool,
}

impl<'a> DueFacts<'a> {
    /// Facts with only the quiet-hours inputs set: no preference set, reachable.
    pub fn new(
        channel: Channel,
        critical: bool,
        timezone: Option<Tz>,
        quiet_hours: &'a [QuietWindow],
    ) -> Self {
        DueFacts {
            channel,
            critical,
            timezone,
            quiet_hours,
            batch: false,
            preferences: Preferences::default(),
            line_unfollowed_at: None,
            endpoint: Endpoint::Usable,
            email_undeliverable_at: None,
            email_suppressed_at: None,
            escalation_answered: None,
            email_address_gone: false,
            unsubscribed: false,
        }
    }
}

/// Whether a delivery that is due at `now` (database clock) may be sent now: skip rules
/// first, then quiet hours.
pub fn check(now: DateTime<Utc>, facts: DueFacts<'_>) -> Due {
    if let Some(at) = facts.escalation_answered {
        return Due::Skip {
            reason: SkipReason::Read,
            why: format!(
                "escalation: not sent, the notification it escalates was read or clicked at {}",
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        };
    }
    if let Some((reason, why)) = skip(now, &facts) {
        return Due::Skip { reason, why };
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

fn skip(now: DateTime<Utc>, f: &DueFacts<'_>) -> Option<(SkipReason, String)> {
    let when = now.to_rfc3339();
    // Leaving a topic's audience holds for every type, critical ones included.
    if f.unsubscribed && !f.batch {
        return Some((
            SkipReason::Unsubscribed,
            format!(
                "topic: the recipient unsubscribed from the event's topic; skipped when due at {when}"
            ),
        ));
    }
    if !f.batch {
        let p = f.preferences;
        let (on, source) = resolve_preference(
            f.critical,
            p.type_channel.map(|s| s.on),
            p.type_wide.map(|s| s.on),
            p.channel_wide.map(|s| s.on),
        );
        if !on {
            let set_at = match source {
                PreferenceSource::TypeChannel => p.type_channel,
                PreferenceSource::TypeWide => p.type_wide,
                PreferenceSource::ChannelWide => p.channel_wide,
                PreferenceSource::Critical | PreferenceSource::TypeDefault => None,
            }
            .map(|s| format!(" (set {})", s.at.to_rfc3339()))
            .unwrap_or_default();
            let line = preference_line(on, source, f.channel);
            let rest = line.strip_prefix("preference: off ").unwrap_or(&line);
            return Some((
                SkipReason::OptedOut,
                format!("preference: off at {when} {rest}{set_at}; skipped when due"),
            ));
        }
    }
    if f.channel == Channel::Email
        && !f.critical
        && let Some(at) = f.email_suppressed_at
    {
        return Some((
            SkipReason::Suppressed,
            format!(
                "email: suppressed since {} (complaint, soft bounces or the console); skipped when due at {when}",
                at.to_rfc3339()
            ),
        ));
    }
    match f.channel {
        Channel::Line if !f.batch => f.line_unfollowed_at.map(|at| {
            (
                SkipReason::LineUnfollowed,
                format!(
                    "LINE: unfollowed at {} (the user blocked the official account); skipped when due at {when}",
                    at.to_rfc3339()
                ),
            )
        }),
        Channel::Push => match f.endpoint {
            Endpoint::Usable => None,
            Endpoint::Revoked { at, reason } => Some((
                SkipReason::EndpointRevoked,
                format!(
                    "endpoint: revoked{}{}; skipped when due at {when}",
                    at.map(|t| format!(" at {}", t.to_rfc3339()))
                        .unwrap_or_default(),
                    reason.map(|r| format!(" ({r})")).unwrap_or_default(),
                ),
            )),
            Endpoint::Gone => Some((
                SkipReason::NoPushEndpoint,
                format!(
                    "endpoint: gone (deleted, or registered to another user since); skipped when due at {when}"
                ),
            )),
        },
        Channel::Email if f.email_address_gone => Some((
            SkipReason::NoEmailAddress,
            format!("email: the recipient has no email address any more; skipped when due at {when}"),
        )),
        Channel::Email => f.email_undeliverable_at.map(|at| {
            (
                SkipReason::EmailUndeliverable,
                format!(
                    "email: the address was marked undeliverable at {} (refused as nonexistent); skipped when due at {when}",
                    at.to_rfc3339()
                ),
            )
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
