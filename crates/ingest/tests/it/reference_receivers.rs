//! The example receivers (issue 18): `examples/python/webhook_receiver.py` with PyPI's
//! `standardwebhooks` and `examples/node/webhook-receiver.mjs` with npm's, run as child
//! processes exactly as docs/webhooks.md tells a team to run them, against the platform's
//! webhook worker. Both reference libraries verify every webhook of a run of deliveries;
//! both refuse a tampered body and a 10-minute-old timestamp signed by the platform's own
//! signer; during a rotation a receiver knowing only the old or only the new secret
//! verifies, and after the overlap the old one no longer does.
//!
//! The receivers' dependencies are installed by `deploy/local-stack.sh up` (`make up`),
//! which writes `NOTIFY_EXAMPLES_PYTHON` (the venv's python) and `NOTIFY_EXAMPLES_DIR`
//! to the stack's env file.

use crate::support::{self, Platform, eventually, uniq};
use crate::webhooks::{
    create_endpoint, deliveries, platform, start_webhook_worker, webhook_config, webhooks,
};
use notify_core::Channel;
use notify_proto::v1 as pb;
use notify_store::webhooks::ClaimedMessage;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use uuid::Uuid;

/// Which reference library a receiver verifies with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lang {
    Python,
    Node,
}

const BOTH: [Lang; 2] = [Lang::Python, Lang::Node];

/// Where an endpoint points until its receiver is started (a receiver needs the secret
/// the endpoint's creation answers): a development host, so the link policy allows it.
const PLACEHOLDER: &str = "http://127.0.0.1:9/not-yet";

/// The venv's python and the examples folder, from the environment or the stack's env
/// file. Panics naming `make up` when unset: this test never skips.
fn examples() -> (String, PathBuf) {
    let vars = support::stack_env();
    let get = |k: &str| {
        vars.get(k).cloned().unwrap_or_else(|| {
            panic!(
                "{k} is not set: run `make up` (deploy/local-stack.sh up installs the example \
                 receivers' venv and node_modules and writes {k} to the stack's env file)"
            )
        })
    };
    (
        get("NOTIFY_EXAMPLES_PYTHON"),
        PathBuf::from(get("NOTIFY_EXAMPLES_DIR")),
    )
}

/// A reference receiver running as a child process (killed on drop), listening on a free
/// port of 127.0.0.1 and logging one JSON line per POST to its own file.
struct RefReceiver {
    lang: Lang,
    child: tokio::process::Child,
    /// Where to POST (any path does).
    url: String,
    log: PathBuf,
}

impl RefReceiver {
    /// Starts the `lang` receiver knowing `secrets`, and waits for its `listening on` line.
    async fn start(lang: Lang, secrets: &[&str]) -> RefReceiver {
        let (python, dir) = examples();
        let (program, script) = match lang {
            Lang::Python => (python, dir.join("python/webhook_receiver.py")),
            Lang::Node => ("node".to_string(), dir.join("node/webhook-receiver.mjs")),
        };
        assert!(script.exists(), "{} is missing", script.display());
        let log = std::env::temp_dir().join(format!("{}.jsonl", uniq(&format!("{lang:?}-rx"))));
        let mut child = tokio::process::Command::new(&program)
            .arg(&script)
            .env("WEBHOOK_SECRET", secrets.join(","))
            .env("HOST", "127.0.0.1")
            .env("PORT", "0")
            .env("WEBHOOK_LOG", &log)
            // Nothing inherited: Node sets O_NONBLOCK on the stdio pipes it is given, which
            // would make the test harness's own writes to the shared pipe fail (EAGAIN).
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(log.with_extension("stderr")).expect("receiver stderr file"),
            ))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{program} {}: {e}", script.display()));
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{lang:?} receiver: no `listening on` line within 20 s"))
            .expect("the receiver's stdout")
            .unwrap_or_else(|| panic!("{lang:?} receiver exited before listening"));
        let port: u16 = line
            .strip_prefix("listening on http://127.0.0.1:")
            .and_then(|rest| rest.strip_suffix('/'))
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("{lang:?} receiver printed {line:?}"));
        assert_ne!(port, 0, "the real port");
        // Anything it prints later is read, so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        RefReceiver {
            lang,
            child,
            url: format!("http://127.0.0.1:{port}/hooks/notify"),
            log,
        }
    }

    /// The complete lines of its log so far, parsed.
    fn lines(&self) -> Vec<Value> {
        let text = match std::fs::read_to_string(&self.log) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => panic!("{}: {e}", self.log.display()),
        };
        let mut parts: Vec<&str> = text.split('\n').collect();
        parts.pop(); // after the last newline: empty, or a line still being written
        parts
            .into_iter()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("{:?} log line {l:?}: {e}", self.lang))
            })
            .collect()
    }

    /// The webhook-ids its library verified, each once.
    fn verified(&self) -> BTreeSet<String> {
        self.lines()
            .iter()
            .filter(|l| l["verified"] == true)
            .map(|l| l["webhook_id"].as_str().unwrap().to_string())
            .collect()
    }

    /// The lines of requests its library refused.
    fn refused(&self) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|l| l["verified"] != true)
            .collect()
    }
}

