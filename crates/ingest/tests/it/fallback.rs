//! Derived deliveries: the fallback to the next channel of a type's `fallback_channels`
//! when a channel cannot reach the user (found at planning) or its delivery fails, and the
//! escalation of an unread in-app notification to email. Each is created once (its key is
//! the planned key of its channel), names its cause in its trail, and honours the
//! recipient's preferences.

use crate::support;

use notify_proto::v1 as pb;
use std::time::Duration;
use support::{
    InboxClient, Platform, eventually, field_violations, line_id, on_channel, settle, type_request,
    uniq,
};

/// Asserts that an email's `decision` says it was planned as the fallback of a LINE
/// delivery that could not reach a user without a LINE id.
fn assert_line_fallback_decision(decision: &str) {
    assert!(
        decision.starts_with("fallback: LINE unreachable: no LINE user id; fallback to email\n"),
        "{decision}"
    );
}

/// Waits until MailDev holds exactly one mail to `address` and returns its subject.
async fn one_mail(p: &Platform, address: &str) -> String {
    eventually("one mail", Duration::from_secs(20), async || {
        match p.mails_to(address).await.as_slice() {
            [m] => Ok(m["subject"].as_str().unwrap_or_default().to_string()),
            other => Err(other.len()),
        }
    })
    .await
}

/// A user with no LINE id gets the email instead, once: the LINE skip stays, the email is
/// cause `fallback` and its trail (GetEvent, ExplainDelivery) starts with the cause. A
/// replay of the event adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_a_line_id_gets_the_email_instead_once() {
    let p = Platform::start().await;
    p.add_derived_type("order_paid", &["inapp", "line"], &["line", "email"], None)
        .await;
    let (u, address) = p.add_email_recipient("u").await;
    let key = format!("order:{u}:paid");
    let created = p.send(&key, "order_paid", &[&u]).await;
    let ev = p.wait_final(&created.event_id, 20).await;
    let email = on_channel(&ev, "email");
    assert_eq!(email.len(), 1, "{:#?}", ev.deliveries);
    assert_eq!(email[0].status, "sent");
    assert_eq!(email[0].cause, "fallback");
    assert_eq!(
        email[0].caused_by, "",
        "decided at planning: no delivery to point at"
    );
    assert_line_fallback_decision(&email[0].decision);
    assert_eq!(on_channel(&ev, "inapp")[0].cause, "planned");
    let line: Vec<_> = ev.skipped.iter().filter(|s| s.channel == "line").collect();
    assert_eq!(line.len(), 1);
    assert_eq!(line[0].reason, "no_line_user_id");
    one_mail(&p, &address).await;

    let trail = p.explain(&created.event_id, &u, "email").await.trail;
    assert_eq!(
        trail[0], "fallback: LINE unreachable: no LINE user id; fallback to email",
        "{trail:#?}"
    );
    assert_eq!(trail.last().unwrap(), "status: sent");

    // Replayed: the same event, nothing new.
    let again = p.send(&key, "order_paid", &[&u]).await;
    assert_eq!(again.event_id, created.event_id);
    assert_eq!(p.get_event(&created.event_id).await.deliveries.len(), 2);
    assert_eq!(p.mails_to(&address).await.len(), 1);
}

