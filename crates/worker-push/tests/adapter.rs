//! The push adapter (FCM, APNs, Web Push) called directly (no broker, no database)
//! against the provider simulator on port 0, through a table of answers per provider:
//! each maps to one typed outcome.

use notify_core::ErrorClass::*;
use notify_worker::ChannelSender;
use notify_worker::testing::{APNS, Expect, FCM_PROJECT, Sim, fault, job, lease, sent_id};
use serde_json::json;
use std::time::Duration;
use worker_push::apns::ApnsConfig;
use worker_push::webpush::WebPushConfig;
use worker_push::{PushConfig, PushSender};

/// The adapter's HTTP timeout here; the timeout rows answer later than it.
const TIMEOUT: Duration = Duration::from_millis(500);
/// A fault answering after the timeout.
const LATE_MS: u64 = 2 * TIMEOUT.as_millis() as u64;
/// The subscription endpoint of the Web Push rows; requests go to the simulator's
/// `/webpush` plus its path.
const ENDPOINT: &str = "https://push.example.test/sub/adapter-1";

fn sender(sim: &Sim) -> PushSender {
    use p256::pkcs8::{EncodePrivateKey, LineEnding};
    let vapid = p256::SecretKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
    PushSender::new(PushConfig {
        fcm_api_base: sim.url.clone(),
        fcm_service_account_file: sim.fcm_key_file.display().to_string(),
        fcm_project_id: Some(FCM_PROJECT.into()),
        timeout: TIMEOUT,
        apns: Some(ApnsConfig {
            api_base: sim.url.clone(),
            key_pem: sim.apns_key_pem.clone(),
            key_id: APNS.0.into(),
            team_id: APNS.1.into(),
            topic: APNS.2.into(),
            timeout: TIMEOUT,
        }),
        webpush: Some(WebPushConfig {
            vapid_key_pem: vapid.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
            vapid_subject: "mailto:ops@example.test".into(),
            base_override: format!("{}/webpush", sim.url),
            ttl: Duration::from_secs(3600),
            timeout: TIMEOUT,
            links: notify_core::links::LinkPolicy {
                web_push_hosts: vec!["push.example.test".into()],
                ..Default::default()
            },
        }),
    })
    .unwrap()
}

fn push_job(platform: &str, token: &str) -> notify_worker::Job {
    let mut j = job("push", platform);
    j.endpoint_token = Some(token.into());
    j
}

#[tokio::test]
async fn fcm_answers_map_to_typed_outcomes() {
    let sim = Sim::start().await;
    let push = sender(&sim);
    let ok = push.send(&push_job("fcm", "fcm-token-1"), &lease()).await;
    assert!(sent_id(&ok).is_some_and(|id| id.is_some()), "{ok:?}");
    let unavailable = json!({"error": {"status": "UNAVAILABLE", "details": [
        {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "UNAVAILABLE"}]}});
    let table = [
        (
            "200 with a malformed body: sent, without an id",
            fault("fcm", 200, json!({"body": "<html>"})),
            None,
        ),
        (
            "404 UNREGISTERED",
            fault(
                "fcm",
                404,
                json!({"body": {"error": {"status": "NOT_FOUND", "details": [
                {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "UNREGISTERED"}]}}}),
            ),
            Some(Expect::failed(InvalidEndpoint, "invalid_token", Some(404))),
        ),
        (
            "429 with Retry-After",
            fault(
                "fcm",
                429,
                json!({"retry_after": 9, "body": {"error": {"status": "RESOURCE_EXHAUSTED"}}}),
            ),
            Some(
                Expect::failed(RateLimited, "fcm_quota_exceeded", Some(429))
                    .retry_after(Duration::from_secs(9)),
            ),
        ),
        (
            "503 UNAVAILABLE",
            fault("fcm", 503, json!({"body": unavailable})),
            Some(Expect::failed(Transient, "fcm_unavailable", Some(503))),
        ),
        (
            "500 with a malformed body",
            fault("fcm", 500, json!({"body": "oops"})),
            Some(Expect::failed(Transient, "fcm_500", Some(500)).reason("fcm_5xx")),
        ),
        (
            "timeout",
            fault("fcm", 200, json!({"delay_ms": LATE_MS})),
            Some(Expect::failed(Transient, "fcm_timeout", None).ambiguous()),
        ),
    ];
    for (row, f, want) in table {
        sim.fault(f).await;
        let out = push.send(&push_job("fcm", "fcm-token-1"), &lease()).await;
        match want {
            Some(want) => want.check(row, &out),
            None => assert_eq!(sent_id(&out), Some(None), "{row}: {out:?}"),
        }
        sim.clear_faults().await;
    }
}

