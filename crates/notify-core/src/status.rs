//! States of stored rows other than deliveries (those are
//! [`crate::channel::DeliveryStatus`]): an inbox item's and a topic event's fan-out.

use crate::named::named_enum;

named_enum! {
    /// Where an in-app notification stands for its user (`notifications.status`).
    pub enum InboxStatus("inbox status") {
        /// Not seen yet (the default; a digest update makes a row unread again).
        Unread = "unread",
        /// Seen.
        Read = "read",
        /// Put away: listed only when asked for.
        Archived = "archived",
    }
}

named_enum! {
    /// How far a topic event's fan-out to its subscribers has come
    /// (`notification_events.fanout_status`).
    pub enum FanoutStatus("fan-out status") {
        /// Not a topic event: nothing to fan out.
        None = "none",
        /// Subscribers remain to be planned.
        Pending = "pending",
        /// Every subscriber was planned.
        Done = "done",
        /// The event was canceled while subscribers remained: the fan-out stopped at its
        /// checkpoint and plans no one else.
        Canceled = "canceled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_serialise_as_stored() {
        for s in InboxStatus::ALL {
            assert_eq!(s.as_str().parse::<InboxStatus>().unwrap(), *s);
        }
        for s in FanoutStatus::ALL {
            assert_eq!(s.as_str().parse::<FanoutStatus>().unwrap(), *s);
        }
        assert_eq!(
            serde_json::to_string(&InboxStatus::Archived).unwrap(),
            "\"archived\""
        );
        let err = "deleted".parse::<InboxStatus>().unwrap_err();
        assert!(err.to_string().contains("\"deleted\""), "{err}");
    }
}