/// A LINE delivery refused for good (400) falls back to email in the transaction that
/// fails it: one email, cause `fallback`, `caused_by` the LINE delivery, its trail naming
/// the failure. Neither a replay of the event nor a restart of every worker sends another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_delivery_that_fails_for_good_falls_back_to_email_once() {
    let mut p = Platform::start().await;
    p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
        .await;
    let (u, lid) = (uniq("u"), line_id());
    let address = format!("{u}@example.test");
    p.add_recipient(&u, "", &address, &lid).await;
    p.sim_fault(
        serde_json::json!({"provider": "line", "target_contains": lid, "status": 400,
        "times": 1, "body": {"message": "The property, 'to', in the request body is invalid"}}),
    )
    .await;
    let key = format!("order:{u}:paid");
    let created = p.send(&key, "order_paid", &[&u]).await;
    let ev = eventually(
        "the email fallback sent",
        Duration::from_secs(20),
        async || {
            let ev = p.get_event(&created.event_id).await;
            if on_channel(&ev, "email")
                .first()
                .is_some_and(|d| d.status == "sent")
            {
                Ok(ev)
            } else {
                Err(ev.deliveries)
            }
        },
    )
    .await;
    let line = on_channel(&ev, "line");
    assert_eq!(line.len(), 1);
    assert_eq!(line[0].status, "failed");
    let email = on_channel(&ev, "email");
    assert_eq!(email.len(), 1);
    assert_eq!(email[0].cause, "fallback");
    assert_eq!(email[0].caused_by, line[0].delivery_id);
    let head = format!("fallback: LINE delivery {} failed: ", line[0].delivery_id);
    assert!(
        email[0].decision.starts_with(&head),
        "{}",
        email[0].decision
    );
    assert!(
        email[0].decision.contains("fallback to email"),
        "{}",
        email[0].decision
    );
    let trail = p.explain(&created.event_id, &u, "email").await.trail;
    assert!(trail[0].starts_with(&head), "{trail:#?}");
    one_mail(&p, &address).await;
    // The console's event page shows the cause column.
    let http = support::no_redirects();
    let cookie = p.console_cookie().await;
    let page = http
        .get(format!(
            "{}/console/events/{}",
            p.http_url, created.event_id
        ))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("<th>cause</th>"), "{page}");
    assert!(
        page.contains(&format!("<td>fallback of {}</td>", line[0].delivery_id)),
        "{page}"
    );

    // Replay, then restart every worker: still one email.
    assert_eq!(
        p.send(&key, "order_paid", &[&u]).await.event_id,
        created.event_id
    );
    p.stop_workers().await;
    for c in notify_core::Channel::ALL {
        p.start_worker(c);
    }
    settle("no second email", Duration::from_secs(2), async || {
        let ev = p.get_event(&created.event_id).await;
        match (ev.deliveries.len(), p.mails_to(&address).await.len()) {
            (2, 1) => Ok(()),
            other => Err(other),
        }
    })
    .await;
}

/// An in-app notification still unread after `after_seconds` (2 s) escalates to email:
/// the email delivery exists from the start, pending until then, cause `escalation`,
/// `caused_by` the in-app delivery, and goes out when due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_in_app_notification_escalates_to_email_when_due() {
    let p = Platform::start().await;
    let (u, address, created) = p.escalating_invoice(2, "u").await;
    let ev = p.get_event(&created.event_id).await;
    let (inapp, email) = (on_channel(&ev, "inapp")[0], on_channel(&ev, "email")[0]);
    assert_eq!(email.cause, "escalation");
    assert_eq!(email.caused_by, inapp.delivery_id);
    assert!(
        email
            .decision
            .starts_with("escalation: if the in-app notification is still unread at "),
        "{}",
        email.decision
    );
    let due = email.next_attempt_at.expect("due later");
    let created_at = chrono::Utc::now().timestamp();
    assert!(
        (0..=3).contains(&(due.seconds - created_at)),
        "due about 2 s after planning: {due:?}"
    );
    let ev = p.wait_final(&created.event_id, 20).await;
    assert_eq!(on_channel(&ev, "email")[0].status, "sent");
    let sent_at = on_channel(&ev, "email")[0].sent_at.expect("sent");
    assert!(sent_at.seconds >= due.seconds, "not before it was due");
    one_mail(&p, &address).await;
    let trail = p.explain(&created.event_id, &u, "email").await.trail;
    assert!(trail[0].starts_with("escalation: if the in-app notification is still unread at "));
}

/// Reading the in-app notification before the escalation is due cancels it: at its due
/// time the email is skipped with `read_before_escalation`, and no mail is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_email_when_the_user_reads_the_notification_first() {
    let p = Platform::start().await;
    // 4 s leaves room to read it on a loaded machine.
    let (u, address, created) = p.escalating_invoice(4, "u").await;
    InboxClient::of(&p, &u)
        .read_newest(Duration::from_secs(10))
        .await;
    let ev = p.wait_final(&created.event_id, 20).await;
    let email = on_channel(&ev, "email")[0];
    assert_eq!(email.status, "skipped", "{email:#?}");
    assert_eq!(email.last_error, "read_before_escalation");
    assert_eq!(email.attempts, 0, "no provider call");
    assert!(
        email
            .decision
            .contains("escalation: not sent, the notification it escalates was read"),
        "{}",
        email.decision
    );
    assert!(p.mails_to(&address).await.is_empty());
}

