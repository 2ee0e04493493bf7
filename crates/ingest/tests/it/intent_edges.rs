//! Issue 17 where its parts meet, as a hostile or unlucky caller and operator would try
//! it: cancels racing fan-out pages, failures and their fallbacks, escalations, writers
//! and each other; schedules at the horizon's edge and in odd spellings; derived
//! deliveries seen by another caller and by the console.

use crate::support;

use chrono::{DateTime, Utc};
use notify_core::Channel;
use notify_proto::v1 as pb;
use notify_proto::v1::cancel_event_request::Target;
use serde_json::json;
use std::time::Duration;
use support::{
    Options, Platform, SendExt, api_key, cancel, cancel_req, db_now, delivery_of, event_request,
    eventually, no_redirects, on_channel, settle, type_request, uniq, violations, with_key,
};
use tonic::Code;

/// The database clock now.
fn instant(t: &prost_types::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(t.seconds, t.nanos as u32).expect("timestamp in range")
}

/// Deliveries of `event_id` by (channel, status).
async fn statuses(p: &Platform, event_id: &str) -> Vec<(String, String, i64)> {
    p.rows(
        "SELECT channel, status, count(*) FROM notification_deliveries WHERE event_id = $1::uuid
         GROUP BY channel, status ORDER BY channel, status",
        event_id,
    )
    .await
}

async fn wait_fanout_done(p: &Platform, event_id: &str) {
    eventually("fan-out done", Duration::from_secs(30), async || {
        let ev = p.get_event(event_id).await;
        if ev.fanout_status == "done" {
            Ok(())
        } else {
            Err(ev.fanout_status)
        }
    })
    .await;
}

/// A recipient canceled after the fan-out wrote their LINE multicast batch (the batch
/// still pending) is not in the multicast call: CancelEvent promises that a canceled
/// recipient gets nothing not yet handed to a provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recipient_canceled_after_their_multicast_batch_was_written_is_not_in_the_call() {
    let mut p = Platform::start_with_type(&[], "promo", &["line"]).await;
    p.create_topic("shop.mc").await;
    let mut users = Vec::new();
    for n in ["a", "b", "c"] {
        users.push(p.add_line_recipient(n).await);
    }
    p.topics()
        .subscribe(pb::SubscribeRequest {
            topic: "shop.mc".into(),
            user_ids: users.iter().map(|(u, _)| u.clone()).collect(),
        })
        .await
        .unwrap();
    let mut req = p.topic_event("mc:1", "promo", "shop.mc");
    req.line_multicast = true;
    let ev = p.create_event(req).await;
    wait_fanout_done(&p, &ev.event_id).await;
    let (b, b_line) = users[1].clone();
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[&b]).await;
    p.start_worker(Channel::Line);
    p.wait_final(&ev.event_id, 30).await;
    let mut to: Vec<String> = Vec::new();
    for c in p.sim_requests("line").await {
        to.extend(
            c["body"]["to"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap().to_string()),
        );
    }
    assert!(
        !to.contains(&b_line),
        "the canceled recipient was in the multicast call {to:?}; CancelEvent answered {out:?}"
    );
    assert!(
        to.contains(&users[0].1) && to.contains(&users[2].1),
        "{to:?}"
    );
}

/// A delay that is a well-formed duration but longer than the horizon is refused naming
/// the horizon (as `31d` is), not as if it were not a duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_longer_than_a_year_is_refused_naming_the_horizon() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp"]).await;
    for delay in ["400d", "9999999d", "100000h"] {
        let mut req = p.event(&uniq("order:long"), "order_paid", &["u1"]);
        req.delay = delay.into();
        let err = p.ingest().create_event(req).await.expect_err(delay);
        let found = violations(&err);
        assert_eq!(found.len(), 1, "{delay}: {found:?}");
        assert_eq!(found[0].0, "delay", "{delay}: {found:?}");
        assert!(
            found[0].1.contains("30d") && found[0].1.contains("horizon"),
            "{delay}: {found:?}"
        );
    }
}

/// Odd delays: "0s" sends now (no due time); negative, fractional, unit-less garbage and
/// numbers past u64 are refused naming `delay`; nothing is written for a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_delays_send_now_or_are_refused_naming_delay() {
    let p = Platform::start_with_type(&[Channel::InApp], "order_paid", &["inapp"]).await;
    for delay in [
        "-5s",
        "1.5h",
        "5S",
        "99999999999999999999999s",
        "5s5s",
        "1h30m",
    ] {
        let mut req = p.event(&uniq("order:odd"), "order_paid", &["u1"]);
        req.delay = delay.into();
        let err = p.ingest().create_event(req).await.expect_err(delay);
        let found = violations(&err);
        assert_eq!(
            found.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
            ["delay"],
            "{delay}: {found:?}"
        );
    }
    assert_eq!(p.count("notification_events").await, 0);
    let mut req = p.event("order:now", "order_paid", &["u1"]);
    req.delay = "0s".into();
    let r = p.create_event(req.clone()).await;
    assert!(r.send_at.is_none(), "0s is now: {r:?}");
    let done = p.wait_final(&r.event_id, 20).await;
    support::assert_all_sent(&done);
    req.delay = "0ms".into();
    let again = p.create_event(req.clone()).await;
    assert!(again.duplicate, "0ms and 0s are one delay");
    req.delay = String::new();
    let err = p.ingest().create_event(req).await.unwrap_err();
    assert_eq!(
        err.code(),
        Code::AlreadyExists,
        "no delay is another event identity than 0s: {err:?}"
    );
}

