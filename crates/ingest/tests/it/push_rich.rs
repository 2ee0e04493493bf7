//! Rich content on push (issue 16): one event with an image, two actions, a thread, an
//! unread-count badge and push overrides reaches FCM, APNs and a Web Push service, and
//! each provider's received request carries exactly the fields of that content.

use crate::support::{self, Platform};
use notify_core::Channel;
use notify_proto::v1 as pb;
use serde_json::{Value, json};

/// The recorded request of `provider` (the only one it got).
async fn only_request(p: &Platform, provider: &str) -> Value {
    let mut seen = p.sim_requests(provider).await;
    assert_eq!(seen.len(), 1, "{provider}: {seen:?}");
    let r = seen.remove(0);
    assert!(
        matches!(r["status"].as_u64(), Some(200 | 201)),
        "{provider}: {r}"
    );
    r
}

async fn unread(p: &Platform, user: &str) -> i64 {
    p.scalar(
        "SELECT count(*) FROM notifications WHERE user_id = $1 AND status = 'unread'",
        user,
    )
    .await
}

/// The badge is the unread in-app count at send time, this event's own inbox row
/// included whether or not the in-app worker has written it yet (2 earlier unread rows +
/// this one = 3; a read row does not count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rich_event_reaches_fcm_apns_and_web_push_with_every_field() {
    let p =
        Platform::start_with_type(&[Channel::Push, Channel::InApp], "inbox_only", &["inapp"]).await;
    p.add_type("order_paid", &["push", "inapp"]).await;
    let u = p.add_bare_recipient("rich-push").await;
    for n in 1..=3 {
        let ev = p.send(&format!("seed:{n}"), "inbox_only", &[&u]).await;
        support::assert_all_sent(&p.wait_final(&ev.event_id, 30).await);
    }
    p.exec(
        "UPDATE notifications SET status = 'read', read_at = now()
          WHERE id = (SELECT id FROM notifications WHERE user_id = $1 ORDER BY created_at LIMIT 1)",
        &u,
    )
    .await;
    assert_eq!(unread(&p, &u).await, 2);

    let fcm_token = format!("fcm-rich-{u}");
    let fcm = p.add_device(&u, &fcm_token).await;
    let apns = p.add_endpoint(&u, "apns", &format!("apns-rich-{u}")).await;
    let web_url = format!("https://push.example.test/sub/rich-{u}");
    let web = p.add_webpush(&u, &web_url).await;

    let mut req = p.rich_event("push-rich:1", "order_paid", &[&u]);
    let c = req.content.as_mut().unwrap();
    c.badge = pb::BadgePolicy::UnreadCount as i32;
    c.thread = "order-1001".into();
    c.overrides = Some(pb::ChannelOverrides {
        fcm_data: [("order_id".to_string(), "1001".to_string())].into(),
        android_channel_id: "orders".into(),
        apns_category: "ORDER_UPDATE".into(),
        webpush_icon: "https://cdn.shop.example.test/icon-192.png".into(),
        ..Default::default()
    });
    let (ev, done) = p.deliver_all(req).await;
    assert_eq!(unread(&p, &u).await, 3, "the badge the devices got");
    let delivery = |endpoint: &str| {
        done.deliveries
            .iter()
            .find(|d| d.endpoint_id == endpoint)
            .unwrap_or_else(|| panic!("no delivery to {endpoint}"))
            .delivery_id
            .clone()
    };

    let title = "ชำระเงินแล้ว #1001";
    let body = "ขอบคุณที่ใช้บริการ";
    let image = "https://cdn.shop.example.test/orders/1001.png";
    let link = "https://shop.example.test/orders/1001";
    let actions = json!([
        {"id": "view", "label": "ดูคำสั่งซื้อ", "url": link},
        {"id": "track", "label": "ติดตามพัสดุ", "url": "myshop://orders/1001/track"},
    ]);

    let m = only_request(&p, "fcm").await["body"]["message"].clone();
    assert_eq!(m["token"], fcm_token.as_str());
    assert_eq!(
        m["notification"],
        json!({"title": title, "body": body, "image": image})
    );
    let mut data = m["data"].clone();
    let data_actions: Value =
        serde_json::from_str(data["actions"].as_str().expect("actions as text")).unwrap();
    assert_eq!(data_actions, actions);
    data.as_object_mut().unwrap().remove("actions");
    assert_eq!(
        data,
        json!({"delivery_id": delivery(&fcm), "event_id": ev.event_id, "type": "order_paid",
               "url": link, "order_id": "1001"})
    );
    assert_eq!(
        m["android"]["notification"],
        json!({"channel_id": "orders", "tag": "order-1001", "notification_count": 3})
    );
    assert_eq!(
        m["apns"]["payload"]["aps"],
        json!({"category": "ORDER_UPDATE", "thread-id": "order-1001", "sound": "default",
               "badge": 3, "mutable-content": 1})
    );
    assert_eq!(m["apns"]["fcm_options"]["image"], image);
    assert_eq!(
        m["webpush"]["fcm_options"]["link"], link,
        "the web click link"
    );

    let a = only_request(&p, "apns").await["body"].clone();
    assert_eq!(
        a,
        json!({
            "aps": {"alert": {"title": title, "body": body}, "sound": "default",
                    "category": "ORDER_UPDATE", "thread-id": "order-1001", "badge": 3,
                    "mutable-content": 1},
            "url": link, "delivery_id": delivery(&apns), "event_id": ev.event_id,
            "type": "order_paid", "image_url": image, "actions": actions,
        })
    );

    let w = only_request(&p, "webpush").await;
    assert_eq!(w["body"]["endpoint"], web_url.as_str());
    // Decrypted by the simulator with the subscription's keys (RFC 8291).
    assert_eq!(
        w["body"]["payload"],
        json!({
            "title": title, "body": body, "url": link, "tag": "order-1001",
            "icon": "https://cdn.shop.example.test/icon-192.png", "image": image,
            // The deep-link action is left out: a browser cannot open the app.
            "actions": [{"action": "view", "title": "ดูคำสั่งซื้อ"}],
            "data": {"delivery_id": delivery(&web), "event_id": ev.event_id,
                     "type": "order_paid", "url": link,
                     "actions": {"view": link}},
        })
    );
    let recorded: Value = p
        .scalar(
            "SELECT content_json FROM delivery_attempts WHERE delivery_id = $1::uuid",
            delivery(&web),
        )
        .await;
    assert_eq!(
        recorded["payload"], w["body"]["payload"],
        "decrypted = recorded"
    );
}

