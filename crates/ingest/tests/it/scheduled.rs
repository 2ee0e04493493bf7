//! Scheduled sends: `send_at` and `delay` on `CreateEvent`. The deliveries are written
//! at call time, wait in Postgres (not in the broker) until due, and go out on time on
//! every channel, across restarts; bad values are refused by field.

use crate::support;

use chrono::{DateTime, Utc};
use std::time::Duration;
use support::{Platform, eventually, uniq, violations};
use tonic::Code;

/// The instant of a protobuf timestamp.
fn instant(t: &prost_types::Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(t.seconds, t.nanos as u32).expect("timestamp in range")
}

/// The instant of an RFC 3339 text (the simulator's and MailDev's arrival times).
fn parse_time(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s:?}: {e}"))
        .with_timezone(&Utc)
}

/// Asserts that `at` (a provider's arrival time) is at `due` or within 1 s after it;
/// 50 ms before it are tolerated for the two clocks' reads (host and database).
fn on_time(what: &str, at: DateTime<Utc>, due: DateTime<Utc>) {
    let late = at - due;
    assert!(
        late >= chrono::Duration::milliseconds(-50) && late <= chrono::Duration::seconds(1),
        "{what}: arrived at {at}, due at {due} ({} ms after)",
        late.num_milliseconds()
    );
}

