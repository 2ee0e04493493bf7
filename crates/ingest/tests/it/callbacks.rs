//! What providers and mail clients call back on, through the HTTP service: the LINE
//! webhook (signed follow/unfollow events) and the one-click unsubscribe link of marketing
//! email (RFC 8058).

use crate::support;

use notify_core::Channel;
use notify_proto::v1 as pb;
use serde_json::{Value, json};
use std::time::Duration;
use support::{Options, Platform, SendExt, eventually, line_id, line_webhook, uniq};

/// Has the simulator send a LINE webhook with `events` to the HTTP service; returns the
/// receiver's (status, body).
async fn webhook(p: &Platform, events: Value, signature: Option<&str>) -> (u16, Value) {
    let mut req = json!({"url": format!("{}/webhooks/line", p.http_url), "events": events});
    if let Some(s) = signature {
        req["signature"] = json!(s);
    }
    let r: Value = p
        .http
        .post(format!("{}/_sim/line/webhook", p.sim_url))
        .json(&req)
        .json_body()
        .await;
    let body = serde_json::from_str(r["body"].as_str().unwrap()).unwrap_or(Value::Null);
    (r["status"].as_u64().unwrap() as u16, body)
}

fn follow_event(kind: &str, user: &str, at_ms: i64) -> Value {
    json!({
        "type": kind,
        "mode": "active",
        "timestamp": at_ms,
        "source": {"type": "user", "userId": user},
        "webhookEventId": format!("01H{at_ms}"),
        "deliveryContext": {"isRedelivery": false},
    })
}

