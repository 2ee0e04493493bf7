//! Rich content in the inbox API: each item carries its image and actions, a click on an
//! action marks it read, answers the link to open and is recorded once against the
//! delivery; a digest row shows its latest content; a page carries the feed position that
//! a stream opened right after it resumes from, so nothing that arrives in between is
//! missed.

use crate::support;

use futures_util::StreamExt;
use notify_core::Channel;
use notify_proto::v1 as pb;
use notify_store::clicks::clicks_of;
use serde_json::Value;
use std::time::Duration;
use support::{InboxClient, Platform, click_triples, type_request};

/// Sends `req` and waits until its deliveries are final; returns the event.
async fn deliver(p: &Platform, req: pb::CreateEventRequest) -> pb::GetEventResponse {
    let ev = p.create_event(req).await;
    p.wait_final(&ev.event_id, 30).await
}

fn delivery_id(ev: &pb::GetEventResponse) -> uuid::Uuid {
    ev.deliveries[0].delivery_id.parse().unwrap()
}

const ACTIONS: &str = r#"[
    {"id": "view", "label": "ดูคำสั่งซื้อ", "url": "https://shop.example.test/orders/1001"},
    {"id": "track", "label": "ติดตามพัสดุ", "url": "myshop://orders/1001/track"}
]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_click_marks_the_item_read_answers_its_link_and_is_counted_once() {
    let p = Platform::start_with_type(&[Channel::InApp], "order_paid", &["inapp"]).await;
    let u = p.add_bare_recipient("u").await;
    let ev = deliver(&p, p.rich_event("order:1001:paid", "order_paid", &[&u])).await;
    assert_eq!(ev.deliveries[0].status, "sent");
    let c = InboxClient::of(&p, &u);

    let page = c.page().await;
    let item = &page["items"][0];
    assert_eq!(
        item["image_url"],
        "https://cdn.shop.example.test/orders/1001.png"
    );
    assert_eq!(
        item["actions"],
        serde_json::from_str::<Value>(ACTIONS).unwrap()
    );
    assert_eq!(item["clicked_action"], Value::Null);
    assert_eq!(item["status"], "unread");
    let id = item["id"].as_str().unwrap().to_string();

    let (status, r) = c.click(&id, "view").await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["url"], "https://shop.example.test/orders/1001");
    assert_eq!(r["counted"], true);
    assert_eq!(r["item"]["status"], "read");
    assert_eq!(r["item"]["clicked_action"], "view");
    assert!(r["item"]["clicked_at"].is_string());
    // A double click is counted once, and the item stays as it was.
    let (status, again) = c.click(&id, "view").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["counted"], false);
    assert_eq!(again["item"]["seq"], r["item"]["seq"], "nothing changed");
    // The deep link of the other action, then the notification itself.
    let (_, track) = c.click(&id, "track").await;
    assert_eq!(track["url"], "myshop://orders/1001/track");
    assert_eq!(track["item"]["clicked_action"], "track");
    let (_, itself) = c
        .post(&format!("/v1/inbox/notifications/{id}/click"), "")
        .await;
    assert_eq!(itself["url"], "https://shop.example.test/orders/1001");
    assert_eq!(itself["action_id"], "");

    let clicks = clicks_of(&p.pool, delivery_id(&ev)).await.unwrap();
    let seen = click_triples(&clicks);
    assert_eq!(
        seen,
        [
            (u.as_str(), "view", "inapp"),
            (u.as_str(), "track", "inapp"),
            (u.as_str(), "", "inapp")
        ]
    );
    let (_, count) = c.get("/v1/inbox/unread-count").await;
    assert_eq!(count["unread"], 0);
    let listed = c.page().await;
    assert_eq!(listed["items"][0]["clicked_action"], "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_click_names_the_field_and_changes_nothing() {
    let p = Platform::start_with_type(&[Channel::InApp], "order_paid", &["inapp"]).await;
    let (u, other) = (
        p.add_bare_recipient("u").await,
        p.add_bare_recipient("o").await,
    );
    let ev = deliver(&p, p.rich_event("order:1001:paid", "order_paid", &[&u])).await;
    let c = InboxClient::of(&p, &u);
    let id = c.page().await["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();

    let (status, r) = c.click(&id, "buy").await;
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["field"], "action_id");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(message.contains("view, track"), "{message}");
    let path = format!("/v1/inbox/notifications/{id}/click");
    for (body, field) in [
        (r#"{"action_id": 3}"#, "action_id"),
        (r#"{"action": "view"}"#, "action"),
        ("not json", "body"),
    ] {
        let (status, r) = c.post(&path, body).await;
        assert_eq!(status, 400, "{body}: {r}");
        assert_eq!(r["error"]["field"], field, "{body}: {r}");
    }
    let (status, r) = c.post("/v1/inbox/notifications/nope/click", "").await;
    assert_eq!((status, r["error"]["field"].as_str()), (400, Some("id")));
    // Another user's notification is not there for them.
    let (status, r) = InboxClient::of(&p, &other).click(&id, "view").await;
    assert_eq!((status, r["error"]["field"].as_str()), (404, Some("id")));

    let item = &c.page().await["items"][0];
    assert_eq!(item["status"], "unread");
    assert_eq!(item["clicked_action"], Value::Null);
    assert!(
        clicks_of(&p.pool, delivery_id(&ev))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_row_shows_its_latest_image_and_actions_and_forgets_the_old_click() {
    let p = Platform::start_with_workers(&[Channel::InApp]).await;
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        digest_window_seconds: 600,
        ..type_request("order_update", &["inapp"])
    })
    .await;
    let u = p.add_bare_recipient("u").await;
    let c = InboxClient::of(&p, &u);
    let mut first = p.rich_event("order:1001:packed", "order_update", &[&u]);
    first.aggregate_key = "order:1001".into();
    deliver(&p, first).await;
    let id = c.page().await["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(c.click(&id, "view").await.1["counted"], true);

    let mut second = p.rich_event("order:1001:shipped", "order_update", &[&u]);
    second.aggregate_key = "order:1001".into();
    let content = second.content.as_mut().unwrap();
    content.title = "จัดส่งแล้ว #1001".into();
    content.image_url = "https://cdn.shop.example.test/orders/1001-box.png".into();
    content.actions.remove(0);
    let ev = deliver(&p, second).await;

    let page = c.page().await;
    assert_eq!(
        page["items"].as_array().unwrap().len(),
        1,
        "one row per group"
    );
    let item = &page["items"][0];
    assert_eq!(item["id"], id.as_str());
    assert_eq!(item["item_count"], 2);
    assert_eq!(item["status"], "unread");
    assert_eq!(
        item["image_url"],
        "https://cdn.shop.example.test/orders/1001-box.png"
    );
    assert_eq!(item["actions"][0]["id"], "track");
    assert_eq!(item["actions"].as_array().unwrap().len(), 1);
    assert_eq!(
        item["clicked_action"],
        Value::Null,
        "the old click is forgotten"
    );
    // "view" is gone; the remaining action counts against the latest delivery.
    assert_eq!(c.click(&id, "view").await.0, 400);
    assert_eq!(c.click(&id, "track").await.1["counted"], true);
    let clicks = clicks_of(&p.pool, delivery_id(&ev)).await.unwrap();
    assert_eq!(clicks.len(), 1);
    assert_eq!(clicks[0].action_id, "track");
}

/// Opens the stream, resuming after `last` when given; returns the body.
async fn open_stream(
    p: &Platform,
    c: &InboxClient<'_>,
    last: Option<i64>,
) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin + use<> {
    let mut r = p
        .http
        .get(format!("{}/v1/inbox/stream", p.http_url))
        .bearer_auth(&c.token);
    if let Some(last) = last {
        r = r.header("last-event-id", last.to_string());
    }
    let r = r.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.bytes_stream()
}

/// The titles of the `notification` events until the first `unread_count` event after
/// them (the stream sends one after each batch of changes, and one on connecting).
async fn titles_until_count(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
) -> Vec<String> {
    let (mut buf, mut titles) = (String::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let event = frame.lines().find_map(|l| l.strip_prefix("event:"));
            let data = frame.lines().find_map(|l| l.strip_prefix("data:"));
            match (event.map(str::trim), data) {
                (Some("notification"), Some(d)) => {
                    let v: Value = serde_json::from_str(d.trim()).unwrap();
                    titles.push(v["title"].as_str().unwrap().to_string());
                }
                (Some("unread_count"), _) => return titles,
                _ => {}
            }
        }
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("an event within 10 s")
            .expect("stream open")
            .unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opened_from_the_pages_feed_seq_gets_what_arrived_after_the_page() {
    let p = Platform::start_with_type(&[Channel::InApp], "news", &["inapp"]).await;
    let u = p.add_bare_recipient("u").await;
    let c = InboxClient::of(&p, &u);
    let mut req = p.event("n1", "news", &[&u]);
    req.content.as_mut().unwrap().title = "ก่อนหน้า".into();
    deliver(&p, req).await;
    let page = c.page().await;
    assert_eq!(page["timezone"], "Asia/Bangkok");
    let feed_seq = page["feed_seq"].as_i64().unwrap();
    assert_eq!(feed_seq, page["items"][0]["seq"].as_i64().unwrap());

    // Arrives after the page was read, before the stream is opened.
    let mut req = p.event("n2", "news", &[&u]);
    req.content.as_mut().unwrap().title = "ระหว่างนั้น".into();
    deliver(&p, req).await;

    let mut resumed = open_stream(&p, &c, Some(feed_seq)).await;
    assert_eq!(titles_until_count(&mut resumed).await, ["ระหว่างนั้น"]);
    // A stream opened without it starts at the present: the race an old client lost.
    let mut fresh = open_stream(&p, &c, None).await;
    assert!(titles_until_count(&mut fresh).await.is_empty());
}
