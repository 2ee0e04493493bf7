//! Decided at sending time: preferences, LINE follow state, revoked push endpoints and
//! undeliverable addresses are checked again when a delivery becomes due, not only when
//! the event is created. A delivery the rules refuse at its due time ends `skipped`, with
//! no provider call, its reason in `last_error` and a trail line saying why and when.
//!
//! The deliveries are made not due by a quiet window around now (planning holds them in
//! Postgres until its end); the test then changes the user's facts and makes them due now,
//! as time passing would: the window moves behind and the due time to now.

use crate::support;

use notify_proto::v1 as pb;
use serde_json::json;
use std::time::Duration;
use support::{Platform, line_id, line_webhook, type_request, uniq};

/// Holds `users`' noisy deliveries: a quiet window around now on every channel.
async fn hold(p: &Platform, users: &[&str]) {
    let now = chrono::Utc::now().with_timezone(&chrono_tz::Asia::Bangkok);
    for u in users {
        p.set_quiet_hours(
            u,
            now - chrono::Duration::hours(1),
            now + chrono::Duration::hours(1),
        )
        .await;
    }
}

/// Makes the event's deliveries due now: `users`' window moves behind us, and the due
/// time (delivery and outbox row) becomes now.
async fn make_due(p: &Platform, event_id: &str, users: &[&str]) {
    let now = chrono::Utc::now().with_timezone(&chrono_tz::Asia::Bangkok);
    for u in users {
        p.set_quiet_hours(
            u,
            now - chrono::Duration::hours(3),
            now - chrono::Duration::hours(2),
        )
        .await;
    }
    p.make_due_now(event_id).await;
}

/// Every delivery is pending and held at the call: nothing was decided yet.
fn assert_held(ev: &pb::CreateEventResponse) {
    assert!(!ev.deliveries.is_empty(), "{:?}", ev.skipped);
    for d in &ev.deliveries {
        assert_eq!(d.status, "pending", "{d:?}");
        assert!(d.deferred_until.is_some(), "{d:?}");
    }
}

async fn set_pref(p: &Platform, user: &str, type_key: &str, channel: &str, on: bool) {
    p.set_preference(user, type_key, channel, on).await;
}

fn delivery<'a>(ev: &'a pb::GetEventResponse, user: &str, channel: &str) -> &'a pb::Delivery {
    ev.deliveries
        .iter()
        .find(|d| d.user_id == user && d.channel == channel)
        .unwrap_or_else(|| panic!("no {channel} delivery for {user}: {:#?}", ev.deliveries))
}

/// Skipped when due: final, the reason code, the claim's attempt given back, no provider
/// call on record, and the decision's last line naming the rule.
fn assert_skipped(d: &pb::Delivery, reason: &str, line_starts: &str) {
    assert_eq!(
        (d.status.as_str(), d.last_error.as_str(), d.attempts),
        ("skipped", reason, 0),
        "{d:#?}"
    );
    let last = d.decision.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(line_starts) && last.contains("skipped when due"),
        "{}",
        d.decision
    );
    assert!(d.next_attempt_at.is_none(), "{d:?}");
}

