//! Unit tests of template picking, filters and rendering.
use super::filters::group_digits;
use super::*;
use serde_json::json;

fn t(channel: &str, locale: &str, body: &str) -> Template {
    Template {
        channel: channel.into(),
        locale: locale.into(),
        body: body.into(),
        ..Default::default()
    }
}

fn ctx<'a>(payload: &'a Value, content: &'a Content, locale: &'a str) -> RenderContext<'a> {
    RenderContext {
        payload,
        content,
        recipient: RecipientContext {
            user_id: "u1",
            display_name: "สมชาย",
            locale,
            timezone: "Asia/Bangkok",
        },
        event: EventContext {
            id: "e1".into(),
            key: "order:1001:paid",
            type_key: "order_paid",
        },
        digest: DigestContext {
            count: 0,
            items: vec![],
        },
    }
}

#[test]
fn the_locale_chain_falls_back_to_the_language_then_the_default() {
    let ts = [
        t("email", "th", "th email"),
        t("*", "th-TH", "th-TH any"),
        t("*", "en", "en any"),
    ];
    assert_eq!(pick(&ts, "line", "th-TH", "en").unwrap().body, "th-TH any");
    assert_eq!(
        pick(&ts, "email", "th-TH", "en").unwrap().body,
        "th-TH any",
        "locale before channel"
    );
    assert_eq!(pick(&ts, "email", "th", "en").unwrap().body, "th email");
    assert_eq!(pick(&ts, "email", "ja-JP", "en").unwrap().body, "en any");
    assert!(pick(&ts, "email", "ja-JP", "fr").is_none());
}

#[test]
fn thai_money_and_buddhist_era_dates_in_the_recipients_zone() {
    let payload = json!({"total": "1250", "paid_at": "2026-11-30T18:30:00Z", "items": 3});
    let content = Content::default();
    let tpl = Template {
        channel: "*".into(),
        locale: "th".into(),
        title: "ชำระเงิน {{ payload.total|money }} แล้ว".into(),
        body: "วันที่ {{ payload.paid_at|date }} ({{ payload.paid_at|date('short') }}) เวลา {{ payload.paid_at|datetime }}".into(),
        ..Default::default()
    };
    let out = render("order_paid", &tpl, &ctx(&payload, &content, "th-TH")).unwrap();
    assert_eq!(out.title, "ชำระเงิน 1,250.00 บาท แล้ว");
    // 18:30 UTC is 01:30 on 1 December in Bangkok; 2026 CE is 2569 BE.
    assert_eq!(
        out.body,
        "วันที่ 1 ธันวาคม 2569 (1 ธ.ค. 2569) เวลา 1 ธันวาคม 2569 01:30 น."
    );
    let en = render(
        "order_paid",
        &Template {
            locale: "en".into(),
            ..tpl
        },
        &ctx(&payload, &content, "en-US"),
    )
    .unwrap();
    assert_eq!(en.title, "ชำระเงิน THB 1,250.00 แล้ว");
    assert!(en.body.contains("1 December 2026"), "{}", en.body);
    assert_eq!(group_digits(1234567.5), "1,234,567.50");
    assert_eq!(group_digits(-5.0), "-5.00");
}

#[test]
fn errors_name_the_template_and_line_and_html_is_escaped() {
    let payload = json!({"name": "<b>สมชาย</b>"});
    let content = Content::default();
    let broken = t("email", "th", "สวัสดี\n{{ payload.missing.deeper }}");
    let e = render("order_paid", &broken, &ctx(&payload, &content, "th")).unwrap_err();
    assert_eq!(e.name, "order_paid/email/th:body");
    assert_eq!(e.line, 2);
    let html = Template {
        email_html: "<p>{{ payload.name }}</p>".into(),
        ..t("email", "th", "{{ payload.name }}")
    };
    let out = render("order_paid", &html, &ctx(&payload, &content, "th")).unwrap();
    assert_eq!(out.email_html, "<p>&lt;b&gt;สมชาย&lt;&#x2f;b&gt;</p>");
    assert_eq!(out.body, "<b>สมชาย</b>", "plain text is not escaped");
    let endless = t("*", "th", "{% for i in range(100000) %}{{ i }}{% endfor %}");
    assert!(
        render("order_paid", &endless, &ctx(&payload, &content, "th")).is_err(),
        "fuel runs out"
    );
    let v = validate(
        "order_paid",
        &[t("*", "th", "ok"), broken, t("fax", "th", "x")],
        &payload,
    );
    let fields: Vec<&str> = v.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(fields, ["templates[1].body", "templates[2].channel"]);
}

#[test]
fn rich_fields_and_a_flex_card_render_from_the_payload() {
    let payload = json!({"order_id": 1001, "total": "1250"});
    let content = Content {
        title: "t".into(),
        ..Default::default()
    };
    let tpl: Template = serde_json::from_value(json!({
        "channel": "line", "locale": "th",
        "image_url": "https://cdn.shop.example/o/{{ payload.order_id }}.png",
        "actions": [{"label": "ดูคำสั่งซื้อ", "url": "https://shop.example/o/{{ payload.order_id }}"}],
        "badge": "unread_count",
        "overrides": {"line_messages": [{"type": "flex", "altText": "ชำระแล้ว {{ payload.total|money }}",
            "contents": {"type": "bubble", "body": {"type": "box", "layout": "vertical",
                "contents": [{"type": "text", "text": "ยอด {{ payload.total|money }}", "size": "xl"}]}}}]}
    }))
    .unwrap();
    let out = render("order_paid", &tpl, &ctx(&payload, &content, "th-TH")).unwrap();
    assert_eq!(out.image_url, "https://cdn.shop.example/o/1001.png");
    assert_eq!(out.actions[0].url, "https://shop.example/o/1001");
    assert_eq!(
        out.actions[0].id, "action1",
        "ids are filled in after rendering"
    );
    assert_eq!(out.badge, crate::Badge::UnreadCount);
    let flex = &out.overrides.line_messages[0];
    assert_eq!(flex["altText"], "ชำระแล้ว 1,250.00 บาท");
    assert_eq!(
        flex["contents"]["body"]["contents"][0]["text"],
        "ยอด 1,250.00 บาท"
    );
    assert_eq!(flex["contents"]["body"]["contents"][0]["size"], "xl");
    assert_eq!(
        out.title, "t",
        "fields the template leaves empty keep the caller's"
    );

    let mut broken = tpl.clone();
    broken.overrides.line_messages[0]["altText"] = json!("{{ payload.nope.x }}");
    let e = render("order_paid", &broken, &ctx(&payload, &content, "th")).unwrap_err();
    assert_eq!(
        e.name,
        "order_paid/line/th:overrides.line_messages[0].altText"
    );

    let mut four = tpl.clone();
    four.actions = vec![tpl.actions[0].clone(); 4];
    let v = validate("order_paid", &[four], &payload);
    let fields: Vec<&str> = v.iter().map(|f| f.field.as_str()).collect();
    assert_eq!(
        fields,
        ["templates[0].actions"],
        "rendered content is checked on save"
    );
    let stored = tpl.rich_json();
    let mut back = Template {
        channel: "line".into(),
        locale: "th".into(),
        ..Default::default()
    };
    back.set_rich_json(stored).unwrap();
    assert_eq!(back, tpl, "the store's rich column round-trips");
}