/// `send_at` at the horizon's edge and in odd spellings: exactly 30 days ahead on the
/// database clock is taken, a second more is refused naming `send_at`; the year 1 sends
/// now; +05:45 and -00:00 spellings of one instant are one event; a leap-second text is
/// either refused naming `send_at` or taken, never an internal error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_at_at_the_horizon_and_in_odd_spellings() {
    let p = Platform::start_with_type(&[Channel::InApp], "order_paid", &["inapp"]).await;
    let horizon = db_now(&p).await + chrono::Duration::days(30);

    let mut at = p.event("order:edge", "order_paid", &["u1"]);
    at.send_at = horizon.to_rfc3339();
    let r = p.create_event(at).await;
    assert_eq!(instant(r.send_at.as_ref().unwrap()), horizon);

    let mut over = p.event("order:over", "order_paid", &["u1"]);
    over.send_at =
        (db_now(&p).await + chrono::Duration::days(30) + chrono::Duration::seconds(1)).to_rfc3339();
    let found = violations(&p.ingest().create_event(over).await.unwrap_err());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "send_at");
    assert!(found[0].1.contains("30d"), "{found:?}");
    let mut far = p.event("order:far", "order_paid", &["u1"]);
    far.send_at = "9999-12-31T23:59:59Z".into();
    assert_eq!(
        violations(&p.ingest().create_event(far).await.unwrap_err())[0].0,
        "send_at"
    );

    let mut past = p.event("order:year1", "order_paid", &["u1"]);
    past.send_at = "0001-01-01T00:00:00+00:00".into();
    let r = p.create_event(past).await;
    support::assert_all_sent(&p.wait_final(&r.event_id, 20).await);

    let due = (db_now(&p).await + chrono::Duration::hours(2))
        .with_timezone(&chrono::FixedOffset::east_opt(5 * 3600 + 45 * 60).unwrap());
    let mut kathmandu = p.event("order:np", "order_paid", &["u1"]);
    kathmandu.send_at = due.format("%Y-%m-%dT%H:%M:%S%.6f+05:45").to_string();
    let first = p.create_event(kathmandu.clone()).await;
    let mut unknown_local = kathmandu.clone();
    unknown_local.send_at = due
        .with_timezone(&Utc)
        .format("%Y-%m-%dT%H:%M:%S%.6f-00:00")
        .to_string();
    let second = p.create_event(unknown_local).await;
    assert!(second.duplicate, "one instant, two spellings");
    assert_eq!(second.event_id, first.event_id);
    assert_eq!(instant(first.send_at.as_ref().unwrap()), due);

    let leap_day = (db_now(&p).await + chrono::Duration::days(3)).format("%Y-%m-%d");
    let mut leap = p.event("order:leap", "order_paid", &["u1"]);
    leap.send_at = format!("{leap_day}T23:59:60Z");
    match p.ingest().create_event(leap.clone()).await {
        Ok(r) => {
            let again = p.create_event(leap).await;
            assert!(again.duplicate && again.event_id == r.into_inner().event_id);
        }
        Err(e) => assert_eq!(violations(&e)[0].0, "send_at", "{e:?}"),
    }
}

/// A canceled scheduled event replayed with the same key is a duplicate of the canceled
/// one: nothing is revived or written, and the replay's changed schedule is
/// ALREADY_EXISTS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canceled_scheduled_event_replayed_stays_canceled() {
    let p = Platform::start_with_type(&[Channel::InApp], "reminder", &["inapp"]).await;
    let mut req = p.event("remind:later", "reminder", &["u1", "u2"]);
    req.delay = "2s".into();
    let ev = p.create_event(req.clone()).await;
    let out = cancel(&p, Target::EventKey("remind:later".into()), &[]).await;
    assert_eq!((out.events, out.canceled), (1, 2), "{out:?}");
    let replay = p.create_event(req.clone()).await;
    assert!(
        replay.duplicate && replay.event_id == ev.event_id,
        "{replay:?}"
    );
    let mut moved = req.clone();
    moved.delay = "3s".into();
    assert_eq!(
        p.ingest().create_event(moved).await.unwrap_err().code(),
        Code::AlreadyExists
    );
    settle(
        "nothing revived past the due time",
        Duration::from_secs(3),
        async || {
            let s = statuses(&p, &ev.event_id).await;
            if s == [("inapp".to_string(), "canceled".to_string(), 2)] {
                Ok(())
            } else {
                Err(s)
            }
        },
    )
    .await;
    assert_eq!(p.count("outbox").await, 0);
    assert_eq!(p.count("notifications").await, 0, "no inbox row");
}

/// A scheduled topic broadcast canceled by its cancellation key before its due time:
/// the fan-out's pages (written at once, due later) are all canceled, nothing reaches
/// anyone when the due time passes, and the counts add up to the audience.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_broadcast_canceled_before_it_is_due_sends_nothing() {
    let p = Platform::start_with_type(&[Channel::InApp], "promo", &["inapp"]).await;
    p.add_topic_audience("shop.sale", "s", 2500).await;
    let mut req = p.topic_event("sale:1", "promo", "shop.sale");
    req.delay = "3s".into();
    req.cancellation_key = "sale:all".into();
    let ev = p.create_event(req).await;
    let out = cancel(&p, Target::CancellationKey("sale:all".into()), &[]).await;
    assert_eq!(out.events, 1, "{out:?}");
    assert_eq!(
        out.canceled + out.not_created,
        2_500,
        "the counts add up to the audience: {out:?}"
    );
    assert_eq!(
        out.sent + out.in_flight + out.failed + out.skipped,
        0,
        "{out:?}"
    );
    settle("nothing sent after the due time", Duration::from_secs(4), async || {
        let bad: i64 = p.scalar("SELECT count(*) FROM notification_deliveries WHERE event_id = $1::uuid AND status <> 'canceled'", &ev.event_id).await;
        if bad == 0 { Ok(()) } else { Err(bad) }
    })
    .await;
    assert_eq!(p.count("notifications").await, 0);
    assert_eq!(p.get_event(&ev.event_id).await.fanout_status, "canceled");
}

/// Leaving a topic before a scheduled broadcast is due is decided when due: the
/// subscriber who unsubscribed is skipped `unsubscribed`, the one who stayed gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_who_leaves_the_topic_before_the_due_time_gets_nothing() {
    let p = Platform::start_with_type(&[Channel::InApp], "promo", &["inapp"]).await;
    let topic = uniq("shop.flash");
    p.topics()
        .create_topic(pb::CreateTopicRequest { key: topic.clone() })
        .await
        .unwrap();
    let (stays, leaves) = (uniq("stays"), uniq("leaves"));
    p.topics()
        .subscribe(pb::SubscribeRequest {
            topic: topic.clone(),
            user_ids: vec![stays.clone(), leaves.clone()],
        })
        .await
        .unwrap();
    let mut req = p.event(&uniq("flash"), "promo", &[]);
    req.topic = topic.clone();
    req.delay = "3s".into();
    let ev = p.create_event(req).await;
    // Both deliveries are planned (and wait) before the unsubscribe.
    p.wait_scalar(
        "the fan-out planned both",
        Duration::from_secs(10),
        "SELECT count(*) FROM notification_deliveries WHERE event_id = $1::uuid",
        &ev.event_id,
        2,
    )
    .await;
    p.topics()
        .unsubscribe(pb::UnsubscribeRequest {
            topic: topic.clone(),
            user_ids: vec![leaves.clone()],
        })
        .await
        .unwrap();
    let got = p.wait_final(&ev.event_id, 20).await;
    let of = |u: &str| delivery_of(&got, u);
    assert_eq!(of(&stays).status, "sent", "{got:#?}");
    let left = of(&leaves);
    assert_eq!(
        (left.status.as_str(), left.last_error.as_str()),
        ("skipped", "unsubscribed")
    );
    assert!(
        left.decision
            .contains("unsubscribed from the event's topic"),
        "{}",
        left.decision
    );
}

