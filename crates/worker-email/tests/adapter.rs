//! The email adapter called directly (no broker, no database) against the simulator's
//! SMTP server on port 0, through a table of answers (the recipient's local part chooses
//! the server's answer, see `provider_sim::smtp`): each maps to one typed outcome.

use common::mail_to;
use notify_core::ErrorClass::*;
use notify_worker::ChannelSender;
use notify_worker::testing::{Expect, Sim, lease, sent_id};
use std::time::Duration;
use worker_email::{EmailConfig, EmailSender};

mod common;

/// The exchange's deadline here; the stalling server answers later than it.
const TIMEOUT: Duration = Duration::from_millis(500);

fn sender(sim: &Sim) -> EmailSender {
    EmailSender::new(EmailConfig {
        timeout: TIMEOUT,
        ..common::config(sim.smtp_url.clone())
    })
    .unwrap()
}

#[tokio::test]
async fn every_smtp_answer_maps_to_its_typed_outcome() {
    let sim = Sim::start().await;
    let email = sender(&sim);

    let ok = email.send(&mail_to("somchai@example.test"), &lease()).await;
    assert!(sent_id(&ok).is_some_and(|id| id.is_some()), "{ok:?}");
    assert_eq!(ok.provider_status, Some(250));
    assert_eq!(sim.smtp.messages().len(), 1);

    let table = [
        (
            "550 mailbox does not exist",
            "nouser@example.test",
            Expect::failed(InvalidEndpoint, "address_undeliverable", Some(550)),
        ),
        (
            "452 mailbox full (transient)",
            "full@example.test",
            Expect::failed(Transient, "smtp_transient", Some(452)),
        ),
        (
            "554 refused by policy",
            "blocked@example.test",
            Expect::failed(Permanent, "smtp_rejected", Some(554)),
        ),
        (
            "no answer after the data (timeout)",
            "stall@example.test",
            Expect::failed(Transient, "smtp_timeout", None).ambiguous(),
        ),
        (
            "malformed address: no call at all",
            "not an address",
            Expect::failed(Permanent, "invalid_address", None),
        ),
    ];
    for (row, to, want) in &table {
        want.check(row, &email.send(&mail_to(to), &lease()).await);
    }
    assert_eq!(sim.smtp.messages().len(), 1, "only the first was accepted");
}
