//! Retention (notify_store::retention): old final deliveries, their attempts, inbox
//! rows and events are purged, attempts' content is cleared earlier, pending data stays,
//! a type's own lengths beat the global ones, two purgers at once delete each row once,
//! and an event_key stays a duplicate as long as its event is kept. Every purge is run at
//! an instant set by the test (the database clock plus the age wanted), so no test waits
//! for data to grow old.

use crate::support::*;
use chrono::{DateTime, Utc};
use notify_core::Channel;
use notify_proto::v1 as pb;
use notify_store::retention::{PurgeLimits, Purged, Retention, purge};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use uuid::Uuid;

/// Lengths of seconds and minutes, as in a compressed-clock run.
fn lengths(content: u64, deliveries: u64, archived_inbox: u64) -> Retention {
    Retention {
        content: Duration::from_secs(content),
        deliveries: Duration::from_secs(deliveries),
        archived_inbox: Duration::from_secs(archived_inbox),
    }
}

/// Small batches and no pause, so a test's few rows still take several batches.
const LIMITS: PurgeLimits = PurgeLimits {
    batch: 3,
    pause: Duration::ZERO,
};

/// One pass at `at`; panics if it did not run or failed.
async fn purge_at(p: &Platform, r: &Retention, limits: PurgeLimits, at: DateTime<Utc>) -> Purged {
    purge(&p.pool, r, limits, at, &CancellationToken::new())
        .await
        .expect("purge")
        .expect("no other purge holds the lock")
}

async fn rows_of_event(p: &Platform, event_id: &str) -> (i64, i64, i64, i64) {
    let id = Uuid::parse_str(event_id).unwrap();
    let one = |sql: &'static str| {
        let pool = p.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    (
        one("SELECT count(*) FROM notification_events WHERE id = $1").await,
        one("SELECT count(*) FROM notification_deliveries WHERE event_id = $1").await,
        one(
            "SELECT count(*) FROM delivery_attempts a JOIN notification_deliveries d
             ON d.id = a.delivery_id WHERE d.event_id = $1",
        )
        .await,
        one("SELECT count(*) FROM notifications WHERE event_id = $1").await,
    )
}

#[tokio::test]
async fn old_final_deliveries_attempts_inbox_rows_and_events_go_and_pending_ones_stay() {
    let p = Platform::start_with_workers(&[Channel::InApp, Channel::Email]).await;
    let ty = uniq("ret");
    p.add_type(&ty, &["inapp", "email"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "สมชาย", &format!("{user}@example.test"), "")
        .await;

    let sent = p.send(&uniq("sent"), &ty, &[&user]).await;
    let ev = p.wait_final(&sent.event_id, 60).await;
    assert_all_sent(&ev);
    let archived = p.send(&uniq("archived"), &ty, &[&user]).await;
    assert_all_sent(&p.wait_final(&archived.event_id, 60).await);
    let item: Uuid = p
        .scalar(
            "SELECT id FROM notifications WHERE event_id = $1",
            Uuid::parse_str(&archived.event_id).unwrap(),
        )
        .await;
    notify_store::inbox::set_status(&p.pool, &user, item, notify_core::InboxStatus::Archived)
        .await
        .unwrap()
        .expect("the item is the user's");
    // Scheduled a day ahead: its deliveries stay pending through every purge below.
    let mut later = p.event(&uniq("later"), &ty, &[&user]);
    later.delay = "1d".into();
    let later = p.create_event(later).await;

    let t0 = db_now(&p).await;
    let r = lengths(60, 3600, 60);
    // Ten minutes on: content older than a minute is cleared, the archived inbox item
    // goes, every delivery is still there.
    let first = purge_at(&p, &r, LIMITS, t0 + chrono::Duration::minutes(10)).await;
    assert_eq!(first.deliveries, 0, "{first:?}");
    assert_eq!(first.inbox, 1, "only the archived item: {first:?}");
    assert!(first.attempts_cleared >= 2, "{first:?}");
    assert!(first.batches > 2, "small batches: {first:?}");
    let (kept, with_content): (i64, i64) = p
        .row(
            "SELECT count(*), count(*) FILTER (WHERE a.content_json IS NOT NULL
                                          OR a.provider_response IS NOT NULL)
         FROM delivery_attempts a JOIN notification_deliveries d ON d.id = a.delivery_id
         WHERE d.event_id = $1 AND a.outcome = 'sent'",
            Uuid::parse_str(&sent.event_id).unwrap(),
        )
        .await;
    assert_eq!(
        (kept, with_content),
        (2, 0),
        "attempts kept, their content cleared"
    );
    assert_eq!(rows_of_event(&p, &archived.event_id).await, (1, 2, 2, 0));
    assert_eq!(rows_of_event(&p, &sent.event_id).await, (1, 2, 2, 1));
    // The same instant again: nothing left to do (the content cursor moved on).
    let again = purge_at(&p, &r, LIMITS, t0 + chrono::Duration::minutes(10)).await;
    assert!(again.is_nothing(), "{again:?}");

    // Two hours on: the final deliveries are past their hour.
    let second = purge_at(&p, &r, LIMITS, t0 + chrono::Duration::hours(2)).await;
    assert_eq!(second.deliveries, 4, "{second:?}");
    assert_eq!(second.attempts, 4, "{second:?}");
    assert_eq!(second.events, 2, "{second:?}");
    assert_eq!(
        second.inbox, 1,
        "the unarchived item went with its delivery: {second:?}"
    );
    for gone in [&sent.event_id, &archived.event_id] {
        assert_eq!(rows_of_event(&p, gone).await, (0, 0, 0, 0));
        let e = p.ingest().get_event(event_request(gone)).await.unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
    }
    let (events, deliveries, _, _) = rows_of_event(&p, &later.event_id).await;
    assert_eq!(
        (events, deliveries),
        (1, 2),
        "pending deliveries are never purged"
    );
    let pending: i64 = p
        .query_scalar("SELECT count(*) FROM notification_deliveries WHERE status = 'pending'")
        .await;
    assert_eq!(pending, 2);

    // Purged deliveries leave the console's counts: the overview equals the rows held.
    let (overview, _) = notify_store::console::overview(&p.pool).await.unwrap();
    let counted: i64 = overview.iter().flat_map(|o| o.last_day).sum();
    assert_eq!(counted, p.count("notification_deliveries").await);
}

