//! Who gets what: turns an event, its type and the recipients' facts into planned
//! deliveries and skipped recipient x channel pairs.

use crate::channel::{Channel, Provider};
use crate::validate::FieldViolation;
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
    /// Email address, if any.
    pub email: Option<String>,
    /// LINE user id, if any.
    pub line_user_id: Option<String>,
    /// The LINE user blocked the official account (last webhook event was `unfollow`).
    pub line_unfollowed: bool,
    /// The email address bounced as nonexistent and has not changed since.
    pub email_undeliverable: bool,
    /// Active push endpoints: (endpoint id, platform `fcm`/`apns`/`webpush`).
    pub push_endpoints: Vec<(Uuid, String)>,
    /// Preferences for this event's type, per channel.
    pub type_prefs: HashMap<Channel, bool>,
    /// Channel-wide preferences (type `*`), per channel.
    pub channel_prefs: HashMap<Channel, bool>,
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
}

/// Preference resolution, in order: a critical type always sends; then the user's
/// setting for this type x channel; then the user's channel-wide setting; then on.
pub fn is_enabled(critical: bool, type_pref: Option<bool>, channel_pref: Option<bool>) -> bool {
    critical || type_pref.or(channel_pref).unwrap_or(true)
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

/// Plans the deliveries of one event. Recipients keep the event's order; channels the
/// given order. Pure: ids come from `event_id` and the facts.
pub fn plan(
    event_id: Uuid,
    critical: bool,
    channels: &[Channel],
    recipients: &[RecipientFacts],
) -> (Vec<PlannedDelivery>, Vec<SkippedDelivery>) {
    let mut planned = Vec::new();
    let mut skipped = Vec::new();
    for r in recipients {
        for &channel in channels {
            let skip = |reason| SkippedDelivery {
                user_id: r.user_id.clone(),
                channel,
                reason,
            };
            let key = format!("{event_id}/{}/{channel}", r.user_id);
            if !is_enabled(
                critical,
                r.type_prefs.get(&channel).copied(),
                r.channel_prefs.get(&channel).copied(),
            ) {
                skipped.push(skip(SkipReason::OptedOut));
                continue;
            }
            if channel != Channel::InApp && !r.exists {
                skipped.push(skip(SkipReason::RecipientNotFound));
                continue;
            }
            let one = |provider, address: Option<&String>| PlannedDelivery {
                user_id: r.user_id.clone(),
                channel,
                provider,
                endpoint_id: None,
                address: address.cloned(),
                idempotency_key: key.clone(),
            };
            match channel {
                Channel::InApp => planned.push(one(Provider::Inbox, None)),
                Channel::Email => match &r.email {
                    Some(_) if r.email_undeliverable => {
                        skipped.push(skip(SkipReason::EmailUndeliverable))
                    }
                    Some(addr) => planned.push(one(Provider::Smtp, Some(addr))),
                    None => skipped.push(skip(SkipReason::NoEmailAddress)),
                },
                Channel::Line => match &r.line_user_id {
                    Some(_) if r.line_unfollowed => skipped.push(skip(SkipReason::LineUnfollowed)),
                    Some(id) => planned.push(one(Provider::Line, Some(id))),
                    None => skipped.push(skip(SkipReason::NoLineUserId)),
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
                        });
                    }
                    if !any {
                        skipped.push(skip(SkipReason::NoPushEndpoint));
                    }
                }
            }
        }
    }
    (planned, skipped)
}

/// Most LINE users per multicast call (LINE Messaging API reference, "Send multicast
/// message": `to` holds up to 500 user ids).
pub const LINE_MULTICAST_MAX: usize = 500;

/// Replaces the per-recipient LINE deliveries in `planned` with multicast batches of up
/// to [`LINE_MULTICAST_MAX`] LINE user ids, in order. Each batch is one delivery: provider
/// `line_multicast`, `address` = the ids joined with `,`, `user_id` =
/// `line-multicast:<first user>+<others>`, idempotency key
/// `<event id>/line-multicast/<page>/<n>`. `page` names this planning run (the fan-out
/// page's cursor), so planning the same page again yields the same keys. Other deliveries
/// are kept as they are, before the batches.
pub fn merge_line_multicast(
    event_id: Uuid,
    page: &str,
    planned: Vec<PlannedDelivery>,
) -> Vec<PlannedDelivery> {
    let (line, mut out): (Vec<_>, Vec<_>) = planned
        .into_iter()
        .partition(|d| d.provider == Provider::Line);
    for (n, batch) in line.chunks(LINE_MULTICAST_MAX).enumerate() {
        let ids: Vec<&str> = batch.iter().filter_map(|d| d.address.as_deref()).collect();
        out.push(PlannedDelivery {
            user_id: format!("line-multicast:{}+{}", batch[0].user_id, batch.len() - 1),
            channel: Channel::Line,
            provider: Provider::LineMulticast,
            endpoint_id: None,
            address: Some(ids.join(",")),
            idempotency_key: format!("{event_id}/line-multicast/{page}/{n}"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn preference_resolution_order() {
        assert!(is_enabled(true, Some(false), Some(false)), "critical wins");
        assert!(
            !is_enabled(false, Some(false), Some(true)),
            "type x channel beats channel-wide"
        );
        assert!(is_enabled(false, Some(true), Some(false)));
        assert!(
            !is_enabled(false, None, Some(false)),
            "channel-wide beats default"
        );
        assert!(is_enabled(false, None, None), "default on");
    }

    #[test]
    fn one_delivery_per_channel_and_per_push_endpoint() {
        let ev = Uuid::from_u128(9);
        let (p, s) = plan(ev, false, &Channel::ALL, &[somchai()]);
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
        let (planned, _) = plan(ev, false, &[Channel::InApp, Channel::Line], &users);
        let merged = merge_line_multicast(ev, "u0000", planned);
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
        let again = merge_line_multicast(ev, "u0000", plan(ev, false, &[Channel::Line], &users).0);
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
            let (p, s) = plan(Uuid::from_u128(9), critical, &[Channel::Line], &[r.clone()]);
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
        let (p, s) = plan(Uuid::nil(), false, &Channel::ALL, &[r, unknown]);
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
        let (p, s) = plan(Uuid::nil(), true, &[Channel::Email], &[r]);
        assert_eq!(p.len(), 1);
        assert!(s.is_empty());
    }

    #[test]
    fn requested_channels_must_be_type_defaults() {
        let defaults = [Channel::InApp, Channel::Email];
        let names = vec!["email".to_string(), "line".to_string()];
        let errs = effective_channels(&defaults, &[Channel::Email, Channel::Line], &names, "t")
            .unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "channels[1]");
        assert_eq!(
            effective_channels(&defaults, &[], &[], "t").unwrap(),
            [Channel::InApp, Channel::Email]
        );
    }
}