/// The raw headers MailDev received for email `id`, unfolded, by lowercase name.
async fn raw_headers(p: &Platform, id: &str) -> std::collections::HashMap<String, String> {
    let raw = p
        .http
        .get(format!("{}/api/email/{id}/source", p.stack.maildev_url))
        .text_body()
        .await;
    let head = raw.replace("\r\n", "\n");
    let head = head.split_once("\n\n").unwrap().0.replace("\n ", " ");
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

fn line_skips(ev: &pb::CreateEventResponse) -> Vec<String> {
    ev.skipped
        .iter()
        .filter(|s| s.channel == "line")
        .map(|s| s.reason.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_user_who_unfollowed_is_skipped_until_they_follow_again() {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    let t0 = chrono::Utc::now().timestamp_millis();

    // A forged webhook is refused and changes nothing.
    let (status, body) = webhook(
        &p,
        json!([follow_event("unfollow", &lid, t0)]),
        Some("Zm9yZ2Vk"),
    )
    .await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["field"], "X-Line-Signature");
    assert_eq!(p.count("line_followers").await, 0);
    let ev = p.send("wh:0", "order_paid", &[&u]).await;
    assert!(line_skips(&ev).is_empty(), "{:?}", ev.skipped);

    // Unfollow (block): LINE deliveries are skipped with line_unfollowed.
    let (status, _) = webhook(&p, json!([follow_event("unfollow", &lid, t0)]), None).await;
    assert_eq!(status, 200);
    let ev = p.send("wh:1", "order_paid", &[&u]).await;
    assert!(ev.deliveries.is_empty());
    assert_eq!(line_skips(&ev), ["line_unfollowed"]);

    // Follow again, then a late redelivery of the older unfollow: still following.
    webhook(&p, json!([follow_event("follow", &lid, t0 + 1000)]), None).await;
    let (status, _) = webhook(&p, json!([follow_event("unfollow", &lid, t0)]), None).await;
    assert_eq!(status, 200);
    let ev = p.send("wh:2", "order_paid", &[&u]).await;
    assert_eq!(ev.deliveries.len(), 1, "{:?}", ev.skipped);
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent");

    // Events of other kinds and from groups are acknowledged and ignored.
    let (status, body) = webhook(
        &p,
        json!([
            {"type": "message", "timestamp": t0 + 2000, "source": {"type": "user", "userId": lid},
             "message": {"type": "text", "text": "สวัสดีครับ"}},
            {"type": "unfollow", "timestamp": t0 + 2000, "source": {"type": "group", "groupId": "C1"}},
        ]),
        None,
    )
    .await;
    assert_eq!((status, body), (200, json!({})));
    let ev = p.send("wh:3", "order_paid", &[&u]).await;
    assert_eq!(ev.deliveries.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_line_webhook_body_gets_a_json_400_naming_the_field() {
    let p = Platform::start_with_workers(&[]).await;
    let body = r#"{"destination":"U0","events":{}}"#;
    let r = line_webhook(&p, &p.http_url, body).await;
    assert_eq!(r.status(), 400);
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["field"], "events");
    let r = p
        .http
        .post(format!("{}/webhooks/line", p.http_url))
        .body(vec![b'x'; 2 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413, "bodies over 1 MiB are refused");
    let err: Value = r.json().await.unwrap();
    assert_eq!(
        err["error"]["code"], "body_too_large",
        "as JSON like every other error"
    );
}

/// Marketing email carries List-Unsubscribe and List-Unsubscribe-Post; a POST of
/// `List-Unsubscribe=One-Click` to that URL turns the type off on email, so the next event
/// skips it. Transactional email has no such header. A tampered token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marketing_email_unsubscribes_in_one_click() {
    let p = Platform::start_with_workers(&[Channel::Email]).await;
    p.add_marketing_type().await;
    p.add_type("order_paid", &["email"]).await;
    let u = uniq("u");
    let address = format!("{u}@example.test");
    p.add_recipient(&u, "สมชาย ใจดี", &address, "").await;

    let ev = p.send("promo:1", "promo_weekly", &[&u]).await;
    p.wait_final(&ev.event_id, 30).await;
    let ev = p.send("order:1", "order_paid", &[&u]).await;
    p.wait_final(&ev.event_id, 30).await;
    let mails = p.mails_to(&address).await;
    assert_eq!(mails.len(), 2);
    let mut heads = Vec::new();
    for m in &mails {
        heads.push(raw_headers(&p, m["id"].as_str().unwrap()).await);
    }
    let (promo, order): (Vec<_>, Vec<_>) = heads
        .into_iter()
        .partition(|h| h.contains_key("list-unsubscribe"));
    assert_eq!(
        (promo.len(), order.len()),
        (1, 1),
        "only the marketing email has List-Unsubscribe"
    );
    assert!(!order[0].contains_key("list-unsubscribe-post"));
    assert_eq!(
        promo[0]["list-unsubscribe-post"],
        "List-Unsubscribe=One-Click"
    );
    let link = promo[0]["list-unsubscribe"]
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>')
        .to_string();
    assert!(link.starts_with(&format!("{}/unsubscribe?token=", p.http_url)));

    // A GET (a mail scanner following the link) changes nothing.
    let page = p.http.get(&link).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("promo_weekly"));
    // A tampered token is refused.
    let bad = p
        .http
        .post(format!("{link}x"))
        .body("List-Unsubscribe=One-Click")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().await.unwrap();
    assert_eq!(err["error"]["field"], "token");
    let ev = p.send("promo:2", "promo_weekly", &[&u]).await;
    assert_eq!(
        ev.deliveries.len(),
        1,
        "still subscribed after GET and a forgery"
    );
    p.wait_final(&ev.event_id, 30).await;

    let ok = p
        .http
        .post(&link)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("List-Unsubscribe=One-Click")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let ok: Value = ok.json().await.unwrap();
    assert_eq!(ok["unsubscribed"], true);
    let ev = p.send("promo:3", "promo_weekly", &[&u]).await;
    assert!(ev.deliveries.is_empty());
    assert_eq!(ev.skipped[0].reason, "opted_out");
    let ev = p.send("order:2", "order_paid", &[&u]).await;
    assert_eq!(ev.deliveries.len(), 1, "other types still arrive");
}

/// SMTP rejections sorted by their reply: 550 5.1.1 fails at once and marks the address,
/// so later email is skipped with `email_undeliverable` until the address changes; 452 is
/// retried; 554 5.7.1 fails without marking the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nonexistent_mailbox_is_marked_and_skipped_until_the_address_changes() {
    let p = Platform::start_with(Options::workers(&[Channel::Email]).smtp_sim(true)).await;
    p.add_type("order_paid", &["email"]).await;
    let (gone, full, blocked) = (uniq("g"), uniq("f"), uniq("b"));
    p.add_recipient(&gone, "", &format!("nouser-{gone}@example.test"), "")
        .await;
    p.add_recipient(&full, "", &format!("full-{full}@example.test"), "")
        .await;
    p.add_recipient(&blocked, "", &format!("blocked-{blocked}@example.test"), "")
        .await;
    let ev = p
        .send("smtp:1", "order_paid", &[&gone, &full, &blocked])
        .await;
    // The full mailbox keeps retrying; wait for the other two and its first attempt.
    let by_user = |ev: &pb::GetEventResponse, u: &str| {
        ev.deliveries
            .iter()
            .find(|d| d.user_id == u)
            .unwrap()
            .clone()
    };
    let got = eventually(
        "two failed and the full mailbox retried",
        Duration::from_secs(60),
        async || {
            let got = p.get_event(&ev.event_id).await;
            if by_user(&got, &gone).status == "failed"
                && by_user(&got, &blocked).status == "failed"
                && by_user(&got, &full).attempts >= 2
            {
                Ok(got)
            } else {
                Err(got.deliveries)
            }
        },
    )
    .await;
    let d = by_user(&got, &gone);
    assert_eq!(d.attempts, 1);
    assert!(
        d.last_error
            .starts_with("address_undeliverable (provider status 550)"),
        "{d:?}"
    );
    let d = by_user(&got, &blocked);
    assert_eq!(d.attempts, 1);
    assert!(d.last_error.starts_with("smtp_rejected"), "{d:?}");
    assert!(
        by_user(&got, &full)
            .last_error
            .starts_with("smtp_transient")
    );
    assert!(p.smtp_sim.messages().is_empty(), "nothing was accepted");

    let ev = p.send("smtp:2", "order_paid", &[&gone, &blocked]).await;
    let reasons: Vec<(String, String)> = ev
        .skipped
        .iter()
        .map(|s| (s.user_id.clone(), s.reason.clone()))
        .collect();
    assert_eq!(reasons, [(gone.clone(), "email_undeliverable".to_string())]);
    assert_eq!(
        ev.deliveries.len(),
        1,
        "554 5.7.1 does not mark the address"
    );

    // The same address sent again by a profile sync keeps the mark; a new one clears it.
    let set_email = |email: String| {
        let r = p.recipients();
        let user = gone.clone();
        async move {
            let mut r = r;
            r.upsert_recipient(pb::UpsertRecipientRequest {
                user_id: user,
                email,
                ..Default::default()
            })
            .await
            .unwrap();
        }
    };
    set_email(format!("nouser-{gone}@example.test")).await;
    let ev = p.send("smtp:3", "order_paid", &[&gone]).await;
    assert_eq!(ev.skipped[0].reason, "email_undeliverable");
    set_email(format!("{gone}@example.test")).await;
    let ev = p.send("smtp:4", "order_paid", &[&gone]).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent");
    assert_eq!(p.smtp_sim.messages().len(), 1);
    assert_eq!(
        p.smtp_sim.messages()[0].to,
        [format!("{gone}@example.test")]
    );
}

/// An unsubscribe link older than `NOTIFY_UNSUBSCRIBE_TTL` (60 days), or from before links
/// carried their date, shows a page saying it expired (410) and its POST answers 410:
/// the user stays subscribed. A link of today works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_unsubscribe_link_changes_nothing() {
    let p = Platform::start_with_workers(&[]).await;
    p.add_marketing_type().await;
    let (u, _) = p.add_email_recipient("u").await;
    let now = chrono::Utc::now().timestamp();
    let token = |issued_at: i64| {
        notify_core::signed::UnsubscribeToken {
            user_id: u.clone(),
            type_key: "promo_weekly".into(),
            channel: "email".into(),
            issued_at,
        }
        .sign(support::UNSUBSCRIBE_SECRET)
    };
    // A token without a date, as links were signed before they expired.
    let legacy = {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let payload = b64.encode(json!({"u": u, "t": "promo_weekly", "c": "email"}).to_string());
        format!(
            "{payload}.{}",
            notify_core::signed::sign(support::UNSUBSCRIBE_SECRET, &payload)
        )
    };
    for old in [token(now - 61 * 86_400), legacy] {
        let url = format!("{}/unsubscribe?token={old}", p.http_url);
        let page = p.http.get(&url).send().await.unwrap();
        assert_eq!(page.status(), 410);
        let text = page.text().await.unwrap();
        assert!(
            text.contains("expired") && text.contains("nothing was changed"),
            "{text}"
        );
        let post = p
            .http
            .post(&url)
            .body("List-Unsubscribe=One-Click")
            .send()
            .await
            .unwrap();
        assert_eq!(post.status(), 410);
        let err: Value = post.json().await.unwrap();
        assert_eq!(
            (
                err["error"]["code"].as_str(),
                err["error"]["field"].as_str()
            ),
            (Some("expired_token"), Some("token"))
        );
    }
    let ev = p.send("promo:expired", "promo_weekly", &[&u]).await;
    assert_eq!(ev.deliveries.len(), 1, "still subscribed");
    let fresh = format!(
        "{}/unsubscribe?token={}",
        p.http_url,
        token(now - 59 * 86_400)
    );
    let ok = p
        .http
        .post(&fresh)
        .body("List-Unsubscribe=One-Click")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let ev = p.send("promo:fresh", "promo_weekly", &[&u]).await;
    assert!(ev.deliveries.is_empty());
}