/// A LINE delivery in its provider call when its recipient is canceled, which then fails
/// for good: the cancel waits and reports it `failed`, and no email fallback is created
/// for the canceled recipient (the fallback's fence sees the cancel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_the_recipients_cancel_makes_no_fallback() {
    let p = Platform::start_with_workers(&[Channel::Line, Channel::Email]).await;
    p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
        .await;
    let (u, lid) = (uniq("fb"), support::line_id());
    let mail = format!("{u}@shop.example.test");
    p.add_recipient(&u, "", &mail, &lid).await;
    let other = uniq("fb-other");
    let other_mail = format!("{other}@shop.example.test");
    let other_lid = support::line_id();
    p.add_recipient(&other, "", &other_mail, &other_lid).await;
    for l in [&lid, &other_lid] {
        p.sim_fault(json!({"provider": "line", "target_contains": l, "status": 400,
                           "body": {"message": "The property, 'to', in the request body is invalid"},
                           "delay_ms": 1500, "times": 1}))
            .await;
    }
    let ev = p.send("fb:1", "order_paid", &[&u, &other]).await;
    eventually(
        "both LINE calls started",
        Duration::from_secs(10),
        async || match p.sim_count("line").await {
            2 => Ok(()),
            n => Err(n),
        },
    )
    .await;
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[&u]).await;
    assert_eq!(
        (out.failed, out.canceled, out.in_flight),
        (1, 0, 0),
        "{out:?}"
    );
    // The other recipient's LINE failure falls back to email as usual.
    p.wait_mails(
        &other_mail,
        1,
        "the other's fallback email",
        Duration::from_secs(20),
    )
    .await;
    let done = p.wait_final(&ev.event_id, 20).await;
    let emails = on_channel(&done, "email");
    assert_eq!(emails.len(), 1, "{:?}", done.deliveries);
    assert_eq!(emails[0].user_id, other);
    assert_eq!(emails[0].cause, "fallback");
    assert!(
        p.mails_to(&mail).await.is_empty(),
        "no mail to the canceled recipient"
    );
}

