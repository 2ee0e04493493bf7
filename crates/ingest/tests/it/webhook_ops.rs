//! Operating status webhooks: the console's webhooks page (an endpoint worker-webhook
//! disabled after failing too long is listed with its reason, failure run and attempts; a
//! staff member enables it again through the confirmation page, audited; a POST without
//! the session's CSRF token changes nothing), and worker-webhook's `/readyz`, which
//! needs its broker consumer as the channel workers' does.

use crate::support;
use crate::webhooks::{create_endpoint, platform, start_webhook_worker, webhook_config};

use axum::http::StatusCode;
use notify_core::Channel;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::{SendExt, eventually, no_redirects, uniq};

/// A receiver that answers every POST with 500; returns its URL and the request count.
async fn failing_receiver() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                (StatusCode::INTERNAL_SERVER_ERROR, "receiver broken")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://127.0.0.1:{}/hook",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, hits)
}

/// (enabled, disabled_reason, failing_since is set) of endpoint `id`.
async fn endpoint_state(p: &support::Platform, id: uuid::Uuid) -> (bool, Option<String>, bool) {
    p.row(
        "SELECT enabled, disabled_reason, failing_since IS NOT NULL FROM webhook_endpoints
          WHERE id = $1",
        id,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_a_disabled_endpoint_with_its_attempts_and_enables_it_again() {
    let p = platform(&[Channel::InApp]).await;
    let (hook_url, hits) = failing_receiver().await;
    let (id, _) = create_endpoint(&p, &hook_url, &["delivery.sent"]).await;
    let id = uuid::Uuid::parse_str(&id).unwrap();
    let mut cfg = webhook_config(&p);
    cfg.retry.delays = vec![Duration::from_millis(100), Duration::from_millis(200)];
    cfg.disable_after = Duration::from_millis(800);
    let (stop, task) = start_webhook_worker(cfg, p.pool.clone());
    p.add_type("order.paid", &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "U", "", "").await;
    p.send(&uniq("e"), "order.paid", &[&user]).await;
    let reason = eventually(
        "worker-webhook disables the failing endpoint",
        Duration::from_secs(30),
        async || match endpoint_state(&p, id).await {
            (false, Some(reason), true) => Ok(reason),
            other => Err(other),
        },
    )
    .await;
    assert!(reason.starts_with("failing since"), "{reason}");
    stop.cancel();
    task.await.unwrap();
    let posts = hits.load(Ordering::SeqCst);
    assert!(posts >= 2, "{posts} POSTs");

    let http = no_redirects();
    let url = |path: &str| format!("{}{path}", p.http_url);
    let cookie = p.console_cookie().await;
    let overview = p.console_page(&cookie, "/console").await;
    assert!(
        overview.contains("<a href=\"/console/webhooks\">Webhooks</a>"),
        "the nav links the page: {overview}"
    );
    let page = p.console_page(&cookie, "/console/webhooks").await;
    assert!(
        page.contains(&format!("<h2 id=\"endpoint-{id}\">{hook_url}</h2>")),
        "{page}"
    );
    assert!(
        page.contains("<th>Event types</th><td>delivery.sent</td>"),
        "{page}"
    );
    assert!(
        page.contains(&format!("<span class=\"failed\">disabled</span>: {reason}")),
        "the reason is shown: {page}"
    );
    assert!(
        !page.contains("<th>Failing since</th><td>–</td>"),
        "the failure run's start is shown: {page}"
    );
    // Every POST the receiver answered is an attempt row: status 500 and its error.
    let rows = page.matches("<td class=\"failed\">500</td>").count();
    assert_eq!(rows, posts.min(20), "{page}");
    assert!(page.contains("<td>delivery.sent</td><td>1</td>"), "{page}");
    assert!(page.contains("<td>http_500</td>"), "{page}");
    let link = format!("/console/webhooks/confirm-enable/{id}");
    assert!(page.contains(&link), "{page}");

    let confirm = p.console_page(&cookie, &link).await;
    let action = format!("/console/actions/webhooks/{id}/enable");
    assert!(
        confirm.contains(&format!("action=\"{action}\"")),
        "{confirm}"
    );
    // A forged token, or none, is refused and changes nothing.
    let forged = http
        .post(url(&action))
        .header("cookie", &cookie)
        .form(&[("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    let missing = http
        .post(url(&action))
        .header("cookie", &cookie)
        .form(&[("other", "x")])
        .send()
        .await
        .unwrap();
    assert!(missing.status().is_client_error(), "{}", missing.status());
    assert_eq!(
        endpoint_state(&p, id).await,
        (false, Some(reason.clone()), true)
    );
    assert_eq!(p.count("console_audit").await, 0);

    let done = p.console_post(&cookie, &action, &confirm).await;
    assert_eq!(done.status(), 303);
    assert_eq!(
        done.headers()["location"],
        format!("/console/webhooks#endpoint-{id}").as_str()
    );
    assert_eq!(
        endpoint_state(&p, id).await,
        (true, None, false),
        "enabled, its failure run cleared"
    );
    let caller: String = p
        .scalar("SELECT caller FROM webhook_endpoints WHERE id = $1", id)
        .await;
    assert!(
        page.contains(&format!("<th>Caller</th><td>{caller}</td>")),
        "{page}"
    );
    let audit: Vec<(String, String, String, String)> = p
        .query_rows("SELECT staff, action, target, detail FROM console_audit ORDER BY id")
        .await;
    assert_eq!(
        audit,
        [(
            support::CONSOLE_USER.to_string(),
            "webhook_enable".to_string(),
            id.to_string(),
            format!("{hook_url} ({caller}; was: {reason})"),
        )]
    );
    let page = p.console_page(&cookie, "/console/webhooks").await;
    assert!(
        page.contains("<span class=\"sent\">enabled</span>"),
        "{page}"
    );
    assert!(
        !page.contains(&link),
        "no re-enable link once enabled: {page}"
    );
}

/// `GET url`: (status, body); a connection error is `None`.
async fn get(url: &str) -> Option<(u16, String)> {
    let r = reqwest::get(url).await.ok()?;
    Some((r.status().as_u16(), r.text().await.unwrap_or_default()))
}

/// Waits (20 s at most, else panics naming `what`) until `/readyz` at `addr` answers
/// `status`; returns its body.
async fn readyz_answers(addr: std::net::SocketAddr, status: u16, what: &str) -> String {
    eventually(what, Duration::from_secs(20), async || {
        match get(&format!("http://{addr}/readyz")).await {
            Some((s, body)) if s == status => Ok(body),
            other => Err(other),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_webhook_is_ready_only_while_it_consumes_from_rabbitmq() {
    let p = support::Platform::start_with_workers(&[]).await;
    // RabbitMQ unreachable: alive, Postgres fine, not ready, and says why.
    let cut_off = support::free_addr();
    let _cut = p.spawn(
        "worker-webhook",
        &[],
        &[
            ("NOTIFY_ADMIN_ADDR", cut_off.to_string()),
            (
                "NOTIFY_AMQP_URL",
                "amqp://guest:guest@127.0.0.1:1/%2f".into(),
            ),
        ],
    );
    let body = readyz_answers(
        cut_off,
        503,
        "worker-webhook without RabbitMQ answers /readyz 503",
    )
    .await;
    assert!(
        body.contains("rabbitmq: not consuming from deliveries.webhook"),
        "{body}"
    );
    assert!(!body.contains("postgres"), "{body}");
    assert_eq!(
        get(&format!("http://{cut_off}/healthz")).await.map(|r| r.0),
        Some(200)
    );

    // With the broker: ready, and the disabled-endpoint counter is exported at 0 from the
    // start (so the alert's increase() sees the first one).
    let admin = support::free_addr();
    let _worker = p.spawn(
        "worker-webhook",
        &[],
        &[("NOTIFY_ADMIN_ADDR", admin.to_string())],
    );
    readyz_answers(admin, 200, "worker-webhook with RabbitMQ ready").await;
    let (_, metrics) = get(&format!("http://{admin}/metrics")).await.unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("notify_webhook_endpoints_disabled_total"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(line.ends_with(" 0"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_counts_messages_pending_over_a_minute_and_the_page_counts_each_endpoints() {
    let p = platform(&[]).await;
    let (a, _) = create_endpoint(&p, "https://a.example.test/hook", &[]).await;
    let (b, _) = create_endpoint(&p, "https://b.example.test/hook", &[]).await;
    // Rows as enqueue writes them: two of a's pending, one for two minutes; b's one sent
    // long ago; and one of b's pending for five minutes.
    for (endpoint, status, age_s) in [
        (&a, "pending", 120),
        (&a, "pending", 5),
        (&b, "sent", 600),
        (&b, "pending", 300),
    ] {
        sqlx::query(
            "INSERT INTO webhook_messages (id, endpoint_id, event_type, payload, delivery_id,
                                           state_version, status, created_at)
             VALUES (gen_random_uuid(), $1::uuid, 'delivery.sent', '{}', gen_random_uuid(), 1,
                     $2, now() - $3 * interval '1 second')",
        )
        .bind(endpoint)
        .bind(status)
        .bind(age_s)
        .execute(&p.pool)
        .await
        .unwrap();
    }
    assert_eq!(
        notify_store::webhooks::pending_backlog(&p.pool)
            .await
            .unwrap(),
        2,
        "a's two-minute-old and b's five-minute-old message"
    );
    let http = no_redirects();
    let cookie = p.console_cookie().await;
    let page = http
        .get(format!("{}/console/webhooks", p.http_url))
        .header("cookie", &cookie)
        .text_body()
        .await;
    for (id, pending) in [(&a, 2), (&b, 1)] {
        let at = page
            .find(&format!("<td>{id}</td>"))
            .unwrap_or_else(|| panic!("{page}"));
        let count = format!("<th>Pending messages</th><td>{pending}</td>");
        assert_eq!(
            page[at..].find(&count),
            page[at..].find("<th>Pending messages</th>"),
            "{id}: {pending} pending: {page}"
        );
    }
    assert!(page.contains("<th>Event types</th><td>all</td>"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_webhook_exports_its_posts_by_outcome_with_their_duration() {
    let p = platform(&[Channel::InApp]).await;
    let (hook_url, hits) = failing_receiver().await;
    create_endpoint(&p, &hook_url, &["delivery.sent"]).await;
    let admin = support::free_addr();
    let _worker = p.spawn(
        "worker-webhook",
        &[],
        &[
            ("NOTIFY_ADMIN_ADDR", admin.to_string()),
            ("NOTIFY_DEV_HTTP_HOSTS", "127.0.0.1".into()),
            ("NOTIFY_WEBHOOK_RETRY_DELAYS", "1s".into()),
            ("NOTIFY_WEBHOOK_MAX_ATTEMPTS", "2".into()),
        ],
    );
    p.add_type("order.paid", &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "U", "", "").await;
    p.send(&uniq("e"), "order.paid", &[&user]).await;
    // Two POSTs answered 500: the first is retried, the second spends the attempts.
    let metrics = eventually(
        "both POSTs counted on /metrics",
        Duration::from_secs(30),
        async || {
            let (_, text) = get(&format!("http://{admin}/metrics"))
                .await
                .ok_or("no answer")?;
            let has = |needle: &str| {
                text.lines()
                    .any(|l| l.starts_with(needle) && l.ends_with(" 1"))
            };
            if has("notify_webhook_attempts_total{outcome=\"retry\"")
                && has("notify_webhook_attempts_total{outcome=\"failed\"")
            {
                Ok(text)
            } else {
                Err("not yet")
            }
        },
    )
    .await;
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    for outcome in ["retry", "failed"] {
        let count = format!("notify_webhook_attempt_duration_seconds_count{{outcome=\"{outcome}\"");
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&count))
            .unwrap_or_else(|| panic!("{metrics}"));
        assert!(line.ends_with(" 1"), "{line}");
    }
    assert!(
        !metrics.contains("notify_webhook_attempts_total{outcome=\"sent\""),
        "{metrics}"
    );
}

/// The stale-message sweep (a pending webhook message whose queue message was lost) waits
/// while the relay is behind, as the deliveries' sweep does: the outbox then still holds
/// what it has not published, and the look-up of every stale message's outbox row would
/// repeat on each sweep (issue 44, item 6: the statements that join the outbox).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stale_webhook_message_sweep_waits_while_the_relay_is_behind() {
    // No ingest, so no relay claims the backlog below while the test looks.
    let p = support::Platform::start_with(support::Options {
        workers: vec![],
        ingest_in_process: false,
        ..Default::default()
    })
    .await;
    let endpoint = uuid::Uuid::new_v4();
    p.exec(
        "INSERT INTO webhook_endpoints (id, caller, url, secret)
         VALUES ($1, 'anonymous', 'https://hooks.example.test/', 'whsec_x')",
        endpoint,
    )
    .await;
    // Pending for an hour, with no outbox row: its queue message was lost.
    p.exec(
        "INSERT INTO webhook_messages (id, endpoint_id, event_type, payload, delivery_id,
                                       state_version, next_attempt_at)
         VALUES (gen_random_uuid(), $1, 'delivery.sent', '{}', gen_random_uuid(), 1,
                 now() - interval '1 hour')",
        endpoint,
    )
    .await;
    // Four rows due an hour ago, not claimed: against a sweep batch of 3 the relay is
    // behind.
    let backlog = p.add_stale_outbox_rows(4).await;
    let wait = Duration::from_secs(60);
    let sweep = async || {
        notify_store::webhooks::republish_stale_messages(&p.pool, wait, 3)
            .await
            .unwrap()
    };
    assert_eq!(sweep().await, 0, "the relay is behind: the sweep waits");
    p.exec("DELETE FROM outbox WHERE id = ANY($1)", &backlog)
        .await;
    assert_eq!(
        sweep().await,
        1,
        "caught up: the lost message is republished"
    );
}
