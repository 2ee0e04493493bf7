//! Child processes of the platform (ingest and the workers) started, killed and stopped
//! by pid, with their output appended to log files. Used by `chaos` and `bench`.

use anyhow::Context;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// The four channel worker binaries.
pub const WORKERS: [&str; 4] = ["worker-line", "worker-email", "worker-inapp", "worker-push"];

/// The binary that POSTs status webhooks to callers (`crates/worker-webhook`).
pub const WEBHOOK_WORKER: &str = "worker-webhook";

/// Running platform processes, by binary name.
pub struct Procs {
    bin_dir: PathBuf,
    log_dir: PathBuf,
    log_prefix: String,
    children: HashMap<&'static str, Child>,
}

impl Procs {
    /// Processes from `bin_dir`, logging to `log_dir/<prefix>-<name>.log`. They inherit this
    /// process's environment.
    pub fn new(bin_dir: &Path, log_dir: &Path, log_prefix: &str) -> Self {
        Self {
            bin_dir: bin_dir.to_path_buf(),
            log_dir: log_dir.to_path_buf(),
            log_prefix: log_prefix.to_string(),
            children: HashMap::new(),
        }
    }

    /// Starts `name` (`ingest` runs `ingest serve`).
    pub fn spawn(&mut self, name: &'static str) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.join(format!("{}-{name}.log", self.log_prefix)))?;
        let mut cmd = Command::new(self.bin_dir.join(name));
        if name == "ingest" {
            cmd.arg("serve");
        }
        let child = cmd
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        self.children.insert(name, child);
        Ok(())
    }

    /// The pid of a running process.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.get(name).and_then(|c| c.id())
    }

    /// SIGKILL and reap.
    pub async fn kill9(&mut self, name: &'static str) -> anyhow::Result<()> {
        if let Some(mut c) = self.children.remove(name) {
            c.start_kill()?;
            c.wait().await?;
        }
        Ok(())
    }

    /// SIGTERM and wait for the exit; true when it exited 0 within 40 s.
    pub async fn terminate(&mut self, name: &'static str) -> anyhow::Result<bool> {
        let Some(mut c) = self.children.remove(name) else {
            return Ok(true);
        };
        if let Some(pid) = c.id() {
            Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await?;
        }
        match tokio::time::timeout(Duration::from_secs(40), c.wait()).await {
            Ok(status) => Ok(status?.success()),
            Err(_) => {
                c.start_kill()?;
                c.wait().await?;
                Ok(false)
            }
        }
    }

    /// Stops every process with SIGTERM.
    pub async fn stop_all(&mut self) {
        let names: Vec<&'static str> = self.children.keys().copied().collect();
        for n in names {
            let _ = self.terminate(n).await;
        }
    }
}

/// Peak resident memory (VmHWM) of a process, in KiB, from /proc.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Connects to a gRPC server that may still be starting: retries for up to 30 s.
pub async fn connect_grpc(url: &str) -> anyhow::Result<crate::keys::Grpc> {
    let started = std::time::Instant::now();
    loop {
        match tonic::transport::Endpoint::from_shared(url.to_string())?
            .connect()
            .await
        {
            Ok(c) => return Ok(crate::keys::authed(c)),
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Machine CPU counters from /proc/stat: (busy, total) jiffies over all cores.
pub fn cpu_jiffies() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// CPU jiffies (user + system) used so far by one process, from /proc/<pid>/stat.
pub fn process_jiffies(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// CPU jiffies used so far by `root` and every process below it (a Postgres postmaster
/// and its backends, the RabbitMQ VM and its helpers). Processes that already exited are
/// not counted.
pub fn tree_jiffies(root: u32) -> Option<u64> {
    let mut parent: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        // Field 4 is the parent pid.
        if let Some(ppid) = stat[close + 2..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
        {
            parent.insert(pid, ppid);
        }
    }
    let in_tree = |mut pid: u32| loop {
        if pid == root {
            return true;
        }
        match parent.get(&pid) {
            Some(&p) if p != 0 && p != pid => pid = p,
            _ => return false,
        }
    };
    Some(
        parent
            .keys()
            .filter(|&&pid| in_tree(pid))
            .filter_map(|&pid| process_jiffies(pid))
            .sum(),
    )
}
