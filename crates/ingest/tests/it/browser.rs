//! Browser tests in headless Chromium (Debian's package, driven by playwright-core; the
//! local stack installs both): the example inbox page and the operations console, against
//! an in-process platform. Screenshots are saved under `.stack/screenshots/`.

use crate::support;

use notify_core::Channel;
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use support::{Platform, hs256, status_attempts, uniq};

/// Copies `script` next to playwright-core (ES modules resolve packages from the script's
/// folder) and returns the command that runs it, with the screenshot folder.
fn node(p: &Platform, script: &str) -> (Command, PathBuf) {
    let modules = PathBuf::from(&p.stack.browser_modules);
    let dir = modules.parent().unwrap().to_path_buf();
    let shots = dir.parent().unwrap().join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/browser")
        .join(script);
    let copy = dir.join(format!("{}-{script}", uniq("run")));
    std::fs::copy(src, &copy).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(&copy)
        .env("BASE", &p.http_url)
        .env("SHOTS", &shots)
        .env("CHROMIUM", &p.stack.chromium)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    (cmd, shots)
}

/// An inbox token for `user`, valid for ten minutes.
fn token(user: &str) -> String {
    hs256(
        &json!({"sub": user, "exp": chrono::Utc::now().timestamp() + 600}),
        support::INBOX_SECRET,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_inbox_updates_live_and_marks_all_read_in_chromium() {
    let p = Platform::start_with_workers(&[Channel::InApp]).await;
    p.add_type("news", &["inapp"]).await;
    let u = p.add_bare_recipient("u").await;
    let ev = p.send("first", "news", &[&u]).await;
    p.wait_final(&ev.event_id, 30).await;

    let (mut cmd, shots) = node(&p, "inbox.mjs");
    let mut child = cmd
        .env("TOKEN", token(&u))
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let ready = tokio::task::spawn_blocking(move || {
        out.read_line(&mut line).unwrap();
        (out, line)
    });
    let (mut out, line) = ready.await.unwrap();
    assert_eq!(
        line.trim(),
        "READY",
        "the page did not show the first notification"
    );
    let mut req = p.event("live", "news", &[&u]);
    req.content.as_mut().unwrap().title = "ข้อความใหม่แบบสด".into();
    let ev = p.ingest().create_event(req).await.unwrap().into_inner();
    p.wait_final(&ev.event_id, 30).await;
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    let result = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        (child.wait_with_output().unwrap(), rest)
    })
    .await
    .unwrap();
    let (output, rest) = result;
    assert!(
        output.status.success() && rest.contains("OK"),
        "browser test failed: {rest}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(shots.join("inbox-3-all-read.png").exists());
    let unread: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM notifications WHERE user_id = $1 AND status = 'unread'",
    )
    .bind(&u)
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert_eq!(unread, 0, "mark all read reached the database");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_failed_line_delivery_in_chromium() {
    let p = Platform::start_with_workers(&[Channel::Line]).await;
    p.add_type("order_paid", &["line"]).await;
    let (u, lid) = p.add_line_recipient("u").await;
    let error = "The property, to, in the request body is invalid";
    p.sim_fault(json!({"provider": "line", "target_contains": lid, "status": 400, "times": 1, "body": {"message": error}}))
        .await;
    let key = format!("order:{u}:paid");
    let ev = p.send(&key, "order_paid", &[&u]).await;
    assert_eq!(
        p.wait_final(&ev.event_id, 30).await.deliveries[0].status,
        "failed"
    );

    let (mut cmd, shots) = node(&p, "console.mjs");
    let p2 = cmd
        .env("USER", support::CONSOLE_USER)
        .env("PASSWORD", support::CONSOLE_PASSWORD)
        .env("EVENT_KEY", &key)
        .env("PROVIDER_ERROR", error);
    let output = tokio::task::spawn_blocking({
        let child = p2.spawn().unwrap();
        move || child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "browser test failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(shots.join("console-3-sent.png").exists());
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(status_attempts(&done.deliveries[0]), ("sent", 2));
    p.stop().await;
}
