//! The gRPC client examples (issue 22): `examples/python/send_event.py` (grpcio, code
//! generated from `proto/notify/v1` when it starts), `examples/node/send-event.mjs`
//! (@grpc/grpc-js with @grpc/proto-loader) and the reflection client
//! `examples/python/grpc_call.py` (grpcio-reflection, no .proto at all), run as child
//! processes exactly as docs/quickstart.md tells a team to run them, against an ingest
//! that checks API keys and an in-app worker. Each one's event is delivered (an inbox
//! row, its delivery `sent` as the example prints it); each prints the field violations
//! of a bad request as `field: rule` lines; each retries UNAVAILABLE and nothing else.
//!
//! The examples read the repository's `proto/` (and the server's reflection, built from
//! it), so a proto change that breaks one fails here. Their dependencies are installed
//! by `deploy/local-stack.sh up` (`make up`, and so `make test`), which writes
//! `NOTIFY_EXAMPLES_PYTHON` (the venv's python) and `NOTIFY_EXAMPLES_DIR` to the stack's
//! env file; this test never skips.

use crate::support::{
    self, Options, Platform, api_key, event_request, eventually, free_addr, uniq, with_key,
};
use notify_core::Channel;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

/// One of the client examples.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Client {
    Python,
    Node,
}

const BOTH: [Client; 2] = [Client::Python, Client::Node];

/// The venv's python and the examples folder, from the environment or the stack's env
/// file. Panics naming `make up` when unset: this test never skips.
fn examples() -> (String, PathBuf) {
    let vars = support::stack_env();
    let get = |k: &str| {
        vars.get(k).cloned().unwrap_or_else(|| {
            panic!(
                "{k} is not set: run `make up` (deploy/local-stack.sh up installs the examples' \
                 venv and node_modules and writes {k} to the stack's env file)"
            )
        })
    };
    (
        get("NOTIFY_EXAMPLES_PYTHON"),
        PathBuf::from(get("NOTIFY_EXAMPLES_DIR")),
    )
}

/// What a finished example printed.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }
}

/// Runs `program script args` with the address and key in the environment, as the
/// quickstart does, and waits up to 90 s for it.
async fn run(program: &str, script: PathBuf, args: &[&str], addr: &str, key: &str) -> Run {
    assert!(script.exists(), "{} is missing", script.display());
    let child = tokio::process::Command::new(program)
        .arg(&script)
        .args(args)
        .env("NOTIFY_GRPC_ADDR", addr)
        .env("NOTIFY_API_KEY", key)
        .env_remove("NOTIFY_PROTO_DIR")
        // Nothing inherited: Node sets O_NONBLOCK on the stdio it is given.
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{program} {}: {e}", script.display()));
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?}: still running after 90 s", script.display()))
        .expect("the example's output");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the `client` example's `send` program with `args`.
async fn send(client: Client, args: &[&str], addr: &str, key: &str) -> Run {
    let (python, dir) = examples();
    match client {
        Client::Python => run(&python, dir.join("python/send_event.py"), args, addr, key).await,
        Client::Node => run("node", dir.join("node/send-event.mjs"), args, addr, key).await,
    }
}

/// Runs the reflection client `grpc_call.py` with `args`.
async fn grpc_call(args: &[&str], addr: &str, key: &str) -> Run {
    let (python, dir) = examples();
    run(&python, dir.join("python/grpc_call.py"), args, addr, key).await
}

/// A platform whose ingest checks API keys, with the in-app worker only.
async fn platform() -> Platform {
    Platform::start_with(Options::workers(&[Channel::InApp]).auth(ingest::auth::AuthMode::ApiKey))
        .await
}