/// An escalation of a canceled event: the in-app notification was sent, the pending
/// email escalation is canceled with the event (counted), GetEvent shows it canceled with
/// its cause, and no email goes out when it would have been due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_escalation_of_a_canceled_event_is_canceled_and_never_sent() {
    let p = Platform::start_with_workers(&[Channel::InApp, Channel::Email]).await;
    p.add_derived_type("invoice_due", &["inapp"], &[], Some(("inapp", "email", 2)))
        .await;
    let (u, mail) = p.add_email_recipient("esc").await;
    let ev = p.send("inv:1", "invoice_due", &[&u]).await;
    eventually("in-app sent", Duration::from_secs(10), async || {
        let s = statuses(&p, &ev.event_id).await;
        if s.contains(&("inapp".into(), "sent".into(), 1)) {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    assert_eq!((out.sent, out.canceled), (1, 1), "{out:?}");
    settle(
        "no escalation email",
        Duration::from_secs(3),
        async || match p.mails_to(&mail).await.len() {
            0 => Ok(()),
            n => Err(n),
        },
    )
    .await;
    let got = p.get_event(&ev.event_id).await;
    let email = on_channel(&got, "email")[0];
    assert_eq!(
        (email.status.as_str(), email.cause.as_str()),
        ("canceled", "escalation")
    );
}

/// Another caller sees nothing of a caller's derived deliveries: GetEvent, ExplainDelivery
/// of the fallback email and of the escalation, CancelEvent by id, key and cancellation
/// key all answer as for an event that does not exist; the owner sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_caller_learns_nothing_of_derived_deliveries() {
    let p = Platform::start_with(Options::workers(&[]).auth(ingest::auth::AuthMode::ApiKey)).await;
    let admin = api_key(&p, "admin", true).await;
    let (alice, bob) = (
        api_key(&p, "alice", false).await,
        api_key(&p, "bob", false).await,
    );
    let mut types = p.types();
    eventually("the admin key works", Duration::from_secs(5), async || {
        types
            .upsert_notification_type(with_key(
                pb::UpsertNotificationTypeRequest {
                    fallback_channels: vec!["line".into(), "email".into()],
                    escalations: vec![pb::Escalation {
                        from_channel: "inapp".into(),
                        to_channel: "push".into(),
                        after_seconds: 3600,
                    }],
                    ..type_request("order_paid", &["inapp", "line"])
                },
                &admin,
            ))
            .await
            .map(|_| ())
    })
    .await;
    for key in [&alice, &bob] {
        eventually("the key works", Duration::from_secs(5), async || {
            let r = p
                .ingest()
                .get_event(with_key(
                    event_request(&uuid::Uuid::new_v4().to_string()),
                    key,
                ))
                .await;
            match r {
                Err(e) if e.code() == Code::Unauthenticated => Err(e),
                _ => Ok(()),
            }
        })
        .await;
    }
    let u = uniq("nolid");
    sqlx::query("INSERT INTO recipients (user_id, email) VALUES ($1, $2)")
        .bind(&u)
        .bind(format!("{u}@shop.example.test"))
        .execute(&p.pool)
        .await
        .unwrap();
    let mut req = p.event("secret:1", "order_paid", &[&u]);
    req.cancellation_key = "secret:group".into();
    let ev = p.create_event(with_key(req, &alice)).await;
    let explain = |key: &str, channel: &str| {
        let mut c = p.ingest();
        let r = with_key(
            pb::ExplainDeliveryRequest {
                event_id: ev.event_id.clone(),
                user_id: u.clone(),
                channel: channel.into(),
            },
            key,
        );
        async move { c.explain_delivery(r).await }
    };
    let trail = explain(&alice, "email")
        .await
        .expect("owner explains")
        .into_inner();
    assert!(
        trail.trail.iter().any(|l| l.contains("fallback")),
        "{trail:?}"
    );
    for channel in ["email", "push", "inapp", "line"] {
        let e = explain(&bob, channel).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{channel}: {e:?}");
        assert!(!e.message().contains(&u), "{e:?}");
    }
    let get = p
        .ingest()
        .get_event(with_key(event_request(&ev.event_id), &bob))
        .await
        .unwrap_err();
    assert_eq!(get.code(), Code::NotFound);
    for target in [
        Target::EventId(ev.event_id.clone()),
        Target::EventKey("secret:1".into()),
    ] {
        let e = p
            .ingest()
            .cancel_event(with_key(cancel_req(target, &[]), &bob))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }
    let none = support::cancel_as(&p, Target::CancellationKey("secret:group".into()), &bob).await;
    assert_eq!(none, pb::CancelEventResponse::default());
    let pending: i64 = p.query_scalar("SELECT count(*) FROM notification_deliveries WHERE status = 'pending' AND cause <> 'planned'").await;
    assert!(pending >= 1, "alice's derived deliveries untouched");
}

/// 50 concurrent cancels of overlapping targets (one cancellation key over several
/// events, those events by id and by key, some recipients of them) all succeed (no
/// deadlock, no error) and leave nothing pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_cancels_of_overlapping_targets_all_succeed() {
    let p = Platform::start_with_type(&[], "reminder", &["inapp", "email"]).await;
    let users: Vec<String> = (0..4).map(|i| format!("ov-{i}")).collect();
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let mut ids = Vec::new();
    for i in 0..6 {
        let mut req = p.event(&format!("ov:{i}"), "reminder", &refs);
        req.cancellation_key = format!("ov:group:{}", i % 2);
        ids.push(p.create_event(req).await.event_id);
    }
    let mut tasks = Vec::new();
    for n in 0..50usize {
        let mut c = p.ingest();
        let (ids, users) = (ids.clone(), users.clone());
        tasks.push(tokio::spawn(async move {
            let (target, who): (Target, Vec<String>) = match n % 5 {
                0 => (
                    Target::CancellationKey(format!("ov:group:{}", n % 2)),
                    vec![],
                ),
                1 => (
                    Target::EventId(ids[n % 6].clone()),
                    vec![users[n % 4].clone()],
                ),
                2 => (Target::EventKey(format!("ov:{}", n % 6)), vec![]),
                3 => (
                    Target::CancellationKey(format!("ov:group:{}", (n + 1) % 2)),
                    vec![users[n % 4].clone(), users[(n + 1) % 4].clone()],
                ),
                _ => (Target::EventId(ids[(n + 3) % 6].clone()), vec![]),
            };
            let who: Vec<&str> = who.iter().map(String::as_str).collect();
            c.cancel_event(cancel_req(target, &who))
                .await
                .map(|r| r.into_inner())
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("every cancel succeeds");
    }
    // The groups cover every event: nothing may be left pending.
    let left: i64 = p
        .query_scalar("SELECT count(*) FROM notification_deliveries WHERE status <> 'canceled'")
        .await;
    assert_eq!(left, 0);
    assert_eq!(p.count("outbox").await, 0);
    for id in &ids {
        assert!(p.get_event(id).await.canceled_at.is_some());
    }
}

/// A cancel by cancellation key repeated while a large CreateEvent with that key is being
/// written: every answer is either "no events" (before the commit) or the whole event
/// with all its deliveries canceled; once it found the event, nothing of it is pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_the_create_of_its_key_finds_nothing_or_everything() {
    let p = Platform::start_with_type(&[], "reminder", &["inapp"]).await;
    let users: Vec<String> = (0..900).map(|i| format!("race-{i:04}")).collect();
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let mut req = p.event("race:1", "reminder", &refs);
    req.cancellation_key = "race:group".into();
    let mut c = p.ingest();
    let create = tokio::spawn(async move { c.create_event(req).await.map(|r| r.into_inner()) });
    let out = eventually(
        "the cancel found the event",
        Duration::from_secs(20),
        async || {
            let out = cancel(&p, Target::CancellationKey("race:group".into()), &[]).await;
            match out.events {
                0 => Err(out),
                _ => Ok(out),
            }
        },
    )
    .await;
    let ev = create.await.unwrap().expect("create");
    assert_eq!(out.event_ids, std::slice::from_ref(&ev.event_id));
    assert_eq!((out.canceled, out.in_flight), (900, 0), "{out:?}");
    assert_eq!(
        statuses(&p, &ev.event_id).await,
        [("inapp".to_string(), "canceled".to_string(), 900)]
    );
}

/// A LINE user who unfollows and follows again before a scheduled delivery is due gets
/// it: the newest follow event decides at the due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_user_who_follows_again_before_the_due_time_gets_the_message() {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("refollow").await;
    let mut req = p.event("refollow:1", "order_paid", &[&u]);
    req.delay = "2s".into();
    let ev = p.create_event(req).await;
    let t0 = chrono::Utc::now().timestamp_millis();
    for (i, kind) in ["unfollow", "follow"].iter().enumerate() {
        let body = json!({"destination": "Ubot", "events": [{
            "type": kind, "mode": "active", "timestamp": t0 + i as i64,
            "source": {"type": "user", "userId": lid},
            "webhookEventId": uniq("wh"), "deliveryContext": {"isRedelivery": false},
            "replyToken": "r"}]})
        .to_string();
        assert!(
            support::line_webhook(&p, &p.http_url, &body)
                .await
                .status()
                .is_success()
        );
    }
    let done = p.wait_final(&ev.event_id, 20).await;
    support::assert_all_sent(&done);
    assert_eq!(p.sim_count("line").await, 1);
}

/// The console's event page for a scheduled, canceled event whose LINE delivery failed
/// with a hostile provider answer and fell back to email: it renders, shows the due time,
/// the cancel and the derived row's cause, and escapes what came from outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_renders_scheduled_canceled_and_derived_rows_escaped() {
    let p = Platform::start_with_workers(&[Channel::Line]).await;
    p.add_derived_type("order_paid", &["line", "inapp"], &["line", "email"], None)
        .await;
    let (u, lid) = (uniq("con"), support::line_id());
    p.add_recipient(&u, "", &format!("{u}@shop.example.test"), &lid)
        .await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": lid, "status": 400,
                       "body": {"message": "<script>alert('line')</script>"}, "times": 1}),
    )
    .await;
    let mut req = p.event("con:1", "order_paid", &[&u]);
    req.content.as_mut().unwrap().title = "<img src=x onerror=alert(1)>".into();
    let ev = p.create_event(req).await;
    eventually("the email fallback", Duration::from_secs(20), async || {
        let s = statuses(&p, &ev.event_id).await;
        if s.iter().any(|(c, _, _)| c == "email") {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
    let mut later = p.event("con:2", "order_paid", &[&u]);
    later.delay = "1h".into();
    let later = p.create_event(later).await;
    cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    cancel(&p, Target::EventId(later.event_id.clone()), &[]).await;

    let http = no_redirects();
    let cookie = p.console_cookie().await;
    for id in [&ev.event_id, &later.event_id] {
        let page = http
            .get(format!("{}/console/events/{id}", p.http_url))
            .header("cookie", &cookie)
            .text_body()
            .await;
        assert!(page.contains("canceled"), "{page}");
        assert!(
            !page.contains("<script>alert") && !page.contains("<img src=x"),
            "{page}"
        );
        if id == &ev.event_id {
            assert!(page.contains("fallback of "), "{page}");
            assert!(page.contains("&lt;script&gt;alert("), "{page}");
            assert!(page.contains("&lt;img src=x"), "{page}");
        } else {
            assert!(page.contains("scheduled: due at"), "{page}");
        }
    }
}

/// A user whose phone is signed in to another account before a scheduled push is due:
/// the app registers the same FCM token for the other user, so at the due time the
/// endpoint is no longer this user's and the push must not reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_push_does_not_reach_a_device_now_registered_to_another_user() {
    let p = Platform::start_with_type(&[Channel::Push], "order_paid", &["push"]).await;
    let (a, b) = (
        p.add_bare_recipient("owner").await,
        p.add_bare_recipient("next").await,
    );
    let token = format!("fcm-shared-{a}");
    p.add_device(&a, &token).await;
    let mut req = p.event("moved:1", "order_paid", &[&a]);
    req.delay = "2s".into();
    let ev = p.create_event(req).await;
    // The phone now belongs to b's account.
    p.add_device(&b, &token).await;
    let owner: String = p
        .scalar(
            "SELECT user_id FROM notification_endpoints WHERE token = $1",
            &token,
        )
        .await;
    assert_eq!(owner, b, "the token is b's now");
    let done = p.wait_final(&ev.event_id, 20).await;
    assert_eq!(
        p.sim_count("fcm").await,
        0,
        "a's notification reached the device now registered to b: {:?}",
        done.deliveries
    );
    assert_eq!(
        done.deliveries[0].status, "skipped",
        "{:?}",
        done.deliveries
    );
}

/// A user who changes their email address before a scheduled email is due gets it at the
/// new address, not at the one they left (decided at the time of sending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_email_goes_to_the_address_the_user_has_when_it_is_due() {
    let p = Platform::start_with_type(&[Channel::Email], "order_paid", &["email"]).await;
    let u = uniq("moved");
    let (old, new) = (
        format!("{u}-old@shop.example.test"),
        format!("{u}-new@shop.example.test"),
    );
    p.add_recipient(&u, "", &old, "").await;
    let mut req = p.event("mail:moved", "order_paid", &[&u]);
    req.delay = "2s".into();
    let ev = p.create_event(req).await;
    p.add_recipient(&u, "", &new, "").await;
    p.wait_final(&ev.event_id, 20).await;
    eventually("one mail somewhere", Duration::from_secs(10), async || {
        let (o, n) = (p.mails_to(&old).await.len(), p.mails_to(&new).await.len());
        if o + n == 1 { Ok((o, n)) } else { Err((o, n)) }
    })
    .await;
    assert!(
        p.mails_to(&old).await.is_empty(),
        "mailed to the old address"
    );
    assert_eq!(p.mails_to(&new).await.len(), 1);
}

