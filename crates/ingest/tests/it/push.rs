//! Push channel tests across FCM, APNs and Web Push against the provider simulator: dead
//! targets (F05), Web Push encryption and VAPID, error classes, and Thai bodies cut to
//! each provider's limit.

use crate::support;

use notify_core::Channel;
use notify_proto::v1 as pb;
use serde_json::{Value, json};
use std::time::Duration;
use support::{Platform, SendExt, eventually, uniq};

async fn push_platform() -> Platform {
    Platform::start_with_workers(&[Channel::Push]).await
}

async fn endpoint_state(p: &Platform, id: &str) -> (String, Option<String>) {
    p.row(
        "SELECT status, revoked_reason FROM notification_endpoints WHERE id = $1::uuid",
        id,
    )
    .await
}

fn by_endpoint<'a>(ev: &'a pb::GetEventResponse, endpoint_id: &str) -> &'a pb::Delivery {
    ev.deliveries
        .iter()
        .find(|d| d.endpoint_id == endpoint_id)
        .unwrap_or_else(|| panic!("no delivery to {endpoint_id}: {:?}", ev.deliveries))
}

/// Every push call the simulator saw, as (provider, target).
async fn push_calls(p: &Platform) -> Vec<(String, String)> {
    let mut calls = Vec::new();
    for provider in ["fcm", "apns", "webpush"] {
        for r in p.sim_requests(provider).await {
            let target = match provider {
                "fcm" => r["body"]["message"]["token"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                "apns" => r["path"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches("/3/device/")
                    .into(),
                _ => r["body"]["endpoint"].as_str().unwrap_or("").to_string(),
            };
            calls.push((provider.to_string(), target));
        }
    }
    calls
}

/// F05: six targets of one user on three push services. The four dead ones fail once with
/// `invalid_token` and are deactivated; the live ones are sent (B after a 503 retry, sub-case
/// a); the next event calls only the live ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_push_targets_on_every_service_are_removed_and_live_ones_kept() {
    let p = push_platform().await;
    p.add_type("order_paid", &["push"]).await;
    let u = p.add_bare_recipient("user-1001").await;
    let a = p
        .add_device(&u, &format!("unregistered-fcm-tok-A-{u}"))
        .await;
    let b_token = format!("fcm-tok-B-{u}");
    let b = p.add_device(&u, &b_token).await;
    // Registered 2025-04-01; APNs says it is gone since 2025-05-01.
    let c = p
        .add_endpoint(
            &u,
            "apns",
            &format!("unregistered-1746057600000-apns-tok-C-{u}"),
        )
        .await;
    p.exec("UPDATE notification_endpoints SET registered_at = '2025-04-01T00:00:00Z' WHERE id = $1::uuid", &c).await;
    let d = p
        .add_endpoint(&u, "apns", &format!("bad-apns-tok-D-{u}"))
        .await;
    let e_url = format!("https://push.example.test/sub/E-{u}");
    let e = p.add_webpush(&u, &e_url).await;
    p.webpush_unsubscribe(&e_url).await;
    let f_url = format!("https://push.example.test/sub/F-{u}");
    let f = p.add_webpush(&u, &f_url).await;
    // Sub-case (a): B is unavailable once.
    p.sim_fault(json!({
        "provider": "fcm", "target_contains": "fcm-tok-B-", "status": 503, "times": 1,
        "body": {"error": {"code": 503, "status": "UNAVAILABLE", "message": "try later",
                 "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "UNAVAILABLE"}]}}
    }))
    .await;

    let ev = p.send("f05:1", "order_paid", &[&u]).await;
    assert_eq!(ev.deliveries.len(), 6);
    let done = p.wait_final(&ev.event_id, 30).await;
    for id in [&a, &c, &d, &e] {
        let del = by_endpoint(&done, id);
        assert_eq!(
            (del.status.as_str(), del.attempts),
            ("failed", 1),
            "{del:?}"
        );
        assert!(del.last_error.starts_with("invalid_token"), "{del:?}");
        assert_eq!(
            endpoint_state(&p, id).await,
            ("revoked".to_string(), Some("invalid_token".to_string())),
            "{del:?}"
        );
    }
    let del_b = by_endpoint(&done, &b);
    assert_eq!(
        (del_b.status.as_str(), del_b.attempts),
        ("sent", 2),
        "503 is retried"
    );
    let del_f = by_endpoint(&done, &f);
    assert_eq!((del_f.status.as_str(), del_f.attempts), ("sent", 1));
    for id in [&b, &f] {
        assert_eq!(endpoint_state(&p, id).await.0, "active");
    }

    p.http
        .delete(format!("{}/_sim/requests", p.sim_url))
        .send()
        .await
        .unwrap();
    let ev2 = p.send("f05:2", "order_paid", &[&u]).await;
    assert_eq!(ev2.deliveries.len(), 2, "{:?}", ev2.deliveries);
    p.wait_final(&ev2.event_id, 30).await;
    let mut calls = push_calls(&p).await;
    calls.sort();
    assert_eq!(
        calls,
        vec![
            ("fcm".to_string(), b_token.clone()),
            ("webpush".to_string(), f_url.clone())
        ],
        "event 2 calls exactly B and F"
    );
}

/// F05 sub-case (b): a new subscription E2 registered while the send to E is in flight
/// is untouched by E's 410, and receives the next event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_registered_during_a_410_send_is_kept() {
    let p = push_platform().await;
    p.add_type("order_paid", &["push"]).await;
    let u = p.add_bare_recipient("user-1001").await;
    let e_url = format!("https://push.example.test/sub/E-{u}");
    let e = p.add_webpush(&u, &e_url).await;
    p.sim_fault(json!({"provider": "webpush", "target_contains": "/sub/E-", "status": 410, "delay_ms": 1500, "times": 1}))
        .await;
    let ev = p.send("f05b:1", "order_paid", &[&u]).await;
    // The send to E is in flight once the push service has it (its answer is 1.5 s away).
    eventually(
        "the send to E in flight",
        Duration::from_secs(10),
        async || {
            let calls = p.sim_requests("webpush").await;
            if calls.is_empty() { Err(calls) } else { Ok(()) }
        },
    )
    .await;
    let e2_url = format!("https://push.example.test/sub/E2-{u}");
    let e2 = p.add_webpush(&u, &e2_url).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(by_endpoint(&done, &e).status, "failed");
    assert_eq!(endpoint_state(&p, &e).await.0, "revoked");
    assert_eq!(endpoint_state(&p, &e2).await.0, "active");
    let ev2 = p.send("f05b:2", "order_paid", &[&u]).await;
    assert_eq!(ev2.deliveries.len(), 1);
    assert_eq!(ev2.deliveries[0].endpoint_id, e2);
    let done2 = p.wait_final(&ev2.event_id, 30).await;
    assert_eq!(done2.deliveries[0].status, "sent");
}

/// Web Push: the simulator decrypts the aes128gcm body with the subscription's keys back
/// to exactly the JSON the attempt recorded; VAPID, TTL, Urgency (from the type's
/// priority) and Topic are sent; one VAPID JWT serves both sends to the same origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_push_bodies_decrypt_to_the_exact_json_sent() {
    let p = push_platform().await;
    p.upsert_type(pb::UpsertNotificationTypeRequest {
        key: "security_login".into(),
        priority: "high".into(),
        default_channels: vec!["push".into()],
        critical: true,
        ..Default::default()
    })
    .await;
    let u = p.add_bare_recipient("u").await;
    let url = format!("https://push.example.test/sub/W-{u}");
    p.add_webpush(&u, &url).await;
    let mut ids = Vec::new();
    for key in ["wp:1", "wp:2"] {
        let ev = p.send(key, "security_login", &[&u]).await;
        let done = p.wait_final(&ev.event_id, 30).await;
        let del = &done.deliveries[0];
        assert_eq!(
            (del.status.as_str(), del.provider.as_str()),
            ("sent", "webpush"),
            "{del:?}"
        );
        assert!(
            del.provider_message_id
                .starts_with("/_sim/webpush/messages/")
        );
        ids.push((ev.event_id.clone(), del.delivery_id.clone()));
    }
    let seen = p.sim_requests("webpush").await;
    assert_eq!(seen.len(), 2);
    for (req, (event_id, delivery_id)) in seen.iter().zip(&ids) {
        assert_eq!(req["status"], 201);
        let content: Value = p
            .scalar(
                "SELECT content_json FROM delivery_attempts WHERE delivery_id = $1::uuid",
                delivery_id,
            )
            .await;
        let decrypted = &req["body"]["payload"];
        assert_eq!(decrypted, &content["payload"], "decrypted = recorded");
        assert_eq!(decrypted["title"], "ชำระเงินแล้ว #1001");
        assert_eq!(decrypted["data"]["event_id"], event_id.as_str());
        assert_eq!(
            serde_json::from_str::<Value>(req["body"]["plaintext"].as_str().unwrap()).unwrap(),
            *decrypted
        );
        let h = &req["headers"];
        assert_eq!(h["content-encoding"], "aes128gcm");
        assert_eq!(h["ttl"], "3600");
        assert_eq!(h["urgency"], "high");
        assert_eq!(h["topic"], event_id.replace('-', ""));
        assert!(h["authorization"].as_str().unwrap().starts_with("vapid t="));
    }
    assert_eq!(
        seen[0]["headers"]["authorization"], seen[1]["headers"]["authorization"],
        "the VAPID JWT is reused for the origin"
    );
}

/// Web Push answers sorted per RFC 8030: 503 and 429 retry, a timeout after the push
/// service accepted is an ambiguous retry (sent twice), 413 fails, 404 deactivates,
/// a VAPID key the subscription was not made with is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_push_errors_are_sorted_by_class() {
    let p = push_platform().await;
    p.add_type("order_paid", &["push"]).await;
    let cases: [(&str, Value, &str, u32, &str); 5] = [
        (
            "unavailable",
            json!({"status": 503, "times": 1}),
            "sent",
            2,
            "",
        ),
        (
            "slow",
            json!({"status": 201, "delay_ms": 6000, "times": 1}),
            "sent",
            2,
            "",
        ),
        (
            "toolarge",
            json!({"status": 413}),
            "failed",
            1,
            "payload_too_large",
        ),
        (
            "notfound",
            json!({"status": 404}),
            "failed",
            1,
            "invalid_token",
        ),
        (
            "badrequest",
            json!({"status": 400}),
            "failed",
            1,
            "webpush_rejected",
        ),
    ];
    let mut users = Vec::new();
    for (name, fault, ..) in &cases {
        let u = uniq(name);
        p.add_recipient(&u, "", "", "").await;
        let url = format!("https://push.example.test/sub/{name}-{u}");
        let id = p.add_webpush(&u, &url).await;
        let mut fault = fault.clone();
        fault["provider"] = json!("webpush");
        fault["target_contains"] = json!(format!("/sub/{name}-"));
        p.sim_fault(fault).await;
        users.push((u, id));
    }
    // A subscription bound to another application server key.
    let vapid_user = p.add_bare_recipient("vapid").await;
    let other_key =
        "BOr8ZrmWJnkJUpVhjW2oIlzv8l3nNpfdpnaJ1Fwd2ye5Vp_ZjIFlh3Gwjxcl2J0YfG6b1MaX0bDhj5L2p4QjZ8w";
    let sub: Value = p
        .http
        .post(format!("{}/_sim/webpush/subscriptions", p.sim_url))
        .json(&json!({"endpoint": format!("https://push.example.test/sub/bound-{vapid_user}"), "application_server_key": other_key}))
        .json_body().await;
    let bound = p
        .recipients()
        .register_endpoint(pb::RegisterEndpointRequest {
            user_id: vapid_user.clone(),
            platform: "webpush".into(),
            token: String::new(),
            web_push: Some(pb::WebPushSubscription {
                endpoint: sub["endpoint"].as_str().unwrap().into(),
                p256dh: sub["keys"]["p256dh"].as_str().unwrap().into(),
                auth: sub["keys"]["auth"].as_str().unwrap().into(),
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .endpoint_id;

    let mut all: Vec<&str> = users.iter().map(|(u, _)| u.as_str()).collect();
    all.push(&vapid_user);
    let ev = p.send("wp-errors", "order_paid", &all).await;
    let done = p.wait_final(&ev.event_id, 60).await;
    for ((name, _, status, attempts, code), (_, id)) in cases.iter().zip(&users) {
        let del = by_endpoint(&done, id);
        assert_eq!(
            (del.status.as_str(), del.attempts),
            (*status, *attempts),
            "{name}: {del:?}"
        );
        assert!(del.last_error.starts_with(code), "{name}: {del:?}");
        let active = endpoint_state(&p, id).await.0 == "active";
        assert_eq!(active, *code != "invalid_token", "{name}");
    }
    let del = by_endpoint(&done, &bound);
    assert_eq!(del.status, "failed");
    assert!(
        del.last_error.starts_with("webpush_vapid_rejected"),
        "{del:?}"
    );
    // The slow one was accepted and then timed out: sent again (the duplicate window).
    let slow = p
        .sim_requests("webpush")
        .await
        .into_iter()
        .filter(|r| {
            r["body"]["endpoint"]
                .as_str()
                .unwrap()
                .contains("/sub/slow-")
        })
        .count();
    assert_eq!(slow, 2);
    let rows: Vec<(i32, Option<String>)> = p.rows("SELECT a.attempt, a.error_code FROM delivery_attempts a WHERE a.delivery_id = $1::uuid ORDER BY a.attempt", &by_endpoint(&done, &users[1].1).delivery_id).await;
    assert_eq!(rows[0].1.as_deref(), Some("webpush_timeout"), "{rows:?}");

    // 429 with Retry-After: 2 waits for the later of Retry-After and the one-minute floor
    // for rate limits, without failing.
    let limited = p.add_bare_recipient("limited").await;
    p.add_webpush(
        &limited,
        &format!("https://push.example.test/sub/limited-{limited}"),
    )
    .await;
    p.sim_fault(json!({"provider": "webpush", "target_contains": "/sub/limited-", "status": 429, "retry_after": 2}))
        .await;
    let ev = p.send("wp-429", "order_paid", &[&limited]).await;
    let del = eventually(
        "one attempt, rate limited, pending",
        Duration::from_secs(60),
        async || {
            let d = p.get_event(&ev.event_id).await.deliveries[0].clone();
            if d.attempts == 1 && d.status == "pending" {
                Ok(d)
            } else {
                Err(d)
            }
        },
    )
    .await;
    assert!(
        del.last_error.starts_with("webpush_rate_limited"),
        "{del:?}"
    );
    let wait = del.next_attempt_at.unwrap().seconds - chrono::Utc::now().timestamp();
    assert!((55..=61).contains(&wait), "next attempt in {wait}s");
}

/// 1,500 Thai characters on FCM, APNs and Web Push: each provider receives the longest
/// prefix that fits its limit, cut between grapheme clusters and ended with "…", byte for
/// byte as written, with the title whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thai_push_bodies_are_cut_to_each_providers_limit_byte_for_byte() {
    let p = push_platform().await;
    p.add_type("order_paid", &["push"]).await;
    let u = p.add_bare_recipient("u").await;
    p.add_device(&u, &format!("fcm-tok-{u}")).await;
    p.add_endpoint(&u, "apns", &format!("apns-tok-{u}")).await;
    p.add_webpush(&u, &format!("https://push.example.test/sub/T-{u}"))
        .await;
    let body: String = "ผู้ใหญ่ลีตีกลองประชุม น้ำท่วมทุ่งผักบุ้งโหรงเหรง "
        .chars()
        .cycle()
        .take(1500)
        .collect();
    assert_eq!(body.chars().count(), 1500);
    let mut req = p.event("thai:push", "order_paid", &[&u]);
    req.content.as_mut().unwrap().body = body.clone();
    let (_, _done) = p.deliver_all(req).await;

    let fcm = &p.sim_requests("fcm").await[0]["body"]["message"];
    let apns = &p.sim_requests("apns").await[0]["body"];
    let webpush = &p.sim_requests("webpush").await[0]["body"];
    let shown = [
        (
            "fcm",
            fcm["notification"]["body"].clone(),
            fcm["notification"]["title"].clone(),
            fcm.to_string().len(),
            4096,
        ),
        (
            "apns",
            apns["aps"]["alert"]["body"].clone(),
            apns["aps"]["alert"]["title"].clone(),
            apns.to_string().len(),
            4096,
        ),
        (
            "webpush",
            webpush["payload"]["body"].clone(),
            webpush["payload"]["title"].clone(),
            webpush["plaintext"].as_str().unwrap().len(),
            3993,
        ),
    ];
    for (provider, text, title, size, limit) in shown {
        assert!(size <= limit, "{provider}: {size} bytes over {limit}");
        assert_eq!(title, "ชำระเงินแล้ว #1001", "{provider}: title whole");
        let text = text.as_str().unwrap();
        let kept = text
            .strip_suffix('…')
            .unwrap_or_else(|| panic!("{provider}: no ellipsis"));
        assert_eq!(
            kept.as_bytes(),
            &body.as_bytes()[..kept.len()],
            "{provider}: a byte-exact prefix"
        );
        assert!(
            size + 60 > limit,
            "{provider}: as much as fits is kept ({size} of {limit})"
        );
        let next = body[kept.len()..].chars().next().unwrap();
        assert!(
            !matches!(next, '\u{0E31}' | '\u{0E34}'..='\u{0E3A}' | '\u{0E47}'..='\u{0E4E}'),
            "{provider}: the cut leaves no vowel or tone mark without its consonant"
        );
    }
}

/// FCM and APNs answers sorted by class against the simulator: 5xx and an expired APNs
/// provider token retry, a timeout after the provider accepted is an ambiguous retry (the
/// provider sees the message twice), FCM's "message is too big" is `payload_too_large`,
/// other 4xx fail at once and keep the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcm_and_apns_errors_are_sorted_by_class() {
    let p = push_platform().await;
    p.add_type("order_paid", &["push"]).await;
    let fcm_err = |status: u16, code: &str| {
        json!({"error": {"code": status, "status": code, "message": "x",
               "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}]}})
    };
    // (name, platform, fault, status, attempts, first error code)
    let cases: Vec<(&str, &str, Value, &str, u32, &str)> = vec![
        (
            "fcm503",
            "fcm",
            json!({"status": 503, "body": fcm_err(503, "UNAVAILABLE"), "times": 1}),
            "sent",
            2,
            "fcm_unavailable",
        ),
        (
            "fcmslow",
            "fcm",
            json!({"status": 200, "body": {"name": "projects/x/messages/1"}, "delay_ms": 6000, "times": 1}),
            "sent",
            2,
            "fcm_timeout",
        ),
        (
            "fcm400",
            "fcm",
            json!({"status": 400, "body": fcm_err(400, "INVALID_ARGUMENT")}),
            "failed",
            1,
            "fcm_invalid_argument",
        ),
        (
            // FCM's answer to a message over its size limit (FCM v1 ErrorCode,
            // INVALID_ARGUMENT: "message too big"): permanent, named as such.
            "fcmtoobig",
            "fcm",
            json!({"status": 400, "body": {"error": {"code": 400, "status": "INVALID_ARGUMENT",
                "message": "Android message is too big",
                "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "INVALID_ARGUMENT"}]}}}),
            "failed",
            1,
            "payload_too_large",
        ),
        (
            "apns500",
            "apns",
            json!({"status": 500, "body": {"reason": "InternalServerError"}, "times": 1}),
            "sent",
            2,
            "apns_500",
        ),
        (
            "apnsslow",
            "apns",
            json!({"status": 200, "delay_ms": 6000, "times": 1}),
            "sent",
            2,
            "apns_timeout",
        ),
        (
            "apnsexpired",
            "apns",
            json!({"status": 403, "body": {"reason": "ExpiredProviderToken"}, "times": 1}),
            "sent",
            2,
            "apns_expired_provider_token",
        ),
        (
            "apns413",
            "apns",
            json!({"status": 413, "body": {"reason": "PayloadTooLarge"}}),
            "failed",
            1,
            "payload_too_large",
        ),
        (
            "apnstopic",
            "apns",
            json!({"status": 400, "body": {"reason": "BadTopic"}}),
            "failed",
            1,
            "apns_bad_topic",
        ),
    ];
    let mut users = Vec::new();
    for (name, platform, fault, ..) in &cases {
        let u = uniq(name);
        p.add_recipient(&u, "", "", "").await;
        let token = format!("{name}-tok-{u}");
        let id = p.add_endpoint(&u, platform, &token).await;
        let mut fault = fault.clone();
        fault["provider"] = json!(platform);
        fault["target_contains"] = json!(format!("{name}-tok-"));
        p.sim_fault(fault).await;
        users.push((u, id, token));
    }
    let all: Vec<&str> = users.iter().map(|(u, ..)| u.as_str()).collect();
    let ev = p.send("push-errors", "order_paid", &all).await;
    let done = p.wait_final(&ev.event_id, 60).await;
    let calls = push_calls(&p).await;
    for ((name, _, _, status, attempts, code), (_, id, token)) in cases.iter().zip(&users) {
        let del = by_endpoint(&done, id);
        assert_eq!(
            (del.status.as_str(), del.attempts),
            (*status, *attempts),
            "{name}: {del:?}"
        );
        let first: Option<String> = p.scalar("SELECT error_code FROM delivery_attempts WHERE delivery_id = $1::uuid AND attempt = 1", &del.delivery_id).await;
        assert_eq!(first.as_deref(), Some(*code), "{name}");
        assert_eq!(
            endpoint_state(&p, id).await.0,
            "active",
            "{name}: endpoint kept"
        );
        let seen = calls.iter().filter(|(_, t)| t == token).count();
        assert_eq!(seen as u32, *attempts, "{name}: provider calls");
    }
}

/// Web Push endpoints on every private or loopback spelling, with credentials, or on a
/// host that is no known push service are refused when a device is registered, over
/// gRPC and over the inbox API alike, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_push_endpoints_off_the_known_push_services_are_refused_at_registration() {
    let p = Platform::start_with_workers(&[]).await;
    let u = p.add_bare_recipient("ssrf").await;
    let p256dh = format!("B{}", "A".repeat(86));
    let auth = "A".repeat(22);
    let token = support::hs256(
        &json!({"sub": u, "exp": chrono::Utc::now().timestamp() + 300}),
        support::INBOX_SECRET,
    );
    for endpoint in [
        "https://127.0.0.1/wp/1",
        "https://169.254.169.254/latest/meta-data",
        "https://10.0.0.1/wp/1",
        "https://localhost/wp/1",
        "https://[::1]/wp/1",
        "https://0x7f000001/wp/1",
        "https://127.1:8443/wp/1",
        "https://user:pw@push.example.test/wp/1",
        "https://push.example.test@127.0.0.1/wp/1",
        "https://internal.example.com/wp/1",
        "http://push.example.test/wp/1",
    ] {
        let err = p
            .recipients()
            .register_endpoint(pb::RegisterEndpointRequest {
                user_id: u.clone(),
                platform: "webpush".into(),
                token: String::new(),
                web_push: Some(pb::WebPushSubscription {
                    endpoint: endpoint.into(),
                    p256dh: p256dh.clone(),
                    auth: auth.clone(),
                }),
            })
            .await
            .expect_err(endpoint);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{endpoint}");
        assert!(
            err.message().contains("web_push.endpoint"),
            "{endpoint}: {}",
            err.message()
        );

        let r = p
            .http
            .post(format!("{}/v1/inbox/devices", p.http_url))
            .bearer_auth(&token)
            .json(&json!({"platform": "webpush", "web_push": {"endpoint": endpoint, "keys": {"p256dh": p256dh, "auth": auth}}}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let e: Value = r.json().await.unwrap();
        assert_eq!(status, 400, "{endpoint}: {e}");
        assert_eq!(e["error"]["field"], "web_push.endpoint", "{endpoint}: {e}");
    }
    let stored: i64 = p
        .query_scalar("SELECT count(*) FROM notification_endpoints")
        .await;
    assert_eq!(stored, 0);
    // A known push service's endpoint is accepted.
    let r = p
        .http
        .post(format!("{}/v1/inbox/devices", p.http_url))
        .bearer_auth(&token)
        .json(&json!({"platform": "webpush", "web_push": {"endpoint": "https://updates.push.services.mozilla.com/wpush/v2/gAAAA", "keys": {"p256dh": p256dh, "auth": auth}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
}
