//! The console overview's counts, kept by triggers as append-only deltas and rolled up
//! into a per-minute summary: at every moment they equal a `count(*)` of the rows, through
//! every status change the workers, the sweeper, cancellation and due-time skips make,
//! before and after a rollup, and with rollups of several replicas racing.

use crate::support;

use notify_core::Channel;
use notify_proto::v1 as pb;
use notify_store::console::{OVERVIEW_STATUSES, overview, roll_up_counts};
use pb::cancel_event_request::Target;
use serde_json::json;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;
use support::{Options, Platform, cancel, eventually, uniq};

/// (channel, status) -> (last hour, last day), and channel -> retry rate, counted from
/// the rows themselves with the overview's windows (from the start of the minute an hour
/// or a day ago).
type Counts = (
    BTreeMap<(String, String), (i64, i64)>,
    BTreeMap<String, f64>,
);

async fn counted(db: &PgPool) -> Counts {
    let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "SELECT channel, status,
                count(*) FILTER (WHERE created_at >= date_bin('1 minute', now() - interval '1 hour', timestamptz '2000-01-01 00:00:00+00')),
                count(*)
         FROM notification_deliveries
         WHERE created_at >= date_bin('1 minute', now() - interval '1 day', timestamptz '2000-01-01 00:00:00+00')
         GROUP BY 1, 2",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let rates: Vec<(String, f64)> = sqlx::query_as(
        "SELECT d.channel, avg((a.outcome = 'retry')::int)::float8
         FROM delivery_attempts a JOIN notification_deliveries d ON d.id = a.delivery_id
         WHERE a.finished_at >= date_bin('1 minute', now() - interval '1 hour', timestamptz '2000-01-01 00:00:00+00')
         GROUP BY 1",
    )
    .fetch_all(db)
    .await
    .unwrap();
    (
        rows.into_iter()
            .map(|(c, s, h, d)| ((c, s), (h, d)))
            .collect(),
        rates.into_iter().collect(),
    )
}

/// The overview's figures in the same shape (zeros left out).
async fn shown(db: &PgPool) -> Counts {
    let (channels, _) = overview(db).await.unwrap();
    let mut counts = BTreeMap::new();
    let mut rates = BTreeMap::new();
    for c in channels {
        for (i, s) in OVERVIEW_STATUSES.iter().enumerate() {
            if c.last_day[i] != 0 || c.last_hour[i] != 0 {
                counts.insert(
                    (c.channel.as_str().to_string(), s.as_str().to_string()),
                    (c.last_hour[i], c.last_day[i]),
                );
            }
        }
        if let Some(r) = c.retry_rate {
            rates.insert(c.channel.as_str().to_string(), r);
        }
    }
    (counts, rates)
}

