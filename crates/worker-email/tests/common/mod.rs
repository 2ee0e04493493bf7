//! Shared by the adapter's integration tests: the settings of a sender for the simulator's
//! SMTP servers, and a job addressed to one mailbox.

use std::time::Duration;
use worker_email::EmailConfig;

/// A sender's settings for `smtp_url` (one URL, or several comma-joined in failover
/// order), with default breakers, no SES credentials, the test sender address and a
/// 2-second exchange deadline; tests change what they exercise.
pub(crate) fn config(smtp_url: String) -> EmailConfig {
    EmailConfig {
        breaker: Default::default(),
        ses_credentials: None,
        smtp_url,
        from: "Notify <noreply@example.test>".parse().unwrap(),
        message_id_domain: "example.test".into(),
        timeout: Duration::from_secs(2),
        unsubscribe_url: "https://notify.example.test/unsubscribe".into(),
        unsubscribe_secret: "adapter-test-unsubscribe-secret".into(),
        layout: Default::default(),
    }
}

/// An email job of the test helpers' delivery, to `address`.
pub(crate) fn mail_to(address: &str) -> notify_worker::Job {
    let mut j = notify_worker::testing::job("email", "smtp");
    j.endpoint_id = None;
    j.address = Some(address.into());
    j
}
