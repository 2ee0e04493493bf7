//! Topic broadcasts: the reply comes at once, the fan-out runs in checkpointed batches and
//! never duplicates, even when it runs again.

use crate::support;

use notify_proto::v1 as pb;
use std::time::{Duration, Instant};
use support::{Platform, eventually};
use tonic::Code;

async fn subscribe_many(p: &Platform, topic: &str, users: &[String]) {
    for chunk in users.chunks(1000) {
        p.topics()
            .subscribe(pb::SubscribeRequest {
                topic: topic.into(),
                user_ids: chunk.to_vec(),
            })
            .await
            .unwrap();
    }
}

async fn wait_fanout_done(p: &Platform, event_id: &str) -> pb::GetEventResponse {
    eventually("fan-out done", Duration::from_secs(60), async || {
        let ev = p
            .ingest()
            .get_event(pb::GetEventRequest {
                selector: Some(pb::get_event_request::Selector::EventId(event_id.into())),
                page_size: 10,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if ev.fanout_status == "done" {
            Ok(ev)
        } else {
            Err((ev.fanout_status, ev.fanout_recipients))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_event_reaches_every_subscriber_once_in_checkpointed_batches() {
    let p = Platform::start_with_type(&[notify_core::Channel::InApp], "promo", &["inapp", "line"])
        .await;
    assert!(
        p.topics()
            .create_topic(pb::CreateTopicRequest {
                key: "shop.promotions".into()
            })
            .await
            .unwrap()
            .into_inner()
            .created
    );
    let users: Vec<String> = (0..2_500).map(|i| format!("user-{i:06}")).collect();
    subscribe_many(&p, "shop.promotions", &users).await;
    // One subscriber has a LINE id; the rest are only reachable in-app.
    p.add_recipient(
        "user-000007",
        "",
        "",
        &format!("U{}", uuid::Uuid::new_v4().simple()),
    )
    .await;

    let req = p.topic_event("promo:2026-12", "promo", "shop.promotions");
    let started = Instant::now();
    let reply = p.create_event(req.clone()).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the reply does not wait for the fan-out"
    );
    assert!(reply.deliveries.is_empty());

    let ev = wait_fanout_done(&p, &reply.event_id).await;
    assert_eq!(ev.fanout_recipients, 2_500);
    assert_eq!(ev.topic, "shop.promotions");
    assert_eq!(ev.deliveries.len(), 10, "one page of the requested size");
    assert!(!ev.next_page_token.is_empty());
    let total: u32 = ev.counts.iter().map(|c| c.count).sum();
    assert_eq!(
        total, 2_501,
        "2,500 in-app deliveries and one LINE delivery"
    );
    assert_eq!(
        p.count("delivery_skips").await,
        2_499,
        "everyone else has no LINE id"
    );

    // A replay adds nothing.
    let again = p.create_event(req).await;
    assert!(again.duplicate);
    assert_eq!(again.event_id, reply.event_id);
    assert_eq!(p.count("notification_deliveries").await, 2_501);

    // A fan-out that runs again from any checkpoint (as after a crash) duplicates nothing.
    p.execute("UPDATE notification_events SET fanout_status = 'pending', fanout_cursor = 'user-000999', fanout_locked_until = NULL").await;
    wait_fanout_done(&p, &reply.event_id).await;
    assert_eq!(p.count("notification_deliveries").await, 2_501);

    // Every in-app notification is written exactly once.
    p.wait_count(
        "notifications",
        2_500,
        "2,500 in-app notifications written",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(p.count("notifications").await, 2_500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_calls_validate_their_input() {
    let p = Platform::start_with_type(&[], "promo", &["inapp"]).await;
    let err = p
        .topics()
        .create_topic(pb::CreateTopicRequest {
            key: "Bad Key".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = p.try_subscribe("nope", &["u1"]).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = p.try_subscribe("nope", &[]).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let req = p.topic_event("x", "promo", "nope");
    assert_eq!(
        p.ingest().create_event(req).await.unwrap_err().code(),
        Code::NotFound
    );
    let mut req = p.event("x", "promo", &["u1"]);
    req.topic = "nope".into();
    assert_eq!(
        p.ingest().create_event(req).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    assert_eq!(p.count("notification_events").await, 0);
}

/// A topic event with `line_multicast`: LINE goes out in multicast calls of at most 500
/// ids, one delivery and one retry key per call, every LINE-reachable subscriber in
/// exactly one accepted call; a 500 on a batch is retried with the same retry key; users
/// without a LINE id or who blocked the account are still skipped one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_multicast_sends_topic_broadcasts_in_batches_of_at_most_500() {
    let p = Platform::start_with_type(&[notify_core::Channel::Line], "promo", &["line"]).await;
    p.create_topic("shop.promotions").await;
    let users: Vec<String> = (0..1_200).map(|i| format!("user-{i:06}")).collect();
    subscribe_many(&p, "shop.promotions", &users).await;
    // Everyone but every 40th user has a LINE id; user-000001 blocked the account.
    let line_of = |i: usize| format!("U{:032x}", i + 1);
    let with_line: Vec<usize> = (0..1_200).filter(|i| i % 40 != 39).collect();
    sqlx::query(
        "INSERT INTO recipients (user_id, line_user_id)
         SELECT u, CASE WHEN l = '' THEN NULL ELSE l END FROM UNNEST($1::text[], $2::text[]) AS t(u, l)",
    )
    .bind(&users)
    .bind(
        (0..1_200)
            .map(|i| if i % 40 == 39 { String::new() } else { line_of(i) })
            .collect::<Vec<_>>(),
    )
    .execute(&p.pool)
    .await
    .unwrap();
    p.exec("INSERT INTO line_followers (line_user_id, following, changed_at) VALUES ($1, false, now())", line_of(1)).await;
    p.sim_fault(serde_json::json!({"provider": "line", "status": 500, "times": 1}))
        .await;

    let mut req = p.topic_event("promo:multicast", "promo", "shop.promotions");
    req.line_multicast = true;
    let reply = p.create_event(req).await;
    wait_fanout_done(&p, &reply.event_id).await;
    let done = p.wait_final(&reply.event_id, 60).await;
    // Page 1 (1,000 users): 974 reachable -> 500 + 474; page 2 (200): 195 -> 195.
    let sizes: Vec<(String, u32)> = done
        .deliveries
        .iter()
        .map(|d| (d.provider.clone(), d.attempts))
        .collect();
    assert_eq!(done.deliveries.len(), 3, "{sizes:?}");
    assert!(
        done.deliveries
            .iter()
            .all(|d| d.status == "sent" && d.provider == "line_multicast")
    );
    assert_eq!(
        done.deliveries.iter().map(|d| d.attempts).sum::<u32>(),
        4,
        "one batch retried once"
    );
    let reasons: Vec<&str> = done.skipped.iter().map(|s| s.reason.as_str()).collect();
    assert_eq!(
        reasons.iter().filter(|r| **r == "no_line_user_id").count(),
        30
    );
    assert_eq!(
        reasons.iter().filter(|r| **r == "line_unfollowed").count(),
        1
    );

    let calls = p.sim_requests("line").await;
    assert!(
        calls
            .iter()
            .all(|c| c["path"] == "/v2/bot/message/multicast")
    );
    assert_eq!(calls.len(), 4);
    let failed = calls.iter().find(|c| c["status"] == 500).unwrap();
    let retried: Vec<_> = calls
        .iter()
        .filter(|c| c["headers"]["x-line-retry-key"] == failed["headers"]["x-line-retry-key"])
        .collect();
    assert_eq!(retried.len(), 2, "the retry carries the batch's retry key");
    let mut reached: Vec<String> = Vec::new();
    for c in calls.iter().filter(|c| c["status"] == 200) {
        let to = c["body"]["to"].as_array().unwrap();
        assert!(to.len() <= 500);
        reached.extend(to.iter().map(|v| v.as_str().unwrap().to_string()));
    }
    reached.sort();
    let mut expected: Vec<String> = with_line
        .iter()
        .filter(|&&i| i != 1)
        .map(|&i| line_of(i))
        .collect();
    expected.sort();
    assert_eq!(
        reached, expected,
        "every reachable subscriber in exactly one accepted call"
    );
}
