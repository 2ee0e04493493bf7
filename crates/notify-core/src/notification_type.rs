//! What a notification type says about its notifications: priority, category and the
//! sensitive-data policy (columns of `notification_types`; the allowed names are the
//! `CHECK` constraints of `migrations/`).

use crate::named::named_enum;

named_enum! {
    /// How urgent a type's notifications are (`notification_types.priority`). Drives the
    /// APNs priority, FCM's Android priority and Web Push `Urgency`.
    #[derive(Default)]
    pub enum Priority("priority") {
        /// May wait: APNs priority 5, FCM `normal`, Web Push `Urgency: low`.
        Low = "low",
        /// The default (the column's).
        #[default]
        Normal = "normal",
        /// Deliver at once: FCM `high`, Web Push `Urgency: high`.
        High = "high",
    }
}

named_enum! {
    /// What a type's notifications are for (`notification_types.category`).
    #[derive(Default)]
    pub enum Category("category") {
        /// Caused by something the user did or must know (receipts, security alerts).
        /// The default (the column's).
        #[default]
        Transactional = "transactional",
        /// Promotional: email carries `List-Unsubscribe` (RFC 8058).
        Marketing = "marketing",
    }
}

named_enum! {
    /// What ingest does with sensitive data (national ids, card numbers: see
    /// [`crate::guard`]) found in an event of a type (`notification_types.sensitive_data`).
    #[derive(Default)]
    pub enum SensitiveData("sensitive_data policy") {
        /// Refuse the event. The default (the column's).
        #[default]
        Reject = "reject",
        /// Store the event with the values masked.
        Mask = "mask",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_named_in_the_error() {
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>().unwrap(), *p);
        }
        for c in Category::ALL {
            assert_eq!(c.to_string().parse::<Category>().unwrap(), *c);
        }
        for s in SensitiveData::ALL {
            assert_eq!(s.as_str().parse::<SensitiveData>().unwrap(), *s);
        }
        let err = "urgent".parse::<Priority>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown priority \"urgent\": expected one of low, normal, high"
        );
        assert!("allow".parse::<SensitiveData>().is_err());
    }

    #[test]
    fn defaults_are_the_columns_defaults_and_serde_uses_the_names() {
        assert_eq!(Priority::default(), Priority::Normal);
        assert_eq!(Category::default(), Category::Transactional);
        assert_eq!(SensitiveData::default(), SensitiveData::Reject);
        assert_eq!(
            serde_json::to_string(&Category::Marketing).unwrap(),
            "\"marketing\""
        );
        assert_eq!(
            serde_json::from_str::<Priority>("\"high\"").unwrap(),
            Priority::High
        );
        assert!(serde_json::from_str::<Priority>("\"HIGH\"").is_err());
    }
}
