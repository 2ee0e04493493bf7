//! Recovery of deliveries when a worker dies, freezes or is stopped mid-work.

use crate::support;

use notify_core::Channel;
use serde_json::json;
use std::time::Duration;
use support::{Options, Platform, eventually, line_id, status_attempts, uniq};

/// Waits until the simulator has recorded at least `n` LINE calls (it records a call when
/// it arrives, before any delay of a fault) and returns them.
async fn wait_line_calls(p: &Platform, n: usize) -> Vec<serde_json::Value> {
    let what = format!("{n} LINE call(s) recorded");
    eventually(&what, Duration::from_secs(10), async || {
        let calls = p.sim_requests("line").await;
        if calls.len() >= n {
            Ok(calls)
        } else {
            Err(calls)
        }
    })
    .await
}

async fn status_of(p: &Platform, delivery_id: &str) -> (String, i32) {
    p.row(
        "SELECT status, attempts FROM notification_deliveries WHERE id = $1::uuid",
        delivery_id,
    )
    .await
}

/// The attempts of delivery `id` as (attempt, error code or outcome, worker id), in order.
async fn attempts_of(p: &Platform, id: &str) -> Vec<(i32, String, String)> {
    p.rows(
        "SELECT attempt, coalesce(error_code, outcome), worker_id FROM delivery_attempts
         WHERE delivery_id = $1::uuid ORDER BY attempt",
        id,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_died_after_claiming_is_recovered_by_the_sweeper_and_sent_once() {
    let mut p = Platform::start_with_type(&[], "order_paid", &["line"]).await;
    let u = uniq("u");
    p.add_recipient(&u, "", "", &line_id()).await;
    let ev = p.send("died", "order_paid", &[&u]).await;
    let id = ev.deliveries[0].delivery_id.clone();
    p.wait_outbox_empty("outbox drained", Duration::from_secs(20))
        .await;
    // A worker claims it with a 1 s lease and dies before calling LINE.
    let claimed = notify_store::deliveries::claim(
        &p.pool,
        id.parse().unwrap(),
        notify_core::Channel::Line,
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
    assert_eq!(status_attempts(&done.deliveries[0]), ("sent", 2));
    assert_eq!(p.sim_count("line").await, 1, "sent exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_lease_was_taken_writes_nothing_and_the_retry_key_prevents_a_double_push() {
    let mut p =
        Platform::start_with(Options::workers(&[Channel::Line]).lease(Duration::from_secs(3)))
            .await;
    p.add_type("order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    // LINE answers after 2 s: the worker is "frozen" in the call meanwhile.
    p.slow_line_once(&lid, "1", 2000).await;
    let ev = p.send("frozen", "order_paid", &[&u]).await;
    let id = ev.deliveries[0].delivery_id.clone();
    wait_line_calls(&p, 1).await;
    // While it is frozen, its lease is taken over (as after expiry by the sweeper and a
    // second worker's claim).
    let taken = p.exec("UPDATE notification_deliveries SET lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 second'
         WHERE id = $1::uuid AND status = 'sending'", &id).await;
    assert_eq!(taken, 1);
    // The takeover "died" too: the sweeper recovers the delivery; the resend carries the
    // same retry key, LINE answers 409 and the delivery counts as sent.
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent");
    // A graceful stop returns once every delivery in hand is finished: the frozen call has
    // returned and its worker has done all it will do.
    p.stop_workers().await;
    let recorded: Vec<(i32, String)> = p
        .rows(
            "SELECT attempt, coalesce(error_code, outcome) FROM delivery_attempts
         WHERE delivery_id = $1::uuid ORDER BY attempt",
            &id,
        )
        .await;
    assert_eq!(
        recorded,
        [(1, "worker_lost".to_string()), (2, "sent".to_string())],
        "the frozen worker (attempt 1) recorded nothing once its lease was gone; the sweeper \
         recorded that attempt as lost"
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_finishes_the_delivery_in_hand_and_leaves_the_rest_queued() {
    let mut p = Platform::start_with(Options::workers(&[Channel::Line]).concurrency(1)).await;
    p.add_type("order_paid", &["line"]).await;
    let users: Vec<String> = (0..3).map(|i| uniq(&format!("u{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "", "", &line_id()).await;
    }
    p.sim_fault(json!({"provider": "line", "status": 200, "body": {"sentMessages": [{"id": "1"}]}, "delay_ms": 1500})).await;
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let ev = p.send("sigterm", "order_paid", &refs).await;
    wait_line_calls(&p, 1).await;
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
    // The three went out in one (version-2) message; with one delivery at a time the
    // worker had started only the first, so the message goes back whole and unsettled.
    assert_eq!(
        p.queue_depth(&p.topology.queue("line")).await,
        1,
        "the message naming the other two is back in the queue"
    );
    assert_eq!(p.sim_count("line").await, 1);

    p.start_worker(Channel::Line);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert!(
        done.deliveries
            .iter()
            .all(|d| d.status == "sent" && d.attempts == 1)
    );
    assert_eq!(p.sim_count("line").await, 3, "each sent exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_lost_after_the_confirm_is_republished_from_postgres() {
    let mut p = Platform::start_with_type(&[], "order_paid", &["line"]).await;
    let u = uniq("u");
    p.add_recipient(&u, "", "", &line_id()).await;
    let ev = p.send("lost", "order_paid", &[&u]).await;
    p.wait_outbox_empty("outbox drained", Duration::from_secs(20))
        .await;
    // The broker confirmed it; now the message is gone (queue purged).
    let (_conn, ch) = p.amqp().await;
    let purged = ch
        .queue_purge(p.topology.queue("line").into(), Default::default())
        .await
        .unwrap();
    assert_eq!(purged, 1);
    p.start_worker(Channel::Line);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(status_attempts(&done.deliveries[0]), ("sent", 1));
    assert_eq!(p.sim_count("line").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_claimed_by_a_relay_that_died_before_the_confirm_are_published_again() {
    held_rows_are_published_again_after_the_hold(DiedHolding::Relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_held_by_a_writer_that_died_before_handing_them_over_are_published_after_the_hold() {
    held_rows_are_published_again_after_the_hold(DiedHolding::Writer).await;
}

/// Plans `n` in-app events of type `promo`, one recipient each, and writes their deliveries
/// held for an hour in one statement, as a group commit does: the deliveries with their
/// events, and the held outbox rows.
async fn write_group(
    p: &Platform,
    prefix: &str,
    n: usize,
) -> (
    Vec<(uuid::Uuid, notify_store::events::NewDelivery)>,
    Vec<notify_store::outbox::OutboxRow>,
) {
    let mut tx = p.pool.begin().await.unwrap();
    let mut planned = Vec::new();
    for i in 0..n {
        let user = format!("{}-{i:02}", uniq(prefix));
        let (event_id, deliveries) =
            plan_event(&mut tx, &uniq(prefix), "promo", &[user], Channel::InApp).await;
        planned.extend(deliveries.into_iter().map(|d| (event_id, d)));
    }
    let rows: Vec<_> = planned.iter().map(|(e, d)| (*e, d)).collect();
    let held =
        notify_store::events::insert_deliveries_held(&mut tx, &rows, Duration::from_secs(3600), 50)
            .await
            .unwrap();
    tx.commit().await.unwrap();
    (planned, held)
}

/// Waits until no delivery of `events` is pending or sending, then answers how many of
/// them ended in each status, by status name.
async fn final_statuses(p: &Platform, events: &[uuid::Uuid]) -> Vec<(String, i64)> {
    p.wait_scalar(
        "every delivery of the events final",
        Duration::from_secs(30),
        "SELECT count(*) FROM notification_deliveries
                 WHERE event_id = ANY($1) AND status IN ('pending', 'sending')",
        events,
        0,
    )
    .await;
    p.rows(
        "SELECT status, count(*) FROM notification_deliveries WHERE event_id = ANY($1)
         GROUP BY status ORDER BY status",
        events,
    )
    .await
}

/// Who held the outbox row and died before the broker's confirm.
enum DiedHolding {
    /// A relay that claimed it.
    Relay,
    /// An event writer that wrote it held for its own relay and died right after the
    /// commit, before handing it over.
    Writer,
}

/// Writes an event of `type_key` for `recipients` on `channel` in `tx` and plans its
/// deliveries the way ingest does (at the host's clock, 5 attempts), without writing
/// them: the caller writes them as the path under test does.
async fn plan_event(
    tx: &mut sqlx::PgConnection,
    event_key: &str,
    type_key: &str,
    recipients: &[String],
    channel: Channel,
) -> (uuid::Uuid, Vec<notify_store::events::NewDelivery>) {
    let event = notify_core::NewEvent::parse(notify_core::event::CreateEventInput {
        event_key: event_key.into(),
        type_key: type_key.into(),
        recipients: recipients.to_vec(),
        content: notify_core::Content {
            title: "t".into(),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let event_id = uuid::Uuid::new_v4();
    assert!(
        notify_store::events::insert_event_or_get_existing(&mut *tx, event_id, &event, &[channel])
            .await
            .unwrap()
            .is_none()
    );
    let facts = notify_store::catalog::load_recipient_facts(&mut *tx, type_key, &event.recipients)
        .await
        .unwrap();
    let (planned, _) = notify_core::plan::plan(
        event_id,
        false,
        &[channel],
        &facts,
        chrono::Utc::now(),
        false,
    );
    (event_id, ingest::planning::new_deliveries(planned, 5))
}

/// A row hidden for a 2 s hold by a process that died is published once, after the hold.
async fn held_rows_are_published_again_after_the_hold(died: DiedHolding) {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
    let (u, _) = p.add_line_recipient("u").await;
    // Write an event the way ingest does, but leave its outbox row as a relay leaves it
    // when it claimed the row and died before the confirm: hidden for the 2 s hold.
    let mut tx = p.pool.begin().await.unwrap();
    let (event_id, planned) = plan_event(
        &mut tx,
        "relay-died",
        "order_paid",
        std::slice::from_ref(&u),
        Channel::Line,
    )
    .await;
    match died {
        DiedHolding::Relay => {
            notify_store::events::insert_deliveries(&mut tx, event_id, &planned)
                .await
                .unwrap();
            sqlx::query("UPDATE outbox SET available_at = now() + interval '2 seconds'")
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        DiedHolding::Writer => {
            let rows: Vec<_> = planned.iter().map(|d| (event_id, d)).collect();
            let held = notify_store::events::insert_deliveries_held(
                &mut tx,
                &rows,
                Duration::from_secs(2),
                50,
            )
            .await
            .unwrap();
            assert_eq!(held.len(), 1, "the delivery due now is held: {held:?}");
        }
    }
    tx.commit().await.unwrap();

    // For the whole hold (until the row is due again in the database's time), LINE sees
    // nothing. Calls are read before the hold, so a call seen was made while it lasted.
    eventually(
        "the dead relay's hold over",
        Duration::from_secs(10),
        async || {
            let calls = p.sim_requests("line").await;
            let held: bool = p
                .query_scalar("SELECT count(*) > 0 FROM outbox WHERE available_at > now()")
                .await;
            assert!(
                !held || calls.is_empty(),
                "nothing is published while the dead relay's hold lasts: {calls:?}"
            );
            if held { Err("held") } else { Ok(()) }
        },
    )
    .await;
    let done = p.wait_final(&event_id.to_string(), 30).await;
    assert_eq!(done.deliveries[0].status, "sent");
    assert_eq!(
        p.sim_count("line").await,
        1,
        "published again after the hold and sent once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_to_a_missing_exchange_fails_fast_and_the_next_channel_works() {
    let stack = support::Stack::get();
    let conn = notify_broker::connect(&stack.amqp_url, "tests-missing-exchange")
        .await
        .unwrap();
    let prefix = format!("t{}.", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let missing = notify_broker::Topology::new(format!("{prefix}missing."));
    let publisher = notify_broker::Publisher::new(&conn, &missing, Duration::from_secs(5))
        .await
        .unwrap();
    let msg = notify_broker::DeliveryMessage {
        v: 1,
        delivery_id: uuid::Uuid::new_v4(),
        channel: "line".into(),
    };
    let started = std::time::Instant::now();
    let out = publisher.publish_batch(std::slice::from_ref(&msg)).await;
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "no hang on the confirm"
    );
    assert!(
        matches!(out[0], notify_broker::PublishOutcome::Unknown(_)),
        "{out:?}"
    );
    assert!(!publisher.is_healthy(), "the broker closed that channel");

    // A new channel to an existing exchange publishes fine.
    let good = notify_broker::Topology::new(prefix);
    let ch = conn.create_channel().await.unwrap();
    good.declare(&ch, &["line"]).await.unwrap();
    let publisher = notify_broker::Publisher::new(&conn, &good, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        publisher.publish_batch(&[msg]).await,
        [notify_broker::PublishOutcome::Confirmed]
    );
    good.delete(&ch, &["line"]).await.unwrap();
}

/// F06: a burst of slow provider calls must not hold database connections: a small worker
/// pool serves 30 concurrent sends, ingest stays fast, and no session sits idle in a
/// transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_provider_calls_hold_no_database_connection() {
    let p = Platform::start_with(
        Options::workers(&[Channel::Line])
            .concurrency(30)
            .worker_pool_size(Some(5)),
    )
    .await;
    p.add_type("order_paid", &["line"]).await;
    p.add_type("comment_reply", &["inapp"]).await;
    let users: Vec<String> = (0..60).map(|i| uniq(&format!("u{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "", "", &line_id()).await;
    }
    p.sim_fault(json!({"provider": "line", "status": 200, "body": {"sentMessages": [{"id": "1"}]}, "delay_ms": 1500})).await;
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let ev = p.send("burst", "order_paid", &refs).await;

    let sampler = {
        let pool = p.pool.clone();
        tokio::spawn(async move {
            let mut worst = 0i64;
            for _ in 0..25 {
                let stuck: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                       AND state = 'idle in transaction' AND now() - state_change > interval '1 second'",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                worst = worst.max(stuck);
                // A sampler: one look every 200 ms while the outage lasts.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            worst
        })
    };
    let mut latencies = Vec::new();
    for i in 0..30 {
        let started = std::time::Instant::now();
        p.ingest()
            .create_event(p.event(&format!("side-{i}"), "comment_reply", &["x"]))
            .await
            .expect("CreateEvent succeeds");
        latencies.push(started.elapsed());
        // Pacing: a caller sending every 100 ms through the outage.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    latencies.sort();
    assert!(
        latencies[latencies.len() - 1] < Duration::from_secs(2),
        "ingest p100 {:?}",
        latencies.last()
    );
    assert_eq!(
        sampler.await.unwrap(),
        0,
        "no session idle in a transaction for more than 1 s"
    );
    let done = p.wait_final(&ev.event_id, 60).await;
    assert!(
        done.deliveries
            .iter()
            .all(|d| d.status == "sent" && d.attempts == 1)
    );
    assert_eq!(p.sim_count("line").await, 60);
}

/// F01: prefetch is bounded by concurrency, so a worker that starts later still gets its
/// share instead of waiting while the first one hoards the queue; nothing is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_worker_shares_a_slow_queue_and_nothing_is_sent_twice() {
    let mut p = Platform::start_with(Options::workers(&[]).concurrency(2)).await;
    p.add_type("order_paid", &["line"]).await;
    let users: Vec<String> = (1..=20).map(|i| uniq(&format!("u10{i:02}"))).collect();
    for u in &users {
        p.add_recipient(u, "", "", &line_id()).await;
    }
    p.sim_fault(json!({"provider": "line", "status": 200, "body": {"sentMessages": [{"id": "1"}]}, "delay_ms": 3000})).await;
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let ev = p.send("b01", "order_paid", &refs).await;
    p.wait_outbox_empty("outbox drained", Duration::from_secs(20))
        .await;
    p.start_worker_named(Channel::Line, "w1");
    // w2 starts once w1 is busy with as many slow calls as its concurrency allows.
    wait_line_calls(&p, 2).await;
    p.start_worker_named(Channel::Line, "w2");
    let done = p.wait_final(&ev.event_id, 60).await;
    assert!(
        done.deliveries
            .iter()
            .all(|d| d.status == "sent" && d.attempts == 1)
    );
    assert_eq!(
        p.sim_count("line").await,
        20,
        "exactly one push per recipient"
    );
    let by_w2: i64 = p
        .query_scalar("SELECT count(*) FROM delivery_attempts WHERE worker_id = 'w2'")
        .await;
    assert!(by_w2 >= 8, "the later worker sent {by_w2} of 20");
}

/// F01, forced-timeout case: the broker gives a message to a second worker while the first
/// is still in a provider call longer than the lease (as after a consumer-timeout channel
/// closure). The heartbeat keeps the lease alive, so the second worker finds the delivery
/// `sending` under a live lease and acks the message without calling LINE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_redelivered_during_a_slow_call_is_not_sent_again() {
    let mut p = Platform::start_with(Options::workers(&[]).lease(Duration::from_secs(3))).await;
    p.start_worker_named(Channel::Line, "w1");
    p.start_worker_named(Channel::Line, "w2");
    p.add_type("order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    // LINE takes 4.5 s for this user: longer than the 3 s lease, shorter than the
    // LINE worker's 5 s provider timeout in these tests.
    p.slow_line_once(&lid, "slow-1", 4500).await;
    let ev = p.send("slow-redelivered", "order_paid", &[&u]).await;
    let id = ev.deliveries[0].delivery_id.clone();
    wait_line_calls(&p, 1).await;
    // Past the first lease's end (3 s after the claim), the broker hands the same message
    // out again; meanwhile the heartbeat has kept the lease alive.
    let first_lease_end: chrono::DateTime<chrono::Utc> = p
        .scalar(
            "SELECT lease_expires_at FROM notification_deliveries WHERE id = $1::uuid",
            &id,
        )
        .await;
    eventually(
        "the first lease's end passed, the delivery still sending under a live lease",
        Duration::from_secs(10),
        async || {
            let r: (String, bool, bool) = sqlx::query_as(
                "SELECT status, now() > $2, lease_expires_at > now()
                 FROM notification_deliveries WHERE id = $1::uuid",
            )
            .bind(&id)
            .bind(first_lease_end)
            .fetch_one(&p.pool)
            .await
            .unwrap();
            if r.1 { Ok(r) } else { Err(r) }
        },
    )
    .await;
    let (_conn, ch) = p.amqp().await;
    ch.basic_publish(
        "".into(),
        p.topology.queue("line").into(),
        Default::default(),
        &serde_json::to_vec(&json!({"v": 1, "delivery_id": id, "channel": "line"})).unwrap(),
        Default::default(),
    )
    .await
    .unwrap();
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(
        status_attempts(&done.deliveries[0]),
        ("sent", 1),
        "one attempt, recorded by the worker that made the slow call"
    );
    assert_eq!(
        p.sim_count("line").await,
        1,
        "the redelivered message did not cause a second push"
    );
    let last_error: Option<String> = p
        .scalar(
            "SELECT last_error FROM notification_deliveries WHERE id = $1::uuid",
            &id,
        )
        .await;
    assert_eq!(last_error, None, "the sweeper never took the live lease");
    assert_eq!(p.queue_depth(&p.topology.queue("line")).await, 0);
}

/// F06, sub-case: an unrelated `REPEATABLE READ` transaction (a backup, a long report)
/// holds its snapshot for the whole run. Claims and records find rows by primary key and
/// hold no transaction across a call, so throughput stays near the baseline, nothing
/// waits on a lock and every delivery is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_snapshot_held_open_does_not_stall_delivery() {
    let p = Platform::start_with(
        Options::workers(&[Channel::Line])
            .concurrency(50)
            .worker_pool_size(Some(10)),
    )
    .await;
    p.add_type("order_paid", &["line"]).await;
    let users: Vec<String> = (0..200).map(|i| uniq(&format!("u{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "", "", &line_id()).await;
    }
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    // LINE takes 400 ms per call: the run is bound by the provider, as in production.
    p.sim_fault(json!({"provider": "line", "status": 200,
        "body": {"sentMessages": [{"id": "1"}]}, "delay_ms": 400}))
        .await;
    let run = |key: &'static str| {
        let p = &p;
        let refs = refs.clone();
        async move {
            let started = std::time::Instant::now();
            let ev = p.send(key, "order_paid", &refs).await;
            let done = p.wait_final(&ev.event_id, 60).await;
            let elapsed = started.elapsed();
            assert!(
                done.deliveries
                    .iter()
                    .all(|d| d.status == "sent" && d.attempts == 1),
                "{key}: every delivery sent with one attempt"
            );
            200.0 / elapsed.as_secs_f64()
        }
    };
    let baseline = run("baseline").await;

    let mut backup = p.pool.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *backup)
        .await
        .unwrap();
    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM notification_deliveries")
        .fetch_one(&mut *backup)
        .await
        .unwrap();
    let waits = {
        let pool = p.pool.clone();
        tokio::spawn(async move {
            let mut worst = 0i64;
            for _ in 0..20 {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                     WHERE NOT l.granted AND c.relname IN ('notification_deliveries', 'outbox')",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                worst = worst.max(n);
                // A sampler: one look every 100 ms while the writers run.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            worst
        })
    };
    let with_snapshot = run("with-snapshot").await;
    backup.rollback().await.unwrap();
    assert_eq!(
        waits.await.unwrap(),
        0,
        "no ungranted lock on the queue tables"
    );
    assert!(
        with_snapshot >= 0.5 * baseline,
        "throughput with an old snapshot open {with_snapshot:.0}/s, baseline {baseline:.0}/s"
    );
    assert_eq!(
        p.sim_count("line").await,
        400,
        "each delivery reached LINE once"
    );
}

async fn wait_status(p: &Platform, delivery_id: &str, want: &str, secs: u64) {
    let what = format!("delivery {want}");
    eventually(&what, Duration::from_secs(secs), async || {
        let (status, attempts) = status_of(p, delivery_id).await;
        if status == want {
            Ok(())
        } else {
            Err((status, attempts))
        }
    })
    .await;
}

/// Whether process `pid` holds an established TCP connection to `port` (Linux: its socket
/// inodes under `/proc/<pid>/fd` matched against `/proc/net/tcp`, whose columns are slot,
/// local address, remote address, state (`01` established), queues, timers, retransmits,
/// uid, timeout, inode).
fn connected_to(pid: u32, port: u16) -> bool {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_str()?;
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let remote = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() > 9 && f[3] == "01" && f[2].ends_with(&remote) && inodes.contains(f[9])
        })
}

/// Sends SIGCONT to a stopped worker and waits (at most `within`) until it is done with
/// its message, which it logs as having written nothing (its lease was taken).
async fn resume_until_idle(frozen: &support::Proc, within: Duration) {
    signal(frozen.pid(), "-CONT");
    eventually(
        "the resumed worker finished its message",
        within,
        async || {
            let log = frozen.log();
            if log.contains("nothing written") {
                Ok(())
            } else {
                Err(log)
            }
        },
    )
    .await;
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill {sig} failed");
}

/// Issue 14, item 10: fencing guards the record, and the lease check at the call's point
/// of no return guards the call. A worker process stopped (SIGSTOP) right after its claim,
/// while the SMTP server is still answering `RCPT TO`, is resumed after the sweeper and a
/// second worker took the delivery over: it never sends `DATA`, and the message goes out
/// once, from the second worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_after_its_claim_and_resumed_after_its_lease_was_taken_makes_no_provider_call()
 {
    let mut p = Platform::start_with(
        Options::workers(&[])
            .smtp_sim(true)
            .lease(Duration::from_secs(3)),
    )
    .await;
    p.add_type("order_paid", &["email"]).await;
    let u = uniq("u");
    // `slow…`: the simulator answers RCPT TO after 3 s, so the claim is well ahead of DATA.
    p.add_recipient(&u, "", &format!("slow-{u}@example.test"), "")
        .await;
    let frozen = p.spawn(
        "worker-email",
        &[],
        &[
            ("NOTIFY_SMTP_URL", p.smtp_sim_url.clone()),
            ("NOTIFY_EMAIL_FROM", "noreply@example.test".into()),
            (
                "NOTIFY_UNSUBSCRIBE_URL",
                format!("{}/unsubscribe", p.http_url),
            ),
            (
                "NOTIFY_UNSUBSCRIBE_SECRET",
                support::UNSUBSCRIBE_SECRET.into(),
            ),
            ("NOTIFY_LEASE", "3s".into()),
            ("NOTIFY_WORKER_CONCURRENCY", "1".into()),
            ("NOTIFY_WORKER_ID", "frozen".into()),
            // Longer than the freeze: the lease check, not the deadline, must stop it.
            ("NOTIFY_SMTP_TIMEOUT", "60s".into()),
        ],
    );
    let ev = p.send("frozen-email", "order_paid", &[&u]).await;
    let id = ev.deliveries[0].delivery_id.clone();
    wait_status(&p, &id, "sending", 30).await;
    // Frozen inside the SMTP exchange (its slow RCPT TO), not in the database reads between
    // the claim and the call, whose pool timeouts would fire first on resume.
    let smtp_port: u16 = p.smtp_sim_url.rsplit(':').next().unwrap().parse().unwrap();
    eventually(
        "the frozen worker connected to the SMTP server",
        Duration::from_secs(10),
        async || {
            if connected_to(frozen.pid(), smtp_port) {
                Ok(())
            } else {
                Err(frozen.log())
            }
        },
    )
    .await;
    signal(frozen.pid(), "-STOP");

    // The lease runs out, the sweeper puts the delivery back, another worker sends it.
    p.start_worker_named(Channel::Email, "second");
    let done = p.wait_final(&ev.event_id, 60).await;
    assert_eq!(done.deliveries[0].status, "sent");
    assert_eq!(
        p.smtp_sim.data_started(),
        1,
        "only the second worker sent DATA"
    );

    resume_until_idle(&frozen, Duration::from_secs(20)).await;
    assert_eq!(
        p.smtp_sim.data_started(),
        1,
        "the resumed worker made no provider call"
    );
    assert!(
        frozen.log().contains("call abandoned"),
        "it abandoned the call at the lease check:\n{}",
        frozen.log()
    );
    assert_eq!(p.smtp_sim.messages().len(), 1, "one message accepted");
    let attempts = attempts_of(&p, &id).await;
    // Attempt 1 is the frozen worker's lost lease, recorded by the sweeper as a call
    // without an answer; it never reached DATA.
    assert_eq!(
        attempts,
        [
            (1, "worker_lost".to_string(), String::new()),
            (2, "sent".to_string(), "second".to_string())
        ]
    );
    assert_eq!(status_of(&p, &id).await, ("sent".to_string(), 2));
    frozen.terminate();
}

/// Issue 14, item 11: a call that the provider accepted after the worker's lease was taken
/// (its heartbeats stopped, the sweeper put the delivery back) is recorded as sent when
/// nobody claimed the delivery again, instead of being sent a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_on_an_unclaimed_delivery_is_recorded_and_not_sent_again() {
    let mut p = Platform::start_with(
        Options::workers(&[Channel::Line])
            .concurrency(1)
            .lease(Duration::from_secs(3)),
    )
    .await;
    p.add_type("order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    // LINE accepts, but answers only after 3 s.
    p.slow_line_once(&lid, "late-1", 3000).await;
    let ev = p.send("late", "order_paid", &[&u]).await;
    let id = ev.deliveries[0].delivery_id.clone();
    wait_line_calls(&p, 1).await;
    // Meanwhile the sweeper recovers it as if its heartbeats had stopped: pending, no
    // lease, a new outbox row (published, but the only worker is busy with the call).
    let swept = p
        .exec(
            "WITH d AS (
             UPDATE notification_deliveries SET status = 'pending', lease_token = NULL,
                 lease_expires_at = NULL, next_attempt_at = now(), last_error = 'lease_expired'
             WHERE id = $1::uuid AND status = 'sending' RETURNING id, channel)
         INSERT INTO outbox (delivery_id, channel) SELECT id, channel FROM d",
            &id,
        )
        .await;
    assert_eq!(swept, 1);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(
        status_attempts(&done.deliveries[0]),
        ("sent", 1),
        "the late success was recorded"
    );
    p.wait_outbox_empty("outbox drained", Duration::from_secs(20))
        .await;
    let queue = p.topology.queue("line");
    p.wait_queue_depth(
        &queue,
        0,
        "the recovered message taken",
        Duration::from_secs(5),
    )
    .await;
    // A graceful stop returns once the worker finished the message in hand; a message it
    // had not acked would be back in the queue.
    p.stop_workers().await;
    assert_eq!(
        p.sim_count("line").await,
        1,
        "the recovered message was acked without a second push"
    );
    assert_eq!(p.queue_depth(&queue).await, 0, "and acked");
    let recorded: Vec<(i32, String)> = p
        .rows(
            "SELECT attempt, outcome FROM delivery_attempts WHERE delivery_id = $1::uuid",
            &id,
        )
        .await;
    assert_eq!(recorded, [(1, "sent".to_string())]);
}

/// Issue 14, item 11, the fence: a late success never overrides a newer claim, whether that
/// claim is still sending or has already scheduled its own retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_loses_to_a_newer_claim() {
    use notify_store::deliveries::{self, AttemptRecord, ClaimOutcome, NextState};
    let p = Platform::start_with_type(&[], "order_paid", &["line"]).await;
    let u = uniq("u");
    p.add_recipient(&u, "", "", &line_id()).await;
    let ev = p.send("late-fence", "order_paid", &[&u]).await;
    let id: uuid::Uuid = ev.deliveries[0].delivery_id.parse().unwrap();
    p.wait_outbox_empty("outbox drained", Duration::from_secs(20))
        .await;
    let claim = || async {
        match deliveries::claim(
            &p.pool,
            id,
            notify_core::Channel::Line,
            Duration::from_secs(60),
        )
        .await
        .unwrap()
        {
            ClaimOutcome::Claimed(job) => job,
            other => panic!("{other:?}"),
        }
    };
    let sent = NextState::Sent {
        provider_message_id: Some("late".into()),
    };
    let record = AttemptRecord {
        outcome: notify_core::AttemptLabel::Sent,
        provider_status: Some(200),
        error_code: None,
        provider_response: None,
        content: json!({}),
        deactivate_endpoint: None,
        address_undeliverable: None,
        endpoint_invalid_since: None,
        worker_id: "late".into(),
        call_took: Duration::ZERO,
    };
    let first = claim().await;
    // The first lease runs out: set by the test rather than waited for (the leases are
    // long), and requeued at once, so the platform's own sweeper (every 1 s) does not take
    // the row first.
    p.exec(
        "UPDATE notification_deliveries SET lease_expires_at = now() - interval '1 millisecond'
         WHERE id = $1 AND status = 'sending'",
        id,
    )
    .await;
    assert_eq!(
        deliveries::requeue_expired_leases(&p.pool, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let second = claim().await;
    assert!(
        deliveries::record_late_success(&p.pool, &first, &sent, &record)
            .await
            .unwrap()
            .is_none(),
        "the newer claim is sending"
    );
    let retry = NextState::Retry {
        after: Duration::from_secs(60),
        error: "line_500".into(),
    };
    let failed_attempt = AttemptRecord {
        outcome: notify_core::AttemptLabel::Retry,
        ..record.clone()
    };
    assert_eq!(
        deliveries::record_attempts(&p.pool, &[(&second, &retry, &failed_attempt)])
            .await
            .unwrap(),
        [true]
    );
    assert!(
        deliveries::record_late_success(&p.pool, &first, &sent, &record)
            .await
            .unwrap()
            .is_none(),
        "the newer claim already recorded its attempt"
    );
    assert_eq!(
        status_of(&p, &id.to_string()).await,
        ("pending".to_string(), 2)
    );
}

/// Issue 14, item 12: every provider call has a total deadline, not only its connect. An
/// SMTP server that takes DATA and never answers ends each attempt at the deadline as an
/// ambiguous `smtp_timeout`, retried per policy until the budget is spent; nothing stays
/// `sending`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_smtp_server_that_never_answers_after_data_ends_each_attempt_at_the_deadline() {
    let p = Platform::start_with(Options::workers(&[]).smtp_sim(true)).await;
    let sender = std::sync::Arc::new(
        worker_email::EmailSender::new(worker_email::EmailConfig {
            breaker: Default::default(),
            ses_credentials: None,
            smtp_url: p.smtp_sim_url.clone(),
            from: "noreply@example.test".parse().unwrap(),
            message_id_domain: "example.test".into(),
            timeout: Duration::from_secs(1),
            unsubscribe_url: format!("{}/unsubscribe", p.http_url),
            unsubscribe_secret: support::UNSUBSCRIBE_SECRET.into(),
            layout: Default::default(),
        })
        .unwrap(),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = {
        let (cfg, pool, stop) = (p.worker_config(), p.pool.clone(), stop.clone());
        tokio::spawn(async move {
            notify_worker::run(cfg, pool, sender, Default::default(), stop)
                .await
                .unwrap()
        })
    };
    p.add_type("order_paid", &["email"]).await;
    let u = uniq("u");
    p.add_recipient(&u, "", &format!("stall-{u}@example.test"), "")
        .await;
    let started = std::time::Instant::now();
    let ev = p.send("stalled-smtp", "order_paid", &[&u]).await;
    let done = p.wait_final(&ev.event_id, 60).await;
    let took = started.elapsed();
    let d = &done.deliveries[0];
    assert_eq!((d.status.as_str(), d.attempts), ("failed", 5), "{d:?}");
    let codes: Vec<Option<String>> = p.scalars("SELECT error_code FROM delivery_attempts WHERE delivery_id = $1::uuid ORDER BY attempt", &d.delivery_id).await;
    assert_eq!(codes, vec![Some("smtp_timeout".to_string()); 5]);
    assert_eq!(
        p.smtp_sim.data_started(),
        5,
        "each attempt got as far as DATA"
    );
    assert!(
        took < Duration::from_secs(20),
        "five 1 s deadlines and short retries took {took:?}"
    );
    stop.cancel();
    worker.await.unwrap();
}

/// Held rows a writer cannot hand over (its relay stopped, or too far behind) are released
/// at once: due now, so a relay publishes them well before their 30 s hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_rows_the_relay_cannot_take_are_released_and_published_before_their_hold_ends() {
    let p = Platform::start_with_workers(&[]).await;
    let ids: Vec<i64> = p
        .query_scalars(
            "INSERT INTO outbox (delivery_id, channel, available_at)
         SELECT gen_random_uuid(), 'inapp', now() + interval '30 seconds'
         FROM generate_series(1, 3)
         RETURNING id",
        )
        .await;
    let rows: Vec<notify_store::outbox::OutboxRow> = ids
        .iter()
        .map(|&id| notify_store::outbox::OutboxRow {
            id,
            delivery_id: uuid::Uuid::new_v4(),
            more_delivery_ids: Vec::new(),
            queue: notify_store::outbox::OutboxQueue::Deliveries(Channel::InApp),
            origins: Vec::new(),
        })
        .collect();
    // A door whose relay end is gone: the writer's relay stopped.
    let (direct, relay_end) = ingest::relay::Direct::new(p.pool.clone(), 50);
    drop(relay_end);
    let asked = std::time::Instant::now();
    direct.publish(rows);
    p.wait_scalar(
        "the released rows published by the running relay",
        Duration::from_secs(10),
        "SELECT count(*) FROM outbox WHERE id = ANY($1)",
        &ids,
        0,
    )
    .await;
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "not after the hold"
    );
}

/// Held deliveries of one event and channel share outbox rows (at most 50 deliveries
/// each, so that a row fits in one broker message). Such a row outlives a cancel of one of its recipients
/// (the worker's claim skips that one) and goes with a cancel of all of them, keeps its deliveries from the lost-message sweep
/// while it waits (a row deleted unpublished gives them back to the sweep), and once its
/// writer's hold has passed (the writer died before handing it over) a relay publishes
/// it: every pending delivery it names is sent once, the canceled one never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_deliveries_share_rows_one_per_message_through_a_cancel_the_sweep_and_the_hold() {
    use notify_store::cancel::{CancelSelector, cancel};
    use notify_store::deliveries::republish_stale;
    let p = Platform::start_with_type(&[Channel::InApp], "promo", &["inapp"]).await;
    let users: Vec<String> = (0..120).map(|i| format!("{}-{i:03}", uniq("u"))).collect();
    let hold = Duration::from_secs(4);
    let mut tx = p.pool.begin().await.unwrap();
    let (event_id, planned) =
        plan_event(&mut tx, &uniq("several"), "promo", &users, Channel::InApp).await;
    let rows: Vec<_> = planned.iter().map(|d| (event_id, d)).collect();
    let held = notify_store::events::insert_deliveries_held(&mut tx, &rows, hold, 50)
        .await
        .unwrap();
    // A second event, canceled whole below: its shared rows go with it.
    let (dropped_id, dropped) = plan_event(
        &mut tx,
        &uniq("dropped"),
        "promo",
        &users[..60],
        Channel::InApp,
    )
    .await;
    let rows: Vec<_> = dropped.iter().map(|d| (dropped_id, d)).collect();
    let dropped_rows = notify_store::events::insert_deliveries_held(&mut tx, &rows, hold, 50)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(dropped_rows.len(), 2);
    let mut sizes: Vec<usize> = held.iter().map(|r| r.deliveries()).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![20, 50, 50], "120 deliveries in three rows");
    let named: std::collections::HashSet<uuid::Uuid> =
        held.iter().flat_map(|r| r.delivery_ids()).collect();
    assert_eq!(named.len(), 120, "each delivery named once");
    assert_eq!(p.count("outbox").await, 5);
    // Every delivery a row names canceled: the row goes with them.
    let out = cancel(&p.pool, &CancelSelector::Id(dropped_id), &[], "tests", true)
        .await
        .unwrap();
    assert_eq!(out.newly_canceled, 60);
    assert_eq!(p.count("outbox").await, 3);

    // A cancel of one recipient leaves the rows (they name others too).
    let canceled_user = &users[60];
    let out = cancel(
        &p.pool,
        &CancelSelector::Id(event_id),
        std::slice::from_ref(canceled_user),
        "tests",
        true,
    )
    .await
    .unwrap();
    assert_eq!(out.newly_canceled, 1);
    assert_eq!(p.count("outbox").await, 3);

    // Long overdue, but named by a waiting row: the sweep leaves them alone.
    p.exec(
        "UPDATE notification_deliveries SET next_attempt_at = now() - interval '1 hour'
         WHERE event_id = $1",
        event_id,
    )
    .await;
    assert_eq!(
        republish_stale(&p.pool, Duration::from_secs(60), 1_000)
            .await
            .unwrap(),
        0
    );
    // The smallest row lost unpublished: its pending deliveries go back to the sweep.
    let lost = held.iter().find(|r| r.deliveries() == 20).unwrap();
    let lost_pending: i64 = p.scalar("SELECT count(*) FROM notification_deliveries WHERE id = ANY($1) AND status = 'pending'", lost.delivery_ids().collect::<Vec<_>>()).await;
    notify_store::outbox::delete(&p.pool, &[lost.id])
        .await
        .unwrap();
    assert_eq!(
        republish_stale(&p.pool, Duration::from_secs(60), 1_000)
            .await
            .unwrap(),
        lost_pending as u64
    );

    // The hold passes: a relay publishes the two rows left, the sweep's rows are out
    // already; every pending delivery is sent once, the canceled one never.
    assert_eq!(
        final_statuses(&p, &[event_id]).await,
        vec![("canceled".to_string(), 1), ("sent".to_string(), 119)]
    );
    let inbox: Vec<(String, i64)> = p
        .rows(
            "SELECT user_id, count(*) FROM notifications WHERE event_id = $1 GROUP BY user_id",
            event_id,
        )
        .await;
    assert_eq!(
        inbox.len(),
        119,
        "one inbox item per recipient but the canceled one"
    );
    assert!(inbox.iter().all(|(u, n)| *n == 1 && u != canceled_user));
    assert_eq!(p.count("outbox").await, 0);
}

/// A group commit's held deliveries share one outbox row a channel whichever of its
/// events they belong to (at most 50 a row), and each keeps its own event: the writer's
/// rows and a relay's claim of them name every delivery's event, and its trace, in row
/// order, and a relay claims them whole, up to its batch of deliveries. A cancel of one of
/// the events leaves its row to the others; one cancel that takes every delivery of a row
/// takes the row. Once the writer's hold has passed (it died before handing them over) a
/// relay publishes what is left: every pending delivery is sent once, the canceled never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_commits_held_deliveries_share_rows_across_its_events_each_with_its_own_event() {
    let p =
        Platform::start_with(Options::workers(&[Channel::InApp]).ingest_in_process(false)).await;
    // No ingest yet (its relay would claim the rows): the type goes in directly.
    p.execute("INSERT INTO notification_types (key, default_channels) VALUES ('promo', '{inapp}')")
        .await;
    let (planned, held) = write_group(&p, "group", 60).await;
    let event_of: std::collections::HashMap<uuid::Uuid, uuid::Uuid> =
        planned.iter().map(|(e, d)| (d.id, *e)).collect();
    let mut sizes: Vec<usize> = held.iter().map(|r| r.deliveries()).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![10, 50], "60 events' deliveries in two rows");
    assert_eq!(p.count("outbox").await, 2);
    let events_named = |row: &notify_store::outbox::OutboxRow| -> Vec<Option<uuid::Uuid>> {
        row.origins.iter().map(|o| o.event_id).collect()
    };
    for row in &held {
        let expected: Vec<Option<uuid::Uuid>> = row
            .delivery_ids()
            .map(|d| event_of.get(&d).copied())
            .collect();
        assert!(expected.iter().all(Option::is_some));
        assert_eq!(
            events_named(row),
            expected,
            "each delivery with its own event"
        );
    }

    // The event of a row's head delivery canceled: the row stays for the 49 others.
    let small = held.iter().find(|r| r.deliveries() == 10).unwrap();
    let big = held.iter().find(|r| r.deliveries() == 50).unwrap();
    let (canceled_event, canceled_delivery) = (event_of[&big.delivery_id], big.delivery_id);
    let cancel = async |selector| {
        notify_store::cancel::cancel(&p.pool, &selector, &[], "tests", true)
            .await
            .unwrap()
            .newly_canceled
    };
    assert_eq!(
        cancel(notify_store::cancel::CancelSelector::Id(canceled_event)).await,
        1
    );
    assert_eq!(p.count("outbox").await, 2);
    // A relay claims the rows (due now, as when the hold has passed): each delivery's
    // event and trace read back, the canceled one's included.
    let traced = event_of[&big.more_delivery_ids[3]];
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    sqlx::query("UPDATE notification_events SET trace_context = $2 WHERE id = $1")
        .bind(traced)
        .bind(traceparent)
        .execute(&p.pool)
        .await
        .unwrap();
    p.execute("UPDATE outbox SET available_at = now()").await;
    // A batch of 10 deliveries: the first row only (whole, though it may name 50).
    let mut claimed = notify_store::outbox::claim_due(&p.pool, 10, Duration::from_millis(500))
        .await
        .unwrap();
    assert!(claimed[0].origins.is_empty(), "read on demand");
    assert_eq!(claimed.len(), 1, "one row: it names 10 deliveries or more");
    claimed.extend(
        notify_store::outbox::claim_due(&p.pool, 1_000, Duration::from_millis(500))
            .await
            .unwrap(),
    );
    let mut ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    let mut expected_ids = vec![small.id, big.id];
    expected_ids.sort_unstable();
    assert_eq!(ids, expected_ids, "the other row in the next batch");
    notify_store::outbox::read_origins(&p.pool, &mut claimed)
        .await
        .unwrap();
    for row in &claimed {
        let expected: Vec<Option<uuid::Uuid>> = row
            .delivery_ids()
            .map(|d| event_of.get(&d).copied())
            .collect();
        assert_eq!(
            events_named(row),
            expected,
            "claimed: each delivery's event"
        );
        for (id, origin) in row.delivery_ids().zip(&row.origins) {
            let trace = origin.trace_context.as_deref();
            if event_of[&id] == traced {
                assert_eq!(trace, Some(traceparent));
            } else {
                assert_eq!(trace, None);
            }
        }
    }
    assert!(
        claimed
            .iter()
            .flat_map(|r| r.delivery_ids())
            .any(|d| d == canceled_delivery)
    );

    // One cancel that takes every delivery of the other row (its ten events share a
    // cancellation key): that row goes.
    let small_events: Vec<uuid::Uuid> = small.delivery_ids().map(|d| event_of[&d]).collect();
    p.exec(
        "UPDATE notification_events SET cancellation_key = 'group-ten' WHERE id = ANY($1)",
        &small_events,
    )
    .await;
    assert_eq!(
        cancel(notify_store::cancel::CancelSelector::CancellationKey(
            "group-ten".into()
        ))
        .await,
        10
    );
    assert_eq!(p.count("outbox").await, 1);

    // Five more events whose shared row is lost unpublished: their deliveries are the
    // lost-message sweep's, but not while the relay is behind (more overdue rows than
    // the sweep's batch): republishing would only add to that backlog.
    let (lost, lost_rows) = write_group(&p, "lost", 5).await;
    assert_eq!(lost_rows.len(), 1);
    notify_store::outbox::delete(&p.pool, &[lost_rows[0].id])
        .await
        .unwrap();
    let lost_events: Vec<uuid::Uuid> = lost.iter().map(|(e, _)| *e).collect();
    p.exec(
        "UPDATE notification_deliveries SET next_attempt_at = now() - interval '1 hour'
         WHERE event_id = ANY($1)",
        &lost_events,
    )
    .await;
    // A backlog of 4 rows due an hour ago, against a sweep batch of 3: the relay is behind.
    let backlog = p.add_stale_outbox_rows(4).await;
    let wait = Duration::from_secs(60);
    let behind = async |batch| {
        notify_store::deliveries::relay_behind(&p.pool, wait, batch)
            .await
            .unwrap()
    };
    let sweep = async |batch| {
        notify_store::deliveries::republish_stale(&p.pool, wait, batch)
            .await
            .unwrap()
    };
    assert!(behind(3).await);
    assert_eq!(sweep(3).await, 0, "the relay is behind: the sweep waits");
    // Four stuck rows are no backlog for a batch of 1,000: the sweep runs.
    assert!(!behind(1_000).await);
    notify_store::outbox::delete(&p.pool, &backlog[1..])
        .await
        .unwrap();
    assert!(!behind(3).await, "one overdue row: not behind");
    assert_eq!(
        sweep(3).await,
        3,
        "caught up: the lost row's deliveries republished"
    );
    assert_eq!(sweep(3).await, 2);
    notify_store::outbox::delete(&p.pool, &backlog[..1])
        .await
        .unwrap();

    // That relay died; the claim's hold passes and a running ingest's relay publishes
    // the row, and the swept ones: 54 sent once, the canceled ones never.
    let _ingest = p.spawn("ingest", &["serve"], &[]);
    let events: Vec<uuid::Uuid> = planned
        .iter()
        .map(|(e, _)| *e)
        .chain(lost_events.iter().copied())
        .collect();
    assert_eq!(
        final_statuses(&p, &events).await,
        vec![("canceled".to_string(), 11), ("sent".to_string(), 54)]
    );
    let inbox: Vec<(uuid::Uuid, i64)> = p
        .rows(
            "SELECT event_id, count(*) FROM notifications WHERE event_id = ANY($1)
         GROUP BY event_id",
            &events,
        )
        .await;
    assert_eq!(
        inbox.len(),
        54,
        "one inbox item per event but the canceled ones"
    );
    assert!(
        inbox
            .iter()
            .all(|(e, n)| *n == 1 && *e != canceled_event && !small_events.contains(e))
    );
    assert_eq!(p.count("outbox").await, 0);
}

/// Issue 44, item 8: a worker frozen (SIGSTOP) during the last attempt allowed, past its
/// lease. The sweeper gives the delivery up (`failed`, the `delivery_failed` alert and
/// metric, the type's fallback if it has one); the worker resumes, LINE had accepted, and
/// the late success records `sent`. Every consequence of the failure follows that final
/// state in the same transaction: the fallback, still pending, is canceled and never
/// sent; a `delivery.sent` webhook follows the `delivery.failed` one; the worker logs
/// `alert_resolved = "delivery_failed"` and counts the failure withdrawn.
async fn a_late_success_after_the_last_attempt_was_given_up(with_fallback: bool) {
    let mut p = Platform::start_with(Options::workers(&[]).lease(Duration::from_secs(3))).await;
    if with_fallback {
        p.add_derived_type("order_paid", &["line"], &["line", "email"], None)
            .await;
    } else {
        p.add_type("order_paid", &["line"]).await;
    }
    crate::webhooks::create_endpoint(&p, "https://hooks.example.test/status", &[]).await;
    let (u, lid) = (uniq("u"), line_id());
    let address = format!("{u}@example.test");
    p.add_recipient(&u, "", &address, &lid).await;
    // LINE accepts, answering after 1.5 s: the worker is stopped before it reads that.
    p.slow_line_once(&lid, "late-1", 1500).await;
    let admin = support::free_addr();
    let frozen = p.spawn(
        "worker-line",
        &[],
        &[
            ("NOTIFY_LEASE", "3s".into()),
            ("NOTIFY_WORKER_CONCURRENCY", "1".into()),
            ("NOTIFY_WORKER_ID", "frozen".into()),
            ("NOTIFY_ADMIN_ADDR", admin.to_string()),
        ],
    );
    let ev = p.send("late-given-up", "order_paid", &[&u]).await;
    let id = ev.deliveries[0].delivery_id.clone();
    wait_line_calls(&p, 1).await;
    signal(frozen.pid(), "-STOP");
    // This call is the last one allowed (as the third of three would be).
    let last = p
        .exec(
            "UPDATE notification_deliveries SET max_attempts = attempts
         WHERE id = $1::uuid AND status = 'sending'",
            &id,
        )
        .await;
    assert_eq!(last, 1);
    wait_status(&p, &id, "failed", 30).await;
    let pool = p.pool.clone();
    let fallback = || async {
        sqlx::query_as::<_, (String, String, String)>(
            "SELECT id::text, status, coalesce(last_error, '') FROM notification_deliveries
             WHERE event_id = $1::uuid AND channel = 'email'",
        )
        .bind(&ev.event_id)
        .fetch_optional(&pool)
        .await
        .unwrap()
    };
    if with_fallback {
        let f = fallback()
            .await
            .expect("the sweeper created the email fallback");
        assert_eq!(f.1, "pending", "{f:?}");
    }

    signal(frozen.pid(), "-CONT");
    wait_status(&p, &id, "sent", 30).await;
    let (state, attempts) = status_of(&p, &id).await;
    assert_eq!((state.as_str(), attempts), ("sent", 1));
    let hooks: Vec<String> = p
        .scalars(
            "SELECT event_type FROM webhook_messages WHERE delivery_id = $1::uuid
         ORDER BY state_version",
            &id,
        )
        .await;
    assert_eq!(
        hooks[hooks.len().saturating_sub(2)..],
        ["delivery.failed".to_string(), "delivery.sent".to_string()],
        "the failure's webhook is followed by the success's: {hooks:?}"
    );
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("notify_deliveries_failure_withdrawn_total{")
                && l.contains(r#"channel="line""#)
                && l.ends_with(" 1")
        ),
        "the failure counted withdrawn:\n{metrics}"
    );
    let log = frozen.log();
    assert!(
        log.contains(r#""alert_resolved":"delivery_failed""#),
        "the resumed worker resolves the alert:\n{log}"
    );
    match fallback().await {
        Some((fid, status, error)) => {
            assert!(with_fallback);
            assert_eq!(status, "canceled", "the pending fallback is canceled");
            assert!(
                error.starts_with(&format!("canceled: delivery {id}")),
                "{error}"
            );
            let cancelled: i64 = p
                .scalar(
                    "SELECT count(*) FROM webhook_messages
                 WHERE delivery_id = $1::uuid AND event_type = 'delivery.cancelled'",
                    &fid,
                )
                .await;
            assert_eq!(cancelled, 1, "its delivery.cancelled webhook");
            // An email worker now finds the fallback's message and sends nothing.
            p.start_worker(Channel::Email);
            let queue = p.topology.queue("email");
            p.wait_queue_depth(
                &queue,
                0,
                "the fallback's message taken",
                Duration::from_secs(20),
            )
            .await;
            p.stop_workers().await;
            assert!(p.mails_to(&address).await.is_empty(), "no fallback email");
            assert_eq!(fallback().await.unwrap().1, "canceled");
        }
        None => assert!(!with_fallback, "a fallback without the type's list"),
    }
    frozen.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_after_the_last_attempt_was_given_up_cancels_the_pending_fallback() {
    a_late_success_after_the_last_attempt_was_given_up(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_success_after_the_last_attempt_was_given_up_withdraws_the_failure() {
    a_late_success_after_the_last_attempt_was_given_up(false).await;
}

/// Issue 44, item 9: a worker process stopped (SIGSTOP) during a call holds, besides that
/// call's message, room in its prefetch. Its AMQP heartbeat (notify_broker::HEARTBEAT_S,
/// 10 s) stops with it, so the broker closes its connection within three heartbeat
/// intervals and returns what it held: the sweeper's recovered message reaches a live worker
/// (started only once that message is published, so it cannot have taken it first) while
/// the frozen one is still stopped, within the bound of docs/guarantees.md; the resumed
/// worker writes nothing and the delivery is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_holds_a_recovered_delivery_no_longer_than_three_heartbeats() {
    let mut p = Platform::start_with(Options {
        workers: vec![],
        lease: Duration::from_secs(3),
        // No republish of the waiting delivery meanwhile: only the broker's return of
        // what the frozen worker held can bring the message to the live one.
        republish_after: Duration::from_secs(600),
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    // The first call fails, answered after 2 s, when the worker is already stopped.
    p.sim_fault(
        json!({"provider": "line", "target_contains": lid, "status": 500,
        "body": {"message": "internal"}, "delay_ms": 2000, "times": 1}),
    )
    .await;
    let frozen = p.spawn(
        "worker-line",
        &[],
        &[
            ("NOTIFY_LEASE", "3s".into()),
            // Room in its prefetch beside the call in hand.
            ("NOTIFY_WORKER_CONCURRENCY", "4".into()),
            ("NOTIFY_WORKER_ID", "frozen".into()),
        ],
    );
    let ev = p.send("frozen-prefetch", "order_paid", &[&u]).await;
    let id = ev.deliveries[0].delivery_id.clone();
    wait_line_calls(&p, 1).await;
    signal(frozen.pid(), "-STOP");
    let stopped = std::time::Instant::now();
    // The lease runs out; the sweeper puts the delivery back with a new outbox row, which
    // the relay publishes.
    eventually(
        "the recovered delivery published",
        Duration::from_secs(30),
        async || {
            let (status, _) = status_of(&p, &id).await;
            let rows: i64 = p.query_scalar("SELECT count(*) FROM outbox").await;
            if status == "pending" && rows == 0 {
                Ok(())
            } else {
                Err((status, rows))
            }
        },
    )
    .await;
    p.start_worker_named(Channel::Line, "second");
    // The broker checks once a heartbeat interval and closes the connection at the second
    // check that saw nothing: 2 to 3 intervals after the frozen worker's last frame. Then
    // the live worker's claim and call.
    let bound = Duration::from_secs(3 * u64::from(notify_broker::HEARTBEAT_S) + 10);
    let done = p.wait_final(&ev.event_id, bound.as_secs()).await;
    let took = stopped.elapsed();
    assert_eq!(done.deliveries[0].status, "sent", "{done:?}");
    assert!(
        took < bound,
        "sent {took:?} after the freeze; bound {bound:?}"
    );
    eprintln!(
        "recovered delivery sent {:.1} s after the freeze",
        took.as_secs_f64()
    );

    resume_until_idle(&frozen, Duration::from_secs(30)).await;
    let attempts = attempts_of(&p, &id).await;
    assert_eq!(
        attempts,
        [
            (1, "worker_lost".to_string(), String::new()),
            (2, "sent".to_string(), "second".to_string())
        ]
    );
    assert_eq!(
        p.sim_count("line").await,
        2,
        "the refused call and the send"
    );
    frozen.terminate();
}