#[tokio::test]
async fn a_types_own_retention_beats_the_global_one() {
    let p = Platform::start_with_workers(&[Channel::InApp]).await;
    let user = uniq("u");
    p.add_recipient(&user, "Nok", "", "").await;
    let (short, long, global) = (uniq("short"), uniq("long"), uniq("global"));
    for (key, deliveries) in [(&short, 60), (&long, 10 * 86_400), (&global, 0)] {
        p.upsert_type(pb::UpsertNotificationTypeRequest {
            key: key.clone(),
            default_channels: vec!["inapp".into()],
            delivery_retention_seconds: deliveries,
            ..Default::default()
        })
        .await;
    }
    let mut ids = Vec::new();
    for ty in [&short, &long, &global] {
        let e = p.send(&uniq("k"), ty, &[&user]).await;
        assert_all_sent(&p.wait_final(&e.event_id, 60).await);
        ids.push(e.event_id);
    }
    let t0 = db_now(&p).await;
    let r = lengths(86_400, 86_400, 86_400);
    // Five minutes on: only the type that keeps a minute has lost its event.
    purge_at(&p, &r, LIMITS, t0 + chrono::Duration::minutes(5)).await;
    assert_eq!(
        rows_of_event(&p, &ids[0]).await.0,
        0,
        "60 s override < 1 d global"
    );
    assert_eq!(rows_of_event(&p, &ids[1]).await.0, 1);
    assert_eq!(rows_of_event(&p, &ids[2]).await.0, 1);
    // Two days on: the global day has passed; the ten-day type keeps its event.
    purge_at(&p, &r, LIMITS, t0 + chrono::Duration::days(2)).await;
    assert_eq!(
        rows_of_event(&p, &ids[1]).await,
        (1, 1, 1, 1),
        "10 d override > 1 d"
    );
    assert_eq!(rows_of_event(&p, &ids[2]).await.0, 0);
    purge_at(&p, &r, LIMITS, t0 + chrono::Duration::days(11)).await;
    assert_eq!(rows_of_event(&p, &ids[1]).await, (0, 0, 0, 0));

    // A length over 366 days is refused, naming the field.
    let e = p
        .types()
        .upsert_notification_type(pb::UpsertNotificationTypeRequest {
            key: short.clone(),
            default_channels: vec!["inapp".into()],
            content_retention_seconds: 400 * 86_400,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        format!("{:?}", e.details()).contains("content_retention_seconds")
            || e.message().contains("content_retention_seconds"),
        "{e:?}"
    );

    // The type file takes the same fields.
    let filed = uniq("filed");
    let file = serde_json::json!({"version": 1, "types": [{
        "key": filed, "default_channels": ["inapp"],
        "content_retention_seconds": 30, "delivery_retention_seconds": 120}]});
    ingest::types_file::load(&p.pool, &file.to_string())
        .await
        .expect("type file");
    let stored = notify_store::catalog::get_type(&p.pool, &filed)
        .await
        .unwrap()
        .expect("the filed type");
    assert_eq!(
        stored.retention,
        notify_store::retention::TypeRetention {
            content_s: Some(30),
            deliveries_s: Some(120),
            archived_inbox_s: None,
        }
    );
}

#[tokio::test]
async fn a_replayed_event_key_is_a_duplicate_within_retention_and_a_new_event_after_its_purge() {
    let p = Platform::start_with_workers(&[Channel::InApp]).await;
    let ty = uniq("ret");
    p.add_type(&ty, &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "Mali", "", "").await;
    let key = uniq("order-1001-paid");
    let first = p.send(&key, &ty, &[&user]).await;
    assert!(!first.duplicate);
    assert_all_sent(&p.wait_final(&first.event_id, 60).await);

    let t0 = db_now(&p).await;
    let r = lengths(60, 3600, 3600);
    // Within the hour the event is kept: the replay is its duplicate.
    purge_at(&p, &r, LIMITS, t0 + chrono::Duration::minutes(59)).await;
    let replay = p.send(&key, &ty, &[&user]).await;
    assert!(replay.duplicate);
    assert_eq!(replay.event_id, first.event_id);
    // Once the event is gone, the same key is a new event.
    let done = purge_at(&p, &r, LIMITS, t0 + chrono::Duration::minutes(61)).await;
    assert_eq!(done.events, 1, "{done:?}");
    let after = p.send(&key, &ty, &[&user]).await;
    assert!(!after.duplicate);
    assert_ne!(after.event_id, first.event_id);
    assert_all_sent(&p.wait_final(&after.event_id, 60).await);
}

#[tokio::test]
async fn two_purgers_at_once_delete_each_row_once_and_one_waits_for_nothing() {
    let p = Platform::start_with_workers(&[]).await;
    let ty = uniq("ret");
    p.add_type(&ty, &["inapp", "email"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "Dao", &format!("{user}@example.test"), "")
        .await;
    let batch = uniq("batch");
    let sends = (0..120).map(|i| {
        let mut e = p.event(&format!("{batch}-{i}"), &ty, &[&user]);
        e.cancellation_key = batch.clone();
        let mut c = p.ingest();
        async move { c.create_event(e).await.expect("CreateEvent") }
    });
    futures_util::future::join_all(sends).await;
    // No worker runs: the cancel makes all 240 deliveries final.
    let counts = cancel(
        &p,
        pb::cancel_event_request::Target::CancellationKey(batch),
        &[],
    )
    .await;
    assert_eq!(counts.canceled, 240, "{counts:?}");

    // A pass holding the lock makes another one skip its turn at once.
    let mut holder = p.pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(notify_store::retention::PURGE_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    let at = db_now(&p).await + chrono::Duration::hours(2);
    let r = lengths(60, 3600, 3600);
    let skipped = purge(&p.pool, &r, LIMITS, at, &CancellationToken::new())
        .await
        .unwrap();
    assert!(skipped.is_none());
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(notify_store::retention::PURGE_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    drop(holder);

    // Two at once (as two replicas): between them every row once, no error, no deadlock.
    let limits = PurgeLimits {
        batch: 7,
        pause: Duration::ZERO,
    };
    let running = CancellationToken::new();
    let (a, b) = tokio::join!(
        purge(&p.pool, &r, limits, at, &running),
        purge(&p.pool, &r, limits, at, &running),
    );
    let (a, b) = (
        a.unwrap().unwrap_or_default(),
        b.unwrap().unwrap_or_default(),
    );
    assert_eq!(a.deliveries + b.deliveries, 240, "{a:?} {b:?}");
    assert_eq!(a.events + b.events, 120, "{a:?} {b:?}");
    assert_eq!(p.count("notification_deliveries").await, 0);
    assert_eq!(p.count("notification_events").await, 0);
    assert_eq!(p.count("delivery_skips").await, 0);
}