/// The fallback email respects the user's email opt-out, at planning (no LINE id) and
/// after a failure (LINE 400): no email delivery, a skip `opted_out` whose trail names
/// the fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_email_respects_an_email_opt_out() {
    let p = Platform::start().await;
    p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
        .await;
    let (u, v, lid) = (uniq("u"), uniq("v"), line_id());
    p.add_recipient(&u, "", &format!("{u}@example.test"), "")
        .await;
    p.add_recipient(&v, "", &format!("{v}@example.test"), &lid)
        .await;
    for user in [&u, &v] {
        p.set_preference(user, "order_paid", "email", false).await;
    }
    // At planning.
    let created = p.send(&format!("order:{u}"), "order_paid", &[&u]).await;
    let ev = p.get_event(&created.event_id).await;
    assert!(ev.deliveries.is_empty(), "{:#?}", ev.deliveries);
    let email: Vec<_> = ev.skipped.iter().filter(|s| s.channel == "email").collect();
    assert_eq!(email.len(), 1);
    assert_eq!(email[0].reason, "opted_out");
    assert_line_fallback_decision(&email[0].decision);
    // After a failure.
    p.sim_fault(
        serde_json::json!({"provider": "line", "target_contains": lid, "status": 400,
        "times": 1, "body": {"message": "invalid"}}),
    )
    .await;
    let created = p.send(&format!("order:{v}"), "order_paid", &[&v]).await;
    let ev = eventually(
        "the email skip after the failure",
        Duration::from_secs(20),
        async || {
            let ev = p.get_event(&created.event_id).await;
            if ev.skipped.iter().any(|s| s.channel == "email") {
                Ok(ev)
            } else {
                Err(ev.deliveries)
            }
        },
    )
    .await;
    assert_eq!(ev.deliveries.len(), 1, "only the failed LINE delivery");
    assert_eq!(ev.deliveries[0].status, "failed");
    let skip = ev.skipped.iter().find(|s| s.channel == "email").unwrap();
    assert_eq!(skip.reason, "opted_out");
    assert!(
        skip.decision.starts_with("fallback: LINE delivery "),
        "{}",
        skip.decision
    );
}

/// Bad fallback and escalation settings are refused by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fallback_and_escalation_settings_are_refused_by_field() {
    let p = Platform::start_with_workers(&[]).await;
    let err = p
        .types()
        .upsert_notification_type(pb::UpsertNotificationTypeRequest {
            fallback_channels: vec!["line".into(), "fax".into(), "line".into()],
            escalations: vec![
                pb::Escalation {
                    from_channel: "email".into(),
                    to_channel: "line".into(),
                    after_seconds: 60,
                },
                pb::Escalation {
                    from_channel: "inapp".into(),
                    to_channel: "email".into(),
                    after_seconds: 0,
                },
                pb::Escalation {
                    from_channel: "inapp".into(),
                    to_channel: "email".into(),
                    after_seconds: 7 * 86_400 + 1,
                },
            ],
            ..type_request("t", &["inapp"])
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let fields = field_violations(&err);
    assert_eq!(
        fields,
        [
            "fallback_channels[1]",
            "fallback_channels[2]",
            "escalations[0].from_channel",
            "escalations[1].after_seconds",
            "escalations[2].after_seconds",
            "escalations[2]",
        ]
    );
}

/// "Why was this email sent?": for a user whose LINE account unfollowed, ExplainDelivery
/// on the email starts with the cause and the time of the unfollow webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_the_unfollow_and_its_time() {
    let p = Platform::start_with_workers(&[]).await;
    p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
        .await;
    let (u, lid) = (uniq("u"), line_id());
    p.add_recipient(&u, "", &format!("{u}@example.test"), &lid)
        .await;
    let at = chrono::DateTime::from_timestamp(chrono::Utc::now().timestamp() - 60, 0).unwrap();
    let body = serde_json::json!({"destination": "Ubot", "events": [{
        "type": "unfollow", "mode": "active", "timestamp": at.timestamp_millis(),
        "source": {"type": "user", "userId": lid}, "webhookEventId": "01HUNFOLLOW",
        "deliveryContext": {"isRedelivery": false}}]})
    .to_string();
    let r = support::line_webhook(&p, &p.http_url, &body).await;
    assert_eq!(r.status(), 200);
    let created = p.send(&format!("order:{u}"), "order_paid", &[&u]).await;
    let trail = p.explain(&created.event_id, &u, "email").await.trail;
    assert_eq!(
        trail[0],
        format!(
            "fallback: LINE unreachable: unfollowed at {}; fallback to email",
            at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        "{trail:#?}"
    );
    let ev = p.get_event(&created.event_id).await;
    assert_eq!(ev.skipped[0].reason, "line_unfollowed");
}

/// The topic fan-out derives like the direct writer: a subscriber without a LINE id gets
/// the fallback email, one with a LINE id only LINE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topic_fan_out_plans_the_fallback_too() {
    let p = Platform::start_with_workers(&[]).await;
    p.add_derived_type("promo", &["line"], &["line", "email"], None)
        .await;
    p.create_topic("shop.news").await;
    let (a, b) = (uniq("a"), uniq("b"));
    p.add_recipient(&a, "", &format!("{a}@example.test"), "")
        .await;
    p.add_recipient(&b, "", &format!("{b}@example.test"), &line_id())
        .await;
    p.subscribe("shop.news", &[&a, &b]).await;
    let req = p.topic_event("news:1", "promo", "shop.news");
    let created = p.create_event(req).await;
    let ev = eventually("fan-out planned", Duration::from_secs(20), async || {
        let ev = p.get_event(&created.event_id).await;
        if ev.deliveries.len() >= 2 {
            Ok(ev)
        } else {
            Err(ev.deliveries)
        }
    })
    .await;
    let mut got: Vec<(String, String, String)> = ev
        .deliveries
        .iter()
        .map(|d| (d.user_id.clone(), d.channel.clone(), d.cause.clone()))
        .collect();
    got.sort();
    let mut want = vec![
        (a.clone(), "email".to_string(), "fallback".to_string()),
        (b.clone(), "line".to_string(), "planned".to_string()),
    ];
    want.sort();
    assert_eq!(got, want);
}