impl RefReceiver {
    /// Sends `signal` (`TERM`, `INT`) and waits up to 5 s for the exit.
    async fn stop(&mut self, signal: &str) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running").to_string();
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill");
        assert!(sent.success(), "kill -{signal} {pid}");
        tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{:?} receiver still running 5 s after SIG{signal}",
                    self.lang
                )
            })
            .unwrap()
    }
}

impl Drop for RefReceiver {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Points endpoint `id` at `url`.
async fn point(p: &Platform, id: &str, url: &str) {
    webhooks(p)
        .update_webhook_endpoint(pb::UpdateWebhookEndpointRequest {
            id: id.into(),
            url: Some(url.into()),
            ..Default::default()
        })
        .await
        .expect("UpdateWebhookEndpoint");
}

/// An endpoint for `types` and a `lang` receiver knowing its secret, pointed at it.
async fn endpoint_with_receiver(p: &Platform, lang: Lang, types: &[&str]) -> (String, RefReceiver) {
    let (id, secret) = create_endpoint(p, PLACEHOLDER, types).await;
    let rx = RefReceiver::start(lang, &[&secret]).await;
    point(p, &id, &rx.url).await;
    (id, rx)
}

/// The `webhook-id`s of the messages written for endpoint `id`.
async fn message_ids(p: &Platform, id: &str) -> BTreeSet<String> {
    let ids: Vec<Uuid> = p
        .scalars(
            "SELECT id FROM webhook_messages WHERE endpoint_id = $1::uuid",
            id,
        )
        .await;
    ids.into_iter()
        .map(notify_core::webhook::message_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_reference_libraries_verify_every_webhook_of_a_run_and_see_every_final_state() {
    let p = platform(&[Channel::InApp, Channel::Email]).await;
    let mut endpoints = Vec::new();
    for lang in BOTH {
        endpoints.push(endpoint_with_receiver(&p, lang, &[]).await);
    }
    // 200 in-app deliveries of one topic event (sent) and an email to an unknown mailbox
    // (550 5.1.1: failed).
    p.add_type("promo", &["inapp"]).await;
    p.add_type("order.paid", &["email"]).await;
    p.add_topic_audience("shop.sale", "s", 200).await;
    let bad = uniq("bad");
    p.add_recipient(&bad, "Bad", &format!("nouser-{bad}@example.test"), "")
        .await;
    let started = std::time::Instant::now();
    let (_stop, _task) = start_webhook_worker(webhook_config(&p), p.pool.clone());
    let mut sale = p.event(&uniq("sale"), "promo", &[]);
    sale.topic = "shop.sale".into();
    p.ingest().create_event(sale).await.unwrap();
    p.send(&uniq("order"), "order.paid", &[&bad]).await;

    let finals = eventually("every delivery ends", Duration::from_secs(60), async || {
        let d = deliveries(&p).await;
        if d.len() == 201 && d.iter().all(|(_, s, _)| s != "pending" && s != "sending") {
            Ok(d)
        } else {
            Err(d.len())
        }
    })
    .await;
    assert_eq!(
        finals.iter().filter(|d| d.1 == "failed").count(),
        1,
        "{finals:?}"
    );
    // Every message answered 2xx: each receiver's library verified it.
    p.wait_query_scalar(
        "every webhook answered 2xx",
        Duration::from_secs(60),
        "SELECT count(*) FROM webhook_messages WHERE status <> 'sent'",
        0,
    )
    .await;
    println!(
        "reference receivers: {} deliveries verified by both in {:?}",
        finals.len(),
        started.elapsed()
    );

    for (id, rx) in &endpoints {
        let lang = rx.lang;
        let lines = rx.lines();
        assert_eq!(
            rx.refused(),
            Vec::<Value>::new(),
            "{lang:?}: nothing refused"
        );
        let rows = message_ids(&p, id).await;
        assert!(rows.len() >= 201, "{lang:?}: {} messages", rows.len());
        // Exactly one verified webhook-id per message, each first seen once.
        assert_eq!(rx.verified(), rows, "{lang:?}");
        let first_seen = lines.iter().filter(|l| l["duplicate"] == false).count();
        assert_eq!(first_seen, rows.len(), "{lang:?}");
        let types: BTreeSet<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
        assert!(
            types.contains("delivery.sent") && types.contains("delivery.failed"),
            "{lang:?}: {types:?}"
        );
        // Every delivery's final state arrived, and was not taken for a stale one.
        let mut last: BTreeMap<String, (String, i64, bool)> = BTreeMap::new();
        for l in &lines {
            let v = l["state_version"].as_i64().unwrap();
            let d = l["delivery_id"].as_str().unwrap().to_string();
            if last.get(&d).is_none_or(|(_, seen, _)| *seen <= v) {
                let status = l["status"].as_str().unwrap().to_string();
                last.insert(d, (status, v, l["stale"] == true));
            }
        }
        for (delivery, status, version) in &finals {
            assert_eq!(
                last.get(&delivery.to_string()),
                Some(&(status.clone(), i64::from(*version), false)),
                "{lang:?}: the final state of {delivery}"
            );
        }
    }
}

/// A message as the worker claims it, for the platform's own signer
/// ([`worker_webhook::post::headers`]).
fn claimed(secret: &str, url: &str) -> ClaimedMessage {
    let body = json!({
        "type": "delivery.sent",
        "timestamp": "2026-12-01T19:14:34.927128Z",
        "data": {"event_id": Uuid::new_v4(), "event_key": "order-1001",
                 "delivery_id": Uuid::new_v4(), "user_id": "u-1", "channel": "email",
                 "status": "sent", "state_version": 2, "error": null, "attempts": 1,
                 "sent_at": "2026-12-01T19:14:34.901000Z"}
    });
    ClaimedMessage {
        id: Uuid::new_v4(),
        endpoint_id: Uuid::new_v4(),
        url: url.into(),
        secrets: vec![secret.into()],
        endpoint_enabled: true,
        body: body.to_string(),
        attempt: 1,
        lease_token: Uuid::new_v4(),
        started_at: chrono::Utc::now(),
    }
}

/// POSTs `body` with `headers`: the status and the answer's body.
async fn post(
    http: &reqwest::Client,
    url: &str,
    headers: &[(&str, String)],
    body: String,
) -> (u16, String) {
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let r = req.send().await.expect("POST to the receiver");
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_body_and_an_old_timestamp_fail_in_both_reference_libraries() {
    let secret = notify_core::webhook::new_secret(&rand::random());
    notify_telemetry::install_crypto_provider();
    let http = reqwest::Client::new();
    for (lang, signal) in BOTH.into_iter().zip(["TERM", "INT"]) {
        let mut rx = RefReceiver::start(lang, &[&secret]).await;
        let msg = claimed(&secret, &rx.url);
        let id = notify_core::webhook::message_id(msg.id);
        let now = chrono::Utc::now().timestamp();
        let signed = worker_webhook::post::headers(&msg, now);
        // As signed: verified.
        assert_eq!(
            post(&http, &rx.url, &signed, msg.body.clone()).await,
            (204, String::new()),
            "{lang:?}"
        );
        // The same headers, one word of the body changed.
        let tampered = msg.body.replace("\"sent\"", "\"failed\"");
        assert_ne!(tampered, msg.body);
        let (status, answer) = post(&http, &rx.url, &signed, tampered).await;
        assert_eq!(status, 400, "{lang:?}: {answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["error"], "No matching signature found", "{lang:?}");
        // The body as it was, signed by the platform 10 minutes ago.
        let old = worker_webhook::post::headers(&msg, now - 600);
        let (status, answer) = post(&http, &rx.url, &old, msg.body.clone()).await;
        assert_eq!(status, 400, "{lang:?}: {answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["error"], "Message timestamp too old", "{lang:?}");
        // Only POST, and at most 1 MiB.
        let get = http.get(&rx.url).send().await.unwrap();
        assert_eq!(get.status().as_u16(), 405, "{lang:?}");
        let big = "x".repeat(1024 * 1024 + 1);
        assert_eq!(post(&http, &rx.url, &signed, big).await.0, 413, "{lang:?}");

        let lines = eventually("four log lines", Duration::from_secs(5), async || {
            let l = rx.lines();
            if l.len() == 4 { Ok(l) } else { Err(l) }
        })
        .await;
        assert_eq!(lines[0]["verified"], true, "{lang:?}: {lines:?}");
        assert_eq!(lines[0]["webhook_id"], id.as_str());
        assert_eq!(lines[0]["duplicate"], false);
        assert_eq!(lines[0]["type"], "delivery.sent");
        assert_eq!(lines[0]["state_version"], 2);
        for (line, error) in lines[1..].iter().zip([
            "No matching signature found",
            "Message timestamp too old",
            "body larger than 1 MiB",
        ]) {
            assert_eq!(
                line,
                &json!({"webhook_id": id, "verified": false, "error": error}),
                "{lang:?}"
            );
        }
        // Stopped by a signal: exit code 0.
        let exit = rx.stop(signal).await;
        assert!(exit.success(), "{lang:?} after SIG{signal}: {exit}");
    }
    // The other signal too, on a receiver that has had no request (the first ones had
    // connections kept alive by the client).
    for (lang, signal) in BOTH.into_iter().zip(["INT", "TERM"]) {
        let mut rx = RefReceiver::start(lang, &[&secret]).await;
        let exit = rx.stop(signal).await;
        assert!(exit.success(), "{lang:?} after SIG{signal}: {exit}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rotation_receivers_knowing_only_the_old_or_only_the_new_secret_both_verify() {
    let p = platform(&[Channel::InApp]).await;
    // Per library two endpoints, rotated alike: one's receiver knows only its old secret,
    // the other's only its new one. They get the same changes, each signed for its own.
    let mut cases = Vec::new();
    for lang in BOTH {
        for knows_new in [false, true] {
            let (id, old) = create_endpoint(&p, PLACEHOLDER, &["delivery.sent"]).await;
            let new = webhooks(&p)
                .rotate_webhook_secret(pb::RotateWebhookSecretRequest {
                    id: id.clone(),
                    overlap_seconds: 3600,
                })
                .await
                .unwrap()
                .into_inner()
                .secret;
            assert_ne!(new, old);
            let rx = RefReceiver::start(lang, &[if knows_new { &new } else { &old }]).await;
            point(&p, &id, &rx.url).await;
            cases.push((knows_new, id, rx));
        }
    }
    let (_stop, _task) = start_webhook_worker(webhook_config(&p), p.pool.clone());
    p.add_type("order.paid", &["inapp"]).await;
    let users: Vec<String> = (0..3).map(|i| uniq(&format!("u{i}"))).collect();
    for u in &users {
        p.add_recipient(u, "U", "", "").await;
    }
    let users: Vec<&str> = users.iter().map(String::as_str).collect();

    // During the overlap every receiver verifies every message.
    p.send(&uniq("e1"), "order.paid", &users).await;
    let mut during = Vec::new();
    for (knows_new, id, rx) in &cases {
        let ids = eventually(
            "three verified during the overlap",
            Duration::from_secs(30),
            async || {
                let rows = message_ids(&p, id).await;
                if rows.len() == 3 && rx.verified() == rows {
                    Ok(rows)
                } else {
                    Err((rows.len(), rx.lines()))
                }
            },
        )
        .await;
        assert_eq!(
            rx.refused(),
            Vec::<Value>::new(),
            "{:?} knowing the {}",
            rx.lang,
            if *knows_new { "new" } else { "old" }
        );
        during.push(ids);
    }

    // The overlap ends (moved to now instead of waiting an hour): only the new secret
    // signs, so the receivers knowing only the old one refuse every new message.
    p.execute("UPDATE webhook_endpoints SET previous_expires_at = now()")
        .await;
    p.send(&uniq("e2"), "order.paid", &users).await;
    for ((knows_new, id, rx), before) in cases.iter().zip(&during) {
        let what = format!(
            "{:?} knowing the {}",
            rx.lang,
            if *knows_new { "new" } else { "old" }
        );
        let after = eventually("three more answered", Duration::from_secs(30), async || {
            let rows: BTreeSet<String> = message_ids(&p, id)
                .await
                .difference(before)
                .cloned()
                .collect();
            let refused: BTreeSet<String> = rx
                .refused()
                .iter()
                .map(|l| l["webhook_id"].as_str().unwrap().to_string())
                .collect();
            let answered = if *knows_new { rx.verified() } else { refused };
            if rows.len() == 3 && rows.is_subset(&answered) {
                Ok(rows)
            } else {
                Err((rows.len(), rx.lines()))
            }
        })
        .await;
        if *knows_new {
            assert_eq!(rx.refused(), Vec::<Value>::new(), "{what}");
        } else {
            // Refused by the library, never verified.
            assert_eq!(&rx.verified(), before, "{what}");
            for line in rx.refused() {
                assert_eq!(line["error"], "No matching signature found", "{what}");
                assert!(
                    after.contains(line["webhook_id"].as_str().unwrap()),
                    "{what}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reference_receiver_takes_a_thousand_webhooks_from_four_concurrent_senders() {
    notify_telemetry::install_crypto_provider();
    let secret = notify_core::webhook::new_secret(&rand::random());
    for lang in BOTH {
        let rx = RefReceiver::start(lang, &[&secret]).await;
        let msgs: Vec<ClaimedMessage> = (0..1000).map(|_| claimed(&secret, &rx.url)).collect();
        let want: BTreeSet<String> = msgs
            .iter()
            .map(|m| notify_core::webhook::message_id(m.id))
            .collect();
        let started = std::time::Instant::now();
        // Four senders, each with its kept-alive connection, as the worker's per-endpoint
        // cap (NOTIFY_WEBHOOK_ENDPOINT_CONCURRENCY = 4) sends.
        let mut senders = tokio::task::JoinSet::new();
        for part in msgs.chunks(250).map(<[ClaimedMessage]>::to_vec) {
            senders.spawn(async move {
                let http = reqwest::Client::new();
                let mut statuses = BTreeMap::<u16, usize>::new();
                for m in part {
                    let headers = worker_webhook::post::headers(&m, chrono::Utc::now().timestamp());
                    let (status, _) = post(&http, &m.url, &headers, m.body).await;
                    *statuses.entry(status).or_default() += 1;
                }
                statuses
            });
        }
        let statuses = senders.join_all().await;
        let took = started.elapsed();
        assert!(
            statuses.iter().all(|s| s.keys().eq([&204])),
            "{lang:?}: {statuses:?}"
        );
        assert_eq!(rx.verified(), want, "{lang:?}");
        assert_eq!(rx.lines().len(), 1000, "{lang:?}: one line per request");
        println!("{lang:?} reference receiver: 1000 webhooks from 4 senders in {took:?}");
    }
}
