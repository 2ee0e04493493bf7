//! Issue 18, email: failover between providers with a circuit breaker each, and SES
//! bounces and complaints through SNS into the undeliverable mark and the suppression list.

use crate::support::{self, Options, Platform, eventually, uniq};
use notify_core::Channel;
use serde_json::{Value, json};
use std::time::Duration;

/// A second SMTP server (the simulator's), for the platform's email worker to fail over
/// to; it runs until the test process ends.
async fn backup_smtp() -> (provider_sim::smtp::SmtpSim, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("smtp://{}", listener.local_addr().unwrap());
    let sim = provider_sim::smtp::SmtpSim::default();
    tokio::spawn(sim.clone().serve(listener, Default::default()));
    (sim, url)
}

/// `(provider, outcome)` of each attempt of event `event_id`'s only delivery.
async fn attempts(p: &Platform, event_id: &str) -> Vec<(String, String)> {
    p.rows(
        "SELECT coalesce(a.provider_name, ''), a.outcome FROM delivery_attempts a
         JOIN notification_deliveries d ON d.id = a.delivery_id
         WHERE d.event_id = $1::uuid ORDER BY a.attempt",
        event_id,
    )
    .await
}

/// Waits (10 s at most) until the console's table shows `provider`'s breaker `state`.
async fn wait_provider_state(p: &Platform, provider: &str, state: &str) {
    let what = format!("the console's table says {state}");
    eventually(&what, Duration::from_secs(10), async || {
        let now: Option<String> =
            sqlx::query_scalar("SELECT state FROM email_provider_states WHERE provider = $1")
                .bind(provider)
                .fetch_optional(&p.pool)
                .await
                .unwrap();
        if now.as_deref() == Some(state) {
            Ok(())
        } else {
            Err(now)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_answering_421_to_every_call_fails_over_and_email_returns_to_it_once_it_recovers() {
    let (backup, backup_url) = backup_smtp().await;
    let p = Platform::start_with(Options {
        workers: vec![Channel::Email],
        smtp_sim: true,
        email_backups: vec![backup_url.clone()],
        email_breaker: worker_email::breaker::BreakerConfig {
            failures: 2,
            cooldown: Duration::from_secs(1),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let primary = p.smtp_sim_url.trim_start_matches("smtp://").to_string();
    let secondary = backup_url.trim_start_matches("smtp://").to_string();
    p.add_type("order_paid", &["email"]).await;
    let user = uniq("fo");
    p.add_recipient(&user, "สมชาย", &format!("{user}@example.test"), "")
        .await;
    p.smtp_sim
        .set_fault(Some("421 4.3.2 service not available"));

    // Each email goes out in its first attempt, through the second provider; the
    // primary is asked twice (the breaker's threshold) and then not at all.
    for i in 1..=4 {
        let ev = p.send(&format!("fo:{i}"), "order_paid", &[&user]).await;
        let done = p.wait_final(&ev.event_id, 30).await;
        assert_eq!(done.deliveries[0].status, "sent", "{done:?}");
        assert_eq!(
            attempts(&p, &ev.event_id).await,
            [(secondary.clone(), "sent".to_string())]
        );
    }
    assert_eq!(
        p.smtp_sim.mail_commands(),
        2,
        "the open breaker keeps email away"
    );
    assert!(p.smtp_sim.messages().is_empty());
    assert_eq!(backup.messages().len(), 4);
    wait_provider_state(&p, &primary, "open").await;
    let http = support::no_redirects();
    let cookie = p.console_cookie().await;
    let page = support::SendExt::text_body(
        http.get(format!("{}/console/email", p.http_url))
            .header("cookie", &cookie),
    )
    .await;
    assert!(
        page.contains(&format!("<td>{primary}</td><td class=\"failed\">open</td>")),
        "{page}"
    );

    // The relay recovers; after the cooldown a new email probes it and email is back.
    p.smtp_sim.set_fault(None);
    let mut n = 10;
    eventually(
        "email goes out through the primary again",
        Duration::from_secs(20),
        async || {
            n += 1;
            let ev = p.send(&format!("fo:{n}"), "order_paid", &[&user]).await;
            p.wait_final(&ev.event_id, 30).await;
            match attempts(&p, &ev.event_id).await.as_slice() {
                [(who, outcome)] if *who == primary && outcome == "sent" => Ok(()),
                other => Err(other.to_vec()),
            }
        },
    )
    .await;
    assert_eq!(p.smtp_sim.messages().len(), 1);
    wait_provider_state(&p, &primary, "closed").await;
}

/// Issue 44, item 7: while every provider's breaker is open, the waiting emails are not
/// attempts. Each wake-up (the pause's end, when one probe is admitted and the other
/// deliveries find no provider) gives its claim back: no attempt row, no status webhook,
/// `attempts` and `max_attempts` untouched. Only real calls count: in the end each
/// delivery's `attempts` is its number of provider calls, one attempt row each, one
/// `delivery.deferred` webhook per failed call and one `delivery.sent`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_provider_open_waiting_emails_get_no_attempt_row_webhook_or_count_per_wake_up() {
    let (backup, backup_url) = backup_smtp().await;
    let cooldown = Duration::from_secs(2);
    let p = Platform::start_with(Options {
        workers: vec![Channel::Email],
        smtp_sim: true,
        email_backups: vec![backup_url.clone()],
        email_breaker: worker_email::breaker::BreakerConfig {
            failures: 1,
            cooldown,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    crate::webhooks::create_endpoint(&p, "https://hooks.example.test/status", &[]).await;
    p.add_type("order_paid", &["email"]).await;
    let users: Vec<String> = (0..6).map(|i| uniq(&format!("open{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "สมหญิง", &format!("{u}@example.test"), "")
            .await;
    }
    p.smtp_sim
        .set_fault(Some("421 4.3.2 service not available"));
    backup.set_fault(Some("421 4.7.0 try again later"));

    // The first calls (421 from both) open both breakers; the other deliveries, and every
    // retry inside the cooldown, find no provider to call and wait for the pause to end.
    let user_refs: Vec<&str> = users.iter().map(String::as_str).collect();
    let ev = p.send("open:1", "order_paid", &user_refs).await;
    let paused = eventually(
        "the email channel paused by the open breakers",
        Duration::from_secs(20),
        async || {
            let row: Option<(String, f64)> = sqlx::query_as(
                "SELECT reason, extract(epoch FROM paused_until - now())::float8
                 FROM channel_pauses WHERE channel = 'email' AND paused_until > now()",
            )
            .fetch_optional(&p.pool)
            .await
            .unwrap();
            row.ok_or(())
        },
    )
    .await;
    assert!(paused.0.starts_with("email_providers_open"), "{paused:?}");
    assert!(
        paused.1 > 0.0 && paused.1 <= cooldown.as_secs_f64(),
        "paused until the first breaker admits again: {paused:?}"
    );
    // Several pause cycles with both still down: each ends with one probe (a real call,
    // refused) and the others woken and given back. Three more refused probes show three
    // cycles passed.
    let probes = || p.smtp_sim.mail_commands() + backup.mail_commands();
    let before = probes();
    eventually(
        "three more pause cycles, each ending in a refused probe",
        Duration::from_secs(30),
        async || match probes() - before {
            n if n >= 3 => Ok(()),
            n => Err(n),
        },
    )
    .await;

    // Both recover; once the pause ends the probe goes out and the emails with it.
    p.smtp_sim.set_fault(None);
    backup.set_fault(None);
    let done = p.wait_final(&ev.event_id, 60).await;
    assert!(
        done.deliveries.iter().all(|d| d.status == "sent"),
        "{done:?}"
    );
    // user, attempts, max_attempts, attempt rows, rows naming a provider, retry rows,
    // delivery.deferred webhooks, delivery.sent webhooks
    type PerDelivery = (String, i32, i32, i64, i64, i64, i64, i64);
    let rows: Vec<PerDelivery> = p
        .rows(
            "SELECT d.user_id, d.attempts, d.max_attempts,
                (SELECT count(*) FROM delivery_attempts a WHERE a.delivery_id = d.id),
                (SELECT count(*) FROM delivery_attempts a WHERE a.delivery_id = d.id
                                                            AND a.provider_name IS NOT NULL),
                (SELECT count(*) FROM delivery_attempts a WHERE a.delivery_id = d.id
                                                            AND a.outcome = 'retry'),
                (SELECT count(*) FROM webhook_messages w WHERE w.delivery_id = d.id
                                                           AND w.event_type = 'delivery.deferred'),
                (SELECT count(*) FROM webhook_messages w WHERE w.delivery_id = d.id
                                                           AND w.event_type = 'delivery.sent')
         FROM notification_deliveries d WHERE d.event_id = $1::uuid ORDER BY d.user_id",
            &ev.event_id,
        )
        .await;
    assert_eq!(rows.len(), users.len());
    let open_rows: i64 = p
        .query_scalar(
            "SELECT count(*) FROM delivery_attempts WHERE error_code = 'email_providers_open'",
        )
        .await;
    assert_eq!(open_rows, 0, "a pass that called no provider is no attempt");
    for (user, attempts, max_attempts, rows, called, retries, deferred, sent) in &rows {
        assert_eq!(
            (*attempts as i64, *rows),
            (*called, *called),
            "{user}: attempts = attempt rows = provider calls"
        );
        assert_eq!(
            *max_attempts, 5,
            "{user}: no budget given back: none was taken"
        );
        assert_eq!(
            (*deferred, *sent),
            (*retries, 1),
            "{user}: one delivery.deferred per refused call, one delivery.sent"
        );
    }
    let total_calls: i64 = rows.iter().map(|r| r.4).sum();
    let mail_commands = p.smtp_sim.mail_commands() + backup.mail_commands();
    assert!(
        total_calls as usize <= mail_commands,
        "every attempt row is a provider call: {total_calls} rows, {mail_commands} MAIL commands"
    );

    assert_eq!(
        p.smtp_sim.messages().len() + backup.messages().len(),
        users.len(),
        "each email accepted once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_550_5_1_1_on_the_primary_does_not_fail_over_and_marks_the_address() {
    let (backup, backup_url) = backup_smtp().await;
    let p = Platform::start_with(
        Options::workers(&[Channel::Email])
            .smtp_sim(true)
            .email_backups(vec![backup_url]),
    )
    .await;
    p.add_type("order_paid", &["email"]).await;
    let gone = uniq("g");
    p.add_recipient(&gone, "", &format!("nouser-{gone}@example.test"), "")
        .await;
    let ev = p.send("g:1", "order_paid", &[&gone]).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let d = &done.deliveries[0];
    assert_eq!((d.status.as_str(), d.attempts), ("failed", 1), "{d:?}");
    assert!(d.last_error.starts_with("address_undeliverable"), "{d:?}");
    assert_eq!(backup.mail_commands(), 0, "never sent elsewhere");
    let ev = p.send("g:2", "order_paid", &[&gone]).await;
    assert_eq!(ev.skipped[0].reason, "email_undeliverable");
}

/// An http-api that trusts the simulator's SNS certificate, with its base URL.
async fn trusting_http_api(p: &mut Platform) -> String {
    let mut cfg = support::http_config(&p.stack, &p.topology);
    cfg.email_events.sns_cert_url_prefix = Some(format!("{}/_sim/sns/", p.sim_url));
    p.start_http_api(cfg).await
}

/// SES reports a complaint about `address` to the http-api at `http`; asserts the
/// webhook was taken (200).
async fn complain(p: &Platform, http: &str, address: &str) {
    let r = notify(p, http, json!({"event": "Complaint", "address": address})).await;
    assert_eq!(r["status"], 200, "{r}");
}

/// Has the simulator post an SNS notification of `event` about `address` to `http`.
async fn notify(p: &Platform, http: &str, body: Value) -> Value {
    let mut body = body;
    body["url"] = json!(format!("{http}/webhooks/email/ses"));
    p.http
        .post(format!("{}/_sim/ses/notify", p.sim_url))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn marked(p: &Platform, user: &str) -> bool {
    p.scalar(
        "SELECT email_undeliverable_at IS NOT NULL FROM recipients WHERE user_id = $1",
        user,
    )
    .await
}

async fn count(p: &Platform, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(&p.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_bounce_marks_the_address_and_a_forged_one_is_refused_and_writes_nothing() {
    let mut p = Platform::start_with_workers(&[]).await;
    let http = trusting_http_api(&mut p).await;
    p.add_type("order_paid", &["email"]).await;
    let (user, address) = p.add_email_recipient("b").await;

    let forged = notify(
        &p,
        &http,
        json!({"event": "Bounce", "address": address, "forge": true}),
    )
    .await;
    assert_eq!(forged["status"], 401, "{forged}");
    let refusal: Value = serde_json::from_str(forged["body"].as_str().unwrap()).unwrap();
    assert_eq!(refusal["error"]["code"], "invalid_signature");
    assert_eq!(
        refusal["error"]["field"], "Signature",
        "names SNS's field: {refusal}"
    );
    assert!(!marked(&p, &user).await);
    assert_eq!(count(&p, "email_feedback").await, 0);
    // The platform's own http-api does not trust the simulator's certificate URL.
    let untrusted = notify(
        &p,
        &p.http_url.clone(),
        json!({"event": "Bounce", "address": address}),
    )
    .await;
    assert_eq!(untrusted["status"], 401, "{untrusted}");
    assert_eq!(count(&p, "email_feedback").await, 0);

    let ok = notify(
        &p,
        &http,
        json!({"event": "Bounce", "address": address, "bounce_type": "Permanent"}),
    )
    .await;
    assert_eq!(ok["status"], 200, "{ok}");
    assert!(marked(&p, &user).await);
    let ev = p.send("b:1", "order_paid", &[&user]).await;
    assert_eq!(ev.skipped[0].reason, "email_undeliverable");

    // Soft bounces: the third within 30 days suppresses the address.
    let (soft, soft_address) = p.add_email_recipient("s").await;
    for i in 1..=3 {
        let r = notify(
            &p,
            &http,
            json!({"event": "Bounce", "address": soft_address, "bounce_type": "Transient"}),
        )
        .await;
        assert_eq!(r["status"], 200);
        let suppressed: i64 = p
            .scalar(
                "SELECT count(*) FROM email_suppressions WHERE address = $1 AND category = 'all'",
                &soft_address,
            )
            .await;
        assert_eq!(suppressed, i64::from(i == 3), "after {i} soft bounces");
    }
    assert!(
        !marked(&p, &soft).await,
        "soft bounces do not mark the address"
    );
    let ev = p.send("s:1", "order_paid", &[&soft]).await;
    assert_eq!(ev.skipped[0].reason, "suppressed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_subscription_confirmation_is_confirmed_and_a_forged_one_is_not() {
    let mut p = Platform::start_with_workers(&[]).await;
    let http = trusting_http_api(&mut p).await;

    let forged = notify(
        &p,
        &http,
        json!({"event": "SubscriptionConfirmation", "address": "", "forge": true}),
    )
    .await;
    assert_eq!(forged["status"], 401, "{forged}");
    assert_eq!(p.sim_count("sns").await, 0, "a forged one is not confirmed");

    let signed = notify(
        &p,
        &http,
        json!({"event": "SubscriptionConfirmation", "address": ""}),
    )
    .await;
    assert_eq!(signed["status"], 200, "{signed}");
    let confirmed = p.sim_requests("sns").await;
    assert_eq!(
        confirmed.len(),
        1,
        "its SubscribeURL fetched once: {confirmed:?}"
    );
    let q = &confirmed[0]["body"];
    assert_eq!(q["Action"], "ConfirmSubscription");
    assert_eq!(q["TopicArn"], provider_sim::ses::TOPIC_ARN);
    assert_eq!(q["Token"].as_str().map(str::len), Some(32), "{q}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complaint_suppresses_marketing_email_only() {
    let mut p = Platform::start_with_workers(&[]).await;
    let http = trusting_http_api(&mut p).await;
    p.add_type("order_paid", &["email"]).await;
    p.add_marketing_type().await;
    let (user, address) = p.add_email_recipient("c").await;
    complain(&p, &http, &address).await;

    let ev = p.send("c:1", "promo_weekly", &[&user]).await;
    assert!(ev.deliveries.is_empty());
    assert_eq!(ev.skipped[0].reason, "suppressed");
    let ev = p.send("c:2", "order_paid", &[&user]).await;
    assert_eq!(ev.deliveries.len(), 1, "transactional email still goes out");
    assert!(ev.skipped.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_removes_and_adds_suppressions_with_audit() {
    use support::{csrf_token, no_redirects};
    let mut p = Platform::start_with_workers(&[]).await;
    let http_api = trusting_http_api(&mut p).await;
    p.add_marketing_type().await;
    let (user, address) = p.add_email_recipient("k").await;
    complain(&p, &http_api, &address).await;

    let http = no_redirects();
    let url = |path: &str| format!("{}{path}", p.http_url);
    let cookie = p.console_cookie().await;
    let list = p.console_page(&cookie, "/console/email").await;
    assert!(
        list.contains(&format!(
            "<td>{user}</td><td>{address}</td><td>marketing</td><td>complaint</td><td>ses</td>"
        )),
        "{list}"
    );
    let id: i64 = p
        .scalar(
            "SELECT id FROM email_suppressions WHERE user_id = $1",
            &user,
        )
        .await;
    let confirm = p
        .console_page(&cookie, &format!("/console/email/confirm-remove/{id}"))
        .await;
    assert!(
        confirm.contains("Remove the marketing suppression"),
        "{confirm}"
    );
    // Without the CSRF token nothing is removed.
    let refused = http
        .post(url(&format!("/console/actions/suppressions/{id}/remove")))
        .header("cookie", &cookie)
        .form(&[("csrf", "forged")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert_eq!(count(&p, "email_suppressions").await, 1);
    let done = p
        .console_post(
            &cookie,
            &format!("/console/actions/suppressions/{id}/remove"),
            &confirm,
        )
        .await;
    assert_eq!(done.status(), 303);
    assert_eq!(count(&p, "email_suppressions").await, 0);
    let ev = p.send("k:1", "promo_weekly", &[&user]).await;
    assert_eq!(
        ev.deliveries.len(),
        1,
        "marketing email goes out again: {ev:?}"
    );

    // Added back by hand, for the address.
    let confirm = p
        .console_page(
            &cookie,
            &format!("/console/email/confirm-add?user_id=&address={address}&category=all"),
        )
        .await;
    let done = http
        .post(url("/console/actions/suppressions/add"))
        .header("cookie", &cookie)
        .form(&[
            ("csrf", csrf_token(&confirm).as_str()),
            ("user_id", ""),
            ("address", address.as_str()),
            ("category", "all"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 303);
    let ev = p.send("k:2", "promo_weekly", &[&user]).await;
    assert_eq!(ev.skipped[0].reason, "suppressed");
    let audit: Vec<(String, String, String)> = p.query_rows("SELECT staff, action, target FROM console_audit WHERE action LIKE 'suppression_%' ORDER BY id").await;
    assert_eq!(
        audit,
        [
            (
                support::CONSOLE_USER.to_string(),
                "suppression_remove".to_string(),
                format!("{user}/{address}")
            ),
            (
                support::CONSOLE_USER.to_string(),
                "suppression_add".to_string(),
                format!("/{address}")
            ),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complaint_before_the_due_time_skips_the_held_marketing_email() {
    let mut p = Platform::start_with(Options::workers(&[Channel::Email]).smtp_sim(true)).await;
    let http_api = trusting_http_api(&mut p).await;
    p.add_marketing_type().await;
    let (user, address) = p.add_email_recipient("h").await;
    // Held by a quiet window around now, so it is decided again when due.
    let now = chrono::Utc::now().with_timezone(&chrono_tz::Asia::Bangkok);
    p.set_quiet_hours(
        &user,
        now - chrono::Duration::hours(1),
        now + chrono::Duration::hours(1),
    )
    .await;
    let ev = p.send("h:1", "promo_weekly", &[&user]).await;
    assert_eq!(ev.deliveries[0].status, "pending", "{ev:?}");

    complain(&p, &http_api, &address).await;
    p.set_quiet_hours(
        &user,
        now - chrono::Duration::hours(3),
        now - chrono::Duration::hours(2),
    )
    .await;
    p.make_due_now(&ev.event_id).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    let d = &done.deliveries[0];
    assert_eq!(
        (d.status.as_str(), d.last_error.as_str()),
        ("skipped", "suppressed"),
        "{d:?}"
    );
    assert!(
        d.decision.contains("email: suppressed since "),
        "{}",
        d.decision
    );
    assert!(p.smtp_sim.messages().is_empty(), "no email was sent");
}
