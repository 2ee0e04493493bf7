//! Browser tests in headless Chromium (Debian's package, driven by playwright-core; the
//! local stack installs both): the example inbox page and the operations console, against
//! an in-process platform. Screenshots are saved under `<target dir>/screenshots/` (each
//! test prints the folder) for a person to look at.

use crate::support;

use notify_core::Channel;
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{Platform, click_triples, inbox_token, status_attempts, uniq};

/// Copies `script` next to playwright-core (ES modules resolve packages from the script's
/// folder) and returns the command that runs it, with the screenshot folder.
fn node(p: &Platform, script: &str) -> (Command, PathBuf) {
    let modules = PathBuf::from(&p.stack.browser_modules);
    let dir = modules.parent().unwrap().to_path_buf();
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    println!("screenshots of {script}: {}", shots.display());
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/browser")
        .join(script);
    let copy = dir.join(format!("{}-{script}", uniq("run")));
    std::fs::copy(&src, &copy).unwrap();
    // The scripts import ./harness.mjs: put it beside them whole (a rename, so a script of
    // a test running at the same time never reads half a file).
    let harness = dir.join(format!("{}-harness.mjs", uniq("run")));
    std::fs::copy(src.with_file_name("harness.mjs"), &harness).unwrap();
    std::fs::rename(&harness, dir.join("harness.mjs")).unwrap();
    let mut cmd = Command::new("node");
    cmd.arg(&copy)
        .env("BASE", &p.http_url)
        .env("SHOTS", &shots)
        .env("CHROMIUM", &p.stack.chromium)
        // Not inherited: Node sets O_NONBLOCK on the stdio it is given, shared with the
        // test harness's own output.
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    (cmd, shots)
}

/// An inbox token for `user`, valid for ten minutes.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_inbox_updates_live_and_marks_all_read_in_chromium() {
    let p = Platform::start_with_type(&[Channel::InApp], "news", &["inapp"]).await;
    let u = p.add_bare_recipient("u").await;
    let ev = p.send("first", "news", &[&u]).await;
    p.wait_final(&ev.event_id, 30).await;

    let (mut cmd, shots) = node(&p, "inbox.mjs");
    let mut child = cmd
        .env("TOKEN", inbox_token(&u, 600))
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
    let ev = p.create_event(req).await;
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
    let unread = p.unread_count(&u).await;
    assert_eq!(unread, 0, "mark all read reached the database");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_failed_line_delivery_in_chromium() {
    let p = Platform::start_with_type(&[Channel::Line], "order_paid", &["line"]).await;
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
}

/// A running browser script that reports steps as lines on stdout and waits for a line
/// on stdin to go on.
struct Script {
    child: Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Script {
    fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd.stdin(Stdio::piped()).spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Script { child, lines }
    }

    /// The next line starting with `prefix` (earlier lines are echoed); panics with the
    /// script's error output when it ends first or takes over a minute.
    async fn expect(&mut self, prefix: &str) -> String {
        loop {
            match tokio::time::timeout(Duration::from_secs(60), self.lines.recv()).await {
                Ok(Some(line)) if line.starts_with(prefix) => return line,
                Ok(Some(line)) => println!("browser: {line}"),
                other => {
                    let _ = self.child.kill();
                    let mut err = String::new();
                    if let Some(mut e) = self.child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    panic!("the browser script stopped before {prefix} ({other:?}):\n{err}");
                }
            }
        }
    }

    fn go(&mut self) {
        writeln!(self.child.stdin.as_mut().unwrap(), "go").unwrap();
    }
}

/// Where the user's inbox row with `title` stands: (status, clicked action).
async fn row(p: &Platform, user: &str, title: &str) -> (String, Option<String>) {
    sqlx::query_as(
        "SELECT status, clicked_action FROM notifications WHERE user_id = $1 AND title = $2",
    )
    .bind(user)
    .bind(title)
    .fetch_one(&p.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_inbox_shows_thai_dates_rich_items_pages_and_misses_nothing_in_chromium() {
    let p = Platform::start_with_type(&[Channel::InApp], "news", &["inapp"]).await;
    p.add_type("order_paid", &["inapp"]).await;
    let u = p.add_bare_recipient("u").await;
    let notify = async |key: &str, title: &str| {
        let mut req = p.event(key, "news", &[&u]);
        let c = req.content.as_mut().unwrap();
        c.title = title.into();
        c.body = "มีข่าวใหม่จากร้านค้า".into();
        let ev = p.create_event(req).await;
        p.wait_final(&ev.event_id, 30).await;
    };
    for n in 1..=5 {
        notify(&format!("news:{n}"), &format!("ข่าวที่ {n}")).await;
    }
    // 00:30 on 29 November 2026 in Bangkok, still the 28th in UTC (the browser's zone).
    p.exec(
        "UPDATE notifications SET created_at = '2026-11-28T17:30:00Z'
         WHERE user_id = $1 AND title = 'ข่าวที่ 1'",
        &u,
    )
    .await;
    let rich = p
        .create_event(p.rich_event("order:1001:paid", "order_paid", &[&u]))
        .await;
    let rich = p.wait_final(&rich.event_id, 30).await;

    let (mut cmd, shots) = node(&p, "inbox_rich.mjs");
    cmd.env("TOKEN", inbox_token(&u, 600));
    let mut script = Script::spawn(cmd);
    // The page listed its first page and holds its stream: this one falls in the gap.
    script.expect("LISTED").await;
    notify("news:gap", "มาระหว่างรอ").await;
    script.go();
    script.expect("ARCHIVED").await;
    assert_eq!(row(&p, &u, "ข่าวที่ 3").await.0, "archived");
    script.go();
    let nav = script.expect("NAVIGATED").await;
    assert_eq!(nav, "NAVIGATED https://shop.example.test/orders/1001");
    assert_eq!(
        row(&p, &u, "ชำระเงินแล้ว #1001").await,
        ("read".to_string(), Some("view".to_string()))
    );
    let delivery: uuid::Uuid = rich.deliveries[0].delivery_id.parse().unwrap();
    let clicks = notify_store::clicks::clicks_of(&p.pool, delivery)
        .await
        .unwrap();
    let clicks = click_triples(&clicks);
    assert_eq!(clicks, [(u.as_str(), "view", "inapp")]);
    script.expect("OK").await;
    let status = script.child.wait().unwrap();
    assert!(status.success(), "the browser script failed");
    assert_eq!(row(&p, &u, "ข่าวที่ 3").await.0, "read", "unarchived");
    for name in [
        "1-first-page",
        "2-second-page",
        "3-archived",
        "4-action-focused",
        "5-after-click",
    ] {
        assert!(shots.join(format!("inbox-{name}.png")).exists(), "{name}");
    }
}