#[tokio::test]
async fn apns_answers_map_to_typed_outcomes() {
    let sim = Sim::start().await;
    let push = sender(&sim);
    let device = "a1".repeat(32);
    let ok = push.send(&push_job("apns", &device), &lease()).await;
    assert!(sent_id(&ok).is_some(), "{ok:?}");
    assert_eq!(ok.provider_status, Some(200));
    let table = [
        (
            "410 Unregistered",
            fault("apns", 410, json!({"body": {"reason": "Unregistered"}})),
            Expect::failed(InvalidEndpoint, "invalid_token", Some(410)),
        ),
        (
            "429 with Retry-After",
            fault(
                "apns",
                429,
                json!({"retry_after": 4, "body": {"reason": "TooManyRequests"}}),
            ),
            Expect::failed(RateLimited, "apns_too_many_requests", Some(429))
                .retry_after(Duration::from_secs(4)),
        ),
        (
            "503",
            fault(
                "apns",
                503,
                json!({"body": {"reason": "ServiceUnavailable"}}),
            ),
            Expect::failed(Transient, "apns_503", Some(503)).reason("apns_5xx"),
        ),
        (
            "400 with a malformed body",
            fault("apns", 400, json!({"body": "not apns"})),
            Expect::failed(Permanent, "apns_400", Some(400)).reason("apns_4xx"),
        ),
        (
            "timeout",
            fault("apns", 200, json!({"delay_ms": LATE_MS})),
            Expect::failed(Transient, "apns_timeout", None).ambiguous(),
        ),
    ];
    sim.run_table(&table, || async {
        push.send(&push_job("apns", &device), &lease()).await
    })
    .await;
}

#[tokio::test]
async fn web_push_answers_map_to_typed_outcomes() {
    let sim = Sim::start().await;
    let push = sender(&sim);
    let issued = sim
        .control("/_sim/webpush/subscriptions", json!({"endpoint": ENDPOINT}))
        .await;
    let webpush_job = || {
        let mut j = push_job("webpush", ENDPOINT);
        j.endpoint_subscription = Some(issued["keys"].clone());
        j
    };
    let ok = push.send(&webpush_job(), &lease()).await;
    assert!(sent_id(&ok).is_some(), "{ok:?}");
    assert_eq!(ok.provider_status, Some(201));
    let table = [
        (
            "410 gone",
            fault("webpush", 410, json!({})),
            Expect::failed(InvalidEndpoint, "invalid_token", Some(410)),
        ),
        (
            "429 with Retry-After",
            fault("webpush", 429, json!({"retry_after": 3})),
            Expect::failed(RateLimited, "webpush_rate_limited", Some(429))
                .retry_after(Duration::from_secs(3)),
        ),
        (
            "502",
            fault("webpush", 502, json!({"body": "bad gateway"})),
            Expect::failed(Transient, "webpush_unavailable", Some(502)),
        ),
        (
            "400 with a malformed body",
            fault("webpush", 400, json!({"body": "<html>"})),
            Expect::failed(Permanent, "webpush_rejected", Some(400)),
        ),
        (
            "timeout",
            fault("webpush", 201, json!({"delay_ms": LATE_MS})),
            Expect::failed(Transient, "webpush_timeout", None).ambiguous(),
        ),
    ];
    sim.run_table(&table, || async {
        push.send(&webpush_job(), &lease()).await
    })
    .await;
}

#[tokio::test]
async fn a_long_thai_apns_body_is_cut_after_a_whole_word() {
    let sim = Sim::start().await;
    let push = sender(&sim);
    let mut j = push_job("apns", &"a1".repeat(32));
    // "…completed, thank you for using the service, new-device sign-in alert…" with no
    // spaces, about 9 KB of UTF-8; the title makes the byte budget end 2 bytes after
    // "แจ้งเ", where a cut between grapheme clusters gave the measured `…แจ้งเ…`.
    j.content.title = "Your order was paid".into();
    let run = "เราได้รับชำระเงินเรียบร้อยแล้วขอบคุณที่ใช้บริการแจ้งเตือนการเข้าสู่ระบบใหม่จากอุปกรณ์ที่ไม่รู้จัก";
    let body = run.repeat(32)["เราได้รับชำระเงิน".len()..].to_string();
    j.content.body = body.clone();
    let out = push.send(&j, &lease()).await;
    assert!(sent_id(&out).is_some(), "{out:?}");

    let url = format!("{}/_sim/requests?provider=apns", sim.url);
    let reqs: Vec<serde_json::Value> = reqwest::get(url).await.unwrap().json().await.unwrap();
    let payload = &reqs[0]["body"];
    assert!(payload.to_string().len() <= 4096, "APNs allows 4,096 bytes");
    let shown = payload["aps"]["alert"]["body"].as_str().unwrap();
    let kept = shown.strip_suffix('…').expect("ends with an ellipsis");
    assert!(body.starts_with(kept));
    // Hand-checked: "แจ้งเตือน" is "แจ้ง" (notify) + "เตือน" (warn); the cut keeps
    // "แจ้ง" whole and leaves no เ behind.
    assert!(kept.ends_with("บริการแจ้ง"), "…{}", &kept[kept.len() - 30..]);
    assert!(body[kept.len()..].starts_with("เตือนการ"));
    let mut bounds = vec![0];
    for w in notify_core::text::words(&body) {
        bounds.push(bounds.last().unwrap() + w.len());
    }
    assert!(
        bounds.contains(&kept.len()),
        "cut inside a word: …{}",
        &kept[kept.len() - 30..]
    );
    assert!(
        !kept.ends_with(['เ', 'แ', 'โ', 'ใ', 'ไ']),
        "a dangling leading vowel"
    );
    // As much as whole words allow: with the next word the payload would not fit.
    let next = bounds.iter().find(|&&b| b > kept.len()).unwrap();
    assert!(payload.to_string().len() + (next - kept.len()) > 4096);
}

