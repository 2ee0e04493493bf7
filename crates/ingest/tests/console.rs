//! The operations console over HTTP: staff sign-in, search, the event page with the
//! provider's answer, a confirmed and audited retry, CSRF, escaping.

mod support;

use notify_core::Channel;
use serde_json::json;
use support::{Options, Platform, line_id, uniq};

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_failed_line_delivery_and_retries_it() {
    let p = Platform::start_with(Options {
        workers: vec![Channel::Line],
        ..Default::default()
    })
    .await;
    let http = no_redirects();
    let url = |path: &str| format!("{}{path}", p.http_url);

    // Not signed in: sent to the sign-in page; an end-user token does not help.
    let r = http.get(url("/console")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/console/login");
    let user_token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &json!({"sub": "ops", "exp": chrono::Utc::now().timestamp() + 300}),
        &jsonwebtoken::EncodingKey::from_secret(support::INBOX_SECRET.as_bytes()).unwrap(),
    )
    .unwrap();
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
    let r = http
        .post(url("/console/login"))
        .form(&[
            ("user", support::CONSOLE_USER),
            ("password", support::CONSOLE_PASSWORD),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
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
    let (u, lid) = (uniq("u"), line_id());
    p.add_recipient(&u, "", "", &lid).await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": lid, "status": 400, "times": 1,
                       "body": {"message": "The property, 'to', in the request body is invalid"}}),
    )
    .await;
    let key = format!("order:<b>{u}</b>");
    let mut req = p.event(&key, "order_paid", &[&u]);
    req.content.as_mut().unwrap().title = "<script>alert(1)</script>".into();
    let ev = p.ingest().create_event(req).await.unwrap().into_inner();
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
    let csrf = confirm
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
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
    assert_eq!(
        (
            done.deliveries[0].status.as_str(),
            done.deliveries[0].attempts
        ),
        ("sent", 2)
    );
    let (_, page) = get(format!("/console/events/{}", ev.event_id)).await;
    assert!(page.contains("class=\"sent\">sent"));
    let (_, audit) = get("/console/audit".into()).await;
    assert!(
        audit.contains("retry_delivery")
            && audit.contains(delivery)
            && audit.contains(support::CONSOLE_USER),
        "{audit}"
    );
    p.stop().await;
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
    let mut p = Platform::start_with(Options {
        workers: vec![],
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["line"]).await;
    let (u, lid) = (uniq("u"), line_id());
    p.add_recipient(&u, "", "", &lid).await;
    let ev = p.send("dlq", "order_paid", &[&u]).await;
    let delivery = ev.deliveries[0].delivery_id.clone();
    // Its pointer and one unreadable message sit in the dead-letter queue.
    let (_conn, ch) = p.amqp().await;
    p.topology.declare(&ch, &["line"]).await.unwrap();
    // Wait for the relay to publish the pointer, then drop it, as if it had been
    // dead-lettered.
    for _ in 0..100 {
        if p.queue_depth(&p.topology.queue("line")).await == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let dead = p.topology.dead_letter_queue();
    for body in [
        json!({"v": 1, "delivery_id": delivery, "channel": "line"}).to_string(),
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
    assert_eq!(p.queue_depth(&dead).await, 2);

    let http = no_redirects();
    let url = |path: &str| format!("{}{path}", p.http_url);
    let r = http
        .post(url("/console/login"))
        .form(&[
            ("user", support::CONSOLE_USER),
            ("password", support::CONSOLE_PASSWORD),
        ])
        .send()
        .await
        .unwrap();
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let overview = http
        .get(url("/console"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        overview.contains("Dead-letter queue: <b class=\"failed\">2</b>"),
        "{overview}"
    );
    let confirm = http
        .get(url(
            "/console/confirm?action=requeue-dead&target=00000000-0000-0000-0000-000000000000",
        ))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = confirm
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let done = http
        .post(url("/console/actions/requeue-dead"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(done.contains("1 moved back, 1 left"), "{done}");
    assert_eq!(p.queue_depth(&dead).await, 1, "the unreadable one stays");
    assert_eq!(p.queue_depth(&p.topology.queue("line")).await, 1);
    p.start_worker(Channel::Line);
    let final_ = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(final_.deliveries[0].status, "sent");
    let audit: String = sqlx::query_scalar(
        "SELECT detail FROM console_audit WHERE action = 'requeue_dead_letters'",
    )
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert_eq!(audit, "1 moved back, 1 left (not delivery pointers)");
    p.stop().await;
}
