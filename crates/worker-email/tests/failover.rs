//! Provider failover called directly (no broker, no database): two simulators' SMTP
//! servers, or an SMTP server and the simulator's SES, in `NOTIFY_SMTP_URL` order.

use common::mail_to;
use notify_core::ErrorClass::*;
use notify_worker::ChannelSender;
use notify_worker::testing::{Expect, Sim, lease, sent_id};
use std::time::Duration;
use worker_email::breaker::{BreakerConfig, State};
use worker_email::{EmailConfig, EmailSender};

mod common;

fn sender(urls: String, breaker: BreakerConfig) -> EmailSender {
    EmailSender::new(EmailConfig {
        breaker,
        ses_credentials: Some(("AKIDEXAMPLE".into(), "ses-test-secret".into())),
        ..common::config(urls)
    })
    .unwrap()
}

/// Moves Tokio's clock, which the breakers read, `by` forward at once; it runs on from
/// there (the test's runtime is current-thread, which pausing needs).
async fn advance(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}

fn host_port(url: &str) -> String {
    url.trim_start_matches("smtp://").to_string()
}

#[tokio::test]
async fn a_relay_answering_421_fails_over_opens_its_breaker_and_is_used_again_after_the_cooldown() {
    let (primary, secondary) = (Sim::start().await, Sim::start().await);
    let cooldown = Duration::from_secs(30);
    let email = sender(
        format!("{},{}", primary.smtp_url, secondary.smtp_url),
        BreakerConfig {
            failures: 2,
            cooldown,
            ..Default::default()
        },
    );
    let p_name = host_port(&primary.smtp_url);
    let s_name = host_port(&secondary.smtp_url);
    primary
        .smtp
        .set_fault(Some("421 4.3.2 service not available"));

    // The first two attempts try the primary (421 at MAIL FROM: nothing accepted) and go
    // out through the secondary within the same attempt.
    for i in 1..=2 {
        let out = email.send(&mail_to("somchai@example.test"), &lease()).await;
        assert!(sent_id(&out).is_some(), "{out:?}");
        assert_eq!(out.content["provider"], s_name.as_str());
        assert_eq!(primary.smtp.mail_commands(), i);
        assert_eq!(secondary.smtp.messages().len(), i);
    }
    assert_eq!(
        email.providers().states(),
        [
            (p_name.as_str(), State::Open),
            (s_name.as_str(), State::Closed)
        ]
    );
    // Open: the primary is not even tried, a second before the cooldown ends (the real
    // time this test takes meanwhile is far less than that second).
    primary.smtp.set_fault(None);
    advance(cooldown - Duration::from_secs(1)).await;
    let out = email.send(&mail_to("somchai@example.test"), &lease()).await;
    assert_eq!(out.content["provider"], s_name.as_str());
    assert_eq!(primary.smtp.mail_commands(), 2);

    // After the cooldown, the next attempt probes the (recovered) primary and closes it.
    advance(Duration::from_secs(1)).await;
    let out = email.send(&mail_to("somchai@example.test"), &lease()).await;
    assert!(sent_id(&out).is_some(), "{out:?}");
    assert_eq!(
        out.content["provider"],
        p_name.as_str(),
        "the primary's probe"
    );
    assert_eq!(primary.smtp.messages().len(), 1);
    assert_eq!(email.providers().states()[0].1, State::Closed);
}

#[tokio::test]
async fn a_permanent_answer_about_the_address_never_fails_over() {
    let (primary, secondary) = (Sim::start().await, Sim::start().await);
    let email = sender(
        format!("{},{}", primary.smtp_url, secondary.smtp_url),
        BreakerConfig::default(),
    );
    let out = email.send(&mail_to("nouser@example.test"), &lease()).await;
    Expect::failed(InvalidEndpoint, "address_undeliverable", Some(550)).check("550 5.1.1", &out);
    assert_eq!(secondary.smtp.mail_commands(), 0, "never tried elsewhere");
    let out = email.send(&mail_to("blocked@example.test"), &lease()).await;
    Expect::failed(Permanent, "smtp_rejected", Some(554)).check("554 5.7.1", &out);
    assert_eq!(secondary.smtp.mail_commands(), 0);
    assert_eq!(email.providers().states()[0].1, State::Closed);
}

