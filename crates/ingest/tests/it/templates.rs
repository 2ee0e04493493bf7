//! Templates per type x channel x locale: Thai wording with Thai money and Buddhist-era
//! dates, the English fallback, validation when the type is saved, and a template error at
//! send time.

use crate::support;

use notify_proto::v1 as pb;
use serde_json::Value;
use support::{Platform, assert_all_sent, line_id, type_request, uniq};
use tonic::Code;
use tonic_types::StatusExt;

fn tpl(channel: &str, locale: &str) -> pb::Template {
    pb::Template {
        channel: channel.into(),
        locale: locale.into(),
        ..Default::default()
    }
}

fn order_paid_type(templates: Vec<pb::Template>) -> pb::UpsertNotificationTypeRequest {
    pb::UpsertNotificationTypeRequest {
        default_locale: "en".into(),
        sample_payload: r#"{"order_id": 1001, "total": "1250", "paid_at": "2026-11-30T18:30:00Z"}"#
            .into(),
        templates,
        ..type_request("order_paid", &["email", "line"])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thai_templates_with_thai_money_and_dates_and_an_english_fallback() {
    let p = Platform::start().await;
    let th_email = pb::Template {
        email_subject: "ชำระเงินสำเร็จ คำสั่งซื้อ #{{ payload.order_id }}".into(),
        body: "เรียนคุณ{{ recipient.display_name }} เราได้รับชำระเงิน {{ payload.total|money }} เมื่อ {{ payload.paid_at|date }} แล้ว".into(),
        email_html: "<p>เรียนคุณ{{ recipient.display_name }}</p><p>ยอดชำระ <b>{{ payload.total|money }}</b></p>".into(),
        ..tpl("email", "th")
    };
    let th_line = pb::Template {
        title: "ชำระเงินแล้ว #{{ payload.order_id }}".into(),
        body: "ยอด {{ payload.total|money }} วันที่ {{ payload.paid_at|date('short') }}".into(),
        ..tpl("line", "th")
    };
    let en_any = pb::Template {
        title: "Payment received for order #{{ payload.order_id }}".into(),
        body: "We received {{ payload.total|money }} on {{ payload.paid_at|date }}.".into(),
        ..tpl("*", "en")
    };

    // A template that does not render against the sample payload is refused on save.
    let broken = pb::Template {
        body: "ยอด\n{{ payload.totl|money }}".into(),
        ..tpl("line", "th")
    };
    let err = p
        .types()
        .upsert_notification_type(order_paid_type(vec![en_any.clone(), broken]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let v = &err.get_details_bad_request().unwrap().field_violations[0];
    assert_eq!(v.field, "templates[1].body");
    assert!(v.description.starts_with("line 2:"), "{}", v.description);

    p.types()
        .upsert_notification_type(order_paid_type(vec![th_email, th_line, en_any]))
        .await
        .unwrap();
    let (th, ja) = (uniq("th"), uniq("ja"));
    let (th_mail, ja_mail) = (format!("{th}@example.test"), format!("{ja}@example.test"));
    p.add_recipient(&th, "สมชาย", &th_mail, &line_id()).await;
    p.recipients()
        .upsert_recipient(pb::UpsertRecipientRequest {
            user_id: ja.clone(),
            display_name: "Taro".into(),
            email: ja_mail.clone(),
            locale: "ja-JP".into(),
            timezone: "Asia/Tokyo".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut req = p.event("tpl:1", "order_paid", &[&th, &ja]);
    req.payload =
        r#"{"order_id": 1001, "total": "1250", "paid_at": "2026-11-30T18:30:00Z"}"#.into();
    let (_ev, done) = p.deliver_all(req).await;

    // Thai email: Thai subject, amount in baht, date in the Buddhist era (01:30 on 1 December
    // in Bangkok).
    let mail = &p.mails_to(&th_mail).await[0];
    assert_eq!(mail["subject"], "ชำระเงินสำเร็จ คำสั่งซื้อ #1001");
    let text = mail["text"].as_str().unwrap();
    assert!(
        text.contains("เรียนคุณสมชาย เราได้รับชำระเงิน 1,250.00 บาท เมื่อ 1 ธันวาคม 2569 แล้ว"),
        "{text}"
    );
    assert!(
        mail["html"]
            .as_str()
            .unwrap()
            .contains("<b>1,250.00 บาท</b>")
    );
    // Thai LINE message.
    let line = p.sim_requests("line").await;
    let said = line[0]["body"]["messages"][0]["text"].as_str().unwrap();
    assert_eq!(
        said,
        "ชำระเงินแล้ว #1001\nยอด 1,250.00 บาท วันที่ 1 ธ.ค. 2569\nhttps://shop.example.test/orders/1001",
        "the caller's link follows the rendered text"
    );
    // No Japanese template: the type's default locale, English, in Tokyo time.
    let mail = &p.mails_to(&ja_mail).await[0];
    assert_eq!(mail["subject"], "Payment received for order #1001");
    assert!(
        mail["text"]
            .as_str()
            .unwrap()
            .contains("We received THB 1,250.00 on 1 December 2026."),
        "{}",
        mail["text"]
    );
    // The attempt records the rendered content.
    let th_email = done
        .deliveries
        .iter()
        .find(|d| d.user_id == th && d.channel == "email")
        .unwrap();
    let content: Value = p
        .scalar(
            "SELECT content_json FROM delivery_attempts WHERE delivery_id = $1::uuid",
            &th_email.delivery_id,
        )
        .await;
    assert_eq!(content["subject"], "ชำระเงินสำเร็จ คำสั่งซื้อ #1001");

    // A payload without a field the template needs: that delivery fails at once, naming
    // the template and line.
    let mut req = p.event("tpl:2", "order_paid", &[&th]);
    req.payload = r#"{"order_id": 1002}"#.into();
    req.channels = vec!["line".into()];
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let d = &done.deliveries[0];
    assert_eq!((d.status.as_str(), d.attempts), ("failed", 1));
    assert!(
        d.last_error
            .starts_with("template_error: template order_paid/line/th:body line 1:"),
        "{}",
        d.last_error
    );
}

/// `ingest load-types`: the versioned type file is applied once, atomically, and refused
/// when invalid, reused with other content, or older than what is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_type_file_loads_once_per_version_and_all_or_nothing() {
    use ingest::types_file::{LoadError, Loaded, load};
    let p = Platform::start_with_workers(&[]).await;
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/notification-types.json"
    ))
    .unwrap();
    assert_eq!(
        load(&p.pool, &file).await.unwrap(),
        Loaded::Applied {
            version: 3,
            types: 5
        }
    );
    assert_eq!(
        load(&p.pool, &file).await.unwrap(),
        Loaded::AlreadyLoaded { version: 3 }
    );
    // Layout and line endings are not content.
    let relaid = file.replace('\n', "\r\n  ");
    assert_eq!(
        load(&p.pool, &relaid).await.unwrap(),
        Loaded::AlreadyLoaded { version: 3 }
    );
    // Refused with the field named, nothing written: no types; two templates for one
    // channel and locale.
    let empty = r#"{"version": 9, "types": []}"#;
    assert!(
        matches!(load(&p.pool, empty).await, Err(LoadError::Invalid(m)) if m[0].starts_with("types:"))
    );
    let twice = file
        .replace("\"version\": 3", "\"version\": 9")
        .replace("\"locale\": \"en\",", "\"locale\": \"th\",");
    match load(&p.pool, &twice).await {
        Err(LoadError::Invalid(m)) => assert!(
            m.iter()
                .any(|l| l.starts_with("types[0].templates[2]: a template for channel")),
            "{m:?}"
        ),
        other => panic!("{other:?}"),
    }
    let templates: i64 = p
        .query_scalar("SELECT count(*) FROM notification_templates")
        .await;
    assert_eq!(templates, 6);

    let changed = file.replace("\"stock_low\",", "\"stock_low\", \"priority\": \"low\",");
    assert!(
        matches!(load(&p.pool, &changed).await, Err(LoadError::Version(m)) if m.contains("bump the version"))
    );
    let older = file.replace("\"version\": 3", "\"version\": 0");
    assert!(matches!(
        load(&p.pool, &older).await,
        Err(LoadError::Invalid(_))
    ));
    let broken = file
        .replace("\"version\": 3", "\"version\": 4")
        .replace("{{ payload.device }} ที่", "{{ payload.devise }} ที่")
        .replace("\"promo_weekly\"", "\"promo_weekly_v2\"");
    match load(&p.pool, &broken).await {
        Err(LoadError::Invalid(problems)) => {
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0].starts_with("types[1].templates[0].body: line 1:"),
                "{problems:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.count("notification_types").await, 5, "nothing written");
    let v2 = file
        .replace("\"version\": 3", "\"version\": 4")
        .replace("\"promo_weekly\"", "\"promo_weekly_v2\"");
    assert_eq!(
        load(&p.pool, &v2).await.unwrap(),
        Loaded::Applied {
            version: 4,
            types: 5
        }
    );
    assert_eq!(
        p.count("notification_types").await,
        6,
        "types not in the file stay"
    );
    assert!(
        matches!(load(&p.pool, &file).await, Err(LoadError::Version(m)) if m.contains("older"))
    );
}

/// Digest: five replies in one thread within the window become one email and one LINE
/// message listing all five, sent when the window closes; in-app shows one item updated
/// in place. The planning clock is set to the start of a window that closes two to six
/// seconds from now on the database's clock (windows are [4k, 4k+4) seconds since the
/// epoch), so every reply lands in that window however long the requests take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_replies_in_one_window_become_one_digest_per_channel() {
    let clock = ingest::clock::ManualClock::new(chrono::Utc::now());
    let p = Platform::start_with(support::Options {
        clock: ingest::clock::Clock::Manual(clock.clone()),
        ..Default::default()
    })
    .await;
    let db_now: chrono::DateTime<chrono::Utc> = p.query_scalar("SELECT now()").await;
    let closes_after = db_now.timestamp_millis() + 2_000;
    let opens = closes_after - closes_after.rem_euclid(4_000);
    clock.set(chrono::DateTime::from_timestamp_millis(opens).unwrap());
    let digest = pb::Template {
        title: "{{ digest.count }} new replies in thread {{ payload.thread_id }}".into(),
        body: "{% for i in digest.items %}- {{ i.payload.author }}: {{ i.content.body }}\n{% endfor %}".into(),
        ..tpl("*", "en")
    };
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        default_locale: "en".into(),
        sample_payload: r#"{"thread_id": 55, "author": "somying"}"#.into(),
        digest_window_seconds: 4,
        templates: vec![digest],
        ..type_request("comment_reply", &["inapp", "email", "line"])
    })
    .await;
    let u = uniq("u");
    let mail = format!("{u}@example.test");
    p.add_recipient(&u, "", &mail, &line_id()).await;
    let mut events = Vec::new();
    for (n, author) in ["somying", "wichai", "napa", "somchai", "malee"]
        .iter()
        .enumerate()
    {
        let mut req = p.event(&format!("reply:{n}"), "comment_reply", &[&u]);
        req.aggregate_key = "thread:55".into();
        req.payload = format!(r#"{{"thread_id": 55, "author": "{author}"}}"#);
        req.content.as_mut().unwrap().body = format!("ตอบกลับที่ {n}");
        events.push(p.create_event(req).await);
    }
    let first = &events[0];
    let held: Vec<&pb::Delivery> = first
        .deliveries
        .iter()
        .filter(|d| d.channel != "inapp")
        .collect();
    assert_eq!(held.len(), 2);
    assert!(
        held.iter().all(|d| d.deferred_until.is_some()),
        "held until the window closes"
    );
    for ev in &events[1..] {
        let channels: Vec<&str> = ev.deliveries.iter().map(|d| d.channel.as_str()).collect();
        assert_eq!(
            channels,
            ["inapp"],
            "email and LINE join the first event's digest"
        );
        assert!(
            ev.skipped.iter().all(|s| s.reason == "digested"),
            "{:?}",
            ev.skipped
        );
    }
    // Nothing goes out on email or LINE before the window closes.
    assert!(p.mails_to(&mail).await.is_empty());
    assert!(p.sim_requests("line").await.is_empty());
    let done = p.wait_final(&first.event_id, 30).await;
    assert_all_sent(&done);

    let mails = p.mails_to(&mail).await;
    assert_eq!(mails.len(), 1, "one email");
    assert_eq!(mails[0]["subject"], "5 new replies in thread 55");
    let text = mails[0]["text"].as_str().unwrap();
    for (n, author) in ["somying", "wichai", "napa", "somchai", "malee"]
        .iter()
        .enumerate()
    {
        assert!(text.contains(&format!("- {author}: ตอบกลับที่ {n}")), "{text}");
    }
    let line = p.sim_requests("line").await;
    assert_eq!(line.len(), 1, "one LINE message");
    let said = line[0]["body"]["messages"][0]["text"].as_str().unwrap();
    assert!(
        said.starts_with("5 new replies in thread 55\n- somying: ตอบกลับที่ 0\n"),
        "{said}"
    );
    assert_eq!(
        said.matches("\n- ").count(),
        5,
        "five replies listed: {said}"
    );

    for ev in &events {
        p.wait_final(&ev.event_id, 30).await;
    }
    let rows: Vec<(i32, String)> = p
        .rows(
            "SELECT item_count, body FROM notifications WHERE user_id = $1",
            &u,
        )
        .await;
    assert_eq!(rows.len(), 1, "one in-app item");
    assert_eq!(rows[0].0, 5, "updated in place five times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_template_applies_to_the_next_delivery_at_once() {
    let p = Platform::start_with_workers(&[notify_core::Channel::Line]).await;
    let wording = |title: &str| pb::Template {
        title: title.into(),
        body: String::new(),
        ..tpl("line", "th")
    };
    let save = |title: &'static str| {
        let mut t = order_paid_type(vec![wording(title)]);
        t.default_channels = vec!["line".into()];
        t
    };
    p.types()
        .upsert_notification_type(save("เดิม #{{ payload.order_id }}"))
        .await
        .unwrap();
    let user = uniq("u");
    p.add_recipient(&user, "", "", &line_id()).await;
    let first = p.send("tpl:old", "order_paid", &[&user]).await;
    assert_all_sent(&p.wait_final(&first.event_id, 30).await);
    // Saved right after the worker cached the first wording: the next delivery must not
    // wait out any cache lifetime.
    p.types()
        .upsert_notification_type(save("ใหม่ #{{ payload.order_id }}"))
        .await
        .unwrap();
    let second = p.send("tpl:new", "order_paid", &[&user]).await;
    assert_all_sent(&p.wait_final(&second.event_id, 30).await);
    let titles: Vec<String> = p
        .sim_requests("line")
        .await
        .iter()
        .map(|r| {
            let text = r["body"]["messages"][0]["text"].as_str().unwrap();
            text.lines().next().unwrap().to_string()
        })
        .collect();
    assert_eq!(titles, ["เดิม #1001", "ใหม่ #1001"]);
}
