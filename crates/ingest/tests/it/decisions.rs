//! Who gets what, when: preference levels, quiet hours in the recipient's time zone, and
//! the decision trail that `GetEvent` and `ExplainDelivery` show.

use crate::support;

use notify_proto::v1 as pb;
use std::time::Duration;
use support::{
    Platform, assert_all_sent, eventually, field_violations, line_id, type_request, uniq,
};
use tonic::Code;

fn hhmm(t: chrono::DateTime<chrono_tz::Tz>) -> String {
    t.format("%H:%M").to_string()
}

/// A recipient inside quiet hours: in-app arrives at once, LINE and email wait in Postgres
/// until the window's end (nothing reaches the broker or LINE), `GetEvent` shows "deferred
/// until" and `ExplainDelivery` says why; a critical type is not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_hours_hold_noisy_channels_until_the_window_ends() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["inapp", "email", "line"]).await;
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        critical: true,
        ..type_request("security_login", &["line"])
    })
    .await;
    let u = uniq("u");
    p.add_recipient(&u, "", &format!("{u}@example.test"), &line_id())
        .await;
    let now = chrono::Utc::now().with_timezone(&chrono_tz::Asia::Bangkok);
    let (start, end) = (
        now - chrono::Duration::hours(1),
        now + chrono::Duration::hours(1),
    );
    // Bad windows are refused, naming the window.
    let err = p.set_quiet_window(&u, "22:00", "22:00").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let fields = field_violations(&err);
    assert_eq!(fields, ["windows[0]"]);
    p.set_quiet_hours(&u, start, end).await;
    let prefs = p.preferences(&u).await;
    assert_eq!(prefs.timezone, "Asia/Bangkok");
    assert_eq!(prefs.quiet_hours[0].end, hhmm(end));

    let ev = p.send("quiet:1", "order_paid", &[&u]).await;
    let expected_end = notify_core::quiet::first_instant(
        chrono_tz::Asia::Bangkok,
        end.date_naive(),
        notify_core::quiet::parse_hhmm(&hhmm(end)).unwrap(),
    );
    for d in &ev.deliveries {
        let deferred = d.deferred_until.as_ref().map(|t| t.seconds);
        if d.channel == "inapp" {
            assert_eq!(deferred, None);
        } else {
            assert_eq!(deferred, Some(expected_end.timestamp()), "{d:?}");
        }
    }
    // In-app is sent; LINE and email stay pending and nothing reaches LINE.
    eventually("in-app sent at once", Duration::from_secs(10), async || {
        let e = p.get_event(&ev.event_id).await;
        if e.deliveries
            .iter()
            .any(|d| d.channel == "inapp" && d.status == "sent")
        {
            Ok(())
        } else {
            Err(e.deliveries)
        }
    })
    .await;
    // Nothing reaches a worker while the quiet hours last: watched for 1 s.
    support::settle(
        "LINE and email stay pending",
        Duration::from_secs(1),
        async || {
            let e = p.get_event(&ev.event_id).await;
            let line = p.sim_requests("line").await;
            let moved: Vec<_> = e
                .deliveries
                .iter()
                .filter(|d| d.channel != "inapp" && d.status != "pending")
                .collect();
            if moved.is_empty() && line.is_empty() {
                Ok(())
            } else {
                Err(format!("{moved:#?} {line:#?}"))
            }
        },
    )
    .await;
    // Asserted on what the event is now, after the wait.
    let got = p.get_event(&ev.event_id).await;
    for d in got.deliveries.iter().filter(|d| d.channel != "inapp") {
        assert_eq!(d.status, "pending");
        assert_eq!(
            d.deferred_until.as_ref().unwrap().seconds,
            expected_end.timestamp()
        );
        assert!(
            d.decision
                .contains("quiet hours (Asia/Bangkok): deferred until"),
            "{}",
            d.decision
        );
    }
    assert!(p.sim_requests("line").await.is_empty(), "LINE waits");
    let outbox_due: chrono::DateTime<chrono::Utc> = p.scalar("SELECT min(o.available_at) FROM outbox o JOIN notification_deliveries d ON d.id = o.delivery_id
         WHERE d.event_id = $1::uuid", &ev.event_id).await;
    assert_eq!(
        outbox_due.timestamp(),
        expected_end.timestamp(),
        "it waits in Postgres"
    );

    let why = p.explain(&ev.event_id, &u, "line").await;
    assert_eq!(why.deliveries.len(), 1);
    let trail = why.trail.join("\n");
    assert!(
        trail.contains("type order_paid: priority normal, not critical"),
        "{trail}"
    );
    assert!(
        trail.contains("preference: on by the type's default channels"),
        "{trail}"
    );
    assert!(
        trail.contains("quiet hours (Asia/Bangkok): deferred until"),
        "{trail}"
    );
    assert!(trail.ends_with("status: pending"), "{trail}");

    // A critical type is not held by quiet hours.
    let critical = p.send("quiet:2", "security_login", &[&u]).await;
    assert!(critical.deliveries[0].deferred_until.is_none());
    assert!(
        critical.deliveries[0]
            .decision
            .contains("critical type, not deferred")
    );
    p.wait_final(&critical.event_id, 30).await;

    // The window ends (here the window moves behind us and the due time to now, instead of
    // waiting an hour; quiet hours are checked again when the delivery becomes due): LINE
    // is sent.
    p.set_quiet_hours(
        &u,
        now - chrono::Duration::hours(3),
        now - chrono::Duration::hours(2),
    )
    .await;
    p.exec(
        "UPDATE outbox SET available_at = now() WHERE delivery_id IN
           (SELECT id FROM notification_deliveries WHERE event_id = $1::uuid);
         ",
        &ev.event_id,
    )
    .await;
    p.exec(
        "UPDATE notification_deliveries SET next_attempt_at = now() WHERE event_id = $1::uuid",
        &ev.event_id,
    )
    .await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_all_sent(&done);
    let why = p.explain(&ev.event_id, &u, "line").await;
    assert_eq!(why.deliveries[0].attempts.len(), 1);
    assert!(
        why.trail
            .iter()
            .any(|l| l.starts_with("attempt 1: sent, provider status 200"))
    );
}

