//! Recovery of deliveries when a worker dies, freezes or is stopped mid-work.

mod support;

use notify_core::Channel;
use serde_json::json;
use std::time::Duration;
use support::{Options, Platform};

fn uniq(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

fn line_id() -> String {
    format!("U{}", uuid::Uuid::new_v4().simple())
}

async fn wait_outbox_empty(p: &Platform) {
    for _ in 0..200 {
        if p.count("outbox").await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("outbox not drained");
}

async fn status_of(p: &Platform, delivery_id: &str) -> (String, i32) {
    sqlx::query_as("SELECT status, attempts FROM notification_deliveries WHERE id = $1::uuid")
        .bind(delivery_id)
        .fetch_one(&p.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_died_after_claiming_is_recovered_by_the_sweeper_and_sent_once() {
    let mut p = Platform::start_with(Options {
        workers: vec![],
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["line"]).await;
    let u = uniq("u");
    p.add_recipient(&u, "", "", &line_id()).await;
    let ev = p
        .ingest()
        .create_event(p.event("died", "order_paid", &[&u]))
        .await
        .unwrap()
        .into_inner();
    let id = ev.deliveries[0].delivery_id.clone();
    wait_outbox_empty(&p).await;
    // A worker claims it with a 1 s lease and dies before calling LINE.
    let claimed = notify_store::deliveries::claim(
        &p.pool,
        id.parse().unwrap(),
        "line",
        Duration::from_secs(1),
    )
    .await
    .unwrap();
    assert!(matches!(
        claimed,
        notify_store::deliveries::ClaimOutcome::Claimed(_)
    ));
    // A live worker gets the original message while the lease holds: acked, not sent.
    p.start_worker(Channel::Line);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(
        (
            done.deliveries[0].status.as_str(),
            done.deliveries[0].attempts
        ),
        ("sent", 2)
    );
    assert_eq!(p.sim_requests("line").await.len(), 1, "sent exactly once");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_lease_was_taken_writes_nothing_and_the_retry_key_prevents_a_double_push() {
    let p = Platform::start_with(Options {
        workers: vec![Channel::Line],
        lease: Duration::from_secs(3),
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["line"]).await;
    let u = uniq("u");
    let lid = line_id();
    p.add_recipient(&u, "", "", &lid).await;
    // LINE answers after 2 s: the worker is "frozen" in the call meanwhile.
    p.sim_fault(json!({"provider": "line", "target_contains": lid, "status": 200, "body": {"sentMessages": [{"id": "1"}]}, "delay_ms": 2000, "times": 1})).await;
    let ev = p
        .ingest()
        .create_event(p.event("frozen", "order_paid", &[&u]))
        .await
        .unwrap()
        .into_inner();
    let id = ev.deliveries[0].delivery_id.clone();
    for _ in 0..100 {
        if !p.sim_requests("line").await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // While it is frozen, its lease is taken over (as after expiry by the sweeper and a
    // second worker's claim).
    let taken = sqlx::query(
        "UPDATE notification_deliveries SET lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 second'
         WHERE id = $1::uuid AND status = 'sending'",
    )
    .bind(&id)
    .execute(&p.pool)
    .await
    .unwrap();
    assert_eq!(taken.rows_affected(), 1);
    // The takeover "died" too: the sweeper recovers the delivery; the resend carries the
    // same retry key, LINE answers 409 and the delivery counts as sent.
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent");
    tokio::time::sleep(Duration::from_millis(2500)).await; // the frozen call has returned by now
    let recorded: Vec<i32> =
        sqlx::query_scalar("SELECT attempt FROM delivery_attempts WHERE delivery_id = $1::uuid")
            .bind(&id)
            .fetch_all(&p.pool)
            .await
            .unwrap();
    assert_eq!(
        recorded,
        [2],
        "the frozen worker (attempt 1) recorded nothing once its lease was gone"
    );
    assert_eq!(
        status_of(&p, &id).await,
        ("sent".to_string(), 2),
        "and did not overwrite the newer state"
    );
    let line = p.sim_requests("line").await;
    assert_eq!(line.len(), 2);
    assert_eq!(
        line[0]["headers"]["x-line-retry-key"],
        line[1]["headers"]["x-line-retry-key"]
    );
    assert_eq!(line[1]["status"], 409, "LINE itself dropped the duplicate");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_finishes_the_delivery_in_hand_and_leaves_the_rest_queued() {
    let mut p = Platform::start_with(Options {
        workers: vec![Channel::Line],
        concurrency: 1,
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["line"]).await;
    let users: Vec<String> = (0..3).map(|i| uniq(&format!("u{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "", "", &line_id()).await;
    }
    p.sim_fault(json!({"provider": "line", "status": 200, "body": {"sentMessages": [{"id": "1"}]}, "delay_ms": 1500})).await;
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let ev = p
        .ingest()
        .create_event(p.event("sigterm", "order_paid", &refs))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..100 {
        if !p.sim_requests("line").await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // SIGTERM equivalent while the first call is in flight.
    p.stop_workers().await;
    let mut statuses = Vec::new();
    for d in &ev.deliveries {
        statuses.push(status_of(&p, &d.delivery_id).await.0);
    }
    statuses.sort();
    assert_eq!(
        statuses,
        ["pending", "pending", "sent"],
        "the one in hand was finished and recorded"
    );
    assert_eq!(
        p.queue_depth(&p.topology.queue("line")).await,
        2,
        "the others are back in the queue"
    );
    assert_eq!(p.sim_requests("line").await.len(), 1);

    p.start_worker(Channel::Line);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert!(
        done.deliveries
            .iter()
            .all(|d| d.status == "sent" && d.attempts == 1)
    );
    assert_eq!(
        p.sim_requests("line").await.len(),
        3,
        "each sent exactly once"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_lost_after_the_confirm_is_republished_from_postgres() {
    let mut p = Platform::start_with(Options {
        workers: vec![],
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["line"]).await;
    let u = uniq("u");
    p.add_recipient(&u, "", "", &line_id()).await;
    let ev = p
        .ingest()
        .create_event(p.event("lost", "order_paid", &[&u]))
        .await
        .unwrap()
        .into_inner();
    wait_outbox_empty(&p).await;
    // The broker confirmed it; now the message is gone (queue purged).
    let (_conn, ch) = p.amqp().await;
    let purged = ch
        .queue_purge(p.topology.queue("line").into(), Default::default())
        .await
        .unwrap();
    assert_eq!(purged, 1);
    p.start_worker(Channel::Line);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(
        (
            done.deliveries[0].status.as_str(),
            done.deliveries[0].attempts
        ),
        ("sent", 1)
    );
    assert_eq!(p.sim_requests("line").await.len(), 1);
    p.stop().await;
}