/// This event's in-app row counts in the badge before the in-app worker wrote it (here
/// no in-app worker runs at all, so its delivery stays pending): the badge is what the
/// inbox shows once the row is there, not what it showed a moment earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_badge_counts_this_events_inbox_row_before_it_is_written() {
    let p = Platform::start_with_type(&[Channel::Push], "order_paid", &["push", "inapp"]).await;
    let u = p.add_bare_recipient("badge-pending").await;
    p.add_endpoint(&u, "apns", &format!("apns-badge-{u}")).await;
    let mut req = p.rich_event("badge-pending:1", "order_paid", &[&u]);
    req.content.as_mut().unwrap().badge = pb::BadgePolicy::UnreadCount as i32;
    let ev = p.create_event(req).await;
    let sent = support::eventually(
        "the APNs send",
        std::time::Duration::from_secs(30),
        async || {
            let seen = p.sim_requests("apns").await;
            if seen.is_empty() { Err(seen) } else { Ok(seen) }
        },
    )
    .await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["body"]["aps"]["badge"], 1, "{}", sent[0]);
    assert_eq!(unread(&p, &u).await, 0, "no inbox row was written");
    let inapp: String = p.scalar("SELECT status FROM notification_deliveries WHERE event_id = $1::uuid AND channel = 'inapp'", &ev.event_id).await;
    assert_eq!(inapp, "pending");
}
