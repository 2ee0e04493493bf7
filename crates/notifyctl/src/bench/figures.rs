//! The arithmetic and samples behind the printed figures: percentiles, milliseconds, and
//! CPU shares per part of the platform.

use crate::procs::{Procs, WORKERS, cpu_jiffies, process_jiffies, tree_jiffies};
use std::time::Duration;

/// The `p` quantile (0 to 1) of `sorted` durations; zero when empty.
pub(super) fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A duration in milliseconds.
pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// CPU jiffies of the machine and of each part of the platform at one moment.
pub(super) struct CpuSample {
    machine: Option<(u64, u64)>,
    parts: Vec<(&'static str, Option<u64>)>,
    /// Each worker binary on its own (the `workers` part is their sum).
    workers: Vec<(&'static str, Option<u64>)>,
}

impl CpuSample {
    /// Samples the machine and each part now (`stack_dir` holds the stack's pid files).
    pub(super) fn take(procs: &Procs, stack_dir: &std::path::Path) -> Self {
        let pid_of = |name: &str| -> Option<u32> {
            std::fs::read_to_string(stack_dir.join("pids").join(format!("{name}.pid")))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let workers: Option<u64> = WORKERS
            .iter()
            .filter_map(|w| procs.pid(w))
            .map(process_jiffies)
            .sum();
        Self {
            workers: WORKERS
                .iter()
                .map(|&w| (w, procs.pid(w).and_then(process_jiffies)))
                .collect(),
            machine: cpu_jiffies(),
            parts: vec![
                ("postgres", pid_of("postgres").and_then(tree_jiffies)),
                ("rabbitmq", pid_of("rabbitmq").and_then(tree_jiffies)),
                ("ingest", procs.pid("ingest").and_then(process_jiffies)),
                ("workers", workers),
                (
                    "provider-sim",
                    pid_of("provider-sim").and_then(process_jiffies),
                ),
                ("bench client", process_jiffies(std::process::id())),
            ],
        }
    }

    /// Jiffies used so far by one part (`postgres`, `rabbitmq`, `ingest`, `provider-sim`) or
    /// one worker binary (`worker-line`, ...); `None` when it is not running or not readable.
    pub(super) fn jiffies(&self, name: &str) -> Option<u64> {
        self.parts
            .iter()
            .chain(&self.workers)
            .find(|(n, _)| *n == name)
            .and_then(|(_, j)| *j)
    }

    /// One line: how busy all cores were and each part's share of all cores.
    pub(super) fn report(&self, later: &CpuSample) -> String {
        let (Some((b0, t0)), Some((b1, t1))) = (self.machine, later.machine) else {
            return "  cpu: not measurable here".into();
        };
        let total = (t1 - t0).max(1) as f64;
        let busy = (b1 - b0) as f64 / total;
        let parts: Vec<String> = self
            .parts
            .iter()
            .zip(&later.parts)
            .filter_map(|((name, a), (_, b))| {
                let share = b.zip(*a).map(|(b, a)| b.saturating_sub(a) as f64 / total)?;
                (share >= 0.005).then(|| format!("{name} {:.0}%", 100.0 * share))
            })
            .collect();
        format!(
            "  cpu: {:.0}% of all cores busy ({}){}",
            100.0 * busy,
            parts.join(", "),
            if busy > 0.9 {
                " -> CPU is the resource that ran out"
            } else {
                ""
            }
        )
    }
}