/// The rich content of these tests: an image, two actions (a link and a deep link), a
/// thread, a fixed badge and an override for every push field.
fn rich(mut j: notify_worker::Job) -> notify_worker::Job {
    use notify_core::content::{Action, Badge};
    let c = &mut j.content;
    c.url = "https://shop.example.test/orders/1001".into();
    c.image_url = "https://cdn.shop.example.test/orders/1001.png".into();
    c.actions = vec![
        Action {
            id: "view".into(),
            label: "ดูคำสั่งซื้อ".into(),
            url: "https://shop.example.test/orders/1001".into(),
        },
        Action {
            id: String::new(),
            label: "ติดตามพัสดุ".into(),
            url: "myshop://orders/1001/track".into(),
        },
    ];
    c.thread = "order-1001".into();
    c.badge = Badge::Count(7);
    let o = &mut c.overrides;
    o.fcm_data.insert("order_id".into(), "1001".into());
    o.android_channel_id = "orders".into();
    o.apns_category = "ORDER_UPDATE".into();
    o.apns_sound = "chime.caf".into();
    o.apns_interruption_level = "time-sensitive".into();
    o.webpush_icon = "https://cdn.shop.example.test/icon-192.png".into();
    j
}

#[tokio::test]
async fn rich_content_is_accepted_by_every_service_with_each_field_in_place() {
    let sim = Sim::start().await;
    let push = sender(&sim);
    let actions = json!([
        {"id": "view", "label": "ดูคำสั่งซื้อ", "url": "https://shop.example.test/orders/1001"},
        {"id": "action2", "label": "ติดตามพัสดุ", "url": "myshop://orders/1001/track"},
    ]);

    let fcm = push
        .send(&rich(push_job("fcm", "fcm-token-1")), &lease())
        .await;
    assert!(sent_id(&fcm).is_some_and(|id| id.is_some()), "{fcm:?}");
    let m = &fcm.content["request"]["message"];
    assert_eq!(
        m["notification"]["image"],
        "https://cdn.shop.example.test/orders/1001.png"
    );
    assert_eq!(m["data"]["order_id"], "1001");
    assert_eq!(m["data"]["url"], "https://shop.example.test/orders/1001");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(m["data"]["actions"].as_str().unwrap()).unwrap(),
        actions,
        "an action without an id gets action<N>"
    );
    assert_eq!(
        m["android"]["notification"],
        json!({"channel_id": "orders", "tag": "order-1001", "notification_count": 7})
    );
    assert_eq!(m["android"]["notification"].get("click_action"), None);
    assert_eq!(
        m["apns"]["payload"]["aps"],
        json!({"category": "ORDER_UPDATE", "thread-id": "order-1001", "sound": "chime.caf",
               "interruption-level": "time-sensitive", "badge": 7, "mutable-content": 1})
    );
    assert_eq!(
        m["webpush"]["fcm_options"]["link"],
        "https://shop.example.test/orders/1001"
    );

    let apns = push
        .send(&rich(push_job("apns", &"a1".repeat(32))), &lease())
        .await;
    assert_eq!(apns.provider_status, Some(200), "{apns:?}");
    let p = &apns.content["payload"];
    assert_eq!(p["aps"]["badge"], 7);
    assert_eq!(p["aps"]["mutable-content"], 1);
    assert_eq!(p["aps"]["category"], "ORDER_UPDATE");
    assert_eq!(
        p["image_url"],
        "https://cdn.shop.example.test/orders/1001.png"
    );
    assert_eq!(p["actions"], actions);

    let issued = sim
        .control("/_sim/webpush/subscriptions", json!({"endpoint": ENDPOINT}))
        .await;
    let mut wp = rich(push_job("webpush", ENDPOINT));
    wp.endpoint_subscription = Some(issued["keys"].clone());
    let web = push.send(&wp, &lease()).await;
    assert_eq!(web.provider_status, Some(201), "{web:?}");
    let n = &web.content["payload"];
    // The deep-link action is left out: a browser cannot open the app.
    assert_eq!(
        n["actions"],
        json!([{"action": "view", "title": "ดูคำสั่งซื้อ"}])
    );
    assert_eq!(n["icon"], "https://cdn.shop.example.test/icon-192.png");
    assert_eq!(n["image"], "https://cdn.shop.example.test/orders/1001.png");
    assert_eq!(n["tag"], "order-1001");
    assert_eq!(
        n["data"]["actions"],
        json!({"view": "https://shop.example.test/orders/1001"})
    );
    assert_eq!(n.get("badge"), None, "Web Push has no badge");
}

