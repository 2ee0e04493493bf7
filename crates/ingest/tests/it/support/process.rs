//! Platform binaries run as their own processes against a test's platform.

use super::{LINE_TOKEN, Platform};
use std::collections::HashMap;
use std::sync::Arc;

/// A platform binary run as its own process (`ingest`, `worker-line`, ...), killed on
/// drop. Its stdout (the JSON log lines) is collected in [`Proc::log`].
pub(crate) struct Proc {
    pub child: tokio::process::Child,
    log: Arc<std::sync::Mutex<String>>,
}

impl Proc {
    /// Everything the process wrote to stdout so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Sends SIGTERM.
    pub(crate) fn terminate(&self) {
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -TERM failed");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A free port on 127.0.0.1.
pub(crate) fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

impl Platform {
    /// The environment a platform binary needs to run against this platform: its
    /// database, broker prefix, simulator and keys.
    pub(crate) fn process_env(&self) -> HashMap<String, String> {
        let vars = [
            ("NOTIFY_DATABASE_URL", self.db_url.clone()),
            ("NOTIFY_AMQP_URL", self.stack.amqp_url.clone()),
            ("NOTIFY_AMQP_PREFIX", self.amqp_prefix.clone()),
            ("NOTIFY_GRPC_ADDR", self.grpc_addr.to_string()),
            ("NOTIFY_LINE_API_BASE", self.sim_url.clone()),
            ("NOTIFY_LINE_CHANNEL_TOKEN", LINE_TOKEN.into()),
            ("NOTIFY_RETRY_DELAYS", "1s".into()),
            ("NOTIFY_LOG_FORMAT", "json".into()),
            ("NOTIFY_GRPC_AUTH", "off".into()),
            ("RUST_LOG", "info".into()),
        ];
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Starts the binary `name` from this build (`ingest` takes `args` such as `serve`)
    /// with [`Platform::process_env`] plus `extra`.
    pub(crate) fn spawn(&self, name: &str, args: &[&str], extra: &[(&str, String)]) -> Proc {
        use tokio::io::AsyncBufReadExt;
        let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ingest")).with_file_name(name);
        assert!(
            bin.exists(),
            "{} is not built: run `cargo build --workspace --bins` (make test does)",
            bin.display()
        );
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.process_env())
            .envs(extra.iter().map(|(k, v)| (k.to_string(), v.clone())))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn");
        let log = Arc::new(std::sync::Mutex::new(String::new()));
        let out = child.stdout.take().unwrap();
        let l = log.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = l.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Proc { child, log }
    }
}
