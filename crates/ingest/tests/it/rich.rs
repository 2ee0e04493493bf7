//! Rich content at the edge: images, actions, badge, thread and per-channel overrides are
//! accepted and kept as sent, and bad rich content is refused field by field with nothing
//! stored. Each channel's rendering of the same content is tested with that channel
//! (`line`, `push`, `email_format`, `inbox`, `browser`).

use crate::support::Platform;
use notify_proto::v1 as pb;
use tonic::Code;
use tonic_types::StatusExt;

fn fields(err: &tonic::Status) -> Vec<String> {
    err.get_details_bad_request()
        .unwrap_or_else(|| panic!("no BadRequest detail: {err:?}"))
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rich_content_names_the_field_and_writes_nothing() {
    let p = Platform::start_with_workers(&[]).await;
    p.add_type("order_paid", &["inapp", "email", "line", "push"])
        .await;
    let base = || p.rich_event("k:1", "order_paid", &["u1"]);
    let mut cases: Vec<(&str, pb::CreateEventRequest, Vec<&str>)> = Vec::new();

    let mut r = base();
    let c = r.content.as_mut().unwrap();
    c.actions.push(c.actions[0].clone());
    c.actions.push(c.actions[1].clone());
    cases.push(("4 actions", r, vec!["content.actions"]));
    let mut r = base();
    r.content.as_mut().unwrap().actions[1].label = String::new();
    cases.push((
        "an action without a label",
        r,
        vec!["content.actions[1].label"],
    ));
    let mut r = base();
    r.content.as_mut().unwrap().image_url = "http://cdn.shop.example.test/a.png".into();
    cases.push(("a non-https image", r, vec!["content.image_url"]));
    let mut r = base();
    r.content.as_mut().unwrap().actions[0].url = "otherapp://x".into();
    cases.push((
        "a deep link with a scheme not listed",
        r,
        vec!["content.actions[0].url"],
    ));
    let mut r = base();
    r.content.as_mut().unwrap().actions[0].url = "javascript:alert(1)".into();
    cases.push(("a script action", r, vec!["content.actions[0].url"]));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        line_messages_json: r#"{"type":"text","text":"not an array"}"#.into(),
        ..Default::default()
    });
    cases.push((
        "LINE messages that are not an array",
        r,
        vec!["content.overrides.line_messages_json"],
    ));
    let mut r = base();
    r.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        fcm_data: [("from".to_string(), "x".to_string())].into(),
        apns_interruption_level: "loud".into(),
        ..Default::default()
    });
    cases.push((
        "a reserved FCM key and an unknown APNs interruption level",
        r,
        vec![
            "content.overrides.fcm_data[from]",
            "content.overrides.apns_interruption_level",
        ],
    ));
    let big_card = serde_json::json!([{"type": "flex", "altText": "ชำระเงินแล้ว", "contents": {
        "type": "bubble", "body": {"type": "box", "layout": "vertical", "contents": [
            {"type": "text", "text": "ก".repeat(10_000), "wrap": true}]}}}]);
    let mut r = base();
    r.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        line_messages_json: big_card.to_string(),
        ..Default::default()
    });
    cases.push((
        "a Flex card over LINE's 30 KB bubble size",
        r,
        vec!["content.overrides.line_messages_json[0].contents"],
    ));
    let long_alt = serde_json::json!([{"type": "flex", "altText": "ก".repeat(1_501), "contents": {
        "type": "bubble", "body": {"type": "box", "layout": "vertical", "contents": [
            {"type": "text", "text": "ชำระเงินแล้ว"}]}}}]);
    let mut r = base();
    r.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        line_messages_json: long_alt.to_string(),
        ..Default::default()
    });
    cases.push((
        "altText over LINE's 1,500 characters",
        r,
        vec!["content.overrides.line_messages_json[0].altText"],
    ));
    let deep_link_button = serde_json::json!([{"type": "flex", "altText": "x", "contents": {
        "type": "bubble", "footer": {"type": "box", "layout": "vertical", "contents": [
            {"type": "button", "action": {"type": "uri", "label": "ติดตาม", "uri": "myshop://orders/1"}}]}}}]);
    let mut r = base();
    r.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        line_messages_json: deep_link_button.to_string(),
        ..Default::default()
    });
    cases.push((
        "an app deep link LINE cannot open in a URI action (the link policy allows myshop)",
        r,
        vec!["content.overrides.line_messages_json[0].contents.footer.contents[0].action.uri"],
    ));
    let mut r = base();
    r.content.as_mut().unwrap().title = String::new();
    r.content.as_mut().unwrap().overrides = Some(pb::ChannelOverrides {
        line_messages_json: "[".into(),
        ..Default::default()
    });
    cases.push((
        "every violation at once, conversion and rules",
        r,
        vec!["content.title", "content.overrides.line_messages_json"],
    ));

    for (name, req, want) in cases {
        let err = p.ingest().create_event(req).await.expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "{name}: {err:?}");
        assert_eq!(fields(&err), want, "{name}");
    }
    for table in ["notification_events", "notification_deliveries", "outbox"] {
        assert_eq!(p.count(table).await, 0, "{table} must stay empty");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rich_content_is_kept_as_sent_and_shown_by_get_event() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp"]).await;
    let mut r = p.rich_event("order:1001:paid", "order_paid", &["u1"]);
    let c = r.content.as_mut().unwrap();
    c.badge = pb::BadgePolicy::UnreadCount as i32;
    c.thread = "order:1001".into();
    c.actions[0].id = String::new();
    c.overrides = Some(pb::ChannelOverrides {
        fcm_data: [("order_id".to_string(), "1001".to_string())].into(),
        apns_category: "ORDER".into(),
        line_messages_json: r#"[{"type":"text","text":"ชำระเงินแล้ว"}]"#.into(),
        ..Default::default()
    });
    let created = p.create_event(r.clone()).await;
    let got = p.get_event(&created.event_id).await;
    let mut content = got.content.unwrap();
    let mut want = r.content.clone().unwrap();
    want.actions[0].id = "action1".into();
    let json = |c: &mut pb::Content| -> serde_json::Value {
        let o = c.overrides.as_mut().unwrap();
        serde_json::from_str(&std::mem::take(&mut o.line_messages_json)).unwrap()
    };
    assert_eq!(
        json(&mut content),
        json(&mut want),
        "the LINE messages as sent"
    );
    assert_eq!(content, want, "an action without an id gets its position");

    let again = p.create_event(r).await;
    assert!(again.duplicate, "the same rich request is an honest retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_click_counts_once_per_callback_and_explain_delivery_shows_it() {
    use notify_store::clicks::{ClickSource, NewClick, record_click};
    let p =
        Platform::start_with_type(&[notify_core::Channel::InApp], "order_paid", &["inapp"]).await;
    let ev = p
        .create_event(p.rich_event("order:1001:paid", "order_paid", &["u1"]))
        .await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let delivery: uuid::Uuid = done.deliveries[0].delivery_id.parse().unwrap();
    let click = |delivery_id, key| NewClick {
        delivery_id,
        user_id: "u1",
        action_id: "view",
        source: ClickSource::Line,
        dedup_key: key,
    };
    assert!(
        record_click(&p.pool, &click(delivery, Some("line:evt-1")))
            .await
            .unwrap()
    );
    assert!(
        !record_click(&p.pool, &click(delivery, Some("line:evt-1")))
            .await
            .unwrap(),
        "a redelivered callback changes nothing"
    );
    assert!(
        !record_click(&p.pool, &click(uuid::Uuid::now_v7(), None))
            .await
            .unwrap(),
        "a callback naming no delivery of ours is dropped"
    );
    let explained = p
        .ingest()
        .explain_delivery(pb::ExplainDeliveryRequest {
            event_id: ev.event_id.clone(),
            user_id: "u1".into(),
            channel: "inapp".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let clicks = &explained.deliveries[0].clicks;
    assert_eq!(clicks.len(), 1);
    assert_eq!(
        (clicks[0].action_id.as_str(), clicks[0].source.as_str()),
        ("view", "line")
    );
}