/// [`assert_exact`] while workers move deliveries: the rows are counted before and after
/// the overview is read, and the overview must equal them whenever they did not change
/// meanwhile (tried again, for up to 20 s, when a worker moved one during the reads).
async fn assert_exact_live(db: &PgPool, when: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let before = counted(db).await;
        let got = shown(db).await;
        let want = counted(db).await;
        if before == want {
            return assert_same(&got, &want, when);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{when}: the rows never held still for one read"
        );
        // The rows moved during the read: read again shortly (bounded by the deadline).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The overview equals the rows' own counts (rates to 1e-9).
pub(crate) async fn assert_exact(db: &PgPool, when: &str) {
    let want = counted(db).await;
    let got = shown(db).await;
    assert_same(&got, &want, when);
}

/// What the overview showed against the rows' counts: counts equal, rates to 1e-9.
fn assert_same(got: &Counts, want: &Counts, when: &str) {
    let ((got, got_rates), (want, want_rates)) = (got, want);
    assert_eq!(got, want, "{when}: counts");
    assert_eq!(
        got_rates.keys().collect::<Vec<_>>(),
        want_rates.keys().collect::<Vec<_>>(),
        "{when}: channels with attempts"
    );
    for (c, r) in want_rates {
        assert!(
            (got_rates[c] - r).abs() < 1e-9,
            "{when}: {c} {got_rates:?} {want_rates:?}"
        );
    }
}

async fn deltas(db: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM delivery_count_deltas")
        .fetch_one(db)
        .await
        .unwrap()
}

/// Every status the table allows: each change between two of them, on several rows at
/// once, moves the counts by exactly those rows; a statement that changes nothing moves
/// nothing. A trigger that missed a kind of change (or counted a row whose status stayed)
/// fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_change_between_any_two_statuses_is_counted_exactly() {
    // No rollup task: this test decides when one runs.
    let p = Platform::start_with(
        Options::workers(&[]).counts_rollup_interval(Duration::from_secs(3600)),
    )
    .await;
    let db = &p.pool;
    p.add_type("ov_seeded", &["inapp", "line"]).await;
    let allowed: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint
         WHERE conname = 'notification_deliveries_status_check'",
    )
    .fetch_one(db)
    .await
    .unwrap();
    let statuses = [
        "pending", "sending", "sent", "failed", "canceled", "skipped",
    ];
    for s in statuses {
        assert!(allowed.contains(&format!("'{s}'")), "{allowed}");
        assert!(
            OVERVIEW_STATUSES.iter().any(|o| o.as_str() == s),
            "the overview shows {s}"
        );
    }
    assert_eq!(
        allowed.matches("::text").count(),
        statuses.len(),
        "{allowed}"
    );

    // 40 rows per (channel, status, age): now, 3 hours, 30 hours and 3 days old.
    let event = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO notification_events (id, event_key, type, recipients, payload_json, content_json, channels, fingerprint)
         VALUES ($1, $2, 'ov_seeded', '{}', '{}', '{\"title\": \"t\"}', ARRAY['inapp', 'line'], '\\x00')",
    )
    .bind(event)
    .bind(uniq("ov"))
    .execute(db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO notification_deliveries
             (id, event_id, user_id, channel, provider, idempotency_key, status, lease_token, lease_expires_at, created_at)
         SELECT gen_random_uuid(), $1, 'u' || g, c, CASE c WHEN 'inapp' THEN 'inbox' ELSE 'line' END,
                $1 || '/' || c || '/' || s || '/' || age || '/' || g, s,
                gen_random_uuid(), now() + interval '1 hour', now() - age
         FROM unnest($2::text[]) AS s, unnest(ARRAY['inapp', 'line']) AS c,
              unnest(ARRAY[interval '0', interval '3 hours', interval '30 hours', interval '3 days']) AS age,
              generate_series(1, 40) AS g",
    )
    .bind(event)
    .bind(&statuses[..])
    .execute(db)
    .await
    .unwrap();
    assert!(deltas(db).await > 0, "the insert appended deltas");
    assert_exact(db, "after the insert").await;

    // Every ordered pair: 24 rows of `from` (of any age and channel) become `to`, in one
    // statement that also rewrites 2 rows of `to` to themselves.
    for from in statuses {
        for to in statuses.iter().filter(|&&t| t != from) {
            let r = sqlx::query(
                "UPDATE notification_deliveries SET status = $2, updated_at = now()
                 WHERE id IN (SELECT id FROM notification_deliveries WHERE status = $1
                              ORDER BY id LIMIT 24)
                    OR id IN (SELECT id FROM notification_deliveries WHERE status = $2
                              ORDER BY id DESC LIMIT 2)",
            )
            .bind(from)
            .bind(to)
            .execute(db)
            .await
            .unwrap();
            assert!(r.rows_affected() > 2, "{from} -> {to}");
            assert_exact(db, &format!("after {from} -> {to}")).await;
        }
    }
    // Statements that change no status append nothing.
    let before = deltas(db).await;
    sqlx::query("UPDATE notification_deliveries SET lease_expires_at = now() + interval '2 hours'")
        .execute(db)
        .await
        .unwrap();
    sqlx::query("UPDATE notification_deliveries SET status = status WHERE user_id = 'u9'")
        .execute(db)
        .await
        .unwrap();
    assert_eq!(deltas(db).await, before, "no status changed");
    sqlx::query("DELETE FROM notification_deliveries WHERE user_id = 'u40' AND channel = 'line'")
        .execute(db)
        .await
        .unwrap();
    assert_exact(db, "after a delete").await;

    // Attempts by outcome, finished now and two hours ago (outside the hour).
    sqlx::query(
        "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, finished_at, outcome)
         SELECT id, 1, now(), now() - CASE WHEN user_id = 'u5' THEN interval '2 hours' ELSE interval '0' END,
                (ARRAY['sent', 'retry', 'failed'])[1 + (substr(user_id, 2)::int % 3)]
         FROM notification_deliveries WHERE user_id IN ('u4', 'u5', 'u6', 'u7', 'u8')",
    )
    .execute(db)
    .await
    .unwrap();
    assert_exact(db, "after attempts, before a rollup").await;

    let folded = roll_up_counts(db, 100_000).await.unwrap();
    assert!(folded > 0);
    assert_eq!(deltas(db).await, 0, "one rollup folds every delta");
    assert_exact(db, "after a rollup").await;
    let old: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM delivery_counts WHERE minute < now() - interval '2 days'",
    )
    .fetch_one(db)
    .await
    .unwrap();
    assert_eq!(old, 0, "minutes older than two days are pruned");

    // Many small statements, then two rollups racing with small batches until none is
    // left: each delta is folded once.
    for i in 0..150 {
        sqlx::query(
            "UPDATE notification_deliveries SET status = (ARRAY['pending', 'sent', 'failed'])[1 + $1 % 3]
             WHERE id = (SELECT id FROM notification_deliveries ORDER BY id OFFSET $1 LIMIT 1)",
        )
        .bind(i)
        .execute(db)
        .await
        .unwrap();
    }
    assert!(deltas(db).await > 100);
    let race = |db: PgPool| async move {
        let mut n = 0;
        loop {
            let k = roll_up_counts(&db, 7).await.unwrap();
            n += k;
            if k < 7 {
                return n;
            }
        }
    };
    let before = deltas(db).await as u64;
    let (a, b) = tokio::join!(
        tokio::spawn(race(db.clone())),
        tokio::spawn(race(db.clone()))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        a + b,
        before,
        "each delta folded by exactly one rollup ({a} + {b})"
    );
    assert_eq!(deltas(db).await, 0);
    assert_exact(db, "after two racing rollups").await;
}