#[tokio::test]
async fn fcm_refuses_a_reserved_data_key_and_the_adapter_fails_without_retry() {
    let sim = Sim::start().await;
    let push = sender(&sim);
    let mut j = push_job("fcm", "fcm-token-1");
    j.content
        .overrides
        .fcm_data
        .insert("google.sent_time".into(), "1".into());
    let out = push.send(&j, &lease()).await;
    Expect::failed(Permanent, "fcm_invalid_argument", Some(400)).check("reserved key", &out);
}

#[tokio::test]
async fn an_unread_count_badge_without_a_database_fails_before_any_call() {
    let sim = Sim::start().await;
    let push = sender(&sim);
    let mut j = push_job("apns", &"a1".repeat(32));
    j.content.badge = notify_core::content::Badge::UnreadCount;
    let out = push.send(&j, &lease()).await;
    Expect::failed(Permanent, "badge_unavailable", None).check("no database", &out);
}

#[tokio::test]
async fn data_that_leaves_no_room_for_the_body_fails_naming_the_largest_part() {
    let sim = Sim::start().await;
    let push = sender(&sim);
    let mut j = rich(push_job("fcm", "fcm-token-1"));
    j.content.body = "ขอบคุณที่สั่งซื้อกับร้านของเรา คำสั่งซื้อของคุณกำลังจัดเตรียมและจะจัดส่งภายในสองวัน".into();
    j.content
        .overrides
        .fcm_data
        .insert("blob".into(), "x".repeat(3600));
    let out = push.send(&j, &lease()).await;
    Expect::failed(Permanent, "payload_too_large", None).check("too large", &out);
    let why = out.provider_response.as_deref().unwrap();
    assert!(
        why.contains("FCM allows 4096") && why.contains("its largest parts: /message/data "),
        "{why}"
    );
}

/// A Web Push subscription row naming a private or loopback address (written around the
/// registration check: by hand, by an older release) is never connected to, with no
/// simulator override in between, as in production: the attempt fails as an invalid
/// endpoint (revoked, not retried) and the listener on that address sees no connection.
#[tokio::test]
async fn a_web_push_endpoint_on_a_private_address_is_never_connected_to() {
    use p256::pkcs8::{EncodePrivateKey, LineEnding};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let vapid = p256::SecretKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
    let cfg = WebPushConfig {
        vapid_key_pem: vapid.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
        vapid_subject: "mailto:ops@example.test".into(),
        base_override: String::new(),
        ttl: Duration::from_secs(3600),
        timeout: TIMEOUT,
        // Even a misconfigured list naming the address keeps an IP literal out.
        links: notify_core::links::LinkPolicy {
            web_push_hosts: vec!["127.0.0.1".into(), "push.example.test".into()],
            ..Default::default()
        },
    };
    let webpush = worker_push::webpush::WebPush::new(cfg).unwrap();
    let keys = json!({"p256dh": format!("B{}", "A".repeat(86)), "auth": "A".repeat(22)});
    for endpoint in [
        format!("https://127.0.0.1:{port}/wp/1"),
        format!("https://localhost:{port}/wp/1"),
        format!("https://[::1]:{port}/wp/1"),
        format!("https://0x7f000001:{port}/wp/1"),
        format!("https://127.1:{port}/wp/1"),
        format!("https://user:pw@push.example.test:{port}/wp/1"),
        "https://169.254.169.254/latest/meta-data".to_string(),
        "https://10.0.0.1/wp/1".to_string(),
    ] {
        let mut j = push_job("webpush", &endpoint);
        j.endpoint_subscription = Some(keys.clone());
        let out = webpush.send(&j, &endpoint, &lease()).await;
        let err = notify_worker::testing::failure(&out);
        assert_eq!(err.class, InvalidEndpoint, "{endpoint}: {out:?}");
        assert_eq!(err.code, "webpush_endpoint_refused", "{endpoint}");
    }
    assert!(
        listener.accept().is_err(),
        "something connected to the loopback listener"
    );
}