/// Each preference level decides in turn, and the skip says which one did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deciding_preference_level_is_explained() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp", "email", "line"]).await;
    let u = uniq("u");
    p.add_recipient(&u, "", &format!("{u}@example.test"), &line_id())
        .await;
    let set = |t: &str, c: &str, on: bool| {
        let (mut r, u, t, c) = (p.recipients(), u.clone(), t.to_string(), c.to_string());
        async move {
            r.set_preference(pb::SetPreferenceRequest {
                user_id: u,
                r#type: t,
                channel: c,
                enabled: on,
            })
            .await
            .unwrap();
        }
    };
    set("*", "email", false).await; // channel-wide: email off
    set("order_paid", "*", true).await; // type-wide: on, beats the channel switch
    set("order_paid", "line", false).await; // type x channel: LINE off
    let ev = p.send("prefs:1", "order_paid", &[&u]).await;
    let channels: Vec<&str> = ev.deliveries.iter().map(|d| d.channel.as_str()).collect();
    assert_eq!(channels, ["inapp", "email"]);
    assert!(
        ev.deliveries[1]
            .decision
            .contains("on by the user's switch for this type on every channel")
    );
    let why = p.explain(&ev.event_id, &u, "line").await;
    assert_eq!(why.skipped.as_ref().unwrap().reason, "opted_out");
    assert!(
        why.trail
            .iter()
            .any(|l| l == "preference: off by the user's setting for this type on line"),
        "{:?}",
        why.trail
    );
    let err = p
        .recipients()
        .set_preference(pb::SetPreferenceRequest {
            user_id: u.clone(),
            r#type: "*".into(),
            channel: "*".into(),
            enabled: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let prefs = p.preferences(&u).await;
    assert_eq!(prefs.preferences.len(), 3);
}

/// A type with a dedup window: the same key within one bucket is a duplicate; in the next
/// bucket it is a new event; `GetEvent` by the caller's key finds the latest. The planning
/// clock is set, so the buckets are chosen by the test, not waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedup_window_merges_repeats_within_a_bucket_only() {
    // Buckets are [2k, 2k+2) seconds since the epoch: start 50 ms into one.
    let now = chrono::Utc::now().timestamp_millis();
    let start = chrono::DateTime::from_timestamp_millis(now - now.rem_euclid(2_000) + 50).unwrap();
    let clock = ingest::clock::ManualClock::new(start);
    let p = Platform::start_with(support::Options {
        workers: vec![],
        clock: ingest::clock::Clock::Manual(clock.clone()),
        ..Default::default()
    })
    .await;
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        dedup_window_seconds: 2,
        ..type_request("stock_low", &["inapp"])
    })
    .await;
    let u = uniq("u");
    let first = p.send("stock:sku-1", "stock_low", &[&u]).await;
    // The last instant of the same bucket.
    clock.advance(chrono::Duration::milliseconds(1_949));
    let again = p.send("stock:sku-1", "stock_low", &[&u]).await;
    assert!(!first.duplicate);
    assert!(again.duplicate, "same bucket");
    assert_eq!(again.event_id, first.event_id);
    // The first instant of the next bucket.
    clock.advance(chrono::Duration::milliseconds(1));
    let later = p.send("stock:sku-1", "stock_low", &[&u]).await;
    assert!(!later.duplicate, "next bucket: a new event");
    assert_ne!(later.event_id, first.event_id);
    let found = p
        .ingest()
        .get_event(pb::GetEventRequest {
            selector: Some(pb::get_event_request::Selector::EventKey(
                "stock:sku-1".into(),
            )),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(found.event_id, later.event_id, "the latest bucket's event");
    assert!(
        found.event_key.starts_with("stock:sku-1|dedup@"),
        "{}",
        found.event_key
    );
}

/// Fatigue caps (LINE: 2 per user per rolling hour): the third non-critical event in the
/// hour is deferred an hour (type `defer`) or dropped as `throttled` (type `drop`); a
/// critical type is neither capped nor counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fatigue_caps_defer_or_drop_past_the_hourly_cap() {
    let p = Platform::start_with(support::Options {
        workers: vec![notify_core::Channel::Line, notify_core::Channel::InApp],
        fatigue_caps: [(notify_core::Channel::Line, 2)].into(),
        ..Default::default()
    })
    .await;
    for (key, over_cap, critical) in [
        ("news", "defer", false),
        ("promo", "drop", false),
        ("otp", "", true),
    ] {
        p.upsert_type(pb::UpsertNotificationTypeRequest {
            key: key.into(),
            default_channels: vec!["line".into(), "inapp".into()],
            over_cap: over_cap.into(),
            critical,
            ..Default::default()
        })
        .await;
    }
    let u = uniq("u");
    p.add_recipient(&u, "", "", &line_id()).await;
    let first = p.send("news:1", "news", &[&u]).await;
    let otp = p.send("otp:1", "otp", &[&u]).await;
    let second = p.send("news:2", "news", &[&u]).await;
    let third = p.send("news:3", "news", &[&u]).await;
    let dropped = p.send("promo:1", "promo", &[&u]).await;
    let line =
        |ev: &pb::CreateEventResponse| ev.deliveries.iter().find(|d| d.channel == "line").cloned();
    assert!(line(&first).unwrap().deferred_until.is_none());
    assert!(
        line(&otp).unwrap().deferred_until.is_none(),
        "critical: not capped"
    );
    assert!(
        line(&second).unwrap().deferred_until.is_none(),
        "critical did not count"
    );
    let held = line(&third).unwrap();
    let wait = held.deferred_until.as_ref().unwrap().seconds - chrono::Utc::now().timestamp();
    assert!(
        (3590..=3600).contains(&wait),
        "deferred to the next free slot, in {wait}s"
    );
    assert!(
        held.decision
            .contains("fatigue cap: 2 per hour on line reached; deferred until"),
        "{}",
        held.decision
    );
    assert!(line(&dropped).is_none());
    let skip = dropped
        .skipped
        .iter()
        .find(|s| s.channel == "line")
        .unwrap();
    assert_eq!(skip.reason, "throttled");
    assert!(
        dropped.deliveries.iter().any(|d| d.channel == "inapp"),
        "in-app is not capped here"
    );
    // The capped delivery waits in Postgres; the others go out.
    p.wait_final(&first.event_id, 30).await;
    p.wait_final(&second.event_id, 30).await;
    assert_eq!(p.sim_count("line").await, 3, "news 1, otp, news 2");
}