/// The real paths, with the rollup task running every second: in-app sent, LINE sent
/// after a retry (pending again), LINE failed, a scheduled send canceled, one skipped at
/// its due time by an opt-out, and claims in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_equals_the_rows_through_sends_retries_failures_cancellations_and_skips() {
    let p = Platform::start_with_workers(&[Channel::InApp, Channel::Line]).await;
    let db = &p.pool;
    p.add_type("ov_paid", &["inapp", "line"]).await;
    assert_exact_live(db, "empty").await;

    let (ok, _) = p.add_line_recipient("ok").await;
    let (flaky, flaky_line) = p.add_line_recipient("flaky").await;
    let (bad, bad_line) = p.add_line_recipient("bad").await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": flaky_line, "status": 500, "times": 1}),
    )
    .await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": bad_line, "status": 400, "times": 1,
                       "body": {"message": "The property, 'to', in the request body is invalid"}}),
    )
    .await;
    let ev = p
        .send(&uniq("ov:sent"), "ov_paid", &[&ok, &flaky, &bad])
        .await;
    assert_exact_live(db, "planned").await;
    let done = p.wait_final(&ev.event_id, 60).await;
    let states: Vec<_> = done.deliveries.iter().map(|d| d.status.as_str()).collect();
    assert_eq!(
        states.iter().filter(|s| **s == "sent").count(),
        5,
        "{states:?}"
    );
    assert_eq!(
        states.iter().filter(|s| **s == "failed").count(),
        1,
        "{states:?}"
    );
    assert_exact_live(db, "sent, retried and failed").await;

    // A scheduled send canceled; another skipped when due (the user opted out meanwhile).
    let (later, _) = p.add_line_recipient("later").await;
    let (gone, _) = p.add_line_recipient("gone").await;
    let mut req = p.event(&uniq("ov:later"), "ov_paid", &[&later]);
    req.delay = "1h".into();
    let scheduled = p.create_event(req).await;
    let mut req = p.event(&uniq("ov:gone"), "ov_paid", &[&gone]);
    req.delay = "1h".into();
    let skipping = p.create_event(req).await;
    assert_exact_live(db, "scheduled").await;
    let out = cancel(&p, Target::EventId(scheduled.event_id.clone()), &[]).await;
    assert_eq!(out.canceled, 2, "{out:?}");
    assert_exact_live(db, "canceled").await;
    p.set_preference(&gone, "ov_paid", "line", false).await;
    p.make_due_now(&skipping.event_id).await;
    let done = p.wait_final(&skipping.event_id, 60).await;
    let mut states: Vec<_> = done
        .deliveries
        .iter()
        .map(|d| (d.channel.as_str(), d.status.as_str()))
        .collect();
    states.sort();
    assert_eq!(states, [("inapp", "sent"), ("line", "skipped")]);
    assert_exact_live(db, "skipped when due").await;

    // The rollup task folds every delta; the figures stay the same.
    eventually(
        "the rollup task folds the deltas",
        Duration::from_secs(20),
        async || {
            let n = deltas(db).await;
            (n == 0).then_some(()).ok_or(n)
        },
    )
    .await;
    assert_exact_live(db, "rolled up").await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM delivery_counts")
        .fetch_one(db)
        .await
        .unwrap();
    assert!(rows > 0);
}