/// Waits until the host clock shows `t`.
async fn until(t: DateTime<Utc>) {
    eventually(
        &format!("the clock at {t}"),
        Duration::from_secs(60),
        async || {
            let now = Utc::now();
            if now >= t { Ok(()) } else { Err(now) }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_five_seconds_ahead_reaches_every_channel_within_a_second_of_its_time() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["inapp", "email", "line", "push"])
        .await;
    let u = uniq("somchai");
    let mail = format!("{u}@example.test");
    let line = support::line_id();
    p.add_recipient(&u, "สมชาย ใจดี", &mail, &line).await;
    p.add_device(&u, &format!("{u}-phone")).await;

    let mut req = p.event(&uniq("order:5s"), "order_paid", &[&u]);
    req.delay = "5s".into();
    let created = p.create_event(req).await;
    let due = instant(created.send_at.as_ref().expect("a due time in the reply"));
    let ahead = due - Utc::now();
    assert!(
        ahead > chrono::Duration::seconds(4) && ahead <= chrono::Duration::seconds(5),
        "due {ahead:?} ahead"
    );
    assert_eq!(created.deliveries.len(), 4, "{:?}", created.deliveries);
    for d in &created.deliveries {
        assert_eq!(d.next_attempt_at.as_ref().map(instant), Some(due), "{d:?}");
        // Due then, not deferred: the API leaves deferred_until unset when nothing held
        // the delivery past its due time (issue 44).
        assert_eq!(d.deferred_until, None, "{d:?}");
        assert!(
            d.decision
                .contains(&format!("scheduled for {}", due.to_rfc3339())),
            "{}",
            d.decision
        );
    }
    let event_id = created.event_id.clone();

    // A second before it is due nothing has gone out anywhere.
    until(due - chrono::Duration::seconds(1)).await;
    let inbox_rows = async || -> Vec<DateTime<Utc>> {
        p.scalars(
            "SELECT created_at FROM notifications WHERE user_id = $1",
            &u,
        )
        .await
    };
    assert!(
        inbox_rows().await.is_empty(),
        "the inbox before the due time"
    );
    assert!(
        p.mails_to(&mail).await.is_empty(),
        "email before the due time"
    );
    assert!(
        p.sim_requests("line").await.is_empty(),
        "LINE before the due time"
    );
    assert!(
        p.sim_requests("fcm").await.is_empty(),
        "FCM before the due time"
    );
    let early = p.get_event(&event_id).await;
    assert!(
        early.deliveries.iter().all(|d| d.status == "pending"),
        "{:?}",
        early.deliveries
    );
    assert!(
        early
            .deliveries
            .iter()
            .all(|d| d.deferred_until.is_none()
                && d.next_attempt_at.as_ref().map(instant) == Some(due)),
        "stored as not deferred, due then: {:?}",
        early.deliveries
    );

    let done = p.wait_final(&event_id, 15).await;
    support::assert_all_sent(&done);
    let inbox = inbox_rows().await;
    assert_eq!(inbox.len(), 1);
    on_time("in-app", inbox[0], due);
    let mails = p.mails_to(&mail).await;
    assert_eq!(mails.len(), 1);
    // MailDev keeps the Date header's whole seconds: within the second of the due time
    // or the next one.
    let mail_at = parse_time(mails[0]["time"].as_str().expect("MailDev's time"));
    let due_second = DateTime::from_timestamp(due.timestamp(), 0).unwrap();
    assert!(
        mail_at >= due_second && mail_at <= due + chrono::Duration::seconds(1),
        "email: dated {mail_at}, due at {due}"
    );
    let line_calls = p.sim_requests("line").await;
    assert_eq!(line_calls.len(), 1);
    on_time(
        "LINE",
        parse_time(line_calls[0]["received_at"].as_str().unwrap()),
        due,
    );
    let fcm_calls = p.sim_requests("fcm").await;
    assert_eq!(fcm_calls.len(), 1);
    on_time(
        "push",
        parse_time(fcm_calls[0]["received_at"].as_str().unwrap()),
        due,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_at_in_the_past_sends_now_and_an_offset_is_stored_as_its_instant() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["inapp"]).await;
    let u = p.add_bare_recipient("somying").await;

    let mut past = p.event(&uniq("order:past"), "order_paid", &[&u]);
    past.send_at = (Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let created = p.create_event(past).await;
    assert_eq!(created.send_at, None, "sent now");
    assert!(
        !created.deliveries[0].decision.contains("scheduled"),
        "{}",
        created.deliveries[0].decision
    );
    let done = p.wait_final(&created.event_id, 10).await;
    support::assert_all_sent(&done);
    assert_eq!(done.send_at, None);

    // 09:00 in Bangkok (+07:00) a day ahead is 02:00 UTC: that instant is stored.
    let bangkok = chrono::FixedOffset::east_opt(7 * 3600).unwrap();
    let at = (Utc::now() + chrono::Duration::days(1))
        .with_timezone(&bangkok)
        .date_naive()
        .and_hms_opt(9, 0, 0)
        .unwrap()
        .and_local_timezone(bangkok)
        .unwrap();
    let text = at.to_rfc3339();
    assert!(text.ends_with("09:00:00+07:00"), "{text}");
    let key = uniq("order:bangkok");
    let mut req = p.event(&key, "order_paid", &[&u]);
    req.send_at = text.clone();
    let created = p.create_event(req.clone()).await;
    let due = at.with_timezone(&Utc);
    assert_eq!(created.send_at.as_ref().map(instant), Some(due));
    let stored: Option<DateTime<Utc>> = p
        .scalar(
            "SELECT send_at FROM notification_events WHERE id = $1::uuid",
            &created.event_id,
        )
        .await;
    assert_eq!(stored, Some(due));
    let outbox: Vec<DateTime<Utc>> = p
        .scalars(
            "SELECT available_at FROM outbox WHERE delivery_id = $1::uuid",
            &created.deliveries[0].delivery_id,
        )
        .await;
    assert_eq!(outbox, [due], "the outbox row waits for the due time");

    // The same send_at (spelled in UTC) is a replay; another one is other content.
    req.send_at = due.to_rfc3339();
    let again = p.create_event(req.clone()).await;
    assert!(again.duplicate);
    assert_eq!(again.event_id, created.event_id);
    assert_eq!(again.send_at.as_ref().map(instant), Some(due));
    req.send_at = (due + chrono::Duration::minutes(1)).to_rfc3339();
    let err = p.ingest().create_event(req).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_by_field_and_nothing_is_written() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp"]).await;
    let u = p.add_bare_recipient("wichai").await;
    let beyond =
        (Utc::now() + chrono::Duration::days(30) + chrono::Duration::minutes(5)).to_rfc3339();
    let cases: [(&str, &str, &str, &str, &str); 6] = [
        (
            "unparseable send_at",
            "tomorrow at 9",
            "",
            "send_at",
            "RFC 3339",
        ),
        (
            "send_at without an offset",
            "2026-12-02T09:00:00",
            "",
            "send_at",
            "offset",
        ),
        ("unparseable delay", "", "5 minutes", "delay", "15m"),
        ("send_at beyond the horizon", &beyond, "", "send_at", "30d"),
        ("delay beyond the horizon", "", "31d", "delay", "30d"),
        (
            "both",
            "2026-12-02T09:00:00+07:00",
            "5s",
            "delay",
            "send_at and delay are exclusive",
        ),
    ];
    for (name, send_at, delay, field, says) in cases {
        let mut req = p.event(&uniq("order:bad"), "order_paid", &[&u]);
        req.send_at = send_at.into();
        req.delay = delay.into();
        let err = p.ingest().create_event(req).await.expect_err(name);
        let found = violations(&err);
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        assert_eq!(found[0].0, field, "{name}: {found:?}");
        assert!(found[0].1.contains(says), "{name}: {found:?}");
    }
    assert_eq!(p.count("notification_events").await, 0);
    assert_eq!(p.count("notification_deliveries").await, 0);
    assert_eq!(p.count("outbox").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_delivery_survives_a_restart_of_ingest_and_the_workers() {
    let mut p = Platform::start_with(support::Options {
        workers: vec![notify_core::Channel::Line],
        ingest_in_process: false,
        ..Default::default()
    })
    .await;
    // A horizon of 2 minutes, as set.
    let horizon = [("NOTIFY_SCHEDULE_HORIZON", "2m".to_string())];
    let mut ingest = p.spawn("ingest", &["serve"], &horizon);
    p.wait_serving().await;
    p.add_type("order_paid", &["line"]).await;
    let (u, line) = p.add_line_recipient("u").await;
    let mut req = p.event(&uniq("order:restart"), "order_paid", &[&u]);
    req.delay = "121s".into();
    let err = p.ingest().create_event(req.clone()).await.unwrap_err();
    let found = violations(&err);
    assert_eq!(found[0].0, "delay", "{found:?}");
    assert!(found[0].1.contains("at most 2m ahead"), "{found:?}");
    req.delay = "4s".into();
    let created = p.create_event(req).await;
    let due = instant(created.send_at.as_ref().unwrap());

    // Ingest dies (SIGKILL: no drain, no goodbye) and the workers stop, before it is due.
    ingest.child.kill().await.unwrap();
    p.stop_workers().await;
    assert!(Utc::now() < due, "restarted before the due time");
    assert!(p.sim_requests("line").await.is_empty());

    ingest = p.spawn("ingest", &["serve"], &horizon);
    p.start_worker(notify_core::Channel::Line);
    p.wait_serving().await;
    let done = p.wait_final(&created.event_id, 20).await;
    support::assert_sent(&done.deliveries[0]);
    assert_eq!(done.deliveries[0].attempts, 1);
    let calls = p.sim_requests("line").await;
    assert_eq!(calls.len(), 1, "sent once: {calls:?}");
    assert_eq!(calls[0]["body"]["to"], line.as_str());
    let at = parse_time(calls[0]["received_at"].as_str().unwrap());
    assert!(
        at >= due - chrono::Duration::milliseconds(50),
        "sent at {at}, due at {due}"
    );
    drop(ingest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_event_shows_the_due_time_of_each_scheduled_delivery_and_the_event() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp", "email"]).await;
    let (a, b) = (uniq("somchai"), uniq("somying"));
    p.add_recipient(&a, "", &format!("{a}@example.test"), "")
        .await;
    p.add_recipient(&b, "", &format!("{b}@example.test"), "")
        .await;
    p.set_preference(&b, "order_paid", "email", false).await;
    p.create_topic("shop.reminders").await;
    p.subscribe("shop.reminders", &[&a, &b]).await;

    // Whole seconds: Postgres keeps microseconds.
    let due = DateTime::from_timestamp(Utc::now().timestamp() + 7200, 0)
        .unwrap()
        .with_timezone(&chrono::FixedOffset::east_opt(7 * 3600).unwrap());
    let due_utc = due.with_timezone(&Utc);
    for (listed, topic) in [
        (vec![a.as_str(), b.as_str()], ""),
        (vec![], "shop.reminders"),
    ] {
        let mut req = p.event(&uniq("reminder"), "order_paid", &listed);
        req.topic = topic.into();
        req.send_at = due.to_rfc3339();
        let created = p.create_event(req).await;
        assert_eq!(created.send_at.as_ref().map(instant), Some(due_utc));
        let ev = eventually(
            "every delivery planned",
            Duration::from_secs(10),
            async || {
                let ev = p.get_event(&created.event_id).await;
                if ev.deliveries.len() == 4 {
                    Ok(ev)
                } else {
                    Err(ev.deliveries)
                }
            },
        )
        .await;
        assert_eq!(ev.send_at.as_ref().map(instant), Some(due_utc), "{topic:?}");
        assert!(ev.skipped.is_empty(), "{topic:?}: {:?}", ev.skipped);
        for d in &ev.deliveries {
            assert_eq!(d.status, "pending", "{d:?}");
            assert_eq!(
                d.next_attempt_at.as_ref().map(instant),
                Some(due_utc),
                "{d:?}"
            );
            assert_eq!(d.deferred_until, None, "{d:?}");
            let scheduled = format!("scheduled for {}", due_utc.to_rfc3339());
            assert!(d.decision.contains(&scheduled), "{}", d.decision);
        }
        // b turned email off: decided again when due, not skipped now.
        let off = ev
            .deliveries
            .iter()
            .find(|d| d.user_id == b && d.channel == "email")
            .expect("b's email delivery");
        assert!(
            off.decision.starts_with(&format!(
                "preference: off now; decided again when due at {}",
                due_utc.to_rfc3339()
            )),
            "{}",
            off.decision
        );
    }
}

/// Planned at the due time: quiet hours (22:00 to 07:00 Bangkok) that do not hold at the
/// call (12:00) but hold at the due time (22:30) defer the email to 07:00; the same event
/// sent at once goes now. The planning clock is set, so no wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_hours_are_those_of_the_due_time_not_of_the_call() {
    let bangkok = chrono_tz::Asia::Bangkok;
    let day = (Utc::now() + chrono::Duration::days(1))
        .with_timezone(&bangkok)
        .date_naive();
    let local = |d: chrono::NaiveDate, h: u32, m: u32| {
        d.and_hms_opt(h, m, 0)
            .unwrap()
            .and_local_timezone(bangkok)
            .unwrap()
    };
    let clock = ingest::clock::ManualClock::new(local(day, 12, 0).with_timezone(&Utc));
    let p = Platform::start_with(support::Options {
        workers: vec![],
        clock: ingest::clock::Clock::Manual(clock),
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["email"]).await;
    let (u, _) = p.add_email_recipient("somchai").await;
    p.set_quiet_hours(&u, local(day, 22, 0), local(day, 7, 0))
        .await;

    let now = p
        .send(&uniq("order:now"), "order_paid", &[&u])
        .await
        .deliveries;
    assert_eq!(now[0].deferred_until, None, "12:00 is outside the window");

    let mut req = p.event(&uniq("order:night"), "order_paid", &[&u]);
    req.send_at = local(day, 22, 30).to_rfc3339();
    let created = p.create_event(req).await;
    let morning = local(day.succ_opt().unwrap(), 7, 0).with_timezone(&Utc);
    let d = &created.deliveries[0];
    assert_eq!(
        d.deferred_until.as_ref().map(instant),
        Some(morning),
        "{}",
        d.decision
    );
    let stored = p.get_event(&created.event_id).await.deliveries;
    assert_eq!(
        stored[0].next_attempt_at.as_ref().map(instant),
        Some(morning),
        "{}",
        stored[0].decision
    );
    assert!(
        d.decision
            .contains("quiet hours (Asia/Bangkok): deferred until"),
        "{}",
        d.decision
    );
}