/// `http-api` as a process, its log lines read: a LINE follow event and a refused console
/// sign-in leave neither the LINE user id nor the typed name in them. A console user
/// configured with an unsalted SHA-256 hash (older releases) stops it at start (exit 64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_webhook_and_a_refused_sign_in_log_no_line_id_or_typed_name() {
    let p = Platform::start_with_workers(&[]).await;
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let base = format!("http://{addr}");
    let env = |users: String| {
        vec![
            ("NOTIFY_HTTP_ADDR", addr.to_string()),
            (
                "NOTIFY_LINE_CHANNEL_SECRET",
                support::LINE_SECRET.to_string(),
            ),
            (
                "NOTIFY_UNSUBSCRIBE_SECRET",
                support::UNSUBSCRIBE_SECRET.to_string(),
            ),
            ("NOTIFY_INBOX_JWT_SECRET", support::INBOX_SECRET.to_string()),
            ("NOTIFY_CONSOLE_USERS", users),
            (
                "NOTIFY_CONSOLE_SECRET",
                "test-console-session-secret-32-chars-min".to_string(),
            ),
            ("NOTIFY_CONSOLE_INSECURE_COOKIES", "true".to_string()),
        ]
    };
    let sha256 = "19e94e330a8df66087d84e82781253b923fe45a54d67c2179312d9f2dc6df066";
    let mut old = p.spawn("http-api", &[], &env(format!("ops:{sha256}")));
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), old.child.wait())
        .await
        .expect("http-api exits")
        .unwrap();
    assert_eq!(
        status.code(),
        Some(64),
        "a SHA-256 hash is refused at start"
    );

    let users = format!(
        "ops:{}",
        http_api::console::password_hash(support::CONSOLE_PASSWORD)
    );
    let proc = p.spawn("http-api", &[], &env(users));
    eventually(
        "http-api started",
        Duration::from_secs(10),
        async || match reqwest::get(format!("{base}/healthz")).await {
            Ok(_) => Ok(()),
            Err(e) => Err((e.to_string(), proc.log())),
        },
    )
    .await;
    let lid = line_id();
    let body =
        json!({"destination": "Uxxx", "events": [follow_event("follow", &lid, 1_700_000_000_000)]})
            .to_string();
    let r = line_webhook(&p, &base, &body).await;
    assert_eq!(r.status(), 200);
    let typed = uniq("typed-name");
    let r = p
        .http
        .post(format!("{base}/console/login"))
        .form(&[("user", typed.as_str()), ("password", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let log = eventually("both log lines", Duration::from_secs(10), async || {
        let log = proc.log();
        if log.contains("LINE follow state") && log.contains("console sign-in refused") {
            Ok(log)
        } else {
            Err(log)
        }
    })
    .await;
    assert!(!log.contains(&lid), "the LINE user id is logged: {log}");
    assert!(!log.contains(&typed), "the typed name is logged: {log}");
}