/// A fallback chain in which no channel can reach the user: no delivery at all, one skip
/// per channel with its own unreachable reason, and the trail of the last names the walk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_chain_with_no_reachable_channel_skips_each_and_sends_nothing() {
    let p = Platform::start_with_workers(&[]).await;
    p.add_derived_type("order_paid", &["line"], &["line", "push", "email"], None)
        .await;
    let u = p.add_bare_recipient("nobody").await;
    let ev = p.send("none:1", "order_paid", &[&u]).await;
    let got = p.get_event(&ev.event_id).await;
    assert!(got.deliveries.is_empty(), "{:?}", got.deliveries);
    let mut skips: Vec<(String, String)> = got
        .skipped
        .iter()
        .map(|s| (s.channel.clone(), s.reason.clone()))
        .collect();
    skips.sort();
    assert_eq!(
        skips,
        [
            ("email".to_string(), "no_email_address".to_string()),
            ("line".to_string(), "no_line_user_id".to_string()),
            ("push".to_string(), "no_push_endpoint".to_string()),
        ]
    );
    let replay = p.send("none:1", "order_paid", &[&u]).await;
    assert!(replay.duplicate);
    assert_eq!(p.count("notification_deliveries").await, 0);
}

/// A scheduled LINE message whose recipient blocks the account before it is due: at the
/// due time LINE is skipped `line_unfollowed` and the type's email fallback goes out once,
/// caused by the skipped LINE delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfollow_before_the_due_time_falls_back_to_email_when_due() {
    let p = Platform::start_with_workers(&[Channel::Line, Channel::Email]).await;
    p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
        .await;
    let (u, lid) = (uniq("unf"), support::line_id());
    let mail = format!("{u}@shop.example.test");
    p.add_recipient(&u, "", &mail, &lid).await;
    let mut req = p.event("unf:1", "order_paid", &[&u]);
    req.delay = "2s".into();
    let ev = p.create_event(req).await;
    assert!(ev.deliveries.iter().all(|d| d.channel == "line"), "{ev:?}");
    let body = json!({"destination": "Ubot", "events": [{
        "type": "unfollow", "mode": "active", "timestamp": chrono::Utc::now().timestamp_millis(),
        "source": {"type": "user", "userId": lid},
        "webhookEventId": uniq("wh"), "deliveryContext": {"isRedelivery": false}}]})
    .to_string();
    assert!(
        support::line_webhook(&p, &p.http_url, &body)
            .await
            .status()
            .is_success()
    );
    p.wait_mails(&mail, 1, "the fallback mail", Duration::from_secs(20))
        .await;
    let done = p.wait_final(&ev.event_id, 20).await;
    let line = on_channel(&done, "line")[0];
    let email = on_channel(&done, "email")[0];
    assert_eq!(
        (line.status.as_str(), line.last_error.as_str()),
        ("skipped", "line_unfollowed")
    );
    assert_eq!(
        (email.status.as_str(), email.cause.as_str()),
        ("sent", "fallback")
    );
    assert_eq!(email.caused_by, line.delivery_id);
    assert_eq!(p.sim_count("line").await, 0);
}

