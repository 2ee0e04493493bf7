//! The payload builders of the three providers on content without rich parts (nothing
//! rich is sent) and with overrides (which one wins).

use notify_core::content::{Action, Badge};
use notify_worker::testing::job;
use serde_json::json;

fn plain() -> notify_worker::Job {
    let mut j = job("push", "fcm");
    j.content.title = "ชำระเงินแล้ว".into();
    j.content.url = "https://shop.example.test/orders/1".into();
    j
}

#[test]
fn content_without_rich_parts_sends_no_rich_fields() {
    let j = plain();
    let m = crate::fcm::message(&j, "t", None)("body")["message"].clone();
    assert_eq!(
        m["notification"],
        json!({"title": "ชำระเงินแล้ว", "body": "body"})
    );
    assert_eq!(m["android"].get("notification"), None);
    assert_eq!(m["data"].get("actions"), None);
    assert_eq!(m["apns"]["payload"]["aps"], json!({"sound": "default"}));
    assert_eq!(m["apns"].get("fcm_options"), None);

    let a = crate::apns::payload(&j, None)("body");
    assert_eq!(
        a["aps"],
        json!({"alert": {"title": "ชำระเงินแล้ว", "body": "body"}, "sound": "default"})
    );
    assert_eq!((a.get("image_url"), a.get("actions")), (None, None));

    let w = crate::webpush::notification(&j)("body");
    for key in ["actions", "icon", "image", "tag", "badge"] {
        assert_eq!(w.get(key), None, "{key}");
    }
    assert_eq!(w["data"].get("actions"), None);
}

#[test]
fn overrides_win_over_the_common_fields_but_never_over_our_own_data_keys() {
    let mut j = plain();
    let c = &mut j.content;
    c.thread = "order-1".into();
    c.image_url = "https://cdn.example.test/common.png".into();
    c.actions = vec![Action {
        id: "view".into(),
        label: "ดู".into(),
        url: "https://shop.example.test/orders/1".into(),
    }];
    c.badge = Badge::Count(0);
    let o = &mut c.overrides;
    o.apns_thread_id = "apns-thread".into();
    o.webpush_image = "https://cdn.example.test/web.png".into();
    o.webpush_actions = vec![Action {
        id: "open".into(),
        label: "เปิด".into(),
        url: "https://shop.example.test/o".into(),
    }];
    o.fcm_data.insert("delivery_id".into(), "forged".into());
    o.fcm_data
        .insert("url".into(), "https://elsewhere.example.test".into());
    o.fcm_data.insert("campaign".into(), "dec".into());

    let m = crate::fcm::message(&j, "t", Some(0))("b")["message"].clone();
    assert_eq!(m["data"]["delivery_id"], j.id.to_string());
    assert_eq!(m["data"]["url"], "https://shop.example.test/orders/1");
    assert_eq!(m["data"]["campaign"], "dec");
    assert_eq!(m["android"]["notification"]["tag"], "order-1");
    assert_eq!(m["android"]["notification"]["notification_count"], 0);
    assert_eq!(m["apns"]["payload"]["aps"]["thread-id"], "apns-thread");

    let a = crate::apns::payload(&j, Some(0))("b");
    assert_eq!(a["aps"]["thread-id"], "apns-thread");
    assert_eq!(a["aps"]["badge"], 0, "a zero badge clears it");

    let w = crate::webpush::notification(&j)("b");
    assert_eq!(w["image"], "https://cdn.example.test/web.png");
    assert_eq!(w["actions"], json!([{"action": "open", "title": "เปิด"}]));
    assert_eq!(
        w["data"]["actions"],
        json!({"open": "https://shop.example.test/o"})
    );
    assert_eq!(w["tag"], "order-1");
}
