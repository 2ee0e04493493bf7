//! Who gets what: turns an event, its type and the recipients' facts into planned
//! deliveries and skipped recipient x channel pairs.

use crate::channel::{Channel, Provider};
use crate::quiet::{QuietWindow, quiet_until};
use crate::validate::FieldViolation;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use uuid::Uuid;

/// Why a recipient x channel got no delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// No `recipients` row: only the in-app inbox can be reached.
    RecipientNotFound,
    /// The recipient has no email address.
    NoEmailAddress,
    /// The recipient has no LINE user id.
    NoLineUserId,
    /// The recipient has no active push endpoint.
    NoPushEndpoint,
    /// The recipient turned this channel off (for this type or for every type).
    OptedOut,
    /// The recipient's LINE account blocked (unfollowed) the official account, as the
    /// LINE webhook reported.
    LineUnfollowed,
    /// The recipient's email address was refused as nonexistent (SMTP 550 5.1.1).
    EmailUndeliverable,
    /// Over the channel's fatigue cap, and the type drops rather than defers.
    Throttled,
    /// Collected into a digest delivery that an earlier event of the group created.
    Digested,
    /// The delivery's push endpoint was revoked (by the app, or because the provider
    /// said the token is gone) before the delivery was due: skipped at due time.
    EndpointRevoked,
    /// An escalation that was not sent because the notification it escalates was read
    /// (in-app) or clicked (LINE, push) before it was due.
    Read,
    /// A topic event's delivery whose recipient unsubscribed from the topic before it
    /// was due (a scheduled broadcast, a retry, an escalation).
    Unsubscribed,
    /// Email suppressed for this recipient and the type's category: a complaint
    /// (marketing), repeated soft bounces (every category), or an operator in the console.
    Suppressed,
}

impl SkipReason {
    /// Stable snake_case code shown to callers and operators.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::RecipientNotFound => "recipient_not_found",
            SkipReason::NoEmailAddress => "no_email_address",
            SkipReason::NoLineUserId => "no_line_user_id",
            SkipReason::NoPushEndpoint => "no_push_endpoint",
            SkipReason::OptedOut => "opted_out",
            SkipReason::LineUnfollowed => "line_unfollowed",
            SkipReason::EmailUndeliverable => "email_undeliverable",
            SkipReason::Throttled => "throttled",
            SkipReason::Digested => "digested",
            SkipReason::EndpointRevoked => "endpoint_revoked",
            SkipReason::Read => "read_before_escalation",
            SkipReason::Unsubscribed => "unsubscribed",
            SkipReason::Suppressed => "suppressed",
        }
    }
}

/// What the planner needs to know about one recipient.
#[derive(Debug, Clone, Default)]
pub struct RecipientFacts {
    /// The user id as named in the event.
    pub user_id: String,
    /// Whether a `recipients` row exists.
    pub exists: bool,
    /// The user id was erased (`EraseRecipient`) and not registered again: nothing is
    /// planned for it, in-app included.
    pub erased: bool,
    /// Email address, if any.
    pub email: Option<String>,
    /// LINE user id, if any.
    pub line_user_id: Option<String>,
    /// The LINE user blocked the official account (last webhook event was `unfollow`).
    pub line_unfollowed: bool,
    /// When the LINE webhook reported the unfollow (for the fallback trail).
    pub line_unfollowed_at: Option<DateTime<Utc>>,
    /// The email address bounced as nonexistent and has not changed since.
    pub email_undeliverable: bool,
    /// Email of this event's type is suppressed for the user or the address
    /// (`email_suppressions`: a complaint for a marketing type, soft bounces, the console).
    pub email_suppressed: bool,
    /// Active push endpoints: (endpoint id, platform `fcm`/`apns`/`webpush`).
    pub push_endpoints: Vec<(Uuid, String)>,
    /// Preferences for this event's type, per channel.
    pub type_prefs: HashMap<Channel, bool>,
    /// The user's switch for this event's type on every channel (channel `*`).
    pub type_wide_pref: Option<bool>,
    /// Channel-wide preferences (type `*`), per channel.
    pub channel_prefs: HashMap<Channel, bool>,
    /// The recipient's IANA time zone (Asia/Bangkok when unknown).
    pub timezone: Option<chrono_tz::Tz>,
    /// The recipient's quiet hours.
    pub quiet_hours: Vec<QuietWindow>,
}

