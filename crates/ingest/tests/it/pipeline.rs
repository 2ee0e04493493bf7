//! End-to-end tests through the gRPC API on real PostgreSQL, RabbitMQ and MailDev, with
//! the provider simulator standing in for LINE and FCM.

use crate::support;

use notify_proto::v1 as pb;
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;
use support::{
    Platform, assert_all_sent, assert_sent, delivery_of, event_request, eventually,
    field_violations, line_id, on_channel, status_attempts, uniq,
};
use tonic::Code;
use tonic_types::StatusExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_reaches_every_channel_once_and_a_replay_is_a_duplicate() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["inapp", "email", "line", "push"])
        .await;
    let (a, b, c) = (uniq("somchai"), uniq("somying"), uniq("wichai"));
    let (a_mail, b_mail, c_mail) = (
        format!("{a}@example.test"),
        format!("{b}@example.test"),
        format!("{c}@example.test"),
    );
    let (a_line, c_line) = (line_id(), line_id());
    p.add_recipient(&a, "สมชาย ใจดี", &a_mail, &a_line).await;
    p.add_recipient(&b, "สมหญิง รักไทย", &b_mail, "").await;
    p.add_recipient(&c, "วิชัย ศรีสุข", &c_mail, &c_line).await;
    p.add_device(&a, &format!("{a}-phone")).await;
    p.add_device(&a, &format!("{a}-tablet")).await;
    p.add_device(&b, &format!("{b}-phone")).await;
    p.set_preference(&c, "order_paid", "email", false).await;

    let req = p.event(&uniq("order:123:paid"), "order_paid", &[&a, &b, &c]);
    let first = p.create_event(req.clone()).await;
    assert!(!first.duplicate);
    let planned: Vec<(String, u32)> = first
        .planned
        .iter()
        .map(|c| (c.channel.clone(), c.count))
        .collect();
    assert_eq!(
        planned,
        [
            ("inapp".into(), 3),
            ("email".into(), 2),
            ("push".into(), 3),
            ("line".into(), 2)
        ]
    );
    let skipped: HashSet<(String, String, String)> = first
        .skipped
        .iter()
        .map(|s| (s.user_id.clone(), s.channel.clone(), s.reason.clone()))
        .collect();
    assert_eq!(
        skipped,
        HashSet::from([
            (b.clone(), "line".into(), "no_line_user_id".into()),
            (c.clone(), "email".into(), "opted_out".into()),
            (c.clone(), "push".into(), "no_push_endpoint".into()),
        ])
    );

    let second = p.create_event(req).await;
    assert!(second.duplicate);
    assert_eq!(second.event_id, first.event_id);
    assert_eq!(
        second.deliveries.len(),
        10,
        "the duplicate reply lists the first request's deliveries"
    );

    let ev = p.wait_final(&first.event_id, 30).await;
    assert_eq!(ev.deliveries.len(), 10);
    for d in &ev.deliveries {
        assert_eq!((d.status.as_str(), d.attempts), ("sent", 1), "{d:?}");
    }
    assert_eq!(p.count("notification_events").await, 1);
    assert_eq!(
        p.count("notifications").await,
        3,
        "one in-app row per recipient"
    );
    assert_eq!(
        p.count("outbox").await,
        0,
        "every outbox row was confirmed and deleted"
    );

    // Email: one per recipient with an address and email on, Thai intact, stable Message-ID.
    for (addr, name) in [(&a_mail, "สมชาย ใจดี"), (&b_mail, "สมหญิง รักไทย")]
    {
        let mails = p.mails_to(addr).await;
        assert_eq!(mails.len(), 1, "{addr}");
        assert_eq!(mails[0]["subject"], "ชำระเงินแล้ว #1001");
        assert_eq!(mails[0]["to"][0]["name"], name);
        assert_eq!(mails[0]["from"][0]["name"], "ฝ่ายบริการลูกค้า, ร้านตัวอย่าง");
        let d = ev
            .deliveries
            .iter()
            .find(|d| d.channel == "email" && addr.starts_with(&d.user_id))
            .unwrap();
        assert_eq!(
            mails[0]["headers"]["message-id"],
            format!("<{}@example.test>", d.delivery_id)
        );
    }
    assert!(p.mails_to(&c_mail).await.is_empty(), "email turned off");

    // LINE: one push per LINE recipient, each with its own retry key, as stored.
    let line = p.sim_requests("line").await;
    let to: HashSet<&str> = line
        .iter()
        .map(|r| r["body"]["to"].as_str().unwrap())
        .collect();
    assert_eq!(to, HashSet::from([a_line.as_str(), c_line.as_str()]));
    let keys: HashSet<&str> = line
        .iter()
        .map(|r| r["headers"]["x-line-retry-key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2);
    assert!(
        line.iter()
            .all(|r| r["headers"]["authorization"] == format!("Bearer {}", support::LINE_TOKEN))
    );

    // FCM: one request per device, with an OAuth token from the service-account key.
    let fcm = p.sim_requests("fcm").await;
    let tokens: HashSet<&str> = fcm
        .iter()
        .map(|r| r["body"]["message"]["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        tokens,
        HashSet::from([
            format!("{a}-phone").as_str(),
            format!("{a}-tablet").as_str(),
            format!("{b}-phone").as_str()
        ])
    );
    assert!(fcm.iter().all(|r| {
        r["headers"]["authorization"]
            .as_str()
            .unwrap()
            .starts_with("Bearer ya29.sim-")
    }));
    assert_eq!(p.sim_count("oauth").await, 1, "the access token is cached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_identical_requests_make_one_event() {
    let p = Platform::start_with_type(&[], "comment_reply", &["inapp"]).await;
    let req = p.event("comment:55:reply:9", "comment_reply", &["u1", "u2"]);
    let calls = (0..20).map(|_| {
        let mut client = p.ingest();
        let req = req.clone();
        tokio::spawn(async move { client.create_event(req).await })
    });
    let replies = futures_util::future::join_all(calls).await;
    let ids: HashSet<String> = replies
        .into_iter()
        .map(|r| {
            r.unwrap()
                .expect("every call succeeds")
                .into_inner()
                .event_id
        })
        .collect();
    assert_eq!(ids.len(), 1, "one event id for all 20 replies");
    assert_eq!(p.count("notification_events").await, 1);
    assert_eq!(p.count("notification_deliveries").await, 2);
}

/// The event writer has connections of its own: `CreateEvent` is written while every
/// connection of ingest's main pool is held (by slow reads, the relay, the fan-out), where
/// before it waited for one and failed `UNAVAILABLE` after the pool's 5 s acquire timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_event_is_written_while_the_main_pool_is_exhausted() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp"]).await;
    // Hold every connection the main pool will give (its size, less what the LISTEN
    // connections keep); the pool's acquire timeout is 5 s.
    let mut held = Vec::new();
    while let Ok(Ok(conn)) =
        tokio::time::timeout(Duration::from_millis(500), p.pool.acquire()).await
    {
        held.push(conn);
    }
    assert!(!held.is_empty(), "the main pool gave no connection");
    let started = std::time::Instant::now();
    let reply = tokio::time::timeout(
        Duration::from_secs(4),
        p.ingest()
            .create_event(p.event("order:pool:1", "order_paid", &["u1"])),
    )
    .await
    .expect("CreateEvent answered before the main pool's acquire timeout")
    .expect("CreateEvent succeeded with the main pool exhausted");
    assert!(!reply.into_inner().event_id.is_empty());
    assert!(started.elapsed() < Duration::from_secs(4));
    drop(held);
    assert_eq!(p.count("notification_events").await, 1);
    assert_eq!(p.count("notification_deliveries").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_written_together_each_get_their_own_answer() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp", "email"]).await;
    p.add_recipient("u1", "สมชาย", "somchai@example.test", "")
        .await;
    // 120 requests at once, so the writer commits them in shared transactions: 100 good
    // ones, 8 naming an unknown type, 8 repeating one key, 4 broadcasting to no topic.
    let mut reqs = Vec::new();
    for i in 0..100 {
        reqs.push((
            "good",
            p.event(&format!("order:{i}"), "order_paid", &["u1", "u2"]),
        ));
    }
    for i in 0..8 {
        reqs.push((
            "unknown_type",
            p.event(&format!("bad:{i}"), "no_such_type", &["u1"]),
        ));
    }
    for _ in 0..8 {
        reqs.push(("repeat", p.event("order:repeated", "order_paid", &["u1"])));
    }
    for i in 0..4 {
        let mut r = p.event(&format!("topic:{i}"), "order_paid", &[]);
        r.topic = "no.such.topic".into();
        reqs.push(("unknown_topic", r));
    }
    let calls = reqs.into_iter().map(|(kind, req)| {
        let mut client = p.ingest();
        tokio::spawn(async move { (kind, req.event_key.clone(), client.create_event(req).await) })
    });
    let mut repeat_ids = HashSet::new();
    let mut repeat_new = 0;
    for reply in futures_util::future::join_all(calls).await {
        let (kind, key, reply) = reply.unwrap();
        match kind {
            "good" => {
                let r = reply.expect("a good request succeeds").into_inner();
                assert!(!r.duplicate, "{key}");
                // u1 gets in-app and email; u2 has no recipient row: in-app only.
                assert_eq!(r.deliveries.len(), 3, "{key}: {:?}", r.deliveries);
                assert!(r.deliveries.iter().all(|d| !d.delivery_id.is_empty()));
                assert_eq!(r.skipped.len(), 1, "{key}: u2 has no email address");
            }
            "unknown_type" => {
                let e = reply.unwrap_err();
                assert_eq!(e.code(), Code::NotFound, "{key}: {e:?}");
                assert!(e.message().contains("no_such_type"), "{e:?}");
            }
            "unknown_topic" => {
                let e = reply.unwrap_err();
                assert_eq!(e.code(), Code::NotFound, "{key}: {e:?}");
                assert!(e.message().contains("no.such.topic"), "{e:?}");
            }
            _ => {
                let r = reply.expect("a repeat succeeds").into_inner();
                repeat_ids.insert(r.event_id);
                if !r.duplicate {
                    repeat_new += 1;
                }
            }
        }
    }
    assert_eq!(repeat_ids.len(), 1, "the repeated key made one event");
    assert_eq!(repeat_new, 1, "only the first of the repeats is new");
    assert_eq!(p.count("notification_events").await, 101);
    assert_eq!(p.count("notification_deliveries").await, 100 * 3 + 2);
    assert_eq!(p.count("delivery_skips").await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_fails_in_the_database_does_not_fail_the_requests_committed_with_it() {
    // With the default single writer (the failed batch's events are retried alone while
    // nothing else is written) and with four.
    for writers in [1, 4] {
        one_failing_request_among_sixty(writers).await;
    }
}

async fn one_failing_request_among_sixty(writers: usize) {
    let p = Platform::start_with(support::Options {
        workers: Vec::new(),
        ingest_writers: writers,
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["inapp"]).await;
    // A database-side failure for one key only (as a constraint or a trigger would raise).
    p.execute("CREATE FUNCTION test_reject_key() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.event_key LIKE 'poison:%' THEN RAISE EXCEPTION 'rejected by test trigger'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER test_reject_key BEFORE INSERT ON notification_events
             FOR EACH ROW EXECUTE FUNCTION test_reject_key();").await;
    let calls = (0..60).map(|i| {
        let key = if i % 20 == 7 {
            format!("poison:{i}")
        } else {
            format!("fine:{i}")
        };
        let mut client = p.ingest();
        let req = p.event(&key, "order_paid", &["u1"]);
        tokio::spawn(async move { (key, client.create_event(req).await) })
    });
    let mut ok = 0;
    for reply in futures_util::future::join_all(calls).await {
        let (key, reply) = reply.unwrap();
        if key.starts_with("poison:") {
            let e = reply.expect_err("the poisoned request fails");
            assert!(
                !e.message().contains("rejected by test trigger"),
                "no SQL error text reaches the caller: {e:?}"
            );
        } else {
            let r = reply.expect("its neighbours succeed").into_inner();
            assert_eq!(r.deliveries.len(), 1, "{key}");
            ok += 1;
        }
    }
    assert_eq!(ok, 57);
    assert_eq!(p.count("notification_events").await, 57);
    assert_eq!(p.count("notification_deliveries").await, 57);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_line_text_is_split_into_up_to_five_messages_at_grapheme_boundaries() {
    let p = Platform::start_with_type(&[notify_core::Channel::Line], "news", &["line"]).await;
    let (u1, u2) = (uniq("u"), uniq("u"));
    p.add_recipient(&u1, "", "", &line_id()).await;
    p.add_recipient(&u2, "", "", &line_id()).await;
    // 12,600 UTF-16 units of Thai with vowels and tone marks: three text objects.
    let mut long = p.event("news:long", "news", &[&u1]);
    long.content.as_mut().unwrap().body = "ขอบคุณที่ใช้บริการ".repeat(700);
    long.content.as_mut().unwrap().url = String::new();
    let ev = p.create_event(long).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent");
    let reqs = p.sim_requests("line").await;
    assert_eq!(reqs.len(), 1, "one push");
    let messages = reqs[0]["body"]["messages"].as_array().unwrap().clone();
    assert_eq!(messages.len(), 3);
    let texts: Vec<&str> = messages
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts.concat(),
        format!("ชำระเงินแล้ว #1001\n{}", "ขอบคุณที่ใช้บริการ".repeat(700)),
        "the pieces join back into the text, nothing lost or added"
    );
    for t in &texts {
        assert!(t.encode_utf16().count() <= 5000);
        let first = t.chars().next().unwrap();
        assert!(
            !matches!(first, '\u{0E31}' | '\u{0E34}'..='\u{0E3A}' | '\u{0E47}'..='\u{0E4E}'),
            "a piece starts with a Thai vowel or tone mark"
        );
    }
    // Exactly 5,000 Thai characters with tone marks, then an emoji: with the title the
    // text passes 5,000 units, so it becomes two objects, cut between whole clusters,
    // with the emoji's surrogate pair whole, and byte for byte what was sent.
    let u3 = uniq("u");
    p.add_recipient(&u3, "", "", &line_id()).await;
    let thai: String = "น้ำใจไม่ต้องซื้อ ผู้ใหญ่ใจดี ".chars().cycle().take(5000).collect();
    let body = format!("{thai}👍🏽");
    let mut exact = p.event("news:5000", "news", &[&u3]);
    exact.content.as_mut().unwrap().body = body.clone();
    exact.content.as_mut().unwrap().url = String::new();
    let ev = p.create_event(exact).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent");
    let texts = p.line_texts(1).await;
    assert_eq!(texts.len(), 2);
    assert_eq!(
        texts.concat().as_bytes(),
        format!("ชำระเงินแล้ว #1001\n{body}").as_bytes()
    );
    assert!(
        texts.last().unwrap().ends_with("👍🏽"),
        "the emoji with its skin tone stays whole"
    );
    for t in &texts {
        assert!(t.encode_utf16().count() <= 5000);
        let first = t.chars().next().unwrap();
        assert!(
            !matches!(first, '\u{0E31}' | '\u{0E34}'..='\u{0E3A}' | '\u{0E47}'..='\u{0E4E}' | '\u{1F3FB}'..='\u{1F3FF}')
        );
    }

    // 26,000 units of emoji (each a surrogate pair): more than five objects.
    let mut too_long = p.event("news:too-long", "news", &[&u2]);
    too_long.content.as_mut().unwrap().body = "😀".repeat(13_000);
    let ev = p.create_event(too_long).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "failed");
    assert!(
        done.deliveries[0]
            .last_error
            .starts_with("content_too_long"),
        "{}",
        done.deliveries[0].last_error
    );
    assert_eq!(p.sim_count("line").await, 2, "nothing was pushed for it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_monthly_quota_pauses_the_channel_without_spending_attempts() {
    let p = Platform::start_with_type(&[notify_core::Channel::Line], "news", &["line"]).await;
    let (u1, u2) = (uniq("u"), uniq("u"));
    p.add_recipient(&u1, "", "", &line_id()).await;
    p.add_recipient(&u2, "", "", &line_id()).await;
    p.sim_fault(json!({"provider": "line", "status": 429,
        "body": {"message": "You have reached your monthly limit."}, "times": 1}))
        .await;
    let first = p.send("quota:1", "news", &[&u1]).await;
    let row = |id: String| {
        let pool = p.pool.clone();
        async move {
            sqlx::query_as::<
                _,
                (
                    String,
                    i32,
                    i32,
                    Option<String>,
                    chrono::DateTime<chrono::Utc>,
                ),
            >(
                "SELECT status, attempts, max_attempts, last_error, next_attempt_at
                 FROM notification_deliveries WHERE id = $1::uuid",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let id1 = first.deliveries[0].delivery_id.clone();
    let until = eventually("LINE is paused", Duration::from_secs(20), async || {
        let paused = sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
            "SELECT paused_until FROM channel_pauses WHERE channel = 'line'",
        )
        .fetch_optional(&p.pool)
        .await
        .unwrap();
        let delivery = row(id1.clone()).await;
        match paused {
            Some(until) if delivery.0 == "pending" => Ok(until),
            _ => Err((paused, delivery)),
        }
    })
    .await;
    let expected = worker_line::next_quota_month(chrono::Utc::now());
    assert!(
        (until - expected).num_milliseconds().abs() < 1000,
        "paused until the next quota month ({expected}), got {until}"
    );
    let (status, attempts, max_attempts, last_error, next) = row(id1.clone()).await;
    assert_eq!(
        (status.as_str(), attempts, max_attempts),
        ("pending", 1, 6),
        "budget kept"
    );
    assert!(last_error.unwrap().starts_with("line_monthly_quota"));
    assert!(
        next >= until - chrono::Duration::seconds(1),
        "waits for the pause to end"
    );

    // A delivery created during the pause waits too, with no LINE call and no attempt.
    let second = p.send("quota:2", "news", &[&u2]).await;
    let id2 = second.deliveries[0].delivery_id.clone();
    eventually(
        "the new delivery waits for the pause",
        Duration::from_secs(20),
        async || {
            let r = row(id2.clone()).await;
            if r.4 >= until { Ok(()) } else { Err(r) }
        },
    )
    .await;
    let (status, attempts, _, _, next) = row(id2.clone()).await;
    assert_eq!((status.as_str(), attempts), ("pending", 0));
    assert_eq!(next, until);
    let due: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox WHERE delivery_id = $1::uuid AND available_at = $2",
    )
    .bind(&id2)
    .bind(until)
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert_eq!(due, 1, "its message is published again when the pause ends");
    assert_eq!(p.sim_count("line").await, 1, "only the refused call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_with_other_content_is_already_exists_and_nfc_keys_match() {
    let p = Platform::start_with_type(&[], "comment_reply", &["inapp"]).await;
    // "café" precomposed vs e + combining acute: one key after NFC.
    let first = p.send("caf\u{e9}:1", "comment_reply", &["u1"]).await;
    let again = p.send("cafe\u{301}:1", "comment_reply", &["u1"]).await;
    assert!(again.duplicate);
    assert_eq!(again.event_id, first.event_id);

    // Listing the same recipients in another order is the same request.
    let mut two = p.event("two:1", "comment_reply", &["u1", "u2"]);
    let first_two = p.create_event(two.clone()).await;
    two.recipients.reverse();
    let again_two = p.create_event(two).await;
    assert!(again_two.duplicate);
    assert_eq!(again_two.event_id, first_two.event_id);

    let mut other = p.event("caf\u{e9}:1", "comment_reply", &["u1"]);
    other.content.as_mut().unwrap().body = "another text".into();
    let err = p.ingest().create_event(other).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(
        err.get_details_resource_info().unwrap().resource_name,
        first.event_id
    );
    assert_eq!(p.count("notification_events").await, 2);
    assert_eq!(p.count("notification_deliveries").await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_the_field_and_writes_nothing() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp", "email"]).await;
    let base = || p.event("k:1", "order_paid", &["u1"]);
    let mut cases: Vec<(&str, pb::CreateEventRequest, &str)> = Vec::new();
    let mut r = base();
    r.event_key = String::new();
    cases.push(("empty key", r, "event_key"));
    let mut r = base();
    r.event_key = "   ".into();
    cases.push(("blank key", r, "event_key"));
    let mut r = base();
    r.event_key = "k".repeat(256);
    cases.push(("256-byte key", r, "event_key"));
    let mut r = base();
    r.recipients.clear();
    cases.push(("no recipients", r, "recipients"));
    let mut r = base();
    r.recipients = (0..1001).map(|i| format!("u{i}")).collect();
    cases.push(("1,001 recipients", r, "recipients"));
    let mut r = base();
    r.recipients = vec!["u1".into(), "".into()];
    cases.push(("empty recipient id", r, "recipients[1]"));
    let mut r = base();
    r.payload = "[1,2,3]".into();
    cases.push(("payload array", r, "payload"));
    let mut r = base();
    r.payload = "{not json".into();
    cases.push(("payload not JSON", r, "payload"));
    let mut r = base();
    r.channels = vec!["fax".into()];
    cases.push(("unknown channel", r, "channels[0]"));
    let mut r = base();
    r.channels = vec!["line".into()];
    cases.push(("channel outside the type's defaults", r, "channels[0]"));
    let mut r = base();
    r.content.as_mut().unwrap().url = "javascript:alert(1)".into();
    cases.push(("script url", r, "content.url"));
    let mut r = base();
    r.payload = r#"{"note":"a\u0000b"}"#.into();
    cases.push(("NUL in the payload", r, "payload"));
    let mut r = base();
    r.content.as_mut().unwrap().body = "a\0b".into();
    cases.push(("NUL in the body", r, "content.body"));
    let mut r = base();
    r.r#type = "t".repeat(9_000);
    cases.push(("9,000-character type", r, "type"));
    let mut r = base();
    r.recipients = vec!["\u{200b}".into()];
    cases.push(("invisible recipient id", r, "recipients[0]"));

    for (name, req, field) in cases {
        let err = p.ingest().create_event(req).await.expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "{name}: {err:?}");
        let fields: Vec<String> = err
            .get_details_bad_request()
            .unwrap_or_else(|| panic!("{name}: no BadRequest detail"))
            .field_violations
            .into_iter()
            .map(|v| v.field)
            .collect();
        assert_eq!(fields, [field], "{name}");
    }

    let mut r = base();
    r.r#type = "no_such_type".into();
    let err = p.ingest().create_event(r).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("no_such_type"));

    for table in ["notification_events", "notification_deliveries", "outbox"] {
        assert_eq!(p.count(table).await, 0, "{table} must stay empty");
    }
    let err = p
        .ingest()
        .get_event(pb::GetEventRequest {
            selector: Some(pb::get_event_request::Selector::EventKey(
                "k".repeat(100_000),
            )),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::InvalidArgument,
        "an over-long key is bad input, not a lookup"
    );

    // The other services validate too.
    let err = p
        .recipients()
        .upsert_recipient(pb::UpsertRecipientRequest {
            user_id: "u1".into(),
            email: "not-an-address".into(),
            line_user_id: "bad".into(),
            timezone: "Mars/Olympus".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let fields = field_violations(&err);
    assert_eq!(fields, ["email", "line_user_id", "timezone"]);
    let err = p
        .recipients()
        .register_endpoint(pb::RegisterEndpointRequest {
            user_id: "nobody".into(),
            platform: "fcm".into(),
            token: "t".into(),
            web_push: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(p.count("recipients").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_go_to_the_dead_letter_queue_and_good_ones_are_sent_once() {
    let mut p = Platform::start_with_type(&[], "order_paid", &["push"]).await;
    let users: Vec<String> = (0..4).map(|i| uniq(&format!("user-100{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "", "", "").await;
        p.add_device(u, &format!("fcm-tok-{u}")).await;
    }
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let ev = p.send("b03", "order_paid", &refs).await;
    // Wait until the relay published all four.
    p.wait_outbox_empty("the relay published all four", Duration::from_secs(10))
        .await;
    // The fourth delivery is not due: its queued message must be acked without a send,
    // and a well-formed message naming it on the wrong channel must fail it.
    let fourth = ev
        .deliveries
        .iter()
        .find(|d| d.user_id == users[3])
        .unwrap()
        .delivery_id
        .clone();
    p.exec("UPDATE notification_deliveries SET next_attempt_at = now() + interval '1 hour' WHERE id = $1::uuid", &fourth).await;
    let (_conn, ch) = p.amqp().await;
    let queue = p.topology.queue("push");
    let publish = |body: Vec<u8>| {
        let ch = ch.clone();
        let queue = queue.clone();
        async move {
            ch.basic_publish(
                "".into(),
                queue.into(),
                Default::default(),
                &body,
                Default::default(),
            )
            .await
            .unwrap();
        }
    };
    publish(vec![0xFF, 0xFE, 0x00]).await;
    publish(serde_json::to_vec(&json!({"v": 1, "delivery_id": fourth, "channel": "fax"})).unwrap())
        .await;
    publish(
        serde_json::to_vec(
            &json!({"v": 1, "delivery_id": uuid::Uuid::new_v4(), "channel": "push"}),
        )
        .unwrap(),
    )
    .await;

    p.start_worker(notify_core::Channel::Push);
    let dead = p.topology.dead_letter_queue();
    p.wait_queue_depth(
        &dead,
        3,
        "three poison messages dead-lettered",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        p.queue_depth(&dead).await,
        3,
        "three poison messages dead-lettered"
    );
    // The poison messages and the due ones are handled concurrently: dead-lettering says
    // nothing about the sends, the deliveries' final states do.
    p.wait_final(&ev.event_id, 20).await;
    let fcm = p.sim_requests("fcm").await;
    let tokens: Vec<&str> = fcm
        .iter()
        .map(|r| r["body"]["message"]["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        tokens.len(),
        3,
        "exactly the three due deliveries were sent: {tokens:?}"
    );
    let (status, error): (String, Option<String>) = p
        .row(
            "SELECT status, last_error FROM notification_deliveries WHERE id = $1::uuid",
            &fourth,
        )
        .await;
    assert_eq!(
        (status.as_str(), error.as_deref()),
        ("failed", Some("unsupported_channel"))
    );
    assert_eq!(p.queue_depth(&p.topology.queue("push")).await, 0);
}

/// The relay puts up to `NOTIFY_RELAY_DELIVERIES_PER_MESSAGE` deliveries of one channel in
/// one (version-2) message; the worker sends each delivery it names once, and a batch that
/// names an unknown delivery is dead-lettered after its good deliveries were sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_share_messages_and_each_one_a_message_names_is_sent_once() {
    let mut p = Platform::start_with_type(&[], "order_paid", &["inapp"]).await;
    let users: Vec<String> = (0..120).map(|i| uniq(&format!("batch-{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "", "", "").await;
    }
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let ev = p.send("batched", "order_paid", &refs).await;
    assert_eq!(ev.deliveries.len(), 120);
    p.wait_outbox_empty("the relay published all 120", Duration::from_secs(10))
        .await;
    let queue = p.topology.queue("inapp");
    assert_eq!(
        p.queue_depth(&queue).await,
        3,
        "120 in-app deliveries written together travel as 50 + 50 + 20"
    );
    // A hand-made batch naming one of them again and a delivery that does not exist.
    let (_conn, ch) = p.amqp().await;
    let again = ev.deliveries[7].delivery_id.parse::<uuid::Uuid>().unwrap();
    let body = serde_json::to_vec(&notify_broker::DeliveryBatch {
        v: 2,
        channel: "inapp".into(),
        deliveries: [again, uuid::Uuid::new_v4()]
            .into_iter()
            .map(|id| notify_broker::Pointer {
                id,
                traceparent: None,
                tracestate: None,
            })
            .collect(),
    })
    .unwrap();
    ch.basic_publish(
        "".into(),
        queue.clone().into(),
        Default::default(),
        &body,
        Default::default(),
    )
    .await
    .unwrap();

    p.start_worker(notify_core::Channel::InApp);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_all_sent(&done);
    for d in &done.deliveries {
        assert_eq!(status_attempts(d), ("sent", 1), "{}", d.delivery_id);
    }
    let dead = p.topology.dead_letter_queue();
    p.wait_queue_depth(
        &dead,
        1,
        "the batch naming an unknown delivery is dead-lettered",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(p.queue_depth(&queue).await, 0);
    let inbox: i64 = p
        .scalar(
            "SELECT count(*) FROM notifications WHERE user_id = ANY($1)",
            &users,
        )
        .await;
    assert_eq!(inbox, 120, "one inbox item per recipient, none twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_line_push_with_the_same_retry_key_counts_as_sent() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["line"]).await;
    let (u, _) = p.add_line_recipient("u").await;
    let ev = p.send("line-409", "order_paid", &[&u]).await;
    let first = p.wait_final(&ev.event_id, 20).await;
    let d = &first.deliveries[0];
    assert_eq!(d.status, "sent");
    // Simulate a worker that died after LINE accepted but before recording: the delivery
    // goes back to pending and is sent again.
    p.exec("UPDATE notification_deliveries SET status = 'pending', provider_message_id = NULL WHERE id = $1::uuid;", &d.delivery_id).await;
    p.exec(
        "INSERT INTO outbox (delivery_id, channel) VALUES ($1::uuid, 'line')",
        &d.delivery_id,
    )
    .await;
    let again = p.wait_final(&ev.event_id, 20).await;
    let d2 = &again.deliveries[0];
    assert_eq!((d2.status.as_str(), d2.attempts), ("sent", 2));
    let line = p.sim_requests("line").await;
    assert_eq!(line.len(), 2);
    assert_eq!(
        line[0]["headers"]["x-line-retry-key"],
        line[1]["headers"]["x-line-retry-key"]
    );
    assert_eq!(
        (line[0]["status"].as_u64(), line[1]["status"].as_u64()),
        (Some(200), Some(409))
    );
    assert!(
        !d2.provider_message_id.is_empty(),
        "x-line-accepted-request-id recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_retry_and_permanent_errors_fail_at_once() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["line"]).await;
    let (u1, u2) = (uniq("u"), uniq("u"));
    let (l1, l2) = (line_id(), line_id());
    p.add_recipient(&u1, "", "", &l1).await;
    p.add_recipient(&u2, "", "", &l2).await;
    p.sim_fault(json!({"provider": "line", "target_contains": l1, "status": 500, "body": {"message": "internal"}, "times": 1})).await;
    p.sim_fault(json!({"provider": "line", "target_contains": l2, "status": 403, "body": {"message": "forbidden"}})).await;
    let ev = p.send("retry", "order_paid", &[&u1, &u2]).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let by_user = |u: &str| delivery_of(&done, u);
    let (d1, d2) = (by_user(&u1), by_user(&u2));
    assert_eq!((d1.status.as_str(), d1.attempts), ("sent", 2));
    assert_eq!((d2.status.as_str(), d2.attempts), ("failed", 1));
    assert!(d2.last_error.contains("line_403"), "{}", d2.last_error);
    let attempts: Vec<(i32, String, Option<i32>)> = p.rows("SELECT attempt, outcome, provider_status FROM delivery_attempts WHERE delivery_id = $1::uuid ORDER BY attempt", &d1.delivery_id).await;
    assert_eq!(
        attempts,
        [
            (1, "retry".to_string(), Some(500)),
            (2, "sent".to_string(), Some(200))
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_body_too_big_for_fcm_is_shortened_at_a_grapheme_boundary() {
    let p = Platform::start_with_type(&[notify_core::Channel::Push], "order_paid", &["push"]).await;
    let u = p.add_bare_recipient("u").await;
    p.add_device(&u, &format!("fcm-tok-{u}")).await;
    let body = "ขอบคุณที่ใช้บริการ".repeat(1000); // 18,000 characters, 54,000 bytes
    let mut req = p.event("push:long", "order_paid", &[&u]);
    req.content.as_mut().unwrap().body = body.clone();
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_sent(&done.deliveries[0]);
    let sent = p.sim_requests("fcm").await;
    let message = &sent[0]["body"]["message"];
    assert!(message.to_string().len() <= 4096, "FCM's 4,096-byte limit");
    assert_eq!(
        message["notification"]["title"], "ชำระเงินแล้ว #1001",
        "title never cut"
    );
    let shown = message["notification"]["body"].as_str().unwrap();
    let kept = shown.strip_suffix('…').expect("an ellipsis marks the cut");
    assert!(body.starts_with(kept));
    assert!(
        kept.len() > 3000,
        "as much as fits is kept ({} bytes)",
        kept.len()
    );
    let next = body[kept.len()..].chars().next().unwrap();
    assert!(
        !matches!(next, '\u{0E31}' | '\u{0E34}'..='\u{0E3A}' | '\u{0E47}'..='\u{0E4E}'),
        "the cut does not strip a vowel or tone mark from its consonant"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apns_pushes_go_over_http2_with_one_reused_provider_token() {
    let p = Platform::start_with_type(&[notify_core::Channel::Push], "order_paid", &["push"]).await;
    let u = p.add_bare_recipient("u").await;
    p.add_endpoint(&u, "apns", &format!("apns-tok-{u}")).await;
    let mut events = Vec::new();
    for key in ["apns:1", "apns:2"] {
        let ev = p.send(key, "order_paid", &[&u]).await;
        let done = p.wait_final(&ev.event_id, 30).await;
        assert_sent(&done.deliveries[0]);
        assert_eq!(done.deliveries[0].provider, "apns");
        assert!(
            !done.deliveries[0].provider_message_id.is_empty(),
            "apns-id kept"
        );
        events.push(ev.event_id);
    }
    let sent = p.sim_requests("apns").await;
    assert_eq!(sent.len(), 2);
    for (req, event_id) in sent.iter().zip(&events) {
        assert_eq!(req["status"], 200);
        let h = &req["headers"];
        assert_eq!(h["apns-topic"], support::APNS_TOPIC);
        assert_eq!(h["apns-push-type"], "alert");
        assert_eq!(h["apns-priority"], "10");
        assert_eq!(h["apns-collapse-id"], event_id.as_str());
        assert!(
            h["apns-expiration"]
                .as_str()
                .unwrap()
                .parse::<i64>()
                .unwrap()
                > 0
        );
        assert_eq!(req["body"]["aps"]["alert"]["title"], "ชำระเงินแล้ว #1001");
        assert_eq!(req["body"]["url"], "https://shop.example.test/orders/1001");
    }
    assert_eq!(
        sent[0]["headers"]["authorization"], sent[1]["headers"]["authorization"],
        "the provider token is reused, not minted per request"
    );
}

/// F05 for APNs: 410 deactivates a token only if it was not registered again after the
/// answer's timestamp; BadDeviceToken deactivates; neither is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apns_dead_tokens_are_deactivated_respecting_the_410_timestamp() {
    let p = Platform::start_with_type(&[notify_core::Channel::Push], "order_paid", &["push"]).await;
    let u = p.add_bare_recipient("user-1001").await;
    // Invalid since 2025-05-01, but registered (again) now, after that: kept.
    let re_registered = p
        .add_endpoint(&u, "apns", &format!("unregistered-1746057600000-{u}"))
        .await;
    // Invalid from an hour from now on, registered before: removed.
    let later = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let gone = p
        .add_endpoint(&u, "apns", &format!("unregistered-{later}-{u}"))
        .await;
    let bad = p.add_endpoint(&u, "apns", &format!("bad-{u}")).await;
    let live = p.add_endpoint(&u, "apns", &format!("apns-tok-{u}")).await;
    let ev = p.send("f05:1", "order_paid", &[&u]).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let by_ep = |e: &str| done.deliveries.iter().find(|d| d.endpoint_id == e).unwrap();
    for ep in [&re_registered, &gone, &bad] {
        let d = by_ep(ep);
        assert_eq!((d.status.as_str(), d.attempts), ("failed", 1), "{d:?}");
        assert!(
            d.last_error.starts_with("invalid_token"),
            "{}",
            d.last_error
        );
    }
    assert_eq!(by_ep(&live).status, "sent");
    let status = |id: String| {
        let pool = p.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT status FROM notification_endpoints WHERE id = $1::uuid",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(
        status(re_registered.clone()).await,
        "active",
        "registered after the 410 timestamp"
    );
    assert_eq!(status(gone.clone()).await, "revoked");
    assert_eq!(status(bad.clone()).await, "revoked");
    assert_eq!(status(live.clone()).await, "active");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unregistered_fcm_token_deactivates_exactly_that_endpoint() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["push"]).await;
    let u = p.add_bare_recipient("user-1001").await;
    let dead = p.add_device(&u, &format!("unregistered-{u}")).await;
    let live = p.add_device(&u, &format!("fcm-tok-{u}")).await;
    let ev = p.send("e1", "order_paid", &[&u]).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let by_ep = |e: &str| {
        done.deliveries
            .iter()
            .find(|d| d.endpoint_id == e)
            .unwrap()
            .clone()
    };
    let (d_dead, d_live) = (by_ep(&dead), by_ep(&live));
    assert_eq!((d_dead.status.as_str(), d_dead.attempts), ("failed", 1));
    assert!(
        d_dead.last_error.starts_with("invalid_token"),
        "{}",
        d_dead.last_error
    );
    assert_eq!(d_live.status, "sent");
    let (status, reason): (String, Option<String>) = p
        .row(
            "SELECT status, revoked_reason FROM notification_endpoints WHERE id = $1::uuid",
            &dead,
        )
        .await;
    assert_eq!(
        (status.as_str(), reason.as_deref()),
        ("revoked", Some("invalid_token"))
    );

    let ev2 = p.send("e2", "order_paid", &[&u]).await;
    assert_eq!(ev2.deliveries.len(), 1, "only the live device is planned");
    assert_eq!(ev2.deliveries[0].endpoint_id, live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_deadline_cancels_the_request_and_writes_nothing() {
    let p = Platform::start_with_type(&[], "comment_reply", &["inapp"]).await;
    // Hold a lock that makes the ingest transaction wait, past the caller's deadline.
    let mut blocker = p.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE notification_events IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let mut req = tonic::Request::new(p.event("slow:1", "comment_reply", &["u1"]));
    req.set_timeout(Duration::from_millis(300));
    let started = std::time::Instant::now();
    let err = p.ingest().create_event(req).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the deadline was honoured"
    );
    blocker.rollback().await.unwrap();
    // Every transaction that began while the lock was held (the cancelled request's) has
    // ended, committed or not: what it wrote is now visible or never will be.
    let released: chrono::DateTime<chrono::Utc> = p.query_scalar("SELECT now()").await;
    eventually(
        "the cancelled request's transaction ended",
        Duration::from_secs(10),
        async || {
            let open: Vec<(Option<String>, Option<String>)> = p.rows("SELECT state, query FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start < $1", released).await;
            if open.is_empty() { Ok(()) } else { Err(open) }
        },
    )
    .await;
    for table in ["notification_events", "notification_deliveries", "outbox"] {
        assert_eq!(p.count(table).await, 0, "{table}: nothing half-written");
    }
    // The same request afterwards succeeds and is new.
    let ok = p.send("slow:1", "comment_reply", &["u1"]).await;
    assert!(!ok.duplicate);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_api() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let p = Platform::start_with_workers(&[]).await;
    let mut client = ServerReflectionClient::new(p.grpc.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = client
        .server_reflection_info(futures_util::stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection answer");
    };
    let names: HashSet<String> = list.service.into_iter().map(|s| s.name).collect();
    for s in [
        "notify.v1.IngestService",
        "notify.v1.RecipientService",
        "notify.v1.TypeService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(s), "{s} missing from {names:?}");
    }
}

/// An unknown symbol or file is answered in the stream with an `ErrorResponse`
/// (`NOT_FOUND`), as reflection.proto defines it, and the stream goes on answering: on
/// both versions (issue 44: the stream ended with status NOT_FOUND, so grpcio-reflection
/// raised instead of its `KeyError`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_an_unknown_symbol_in_the_stream_and_goes_on() {
    let p = Platform::start_with_workers(&[]).await;
    {
        use tonic_reflection::pb::v1::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let ask = |m| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(m),
        };
        let reqs = [
            ask(MessageRequest::FileContainingSymbol(
                "notify.v1.NoSuchService".into(),
            )),
            ask(MessageRequest::FileByFilename("no/such.proto".into())),
            ask(MessageRequest::FileContainingSymbol(
                "notify.v1.IngestService.CreateEvent".into(),
            )),
        ];
        let mut stream = ServerReflectionClient::new(p.grpc.clone())
            .server_reflection_info(futures_util::stream::iter(reqs))
            .await
            .unwrap()
            .into_inner();
        for unknown in ["notify.v1.NoSuchService", "no/such.proto"] {
            let resp = stream.message().await.expect("the stream goes on").unwrap();
            let Some(MessageResponse::ErrorResponse(e)) = resp.message_response else {
                panic!("{unknown}: {resp:?}");
            };
            assert_eq!(e.error_code, tonic::Code::NotFound as i32, "{e:?}");
            assert!(e.error_message.contains(unknown), "{e:?}");
        }
        let resp = stream.message().await.expect("still open").unwrap();
        let Some(MessageResponse::FileDescriptorResponse(f)) = resp.message_response else {
            panic!("{resp:?}");
        };
        assert_eq!(f.file_descriptor_proto.len(), 1);
        assert!(
            stream.message().await.unwrap().is_none(),
            "ends with the client's"
        );
    }
    {
        use tonic_reflection::pb::v1alpha::{
            ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
            server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        };
        let ask = |m| ServerReflectionRequest {
            host: String::new(),
            message_request: Some(m),
        };
        let reqs = [
            ask(MessageRequest::FileContainingSymbol("nope.Nothing".into())),
            ask(MessageRequest::ListServices(String::new())),
        ];
        let mut stream = ServerReflectionClient::new(p.grpc.clone())
            .server_reflection_info(futures_util::stream::iter(reqs))
            .await
            .unwrap()
            .into_inner();
        let resp = stream.message().await.expect("the stream goes on").unwrap();
        let Some(MessageResponse::ErrorResponse(e)) = resp.message_response else {
            panic!("{resp:?}");
        };
        assert_eq!(e.error_code, tonic::Code::NotFound as i32, "{e:?}");
        let resp = stream.message().await.expect("still open").unwrap();
        assert!(
            matches!(
                resp.message_response,
                Some(MessageResponse::ListServicesResponse(_))
            ),
            "{resp:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_v1alpha_clients_too() {
    use tonic_reflection::pb::v1alpha::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let p = Platform::start_with_workers(&[]).await;
    let mut client = ServerReflectionClient::new(p.grpc.clone());
    let reqs = [
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "notify.v1.IngestService".into(),
            )),
        },
    ];
    let mut stream = client
        .server_reflection_info(futures_util::stream::iter(reqs))
        .await
        .expect("grpc.reflection.v1alpha is served")
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection answer: {resp:?}");
    };
    let names: HashSet<String> = list.service.into_iter().map(|s| s.name).collect();
    for s in [
        "notify.v1.IngestService",
        "notify.v1.TopicService",
        "grpc.health.v1.Health",
    ] {
        assert!(names.contains(s), "{s} missing from {names:?}");
    }
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::FileDescriptorResponse(files)) = resp.message_response else {
        panic!("unexpected reflection answer: {resp:?}");
    };
    assert!(!files.file_descriptor_proto.is_empty());
}

/// A codec that sends the given bytes as the request body, unchecked.
#[derive(Clone, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_request_is_invalid_argument_naming_the_field() {
    let p = Platform::start_with_workers(&[]).await;
    let send = |body: Vec<u8>| {
        let ch = p.grpc.clone();
        async move {
            let mut grpc = tonic::client::Grpc::new(ch);
            grpc.ready().await.unwrap();
            grpc.unary(
                tonic::Request::new(body),
                http::uri::PathAndQuery::from_static("/notify.v1.IngestService/CreateEvent"),
                RawCodec,
            )
            .await
        }
    };
    // recipients (field 4) with bytes that are not UTF-8.
    let err = send(vec![0x22, 0x02, 0xff, 0xfe]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let fields = field_violations(&err);
    assert_eq!(fields, ["recipients"]);
    // Not protobuf at all.
    let err = send(vec![0xff; 16]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let fields = field_violations(&err);
    assert_eq!(fields, ["request"]);
    assert_eq!(p.count("notification_events").await, 0);
}

/// Every service the server offers (as reflection lists them) answers SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_service_reports_every_served_service_serving() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let p = Platform::start_with_workers(&[]).await;
    let mut stream = ServerReflectionClient::new(p.grpc.clone())
        .server_reflection_info(futures_util::stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection answer");
    };
    let served: Vec<String> = list
        .service
        .into_iter()
        .map(|s| s.name)
        .filter(|n| n.starts_with("notify."))
        .collect();
    assert!(
        served.iter().any(|s| s == "notify.v1.TopicService"),
        "{served:?}"
    );
    let mut health = tonic_health::pb::health_client::HealthClient::new(p.grpc.clone());
    for service in served.iter().map(String::as_str).chain([""]) {
        let resp = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("{service:?}: {e:?}"))
            .into_inner();
        assert_eq!(
            resp.status(),
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            "{service:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_publish_stays_in_the_outbox_until_the_route_is_back() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["line"]).await;
    let (u, _) = p.add_line_recipient("user-1001").await;
    // A first event proves the topology is declared and the route works; then cut it.
    let warm = p.send("warm-up", "order_paid", &[&u]).await;
    p.wait_final(&warm.event_id, 30).await;
    let (_conn, ch) = p.amqp().await;
    let (queue, exchange) = (p.topology.queue("line"), p.topology.exchange());
    ch.queue_unbind(
        queue.clone().into(),
        exchange.clone().into(),
        "line".into(),
        Default::default(),
    )
    .await
    .unwrap();

    let ev = p.send("b02-1", "order_paid", &[&u]).await;
    eventually(
        "the unroutable publish is counted on the outbox row",
        Duration::from_secs(20),
        async || {
            let failures: i32 = p
                .query_scalar("SELECT coalesce(max(publish_failures), 0) FROM outbox")
                .await;
            if failures > 0 { Ok(()) } else { Err(failures) }
        },
    )
    .await;
    let last_error: Option<String> = p.query_scalar("SELECT last_error FROM outbox").await;
    assert_eq!(last_error.as_deref(), Some("unroutable"));
    let got = p
        .ingest()
        .get_event(event_request(&ev.event_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.deliveries[0].status, "pending");
    assert_eq!(p.sim_count("line").await, 1, "only the warm-up push so far");

    ch.queue_bind(
        queue.into(),
        exchange.into(),
        "line".into(),
        Default::default(),
        Default::default(),
    )
    .await
    .unwrap();
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(status_attempts(&done.deliveries[0]), ("sent", 1));
    assert_eq!(
        p.sim_count("line").await,
        2,
        "exactly one more push once the route is back"
    );
    assert_eq!(p.count("outbox").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_fcm_access_token_is_replaced_and_the_push_retried() {
    let p = Platform::start().await;
    p.add_type("order_paid", &["push"]).await;
    let u = p.add_bare_recipient("u").await;
    p.add_device(&u, &format!("fcm-tok-{u}")).await;
    let first = p.send("t1", "order_paid", &[&u]).await;
    assert_eq!(
        p.wait_final(&first.event_id, 30).await.deliveries[0].status,
        "sent"
    );
    // The access token stops working (key rotated, token revoked).
    let r = p
        .http
        .delete(format!("{}/_sim/tokens", p.sim_url))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let second = p.send("t2", "order_paid", &[&u]).await;
    let d = p.wait_final(&second.event_id, 30).await.deliveries[0].clone();
    assert_eq!(
        (d.status.as_str(), d.attempts),
        ("sent", 2),
        "401, then a fresh token and success"
    );
    assert_eq!(p.sim_count("oauth").await, 2, "one new token fetched");
}

/// A burst of 60 LINE deliveries with a limit of 20 calls a second reaches LINE spread
/// over at least two seconds, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_spread_to_the_providers_rate_limit() {
    let p = Platform::start_with(support::Options {
        workers: vec![notify_core::Channel::Line],
        concurrency: 32,
        rate_limits: [("line".to_string(), 20)].into(),
        ..Default::default()
    })
    .await;
    p.add_type("news", &["line"]).await;
    let mut users = Vec::new();
    for _ in 0..60 {
        let u = uniq("u");
        p.add_recipient(&u, "", "", &line_id()).await;
        users.push(u);
    }
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let ev = p.send("burst", "news", &refs).await;
    let done = p.wait_final(&ev.event_id, 60).await;
    assert!(
        done.deliveries
            .iter()
            .all(|d| d.status == "sent" && d.attempts == 1)
    );
    let mut at: Vec<chrono::DateTime<chrono::Utc>> = p
        .sim_requests("line")
        .await
        .iter()
        .map(|r| r["received_at"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(at.len(), 60);
    at.sort();
    let span = (at[59] - at[0]).num_milliseconds();
    // 20 at once, then one every 50 ms: the 60th starts 2 s after the first.
    assert!(span >= 1900, "60 calls within {span} ms");
}

/// Accept-then-time-out on LINE: LINE accepts the push but the answer never arrives in
/// time; the retry carries the same retry key, LINE answers 409, the delivery ends `sent`
/// and the user saw one message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_push_accepted_then_timed_out_ends_sent_with_one_message() {
    let p = Platform::start_with_type(&[notify_core::Channel::Line], "order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    p.slow_line_once(&lid, "1", 7000).await;
    let ev = p.send("line-slow", "order_paid", &[&u]).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let d = &done.deliveries[0];
    assert_eq!((d.status.as_str(), d.attempts), ("sent", 2), "{d:?}");
    let calls = p.sim_requests("line").await;
    let statuses: Vec<u64> = calls
        .iter()
        .map(|c| c["status"].as_u64().unwrap())
        .collect();
    assert_eq!(
        statuses,
        [200, 409],
        "accepted once; the resend is refused as a duplicate"
    );
    let first: Option<String> = p
        .scalar(
            "SELECT error_code FROM delivery_attempts WHERE delivery_id = $1::uuid AND attempt = 1",
            &d.delivery_id,
        )
        .await;
    assert_eq!(first.as_deref(), Some("line_timeout"));
}

/// Planning decides on the database's clock, the one due times and leases use: with the
/// database's clock ten hours ahead of this host's, a recipient inside quiet hours by the
/// database's clock (and far outside them by the host's) is deferred to the window's end
/// computed from the database's `now()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_hours_are_decided_on_the_database_clock_not_the_hosts() {
    let p = Platform::start_with(support::Options {
        workers: vec![],
        ingest_in_process: false,
        ..Default::default()
    })
    .await;
    // The clock ingest's sessions read: `now()` resolves to this function first, ten
    // hours ahead of the host (and of pg_catalog.now()).
    p.execute("CREATE SCHEMA skewed_clock").await;
    p.execute(
        "CREATE FUNCTION skewed_clock.now() RETURNS timestamptz LANGUAGE sql STABLE
         AS $$ SELECT pg_catalog.now() + interval '10 hours' $$",
    )
    .await;
    let url = format!(
        "{}?options[search_path]=skewed_clock%2Cpg_catalog%2Cpublic",
        p.db_url
    );
    let ingest = p.spawn("ingest", &["serve"], &[("NOTIFY_DATABASE_URL", url)]);
    let mut health = tonic_health::pb::health_client::HealthClient::new(p.grpc.clone());
    eventually("ingest serving", Duration::from_secs(30), async || {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "notify.v1.IngestService".into(),
            })
            .await
            .map(|r| r.into_inner().status())
            .ok();
        if status == Some(tonic_health::pb::health_check_response::ServingStatus::Serving) {
            Ok(())
        } else {
            Err((status, ingest.log()))
        }
    })
    .await;
    p.add_type("order_paid", &["email"]).await;
    let (u, _) = p.add_email_recipient("u").await;
    p.recipients()
        .upsert_recipient(pb::UpsertRecipientRequest {
            user_id: u.clone(),
            email: format!("{u}@example.test"),
            timezone: "Asia/Bangkok".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let db_now: chrono::DateTime<chrono::Utc> = p
        .query_scalar("SELECT pg_catalog.now() + interval '10 hours'")
        .await;
    let host_now = chrono::Utc::now();
    let local = db_now.with_timezone(&chrono_tz::Asia::Bangkok);
    let (start, end) = (
        local - chrono::Duration::hours(1),
        local + chrono::Duration::hours(1),
    );
    let hhmm = |t: chrono::DateTime<chrono_tz::Tz>| t.format("%H:%M").to_string();
    p.set_quiet_hours(&u, start, end).await;
    // By the host's clock the recipient is nowhere near quiet hours.
    assert!(host_now < db_now - chrono::Duration::hours(9));

    let ev = p.send(&uniq("clock"), "order_paid", &[&u]).await;
    let expected_end = notify_core::quiet::first_instant(
        chrono_tz::Asia::Bangkok,
        end.date_naive(),
        notify_core::quiet::parse_hhmm(&hhmm(end)).unwrap(),
    );
    let email = ev
        .deliveries
        .iter()
        .find(|d| d.channel == "email")
        .expect("an email delivery");
    assert_eq!(
        email.deferred_until.as_ref().map(|t| t.seconds),
        Some(expected_end.timestamp()),
        "deferred to the window's end on the database's clock: {email:?}"
    );
    let due: chrono::DateTime<chrono::Utc> = p
        .scalar(
            "SELECT available_at FROM outbox WHERE delivery_id = $1::uuid",
            &email.delivery_id,
        )
        .await;
    assert_eq!(due.timestamp(), expected_end.timestamp());

    // The topic fan-out plans on the same clock.
    p.create_topic("shop.promotions").await;
    p.subscribe("shop.promotions", &[&u]).await;
    let mut req = p.event(&uniq("clock-topic"), "order_paid", &[]);
    req.topic = "shop.promotions".into();
    let topic_event = p.create_event(req).await;
    let fanned = p
        .wait_fanout_done(&topic_event.event_id, Duration::from_secs(30))
        .await;
    let email = on_channel(&fanned, "email")[0];
    assert_eq!(
        email.deferred_until.as_ref().map(|t| t.seconds),
        Some(expected_end.timestamp()),
        "fan-out deferred on the database's clock: {email:?}"
    );
    drop(ingest);
}
