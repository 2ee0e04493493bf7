//! The Standard Webhooks receivers of `examples/` (`python/webhook_receiver.py` and
//! `node/webhook-receiver.mjs`, each verifying with its language's `standardwebhooks`
//! reference library), started as child processes by `chaos` and `demo`, and their logs
//! read back. Their contract (environment, `listening on` line, one JSON line per request
//! in `WEBHOOK_LOG`) is in `docs/webhooks.md`, "Receiving them".

use anyhow::{Context, bail};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// Where the receivers are.
#[derive(Debug, Clone)]
pub struct Examples {
    /// Python of the examples' virtual environment (`NOTIFY_EXAMPLES_PYTHON`).
    pub python: PathBuf,
    /// The repository's `examples/` folder (`NOTIFY_EXAMPLES_DIR`).
    pub dir: PathBuf,
}

/// A running receiver; killed when dropped.
pub struct Receiver {
    /// `python` or `node`.
    pub lang: &'static str,
    /// `http://127.0.0.1:<port>/hooks/<lang>`.
    pub url: String,
    /// Its `WEBHOOK_LOG`.
    pub log: PathBuf,
    child: Child,
}

/// A free loopback port (bound and released; the receiver binds it a moment later).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Examples {
    /// Starts the `lang` receiver (`python` or `node`) on `port` with `secret`, logging its
    /// requests to `log` (emptied first) and its stderr to `stderr`; waits up to 30 s for
    /// its `listening on` line.
    pub async fn start(
        &self,
        lang: &'static str,
        port: u16,
        secret: &str,
        log: &Path,
        stderr: &Path,
    ) -> anyhow::Result<Receiver> {
        let mut cmd = if lang == "python" {
            let mut c = Command::new(&self.python);
            c.arg(self.dir.join("python/webhook_receiver.py"));
            c
        } else {
            let mut c = Command::new("node");
            c.arg(self.dir.join("node/webhook-receiver.mjs"));
            c
        };
        let _ = std::fs::remove_file(log);
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(stderr)?;
        let mut child = cmd
            .env("WEBHOOK_SECRET", secret)
            .env("HOST", "127.0.0.1")
            .env("PORT", port.to_string())
            .env("WEBHOOK_LOG", log)
            // Nothing inherited: Node sets O_NONBLOCK on the stdio pipes it is given, which
            // would make this tool's own writes to a shared pipe fail (EAGAIN).
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the {lang} webhook receiver"))?;
        let stdout = child.stdout.take().context("receiver stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await? {
                if l.starts_with("listening on") {
                    return Ok::<_, std::io::Error>(true);
                }
            }
            Ok(false)
        })
        .await;
        if !matches!(ready, Ok(Ok(true))) {
            bail!(
                "the {lang} webhook receiver did not start (see {})",
                stderr.display()
            );
        }
        // Keep draining its stdout so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Receiver {
            lang,
            url: format!("http://127.0.0.1:{port}/hooks/{lang}"),
            log: log.to_path_buf(),
            child,
        })
    }
}

/// What a receiver's log says.
#[derive(Debug, Default)]
pub struct Received {
    /// Verified requests per `webhook-id` (more than one: a duplicate).
    pub verified: HashMap<String, usize>,
    /// The verified lines, in order.
    pub lines: Vec<Value>,
    /// Requests the library refused.
    pub rejected: usize,
}

impl Receiver {
    /// Reads its log so far.
    pub fn received(&self) -> anyhow::Result<Received> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut r = Received::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("a line of {}: {line}", self.log.display()))?;
            if v["verified"] == Value::Bool(true) {
                *r.verified
                    .entry(v["webhook_id"].as_str().unwrap_or_default().to_string())
                    .or_default() += 1;
                r.lines.push(v);
            } else {
                r.rejected += 1;
            }
        }
        Ok(r)
    }

    /// Stops it (SIGKILL) and waits for it.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}