/// A LINE call in flight when the cancel comes answers 500: the retry its record would
/// schedule does not happen (the delivery ends `canceled`, counted so), and LINE is
/// called once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_recorded_while_the_cancel_waits_is_canceled_not_sent() {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("retry").await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": lid, "status": 500,
                       "body": {"message": "busy"}, "delay_ms": 1500, "times": 1}),
    )
    .await;
    let ev = p.send("retry:1", "order_paid", &[&u]).await;
    p.wait_provider_called("line").await;
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    assert_eq!(
        (out.canceled, out.sent, out.in_flight, out.failed),
        (1, 0, 0, 0),
        "{out:?}"
    );
    settle(
        "no retry after the cancel",
        Duration::from_secs(2),
        async || {
            let s = statuses(&p, &ev.event_id).await;
            let calls = p.sim_count("line").await;
            if s == [("line".to_string(), "canceled".to_string(), 1)] && calls == 1 {
                Ok(())
            } else {
                Err((s, calls))
            }
        },
    )
    .await;
    assert_eq!(p.count("outbox").await, 0);
}

/// A cancel that lands the moment an escalation becomes due: whatever the race, nothing
/// is sent after the cancel returned and its answer adds up to the event's deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_at_the_moment_an_escalation_is_due_leaves_nothing_sent_after_it() {
    let p = Platform::start_with_workers(&[Channel::InApp, Channel::Email]).await;
    let (_u, mail, ev) = p.escalating_invoice(1, "esc-race").await;
    let due = p.escalation_due(&ev.event_id).await;
    eventually(
        "the escalation is due",
        Duration::from_secs(5),
        async || {
            let now = db_now(&p).await;
            if now >= due { Ok(()) } else { Err(now) }
        },
    )
    .await;
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    let returned = db_now(&p).await;
    assert_eq!(
        out.canceled + out.sent + out.failed + out.skipped + out.in_flight,
        2,
        "{out:?}"
    );
    assert_eq!(out.in_flight, 0, "{out:?}");
    settle(
        "nothing sent after the cancel",
        Duration::from_secs(2),
        async || {
            let late: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM notification_deliveries
             WHERE event_id = $1::uuid AND (sent_at > $2 OR status IN ('pending', 'sending'))",
            )
            .bind(&ev.event_id)
            .bind(returned)
            .fetch_one(&p.pool)
            .await
            .unwrap();
            if late == 0 { Ok(()) } else { Err(late) }
        },
    )
    .await;
    let mails = p.mails_to(&mail).await.len() as u32;
    let email_sent: i64 = p
        .scalar(
            "SELECT count(*) FROM notification_deliveries
         WHERE event_id = $1::uuid AND channel = 'email' AND status = 'sent'",
            &ev.event_id,
        )
        .await;
    assert_eq!(
        i64::from(mails),
        email_sent,
        "a mail exactly when its delivery is sent"
    );
}

/// The fallback of a failure whose transaction dies half way (a worker crash before the
/// commit) leaves nothing; made again and committed, it is one delivery; a redelivered
/// record asking for it again makes none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_whose_transaction_died_is_made_once_when_done_again() {
    let p = Platform::start_with_workers(&[]).await;
    p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
        .await;
    let (u, lid) = (uniq("crash"), support::line_id());
    p.add_recipient(&u, "", &format!("{u}@shop.example.test"), &lid)
        .await;
    let ev = p.send("crash:1", "order_paid", &[&u]).await;
    let line: uuid::Uuid = ev.deliveries[0].delivery_id.parse().unwrap();
    let fail_and_fall_back = async |commit: bool| {
        let mut tx = p.pool.begin().await.unwrap();
        sqlx::query(
            "UPDATE notification_deliveries SET status = 'failed', last_error = 'line_400: bad'
             WHERE id = $1",
        )
        .bind(line)
        .execute(&mut *tx)
        .await
        .unwrap();
        let made = notify_store::derived::fallback_after(&mut tx, line, "failed")
            .await
            .unwrap();
        if commit {
            tx.commit().await.unwrap();
        } // else dropped: the crash rolls it back
        made
    };
    assert!(fail_and_fall_back(false).await.is_some());
    let emails = async || -> i64 {
        p.scalar("SELECT count(*) FROM notification_deliveries WHERE event_id = $1::uuid AND channel = 'email'", &ev.event_id).await
    };
    assert_eq!(emails().await, 0, "the crashed transaction left nothing");
    assert!(fail_and_fall_back(true).await.is_some());
    assert_eq!(
        fail_and_fall_back(true).await,
        None,
        "a second ask makes none"
    );
    assert_eq!(emails().await, 1);
    let replay = p.send("crash:1", "order_paid", &[&u]).await;
    assert!(replay.duplicate);
    assert_eq!(emails().await, 1);
}

/// A scheduled event's derived deliveries wait for its due time too: the fallback email
/// of a user without a LINE id is due at `send_at`, the escalation `after_seconds` after
/// it; nothing goes out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn derived_deliveries_of_a_scheduled_event_wait_for_its_due_time() {
    let p = Platform::start().await;
    p.add_derived_type(
        "order_paid",
        &["inapp", "line"],
        &["line", "email"],
        Some(("inapp", "push", 60)),
    )
    .await;
    let (u, mail) = p.add_email_recipient("later").await;
    p.add_device(&u, &format!("fcm-later-{u}")).await;
    let mut req = p.event("later:1", "order_paid", &[&u]);
    req.delay = "1h".into();
    let ev = p.create_event(req).await;
    let send_at = instant(ev.send_at.as_ref().expect("scheduled"));
    let due: Vec<(String, String, DateTime<Utc>)> = p
        .rows(
            "SELECT channel, cause, next_attempt_at FROM notification_deliveries
         WHERE event_id = $1::uuid ORDER BY channel",
            &ev.event_id,
        )
        .await;
    let close = |a: DateTime<Utc>, b: DateTime<Utc>| (a - b).num_milliseconds().abs() < 5;
    assert_eq!(due.len(), 3, "{due:?}");
    for (channel, cause, at) in &due {
        match channel.as_str() {
            "inapp" => assert!(cause == "planned" && close(*at, send_at), "{due:?}"),
            "email" => assert!(cause == "fallback" && close(*at, send_at), "{due:?}"),
            "push" => assert!(
                cause == "escalation" && close(*at, send_at + chrono::Duration::seconds(60)),
                "{due:?}"
            ),
            other => panic!("{other}: {due:?}"),
        }
    }
    settle(
        "nothing before the due time",
        Duration::from_secs(2),
        async || {
            let early = p.mails_to(&mail).await.len() + p.sim_count("fcm").await;
            let sent: i64 = p
                .query_scalar(
                    "SELECT count(*) FROM notification_deliveries WHERE status <> 'pending'",
                )
                .await;
            if early == 0 && sent == 0 {
                Ok(())
            } else {
                Err((early, sent))
            }
        },
    )
    .await;
}

