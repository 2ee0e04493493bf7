//! Cancellation (issue 17, item 2): `CancelEvent` by event id, event key or cancellation
//! key, for the whole event or some recipients; a topic fan-out canceled half way writes
//! nothing more; concurrent cancels and replays are harmless; another caller's event is
//! not found; a delivery in flight finishes and is reported sent; a lost worker's
//! delivery is not revived; the console cancels through the same path.

use crate::support;

use notify_core::Channel;
use notify_proto::v1 as pb;
use notify_proto::v1::cancel_event_request::Target;
use serde_json::json;
use std::time::Duration;
use support::{
    Platform, cancel, cancel_req, console_login, db_now, eventually, field_violations,
    no_redirects, session_cookie, settle, uniq, with_key,
};
use tonic::Code;

/// The database clock now (the clock `sent_at` is written on).
/// Deliveries of `event_id` by status.
async fn statuses(p: &Platform, event_id: &str) -> Vec<(String, i64)> {
    p.rows(
        "SELECT status, count(*) FROM notification_deliveries WHERE event_id = $1::uuid
         GROUP BY status ORDER BY status",
        event_id,
    )
    .await
}

fn total(r: &pb::CancelEventResponse) -> u32 {
    r.sent + r.canceled + r.not_created + r.in_flight + r.failed + r.skipped
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_canceled_half_way_through_its_fan_out_sends_nothing_after_the_cancel() {
    let p = Platform::start_with_type(&[Channel::InApp], "promo", &["inapp"]).await;
    p.add_topic_audience("shop.sale", "s", 20_000).await;
    let req = p.topic_event("sale:2026-12", "promo", "shop.sale");
    let ev = p.create_event(req).await;

    // About half written: then cancel.
    let planned = eventually(
        "half the fan-out written",
        Duration::from_secs(120),
        async || {
            let e = p
                .ingest()
                .get_event(pb::GetEventRequest {
                    selector: Some(pb::get_event_request::Selector::EventId(
                        ev.event_id.clone(),
                    )),
                    page_size: 1,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            if e.fanout_recipients >= 10_000 {
                Ok(e.fanout_recipients)
            } else {
                Err(e.fanout_recipients)
            }
        },
    )
    .await;
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    let returned = db_now(&p).await;
    assert!(
        planned < 20_000,
        "canceled while the fan-out ran ({planned})"
    );
    assert_eq!(out.events, 1);
    assert_eq!(out.event_ids, std::slice::from_ref(&ev.event_id));
    assert_eq!(
        total(&out),
        20_000,
        "every subscriber is counted once: {out:?}"
    );
    assert!(out.not_created > 0, "subscribers not planned yet: {out:?}");
    assert!(out.canceled > 0, "{out:?}");
    assert_eq!(out.in_flight, 0, "{out:?}");

    // Nothing more is written, nothing canceled is sent, nothing is sent after the return.
    let rows = 20_000 - i64::from(out.not_created);
    settle("nothing after the cancel", Duration::from_secs(3), async || {
        let n = p.count("notification_deliveries").await;
        let late: i64 = p.scalar("SELECT count(*) FROM notification_deliveries WHERE sent_at > $1 OR status IN ('pending', 'sending')", returned).await;
        if n == rows && late == 0 { Ok(()) } else { Err((n, late)) }
    })
    .await;
    assert_eq!(
        p.count("notifications").await,
        i64::from(out.sent),
        "an in-app notification for each delivery sent, none for the canceled"
    );
    let e = p.get_event(&ev.event_id).await;
    assert_eq!(e.fanout_status, "canceled");
    assert!(e.canceled_at.is_some());
    // The same call again: the same answer, nothing new.
    let again = cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    assert_eq!(again, out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_cancels_and_replays_of_one_key_are_harmless() {
    let p = Platform::start_with_type(&[Channel::InApp], "promo", &["inapp"]).await;
    p.add_topic_audience("shop.flash", "f", 5_000).await;
    let mut req = p.topic_event("flash:1", "promo", "shop.flash");
    req.cancellation_key = "flash:1:all".into();
    let first = p.create_event(req.clone()).await;

    let mut tasks = Vec::new();
    for i in 0..50 {
        let (mut c, req) = (p.ingest(), req.clone());
        let pool = p.pool.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                let out = c
                    .cancel_event(cancel_req(Target::EventKey("flash:1".into()), &[]))
                    .await
                    .unwrap()
                    .into_inner();
                let at: chrono::DateTime<chrono::Utc> =
                    sqlx::query_scalar("SELECT clock_timestamp()")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                (Some((out, at)), None)
            } else {
                let r = c.create_event(req).await.unwrap().into_inner();
                (None, Some(r))
            }
        }));
    }
    let mut cancels = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (Some(c), _) => cancels.push(c),
            (_, Some(r)) => {
                assert!(r.duplicate, "a replay is a duplicate");
                assert_eq!(r.event_id, first.event_id);
            }
            _ => unreachable!(),
        }
    }
    assert_eq!(p.count("notification_events").await, 1, "one event");
    let first_return = cancels.iter().map(|(_, at)| *at).min().unwrap();
    let answer = cancels[0].0.clone();
    for (out, _) in &cancels {
        assert_eq!(out.events, 1);
        assert_eq!(total(out), 5_000, "{out:?}");
        assert_eq!(out, &answer, "every cancel answers the same counts");
    }
    settle("nothing sent after the first cancel returned", Duration::from_secs(2), async || {
        let late: i64 = p.scalar("SELECT count(*) FROM notification_deliveries WHERE sent_at > $1 OR status IN ('pending', 'sending')", first_return).await;
        if late == 0 { Ok(()) } else { Err(late) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_by_event_key_by_cancellation_key_and_for_some_recipients() {
    // No worker yet: every delivery waits, pending.
    let mut p = Platform::start_with_type(&[], "reminder", &["inapp"]).await;
    let (a, b, c) = (uniq("a"), uniq("b"), uniq("c"));

    // By event key: the whole event; GetEvent shows it.
    let by_key = p.send("remind:1", "reminder", &[&a, &b]).await;
    let out = cancel(&p, Target::EventKey("remind:1".into()), &[]).await;
    assert_eq!((out.events, out.canceled, out.sent), (1, 2, 0), "{out:?}");
    let ev = p.get_event(&by_key.event_id).await;
    assert!(ev.canceled_at.is_some());
    for d in &ev.deliveries {
        assert_eq!(d.status, "canceled");
        assert_eq!(d.last_error, "canceled by anonymous");
    }
    assert_eq!(
        cancel(&p, Target::EventKey("remind:1".into()), &[]).await,
        out,
        "idempotent"
    );

    // By cancellation key: three events carry it, a fourth another one.
    let mut carts = Vec::new();
    for i in 0..3 {
        let mut req = p.event(&format!("cart:123:r{i}"), "reminder", &[&a]);
        req.cancellation_key = "cart:123:reminders".into();
        carts.push(p.create_event(req).await.event_id);
    }
    let mut other = p.event("cart:124:r0", "reminder", &[&a]);
    other.cancellation_key = "cart:124:reminders".into();
    let other = p.create_event(other).await;
    assert_eq!(
        p.get_event(&carts[0]).await.cancellation_key,
        "cart:123:reminders",
        "GetEvent shows the key"
    );
    let out = cancel(
        &p,
        Target::CancellationKey("cart:123:reminders".into()),
        &[],
    )
    .await;
    carts.sort();
    assert_eq!((out.events, out.canceled), (3, 3), "{out:?}");
    assert_eq!(out.event_ids, carts);
    assert_eq!(statuses(&p, &other.event_id).await, [("pending".into(), 1)]);
    let none = cancel(
        &p,
        Target::CancellationKey("cart:999:reminders".into()),
        &[],
    )
    .await;
    assert_eq!(
        none,
        pb::CancelEventResponse::default(),
        "an unknown key: no events"
    );

    // Some recipients only: the others are still delivered.
    let some = p.send("remind:2", "reminder", &[&a, &b, &c]).await;
    let out = cancel(&p, Target::EventId(some.event_id.clone()), &[&b]).await;
    assert_eq!((out.events, out.canceled), (1, 1), "{out:?}");
    assert!(p.get_event(&some.event_id).await.canceled_at.is_none());
    p.start_worker(Channel::InApp);
    let done = p.wait_final(&some.event_id, 30).await;
    let mut got: Vec<(String, String)> = done
        .deliveries
        .iter()
        .map(|d| (d.user_id.clone(), d.status.clone()))
        .collect();
    got.sort();
    let mut want = vec![
        (a.clone(), "sent".to_string()),
        (b.clone(), "canceled".to_string()),
        (c.clone(), "sent".to_string()),
    ];
    want.sort();
    assert_eq!(got, want);
    p.wait_final(&other.event_id, 30).await;
    assert_eq!(statuses(&p, &other.event_id).await, [("sent".into(), 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cancels_are_refused_by_field_and_the_key_is_checked_at_create() {
    let p = Platform::start_with_type(&[], "reminder", &["inapp"]).await;
    let refused = |r: pb::CancelEventRequest| {
        let mut c = p.ingest();
        async move { field_violations(&c.cancel_event(r).await.unwrap_err()) }
    };
    assert_eq!(refused(pb::CancelEventRequest::default()).await, ["target"]);
    assert_eq!(
        refused(cancel_req(Target::EventId("nope".into()), &[])).await,
        ["event_id"]
    );
    assert_eq!(
        refused(cancel_req(
            Target::CancellationKey("x".repeat(256)),
            &["u1", " "]
        ))
        .await,
        ["cancellation_key", "recipients[1]"]
    );
    assert_eq!(
        refused(cancel_req(Target::EventKey(String::new()), &[])).await,
        ["event_key"]
    );
    let mut req = p.event("k:1", "reminder", &["u1"]);
    req.cancellation_key = "k".repeat(256);
    let s = p.ingest().create_event(req).await.unwrap_err();
    assert_eq!(field_violations(&s), ["cancellation_key"]);
    // An unknown event by id or key: NOT_FOUND, as GetEvent answers.
    let unknown = p
        .ingest()
        .cancel_event(cancel_req(
            Target::EventId(uuid::Uuid::new_v4().to_string()),
            &[],
        ))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_callers_cancel_is_not_found_and_changes_nothing() {
    let (p, admin, shop, forum) = support::two_callers(&["order_paid"]).await;
    let mut req = p.event("order:9", "order_paid", &["u-9"]);
    req.cancellation_key = "order:9:all".into();
    let ev = p.create_event(with_key(req, &shop)).await;

    let as_forum = |t: Target| {
        let (mut c, k) = (p.ingest(), forum.clone());
        async move { c.cancel_event(with_key(cancel_req(t, &[]), &k)).await }
    };
    for t in [
        Target::EventId(ev.event_id.clone()),
        Target::EventKey("order:9".into()),
    ] {
        assert_eq!(as_forum(t).await.unwrap_err().code(), Code::NotFound);
    }
    let by_key = as_forum(Target::CancellationKey("order:9:all".into()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        by_key.events, 0,
        "another caller's cancellation key finds nothing"
    );
    assert_eq!(statuses(&p, &ev.event_id).await, [("pending".into(), 1)]);
    let canceled_at: Option<chrono::DateTime<chrono::Utc>> = p
        .scalar(
            "SELECT canceled_at FROM notification_events WHERE id = $1::uuid",
            &ev.event_id,
        )
        .await;
    assert!(canceled_at.is_none(), "nothing changed");

    // The owner's own cancel works; so does one that may manage (idempotent after it).
    let own = support::cancel_as(&p, Target::CancellationKey("order:9:all".into()), &shop).await;
    assert_eq!((own.events, own.canceled), (1, 1));
    let managed = support::cancel_as(&p, Target::EventId(ev.event_id.clone()), &admin).await;
    assert_eq!(managed, own);
    let last_error: String = p
        .scalar(
            "SELECT last_error FROM notification_deliveries WHERE event_id = $1::uuid",
            &ev.event_id,
        )
        .await;
    assert_eq!(last_error, "canceled by shop-orders");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_in_flight_finishes_and_is_reported_sent() {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    p.slow_line_once(&lid, "1", 2000).await;
    let ev = p.send("line-slow-cancel", "order_paid", &[&u]).await;
    p.wait_provider_called("line").await;
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    assert_eq!(
        (out.sent, out.canceled, out.in_flight),
        (1, 0, 0),
        "it finished while the cancel waited: {out:?}"
    );
    assert_eq!(p.sim_count("line").await, 1, "one push");
    assert_eq!(statuses(&p, &ev.event_id).await, [("sent".into(), 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_workers_delivery_of_a_canceled_event_is_not_revived() {
    let p = Platform::start_with_type(&[], "reminder", &["inapp"]).await;
    let ev = p.send("lost:1", "reminder", &["u-lost"]).await;
    // Its message published (a relay still connecting would keep the row, which nothing
    // below deletes: the delivery is canceled by the requeue's trigger, not by a cancel
    // statement), then, as if a worker claimed it and died: sending, its lease expired.
    p.wait_outbox_empty("the event's message published", Duration::from_secs(20))
        .await;
    p.exec(
        "UPDATE notification_deliveries SET status = 'sending', attempts = 1,
                lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'
         WHERE event_id = $1::uuid",
        &ev.event_id,
    )
    .await;
    // The sweeper requeues it while the cancel waits: it ends canceled, not pending.
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &[]).await;
    assert_eq!((out.canceled, out.in_flight), (1, 0), "{out:?}");
    let (status, outbox): (String, i64) = p
        .row(
            "SELECT d.status, (SELECT count(*) FROM outbox o WHERE o.delivery_id = d.id)
         FROM notification_deliveries d WHERE d.event_id = $1::uuid",
            &ev.event_id,
        )
        .await;
    assert_eq!((status.as_str(), outbox), ("canceled", 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_cancels_through_the_same_path() {
    let p = Platform::start_with_type(&[], "reminder", &["inapp"]).await;
    let ev = p.send("console:1", "reminder", &["u-1", "u-2"]).await;
    let http = no_redirects();
    let r = console_login(&http, &p.http_url).send().await.unwrap();
    let cookie = session_cookie(&r);
    let id = &ev.event_id;
    let confirm = p
        .console_page(
            &cookie,
            &format!("/console/confirm?action=cancel&target={id}"),
        )
        .await;
    let r = p
        .console_post(&cookie, &format!("/console/actions/cancel/{id}"), &confirm)
        .await;
    assert_eq!(r.status(), 303);
    let page = p
        .console_page(&cookie, &format!("/console/events/{id}"))
        .await;
    assert!(
        page.contains(&format!("by {}", support::CONSOLE_USER))
            && page.contains(
                "· canceled 2 · sent 0 · failed 0 · skipped 0 · in flight 0 · not created 0"
            ),
        "{page}"
    );
    let detail: String = p
        .scalar(
            "SELECT detail FROM console_audit WHERE action = 'cancel_event' AND target = $1",
            id,
        )
        .await;
    assert!(
        detail.starts_with("2 pending deliveries canceled"),
        "{detail}"
    );
    // The same store path as CancelEvent: GetEvent shows it, and a CancelEvent after it
    // answers the same counts.
    assert!(p.get_event(id).await.canceled_at.is_some());
    let out = cancel(&p, Target::EventId(id.clone()), &[]).await;
    assert_eq!((out.events, out.canceled), (1, 2));
    let last_error: String = p
        .scalar(
            "SELECT DISTINCT last_error FROM notification_deliveries WHERE event_id = $1::uuid",
            id,
        )
        .await;
    assert_eq!(last_error, format!("canceled by {}", support::CONSOLE_USER));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recipients_canceled_during_a_fan_out_get_no_delivery_and_the_rest_do() {
    // No worker: every delivery the fan-out writes stays pending, so what it wrote shows.
    let p = Platform::start_with_type(&[], "promo", &["inapp"]).await;
    p.add_topic_audience("shop.news", "n", 5_000).await;
    let req = p.topic_event("news:1", "promo", "shop.news");
    let ev = p.create_event(req).await;
    // The first and the last subscriber: one the fan-out has likely written, one it has
    // likely not; either way neither may end with a delivery that can be sent.
    let named = ["n-000000", "n-004999"];
    let out = cancel(&p, Target::EventId(ev.event_id.clone()), &named).await;
    assert_eq!(out.events, 1);
    assert_eq!(out.canceled + out.not_created, 2, "{out:?}");
    let done = p
        .wait_fanout_done(&ev.event_id, Duration::from_secs(60))
        .await;
    assert!(done.canceled_at.is_none(), "not the whole event");
    let rows: Vec<(String, String)> = p.rows("SELECT user_id, status FROM notification_deliveries WHERE event_id = $1::uuid AND status <> 'pending'", &ev.event_id).await;
    for (user, status) in &rows {
        assert!(
            named.contains(&user.as_str()) && status == "canceled",
            "{user} {status}"
        );
    }
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM notification_deliveries WHERE event_id = $1::uuid AND status = 'pending'
           AND user_id <> ALL($2)",
    )
    .bind(&ev.event_id)
    .bind(&named[..])
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert_eq!(pending, 4_998, "everyone else is still to be delivered");
    // After the fan-out passed them: the same counts.
    assert_eq!(
        cancel(&p, Target::EventId(ev.event_id.clone()), &named).await,
        out
    );
}

/// The fence a writer of derived deliveries takes (`notify_store::cancel::is_canceled`):
/// a cancel that comes while the writer holds it waits, then cancels what it wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_waits_for_a_writer_holding_the_fence_and_cancels_what_it_wrote() {
    let p = Platform::start_with_type(&[], "reminder", &["inapp"]).await;
    let ev = p.send("fence:1", "reminder", &["u-1"]).await;
    let id: uuid::Uuid = ev.event_id.parse().unwrap();
    let mut writer = p.pool.begin().await.unwrap();
    assert!(
        !notify_store::cancel::is_canceled(&mut writer, id, "u-1")
            .await
            .unwrap()
    );
    let mut c = p.ingest();
    let canceling = tokio::spawn(async move {
        c.cancel_event(cancel_req(Target::EventId(id.to_string()), &[]))
            .await
            .unwrap()
            .into_inner()
    });
    p.wait_for_a_lock_wait("the cancel waits for the writer's lock", "")
        .await;
    sqlx::query(
        "INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, idempotency_key)
         VALUES (gen_random_uuid(), $1, 'u-1', 'email', 'smtp', $1::text || '/u-1/email')",
    )
    .bind(id)
    .execute(&mut *writer)
    .await
    .unwrap();
    writer.commit().await.unwrap();
    let out = canceling.await.unwrap();
    assert_eq!((out.canceled, out.sent), (2, 0), "{out:?}");
    assert_eq!(statuses(&p, &ev.event_id).await, [("canceled".into(), 2)]);
    let mut conn = p.pool.acquire().await.unwrap();
    assert!(
        notify_store::cancel::is_canceled(&mut conn, id, "u-1")
            .await
            .unwrap()
    );
    drop(conn);
}

/// The delivery ids of `event_id`'s deliveries, in recipient order.
async fn delivery_ids(p: &Platform, event_id: &str) -> Vec<uuid::Uuid> {
    p.scalars(
        "SELECT id FROM notification_deliveries WHERE event_id = $1::uuid ORDER BY user_id",
        event_id,
    )
    .await
}

/// What `delivery` has now: status, attempts, inbox rows, attempt rows.
async fn written(p: &Platform, delivery: uuid::Uuid) -> (String, i32, i64, i64) {
    p.row(
        "SELECT d.status, d.attempts,
                (SELECT count(*) FROM notifications n WHERE n.delivery_id = d.id),
                (SELECT count(*) FROM delivery_attempts a WHERE a.delivery_id = d.id)
         FROM notification_deliveries d WHERE d.id = $1",
        delivery,
    )
    .await
}

/// The attempt the in-app worker records for an inbox row it wrote.
fn inbox_written() -> notify_store::deliveries::AttemptRecord {
    notify_store::deliveries::AttemptRecord {
        outcome: notify_core::AttemptLabel::Sent,
        provider_status: None,
        error_code: None,
        provider_response: Some("inbox row written".into()),
        content: json!({"title": "t"}),
        deactivate_endpoint: None,
        address_undeliverable: None,
        endpoint_invalid_since: None,
        worker_id: "unclaimed".into(),
        call_took: Duration::ZERO,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inapp_delivery_read_without_a_claim_is_written_once_and_never_after_a_cancel() {
    use notify_store::deliveries::{self, ClaimOutcome};
    const LEASE: Duration = Duration::from_secs(60);
    let p = Platform::start_with_type(&[], "nc_note", &["inapp"]).await;
    let canceled = p.send("nc:1", "nc_note", &["u-nc-a"]).await;
    let kept = p.send("nc:2", "nc_note", &["u-nc-b"]).await;
    let claimed = p.send("nc:3", "nc_note", &["u-nc-c"]).await;
    let present = p.send("nc:4", "nc_note", &["u-nc-d"]).await;
    let spent = p.send("nc:5", "nc_note", &["u-nc-e"]).await;
    // Its attempts all spent (workers died during them): never read, failed by the claim.
    let s = delivery_ids(&p, &spent.event_id).await[0];
    p.exec(
        "UPDATE notification_deliveries SET attempts = max_attempts WHERE id = $1",
        s,
    )
    .await;
    let none = deliveries::read_due_many(&p.pool, &[s], Channel::InApp)
        .await
        .unwrap();
    assert!(none[0].is_none());
    let exhausted = deliveries::claim_many(&p.pool, &[s], Channel::InApp, LEASE)
        .await
        .unwrap();
    assert!(
        matches!(exhausted[0], ClaimOutcome::Exhausted { .. }),
        "{exhausted:?}"
    );
    let (c, k, l, r) = (
        delivery_ids(&p, &canceled.event_id).await[0],
        delivery_ids(&p, &kept.event_id).await[0],
        delivery_ids(&p, &claimed.event_id).await[0],
        delivery_ids(&p, &present.event_id).await[0],
    );
    // Read as the in-app worker reads (no claim): the same id twice in one batch is read
    // once, the second goes through the claim.
    let read = deliveries::read_due_many(&p.pool, &[c, k, k, l, r], Channel::InApp)
        .await
        .unwrap();
    assert_eq!(
        read.iter().map(Option::is_some).collect::<Vec<_>>(),
        [true, true, false, true, true]
    );
    let jobs: Vec<_> = read.into_iter().flatten().collect();
    assert!(
        jobs.iter()
            .all(|j| j.attempt == 1 && j.lease_token.is_nil())
    );
    // Between the read and the write: one event canceled, another delivery claimed (a
    // redelivered message through the claim path).
    let out = cancel(&p, Target::EventId(canceled.event_id.clone()), &[]).await;
    assert_eq!((out.canceled, out.in_flight), (1, 0), "{out:?}");
    let claim = deliveries::claim_many(&p.pool, &[l], Channel::InApp, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(matches!(claim[0], ClaimOutcome::Claimed(_)), "{claim:?}");
    let record = inbox_written();
    // A read older than the bound (a worker frozen that long) writes nothing: its rules
    // are decided again by the claim.
    let mut stale = jobs[1].clone();
    stale.started_at -= chrono::Duration::seconds(61);
    assert_eq!(
        deliveries::record_inbox_sent(&p.pool, &[(&stale, &record)], LEASE)
            .await
            .unwrap(),
        [false]
    );
    assert_eq!(written(&p, k).await, ("pending".into(), 0, 0, 0));
    // An inbox row written by an earlier attempt whose record was lost.
    deliveries::insert_inbox_notifications(&p.pool, &[&jobs[3]])
        .await
        .unwrap();
    let batch: Vec<_> = [&jobs[0], &jobs[1], &jobs[1], &jobs[2], &jobs[3]]
        .into_iter()
        .map(|j| (j, &record))
        .collect();
    assert_eq!(
        deliveries::record_inbox_sent(&p.pool, &batch, LEASE)
            .await
            .unwrap(),
        [false, true, false, false, true],
        "only the unchanged deliveries are written, once"
    );
    assert_eq!(written(&p, r).await, ("sent".into(), 1, 1, 1));
    let said: Vec<String> = sqlx::query_scalar(
        "SELECT provider_response FROM delivery_attempts WHERE delivery_id = ANY($1)
         ORDER BY delivery_id = $2",
    )
    .bind([k, r])
    .bind(r)
    .fetch_all(&p.pool)
    .await
    .unwrap();
    assert_eq!(said, ["inbox row written", "inbox row already present"]);
    assert_eq!(written(&p, c).await, ("canceled".into(), 0, 0, 0));
    assert_eq!(written(&p, k).await, ("sent".into(), 1, 1, 1));
    assert_eq!(written(&p, l).await, ("sending".into(), 1, 0, 0));
    // A message redelivered after the commit: its read finds nothing, and an old read
    // writes nothing again.
    let again = deliveries::read_due_many(&p.pool, &[k], Channel::InApp)
        .await
        .unwrap();
    assert!(again[0].is_none());
    assert_eq!(
        deliveries::record_inbox_sent(&p.pool, &[(&jobs[1], &record)], LEASE)
            .await
            .unwrap(),
        [false]
    );
    assert_eq!(written(&p, k).await, ("sent".into(), 1, 1, 1));
    // The sent delivery's attempt is the one read, with its first attempt time.
    let (attempt, first_at_set, sent_at_set): (i32, bool, bool) = p
        .row(
            "SELECT a.attempt, d.first_attempt_at IS NOT NULL, d.sent_at IS NOT NULL
         FROM delivery_attempts a JOIN notification_deliveries d ON d.id = a.delivery_id
         WHERE a.delivery_id = $1",
            k,
        )
        .await;
    assert_eq!((attempt, first_at_set, sent_at_set), (1, true, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inapp_delivery_read_before_an_erasure_is_not_written_and_a_paused_one_is_not_read() {
    use notify_store::deliveries::{self, ClaimOutcome};
    const LEASE: Duration = Duration::from_secs(60);
    let p = Platform::start_with_type(&[], "ne_note", &["inapp"]).await;
    let erased_user = uniq("u-ne-erased");
    let erased = p.send("ne:1", "ne_note", &[erased_user.as_str()]).await;
    let kept = p.send("ne:2", "ne_note", &["u-ne-kept"]).await;
    let (e, k) = (
        delivery_ids(&p, &erased.event_id).await[0],
        delivery_ids(&p, &kept.event_id).await[0],
    );
    let read = deliveries::read_due_many(&p.pool, &[e, k], Channel::InApp)
        .await
        .unwrap();
    let jobs: Vec<_> = read.into_iter().flatten().collect();
    assert_eq!(jobs.len(), 2);
    // The recipient is erased between the worker's read and its write.
    let out = notify_store::erasure::erase_recipient(&p.pool, &erased_user, "test")
        .await
        .unwrap();
    assert_eq!(out.deliveries_canceled, 1, "{out:?}");
    let record = inbox_written();
    assert_eq!(
        deliveries::record_inbox_sent(&p.pool, &[(&jobs[0], &record), (&jobs[1], &record)], LEASE)
            .await
            .unwrap(),
        [false, true],
        "nothing is written for the erased recipient"
    );
    assert_eq!(written(&p, e).await, ("canceled".into(), 0, 0, 0));
    assert_eq!(written(&p, k).await, ("sent".into(), 1, 1, 1));
    let rows_of_erased: i64 = p
        .scalar(
            "SELECT count(*) FROM notifications WHERE user_id = $1",
            &erased_user,
        )
        .await;
    assert_eq!(rows_of_erased, 0);

    // A paused in-app channel: nothing is read, and the claim moves the delivery to the
    // pause's end without an attempt or an inbox row.
    let later = p.send("ne:3", "ne_note", &["u-ne-paused"]).await;
    let l = delivery_ids(&p, &later.event_id).await[0];
    deliveries::pause_channel(&p.pool, Channel::InApp, Duration::from_secs(3600), "test")
        .await
        .unwrap();
    let none = deliveries::read_due_many(&p.pool, &[l], Channel::InApp)
        .await
        .unwrap();
    assert!(none[0].is_none(), "a paused channel's delivery is not read");
    let claim = deliveries::claim_many(&p.pool, &[l], Channel::InApp, LEASE)
        .await
        .unwrap();
    assert!(
        matches!(&claim[0], ClaimOutcome::NotClaimable(why) if why.starts_with("paused until")),
        "{claim:?}"
    );
    assert_eq!(written(&p, l).await, ("pending".into(), 0, 0, 0));
    let waits: bool = p
        .scalar(
            "SELECT next_attempt_at >= now() + interval '59 minutes' FROM notification_deliveries
         WHERE id = $1",
            l,
        )
        .await;
    assert!(waits, "it waits for the pause to end");
}

/// `node` and every plan node below it, depth first.
fn plan_nodes(node: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = vec![node];
    for c in node["Plans"].as_array().into_iter().flatten() {
        out.extend(plan_nodes(c));
    }
    out
}

/// Asserts that the cancel's delete of outbox rows reaches them through `outbox_delivery`
/// and that nothing in the statement scans the outbox whole (issue 44: a nested loop
/// scanning it once per canceled delivery).
fn assert_outbox_by_index(plan: &serde_json::Value, when: &str) {
    let nodes = plan_nodes(&plan[0]["Plan"]);
    let on_outbox: Vec<_> = nodes
        .iter()
        .filter(|n| n["Relation Name"] == "outbox" && n["Node Type"] != "ModifyTable")
        .collect();
    assert!(!on_outbox.is_empty(), "{when}: no outbox read in {plan:#}");
    for n in on_outbox {
        // An index scan names its index; a bitmap heap scan's index is its child's.
        let by_index = plan_nodes(n)
            .iter()
            .any(|m| m["Index Name"] == "outbox_delivery");
        assert!(
            by_index,
            "{when}: the outbox is read without its delivery index: {n:#}"
        );
    }
    assert!(
        !nodes
            .iter()
            .any(|n| n["Node Type"] == "Seq Scan" && n["Relation Name"] == "outbox"),
        "{when}: {plan:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_six_thousand_pending_deliveries_reaches_the_outbox_by_its_index() {
    // Issue 44, item 6: 3 events x 1,000 recipients x 2 channels beside 12,000 outbox rows
    // took 22 s, one scan of the outbox per canceled delivery.
    let p = Platform::start_with_type(&[], "bulk_reminder", &["inapp", "email"]).await;
    let prefix = uniq("bulk");
    p.exec(
        "INSERT INTO recipients (user_id, email)
         SELECT $1 || '-' || i, $1 || '-' || i || '@example.test' FROM generate_series(1, 1000) i",
        &prefix,
    )
    .await;
    let users: Vec<String> = (1..=1000).map(|i| format!("{prefix}-{i}")).collect();
    let users: Vec<&str> = users.iter().map(String::as_str).collect();
    // Six events due tomorrow: every delivery stays pending with an outbox row of its own.
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    for i in 0..6 {
        let mut req = p.event(&format!("bulk:{i}"), "bulk_reminder", &users);
        req.send_at = tomorrow.clone();
        if i < 3 {
            req.cancellation_key = "bulk:canceled".into();
        }
        p.ingest().create_event(req).await.expect("CreateEvent");
    }
    let (pending, outbox): (i64, i64) = p
        .query_row(
            "SELECT (SELECT count(*) FROM notification_deliveries WHERE status = 'pending'),
                (SELECT count(*) FROM outbox)",
        )
        .await;
    assert_eq!((pending, outbox), (12_000, 12_000));
    let ids: Vec<uuid::Uuid> = p.query_scalars("SELECT id FROM notification_events WHERE cancellation_key = 'bulk:canceled' ORDER BY id").await;
    assert_eq!(ids.len(), 3);

    // The plan, as the planner sees the tables before any statistics, and after.
    let plan = notify_store::cancel::explain_cancel(&p.pool, &ids, &[])
        .await
        .unwrap();
    assert_outbox_by_index(&plan, "before ANALYZE");
    p.execute("ANALYZE outbox, notification_deliveries").await;
    let plan = notify_store::cancel::explain_cancel(&p.pool, &ids, &[])
        .await
        .unwrap();
    assert_outbox_by_index(&plan, "after ANALYZE");

    let started = std::time::Instant::now();
    let out = cancel(&p, Target::CancellationKey("bulk:canceled".into()), &[]).await;
    let took = started.elapsed();
    println!("cancel of 6,000 pending deliveries beside 12,000 outbox rows: {took:?}");
    assert_eq!(
        (out.events, out.canceled, out.in_flight),
        (3, 6_000, 0),
        "{out:?}"
    );
    let (pending, outbox): (i64, i64) = p
        .query_row(
            "SELECT (SELECT count(*) FROM notification_deliveries WHERE status = 'pending'),
                (SELECT count(*) FROM outbox)",
        )
        .await;
    assert_eq!(
        (pending, outbox),
        (6_000, 6_000),
        "the canceled deliveries' rows went"
    );
    // The plan is the assertion; the time only catches a return of the 22 s scan (the
    // acceptance figure is under 1 s; a debug build beside other tests needs room).
    assert!(took < Duration::from_secs(5), "{took:?}");
}