/// The case: a user who turns email off before the delivery is due gets no email,
/// and the trail says why; a user who turns it off and on again before it is due gets it;
/// a critical type still goes to a user who turned email off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preference_changed_before_the_due_time_decides() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["email"]).await;
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        critical: true,
        ..type_request("security_login", &["email"])
    })
    .await;
    let (off, back) = (uniq("off"), uniq("back"));
    let (off_mail, back_mail) = (
        format!("{off}@example.test"),
        format!("{back}@example.test"),
    );
    p.add_recipient(&off, "", &off_mail, "").await;
    p.add_recipient(&back, "", &back_mail, "").await;
    hold(&p, &[&off, &back]).await;
    let ev = p.send("due:pref", "order_paid", &[&off, &back]).await;
    assert_held(&ev);

    // Before it is due: one user turns email off for this type, the other off and on.
    set_pref(&p, &off, "order_paid", "email", false).await;
    set_pref(&p, &back, "*", "email", false).await;
    set_pref(&p, &back, "order_paid", "email", true).await;
    make_due(&p, &ev.event_id, &[&off, &back]).await;

    let done = p.wait_final(&ev.event_id, 30).await;
    assert_skipped(
        delivery(&done, &off, "email"),
        "opted_out",
        "preference: off at ",
    );
    assert!(
        delivery(&done, &off, "email")
            .decision
            .contains("by the user's setting for this type on email (set "),
        "{}",
        delivery(&done, &off, "email").decision
    );
    assert_eq!(delivery(&done, &back, "email").status, "sent");
    // GetEvent counts the skipped state with the others.
    let mut counts: Vec<(&str, &str, u32)> = done
        .counts
        .iter()
        .map(|c| (c.channel.as_str(), c.status.as_str(), c.count))
        .collect();
    counts.sort_unstable();
    assert_eq!(counts, [("email", "sent", 1), ("email", "skipped", 1)]);
    p.wait_mails(
        &back_mail,
        1,
        "the user who turned email back on gets it",
        Duration::from_secs(10),
    )
    .await;
    assert!(
        p.mails_to(&off_mail).await.is_empty(),
        "no email to the user who opted out"
    );

    // ExplainDelivery answers "why was this not sent".
    let trail = p.explain(&ev.event_id, &off, "email").await.trail;
    assert_eq!(
        trail.last().unwrap(),
        "status: skipped when due, not sent (no provider call)"
    );
    assert!(
        trail[trail.len() - 2].starts_with("preference: off at ")
            && trail[trail.len() - 2].ends_with("; skipped when due"),
        "{trail:#?}"
    );
    assert!(
        !trail.iter().any(|l| l.starts_with("attempt ")),
        "{trail:#?}"
    );

    // A critical type ignores the opt-out, at the call and when due.
    set_pref(&p, &off, "security_login", "email", false).await;
    let critical = p.send("due:critical", "security_login", &[&off]).await;
    let done = p.wait_final(&critical.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent", "{:#?}", done.deliveries);
    p.wait_mails(
        &off_mail,
        1,
        "the critical email arrives",
        Duration::from_secs(10),
    )
    .await;
}

/// The channel stops reaching the user before the delivery is due: an unfollow (the LINE
/// webhook, signed), a revoked push endpoint (RevokeEndpoint), an address marked
/// undeliverable. Each delivery is skipped with its reason and nothing reaches the
/// provider; in-app, which nothing made unreachable, is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_unreachable_by_the_due_time_is_skipped() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["inapp", "email", "line", "push"])
        .await;
    let u = uniq("u");
    let (mail, lid) = (format!("{u}@example.test"), line_id());
    p.add_recipient(&u, "", &mail, &lid).await;
    let endpoint = p.add_device(&u, &format!("fcm-tok-{u}")).await;
    hold(&p, &[&u]).await;
    let ev = p.send("due:reach", "order_paid", &[&u]).await;
    let mut held: Vec<&str> = ev
        .deliveries
        .iter()
        .filter(|d| d.deferred_until.is_some())
        .map(|d| d.channel.as_str())
        .collect();
    held.sort_unstable();
    assert_eq!(held, ["email", "line", "push"], "{:#?}", ev.deliveries);

    // The user blocks the official account (LINE's signed webhook).
    let at_ms = chrono::Utc::now().timestamp_millis();
    let body = json!({"destination": "U0", "events": [{
        "type": "unfollow", "mode": "active", "timestamp": at_ms,
        "source": {"type": "user", "userId": lid},
        "webhookEventId": format!("01HDUE{at_ms}"),
        "deliveryContext": {"isRedelivery": false},
    }]})
    .to_string();
    assert_eq!(line_webhook(&p, &p.http_url, &body).await.status(), 200);
    // The app revokes the device.
    let revoked = p
        .recipients()
        .revoke_endpoint(pb::RevokeEndpointRequest {
            endpoint_id: endpoint.clone(),
            reason: "app_uninstalled".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(revoked.revoked);
    // The address bounced as nonexistent (as an SMTP 550 5.1.1 on another message marks it).
    assert!(
        notify_store::catalog::mark_email_undeliverable(
            &p.pool,
            &u,
            &mail,
            "550 5.1.1",
            chrono::Utc::now() + chrono::Duration::minutes(1),
        )
        .await
        .unwrap()
    );
    make_due(&p, &ev.event_id, &[&u]).await;

    let done = p.wait_final(&ev.event_id, 30).await;
    let unfollowed_at = chrono::DateTime::from_timestamp_millis(at_ms)
        .unwrap()
        .to_rfc3339();
    let line = delivery(&done, &u, "line");
    assert_skipped(
        line,
        "line_unfollowed",
        &format!("LINE: unfollowed at {unfollowed_at}"),
    );
    let push = delivery(&done, &u, "push");
    assert_skipped(push, "endpoint_revoked", "endpoint: revoked at ");
    assert!(
        push.decision.contains("(app_uninstalled)"),
        "{}",
        push.decision
    );
    assert_skipped(
        delivery(&done, &u, "email"),
        "email_undeliverable",
        "email: the address was marked undeliverable at ",
    );
    assert_eq!(delivery(&done, &u, "inapp").status, "sent");
    assert!(p.sim_requests("line").await.is_empty(), "no LINE call");
    assert!(p.sim_requests("fcm").await.is_empty(), "no FCM call");
    assert!(p.mails_to(&mail).await.is_empty(), "no email");
    let attempts: i64 = p.scalar("SELECT count(*) FROM delivery_attempts a JOIN notification_deliveries d ON d.id = a.delivery_id
         WHERE d.event_id = $1::uuid AND d.status = 'skipped'", &ev.event_id).await;
    assert_eq!(attempts, 0, "a skip writes no attempt");
    let trail = p.explain(&ev.event_id, &u, "line").await.trail;
    assert!(
        trail.iter().any(|l| l.starts_with("LINE: unfollowed at ")),
        "{trail:#?}"
    );
}

/// `skip_claimed` is fenced by the lease token: a worker whose lease was taken writes
/// nothing; the holder's skip gives the attempt back, leaves no lease, no outbox row and
/// no attempt row, and reads the claim's facts (the preference set with its time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skip_is_fenced_by_the_lease_and_gives_the_attempt_back() {
    use notify_store::deliveries::{self, ClaimOutcome};
    let p = Platform::start_with_type(&[], "order_paid", &["email"]).await;
    let (u, _) = p.add_email_recipient("u").await;
    let ev = p.send("due:fence", "order_paid", &[&u]).await;
    let id: uuid::Uuid = ev.deliveries[0].delivery_id.parse().unwrap();
    p.wait_outbox_empty("outbox drained", Duration::from_secs(20))
        .await;
    set_pref(&p, &u, "*", "email", false).await;
    let ClaimOutcome::Claimed(job) = deliveries::claim(
        &p.pool,
        id,
        notify_core::Channel::Email,
        Duration::from_secs(30),
    )
    .await
    .unwrap() else {
        panic!("not claimed")
    };
    assert_eq!(job.attempt, 1);
    let notify_core::due::Due::Skip { reason, why } =
        notify_core::due::check(job.started_at, job.due_facts())
    else {
        panic!("the claim's facts must say skip: {:?}", job.due)
    };
    assert_eq!(reason.as_str(), "opted_out");
    assert!(
        why.contains("by the user's switch for email on every type (set "),
        "{why}"
    );

    let mut stale = (*job).clone();
    stale.lease_token = uuid::Uuid::new_v4();
    assert!(
        !deliveries::skip_claimed(&p.pool, &stale, reason, &why)
            .await
            .unwrap()
    );
    assert_eq!(
        p.get_event(&ev.event_id).await.deliveries[0].status,
        "sending"
    );

    assert!(
        deliveries::skip_claimed(&p.pool, &job, reason, &why)
            .await
            .unwrap()
    );
    assert!(
        !deliveries::skip_claimed(&p.pool, &job, reason, &why)
            .await
            .unwrap(),
        "once"
    );
    let row: (String, i32, Option<String>, Option<uuid::Uuid>, i64, i64) = p
        .row(
            "SELECT status, attempts, last_error, lease_token,
                (SELECT count(*) FROM outbox WHERE delivery_id = $1),
                (SELECT count(*) FROM delivery_attempts WHERE delivery_id = $1)
         FROM notification_deliveries WHERE id = $1",
            id,
        )
        .await;
    assert_eq!(
        row,
        ("skipped".into(), 0, Some("opted_out".into()), None, 0, 0)
    );
    let d = &p.get_event(&ev.event_id).await.deliveries[0];
    assert!(d.decision.ends_with(&why), "{}", d.decision);
}

/// In-app is delivered without a claim when due; a preference turned off after planning
/// is seen by that read, which hands the delivery to the claim: skipped, its attempt not
/// spent, and no inbox row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inapp_preference_turned_off_before_the_worker_reads_it_is_skipped_with_no_inbox_row() {
    let mut p = Platform::start_with_type(&[], "due_inapp_note", &["inapp"]).await;
    let (off, on) = (
        p.add_bare_recipient("inapp-off").await,
        p.add_bare_recipient("inapp-on").await,
    );
    let ev = p
        .send("due:inapp-off", "due_inapp_note", &[&off, &on])
        .await;
    set_pref(&p, &off, "due_inapp_note", "inapp", false).await;
    p.start_worker(notify_core::Channel::InApp);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_skipped(
        delivery(&done, &off, "inapp"),
        "opted_out",
        "preference: off at ",
    );
    assert_eq!(delivery(&done, &on, "inapp").status, "sent");
    let rows: Vec<String> = p
        .scalars(
            "SELECT user_id FROM notifications WHERE event_id = $1::uuid ORDER BY user_id",
            &ev.event_id,
        )
        .await;
    assert_eq!(rows, [on]);
}