/// One delivery to write: one recipient on one channel (one endpoint for push).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedDelivery {
    /// Recipient.
    pub user_id: String,
    /// Channel.
    pub channel: Channel,
    /// Provider that will carry it.
    pub provider: Provider,
    /// Push endpoint, for push only.
    pub endpoint_id: Option<Uuid>,
    /// Email address or LINE user id at planning time.
    pub address: Option<String>,
    /// Unique per channel: `<event id>/<user id>/<channel>[/<endpoint id>]`.
    pub idempotency_key: String,
    /// Held later than it is due, by quiet hours (the end of the window), a fatigue cap
    /// (its next free slot) or a digest (the window's close): the first attempt waits
    /// until then. `None` when nothing held it, a scheduled delivery included.
    pub deferred_until: Option<DateTime<Utc>>,
    /// A scheduled event's (or an escalation's) due time: the first attempt waits until
    /// then at least. Not a deferral: `deferred_until` is set only when something holds
    /// the delivery past it.
    pub scheduled_for: Option<DateTime<Utc>>,
    /// The planning decisions behind this delivery, one per line (preference applied,
    /// quiet hours), shown by `GetEvent` and `ExplainDelivery`.
    pub decision: String,
    /// When it counts toward the channel's fatigue cap (set by
    /// [`crate::fatigue::apply_caps`] for capped channels of non-critical types).
    pub throttle_at: Option<DateTime<Utc>>,
    /// Digest group (`<type>/<aggregate key>`; in-app: with `@<window start>`), set by
    /// [`into_digests`].
    pub digest_key: Option<String>,
    /// Why it exists: planned for the event's channels, or derived from another channel
    /// ([`derive`]).
    pub cause: Cause,
    /// For an escalation: the idempotency key of the delivery it escalates, in the same
    /// plan (its id is given when the plan's ids are).
    pub parent_key: Option<String>,
}

impl PlannedDelivery {
    /// When the first attempt may start: the later of `deferred_until` and
    /// `scheduled_for`; `None` = at once.
    pub fn first_attempt_at(&self) -> Option<DateTime<Utc>> {
        self.deferred_until.max(self.scheduled_for)
    }

    /// Holds the delivery until `t` (a digest's close, a fatigue slot), when that is later
    /// than it would start otherwise; else leaves it as it is.
    pub fn hold_until(&mut self, t: DateTime<Utc>) {
        if self.first_attempt_at().is_none_or(|first| t > first) {
            self.deferred_until = Some(t);
        }
    }
}

/// A recipient x channel pair that gets no delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedDelivery {
    /// Recipient.
    pub user_id: String,
    /// Channel.
    pub channel: Channel,
    /// Why.
    pub reason: SkipReason,
    /// The planning decisions behind the skip, one per line.
    pub decision: String,
}

/// Which level of the preference resolution decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreferenceSource {
    /// A critical type (security alert, OTP) ignores opt-outs.
    Critical,
    /// The user's setting for this type on this channel.
    TypeChannel,
    /// The user's switch for this type on every channel.
    TypeWide,
    /// The user's switch for this channel for every type.
    ChannelWide,
    /// Nothing set: the type's default channels are on.
    TypeDefault,
}

/// Preference resolution, in order: a critical type always sends; then the user's
/// setting for this type x channel; then the user's switch for this type (every
/// channel); then the user's switch for this channel (every type); then the type's
/// default, on. Returns whether the channel is on and which level decided.
pub fn resolve_preference(
    critical: bool,
    type_channel: Option<bool>,
    type_wide: Option<bool>,
    channel_wide: Option<bool>,
) -> (bool, PreferenceSource) {
    if critical {
        return (true, PreferenceSource::Critical);
    }
    if let Some(on) = type_channel {
        return (on, PreferenceSource::TypeChannel);
    }
    if let Some(on) = type_wide {
        return (on, PreferenceSource::TypeWide);
    }
    if let Some(on) = channel_wide {
        return (on, PreferenceSource::ChannelWide);
    }
    (true, PreferenceSource::TypeDefault)
}

