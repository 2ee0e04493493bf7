//! Stored states that are not a delivery's status ([`crate::channel::DeliveryStatus`]) nor
//! an inbox item's or a fan-out's ([`crate::status`]): the label of an attempt, why a
//! delivery failed without a provider's verdict, a push endpoint's state and a status
//! webhook message's. Each is written from Rust as its enum, and the database's CHECK
//! constraint on its column lists exactly [`NAMES`](AttemptLabel::NAMES) of the enum
//! (migration `20261207000042_state_checks.sql`; the store's `state_checks` test keeps
//! the two equal).

use crate::named::named_enum;

named_enum! {
    /// The outcome stored on an attempt (`delivery_attempts.outcome`), derived from the
    /// delivery's next state after it.
    pub enum AttemptLabel("attempt outcome") {
        /// The provider accepted.
        Sent = "sent",
        /// Not accepted; the delivery waits for another attempt (a retry, a paused
        /// channel, a lease lost before the record).
        Retry = "retry",
        /// Not accepted, and the delivery ended `failed`.
        Failed = "failed",
    }
}

named_enum! {
    /// Why a delivery failed, where the runtime (not a provider's verdict) ended it or
    /// counted its end: the `reason` label of `notify_deliveries_failed_total`, the
    /// `reason` log field of a `delivery_failed` alert, the cause of its fallback, and
    /// the `error_code` (or `last_error` prefix) written with it.
    pub enum FailReason("fail reason") {
        /// An attempt's own failure ended it: a permanent error, an invalid endpoint, or
        /// a transient one when the attempt budget or retry horizon was spent (the
        /// attempt's `error_code` says which; the metric's reason is that code's class).
        AttemptFailed = "failed",
        /// The worker died or froze during the attempt (its lease expired) and that was
        /// its last attempt; the provider may or may not have been called.
        WorkerLost = "worker_lost",
        /// The claim found every attempt spent (the last ones by workers that died during
        /// the call) and failed it without calling the provider again.
        AttemptsSpent = "attempts_spent",
        /// The attempt's full record was refused by the database: the delivery was ended
        /// instead of being sent again.
        RecordFailed = "record_failed",
        /// The delivery reached the queue of a channel that is not its own.
        UnsupportedChannel = "unsupported_channel",
    }
}

named_enum! {
    /// Whether a push endpoint may be sent to (`notification_endpoints.status`).
    pub enum EndpointStatus("endpoint status") {
        /// Registered and usable.
        Active = "active",
        /// Given up: the provider said the token is gone, or its owner removed it
        /// (`revoked_reason`, `revoked_at`).
        Revoked = "revoked",
    }
}

named_enum! {
    /// States of a status webhook message (`webhook_messages.status`): the delivery
    /// states a POST can be in.
    pub enum MessageStatus("webhook message status") {
        /// Waiting for its next POST (`next_attempt_at`).
        Pending = "pending",
        /// Claimed by the webhook worker holding a lease.
        Sending = "sending",
        /// The receiver answered 2xx. Final.
        Sent = "sent",
        /// Out of attempts, or its endpoint was disabled. Final.
        Failed = "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in AttemptLabel::ALL {
            assert_eq!(s.as_str().parse::<AttemptLabel>().unwrap(), *s);
        }
        for s in FailReason::ALL {
            assert_eq!(s.as_str().parse::<FailReason>().unwrap(), *s);
        }
        for s in EndpointStatus::ALL {
            assert_eq!(s.as_str().parse::<EndpointStatus>().unwrap(), *s);
        }
        for s in MessageStatus::ALL {
            assert_eq!(s.as_str().parse::<MessageStatus>().unwrap(), *s);
        }
        assert!("disabled".parse::<EndpointStatus>().is_err());
    }
}
