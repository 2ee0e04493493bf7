//! Status webhooks (issue 18, item 1): one verified webhook per state change; a tampered
//! body or an old timestamp fails verification; rotation signs with both secrets during
//! the overlap and only the new one after; a failing endpoint is retried with growing
//! delays and then disabled; a hanging endpoint delays no other and holds no database
//! connection; a worker killed mid-POST loses no webhook; WebhookService's field
//! violations.
//!
//! The receiver verifies with its own implementation of the Standard Webhooks algorithm
//! (HMAC-SHA256 over `id.timestamp.body`, keyed with the base64-decoded secret after
//! `whsec_`, base64, constant-time compare, 5 min timestamp tolerance), not the platform's.

use crate::support;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use notify_core::Channel;
use notify_proto::v1 as pb;
use serde_json::Value;
use sha2::Sha256;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{
    Options, Platform, api_key, eventually, field_violations, type_request, uniq, with_key,
};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic_types::StatusExt;

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Got {
    id: String,
    timestamp: String,
    signature: String,
    body: String,
}

impl Got {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("a JSON body")
    }
}

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Ok,
    Fail500,
    Hang,
}

#[derive(Clone)]
struct Receiver {
    got: Arc<Mutex<Vec<Got>>>,
    mode: Arc<Mutex<Mode>>,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    url: String,
}