/// [`resolve_preference`]'s answer alone.
pub fn is_enabled(
    critical: bool,
    type_channel: Option<bool>,
    type_wide: Option<bool>,
    channel_wide: Option<bool>,
) -> bool {
    resolve_preference(critical, type_channel, type_wide, channel_wide).0
}

pub(crate) fn preference_line(on: bool, source: PreferenceSource, channel: Channel) -> String {
    let state = if on { "on" } else { "off" };
    match source {
        PreferenceSource::Critical => "preference: critical type, opt-outs do not apply".into(),
        PreferenceSource::TypeChannel => {
            format!("preference: {state} by the user's setting for this type on {channel}")
        }
        PreferenceSource::TypeWide => {
            format!("preference: {state} by the user's switch for this type on every channel")
        }
        PreferenceSource::ChannelWide => {
            format!("preference: {state} by the user's switch for {channel} on every type")
        }
        PreferenceSource::TypeDefault => {
            "preference: on by the type's default channels (nothing set by the user)".into()
        }
    }
}

/// The channels an event uses: the type's defaults, narrowed to `requested` when it is
/// not empty. A requested channel outside the defaults is a violation of `channels[i]`.
pub fn effective_channels(
    defaults: &[Channel],
    requested: &[Channel],
    requested_names: &[String],
    type_key: &str,
) -> Result<Vec<Channel>, Vec<FieldViolation>> {
    if requested.is_empty() {
        let mut d = defaults.to_vec();
        d.sort();
        d.dedup();
        return Ok(d);
    }
    let errs: Vec<FieldViolation> = requested_names
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let ch = name.parse::<Channel>().ok()?;
            (!defaults.contains(&ch)).then(|| {
                FieldViolation::new(
                    format!("channels[{i}]"),
                    format!("channel {ch} is not a default channel of type {type_key:?}"),
                )
            })
        })
        .collect();
    if errs.is_empty() {
        Ok(requested.to_vec())
    } else {
        Err(errs)
    }
}