/// A statement updating many deliveries on a connection whose earlier updates were
/// small (the sweeper's, a claim's) is counted in time linear in its rows: a cancel of
/// 20,000 pending deliveries took more than a minute in the counting trigger when it
/// joined the old and new rows by a plan cached for small statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_update_after_small_ones_on_one_connection_is_counted_without_a_quadratic_join() {
    let p = Platform::start_with(
        Options::workers(&[]).counts_rollup_interval(Duration::from_secs(3600)),
    )
    .await;
    let db = &p.pool;
    p.add_type("ov_large", &["inapp"]).await;
    let event = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO notification_events (id, event_key, type, recipients, payload_json,
                                          content_json, channels, fingerprint)
         VALUES ($1, $2, 'ov_large', '{}', '{}', '{}', '{inapp}', '\\x00')",
    )
    .bind(event)
    .bind(uniq("ov-large"))
    .execute(db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, idempotency_key)
         SELECT gen_random_uuid(), $1, 'u' || g, 'inapp', 'inbox', $1 || '/' || g
         FROM generate_series(1, 20000) AS g",
    )
    .bind(event)
    .execute(db)
    .await
    .unwrap();
    let mut conn = db.acquire().await.unwrap();
    // The small statements first, as the sweeper's and claims' are on a pooled connection.
    for user in ["nobody", "u1"] {
        sqlx::query("UPDATE notification_deliveries SET updated_at = now() WHERE user_id = $1")
            .bind(user)
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    sqlx::query("SET statement_timeout = '20s'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let done = sqlx::query(
        "UPDATE notification_deliveries SET status = 'canceled' WHERE event_id = $1 AND status = 'pending'",
    )
    .bind(event)
    .execute(&mut *conn)
    .await
    .expect("the large update finishes well within the timeout");
    assert_eq!(done.rows_affected(), 20_000);
    drop(conn);
    assert_exact(db, "after the large update").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_due_pending_delivery_of_each_channel_is_shown_and_scheduled_ones_are_not() {
    let p = Platform::start_with(
        Options::workers(&[]).counts_rollup_interval(Duration::from_secs(3600)),
    )
    .await;
    let db = &p.pool;
    p.add_type("ov_oldest", &["inapp", "line", "email"]).await;
    let event = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO notification_events (id, event_key, type, recipients, payload_json,
                                          content_json, channels, fingerprint)
         VALUES ($1, $2, 'ov_oldest', '{}', '{}', '{}', '{inapp,line,email}', '\\x00')",
    )
    .bind(event)
    .bind(uniq("ov-oldest"))
    .execute(db)
    .await
    .unwrap();
    // inapp: due 90 s and 30 s ago, and 1,000 due in the future; line: only scheduled ones;
    // email: a sent one due an hour ago (not pending) and a pending one due 10 s ago.
    sqlx::query(
        "INSERT INTO notification_deliveries
             (id, event_id, user_id, channel, provider, idempotency_key, status, next_attempt_at)
         SELECT gen_random_uuid(), $1, 'u' || g, c, p, $1 || '/' || c || '/' || due || '/' || g, s, now() + due
         FROM (VALUES ('inapp', 'inbox', 'pending', interval '-90 seconds'),
                      ('inapp', 'inbox', 'pending', interval '-30 seconds'),
                      ('line', 'line', 'pending', interval '1 hour'),
                      ('email', 'smtp', 'sent', interval '-1 hour'),
                      ('email', 'smtp', 'pending', interval '-10 seconds')) AS v(c, p, s, due),
              generate_series(1, 3) AS g
         UNION ALL
         SELECT gen_random_uuid(), $1, 'f' || g, 'inapp', 'inbox', $1 || '/future/' || g, 'pending',
                now() + g * interval '1 second'
         FROM generate_series(1, 1000) AS g",
    )
    .bind(event)
    .execute(db)
    .await
    .unwrap();
    let (channels, _) = overview(db).await.unwrap();
    let oldest = |ch: Channel| {
        channels
            .iter()
            .find(|c| c.channel == ch)
            .and_then(|c| c.oldest_pending_s)
    };
    let inapp = oldest(Channel::InApp).expect("inapp has due deliveries");
    assert!((89..=95).contains(&inapp), "inapp oldest due {inapp} s");
    let email = oldest(Channel::Email).expect("email has a due delivery");
    assert!(
        (9..=15).contains(&email),
        "email oldest due {email} s, the sent one left out"
    );
    assert_eq!(oldest(Channel::Line), None, "nothing of line is due yet");
    assert_eq!(oldest(Channel::Push), None, "push has no pending delivery");
}