impl Receiver {
    async fn start(mode: Mode) -> Receiver {
        let r = Receiver {
            got: Default::default(),
            mode: Arc::new(Mutex::new(mode)),
            in_flight: Default::default(),
            url: String::new(),
        };
        let state = r.clone();
        let app = Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let state = state.clone();
                async move {
                    let h = |n: &str| {
                        headers
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string()
                    };
                    state.got.lock().unwrap().push(Got {
                        id: h("webhook-id"),
                        timestamp: h("webhook-timestamp"),
                        signature: h("webhook-signature"),
                        body,
                    });
                    let mode = *state.mode.lock().unwrap();
                    match mode {
                        Mode::Ok => StatusCode::NO_CONTENT,
                        Mode::Fail500 => StatusCode::INTERNAL_SERVER_ERROR,
                        Mode::Hang => {
                            use std::sync::atomic::Ordering;
                            state.in_flight.fetch_add(1, Ordering::SeqCst);
                            std::future::pending::<()>().await;
                            StatusCode::NO_CONTENT
                        }
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://127.0.0.1:{}/hook",
            listener.local_addr().unwrap().port()
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { url, ..r }
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    fn set_mode(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
    }
}

/// The receiver's own verification (Standard Webhooks, spec/standard-webhooks.md,
/// "Verifying webhook authenticity"): any `v1,` signature of the header equal, in
/// constant time, to HMAC-SHA256(key, "{id}.{timestamp}.{body}"), and the timestamp
/// within 5 minutes of `now`.
fn verify(secret: &str, got: &Got, now: i64) -> Result<(), &'static str> {
    let ts: i64 = got.timestamp.parse().map_err(|_| "bad timestamp")?;
    if (now - ts).abs() > 5 * 60 {
        return Err("timestamp outside the tolerance");
    }
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").ok_or("no whsec_ prefix")?)
        .map_err(|_| "secret not base64")?;
    for sig in got.signature.split(' ') {
        let Some(b64) = sig.strip_prefix("v1,") else {
            continue;
        };
        let Ok(expected) = STANDARD.decode(b64) else {
            continue;
        };
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        mac.update(format!("{}.{}.{}", got.id, got.timestamp, got.body).as_bytes());
        // `verify_slice` compares in constant time.
        if mac.verify_slice(&expected).is_ok() {
            return Ok(());
        }
    }
    Err("no signature matches")
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A platform whose link policy lets plain http reach 127.0.0.1 (the receivers).
pub(crate) async fn platform(workers: &[Channel]) -> Platform {
    Platform::start_with(Options {
        workers: workers.to_vec(),
        smtp_sim: true,
        links: notify_core::links::LinkPolicy {
            http_hosts: vec!["127.0.0.1".into()],
            deep_link_schemes: vec!["myshop".into()],
            ..Default::default()
        },
        ..Default::default()
    })
    .await
}

/// Settings of a test webhook worker: short timeout and lease, quick retries.
pub(crate) fn webhook_config(p: &Platform) -> worker_webhook::WebhookConfig {
    let mut worker = p.worker_config();
    worker.lease = Duration::from_secs(4);
    worker_webhook::WebhookConfig {
        worker,
        timeout: Duration::from_secs(1),
        disable_after: Duration::from_secs(3600),
        retry: notify_core::RetryPolicy {
            delays: vec![Duration::from_millis(200)],
            max_attempts: 10,
            ..Default::default()
        },
        endpoint_concurrency: 4,
        sweep_every: Duration::from_millis(200),
        republish_after: Duration::from_secs(2),
    }
}

/// Starts a webhook worker in-process on `pool`; cancel the token (or abort the task) to
/// stop it.
pub(crate) fn start_webhook_worker(
    cfg: worker_webhook::WebhookConfig,
    pool: notify_store::PgPool,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let s = stop.clone();
    let task = tokio::spawn(async move {
        worker_webhook::run(cfg, pool, s).await.unwrap();
    });
    (stop, task)
}

pub(crate) fn webhooks(
    p: &Platform,
) -> pb::webhook_service_client::WebhookServiceClient<tonic::transport::Channel> {
    pb::webhook_service_client::WebhookServiceClient::new(p.grpc.clone())
}

pub(crate) async fn create_endpoint(p: &Platform, url: &str, types: &[&str]) -> (String, String) {
    let r = webhooks(p)
        .create_webhook_endpoint(pb::CreateWebhookEndpointRequest {
            url: url.into(),
            event_types: types.iter().map(|t| t.to_string()).collect(),
            caller: String::new(),
        })
        .await
        .expect("CreateWebhookEndpoint")
        .into_inner();
    assert!(r.secret.starts_with("whsec_"), "{}", r.secret);
    (r.endpoint.unwrap().id, r.secret)
}

/// Deliveries: (id, status, state_version).
pub(crate) async fn deliveries(p: &Platform) -> Vec<(uuid::Uuid, String, i32)> {
    p.query_rows("SELECT id, status, state_version FROM notification_deliveries ORDER BY id")
        .await
}

/// The received webhooks by `webhook-id` (duplicates folded; each verified first).
fn distinct(got: &[Got], secret: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for g in got {
        verify(secret, g, now()).unwrap_or_else(|e| panic!("{e}: {g:?}"));
        out.insert(g.id.clone(), g.json());
    }
    out
}

/// The `UpdateWebhookEndpoint` request that disables endpoint `id`.
fn disable(id: &str) -> pb::UpdateWebhookEndpointRequest {
    pb::UpdateWebhookEndpointRequest {
        id: id.into(),
        enabled: Some(false),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_change_of_a_run_of_deliveries_arrives_as_one_verified_webhook() {
    let p = platform(&[Channel::InApp, Channel::Email]).await;
    let rx = Receiver::start(Mode::Ok).await;
    let (_, secret) = create_endpoint(&p, &rx.url, &[]).await;
    let (_stop, _task) = start_webhook_worker(webhook_config(&p), p.pool.clone());
    p.add_type("order.paid", &["inapp", "email"]).await;
    let (ok, bad, skip) = (uniq("ok"), uniq("bad"), uniq("skip"));
    p.add_recipient(&ok, "Ok", "ok@example.test", "").await;
    p.add_recipient(&bad, "Bad", &format!("nouser-{bad}@example.test"), "")
        .await;
    p.add_recipient(&skip, "Skip", "skip@example.test", "")
        .await;

    // sent (inapp, email) and failed (550 5.1.1 on email).
    p.send(&uniq("evt"), "order.paid", &[&ok, &bad]).await;
    // canceled: scheduled a minute ahead, then canceled.
    let mut later = p.event(&uniq("later"), "order.paid", &[&ok]);
    later.delay = "60s".into();
    let later = p.create_event(later).await;
    p.ingest()
        .cancel_event(pb::CancelEventRequest {
            target: Some(pb::cancel_event_request::Target::EventId(
                later.event_id.clone(),
            )),
            recipients: vec![],
        })
        .await
        .unwrap();
    // skipped: due in a second; email turned off before it is due.
    let mut soon = p.event(&uniq("soon"), "order.paid", &[&skip]);
    soon.delay = "1s".into();
    p.ingest().create_event(soon).await.unwrap();
    p.set_preference(&skip, "order.paid", "email", false).await;

    // Every delivery reaches its end state.
    let final_states = eventually("every delivery ends", Duration::from_secs(30), async || {
        let d = deliveries(&p).await;
        if d.len() == 8 && d.iter().all(|(_, s, _)| s != "pending" && s != "sending") {
            Ok(d)
        } else {
            Err(d)
        }
    })
    .await;
    // notification.read: the ok user reads the in-app item of the first event.
    let (item, inapp_delivery): (uuid::Uuid, uuid::Uuid) = p
        .row(
            "SELECT n.id, n.delivery_id FROM notifications n WHERE n.user_id = $1 LIMIT 1",
            &ok,
        )
        .await;
    notify_store::inbox::set_status(&p.pool, &ok, item, notify_core::InboxStatus::Read)
        .await
        .unwrap()
        .expect("the item");
    // notification.clicked: then taps it (already read: no second read).
    notify_store::inbox::click(&p.pool, &ok, item, "")
        .await
        .unwrap()
        .expect("the item");

    let messages: i64 = p.count("webhook_messages").await;
    let got = eventually(
        "one webhook per message",
        Duration::from_secs(30),
        async || {
            let d = distinct(&rx.got(), &secret);
            if d.len() as i64 == messages {
                Ok(d)
            } else {
                Err(d.len())
            }
        },
    )
    .await;
    // Each delivery's end state arrived, with its state version.
    for (id, status, version) in &final_states {
        let hit = got.values().any(|w| {
            w["data"]["delivery_id"] == id.to_string()
                && w["data"]["status"] == *status
                && w["data"]["state_version"] == *version
        });
        assert!(hit, "no webhook for {id} {status} v{version}: {got:#?}");
    }
    let by_type = |t: &str| got.values().filter(|w| w["type"] == t).count();
    // ok inapp + email, bad inapp, skip inapp
    assert_eq!(by_type("delivery.sent"), 4, "{got:#?}");
    assert_eq!(by_type("delivery.failed"), 1, "{got:#?}");
    assert_eq!(by_type("delivery.cancelled"), 2, "{got:#?}");
    assert_eq!(by_type("delivery.skipped"), 1, "{got:#?}");
    assert_eq!(by_type("notification.read"), 1, "{got:#?}");
    assert_eq!(by_type("notification.clicked"), 1, "{got:#?}");
    assert_eq!(got.len(), 10, "{got:#?}");
    let read = got
        .values()
        .find(|w| w["type"] == "notification.read")
        .unwrap();
    assert_eq!(read["data"]["delivery_id"], inapp_delivery.to_string());
    let failed = got
        .values()
        .find(|w| w["type"] == "delivery.failed")
        .unwrap();
    assert_eq!(failed["data"]["channel"], "email");
    assert_eq!(failed["data"]["user_id"], bad.as_str());
    assert!(
        failed["data"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("address_undeliverable"),
        "{failed:#}"
    );

    // For a check with another implementation (the `standardwebhooks` reference library):
    // NOTIFY_WEBHOOK_DUMP=<file> writes every request received, with its secret.
    if let Ok(path) = std::env::var("NOTIFY_WEBHOOK_DUMP") {
        let dump: Vec<Value> = rx
            .got()
            .iter()
            .map(|g| {
                serde_json::json!({"secret": secret, "webhook-id": g.id,
                    "webhook-timestamp": g.timestamp, "webhook-signature": g.signature,
                    "body": g.body})
            })
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&dump).unwrap()).unwrap();
    }

    // A tampered body and an old timestamp fail the receiver's verification.
    let one = rx.got()[0].clone();
    assert_eq!(verify(&secret, &one, now()), Ok(()));
    let tampered = Got {
        body: one.body.replace("delivery", "dElivery"),
        ..one.clone()
    };
    assert_eq!(
        verify(&secret, &tampered, now()),
        Err("no signature matches")
    );
    assert_eq!(
        verify(
            &secret,
            &one,
            one.timestamp.parse::<i64>().unwrap() + 6 * 60
        ),
        Err("timestamp outside the tolerance")
    );
    let wrong = notify_core::webhook::new_secret(&[3; 32]);
    assert_eq!(verify(&wrong, &one, now()), Err("no signature matches"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rotation_both_secrets_verify_and_after_the_overlap_only_the_new_one() {
    let p = platform(&[Channel::InApp]).await;
    let rx = Receiver::start(Mode::Ok).await;
    let (id, old) = create_endpoint(&p, &rx.url, &["delivery.sent"]).await;
    let (_stop, _task) = start_webhook_worker(webhook_config(&p), p.pool.clone());
    p.add_type("order.paid", &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "U", "", "").await;

    let rotated = webhooks(&p)
        .rotate_webhook_secret(pb::RotateWebhookSecretRequest {
            id: id.clone(),
            overlap_seconds: 3600,
        })
        .await
        .unwrap()
        .into_inner();
    let new = rotated.secret;
    assert_ne!(new, old);
    assert!(
        rotated
            .endpoint
            .unwrap()
            .previous_secret_expires_at
            .is_some()
    );
    p.send(&uniq("e1"), "order.paid", &[&user]).await;
    let first = eventually("a webhook", Duration::from_secs(20), async || {
        rx.got().first().cloned().ok_or(())
    })
    .await;
    assert_eq!(first.signature.split(' ').count(), 2, "{first:?}");
    assert_eq!(verify(&old, &first, now()), Ok(()));
    assert_eq!(verify(&new, &first, now()), Ok(()));

    // A second rotation with an overlap while the first one's runs would stop the old
    // secret before the hour it was promised: refused by field, nothing changed.
    let refused = webhooks(&p)
        .rotate_webhook_secret(pb::RotateWebhookSecretRequest {
            id: id.clone(),
            overlap_seconds: 3600,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let violations = refused.get_details_bad_request().unwrap().field_violations;
    assert_eq!(violations.len(), 1);
    assert_eq!(violations[0].field, "overlap_seconds");
    assert!(
        violations[0].description.contains("must be 0 while"),
        "{violations:?}"
    );
    let secrets: (String, Option<String>) = p
        .query_row("SELECT secret, previous_secret FROM webhook_endpoints")
        .await;
    assert_eq!(secrets, (new.clone(), Some(old.clone())), "unchanged");

    // The overlap ends (moved to now instead of waiting an hour).
    p.execute("UPDATE webhook_endpoints SET previous_expires_at = now()")
        .await;
    p.send(&uniq("e2"), "order.paid", &[&user]).await;
    let second = eventually("a second webhook", Duration::from_secs(20), async || {
        rx.got().into_iter().find(|g| g.id != first.id).ok_or(())
    })
    .await;
    assert_eq!(second.signature.split(' ').count(), 1, "{second:?}");
    assert_eq!(verify(&new, &second, now()), Ok(()));
    assert_eq!(verify(&old, &second, now()), Err("no signature matches"));

    // After the overlap, rotating with one again is fine; with 0 during it, every old
    // secret stops at once (a leaked secret).
    for overlap_seconds in [3600, 0] {
        webhooks(&p)
            .rotate_webhook_secret(pb::RotateWebhookSecretRequest {
                id: id.clone(),
                overlap_seconds,
            })
            .await
            .unwrap_or_else(|e| panic!("overlap {overlap_seconds}: {e:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_answering_500_is_retried_with_growing_delays_then_disabled() {
    let p = platform(&[Channel::InApp]).await;
    let rx = Receiver::start(Mode::Fail500).await;
    let (id, _) = create_endpoint(&p, &rx.url, &["delivery.sent"]).await;
    let mut cfg = webhook_config(&p);
    cfg.retry.delays = vec![
        Duration::from_millis(100),
        Duration::from_millis(300),
        Duration::from_millis(900),
    ];
    cfg.disable_after = Duration::from_millis(1500);
    let (_stop, _task) = start_webhook_worker(cfg, p.pool.clone());
    p.add_type("order.paid", &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "U", "", "").await;
    p.send(&uniq("e"), "order.paid", &[&user]).await;

    let endpoint = eventually(
        "the endpoint disabled",
        Duration::from_secs(30),
        async || {
            let list = webhooks(&p)
                .list_webhook_endpoints(pb::ListWebhookEndpointsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .endpoints;
            let e = list.into_iter().find(|e| e.id == id).unwrap();
            if e.enabled { Err(e) } else { Ok(e) }
        },
    )
    .await;
    assert!(
        endpoint.disabled_reason.starts_with("failing since"),
        "{endpoint:?}"
    );
    let (msg_id, status): (uuid::Uuid, String) =
        p.query_row("SELECT id, status FROM webhook_messages").await;
    assert_eq!(status, "failed");
    let attempts = notify_store::webhooks::attempts_of(&p.pool, msg_id)
        .await
        .unwrap();
    assert!(attempts.len() >= 3, "{attempts:#?}");
    assert!(
        attempts.iter().all(|a| a.status_code == Some(500)),
        "{attempts:#?}"
    );
    let gaps: Vec<i64> = attempts
        .windows(2)
        .map(|w| (w[1].started_at - w[0].started_at).num_milliseconds())
        .collect();
    assert!(gaps[1] > gaps[0], "gaps grow: {gaps:?}");
    // Every POST carried the same webhook-id.
    let ids: BTreeSet<String> = rx.got().into_iter().map(|g| g.id).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    // A disabled endpoint gets no new messages.
    p.send(&uniq("e2"), "order.paid", &[&user]).await;
    eventually(
        "the second delivery sent",
        Duration::from_secs(20),
        async || {
            let sent = deliveries(&p)
                .await
                .iter()
                .filter(|d| d.1 == "sent")
                .count();
            if sent == 2 { Ok(()) } else { Err(sent) }
        },
    )
    .await;
    assert_eq!(p.count("webhook_messages").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_endpoint_delays_no_other_and_holds_no_database_connection() {
    let p = platform(&[Channel::InApp]).await;
    let hang = Receiver::start(Mode::Hang).await;
    let fine = Receiver::start(Mode::Ok).await;
    create_endpoint(&p, &hang.url, &["delivery.sent"]).await;
    let (_, fine_secret) = create_endpoint(&p, &fine.url, &["delivery.sent"]).await;
    let mut cfg = webhook_config(&p);
    cfg.timeout = Duration::from_secs(5);
    cfg.worker.lease = Duration::from_secs(30);
    cfg.endpoint_concurrency = 2;
    // The worker's own pool, to count its connections in use.
    let mut pc = notify_store::PoolConfig::new(p.db_url.clone());
    pc.max_connections = 4;
    let wpool = notify_store::connect(&pc).unwrap();
    let (_stop, _task) = start_webhook_worker(cfg, wpool.clone());
    p.add_type("order.paid", &["inapp"]).await;
    let users: Vec<String> = (0..5).map(|i| uniq(&format!("u{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "U", "", "").await;
    }
    let refs: Vec<&str> = users.iter().map(String::as_str).collect();
    p.send(&uniq("e"), "order.paid", &refs).await;

    // All five reach the good endpoint while the hanging one holds its two slots.
    eventually(
        "five webhooks at the good endpoint",
        Duration::from_secs(4),
        async || {
            let n = distinct(&fine.got(), &fine_secret).len();
            if n == 5 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    use std::sync::atomic::Ordering;
    assert_eq!(
        hang.in_flight.load(Ordering::SeqCst),
        2,
        "the per-endpoint cap"
    );
    eventually(
        "no connection in use while POSTs hang",
        Duration::from_secs(2),
        async || {
            let busy = wpool.size() as usize - wpool.num_idle();
            if busy == 0 { Ok(()) } else { Err(busy) }
        },
    )
    .await;
    assert_eq!(hang.in_flight.load(Ordering::SeqCst), 2, "still hanging");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_during_the_post_loses_no_webhook() {
    let p = platform(&[Channel::InApp]).await;
    let rx = Receiver::start(Mode::Hang).await;
    let (_, secret) = create_endpoint(&p, &rx.url, &["delivery.sent"]).await;
    let mut cfg = webhook_config(&p);
    cfg.timeout = Duration::from_secs(20);
    cfg.worker.lease = Duration::from_secs(23);
    let (_stop, first) = start_webhook_worker(cfg, p.pool.clone());
    p.add_type("order.paid", &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "U", "", "").await;
    p.send(&uniq("e"), "order.paid", &[&user]).await;
    let got = eventually("the POST started", Duration::from_secs(20), async || {
        rx.got().first().cloned().ok_or(())
    })
    .await;
    // Killed mid-POST: the task is gone, its lease stays.
    first.abort();
    let _ = first.await;
    rx.set_mode(Mode::Ok);
    // The lease runs out (moved to now instead of waiting), a second worker's sweeper
    // brings the message back, and it arrives again with the same webhook-id.
    p.execute("UPDATE webhook_messages SET lease_expires_at = now() WHERE status = 'sending'")
        .await;
    let (_stop2, _second) = start_webhook_worker(webhook_config(&p), p.pool.clone());
    let again = eventually("the webhook again", Duration::from_secs(20), async || {
        let all = rx.got();
        if all.len() >= 2 {
            Ok(all[1].clone())
        } else {
            Err(all.len())
        }
    })
    .await;
    assert_eq!(again.id, got.id);
    assert_eq!(again.body, got.body);
    assert_eq!(verify(&secret, &again, now()), Ok(()));
    eventually("the message sent", Duration::from_secs(5), async || {
        let s: String = p.query_scalar("SELECT status FROM webhook_messages").await;
        if s == "sent" { Ok(()) } else { Err(s) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_webhook_endpoint_names_every_bad_field() {
    // No development host: 127.0.0.1, however spelt, is refused as the tester found.
    let p = Platform::start_with(Options {
        links: notify_core::links::LinkPolicy::default(),
        ..Default::default()
    })
    .await;
    for (url, types, fields) in [
        (
            "ftp://hooks.example.com/x",
            vec!["delivery.sent"],
            vec!["url"],
        ),
        ("http://hooks.example.com/x", vec![], vec!["url"]),
        ("https://10.1.2.3/x", vec![], vec!["url"]),
        ("https://169.254.169.254/latest", vec![], vec!["url"]),
        // Spellings the WHATWG parser (reqwest's) reads as loopback, and NAT64 of it.
        ("https://127.1:59830/a", vec![], vec!["url"]),
        ("https://0x7f000001:59830/c", vec![], vec!["url"]),
        ("https://%31%32%37.0.0.1:59830/f", vec![], vec!["url"]),
        (
            "https://127\u{3002}0\u{3002}0\u{3002}1:59830/g",
            vec![],
            vec!["url"],
        ),
        ("https://[64:ff9b::7f00:1]/", vec![], vec!["url"]),
        ("https://LOCALHOST./", vec![], vec!["url"]),
        ("https://example.com:99999/", vec![], vec!["url"]),
        (
            "https://hooks.example.com/x",
            vec!["delivery.sent", "delivery.exploded"],
            vec!["event_types[1]"],
        ),
    ] {
        let e = webhooks(&p)
            .create_webhook_endpoint(pb::CreateWebhookEndpointRequest {
                url: url.into(),
                event_types: types.iter().map(|t| t.to_string()).collect(),
                caller: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{url}");
        let got = field_violations(&e);
        assert_eq!(got, fields, "{url} {types:?}");
    }
    // Over 2048 bytes, and a managing key naming a caller no key could have: each field
    // named with its rule.
    let long = format!("https://hooks.example.com/{}", "a".repeat(2048));
    for (url, caller, field, rule) in [
        (long.as_str(), "", "url", "2048 bytes"),
        (
            "https://hooks.example.com/x",
            "Shop Orders!",
            "caller",
            "[a-z0-9._-]",
        ),
        (
            "https://hooks.example.com/x",
            "-shop",
            "caller",
            "[a-z0-9._-]",
        ),
    ] {
        let e = webhooks(&p)
            .create_webhook_endpoint(pb::CreateWebhookEndpointRequest {
                url: url.into(),
                event_types: vec![],
                caller: caller.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{caller}");
        let got = e
            .get_details_bad_request()
            .expect("field violations")
            .field_violations;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].field, field);
        assert!(got[0].description.contains(rule), "{:?}", got[0]);
    }
    // UpdateWebhookEndpoint applies the same rule.
    let (id, _) = create_endpoint(&p, "https://hooks.example.com/x", &[]).await;
    let e = webhooks(&p)
        .update_webhook_endpoint(pb::UpdateWebhookEndpointRequest {
            id,
            url: Some("https://0x7f.1:443/".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let got = e
        .get_details_bad_request()
        .expect("field violations")
        .field_violations;
    assert_eq!(got[0].field, "url", "{got:?}");
    let missing = webhooks(&p)
        .delete_webhook_endpoint(pb::DeleteWebhookEndpointRequest {
            id: uuid::Uuid::new_v4().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

/// An endpoint stored before the rule read hosts as reqwest does (written straight into
/// the database here: `0x7f000001` is 127.0.0.1): the worker refuses it before
/// connecting, and the listener on that port accepts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_stored_with_a_loopback_spelling_is_refused_before_the_worker_connects() {
    let p = platform(&[Channel::InApp]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (id, _) = create_endpoint(&p, "https://hooks.example.com/x", &["delivery.sent"]).await;
    sqlx::query("UPDATE webhook_endpoints SET url = $1 WHERE id = $2")
        .bind(format!("https://0x7f000001:{port}/hook"))
        .bind(uuid::Uuid::parse_str(&id).unwrap())
        .execute(&p.pool)
        .await
        .unwrap();
    // 127.0.0.1 is no development host of this worker.
    let mut cfg = webhook_config(&p);
    cfg.worker.links.http_hosts.clear();
    let (_stop, _task) = start_webhook_worker(cfg, p.pool.clone());
    p.add_type("order.paid", &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "U", "", "").await;
    p.send(&uniq("e"), "order.paid", &[&user]).await;
    let attempts = eventually("an attempt recorded", Duration::from_secs(20), async || {
        let msg: Option<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM webhook_messages")
            .fetch_optional(&p.pool)
            .await
            .unwrap();
        let Some(msg) = msg else { return Err(vec![]) };
        let a = notify_store::webhooks::attempts_of(&p.pool, msg)
            .await
            .unwrap();
        if a.is_empty() { Err(a) } else { Ok(a) }
    })
    .await;
    let error = attempts[0].error.clone().unwrap_or_default();
    assert!(error.starts_with("refused: "), "{attempts:#?}");
    assert_eq!(attempts[0].status_code, None);
    let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(accepted.is_err(), "the worker connected: {accepted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_endpoint_registered_the_enqueue_of_a_record_costs_one_index_probe() {
    let p = platform(&[Channel::InApp]).await;
    p.add_type("order.paid", &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "U", "", "").await;
    p.send(&uniq("e"), "order.paid", &[&user]).await;
    let ids: Vec<uuid::Uuid> = deliveries(&p).await.into_iter().map(|d| d.0).collect();
    let mut tx = p.pool.begin().await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {}",
        notify_store::webhooks::ENQUEUE_SQL
    )))
    .bind(&ids)
    .bind(vec!["delivery.sent"; ids.len()])
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let plan = plan.join("\n");
    // The uncorrelated EXISTS runs once, on the endpoints table alone; the joins to the
    // delivery, the event and the endpoints never run, and nothing is inserted.
    let scans: Vec<&str> = plan
        .lines()
        .filter(|l| l.contains("Scan") && !l.contains("CTE Scan") && !l.contains("Subquery Scan"))
        .filter(|l| !l.contains("never executed"))
        .collect();
    assert_eq!(scans.len(), 1, "one scan runs: {plan}");
    assert!(scans[0].contains("on webhook_endpoints"), "{plan}");
    assert!(
        plan.lines()
            .filter(|l| l.contains("notification_deliveries") || l.contains("notification_events"))
            .all(|l| l.contains("never executed")),
        "{plan}"
    );
    assert_eq!(p.count("webhook_messages").await, 0);
    println!("{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_message_whose_queue_message_was_lost_is_published_again() {
    let p = platform(&[]).await;
    let rx = Receiver::start(Mode::Ok).await;
    let (id, secret) = create_endpoint(&p, &rx.url, &[]).await;
    // A message committed with its outbox row, published, then lost with the queue: what
    // is left is the pending row, due a minute ago, with no outbox row.
    let msg: uuid::Uuid = p
        .scalar(
            "INSERT INTO webhook_messages (id, endpoint_id, event_type, payload, delivery_id,
                                       state_version, next_attempt_at)
         VALUES (gen_random_uuid(), $1::uuid, 'delivery.sent', '{\"type\":\"delivery.sent\"}',
                 gen_random_uuid(), 1, now() - interval '1 minute')
         RETURNING id",
            &id,
        )
        .await;
    let (_stop, _task) = start_webhook_worker(webhook_config(&p), p.pool.clone());
    let got = eventually(
        "the lost message arrives",
        Duration::from_secs(20),
        async || rx.got().first().cloned().ok_or(()),
    )
    .await;
    assert_eq!(got.id, notify_core::webhook::message_id(msg));
    assert_eq!(verify(&secret, &got, now()), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_manages_and_receives_only_its_own_endpoints_and_a_managing_key_any() {
    let p = Platform::start_with(
        Options::workers(&[Channel::InApp]).auth(ingest::auth::AuthMode::ApiKey),
    )
    .await;
    let admin = api_key(&p, "ops-admin", true).await;
    let shop = api_key(&p, "shop-orders", false).await;
    let forum = api_key(&p, "forum-replies", false).await;
    // The key cache reloads on the table's NOTIFY: wait until every new key is known.
    for key in [&admin, &shop, &forum] {
        eventually("the key works", Duration::from_secs(5), async || {
            webhooks(&p)
                .list_webhook_endpoints(with_key(pb::ListWebhookEndpointsRequest::default(), key))
                .await
                .map(|_| ())
                .map_err(|e| e.code())
        })
        .await;
    }
    let create = |key: &str, url: &str, caller: &str| {
        with_key(
            pb::CreateWebhookEndpointRequest {
                url: url.into(),
                event_types: vec![],
                caller: caller.into(),
            },
            key,
        )
    };
    let shop_ep = webhooks(&p)
        .create_webhook_endpoint(create(&shop, "https://hooks.shop.example.com/n", ""))
        .await
        .unwrap()
        .into_inner()
        .endpoint
        .unwrap();
    assert_eq!(shop_ep.caller, "shop-orders");
    let forum_ep = webhooks(&p)
        .create_webhook_endpoint(create(&forum, "https://hooks.forum.example.com/n", ""))
        .await
        .unwrap()
        .into_inner()
        .endpoint
        .unwrap();
    // Another caller's endpoint is not found, for every method; nor may it register one
    // for another caller.
    let list = |key: &str| {
        let mut c = webhooks(&p);
        let key = key.to_string();
        async move {
            c.list_webhook_endpoints(with_key(pb::ListWebhookEndpointsRequest::default(), &key))
                .await
                .unwrap()
                .into_inner()
                .endpoints
                .into_iter()
                .map(|e| e.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(&forum).await, vec![forum_ep.id.clone()]);
    let e = webhooks(&p)
        .update_webhook_endpoint(with_key(disable(&shop_ep.id), &forum))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = webhooks(&p)
        .rotate_webhook_secret(with_key(
            pb::RotateWebhookSecretRequest {
                id: shop_ep.id.clone(),
                overlap_seconds: 0,
            },
            &forum,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = webhooks(&p)
        .delete_webhook_endpoint(with_key(
            pb::DeleteWebhookEndpointRequest {
                id: shop_ep.id.clone(),
            },
            &forum,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = webhooks(&p)
        .create_webhook_endpoint(create(&forum, "https://evil.example.com/n", "shop-orders"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // A managing key sees both and changes either.
    let mut all = list(&admin).await;
    all.sort();
    let mut both = vec![shop_ep.id.clone(), forum_ep.id.clone()];
    both.sort();
    assert_eq!(all, both);
    let disabled = webhooks(&p)
        .update_webhook_endpoint(with_key(disable(&forum_ep.id), &admin))
        .await
        .unwrap()
        .into_inner()
        .endpoint
        .unwrap();
    assert!(!disabled.enabled);
    assert_eq!(disabled.disabled_reason, "disabled by ops-admin");

    // The shop's deliveries write messages for the shop's endpoint only.
    p.types()
        .upsert_notification_type(with_key(type_request("order.paid", &["inapp"]), &admin))
        .await
        .unwrap();
    let user = uniq("u");
    p.recipients()
        .upsert_recipient(with_key(
            pb::UpsertRecipientRequest {
                user_id: user.clone(),
                display_name: "U".into(),
                ..Default::default()
            },
            &admin,
        ))
        .await
        .unwrap();
    p.ingest()
        .create_event(with_key(p.event(&uniq("e"), "order.paid", &[&user]), &shop))
        .await
        .unwrap();
    let endpoints: Vec<String> = eventually(
        "the sent webhook written",
        Duration::from_secs(20),
        async || {
            let rows: Vec<String> = p
                .query_scalars("SELECT endpoint_id::text FROM webhook_messages")
                .await;
            if rows.is_empty() { Err(()) } else { Ok(rows) }
        },
    )
    .await;
    assert_eq!(endpoints, vec![shop_ep.id.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_deliveries_arrive_as_a_thousand_verified_webhooks_across_a_worker_kill() {
    let p = platform(&[Channel::InApp]).await;
    let rx = Receiver::start(Mode::Ok).await;
    let (_, secret) = create_endpoint(&p, &rx.url, &["delivery.sent"]).await;
    let (_stop, first) = start_webhook_worker(webhook_config(&p), p.pool.clone());
    p.add_type("promo", &["inapp"]).await;
    p.add_topic_audience("shop.sale", "s", 1000).await;
    let mut req = p.event(&uniq("sale"), "promo", &[]);
    req.topic = "shop.sale".into();
    p.ingest().create_event(req).await.unwrap();

    // Killed part way: the task is gone, its leases stay until they run out.
    eventually(
        "a first hundred webhooks",
        Duration::from_secs(60),
        async || {
            let n = rx.got().len();
            if n >= 100 { Ok(()) } else { Err(n) }
        },
    )
    .await;
    first.abort();
    let _ = first.await;
    p.execute("UPDATE webhook_messages SET lease_expires_at = now() WHERE status = 'sending'")
        .await;
    let (_stop2, _second) = start_webhook_worker(webhook_config(&p), p.pool.clone());

    let got = eventually(
        "a thousand distinct webhooks",
        Duration::from_secs(120),
        async || {
            let d = distinct(&rx.got(), &secret);
            if d.len() == 1000 { Ok(d) } else { Err(d.len()) }
        },
    )
    .await;
    let deliveries: BTreeSet<String> = got
        .values()
        .map(|w| w["data"]["delivery_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deliveries.len(), 1000, "one per delivery");
    assert!(got.values().all(|w| w["type"] == "delivery.sent"));
    let received = rx.got().len();
    println!(
        "webhooks: distinct=1000 received={received} duplicates={}",
        received - 1000
    );
    p.wait_query_scalar(
        "every message sent",
        Duration::from_secs(30),
        "SELECT count(*) FROM webhook_messages WHERE status <> 'sent'",
        0,
    )
    .await;
}
