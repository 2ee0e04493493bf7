//! The operations console over HTTP: staff sign-in, search, the event page with the
//! provider's answer, a confirmed and audited retry, CSRF, escaping; and the staff
//! authentication promises: throttled sign-in, server-side sessions that sign-out revokes,
//! CSRF tokens bound to a session, the Origin check, security headers, Secure cookies.

use crate::support;

use notify_core::Channel;
use serde_json::json;
use std::time::Duration;
use support::{
    Platform, SendExt, console_login, csrf_token, hs256, no_redirects, session_cookie,
    status_attempts,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_failed_line_delivery_and_retries_it() {
    let p = Platform::start_with_workers(&[Channel::Line]).await;
    let http = no_redirects();
    let url = |path: &str| format!("{}{path}", p.http_url);

    // Not signed in: sent to the sign-in page; an end-user token does not help.
    let r = http.get(url("/console")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/console/login");
    let user_token = hs256(
        &json!({"sub": "ops", "exp": chrono::Utc::now().timestamp() + 300}),
        support::INBOX_SECRET,
    );
    let r = http
        .get(url("/console"))
        .bearer_auth(&user_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "inbox tokens are not console sessions");
    let r = http
        .post(url("/console/login"))
        .form(&[("user", support::CONSOLE_USER), ("password", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = console_login(&http, &p.http_url).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let cookie = session_cookie(&r);
    assert!(
        r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("HttpOnly")
    );
    let get = |path: String| {
        let req = http.get(url(&path)).header("cookie", &cookie);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (s, overview) = get("/console".into()).await;
    assert_eq!(s, 200);
    assert!(overview.contains("Outbox lag"));

    // A LINE delivery fails with the provider's error text.
    p.add_type("order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": lid, "status": 400, "times": 1,
                       "body": {"message": "The property, 'to', in the request body is invalid"}}),
    )
    .await;
    let key = format!("order:<b>{u}</b>");
    let mut req = p.event(&key, "order_paid", &[&u]);
    req.content.as_mut().unwrap().title = "<script>alert(1)</script>".into();
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "failed");

    // Find it by key; the event page shows the failure and the provider's answer, escaped.
    let (_, found) = get(format!("/console/search?q={}", urlencoding(&key))).await;
    assert!(
        found.contains(&format!("/console/events/{}", ev.event_id)),
        "{found}"
    );
    let (_, page) = get(format!("/console/events/{}", ev.event_id)).await;
    assert!(page.contains("class=\"failed\">failed"), "{page}");
    assert!(
        page.contains("The property, &#39;to&#39;, in the request body is invalid"),
        "{page}"
    );
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(
        !page.contains("<script>alert(1)</script>"),
        "everything is escaped"
    );
    let delivery = &done.deliveries[0].delivery_id;
    assert!(page.contains(&format!(
        "/console/confirm?action=retry&amp;target={delivery}"
    )));

    // Confirm, with the CSRF token from the confirmation page; a forged form is refused.
    let (_, confirm) = get(format!("/console/confirm?action=retry&target={delivery}")).await;
    let csrf = csrf_token(&confirm);
    let post = |token: &str| {
        http.post(url(&format!("/console/actions/retry/{delivery}")))
            .header("cookie", &cookie)
            .form(&[("csrf", token)])
            .send()
    };
    assert_eq!(post("forged").await.unwrap().status(), 403);
    let r = post(&csrf).await.unwrap();
    assert_eq!(r.status(), 303);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(status_attempts(&done.deliveries[0]), ("sent", 2));
    let (_, page) = get(format!("/console/events/{}", ev.event_id)).await;
    assert!(page.contains("class=\"sent\">sent"));
    let (_, audit) = get("/console/audit".into()).await;
    assert!(
        audit.contains("retry_delivery")
            && audit.contains(delivery)
            && audit.contains(support::CONSOLE_USER),
        "{audit}"
    );
}

fn urlencoding(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The overview shows the dead-letter queue's depth; the confirmed, audited action moves
/// delivery pointers back to their queue (a worker then sends them) and leaves anything
/// that is not a pointer where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_moved_back_to_their_queue() {
    let mut p = Platform::start_with_type(&[], "order_paid", &["line"]).await;
    let (u, _) = p.add_line_recipient("u").await;
    let ev = p.send("dlq", "order_paid", &[&u]).await;
    let delivery = ev.deliveries[0].delivery_id.clone();
    // Its pointer, a version-2 batch naming it again and one unreadable message sit in the
    // dead-letter queue.
    let (_conn, ch) = p.amqp().await;
    p.topology.declare(&ch, &["line"]).await.unwrap();
    // Wait for the relay to publish the pointer, then drop it, as if it had been
    // dead-lettered.
    let queue = p.topology.queue("line");
    p.wait_queue_depth(
        &queue,
        1,
        "the relay published the pointer",
        Duration::from_secs(10),
    )
    .await;
    let dead = p.topology.dead_letter_queue();
    for body in [
        json!({"v": 1, "delivery_id": delivery, "channel": "line"}).to_string(),
        json!({"v": 2, "channel": "line", "deliveries": [{"id": delivery}]}).to_string(),
        "not a pointer".to_string(),
    ] {
        ch.basic_publish(
            "".into(),
            dead.clone().into(),
            lapin::options::BasicPublishOptions::default(),
            body.as_bytes(),
            lapin::BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    ch.queue_purge(p.topology.queue("line").into(), Default::default())
        .await
        .unwrap();
    assert_eq!(p.queue_depth(&dead).await, 3);

    let http = no_redirects();
    let url = |path: &str| format!("{}{path}", p.http_url);
    let r = console_login(&http, &p.http_url).send().await.unwrap();
    let cookie = session_cookie(&r);
    let overview = p.console_page(&cookie, "/console").await;
    assert!(
        overview.contains("Dead-letter queue: <b class=\"failed\">3</b>"),
        "{overview}"
    );
    let confirm = p
        .console_page(
            &cookie,
            "/console/confirm?action=requeue-dead&target=00000000-0000-0000-0000-000000000000",
        )
        .await;
    let csrf = csrf_token(&confirm);
    let done = http
        .post(url("/console/actions/requeue-dead"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .text_body()
        .await;
    assert!(done.contains("2 moved back, 1 left"), "{done}");
    assert_eq!(p.queue_depth(&dead).await, 1, "the unreadable one stays");
    assert_eq!(p.queue_depth(&p.topology.queue("line")).await, 2);
    p.start_worker(Channel::Line);
    let final_ = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(final_.deliveries[0].status, "sent");
    p.wait_queue_depth(&queue, 0, "both pointers consumed", Duration::from_secs(10))
        .await;
    assert_eq!(p.sim_count("line").await, 1, "two pointers, one send");
    let audit: String = p
        .query_scalar("SELECT detail FROM console_audit WHERE action = 'requeue_dead_letters'")
        .await;
    assert_eq!(audit, "2 moved back, 1 left (not delivery pointers)");
}

/// Signs in from `from` (a loopback address: the throttle counts per client address);
/// returns the status, the `Retry-After` header and the session cookie (`name=value`).
async fn sign_in(
    base: &str,
    from: [u8; 4],
    user: &str,
    password: &str,
) -> (u16, Option<String>, Option<String>) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(std::net::IpAddr::from(from))
        .build()
        .unwrap();
    let r = http
        .post(format!("{base}/console/login"))
        .form(&[("user", user), ("password", password)])
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let cookie = header("set-cookie").map(|c| c.split(';').next().unwrap().to_string());
    (r.status().as_u16(), header("retry-after"), cookie)
}

/// The status of `GET path` with `cookie` (303 to the sign-in page when it is refused).
async fn get_with(base: &str, path: &str, cookie: &str) -> (u16, String) {
    let r = no_redirects()
        .get(format!("{base}{path}"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The CSRF token on a confirmation page seen with `cookie`.
async fn csrf_of(base: &str, cookie: &str) -> String {
    let (_, confirm) = get_with(
        base,
        "/console/confirm?action=cancel&target=00000000-0000-0000-0000-000000000001",
        cookie,
    )
    .await;
    csrf_token(&confirm)
}

const LOCAL: [u8; 4] = [127, 0, 0, 1];

/// Five wrong passwords for one name from one address: the sixth try for that name from
/// there is answered 429 with Retry-After, even with the right password, until the window
/// has passed (moved in the database, whose clock the throttle reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sixth_wrong_password_is_throttled() {
    let p = Platform::start_with_workers(&[]).await;
    let base = p.http_url.as_str();
    let from = [127, 0, 1, 10];
    for i in 0..5u8 {
        let (status, _, _) = sign_in(base, from, support::CONSOLE_USER, "wrong").await;
        assert_eq!(status, 401, "failure {}", i + 1);
    }
    let (status, retry_after, cookie) = sign_in(base, from, support::CONSOLE_USER, "wrong").await;
    assert_eq!(status, 429);
    let wait: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=900).contains(&wait), "{wait} s");
    assert!(cookie.is_none());
    let (status, _, cookie) =
        sign_in(base, from, support::CONSOLE_USER, support::CONSOLE_PASSWORD).await;
    assert_eq!(
        (status, cookie),
        (429, None),
        "the right password waits too"
    );
    // Another name from the same address is not held up.
    let (status, _, _) = sign_in(base, from, "someone-else", "wrong").await;
    assert_eq!(status, 401);
    // Fifteen minutes later (the windows moved back in time), the right password works.
    p.execute("UPDATE console_sign_in_counts SET ends_at = ends_at - interval '16 minutes'")
        .await;
    let (status, _, cookie) =
        sign_in(base, from, support::CONSOLE_USER, support::CONSOLE_PASSWORD).await;
    assert_eq!(status, 303);
    assert!(cookie.is_some());
    // The typed names are kept only as hashes.
    let kept: Vec<String> = p.query_scalars("SELECT key FROM console_sign_in_counts UNION ALL SELECT key FROM console_sign_in_addresses").await;
    assert!(kept.len() >= 4, "{kept:?}");
    assert!(
        kept.iter()
            .all(|k| !k.contains(support::CONSOLE_USER) && !k.contains("someone")),
        "{kept:?}"
    );
}

/// Twenty failures from one address under twenty names: that address is throttled, for
/// the real name and password too; another address signs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_sign_ins_from_one_address_are_throttled_whatever_the_name() {
    let p = Platform::start_with_workers(&[]).await;
    let base = p.http_url.as_str();
    let from = [127, 0, 2, 10];
    for i in 0..20 {
        let (status, _, _) = sign_in(base, from, &format!("guess-{i}"), "wrong").await;
        assert_eq!(status, 401, "guess {i}");
    }
    let (status, retry_after, _) =
        sign_in(base, from, support::CONSOLE_USER, support::CONSOLE_PASSWORD).await;
    assert_eq!(status, 429);
    assert!(retry_after.is_some());
    let (status, _, cookie) = sign_in(
        base,
        [127, 0, 2, 11],
        support::CONSOLE_USER,
        support::CONSOLE_PASSWORD,
    )
    .await;
    assert_eq!(status, 303);
    assert!(cookie.is_some());
}

/// Sends every (address, password) sign-in for [`support::CONSOLE_USER`] at once, spread
/// over `bases` (http-api replicas on one database); returns the statuses in that order.
async fn sign_in_burst(bases: &[&str], tries: &[([u8; 4], &str)]) -> Vec<u16> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(tries.len()));
    let tasks: Vec<_> = tries
        .iter()
        .enumerate()
        .map(|(i, &(from, password))| {
            let (base, password) = (bases[i % bases.len()].to_string(), password.to_string());
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                sign_in(&base, from, support::CONSOLE_USER, &password)
                    .await
                    .0
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// How many of `statuses` are `status`.
fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// 100 wrong passwords for one name from one address sent at once over two replicas,
/// with the right password five times among them: at most five wrong ones are checked
/// (401; only a check leads to a 401 or a sign-in), the rest answered 429 unchecked, and
/// nothing fails (the right passwords give their attempts back while wrong ones take
/// theirs, on the same rows). Whatever the right passwords did, the window then holds
/// exactly five checked wrong passwords: wrong ones sent after the burst make it up to
/// five and no more, and then the right password from that address waits on both
/// replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_wrong_passwords_gets_no_more_checks_than_the_limit() {
    let mut p = Platform::start_with_workers(&[]).await;
    let replica = p
        .start_http_api(support::http_config(&p.stack, &p.topology))
        .await;
    let bases = [p.http_url.as_str(), replica.as_str()];
    let from = [127, 0, 3, 10];
    let mut tries = vec![(from, "wrong"); 100];
    for at in [10, 30, 50, 70, 90] {
        tries.insert(at, (from, support::CONSOLE_PASSWORD));
    }
    let statuses = sign_in_burst(&bases, &tries).await;
    let (checked, signed_in, refused) = (
        count(&statuses, 401),
        count(&statuses, 303),
        count(&statuses, 429),
    );
    assert_eq!(checked + signed_in + refused, 105, "{statuses:?}");
    assert!(
        checked <= 5,
        "{checked} wrong passwords checked: {statuses:?}"
    );
    assert!(checked + signed_in >= 5, "{statuses:?}");
    let mut later = 0;
    for i in 0..6 {
        let (status, _, _) = sign_in(bases[i % 2], from, support::CONSOLE_USER, "wrong").await;
        assert!([401, 429].contains(&status), "{status}");
        later += usize::from(status == 401);
    }
    assert_eq!(checked + later, 5, "burst {checked}, after it {later}");
    for base in bases {
        let (status, retry_after, cookie) =
            sign_in(base, from, support::CONSOLE_USER, support::CONSOLE_PASSWORD).await;
        assert_eq!((status, cookie), (429, None));
        assert!(retry_after.is_some());
    }
    let count: i32 = p
        .query_scalar("SELECT count FROM console_sign_in_counts WHERE key LIKE 'pair:%'")
        .await;
    assert_eq!(
        count, 5,
        "the window holds the five wrong passwords checked"
    );
}

/// An attacker's wrong passwords from one address lock out only that address: the same
/// staff member signs in from another. Guessing from many addresses at once is capped by
/// the name's slower bound from every address (50 a day): of 100 wrong passwords from 100
/// addresses only what is left of the 50 is checked, and a new address then waits even
/// with the right password, while an address the staff member signed in from still
/// signs in. A day later (moved in the database) the new address signs in too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attacker_at_one_address_does_not_lock_the_staff_member_out_elsewhere() {
    let p = Platform::start_with_workers(&[]).await;
    let base = p.http_url.as_str();
    let attacker = [127, 0, 4, 10];
    let statuses = sign_in_burst(&[base], &[(attacker, "wrong"); 100]).await;
    assert_eq!(
        (count(&statuses, 401), count(&statuses, 429)),
        (5, 95),
        "{statuses:?}"
    );
    let (status, _, _) = sign_in(
        base,
        attacker,
        support::CONSOLE_USER,
        support::CONSOLE_PASSWORD,
    )
    .await;
    assert_eq!(status, 429, "the attacker's address waits");
    let usual = [127, 0, 4, 11];
    let (status, _, cookie) = sign_in(
        base,
        usual,
        support::CONSOLE_USER,
        support::CONSOLE_PASSWORD,
    )
    .await;
    assert_eq!(
        status, 303,
        "the staff member signs in from another address"
    );
    assert!(cookie.is_some());

    // 100 addresses, one wrong password each, at once: 45 more are checked (the name had
    // 5 of its 50 used; the right password gave its attempt back).
    let many: Vec<([u8; 4], &str)> = (0..100u8).map(|i| ([127, 0, 5, 10 + i], "wrong")).collect();
    let statuses = sign_in_burst(&[base], &many).await;
    assert_eq!(
        (count(&statuses, 401), count(&statuses, 429)),
        (45, 55),
        "{statuses:?}"
    );
    let new = [127, 0, 6, 10];
    let (status, retry_after, _) =
        sign_in(base, new, support::CONSOLE_USER, support::CONSOLE_PASSWORD).await;
    assert_eq!(status, 429, "a new address waits for the name's bound");
    let wait: u64 = retry_after.unwrap().parse().unwrap();
    assert!((900..=86_400).contains(&wait), "{wait} s");
    let (status, _, _) = sign_in(
        base,
        usual,
        support::CONSOLE_USER,
        support::CONSOLE_PASSWORD,
    )
    .await;
    assert_eq!(
        status, 303,
        "a known address is not held back by the name's bound"
    );

    p.execute("UPDATE console_sign_in_counts SET ends_at = ends_at - interval '25 hours'")
        .await;
    let (status, _, _) = sign_in(base, new, support::CONSOLE_USER, support::CONSOLE_PASSWORD).await;
    assert_eq!(status, 303, "a day later the new address signs in");
}

/// Signing out deletes the session: the old cookie is refused by the same service, and by
/// a freshly started one (a restart, or another replica) that accepted it before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cookie_from_before_sign_out_is_refused_even_after_a_restart() {
    let mut p = Platform::start_with_workers(&[]).await;
    let base = p.http_url.clone();
    let (_, _, cookie) = sign_in(
        &base,
        LOCAL,
        support::CONSOLE_USER,
        support::CONSOLE_PASSWORD,
    )
    .await;
    let cookie = cookie.unwrap();
    let restarted = p
        .start_http_api(support::http_config(&p.stack, &p.topology))
        .await;
    assert_eq!(get_with(&base, "/console", &cookie).await.0, 200);
    assert_eq!(
        get_with(&restarted, "/console", &cookie).await.0,
        200,
        "sessions are shared by every replica"
    );
    // Sign out, through the page and its form.
    let (status, page) = get_with(&base, "/console/logout", &cookie).await;
    assert_eq!(status, 200);
    assert!(page.contains("action=\"/console/logout\""), "{page}");
    let csrf = csrf_token(&page);
    let r = no_redirects()
        .post(format!("{base}/console/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert!(
        r.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    assert_eq!(get_with(&base, "/console", &cookie).await.0, 303);
    assert_eq!(get_with(&restarted, "/console", &cookie).await.0, 303);
    let after_restart = p
        .start_http_api(support::http_config(&p.stack, &p.topology))
        .await;
    let (status, _) = get_with(&after_restart, "/console", &cookie).await;
    assert_eq!(status, 303, "the old cookie is refused after a restart");
}

/// A session ends at its expiry, whatever the cookie's own Max-Age says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_is_refused() {
    let p = Platform::start_with_workers(&[]).await;
    let base = p.http_url.as_str();
    let (_, _, cookie) = sign_in(
        base,
        LOCAL,
        support::CONSOLE_USER,
        support::CONSOLE_PASSWORD,
    )
    .await;
    let cookie = cookie.unwrap();
    assert_eq!(get_with(base, "/console", &cookie).await.0, 200);
    let expires: chrono::DateTime<chrono::Utc> = p
        .query_scalar("SELECT expires_at FROM console_sessions")
        .await;
    let hours = (expires - chrono::Utc::now()).num_minutes() as f64 / 60.0;
    assert!((7.9..=8.0).contains(&hours), "8 hours: {hours}");
    p.execute("UPDATE console_sessions SET expires_at = now() - interval '1 second'")
        .await;
    assert_eq!(get_with(base, "/console", &cookie).await.0, 303);
}

/// The CSRF token belongs to the session it was shown in: the same staff member's token
/// from their other session is refused; the session's own is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csrf_token_from_another_session_is_refused() {
    let p = Platform::start_with_workers(&[]).await;
    let base = p.http_url.as_str();
    let sign = || {
        sign_in(
            base,
            LOCAL,
            support::CONSOLE_USER,
            support::CONSOLE_PASSWORD,
        )
    };
    let (a, b) = (sign().await.2.unwrap(), sign().await.2.unwrap());
    let (csrf_a, csrf_b) = (csrf_of(base, &a).await, csrf_of(base, &b).await);
    assert_ne!(csrf_a, csrf_b);
    let cancel = |cookie: &str, token: &str| {
        no_redirects()
            .post(format!(
                "{base}/console/actions/cancel/00000000-0000-0000-0000-000000000001"
            ))
            .header("cookie", cookie)
            .form(&[("csrf", token)])
            .send()
    };
    assert_eq!(cancel(&a, &csrf_b).await.unwrap().status(), 403);
    assert_eq!(cancel(&b, &csrf_a).await.unwrap().status(), 403);
    let audited: i64 = p.query_scalar("SELECT count(*) FROM console_audit").await;
    assert_eq!(audited, 0, "nothing was done");
    assert_eq!(cancel(&a, &csrf_a).await.unwrap().status(), 303);
}

/// A POST whose Origin (or Referer) is another site is refused with 403 before anything
/// happens, sign-in included; the console's own origin passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_action_from_a_foreign_origin_is_refused() {
    let p = Platform::start_with_workers(&[]).await;
    let base = p.http_url.as_str();
    let http = no_redirects();
    let login = |origin: Option<(&'static str, String)>| {
        let mut req = console_login(&http, base);
        if let Some((name, value)) = origin {
            req = req.header(name, value);
        }
        req.send()
    };
    let r = login(Some(("origin", "https://evil.example".into())))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("set-cookie").is_none());
    let r = login(Some(("referer", "https://evil.example/page".into())))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = login(Some(("origin", "null".into()))).await.unwrap();
    assert_eq!(r.status(), 403);
    // The same host and port over another scheme is another origin (RFC 6454).
    let r = login(Some(("origin", base.replacen("http://", "https://", 1))))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = login(Some(("origin", base.to_string()))).await.unwrap();
    assert_eq!(r.status(), 303);
    let cookie = session_cookie(&r);
    let csrf = csrf_of(base, &cookie).await;
    let cancel = |origin: String| {
        http.post(format!(
            "{base}/console/actions/cancel/00000000-0000-0000-0000-000000000001"
        ))
        .header("cookie", &cookie)
        .header("origin", origin)
        .form(&[("csrf", csrf.as_str())])
        .send()
    };
    let r = cancel("https://evil.example".into()).await.unwrap();
    assert_eq!(r.status(), 403);
    let audited: i64 = p.query_scalar("SELECT count(*) FROM console_audit").await;
    assert_eq!(audited, 0, "nothing was done");
    assert_eq!(cancel(base.to_string()).await.unwrap().status(), 303);
}

/// Console pages and the unsubscribe page carry a CSP that forbids framing, plus
/// X-Frame-Options and nosniff; the session cookie is Secure unless the local-development
/// exception is set (the test platform sets it, a default configuration does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_pages_cannot_be_framed_and_the_cookie_is_secure_by_default() {
    let mut p = Platform::start_with_workers(&[]).await;
    let base = p.http_url.clone();
    let token = notify_core::signed::UnsubscribeToken {
        user_id: "u".into(),
        type_key: "promo".into(),
        channel: "email".into(),
        issued_at: chrono::Utc::now().timestamp(),
    }
    .sign(support::UNSUBSCRIBE_SECRET);
    for path in [
        "/console/login".to_string(),
        "/console".to_string(),
        format!("/unsubscribe?token={token}"),
    ] {
        let r = no_redirects()
            .get(format!("{base}{path}"))
            .send()
            .await
            .unwrap();
        let h = r.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(csp.contains("default-src 'none'"), "{path}: {csp}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
    }
    let local = console_login(&no_redirects(), &base).send().await.unwrap();
    let local = local.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(!local.contains("Secure"), "{local}");
    assert!(local.contains("HttpOnly") && local.contains("SameSite=Strict"));
    let mut cfg = support::http_config(&p.stack, &p.topology);
    cfg.console.insecure_cookies = false;
    let secure = p.start_http_api(cfg).await;
    let r = console_login(&no_redirects(), &secure)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    assert!(
        cookie.contains("; Secure")
            && cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
}