/// The sweeper's last `worker_lost` and the claim's spent attempt budget create the
/// fallback in the transaction that fails the delivery, `caused_by` it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_last_attempt_and_a_spent_budget_fall_back_too() {
    use notify_store::deliveries::{self, ClaimOutcome};
    let p = Platform::start_with_workers(&[]).await;
    p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
        .await;
    let mut line_ids = Vec::new();
    let mut events = Vec::new();
    for prefix in ["lost", "spent"] {
        let u = uniq(prefix);
        p.add_recipient(&u, "", &format!("{u}@example.test"), &line_id())
            .await;
        let created = p.send(&format!("order:{u}"), "order_paid", &[&u]).await;
        line_ids.push(
            created.deliveries[0]
                .delivery_id
                .parse::<uuid::Uuid>()
                .unwrap(),
        );
        events.push(created.event_id);
    }
    // The last attempt's worker died: its lease ran out.
    p.exec(
        "UPDATE notification_deliveries SET status = 'sending', attempts = max_attempts,
             lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'
         WHERE id = $1",
        line_ids[0],
    )
    .await;
    let swept = deliveries::requeue_expired_leases(&p.pool, 10)
        .await
        .unwrap();
    assert_eq!(swept.len(), 1);
    assert!(swept[0].failed);
    let made: Vec<_> = swept[0].fallback.iter().map(|f| f.to).collect();
    assert_eq!(
        made,
        [notify_core::Channel::Email],
        "one fallback, to email"
    );
    // Every attempt spent, due again: the claim fails it.
    p.exec(
        "UPDATE notification_deliveries SET attempts = max_attempts, next_attempt_at = now()
         WHERE id = $1",
        line_ids[1],
    )
    .await;
    let claimed = deliveries::claim(
        &p.pool,
        line_ids[1],
        notify_core::Channel::Line,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let ClaimOutcome::Exhausted { fallback, .. } = claimed else {
        panic!("{claimed:?}");
    };
    let made: Vec<_> = fallback.iter().map(|f| f.to).collect();
    assert_eq!(
        made,
        [notify_core::Channel::Email],
        "one fallback, to email"
    );
    for (event, line) in events.iter().zip(&line_ids) {
        let ev = p.get_event(event).await;
        let email = on_channel(&ev, "email");
        assert_eq!(email.len(), 1, "{:#?}", ev.deliveries);
        assert_eq!(email[0].cause, "fallback");
        assert_eq!(email[0].caused_by, line.to_string());
        assert!(
            email[0]
                .decision
                .starts_with(&format!("fallback: LINE delivery {line} failed: ")),
            "{}",
            email[0].decision
        );
    }
    // Swept again: nothing more.
    assert!(
        deliveries::requeue_expired_leases(&p.pool, 10)
            .await
            .unwrap()
            .is_empty()
    );
}