#[tokio::test]
async fn the_ses_path_delivers_the_thai_multipart_message_intact() {
    let (primary, sim) = (Sim::start().await, Sim::start().await);
    let ses_url = format!(
        "ses+{}?region=ap-southeast-1",
        sim.url.replace("127.0.0.1", "localhost")
    );
    let email = sender(
        format!("{},{ses_url}", primary.smtp_url),
        BreakerConfig::default(),
    );
    primary.smtp.set_fault(Some("421 4.7.0 try again later"));
    let mut j = mail_to("somchai@example.test");
    j.display_name = "สมชาย ใจดี".into();
    j.content.title = "ชำระเงินแล้ว #1001".into();
    j.content.body = "ขอบคุณที่ใช้บริการ".into();
    let email_job = j.clone();
    let out = email.send(&email_job, &lease()).await;
    assert!(sent_id(&out).is_some(), "{out:?}");
    assert_eq!(out.provider_status, Some(200));
    let port = sim.url.rsplit(':').next().unwrap();
    assert_eq!(out.content["provider"], format!("ses:localhost:{port}"));

    let recorded: serde_json::Value =
        reqwest::get(format!("{}/_sim/requests?provider=ses", sim.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let r = &recorded[0];
    assert_eq!(r["status"], 200);
    assert!(
        r["headers"]["authorization"]
            .as_str()
            .unwrap()
            .starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
        "{r}"
    );
    assert_eq!(
        r["body"]["Destination"]["ToAddresses"][0],
        "somchai@example.test"
    );
    // The raw message is the one SMTP would carry: the same bytes the builder makes.
    let built = email.build_message(&email_job).unwrap().formatted();
    let raw = r["body"]["raw_decoded"].as_str().unwrap();
    let without_date = |s: &str| {
        s.lines()
            .filter(|l| !l.starts_with("Date:") && !l.contains("boundary") && !l.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        without_date(raw),
        without_date(&String::from_utf8(built).unwrap())
    );
    assert!(raw.contains("multipart/alternative"), "{raw}");
    assert_eq!(decoded_subject(raw), "ชำระเงินแล้ว #1001");
    // The text part carries the Thai body (lettre encodes it as quoted-printable or base64).
    assert!(
        raw.contains("text/plain") && raw.contains("text/html"),
        "{raw}"
    );
}

#[tokio::test]
async fn ses_errors_fail_over_only_when_they_are_about_the_provider() {
    let (sim, backup) = (Sim::start().await, Sim::start().await);
    let email = sender(
        format!("ses+{}?region=ap-southeast-1,{}", sim.url, backup.smtp_url),
        BreakerConfig::default(),
    );
    sim.fault(serde_json::json!({"provider": "ses", "status": 429, "times": 1,
        "body": {"__type": "TooManyRequestsException", "message": "Maximum sending rate exceeded."}}))
        .await;
    let out = email.send(&mail_to("somchai@example.test"), &lease()).await;
    assert!(sent_id(&out).is_some(), "{out:?}");
    assert_eq!(out.content["provider"], host_port(&backup.smtp_url));

    sim.fault(
        serde_json::json!({"provider": "ses", "status": 400, "times": 1,
        "body": {"__type": "MessageRejected", "message": "Email address is not verified."}}),
    )
    .await;
    let out = email.send(&mail_to("somchai@example.test"), &lease()).await;
    Expect::failed(Permanent, "ses_rejected", Some(400)).check("MessageRejected", &out);
    assert_eq!(
        backup.smtp.messages().len(),
        1,
        "a rejection does not fail over"
    );
}

/// The Subject header of `raw`, unfolded and its RFC 2047 words decoded (whitespace
/// between adjacent encoded-words dropped, RFC 2047 §6.2).
fn decoded_subject(raw: &str) -> String {
    use base64::Engine;
    let mut lines = raw
        .split("\r\n")
        .skip_while(|l| !l.starts_with("Subject: "));
    let mut header = lines.next().unwrap()["Subject: ".len()..].to_string();
    for l in lines.take_while(|l| l.starts_with(' ') || l.starts_with('\t')) {
        header.push_str(l);
    }
    header
        .split_whitespace()
        .map(|w| {
            match w
                .to_ascii_lowercase()
                .starts_with("=?utf-8?b?")
                .then(|| &w[10..w.len() - 2])
            {
                Some(b64) => String::from_utf8(
                    base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .unwrap(),
                )
                .unwrap(),
                None => format!(" {w}"),
            }
        })
        .collect()
}

#[tokio::test]
async fn a_recovered_backup_is_probed_while_the_primary_is_healthy() {
    let (primary, secondary) = (Sim::start().await, Sim::start().await);
    let cooldown = Duration::from_millis(300);
    let email = sender(
        format!("{},{}", primary.smtp_url, secondary.smtp_url),
        BreakerConfig {
            failures: 1,
            cooldown,
            ..Default::default()
        },
    );
    let s_name = host_port(&secondary.smtp_url);
    // Both fail once: both open.
    primary
        .smtp
        .set_fault(Some("421 4.3.2 service not available"));
    secondary.smtp.set_fault(Some("421 4.7.0 try again later"));
    let out = email.send(&mail_to("somchai@example.test"), &lease()).await;
    assert!(sent_id(&out).is_none(), "{out:?}");
    assert!(
        email
            .providers()
            .states()
            .iter()
            .all(|(_, s)| *s == State::Open)
    );
    // Both recover. After the cooldown the first email probes the primary and closes it;
    // the next one probes the backup although the primary is healthy, and closes it too.
    primary.smtp.set_fault(None);
    secondary.smtp.set_fault(None);
    advance(cooldown).await;
    let first = email.send(&mail_to("somchai@example.test"), &lease()).await;
    assert!(sent_id(&first).is_some(), "{first:?}");
    let second = email.send(&mail_to("somying@example.test"), &lease()).await;
    assert!(sent_id(&second).is_some(), "{second:?}");
    assert_eq!(
        second.content["provider"],
        s_name.as_str(),
        "the backup's probe"
    );
    assert!(
        email
            .providers()
            .states()
            .iter()
            .all(|(_, s)| *s == State::Closed),
        "{:?}",
        email.providers().states()
    );
    // Closed again, the list's order holds: the primary takes the mail.
    let third = email.send(&mail_to("wichai@example.test"), &lease()).await;
    assert_eq!(
        third.content["provider"],
        host_port(&primary.smtp_url).as_str()
    );
}