/// A device revoked and registered again (same token, same user) before a scheduled push
/// is due gets it: the endpoint is active at the due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_registered_again_before_the_due_time_gets_the_push() {
    let p = Platform::start_with_type(&[Channel::Push], "order_paid", &["push"]).await;
    let u = p.add_bare_recipient("again").await;
    let token = format!("fcm-again-{u}");
    let endpoint = p.add_device(&u, &token).await;
    let mut req = p.event("again:1", "order_paid", &[&u]);
    req.delay = "2s".into();
    let ev = p.create_event(req).await;
    p.recipients()
        .revoke_endpoint(pb::RevokeEndpointRequest {
            endpoint_id: endpoint.clone(),
            reason: "signed_out".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        p.add_device(&u, &token).await,
        endpoint,
        "the same endpoint"
    );
    let done = p.wait_final(&ev.event_id, 20).await;
    support::assert_all_sent(&done);
    assert_eq!(p.sim_count("fcm").await, 1);
}

/// CancelEvent's edges: an event key in another Unicode normalisation form finds the
/// event (keys are NFC), 1,001 recipients are refused naming `recipients`, a repeated
/// recipient counts once, and a recipient who is not on the event cancels nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_keys_match_in_any_normalisation_and_recipient_lists_are_bounded() {
    let p = Platform::start_with_type(&[], "reminder", &["inapp"]).await;
    let ev = p.send("caf\u{e9}:1", "reminder", &["u1", "u2"]).await;
    let many: Vec<String> = (0..1_001).map(|i| format!("m{i}")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let err = p
        .ingest()
        .cancel_event(cancel_req(Target::EventKey("cafe\u{301}:1".into()), &refs))
        .await
        .unwrap_err();
    assert_eq!(
        violations(&err)
            .into_iter()
            .map(|v| v.0)
            .collect::<Vec<_>>(),
        ["recipients"]
    );
    let stranger = cancel(&p, Target::EventKey("cafe\u{301}:1".into()), &["nobody"]).await;
    assert_eq!((stranger.events, stranger.canceled), (1, 0), "{stranger:?}");
    let out = cancel(&p, Target::EventKey("cafe\u{301}:1".into()), &["u1", "u1"]).await;
    assert_eq!(out.event_ids, std::slice::from_ref(&ev.event_id));
    assert_eq!((out.canceled, out.in_flight), (1, 0), "{out:?}");
    assert_eq!(
        statuses(&p, &ev.event_id).await,
        [
            ("inapp".to_string(), "canceled".to_string(), 1),
            ("inapp".to_string(), "pending".to_string(), 1)
        ]
    );
    // A cancellation key is NFC-normalised as an event key is: composed at create,
    // decomposed at cancel, one key.
    let mut req = p.event("cart:nfc", "reminder", &["u3"]);
    req.cancellation_key = "cart:caf\u{e9}:reminders".into();
    let held = p.create_event(req).await;
    let out = cancel(
        &p,
        Target::CancellationKey("cart:cafe\u{301}:reminders".into()),
        &[],
    )
    .await;
    assert_eq!(out.event_ids, [held.event_id], "{out:?}");
    assert_eq!(out.canceled, 1, "{out:?}");
}

/// Two LINE subscribers with email addresses and a topic type that falls back from LINE
/// to email; returns (topic, [(user, line id, mail)]).
async fn line_topic_with_mail(p: &Platform, topic: &str) -> Vec<(String, String, String)> {
    p.topics()
        .create_topic(pb::CreateTopicRequest { key: topic.into() })
        .await
        .unwrap();
    let mut users = Vec::new();
    for n in ["mc-a", "mc-b"] {
        let (u, lid) = (uniq(n), support::line_id());
        let mail = format!("{u}@shop.example.test");
        p.add_recipient(&u, "", &mail, &lid).await;
        users.push((u, lid, mail));
    }
    p.topics()
        .subscribe(pb::SubscribeRequest {
            topic: topic.into(),
            user_ids: users.iter().map(|u| u.0.clone()).collect(),
        })
        .await
        .unwrap();
    users
}

/// A LINE multicast batch that fails for good falls back to email for each user of the
/// batch, as a per-user LINE delivery does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_line_multicast_batch_falls_back_to_email_for_each_user() {
    let p = Platform::start_with_workers(&[Channel::Line, Channel::Email]).await;
    p.add_derived_type("promo", &["line"], &["line", "email"], None)
        .await;
    let users = line_topic_with_mail(&p, "shop.mcfail").await;
    p.sim_fault(json!({"provider": "line", "status": 400,
                       "body": {"message": "The request body has 1 error(s)"}, "times": 1}))
        .await;
    let mut req = p.topic_event("mcfail:1", "promo", "shop.mcfail");
    req.line_multicast = true;
    let ev = p.create_event(req).await;
    wait_fanout_done(&p, &ev.event_id).await;
    eventually("the batch failed", Duration::from_secs(20), async || {
        let s = statuses(&p, &ev.event_id).await;
        if s.contains(&("line".into(), "failed".into(), 1)) {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
    let done = p.wait_final(&ev.event_id, 20).await;
    for (u, _, mail) in &users {
        assert!(
            done.deliveries
                .iter()
                .any(|d| &d.user_id == u && d.channel == "email" && d.cause == "fallback"),
            "no email fallback for {u}: deliveries {:?} skips {:?}",
            done.deliveries,
            done.skipped
        );
        p.wait_mails(mail, 1, "the fallback mail", Duration::from_secs(10))
            .await;
    }
}

/// A topic broadcast sent by LINE multicast whose type escalates LINE to email: the
/// fan-out completes, and each unclicked user gets the escalation email once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multicast_broadcast_with_a_line_escalation_completes_and_escalates_each_user() {
    let p = Platform::start_with_workers(&[Channel::Line, Channel::Email]).await;
    p.add_derived_type("promo", &["line"], &[], Some(("line", "email", 1)))
        .await;
    let users = line_topic_with_mail(&p, "shop.mcesc").await;
    let mut req = p.topic_event("mcesc:1", "promo", "shop.mcesc");
    req.line_multicast = true;
    let ev = p.create_event(req).await;
    wait_fanout_done(&p, &ev.event_id).await;
    for (_, _, mail) in &users {
        p.wait_mails(mail, 1, "the escalation mail", Duration::from_secs(15))
            .await;
    }
    let done = p.wait_final(&ev.event_id, 20).await;
    let line = on_channel(&done, "line");
    assert_eq!(line.len(), 1, "one multicast batch: {:?}", done.deliveries);
    assert_eq!(line[0].provider, "line_multicast");
}

/// Quiet hours of the due time across a DST change: a New York user's email scheduled for
/// 01:30 EST on the night the clocks spring forward (2027-03-14) waits until 07:00 EDT,
/// which is 11:00 UTC, not 12:00; a `send_at` spelled with that night's -04:00 offset
/// is the same instant as its UTC spelling. The planning clock is set, so no wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_hours_at_a_due_time_across_a_dst_change_end_at_the_local_morning() {
    let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
    let clock = ingest::clock::ManualClock::new(at("2027-03-13T20:00:00Z"));
    let p = Platform::start_with(Options::workers(&[]).clock(ingest::clock::Clock::Manual(clock)))
        .await;
    p.add_type("order_paid", &["email"]).await;
    let (u, _) = p.add_email_recipient("nyc").await;
    p.exec(
        "UPDATE recipients SET timezone = 'America/New_York' WHERE user_id = $1",
        &u,
    )
    .await;
    p.set_quiet_window(&u, "22:00", "07:00").await.unwrap();
    let mut req = p.event("dst:1", "order_paid", &[&u]);
    req.send_at = "2027-03-14T01:30:00-05:00".into();
    let created = p.create_event(req.clone()).await;
    let d = &created.deliveries[0];
    assert_eq!(
        d.deferred_until.as_ref().map(instant),
        Some(at("2027-03-14T11:00:00Z")),
        "{}",
        d.decision
    );
    assert!(
        d.decision.contains("quiet hours (America/New_York)"),
        "{}",
        d.decision
    );
    req.send_at = "2027-03-14T06:30:00Z".into();
    let again = p.create_event(req).await;
    assert!(again.duplicate, "one instant");
}

