//! Rich content at its edges, from a break-it trial (issue 16): forged and odd LINE
//! postbacks, colliding action ids, labels and badges at and past their limits, links
//! rendered by templates into forbidden schemes, deep links where no app opens them,
//! escaping in the email layout, payloads at the providers' limits. Each asserts what a
//! caller reading README.md and docs/channels.md would expect.

use crate::support;

use notify_core::Channel;
use notify_proto::v1 as pb;
use serde_json::{Value, json};
use support::{
    Platform, inbox_token, line_template, line_webhook, on_channel, postback, type_request,
};
use tonic::Code;
use tonic_types::StatusExt;

fn fields(err: &tonic::Status) -> Vec<String> {
    err.get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

/// docs/channels.md "Rich content": a deep link stands only on a button, never as the tap
/// link `content.url`, which email and LINE text print.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_link_as_the_tap_link_is_refused() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp"]).await;
    let mut r = p.rich_event("deep:1", "order_paid", &["u1"]);
    r.content.as_mut().unwrap().url = "myshop://orders/1001".into();
    let err = p.ingest().create_event(r).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(fields(&err), ["content.url"]);
    assert_eq!(p.count("notification_events").await, 0);
}

/// The same event_key with different rich content is not an honest retry: ALREADY_EXISTS,
/// and what was stored stays as first sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_with_different_actions_is_already_exists() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp"]).await;
    let first = p.rich_event("replay:1", "order_paid", &["u1"]);
    let created = p.create_event(first.clone()).await;
    let mut problems = Vec::new();
    type Change = Box<dyn Fn(&mut pb::Content)>;
    let variants: Vec<(&str, Change)> = vec![
        (
            "other action url",
            Box::new(|c| c.actions[0].url = "https://evil.example.test/x".into()),
        ),
        (
            "other action label",
            Box::new(|c| c.actions[1].label = "ยกเลิก".into()),
        ),
        (
            "one action fewer",
            Box::new(|c| {
                c.actions.pop();
            }),
        ),
        (
            "other image",
            Box::new(|c| c.image_url = "https://cdn.shop.example.test/other.png".into()),
        ),
        ("a thread", Box::new(|c| c.thread = "t1".into())),
        (
            "a badge",
            Box::new(|c| {
                c.badge = pb::BadgePolicy::Count as i32;
                c.badge_count = 5
            }),
        ),
        (
            "an override",
            Box::new(|c| {
                c.overrides = Some(pb::ChannelOverrides {
                    apns_category: "X".into(),
                    ..Default::default()
                })
            }),
        ),
    ];
    for (name, change) in variants {
        let mut r = first.clone();
        change(r.content.as_mut().unwrap());
        match p.ingest().create_event(r).await {
            Err(e) if e.code() == Code::AlreadyExists => {}
            Err(e) => problems.push(format!("{name}: {:?} {}", e.code(), e.message())),
            Ok(ok) => problems.push(format!(
                "{name}: accepted, duplicate={}",
                ok.into_inner().duplicate
            )),
        }
    }
    let stored = p.get_event(&created.event_id).await.content.unwrap();
    if stored.actions != first.content.as_ref().unwrap().actions {
        problems.push(format!("stored actions changed: {:?}", stored.actions));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Ingest edge cases, each with the outcome a user would expect from the docs. Every
/// case is tried; the failures are listed together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_edge_cases() {
    let p = Platform::start_with_workers(&[]).await;
    p.add_type("order_paid", &["inapp", "email", "line", "push"])
        .await;
    let mut n = 0;
    let mut base = || {
        n += 1;
        p.rich_event(&format!("edge:{n}"), "order_paid", &["u1"])
    };
    let flex = |alt: String| {
        json!([{"type": "flex", "altText": alt, "contents": {"type": "bubble", "body": {
            "type": "box", "layout": "vertical", "contents": [{"type": "text", "text": "x"}]}}}])
        .to_string()
    };
    let line_over = |json: String| {
        Some(pb::ChannelOverrides {
            line_messages_json: json,
            ..Default::default()
        })
    };
    // (name, request, Ok(()) = accepted, Err(field) = refused naming that field)
    let mut cases: Vec<(&str, pb::CreateEventRequest, Result<(), &str>)> = Vec::new();

    let mut r = base();
    r.content.as_mut().unwrap().overrides = line_over(flex("ก".repeat(1_500)));
    cases.push(("altText exactly 1,500 Thai", r, Ok(())));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = line_over(flex("😀".repeat(751)));
    cases.push((
        "altText 751 emoji = 1,502 UTF-16 units",
        r,
        Err("content.overrides.line_messages_json[0].altText"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = line_over(flex("😀".repeat(750)));
    cases.push(("altText 750 emoji = 1,500 UTF-16 units", r, Ok(())));
    let mut r = base();
    // 20 code points with combining vowels and tone marks (fewer graphemes).
    let label20 = "ที่นี่มีน้ำใจดีนะครับ".chars().take(20).collect::<String>();
    assert_eq!(label20.chars().count(), 20);
    r.content.as_mut().unwrap().actions[0].label = label20.clone();
    cases.push(("label 20 Thai code points with marks", r, Ok(())));
    let mut r = base();
    r.content.as_mut().unwrap().actions[0].label = format!("{label20}ก");
    cases.push(("label 21 code points", r, Err("content.actions[0].label")));
    let mut r = base();
    r.content.as_mut().unwrap().actions[0].label = "\u{200B}\u{200B}".into();
    cases.push((
        "label of zero-width spaces only (invisible button)",
        r,
        Err("content.actions[0].label"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().actions[0].label = "ดู\u{202E}ซื้อ".into();
    cases.push((
        "label with a bidi override",
        r,
        Err("content.actions[0].label"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().thread = "order\u{7}1001".into();
    cases.push(("thread with BEL", r, Err("content.thread")));
    let mut r = base();
    r.content.as_mut().unwrap().thread = "ก".repeat(22); // 66 bytes
    cases.push(("thread 66 bytes of Thai", r, Err("content.thread")));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        fcm_data: (0..101)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect(),
        ..Default::default()
    });
    cases.push((
        "fcm_data with 101 keys",
        r,
        Err("content.overrides.fcm_data"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().image_url = "https://".into();
    cases.push(("image https:// with no host", r, Err("content.image_url")));
    let mut r = base();
    r.content.as_mut().unwrap().actions[0].url = "JaVaScRiPt:alert(1)".into();
    cases.push((
        "mixed-case javascript: action",
        r,
        Err("content.actions[0].url"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().actions[0].url = "myshop:".into();
    cases.push(("deep link with no path", r, Err("content.actions[0].url")));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = line_over(
        json!([{"type": "image", "originalContentUrl": "javascript:alert(1)",
                "previewImageUrl": "https://cdn.shop.example.test/p.png"}])
        .to_string(),
    );
    cases.push((
        "LINE image message with a javascript: URL",
        r,
        Err("content.overrides.line_messages_json[0].originalContentUrl"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = line_over(
        json!([{"type": "image", "originalContentUrl": "myshop://img/1.png",
                "previewImageUrl": "https://cdn.shop.example.test/p.png"}])
        .to_string(),
    );
    cases.push((
        "LINE image message with a deep link",
        r,
        Err("content.overrides.line_messages_json[0].originalContentUrl"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = line_over(
        json!([{"type": "flex", "altText": "x", "contents": {"type": "bubble",
            "hero": {"type": "image", "url": "http://cdn.shop.example.test/a.png"},
            "body": {"type": "box", "layout": "vertical", "contents": [{"type": "text", "text": "x"}]}}}])
        .to_string(),
    );
    cases.push((
        "Flex hero image over http",
        r,
        Err("content.overrides.line_messages_json[0].contents.hero.url"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = line_over(
        json!([{"type": "text", "text": "x", "quickReply": {"items": [{"type": "action",
            "action": {"type": "message", "label": "ก".repeat(21), "text": "x"}}]}}])
        .to_string(),
    );
    cases.push((
        "quick reply label of 21",
        r,
        Err("content.overrides.line_messages_json[0].quickReply.items[0].action.label"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        webpush_actions: vec![pb::Action {
            id: "a".into(),
            label: "x".into(),
            url: "javascript:alert(1)".into(),
        }],
        ..Default::default()
    });
    cases.push((
        "Web Push action override with javascript:",
        r,
        Err("content.overrides.webpush_actions[0].url"),
    ));
    let mut r = base();
    r.content.as_mut().unwrap().badge = 7;
    cases.push(("badge policy 7 (not in the enum)", r, Err("content.badge")));
    let mut r = base();
    let c = r.content.as_mut().unwrap();
    c.badge = pb::BadgePolicy::Count as i32;
    c.badge_count = u32::MAX;
    cases.push((
        "badge count 4,294,967,295 (over APNs/FCM int32)",
        r,
        Err("content.badge_count"),
    ));

    let mut problems = Vec::new();
    for (name, req, want) in cases {
        let got = p.ingest().create_event(req).await;
        match (&got, want) {
            (Ok(_), Ok(())) => {}
            (Err(e), Err(field))
                if e.code() == Code::InvalidArgument && fields(e).iter().any(|f| f == field) => {}
            (Ok(_), Err(field)) => {
                problems.push(format!("{name}: ACCEPTED, expected refusal naming {field}"))
            }
            (Err(e), want) => problems.push(format!(
                "{name}: {:?} {:?} fields={:?}, expected {want:?}",
                e.code(),
                e.message(),
                fields(e)
            )),
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A template renders an action URL (and image) from the payload. The payload value is
/// not under a link-named key, so ingest lets it through; the rendered content must fail
/// at render with `content_invalid` on every channel, and no provider is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_rendering_javascript_action_fails_content_invalid() {
    let p = Platform::start_with_workers(&[Channel::InApp, Channel::Email, Channel::Line]).await;
    let tpl = |channel: &str| pb::Template {
        channel: channel.into(),
        locale: "th".into(),
        title: "คำสั่งซื้อ #{{ payload.order_id }}".into(),
        body: "ดูรายละเอียด".into(),
        actions: vec![pb::Action {
            id: "go".into(),
            label: "เปิด".into(),
            url: "{{ payload.target }}".into(),
        }],
        ..Default::default()
    };
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        default_locale: "th".into(),
        sample_payload: r#"{"order_id": 1, "target": "https://shop.example.test/o/1"}"#.into(),
        templates: vec![tpl("inapp"), tpl("email"), tpl("line")],
        ..type_request("jump", &["inapp", "email", "line"])
    })
    .await;
    let u = support::uniq("u");
    let address = format!("{u}@example.test");
    let lid = support::line_id();
    p.add_recipient(&u, "สมชาย", &address, &lid).await;
    let mut problems = Vec::new();
    for (i, target) in [
        "javascript:alert(document.cookie)",
        "data:text/html,<script>alert(1)</script>",
        "otherapp://steal",
    ]
    .iter()
    .enumerate()
    {
        let mut req = p.event(&format!("jump:{i}"), "jump", &[&u]);
        req.payload = json!({"order_id": 1001, "target": target}).to_string();
        let ev = match p.ingest().create_event(req).await {
            Ok(ev) => ev.into_inner(),
            Err(e) => {
                // Refused at ingest is fine too.
                eprintln!("{target}: refused at ingest {:?} {}", e.code(), e.message());
                continue;
            }
        };
        let done = p.wait_final(&ev.event_id, 30).await;
        for d in &done.deliveries {
            if d.status != "failed" || !d.last_error.starts_with("content_invalid") {
                problems.push(format!(
                    "{target} on {}: {} {:?}",
                    d.channel, d.status, d.last_error
                ));
            }
        }
    }
    let rows = p.count("notifications").await;
    if rows != 0 {
        let urls: Vec<Value> = p.query_scalars("SELECT actions FROM notifications").await;
        problems.push(format!("{rows} inbox rows written: {urls:?}"));
    }
    let line = p.sim_requests("line").await;
    if !line.is_empty() {
        problems.push(format!("LINE called {} times", line.len()));
    }
    let mails = p.mails_to(&address).await;
    if !mails.is_empty() {
        problems.push(format!("{} mails sent", mails.len()));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A signed postback from LINE user B naming user A's delivery, one naming an action the
/// card never had, one naming a non-LINE delivery, a huge garbled one and an unsigned one:
/// none of them is a click on A's delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_postback_forgeries_are_not_clicks() {
    let p = Platform::start_with_type(
        &[Channel::Line, Channel::InApp],
        "order_paid",
        &["line", "inapp"],
    )
    .await;
    let (a, lid_a) = p.add_line_recipient("a").await;
    let (_b, lid_b) = p.add_line_recipient("b").await;
    let (_, done) = p
        .deliver_all(p.rich_event("order:1:paid", "order_paid", &[&a]))
        .await;
    let line_d = on_channel(&done, "line")[0].delivery_id.clone();
    let inapp_d = on_channel(&done, "inapp")[0].delivery_id.clone();
    let mut problems = Vec::new();
    let cases = [
        (
            "another LINE user names A's delivery",
            postback(
                &lid_b,
                &format!("d={line_d}&a=track"),
                "01PROBE0000000000000000001",
            ),
        ),
        (
            "A names an action the card never had",
            postback(
                &lid_a,
                &format!("d={line_d}&a=refund"),
                "01PROBE0000000000000000002",
            ),
        ),
        (
            "A names the in-app delivery",
            postback(
                &lid_a,
                &format!("d={inapp_d}&a=track"),
                "01PROBE0000000000000000003",
            ),
        ),
        (
            "huge action id",
            postback(
                &lid_a,
                &format!("d={line_d}&a={}", "x".repeat(100_000)),
                "01PROBE0000000000000000004",
            ),
        ),
        (
            "garbled percent/utf8",
            postback(
                &lid_a,
                &format!("d={line_d}&a=%00%ff\u{0}ก"),
                "01PROBE0000000000000000005",
            ),
        ),
    ];
    for (name, body) in &cases {
        let r = line_webhook(&p, &p.http_url, body).await;
        let status = r.status().as_u16();
        if status >= 500 {
            problems.push(format!(
                "{name}: HTTP {status} {}",
                r.text().await.unwrap_or_default()
            ));
        }
    }
    // Unsigned and wrongly signed.
    let body = postback(
        &lid_a,
        &format!("d={line_d}&a=track"),
        "01PROBE0000000000000000006",
    );
    for sig in [None, Some("AAAA")] {
        let mut req = p
            .http
            .post(format!("{}/webhooks/line", p.http_url))
            .body(body.clone());
        if let Some(s) = sig {
            req = req.header("x-line-signature", s);
        }
        let st = req.send().await.unwrap().status().as_u16();
        if st != 401 && st != 403 {
            problems.push(format!("signature {sig:?}: HTTP {st}"));
        }
    }
    let rows: Vec<(String, String, String, String)> = p.query_rows("SELECT delivery_id::text, user_id, left(action_id, 40), source FROM delivery_clicks ORDER BY id").await;
    for r in &rows {
        problems.push(format!("recorded click: {r:?}"));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// docs: a click "marks the item read (an archived one stays archived)" and is recorded
/// once; unarchive afterwards shows it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_click_on_archived_item() {
    let p = Platform::start_with_type(&[Channel::InApp], "order_paid", &["inapp"]).await;
    let u = p.add_bare_recipient("u").await;
    let ev = p
        .create_event(p.rich_event("order:1:paid", "order_paid", &[&u]))
        .await;
    p.wait_final(&ev.event_id, 30).await;
    let t = inbox_token(&u, 300);
    let call = |method: &str, path: &str, body: &str| {
        let url = format!("{}{path}", p.http_url);
        let rb = if method == "GET" {
            p.http.get(url)
        } else {
            p.http.post(url)
        };
        let body = body.to_string();
        let t = t.clone();
        async move {
            let r = rb
                .bearer_auth(t)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (_, page) = call("GET", "/v1/inbox/notifications", "").await;
    let id = page["items"][0]["id"].as_str().unwrap().to_string();
    let (st, _) = call("POST", &format!("/v1/inbox/notifications/{id}/archive"), "").await;
    assert_eq!(st, 200);
    let mut problems = Vec::new();
    let (st, r) = call(
        "POST",
        &format!("/v1/inbox/notifications/{id}/click"),
        r#"{"action_id":"view"}"#,
    )
    .await;
    if st != 200 || r["item"]["status"] != "archived" || r["counted"] != true {
        problems.push(format!("click on archived: {st} {r}"));
    }
    let (_, count) = call("GET", "/v1/inbox/unread-count", "").await;
    if count["unread"] != 0 {
        problems.push(format!("unread after click on archived: {count}"));
    }
    let (st, r) = call(
        "POST",
        &format!("/v1/inbox/notifications/{id}/unarchive"),
        "",
    )
    .await;
    if st != 200
        || r["item"]["status"]
            .as_str()
            .unwrap_or(r["status"].as_str().unwrap_or(""))
            == "unread"
    {
        problems.push(format!(
            "unarchive after a click: {st} {r} (should be read)"
        ));
    }
    // Action id with surrounding spaces / different case is not silently matched.
    let (st, r) = call(
        "POST",
        &format!("/v1/inbox/notifications/{id}/click"),
        r#"{"action_id":"VIEW"}"#,
    )
    .await;
    if st != 400 {
        problems.push(format!("action id VIEW: {st} {r}"));
    }
    let clicks: i64 = p.count("delivery_clicks").await;
    if clicks != 1 {
        problems.push(format!("delivery_clicks = {clicks}"));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// The default rich event's second action is an app deep link (`myshop://`): LINE turns it
/// into a postback because LINE cannot open it. An email client cannot open it either
/// (webmail, desktop): expect the email not to carry a dead `myshop://` button.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn email_does_not_carry_app_deep_link_buttons() {
    let p = Platform::start_with_type(&[Channel::Email], "order_paid", &["email"]).await;
    let user = support::uniq("u");
    let address = format!("{user}@example.test");
    p.add_recipient(&user, "สมชาย", &address, "").await;
    let req = p.rich_event("order:1001:paid", "order_paid", &[&user]);
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(
        done.deliveries[0].status, "sent",
        "{:?}",
        done.deliveries[0]
    );
    let mails = p.mails_to(&address).await;
    let html = mails[0]["html"].as_str().unwrap_or("");
    let text = mails[0]["text"].as_str().unwrap_or("");
    let hrefs: Vec<&str> = html
        .split("href=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap())
        .collect();
    let text_lines: Vec<&str> = text.lines().filter(|l| l.contains("myshop:")).collect();
    assert!(
        !html.contains("myshop://") && text_lines.is_empty(),
        "email carries the app deep link: hrefs={hrefs:?} text={text_lines:?}"
    );
}

/// HTML in labels, title and image URL must be escaped in the email layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn email_layout_escapes_labels_and_image() {
    let p = Platform::start_with_type(&[Channel::Email], "order_paid", &["email"]).await;
    let user = support::uniq("u");
    let address = format!("{user}@example.test");
    p.add_recipient(&user, "สมชาย", &address, "").await;
    let mut req = p.rich_event("order:1001:paid", "order_paid", &[&user]);
    let c = req.content.as_mut().unwrap();
    c.actions[0].label = "<img src=x onerror=1>".into();
    c.actions[1].url = "https://shop.example.test/t?a=\"><b>x".into();
    c.image_url = "https://cdn.shop.example.test/a.png\"onerror=\"alert(1)".into();
    c.title = "<script>alert(1)</script>".into();
    let ev = match p.ingest().create_event(req).await {
        Ok(e) => e.into_inner(),
        Err(e) => {
            eprintln!(
                "refused at ingest: {:?} {} {:?}",
                e.code(),
                e.message(),
                fields(&e)
            );
            p.stop().await;
            return;
        }
    };
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(
        done.deliveries[0].status, "sent",
        "{:?}",
        done.deliveries[0]
    );
    let html = p.mails_to(&address).await[0]["html"]
        .as_str()
        .unwrap()
        .to_string();
    for bad in ["<img src=x", "<script>", "\"onerror=", "\"><b>"] {
        assert!(!html.contains(bad), "unescaped {bad:?} in the email HTML");
    }
}

/// 3 actions with 20-character Thai labels, a long Thai body, an image, a thread and a
/// 40-key fcm_data with long values: FCM, APNs and Web Push each get a payload within
/// their limit (body shortened) or a clear payload_too_large; never a provider 400/413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_max_labels_and_long_body_fit_or_fail_clearly() {
    let p = Platform::start_with_type(&[Channel::Push], "order_paid", &["push"]).await;
    let u = p.add_bare_recipient("maxpush").await;
    p.add_device(&u, &format!("fcm-max-{u}")).await;
    p.add_endpoint(&u, "apns", &format!("apns-max-{u}")).await;
    p.add_webpush(&u, &format!("https://push.example.test/sub/max-{u}"))
        .await;
    let label = "ติดตามพัสดุของท่านได้ที่นี่".chars().take(20).collect::<String>();
    let mut req = p.rich_event("maxpush:1", "order_paid", &[&u]);
    let c = req.content.as_mut().unwrap();
    c.body = "ระบบได้รับการชำระเงินของท่านเรียบร้อยแล้วและกำลังแจ้งเตือนไปยังร้านค้า ".repeat(40);
    c.thread = "order-1001".into();
    c.badge = pb::BadgePolicy::Count as i32;
    c.badge_count = notify_core::content::MAX_BADGE;
    c.actions = (0..3)
        .map(|i| pb::Action {
            id: format!("a{i}"),
            label: label.clone(),
            url: format!("https://shop.example.test/orders/1001/{}", "x".repeat(200)),
        })
        .collect();
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 60).await;
    let mut problems = Vec::new();
    for d in &done.deliveries {
        if d.status != "sent" {
            problems.push(format!(
                "{} {}: {} {}",
                d.channel, d.endpoint_id, d.status, d.last_error
            ));
        }
    }
    for prov in ["fcm", "apns", "webpush"] {
        for r in p.sim_requests(prov).await {
            let st = r["status"].as_u64().unwrap_or(0);
            if !(200..300).contains(&st) {
                problems.push(format!("{prov} answered {st}: {}", r["response"]));
            }
        }
    }
    for r in p.sim_requests("apns").await {
        assert_eq!(r["body"]["aps"]["badge"], notify_core::content::MAX_BADGE);
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A Flex override with altText exactly 1,500 Thai characters reaches LINE and LINE (the
/// simulator) accepts it; a built card whose title+body is long with emoji at the cut gets
/// an altText LINE accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_alt_text_at_the_limit_is_sent() {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
    let (u, _) = p.add_line_recipient("u").await;
    let mut a = p.event("alt:1", "order_paid", &[&u]);
    a.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        line_messages_json: json!([{"type": "flex", "altText": "ที่".repeat(500), "contents": {
            "type": "bubble", "body": {"type": "box", "layout": "vertical", "contents": [
                {"type": "text", "text": "x"}]}}}])
        .to_string(),
        ..Default::default()
    });
    let mut b = p.rich_event("alt:2", "order_paid", &[&u]);
    b.content.as_mut().unwrap().body = "👨‍👩‍👧‍👦".repeat(300);
    let mut problems = Vec::new();
    for req in [a, b] {
        let key = req.event_key.clone();
        let ev = p.create_event(req).await;
        let done = p.wait_final(&ev.event_id, 30).await;
        let d = &done.deliveries[0];
        if d.status != "sent" {
            problems.push(format!("{key}: {} {}", d.status, d.last_error));
        }
    }
    for r in p.sim_requests("line").await {
        let alt = r["body"]["messages"][0]["altText"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let units = alt.encode_utf16().count();
        eprintln!(
            "altText {} units, ends {:?}",
            units,
            alt.chars().rev().take(10).collect::<String>()
        );
        if r["status"] != 200 {
            problems.push(format!("LINE answered {}: {}", r["status"], r["response"]));
        }
        // A ZWJ family must not be cut in the middle (a broken emoji before the ellipsis).
        if alt.contains('👨') {
            let before = alt.trim_end_matches('…');
            if !before.ends_with("👨‍👩‍👧‍👦") && !before.ends_with('\n') {
                problems.push(format!(
                    "altText cut inside an emoji sequence: ends {:?}",
                    before.chars().rev().take(4).collect::<Vec<_>>()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// One LINE webhook delivery carries several events. A postback LINE sends with odd bytes
/// must not make the whole delivery fail: the `unfollow` beside it is still recorded, and
/// the answer is not a 5xx (LINE would redeliver the batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_webhook_batch_survives_an_odd_postback() {
    let p = Platform::start_with_workers(&[]).await;
    let (_u, lid) = p.add_line_recipient("u").await;
    let now = chrono::Utc::now().timestamp_millis();
    let body = json!({"destination": "U0", "events": [
        {"type": "postback", "mode": "active", "timestamp": now,
         "source": {"type": "user", "userId": lid}, "webhookEventId": "01PROBEB000000000000000001",
         "deliveryContext": {"isRedelivery": false}, "replyToken": "x",
         "postback": {"data": format!("d={}&a=x\u{0}y", uuid::Uuid::now_v7())}},
        {"type": "unfollow", "mode": "active", "timestamp": now,
         "source": {"type": "user", "userId": lid}, "webhookEventId": "01PROBEB000000000000000002",
         "deliveryContext": {"isRedelivery": false}},
    ]})
    .to_string();
    let r = line_webhook(&p, &p.http_url, &body).await;
    let status = r.status().as_u16();
    let followers: i64 = p.count("line_followers").await;
    assert!(
        status < 500 && followers == 1,
        "HTTP {status}, line_followers rows = {followers}: the unfollow beside the postback was {}",
        if followers == 1 { "kept" } else { "lost" }
    );
}

/// 100 fcm_data keys with long values cannot fit 4,096 bytes: the delivery fails with
/// payload_too_large before any FCM call, naming /message/data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcm_data_too_big_fails_before_the_call() {
    let p = Platform::start_with_type(&[Channel::Push], "order_paid", &["push"]).await;
    let u = p.add_bare_recipient("fcmbig").await;
    p.add_device(&u, &format!("fcm-big-{u}")).await;
    let mut req = p.rich_event("fcmbig:1", "order_paid", &[&u]);
    req.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        fcm_data: (0..100)
            .map(|i| (format!("key{i:03}"), "ข".repeat(20)))
            .collect(),
        ..Default::default()
    });
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let d = &done.deliveries[0];
    let calls = p.sim_count("fcm").await;
    let response: Option<String> = p
        .scalar(
            "SELECT provider_response FROM delivery_attempts WHERE delivery_id = $1::uuid",
            &d.delivery_id,
        )
        .await;
    let response = response.unwrap_or_default();
    eprintln!("attempt response: {response}");
    assert!(
        d.status == "failed"
            && d.last_error.starts_with("payload_too_large")
            && response.contains("/message/data")
            && calls == 0,
        "{} {:?} response {response:?}; FCM calls {calls}",
        d.status,
        d.last_error
    );
}

/// A template whose action label or image is rendered from the payload: a 25-character
/// label and an http:// image fail at render (content_invalid), no inbox row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_rendering_bad_label_or_image_fails_content_invalid() {
    let p = Platform::start_with_workers(&[Channel::InApp]).await;
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        key: "labelled".into(),
        default_channels: vec!["inapp".into()],
        default_locale: "th".into(),
        sample_payload: r#"{"label": "ดู", "img": "https://cdn.shop.example.test/a.png"}"#.into(),
        templates: vec![pb::Template {
            channel: "inapp".into(),
            locale: "th".into(),
            title: "สวัสดี".into(),
            image_url: "{{ payload.img }}".into(),
            actions: vec![pb::Action {
                id: "go".into(),
                label: "{{ payload.label }}".into(),
                url: "https://shop.example.test/x".into(),
            }],
            ..Default::default()
        }],
        ..Default::default()
    })
    .await;
    let u = p.add_bare_recipient("u").await;
    let mut problems = Vec::new();
    for (i, payload) in [
        json!({"label": "ก".repeat(25), "img": "https://cdn.shop.example.test/a.png"}),
        json!({"label": "ดู", "img": "http://cdn.shop.example.test/a.png"}),
        json!({"label": "", "img": "https://cdn.shop.example.test/a.png"}),
        json!({"label": "ดู\nสอง", "img": "https://cdn.shop.example.test/a.png"}),
    ]
    .iter()
    .enumerate()
    {
        let mut req = p.event(&format!("lab:{i}"), "labelled", &[&u]);
        req.payload = payload.to_string();
        let ev = p.create_event(req).await;
        let done = p.wait_final(&ev.event_id, 30).await;
        let d = &done.deliveries[0];
        if d.status != "failed" || !d.last_error.starts_with("content_invalid") {
            problems.push(format!("{payload}: {} {:?}", d.status, d.last_error));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A type's LINE Flex template renders each string from the payload: a payload string
/// full of JSON syntax stays a literal string (no injection), and a button `uri` rendered
/// into `javascript:` fails at render with content_invalid and LINE is not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_flex_template_payload_injection() {
    let p = Platform::start_with_workers(&[Channel::Line]).await;
    let card = json!([{"type": "flex", "altText": "{{ payload.note }}", "contents": {
        "type": "bubble",
        "body": {"type": "box", "layout": "vertical", "contents": [
            {"type": "text", "text": "{{ payload.note }}", "wrap": true}]},
        "footer": {"type": "box", "layout": "vertical", "contents": [
            {"type": "button", "action": {"type": "uri", "label": "เปิด", "uri": "{{ payload.go }}"}}]}}}]);
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        key: "flexy".into(),
        default_channels: vec!["line".into()],
        default_locale: "th".into(),
        sample_payload: r#"{"note": "สั้น", "go": "https://shop.example.test/o/1"}"#.into(),
        templates: vec![line_template(&card)],
        ..Default::default()
    })
    .await;
    let (u, _) = p.add_line_recipient("u").await;
    let inject = r#"x"}],"quickReply":{"items":[]},"y":[{"a":"<b>"#;
    let mut problems = Vec::new();
    let mut a = p.event("flexy:1", "flexy", &[&u]);
    a.payload = json!({"note": inject, "go": "https://shop.example.test/o/1"}).to_string();
    let mut b = p.event("flexy:2", "flexy", &[&u]);
    b.payload = json!({"note": "ok", "go": "javascript:alert(1)"}).to_string();
    let mut c = p.event("flexy:3", "flexy", &[&u]);
    c.payload = json!({"note": "ok", "go": "myshop://orders/1"}).to_string();
    let mut ids = Vec::new();
    for req in [a, b, c] {
        let key = req.event_key.clone();
        match p.ingest().create_event(req).await {
            Ok(ev) => ids.push((key, Some(ev.into_inner().event_id))),
            Err(e) => {
                eprintln!("{key}: refused at ingest {:?} {}", e.code(), e.message());
                ids.push((key, None));
            }
        }
    }
    for (key, id) in &ids {
        let Some(id) = id else { continue };
        let done = p.wait_final(id, 30).await;
        let d = &done.deliveries[0];
        let want_sent = key == "flexy:1";
        let ok = if want_sent {
            d.status == "sent"
        } else {
            d.status == "failed" && d.last_error.starts_with("content_invalid")
        };
        if !ok {
            problems.push(format!("{key}: {} {:?}", d.status, d.last_error));
        }
    }
    let reqs = p.sim_requests("line").await;
    if reqs.len() != 1 {
        problems.push(format!(
            "LINE called {} times: {:?}",
            reqs.len(),
            reqs.iter().map(|r| &r["status"]).collect::<Vec<_>>()
        ));
    }
    if let Some(r) = reqs.first() {
        let m = &r["body"]["messages"][0];
        if m["altText"] != inject || m.get("quickReply").is_some() {
            problems.push(format!("injection changed the card: {m}"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// A long Thai text (no spaces) to LINE splits into text objects at word boundaries: no
/// object ends with a leading vowel (เ แ โ ใ ไ) or starts with a combining mark, each is
/// within 5,000 UTF-16 units, and the objects join back into the text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_thai_split_at_word_boundaries() {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
    let (u, _) = p.add_line_recipient("u").await;
    let sentence =
        "ระบบได้แจ้งเตือนการชำระเงินของท่านเรียบร้อยแล้วโปรดตรวจสอบรายละเอียดในแอปพลิเคชันไม่ต้องตอบกลับข้อความนี้";
    let body: String = sentence.repeat(160).chars().take(14_000).collect();
    let mut req = p.event("split:1", "order_paid", &[&u]);
    req.content.as_mut().unwrap().body = body.clone();
    req.content.as_mut().unwrap().url = String::new();
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let d = &done.deliveries[0];
    assert_eq!(d.status, "sent", "{}", d.last_error);
    let texts = p.line_texts(0).await;
    let mut problems = Vec::new();
    let combining =
        |c: char| matches!(c, '\u{0E31}' | '\u{0E34}'..='\u{0E3A}' | '\u{0E47}'..='\u{0E4E}');
    for (i, t) in texts.iter().enumerate() {
        let units = t.encode_utf16().count();
        let last = t.chars().last().unwrap();
        let first = t.chars().next().unwrap();
        eprintln!(
            "object {i}: {units} units, starts {:?} ends {:?}",
            t.chars().take(6).collect::<String>(),
            t.chars()
                .rev()
                .take(6)
                .collect::<String>()
                .chars()
                .rev()
                .collect::<String>()
        );
        if units > 5_000 {
            problems.push(format!("object {i}: {units} units"));
        }
        // The last object ends where the text ends (the input is cut at 14,000 chars).
        if i + 1 < texts.len() && matches!(last, 'เ' | 'แ' | 'โ' | 'ใ' | 'ไ') {
            problems.push(format!("object {i} ends with leading vowel {last}"));
        }
        if combining(first) {
            problems.push(format!("object {i} starts with a combining mark {first:?}"));
        }
    }
    let joined = texts.concat();
    let want = format!("ชำระเงินแล้ว #1001\n{body}");
    if joined != want {
        problems.push(format!(
            "joined {} chars != {} chars",
            joined.chars().count(),
            want.chars().count()
        ));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// An action without an id gets `action<N>` by position. If another action already has
/// that id explicitly, two buttons end up with the same id (the click callback cannot
/// tell them apart): expect a refusal naming the id, or distinct ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positional_action_id_collides_with_an_explicit_one() {
    let p = Platform::start_with_type(&[Channel::InApp], "order_paid", &["inapp"]).await;
    let u = p.add_bare_recipient("u").await;
    let mut req = p.rich_event("collide:1", "order_paid", &[&u]);
    let c = req.content.as_mut().unwrap();
    c.actions[0].id = String::new(); // becomes action1
    c.actions[1].id = "action1".into();
    c.actions[1].url = "https://shop.example.test/cancel/1001".into();
    c.actions[1].label = "ยกเลิกคำสั่งซื้อ".into();
    match p.ingest().create_event(req).await {
        Err(e) => {
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            eprintln!("refused: {:?}", fields(&e));
        }
        Ok(ev) => {
            let ev = ev.into_inner();
            p.wait_final(&ev.event_id, 30).await;
            let stored = p.get_event(&ev.event_id).await.content.unwrap();
            let ids: Vec<&str> = stored.actions.iter().map(|a| a.id.as_str()).collect();
            // What the user gets when clicking the second button ("cancel").
            let t = inbox_token(&u, 300);
            let page: Value = p
                .http
                .get(format!("{}/v1/inbox/notifications", p.http_url))
                .bearer_auth(&t)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let id = page["items"][0]["id"].as_str().unwrap().to_string();
            let r: Value = p
                .http
                .post(format!("{}/v1/inbox/notifications/{id}/click", p.http_url))
                .bearer_auth(&t)
                .header("content-type", "application/json")
                .body(r#"{"action_id":"action1"}"#)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert!(
                ids[0] != ids[1],
                "accepted with duplicate ids {ids:?}; clicking the 'cancel' button (id action1) opens {}",
                r["url"]
            );
        }
    }
}

/// A template's actions without ids: like the caller's, they should get `action<N>`, so
/// each inbox button can be clicked (an empty id means "the notification itself").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_actions_without_ids_get_positional_ids() {
    let p = Platform::start_with_workers(&[Channel::InApp]).await;
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        key: "noids".into(),
        default_channels: vec!["inapp".into()],
        default_locale: "th".into(),
        sample_payload: r#"{"order_id": 1}"#.into(),
        templates: vec![pb::Template {
            channel: "inapp".into(),
            locale: "th".into(),
            title: "คำสั่งซื้อ #{{ payload.order_id }}".into(),
            actions: vec![
                pb::Action {
                    id: String::new(),
                    label: "ดู".into(),
                    url: "https://shop.example.test/o/{{ payload.order_id }}".into(),
                },
                pb::Action {
                    id: String::new(),
                    label: "ยกเลิก".into(),
                    url: "https://shop.example.test/c/{{ payload.order_id }}".into(),
                },
            ],
            ..Default::default()
        }],
        ..Default::default()
    })
    .await;
    let u = p.add_bare_recipient("u").await;
    let ev = p.send("noids:1", "noids", &[&u]).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(
        done.deliveries[0].status, "sent",
        "{}",
        done.deliveries[0].last_error
    );
    let t = inbox_token(&u, 300);
    let page: Value = p
        .http
        .get(format!("{}/v1/inbox/notifications", p.http_url))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let actions = page["items"][0]["actions"].clone();
    let ids: Vec<&str> = actions
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(ids, ["action1", "action2"], "{actions}");
}
