//! Channels, providers and the delivery state machine's states.

use crate::named::named_enum;
use std::fmt;
use std::str::FromStr;

/// A way of reaching a person. Each channel has its own queue and worker binary.
/// Serialised as its name (`"email"`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    /// The in-app inbox (`notifications` table).
    #[serde(rename = "inapp")]
    InApp,
    /// Email over SMTP.
    Email,
    /// Mobile and browser push (FCM, APNs, Web Push), one delivery per endpoint.
    Push,
    /// LINE Messaging API push message.
    Line,
}

impl Channel {
    /// Every channel, in a stable order.
    pub const ALL: [Channel; 4] = [Channel::InApp, Channel::Email, Channel::Push, Channel::Line];

    /// Canonical lowercase name, used in the API, the database and routing keys.
    pub const fn as_str(self) -> &'static str {
        match self {
            Channel::InApp => "inapp",
            Channel::Email => "email",
            Channel::Push => "push",
            Channel::Line => "line",
        }
    }

    /// Name of the channel's RabbitMQ queue, `deliveries.<channel>`.
    pub fn queue(self) -> String {
        format!("deliveries.{}", self.as_str())
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text is not one of `inapp`, `email`, `push`, `line`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown channel {0:?}: expected one of inapp, email, push, line")]
pub struct UnknownChannel(pub String);

impl FromStr for Channel {
    type Err = UnknownChannel;

    /// Case-insensitive; `in_app` and `in-app` are accepted for `inapp`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "inapp" | "in_app" | "in-app" => Ok(Channel::InApp),
            "email" => Ok(Channel::Email),
            "push" => Ok(Channel::Push),
            "line" => Ok(Channel::Line),
            _ => Err(UnknownChannel(s.to_string())),
        }
    }
}

named_enum! {
    /// Who carries a delivery on its channel, as stored in
    /// `notification_deliveries.provider`.
    pub enum Provider("provider") {
        /// Our own inbox table.
        Inbox = "inbox",
        /// An SMTP relay.
        Smtp = "smtp",
        /// LINE Messaging API.
        Line = "line",
        /// Firebase Cloud Messaging HTTP v1.
        Fcm = "fcm",
        /// Apple Push Notification service.
        Apns = "apns",
        /// A Web Push service (RFC 8030).
        WebPush = "webpush",
        /// LINE Messaging API multicast: one call for up to 500 LINE users.
        LineMulticast = "line_multicast",
    }
}

impl Provider {
    /// The provider of a push endpoint platform (`fcm`, `apns`, `webpush`).
    pub fn for_push_platform(platform: &str) -> Option<Provider> {
        match platform.parse() {
            Ok(p @ (Provider::Fcm | Provider::Apns | Provider::WebPush)) => Some(p),
            _ => None,
        }
    }
}

named_enum! {
    /// States of a delivery (see the state machine in docs/ARCHITECTURE.md), as stored in
    /// `notification_deliveries.status`.
    pub enum DeliveryStatus("delivery status") {
        /// Waiting for its next attempt (`next_attempt_at`).
        Pending = "pending",
        /// Claimed by a worker holding a lease.
        Sending = "sending",
        /// The provider accepted it. Final.
        Sent = "sent",
        /// Permanently failed or out of attempts. Final.
        Failed = "failed",
        /// Canceled before it was sent. Final.
        Canceled = "canceled",
        /// The rules at its due time said it may not go out (preference off, LINE
        /// unfollowed, endpoint revoked, address undeliverable): ended without a provider
        /// call; `last_error` holds the skip reason code, the trail says why and when.
        /// Final.
        Skipped = "skipped",
    }
}

impl DeliveryStatus {
    /// True for sent, failed, canceled and skipped: nothing will change any more.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            DeliveryStatus::Sent
                | DeliveryStatus::Failed
                | DeliveryStatus::Canceled
                | DeliveryStatus::Skipped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_round_trip_and_aliases_parse() {
        for c in Channel::ALL {
            assert_eq!(c.as_str().parse::<Channel>().unwrap(), c);
        }
        assert_eq!("IN_APP".parse::<Channel>().unwrap(), Channel::InApp);
        assert_eq!(" Line ".parse::<Channel>().unwrap(), Channel::Line);
        let err = "fax".parse::<Channel>().unwrap_err();
        assert!(err.to_string().contains("\"fax\""));
    }

    #[test]
    fn only_sent_failed_canceled_skipped_are_final() {
        let finals: Vec<_> = [
            "pending", "sending", "sent", "failed", "canceled", "skipped",
        ]
        .iter()
        .map(|s| s.parse::<DeliveryStatus>().unwrap())
        .filter(|s| s.is_final())
        .map(|s| s.as_str())
        .collect();
        assert_eq!(finals, ["sent", "failed", "canceled", "skipped"]);
        let err = "queued".parse::<DeliveryStatus>().unwrap_err();
        assert_eq!(err.value, "queued");
        assert!(err.to_string().contains("\"queued\""), "{err}");
    }

    #[test]
    fn provider_names_round_trip_and_push_platforms_map() {
        for p in Provider::ALL {
            assert_eq!(p.as_str().parse::<Provider>().unwrap(), *p);
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!(
            Provider::for_push_platform("webpush"),
            Some(Provider::WebPush)
        );
        assert_eq!(Provider::for_push_platform("line"), None);
        assert_eq!(
            serde_json::to_string(&Provider::LineMulticast).unwrap(),
            "\"line_multicast\""
        );
        assert!(
            "LINE".parse::<Provider>().is_err(),
            "stored names are exact"
        );
    }
}