/// The in-app notification read at the very instant its escalation is due: read in time,
/// so the escalation is skipped `read_before_escalation` with no email.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_read_exactly_at_the_escalation_due_time_cancels_it() {
    let mut p = Platform::start_with_workers(&[Channel::InApp]).await;
    let (_u, mail, ev) = p.escalating_invoice(1, "exact").await;
    let due = p.escalation_due(&ev.event_id).await;
    eventually("the inbox row", Duration::from_secs(10), async || {
        let n = sqlx::query(
            "UPDATE notifications SET status = 'read', read_at = $2
             WHERE delivery_id IN (SELECT id FROM notification_deliveries
                                   WHERE event_id = $1::uuid AND channel = 'inapp')",
        )
        .bind(&ev.event_id)
        .bind(due)
        .execute(&p.pool)
        .await
        .unwrap()
        .rows_affected();
        if n == 1 { Ok(()) } else { Err(n) }
    })
    .await;
    p.start_worker(Channel::Email);
    let done = p.wait_final(&ev.event_id, 20).await;
    let email = on_channel(&done, "email")[0];
    assert_eq!(
        (
            email.status.as_str(),
            email.last_error.as_str(),
            email.attempts
        ),
        ("skipped", "read_before_escalation", 0),
        "{email:?}"
    );
    assert!(p.mails_to(&mail).await.is_empty());
}

/// An operator retrying, in the console, a failed LINE delivery of an event that was
/// canceled since: no second provider call and no revived delivery; its fallback email
/// (created with the failure, canceled with the event) stays canceled too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_retry_of_a_failed_delivery_of_a_canceled_event_sends_nothing() {
    let p = Platform::start_with_workers(&[Channel::Line]).await;
    p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
        .await;
    let (u, lid) = (uniq("ops"), support::line_id());
    p.add_recipient(&u, "", &format!("{u}@shop.example.test"), &lid)
        .await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": lid, "status": 400,
                       "body": {"message": "bad"}, "times": 1}),
    )
    .await;
    let ev = p.send("ops:1", "order_paid", &[&u]).await;
    let line = ev.deliveries[0].delivery_id.clone();
    eventually("LINE failed", Duration::from_secs(20), async || {
        let s = statuses(&p, &ev.event_id).await;
        if s.contains(&("line".into(), "failed".into(), 1)) {
            Ok(())
        } else {
            Err(s)
        }
    })
    .await;
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    assert_eq!(
        (out.failed, out.canceled),
        (1, 1),
        "the fallback email canceled: {out:?}"
    );

    let http = no_redirects();
    let cookie = p.console_cookie().await;
    let confirm = http
        .get(format!(
            "{}/console/confirm?action=retry&target={line}",
            p.http_url
        ))
        .header("cookie", &cookie)
        .text_body()
        .await;
    let r = http
        .post(format!("{}/console/actions/retry/{line}", p.http_url))
        .header("cookie", &cookie)
        .form(&[("csrf", support::csrf_token(&confirm).as_str())])
        .send()
        .await
        .unwrap();
    assert!(
        r.status().is_success() || r.status() == 303,
        "{}",
        r.status()
    );
    settle("nothing revived", Duration::from_secs(2), async || {
        let s = statuses(&p, &ev.event_id).await;
        let calls = p.sim_count("line").await;
        let ok = calls == 1
            && !s
                .iter()
                .any(|(_, st, _)| st == "pending" || st == "sending" || st == "sent");
        if ok { Ok(()) } else { Err((s, calls)) }
    })
    .await;
}

/// A LINE message scheduled two days ahead that meets a 500 when it is due is retried
/// like any other (LINE's retry key lives 24 h from the first request, and no request was
/// made before the due time): sent on the second attempt, once. The two days are made by
/// moving the delivery's creation back, so the test does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_message_scheduled_two_days_ahead_is_retried_after_a_500() {
    let mut p = Platform::start_with_type(&[], "order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("later").await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": lid, "status": 500,
                       "body": {"message": "busy"}, "times": 1}),
    )
    .await;
    let mut req = p.event("line:later", "order_paid", &[&u]);
    req.delay = "1s".into();
    let ev = p.create_event(req).await;
    p.exec(
        "UPDATE notification_deliveries SET created_at = created_at - interval '2 days'
         WHERE event_id = $1::uuid",
        &ev.event_id,
    )
    .await;
    p.start_worker(Channel::Line);
    let done = p.wait_final(&ev.event_id, 20).await;
    assert_eq!(
        support::status_attempts(&done.deliveries[0]),
        ("sent", 2),
        "{:?}",
        done.deliveries[0]
    );
}