/// Plans the deliveries of one event at `now`. Recipients keep the event's order;
/// channels the given order. Pure: ids come from `event_id` and the facts. A delivery
/// created inside the recipient's quiet hours is deferred to the window's end unless the
/// type is critical; in-app is never deferred.
///
/// `scheduled`: the event is due later and `now` is its due time (the writer passes
/// `max(database now, send_at)`), so quiet hours are those of the sending time. Every
/// delivery then waits until `now` at least (`deferred_until`, trail "scheduled for
/// <time>"), and a channel the user has turned off is not skipped: the delivery is
/// written, its trail says "preference: off now; decided again when due at <time>", and
/// the worker decides the preference again when it is due. The same holds for a LINE user
/// who unfollowed and an email address marked undeliverable: either may change before
/// the due time, so the rules at due time decide (and a fallback, if the type has one,
/// is created then).
pub fn plan(
    event_id: Uuid,
    critical: bool,
    channels: &[Channel],
    recipients: &[RecipientFacts],
    now: DateTime<Utc>,
    scheduled: bool,
) -> (Vec<PlannedDelivery>, Vec<SkippedDelivery>) {
    let due_text = now.to_rfc3339();
    let mut planned = Vec::new();
    let mut skipped = Vec::new();
    for r in recipients {
        for &channel in channels {
            let (on, source) = resolve_preference(
                critical,
                r.type_prefs.get(&channel).copied(),
                r.type_wide_pref,
                r.channel_prefs.get(&channel).copied(),
            );
            let mut decision = preference_line(on, source, channel);
            if scheduled {
                if !on {
                    let by = decision.trim_start_matches("preference: off ");
                    decision =
                        format!("preference: off now; decided again when due at {due_text} ({by})");
                }
                decision.push_str(&format!("\nscheduled for {due_text}"));
            }
            let skip = |reason: SkipReason, decision: &str| SkippedDelivery {
                user_id: r.user_id.clone(),
                channel,
                reason,
                decision: decision.to_string(),
            };
            let key = format!("{event_id}/{}/{channel}", r.user_id);
            if !on && !scheduled {
                skipped.push(skip(SkipReason::OptedOut, &decision));
                continue;
            }
            let tz = r.timezone.unwrap_or(chrono_tz::Asia::Bangkok);
            let deferred_until = quiet_until(now, tz, &r.quiet_hours, channel);
            let deferred_until = match deferred_until {
                Some(_) if critical => {
                    decision.push_str("\nquiet hours: critical type, not deferred");
                    None
                }
                Some(t) => {
                    decision.push_str(&format!(
                        "\nquiet hours ({tz}): deferred until {}",
                        t.to_rfc3339()
                    ));
                    Some(t)
                }
                None => None,
            };
            // A scheduled delivery waits until its due time (`scheduled_for`); quiet hours
            // at that time hold it until the window's end, later.
            let deferred_until = deferred_until.map(|t| t.max(now)).filter(|t| *t > now);
            let scheduled_for = scheduled.then_some(now);
            if !r.exists && (channel != Channel::InApp || r.erased) {
                let mut decision = decision.clone();
                if r.erased {
                    decision.push_str("\nrecipient: erased, not registered again");
                }
                skipped.push(skip(SkipReason::RecipientNotFound, &decision));
                continue;
            }
            let one = |provider, address: Option<&String>| PlannedDelivery {
                user_id: r.user_id.clone(),
                channel,
                provider,
                endpoint_id: None,
                address: address.cloned(),
                idempotency_key: key.clone(),
                deferred_until,
                scheduled_for,
                decision: decision.clone(),
                throttle_at: None,
                digest_key: None,
                cause: Cause::Planned,
                parent_key: None,
            };
            match channel {
                Channel::InApp => planned.push(one(Provider::Inbox, None)),
                Channel::Email => match &r.email {
                    Some(addr) if r.email_undeliverable && scheduled => {
                        let mut d = one(Provider::Smtp, Some(addr));
                        d.decision.push_str(
                            "\nemail: the address is marked undeliverable now; decided again when due",
                        );
                        planned.push(d)
                    }
                    Some(_) if r.email_undeliverable => {
                        skipped.push(skip(SkipReason::EmailUndeliverable, &decision))
                    }
                    Some(addr) if r.email_suppressed && !critical && scheduled => {
                        let mut d = one(Provider::Smtp, Some(addr));
                        d.decision
                            .push_str("\nemail: suppressed now; decided again when due");
                        planned.push(d)
                    }
                    Some(_) if r.email_suppressed && !critical => {
                        skipped.push(skip(SkipReason::Suppressed, &decision))
                    }
                    Some(addr) => planned.push(one(Provider::Smtp, Some(addr))),
                    None => skipped.push(skip(SkipReason::NoEmailAddress, &decision)),
                },
                Channel::Line => match &r.line_user_id {
                    Some(id) if r.line_unfollowed && scheduled => {
                        let mut d = one(Provider::Line, Some(id));
                        d.decision.push_str(
                            "\nLINE: the user has unfollowed the account now; decided again when due",
                        );
                        planned.push(d)
                    }
                    Some(_) if r.line_unfollowed => {
                        skipped.push(skip(SkipReason::LineUnfollowed, &decision))
                    }
                    Some(id) => planned.push(one(Provider::Line, Some(id))),
                    None => skipped.push(skip(SkipReason::NoLineUserId, &decision)),
                },
                Channel::Push => {
                    let mut any = false;
                    for (endpoint_id, platform) in &r.push_endpoints {
                        let Some(provider) = Provider::for_push_platform(platform) else {
                            continue;
                        };
                        any = true;
                        planned.push(PlannedDelivery {
                            user_id: r.user_id.clone(),
                            channel,
                            provider,
                            endpoint_id: Some(*endpoint_id),
                            address: None,
                            idempotency_key: format!("{key}/{endpoint_id}"),
                            deferred_until,
                            scheduled_for,
                            decision: format!(
                                "{decision}\nendpoint: {platform} {endpoint_id}, active"
                            ),
                            throttle_at: None,
                            digest_key: None,
                            cause: Cause::Planned,
                            parent_key: None,
                        });
                    }
                    if !any {
                        skipped.push(skip(SkipReason::NoPushEndpoint, &decision));
                    }
                }
            }
        }
    }
    (planned, skipped)
}

/// The digest window holding `now` for a window of `window_s` seconds: `[k*W, (k+1)*W)`
/// seconds since the Unix epoch, in UTC. Returns (start, end).
pub fn digest_window(now: DateTime<Utc>, window_s: i64) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = crate::event::dedup_bucket(now, window_s);
    (start, start + chrono::Duration::seconds(window_s.max(1)))
}

