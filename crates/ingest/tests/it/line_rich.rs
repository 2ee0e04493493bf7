//! LINE with rich content: an event with an image and two actions reaches LINE as one
//! Flex Message card (exact JSON at the simulator), a tap on its postback button comes
//! back through the signed webhook and is recorded once as a click, and a card over
//! LINE's limits fails at render, naming the rule, without a call to LINE.

use crate::support;

use notify_core::Channel;
use notify_proto::v1 as pb;
use serde_json::{Value, json};
use support::{Platform, click_triples, line_template, line_webhook, postback};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rich_event_is_a_flex_card_and_a_postback_tap_is_one_click() {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    let (_, done) = p
        .deliver_all(p.rich_event("order:1001:paid", "order_paid", &[&u]))
        .await;
    let delivery = done.deliveries[0].delivery_id.clone();

    let reqs = p.sim_requests("line").await;
    assert_eq!(reqs.len(), 1, "one push");
    assert_eq!(reqs[0]["status"], 200, "LINE accepted the card");
    assert_eq!(
        reqs[0]["body"],
        json!({"to": lid, "messages": [{
            "type": "flex",
            "altText": "ชำระเงินแล้ว #1001\nขอบคุณที่ใช้บริการ",
            "contents": {
                "type": "bubble",
                "hero": {"type": "image", "url": "https://cdn.shop.example.test/orders/1001.png",
                    "size": "full", "aspectRatio": "20:13", "aspectMode": "cover"},
                "body": {"type": "box", "layout": "vertical", "spacing": "sm", "contents": [
                    {"type": "text", "text": "ชำระเงินแล้ว #1001", "weight": "bold", "size": "lg", "wrap": true},
                    {"type": "text", "text": "ขอบคุณที่ใช้บริการ", "size": "sm", "color": "#555555", "wrap": true},
                ]},
                "footer": {"type": "box", "layout": "vertical", "spacing": "sm", "contents": [
                    {"type": "button", "style": "primary", "height": "sm", "action": {
                        "type": "uri", "label": "ดูคำสั่งซื้อ", "uri": "https://shop.example.test/orders/1001"}},
                    {"type": "button", "style": "secondary", "height": "sm", "action": {
                        "type": "postback", "label": "ติดตามพัสดุ",
                        "data": format!("d={delivery}&a=track"), "displayText": "ติดตามพัสดุ"}},
                ]},
                "action": {"type": "uri", "uri": "https://shop.example.test/orders/1001"},
            },
        }]}),
        "the link is a URI button; the app deep link, which LINE cannot open, a postback"
    );

    // The user taps "ติดตามพัสดุ": LINE posts the postback, and redelivers it.
    let tap = postback(
        &lid,
        &format!("d={delivery}&a=track"),
        "01JDTAP0000000000000000001",
    );
    for _ in 0..2 {
        let r = line_webhook(&p, &p.http_url, &tap).await;
        assert_eq!(r.status(), 200);
    }
    // A postback of someone else's making and one naming no delivery are not clicks.
    let foreign = postback(&lid, "action=buy&item=1", "01JDTAP0000000000000000002");
    let unknown = postback(
        &lid,
        &format!("d={}&a=track", uuid::Uuid::now_v7()),
        "01JDTAP0000000000000000003",
    );
    for body in [foreign, unknown] {
        assert_eq!(line_webhook(&p, &p.http_url, &body).await.status(), 200);
    }
    let clicks = notify_store::clicks::clicks_of(&p.pool, delivery.parse().unwrap())
        .await
        .unwrap();
    let got = click_triples(&clicks);
    assert_eq!(
        got,
        [(lid.as_str(), "track", "line")],
        "one click, redelivery ignored"
    );
    assert_eq!(p.count("delivery_clicks").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_over_line_limits_fails_at_render_naming_the_rule_and_line_is_not_called() {
    let p = Platform::start_with_workers(&[Channel::Line]).await;
    // A type whose LINE template is a Flex card with the payload's note as its altText:
    // the sample payload's note is short, so the type is saved; an event's is not.
    let card = json!([{"type": "flex", "altText": "{{ payload.note }}", "contents": {
        "type": "bubble", "body": {"type": "box", "layout": "vertical", "contents": [
            {"type": "text", "text": "คำสั่งซื้อ #{{ payload.order_id }}"}]}}}]);
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        key: "order_note".into(),
        default_channels: vec!["line".into()],
        default_locale: "th".into(),
        sample_payload: r#"{"order_id": 1, "note": "สั้น"}"#.into(),
        templates: vec![line_template(&card)],
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["line"]).await;
    let (u, _) = p.add_line_recipient("u").await;

    let mut long_note = p.event("note:1", "order_note", &[&u]);
    long_note.payload = json!({"order_id": 1001, "note": "ก".repeat(1_501)}).to_string();
    // Rich content whose body makes the built card's bubble over 30 KB (3 bytes a Thai
    // character): the body is within the content rules, the card is not within LINE's.
    let mut long_body = p.rich_event("big:1", "order_paid", &[&u]);
    long_body.content.as_mut().unwrap().body = "ขอบคุณที่ใช้บริการ".repeat(600);
    let cases: [(pb::CreateEventRequest, &str); 2] = [
        (
            long_note,
            "content_invalid: content.overrides.line_messages_json[0].altText: must be at most 1500 characters (LINE Flex Message altText), got 1501",
        ),
        (
            long_body,
            "content_invalid: messages[0].contents: must be at most 30000 bytes of JSON (LINE bubble: 30 KB)",
        ),
    ];
    for (req, want) in cases {
        let ev = p.create_event(req).await;
        let done = p.wait_final(&ev.event_id, 30).await;
        let d = &done.deliveries[0];
        assert_eq!((d.status.as_str(), d.attempts), ("failed", 1), "permanent");
        assert!(d.last_error.starts_with(want), "{}", d.last_error);
    }
    let calls: Vec<Value> = p.sim_requests("line").await;
    assert!(calls.is_empty(), "LINE was never called: {calls:?}");
}

/// The shipped type file's Thai LINE template (what `make demo` sends): its sample payload
/// renders into a Flex card LINE accepts, with the amount in baht, the paid time in Thai
/// with the Buddhist-era year in Bangkok time, and a "view order" button to the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_thai_order_paid_card_renders_from_the_sample_payload() {
    let p = Platform::start_with_workers(&[Channel::Line]).await;
    let file = include_str!("../../../../deploy/notification-types.json");
    ingest::types_file::load(&p.pool, file).await.unwrap();
    let (u, lid) = (support::uniq("u"), support::line_id());
    p.recipients()
        .upsert_recipient(pb::UpsertRecipientRequest {
            user_id: u.clone(),
            line_user_id: lid.clone(),
            locale: "th-TH".into(),
            timezone: "Asia/Bangkok".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let sample: Value =
        serde_json::from_str::<Value>(file).unwrap()["types"][0]["sample_payload"].clone();
    let mut req = p.event("order:1001:paid", "order_paid", &[&u]);
    req.payload = sample.to_string();
    req.channels = vec!["line".into()];
    let ev = p.create_event(req).await;
    support::assert_all_sent(&p.wait_final(&ev.event_id, 30).await);

    let reqs = p.sim_requests("line").await;
    assert_eq!(reqs[0]["status"], 200);
    let card = &reqs[0]["body"]["messages"][0];
    assert_eq!(card["type"], "flex");
    assert_eq!(
        card["altText"],
        "ชำระเงินสำเร็จ คำสั่งซื้อ #1001 ยอด 1,250.00 บาท"
    );
    let rows = &card["contents"]["body"]["contents"];
    assert_eq!(rows[1]["text"], "คำสั่งซื้อ #1001");
    assert_eq!(rows[3]["contents"][1]["text"], "1,250.00 บาท");
    assert_eq!(
        rows[4]["contents"][1]["text"], "1 ธันวาคม 2569 01:30 น.",
        "18:30 UTC on 30 November is 01:30 on 1 December in Bangkok, year 2026 + 543"
    );
    assert_eq!(
        card["contents"]["footer"]["contents"][0]["action"],
        json!({"type": "uri", "label": "ดูคำสั่งซื้อ", "uri": "https://shop.example/orders/1001"})
    );
}