/// Registers the type `order_paid` (in-app) and the recipient `user` through the
/// reflection client, with the quickstart's requests; returns nothing, asserts success.
async fn register(addr: &str, key: &str, user: &str) {
    let ty = grpc_call(
        &[
            "notify.v1.TypeService/UpsertNotificationType",
            r#"{"key": "order_paid", "default_channels": ["inapp"]}"#,
        ],
        addr,
        key,
    )
    .await;
    assert_eq!(ty.code, Some(0), "UpsertNotificationType: {ty:#?}");
    let body = format!(r#"{{"user_id": "{user}", "display_name": "Somchai", "locale": "th-TH"}}"#);
    let rcpt = grpc_call(
        &["notify.v1.RecipientService/UpsertRecipient", &body],
        addr,
        key,
    )
    .await;
    assert_eq!(rcpt.code, Some(0), "UpsertRecipient: {rcpt:#?}");
    assert!(rcpt.stdout.contains(user), "{rcpt:#?}");
}

/// The id of the inbox row written for `event_id` to `user`, once there is one.
async fn inbox_row(p: &Platform, event_id: &str, user: &str) -> String {
    eventually("the inbox row", Duration::from_secs(30), async || {
        sqlx::query_scalar::<_, String>(
            "SELECT title FROM notifications WHERE event_id = $1::uuid AND user_id = $2",
        )
        .bind(event_id)
        .bind(user)
        .fetch_optional(&p.pool)
        .await
        .unwrap()
        .ok_or(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_node_and_reflection_clients_each_send_an_event_that_reaches_the_inbox() {
    let p = platform().await;
    let addr = p.grpc_addr.to_string();
    let key = api_key(&p, "shop-checkout", true).await;
    let user = uniq("customer");
    register(&addr, &key, &user).await;
    let list = grpc_call(&["list"], &addr, &key).await;
    assert!(
        list.lines().contains(&"notify.v1.IngestService"),
        "{list:#?}"
    );
    let described = grpc_call(&["describe", "notify.v1.CreateEventRequest"], &addr, &key).await;
    assert!(
        described
            .lines()
            .contains(&"  string event_key = 1  (JSON eventKey)"),
        "{described:#?}"
    );

    for client in BOTH {
        let event_key = uniq(&format!("order:{client:?}:paid"));
        let out = send(
            client,
            &["--event-key", &event_key, "--user", &user],
            &addr,
            &key,
        )
        .await;
        assert_eq!(out.code, Some(0), "{client:?}: {out:#?}");
        let lines = out.lines();
        let event_id = lines[0]
            .strip_prefix("event ")
            .and_then(|rest| rest.strip_suffix(" created"))
            .unwrap_or_else(|| panic!("{client:?} printed {lines:?}"));
        assert_eq!(
            lines[1..],
            [format!("inapp {user} sent attempts=1")],
            "{client:?}: {out:#?}"
        );
        // The example names the order its key names: order:<id>:...
        let order = event_key.split(':').nth(1).expect("order:<id>:paid");
        assert_eq!(
            inbox_row(&p, event_id, &user).await,
            format!("Order {order} paid")
        );
        let ev = p
            .ingest()
            .get_event(with_key(event_request(event_id), &key))
            .await
            .expect("GetEvent")
            .into_inner();
        assert_eq!(ev.event_key, event_key);
        support::assert_all_sent(&ev);

        // The same event key again: the platform's deduplication answers the same event.
        let again = send(
            client,
            &["--event-key", &event_key, "--user", &user],
            &addr,
            &key,
        )
        .await;
        assert_eq!(again.code, Some(0), "{client:?}: {again:#?}");
        assert_eq!(
            again.lines()[0],
            format!("event {event_id} duplicate"),
            "{again:#?}"
        );
    }

    // The reflection client, as the quickstart's shell steps use it.
    let event_key = uniq("order:reflection:paid");
    let body = format!(
        r#"{{"event_key": "{event_key}", "type": "order_paid", "recipients": ["{user}"],
            "content": {{"title": "Order 1001 paid", "body": "We received 1,250.00 THB."}}}}"#
    );
    let created = grpc_call(&["notify.v1.IngestService/CreateEvent", &body], &addr, &key).await;
    assert_eq!(created.code, Some(0), "{created:#?}");
    let reply: serde_json::Value = serde_json::from_str(&created.stdout).expect("JSON");
    let event_id = reply["eventId"].as_str().expect("eventId").to_string();
    assert_eq!(inbox_row(&p, &event_id, &user).await, "Order 1001 paid");
    let got = eventually("GetEvent says sent", Duration::from_secs(30), async || {
        let body = format!(r#"{{"event_id": "{event_id}"}}"#);
        let out = grpc_call(&["notify.v1.IngestService/GetEvent", &body], &addr, &key).await;
        assert_eq!(out.code, Some(0), "{out:#?}");
        let ev: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
        if ev["deliveries"][0]["status"] == "sent" {
            Ok(ev)
        } else {
            Err(ev)
        }
    })
    .await;
    assert_eq!(got["deliveries"][0]["channel"], "inapp", "{got:#}");
    assert_eq!(got["deliveries"][0]["userId"], user.as_str(), "{got:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_prints_the_field_violations_of_a_bad_request_one_per_line() {
    let p = platform().await;
    let addr = p.grpc_addr.to_string();
    let key = api_key(&p, "shop-checkout", true).await;
    register(&addr, &key, &uniq("customer")).await;
    let expected = [
        "event_key: is required and must not be blank",
        "recipients[0]: is required and must not be blank",
    ];
    for client in BOTH {
        let out = send(client, &["--bad"], &addr, &key).await;
        assert_eq!(out.code, Some(2), "{client:?}: {out:#?}");
        assert!(
            out.stderr.contains("CreateEvent failed: INVALID_ARGUMENT"),
            "{client:?}: {out:#?}"
        );
        for line in expected {
            assert!(
                out.lines().contains(&line),
                "{client:?} lacks {line:?}: {out:#?}"
            );
        }
        assert!(
            out.lines()
                .iter()
                .any(|l| l.starts_with("payload: must be a JSON object")),
            "{client:?}: {out:#?}"
        );
        assert_eq!(out.lines().len(), 3, "one line per violation: {out:#?}");
    }
    let bad = grpc_call(
        &[
            "notify.v1.IngestService/CreateEvent",
            r#"{"event_key": "", "type": "order_paid", "recipients": [""], "payload": "{not json"}"#,
        ],
        &addr,
        &key,
    )
    .await;
    assert_eq!(bad.code, Some(1), "{bad:#?}");
    assert!(bad.stderr.starts_with("ERROR INVALID_ARGUMENT"), "{bad:#?}");
    for line in expected {
        assert!(
            bad.lines().contains(&line),
            "reflection lacks {line:?}: {bad:#?}"
        );
    }
    // Nothing was written.
    assert_eq!(p.count("notification_events").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_retries_unavailable_only_and_a_refused_key_at_once() {
    let p = platform().await;
    let addr = p.grpc_addr.to_string();
    // Nothing listens here: UNAVAILABLE, retried four times, then given up.
    let nowhere = free_addr().to_string();
    for client in BOTH {
        let out = send(client, &[], &nowhere, "nk_whatever").await;
        assert_eq!(out.code, Some(1), "{client:?}: {out:#?}");
        let retries = out.stderr.matches("UNAVAILABLE (").count();
        assert_eq!(retries, 4, "{client:?}: {out:#?}");
        assert!(
            out.stderr.contains("CreateEvent failed: UNAVAILABLE"),
            "{client:?}: {out:#?}"
        );
    }
    // An unknown key: UNAUTHENTICATED, final at once.
    for client in BOTH {
        let out = send(client, &[], &addr, "nk_not-a-key").await;
        assert_eq!(out.code, Some(1), "{client:?}: {out:#?}");
        assert!(!out.stderr.contains("retry"), "{client:?}: {out:#?}");
        assert!(
            out.stderr.contains("CreateEvent failed: UNAUTHENTICATED"),
            "{client:?}: {out:#?}"
        );
    }
    let out = grpc_call(
        &["notify.v1.IngestService/GetEvent", r#"{"event_key": "x"}"#],
        &addr,
        "nk_not-a-key",
    )
    .await;
    assert_eq!(out.code, Some(1), "{out:#?}");
    assert!(out.stderr.starts_with("ERROR UNAUTHENTICATED"), "{out:#?}");
}