/// Turns one event's plan into digest deliveries for the group `<type>/<aggregate>` in
/// the window `[start, end)`: each non-in-app delivery gets the group's key for its user,
/// channel (and endpoint) and window, so every event of the group in the window lands on
/// the same delivery, due at `end`. In-app deliveries stay immediate and carry the group
/// and window, so the inbox shows one item updated in place.
pub fn into_digests(
    planned: Vec<PlannedDelivery>,
    type_key: &str,
    aggregate_key: &str,
    (start, end): (DateTime<Utc>, DateTime<Utc>),
) -> Vec<PlannedDelivery> {
    let group = format!("{type_key}/{aggregate_key}");
    let at = start.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    planned
        .into_iter()
        .map(|mut d| {
            // An escalation keeps its own key and due time (it is sent alone, if at all).
            if d.cause == Cause::Escalation {
                return d;
            }
            if d.channel == Channel::InApp {
                d.digest_key = Some(format!("{group}@{at}"));
                d.decision
                    .push_str(&format!("\ndigest: one in-app item for {group} since {at}"));
                return d;
            }
            d.idempotency_key = format!(
                "digest/{group}/{}/{}{}@{at}",
                d.user_id,
                d.channel,
                d.endpoint_id.map(|e| format!("/{e}")).unwrap_or_default()
            );
            d.hold_until(end);
            d.digest_key = Some(group.clone());
            d.decision.push_str(&format!(
                "\ndigest: collects {group} until {}",
                end.to_rfc3339()
            ));
            d
        })
        .collect()
}

/// Most LINE users per multicast call (LINE Messaging API reference, "Send multicast
/// message": `to` holds up to 500 user ids).
pub const LINE_MULTICAST_MAX: usize = 500;

/// Replaces the per-recipient LINE deliveries in `planned` with multicast batches of up
/// to [`LINE_MULTICAST_MAX`] LINE user ids, in order. Each batch is one delivery: provider
/// `line_multicast`, `address` = the ids joined with `,`, `user_id` =
/// `line-multicast:<first user>+<others>`, idempotency key
/// `<event id>/line-multicast/<page>/<n>`. `page` names this planning run (the fan-out
/// page's cursor), so planning the same page again yields the same keys. Other deliveries,
/// and LINE deliveries deferred by quiet hours or a fatigue cap, are kept as they are,
/// before the batches. A batch does not count toward the users' fatigue caps.
///
/// `due`: a scheduled event's due time. LINE deliveries waiting exactly until then are
/// batched too, and each batch waits until then.
pub fn merge_line_multicast(
    event_id: Uuid,
    page: &str,
    planned: Vec<PlannedDelivery>,
    due: Option<DateTime<Utc>>,
) -> Vec<PlannedDelivery> {
    // Deliveries held by quiet hours or a fatigue cap keep their own time and go alone.
    let (line, mut out): (Vec<_>, Vec<_>) = planned.into_iter().partition(|d| {
        d.provider == Provider::Line && d.deferred_until.is_none() && d.scheduled_for == due
    });
    for (n, batch) in line.chunks(LINE_MULTICAST_MAX).enumerate() {
        let ids: Vec<&str> = batch.iter().filter_map(|d| d.address.as_deref()).collect();
        out.push(PlannedDelivery {
            user_id: format!("line-multicast:{}+{}", batch[0].user_id, batch.len() - 1),
            channel: Channel::Line,
            provider: Provider::LineMulticast,
            endpoint_id: None,
            address: Some(ids.join(",")),
            idempotency_key: format!("{event_id}/line-multicast/{page}/{n}"),
            deferred_until: None,
            scheduled_for: due,
            decision: match due {
                Some(t) => format!(
                    "line multicast: {} LINE users in one call\nscheduled for {}",
                    batch.len(),
                    t.to_rfc3339()
                ),
                None => format!("line multicast: {} LINE users in one call", batch.len()),
            },
            throttle_at: None,
            digest_key: None,
            cause: Cause::Planned,
            parent_key: None,
        });
    }
    out
}

mod derived;
pub use derived::{
    Cause, Derivation, Escalation, MAX_ESCALATION_SECONDS, derive, fallback_after, unreachable_line,
};

#[cfg(test)]
mod tests;
