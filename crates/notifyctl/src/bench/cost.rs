//! Where each delivery's cost goes: counters of Postgres, RabbitMQ and the processes taken
//! at the start and the end of one bench phase, divided by what the phase completed, and
//! printed as a cost table (see [`table::Cost::render`]).
//!
//! Sources, per window:
//! - statements: `pg_stat_statements` of the bench database, reset at the start
//!   (`pg_stat_statements_reset(0, <this database>, 0)`, so other databases keep theirs)
//!   and read at the end; the bench's own queries carry the [`OWN`] comment and are left out.
//! - rows written and HOT updates: the `pg_stat_user_tables` delta (`n_tup_ins`,
//!   `n_tup_upd`, `n_tup_del`, `n_tup_hot_upd`).
//! - transactions: the `pg_stat_database.xact_commit` delta minus the bench's own.
//! - WAL: the `pg_stat_wal` delta (`wal_bytes`, `wal_records`, `wal_fpi`; the whole cluster).
//! - broker: RabbitMQ's global counters (`rabbit_global_counters:overview()`, the whole
//!   node) through `rabbitmqctl eval`, because the local stack does not enable the
//!   management plugin (its statistics collection would cost broker CPU during the bench).
//! - CPU: the jiffies of each process (Postgres and RabbitMQ with their child processes),
//!   as [`super::figures::CpuSample`] samples them.
//!
//! Postgres publishes a backend's table, WAL and transaction counters only when the
//! backend is idle, at most once a second and at the latest 10 s later (`PGSTAT_IDLE_INTERVAL`
//! in PostgreSQL 15's `pgstat.c`). So a window waits [`STATS_SETTLE`] before its first
//! snapshot of those (the earlier phases' counts are in by then) and again after its end
//! (the window's own are in by then); statements, broker counters and CPU are read at the
//! end itself, since they count as they go.

use super::figures::CpuSample;
use crate::procs::Procs;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod table;

pub(super) use table::Unit;
use table::{Broker, CPU_PROCESSES, Cost, Statement, Statements, TableWrites, Wal};

/// How long Postgres may hold a backend's counters before publishing them (10 s), plus 1 s.
pub(super) const STATS_SETTLE: Duration = Duration::from_secs(11);

/// Creates `pg_stat_statements` in the bench database. Errors (the extension is not
/// installed) are returned for printing; the table then says `statements: n/a`.
pub(super) async fn prepare(pool: &PgPool) -> Result<(), String> {
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Deliveries of events of `type_key` in a final state (the window's `n` end to end), and
/// the last of their final records (`updated_at`: the recording transaction's start, on
/// Postgres' clock, which is this machine's). The peer times its end to end to its last
/// record too (bench/celery/run.py; its stamp is the statement's `clock_timestamp()`,
/// later by at most one short transaction), so the rate does not depend on when a poll
/// noticed the end. `None` when none is final.
pub(super) async fn final_deliveries(
    window: &Ended,
    pool: &PgPool,
    type_key: &str,
) -> anyhow::Result<(u64, Option<chrono::DateTime<chrono::Utc>>)> {
    let (n, last): (i64, Option<chrono::DateTime<chrono::Utc>>) = sqlx::query_as(
        "/* notifyctl-bench */ SELECT count(*), max(d.updated_at)
         FROM notification_deliveries d JOIN notification_events e ON e.id = d.event_id
         WHERE e.type = $1 AND d.status NOT IN ('pending', 'sending')",
    )
    .bind(type_key)
    .fetch_one(pool)
    .await?;
    window.count_own();
    Ok((n as u64, last))
}

/// RabbitMQ's global counters, read with `rabbitmqctl eval` as the local stack runs it:
/// `NOTIFY_RABBITMQCTL` (default `/usr/lib/rabbitmq/bin/rabbitmqctl`), node
/// `NOTIFY_RABBIT_NODE` (default `notify<AMQP port>@localhost`, as `deploy/local-stack.sh`
/// names it), `HOME` = `<stack dir>/rabbitmq/home` (where the node keeps its cookie).
#[derive(Debug, Clone)]
pub(super) struct BrokerCounters {
    ctl: PathBuf,
    node: String,
    home: PathBuf,
}

/// Sums each counter over every protocol and queue type.
const COUNTERS_EVAL: &str = "M = rabbit_global_counters:overview(), \
    S = fun(K) -> lists:sum([maps:get(K, C, 0) || C <- maps:values(M)]) end, \
    [S(messages_received_total), S(messages_delivered_total), S(messages_acknowledged_total)].";

impl BrokerCounters {
    /// The counters of the node serving `amqp_url`, for the stack in `stack_dir`.
    pub(super) fn new(amqp_url: &str, stack_dir: &Path) -> Self {
        let port = amqp_url
            .rsplit('@')
            .next()
            .and_then(|host| host.split('/').next())
            .and_then(|hp| hp.rsplit_once(':'))
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .unwrap_or(5672);
        Self {
            ctl: std::env::var_os("NOTIFY_RABBITMQCTL")
                .map(PathBuf::from)
                .unwrap_or_else(|| "/usr/lib/rabbitmq/bin/rabbitmqctl".into()),
            node: std::env::var("NOTIFY_RABBIT_NODE")
                .unwrap_or_else(|_| format!("notify{port}@localhost")),
            home: stack_dir.join("rabbitmq/home"),
        }
    }

    /// Published, delivered and acknowledged so far; errors say why not (for printing).
    async fn read(&self) -> Result<Broker, String> {
        let run = tokio::process::Command::new(&self.ctl)
            .args(["-q", "-n", &self.node, "eval", COUNTERS_EVAL])
            .env("HOME", &self.home)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .map_err(|_| "rabbitmqctl took over 30 s".to_string())?
            .map_err(|e| format!("{}: {e}", self.ctl.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        parse_counters(&text).ok_or_else(|| {
            format!(
                "rabbitmqctl eval: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }
}

/// `[published,delivered,acked]` as `rabbitmqctl eval` prints it.
fn parse_counters(text: &str) -> Option<Broker> {
    let v: Vec<u64> = text
        .trim()
        .strip_prefix('[')?
        .strip_suffix(']')?
        .split(',')
        .map(|n| n.trim().parse().ok())
        .collect::<Option<_>>()?;
    match v[..] {
        [published, delivered, acked] => Some(Broker {
            published,
            delivered,
            acked,
        }),
        _ => None,
    }
}

/// Table, WAL and transaction counters at one moment.
#[derive(Debug, Default)]
struct DbSnapshot {
    tables: BTreeMap<String, TableWrites>,
    wal: Wal,
    xact_commit: i64,
}

async fn db_snapshot(pool: &PgPool) -> anyhow::Result<DbSnapshot> {
    // One statement (one transaction) for all three, so the snapshot is consistent and
    // costs the window exactly one of the bench's own transactions.
    let json: String = sqlx::query_scalar(
        "/* notifyctl-bench */ SELECT json_build_object(
           'tables', (SELECT coalesce(json_agg(json_build_object('name', schemaname || '.' || relname,
                        'ins', n_tup_ins, 'upd', n_tup_upd, 'del', n_tup_del, 'hot', n_tup_hot_upd)), '[]')
                      FROM pg_stat_user_tables),
           'wal', (SELECT json_build_object('records', wal_records, 'fpi', wal_fpi, 'bytes', wal_bytes::bigint)
                   FROM pg_stat_wal),
           'xact', (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()))::text",
    )
    .fetch_one(pool)
    .await?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    let i = |v: &serde_json::Value| v.as_i64().unwrap_or(0);
    let mut tables = BTreeMap::new();
    for t in v["tables"].as_array().into_iter().flatten() {
        let name = t["name"].as_str().unwrap_or_default();
        let name = name.strip_prefix("public.").unwrap_or(name).to_string();
        tables.insert(
            name,
            TableWrites {
                ins: i(&t["ins"]),
                upd: i(&t["upd"]),
                del: i(&t["del"]),
                hot: i(&t["hot"]),
            },
        );
    }
    Ok(DbSnapshot {
        tables,
        wal: Wal {
            records: i(&v["wal"]["records"]),
            fpi: i(&v["wal"]["fpi"]),
            bytes: i(&v["wal"]["bytes"]),
        },
        xact_commit: i(&v["xact"]),
    })
}

/// Why `pg_stat_statements` cannot be read, in the table's words.
fn statements_unavailable(e: &sqlx::Error) -> String {
    let msg = e.to_string();
    if msg.contains("pg_stat_statements") {
        // Not preloaded ("must be loaded via shared_preload_libraries"), or the extension
        // could not be created in this database.
        "pg_stat_statements not loaded".into()
    } else {
        msg
    }
}

/// One measured window: started before a phase's load, ended after it.
pub(super) struct Window {
    label: String,
    unit: Unit,
    settle: Duration,
    before: DbSnapshot,
    /// `pg_stat_statements_info.dealloc` at the start, or why there are no statements.
    statements: Result<i64, String>,
    broker: Result<Broker, String>,
    cpu: CpuSample,
    own: AtomicU64,
}

impl Window {
    /// Waits `settle` (see [`STATS_SETTLE`]), then snapshots the table, WAL and
    /// transaction counters, resets this database's `pg_stat_statements`, and samples the
    /// broker counters and CPU.
    pub(super) async fn start(
        pool: &PgPool,
        procs: &Procs,
        stack_dir: &Path,
        broker: &BrokerCounters,
        label: impl Into<String>,
        unit: Unit,
        settle: Duration,
    ) -> anyhow::Result<Self> {
        tokio::time::sleep(settle).await;
        let own = AtomicU64::new(0);
        let before = db_snapshot(pool).await?;
        own.fetch_add(1, Ordering::Relaxed);
        let statements = sqlx::query_scalar(
            "/* notifyctl-bench */ SELECT i.dealloc FROM pg_stat_statements_info i
             CROSS JOIN LATERAL pg_stat_statements_reset(0::oid, (SELECT oid FROM pg_database WHERE datname = current_database()), 0::bigint) r",
        )
        .fetch_one(pool)
        .await
        .inspect(|_| {
            own.fetch_add(1, Ordering::Relaxed);
        })
        .map_err(|e| statements_unavailable(&e));
        let broker = broker.read().await;
        Ok(Self {
            label: label.into(),
            unit,
            settle,
            before,
            statements,
            broker,
            cpu: CpuSample::take(procs, stack_dir),
            own,
        })
    }

    /// Counts one of the bench's own statements run on the bench database during the window
    /// (each is its own transaction), so that it is left out of the transactions.
    pub(super) fn count_own(&self) {
        self.own.fetch_add(1, Ordering::Relaxed);
    }

    /// Samples CPU, statements and broker counters now; the table, WAL and transaction
    /// counters after [`Ended::measure`]'s settling wait.
    pub(super) async fn end(
        self,
        pool: &PgPool,
        procs: &Procs,
        stack_dir: &Path,
        broker: &BrokerCounters,
    ) -> anyhow::Result<Ended> {
        let cpu = CpuSample::take(procs, stack_dir);
        let statements = match &self.statements {
            Err(why) => Err(why.clone()),
            Ok(dealloc) => read_statements(pool, &self.own, *dealloc).await,
        };
        let broker_after = broker.read().await;
        let broker = match (&self.broker, &broker_after) {
            (Ok(a), Ok(b)) => Ok(Broker {
                published: b.published.saturating_sub(a.published),
                delivered: b.delivered.saturating_sub(a.delivered),
                acked: b.acked.saturating_sub(a.acked),
            }),
            (Err(e), _) | (_, Err(e)) => Err(e.clone()),
        };
        let tick_ms = 1000.0 / clock_ticks_per_second() as f64;
        let cpu_ms = CPU_PROCESSES
            .iter()
            .map(|&p| {
                let used = cpu.jiffies(p).zip(self.cpu.jiffies(p));
                (p, used.map(|(b, a)| b.saturating_sub(a) as f64 * tick_ms))
            })
            .collect();
        Ok(Ended {
            window: self,
            statements,
            broker,
            cpu_ms,
        })
    }
}

/// A window whose load is over, waiting for Postgres's counters to be published.
pub(super) struct Ended {
    window: Window,
    statements: Result<Statements, String>,
    broker: Result<Broker, String>,
    cpu_ms: Vec<(&'static str, Option<f64>)>,
}

impl Ended {
    /// The window's own statements run after [`Window::end`] (see [`Window::count_own`]).
    pub(super) fn count_own(&self) {
        self.window.count_own();
    }

    /// Waits the settling time, snapshots the table, WAL and transaction counters, and
    /// returns the window's cost over `n` deliveries (or events).
    pub(super) async fn measure(self, pool: &PgPool, n: u64) -> anyhow::Result<String> {
        tokio::time::sleep(self.window.settle).await;
        let own = self.window.own.load(Ordering::Relaxed);
        let after = db_snapshot(pool).await?;
        let before = &self.window.before;
        let tables = after
            .tables
            .iter()
            .map(|(name, t)| {
                let was = before.tables.get(name).copied().unwrap_or_default();
                (name.clone(), t.since(&was))
            })
            .collect();
        let cost = Cost {
            label: self.window.label.clone(),
            unit: self.window.unit,
            n,
            statements: self.statements,
            tables,
            wal: Wal {
                records: after.wal.records - before.wal.records,
                fpi: after.wal.fpi - before.wal.fpi,
                bytes: after.wal.bytes - before.wal.bytes,
            },
            xacts: (after.xact_commit - before.xact_commit - own as i64).max(0),
            own_xacts: own,
            broker: self.broker,
            cpu_ms: self.cpu_ms,
        };
        Ok(cost.render())
    }
}

/// This database's statements since the reset but the bench's own; counts the two it runs
/// in `own`. `dealloc` is `pg_stat_statements_info.dealloc` at the start.
async fn read_statements(
    pool: &PgPool,
    own: &AtomicU64,
    dealloc: i64,
) -> Result<Statements, String> {
    let (track, dealloc_now): (Option<String>, i64) = sqlx::query_as(
        "/* notifyctl-bench */ SELECT current_setting('pg_stat_statements.track', true),
           (SELECT dealloc FROM pg_stat_statements_info)",
    )
    .fetch_one(pool)
    .await
    .map_err(|e| statements_unavailable(&e))?;
    own.fetch_add(1, Ordering::Relaxed);
    let rows: Vec<(Option<String>, i64, f64, i64)> = sqlx::query_as(
        "/* notifyctl-bench */ SELECT s.query, s.calls, s.total_exec_time, s.rows
         FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
         WHERE d.datname = current_database() AND s.query NOT LIKE '%notifyctl-bench%'",
    )
    .fetch_all(pool)
    .await
    .map_err(|e| statements_unavailable(&e))?;
    own.fetch_add(1, Ordering::Relaxed);
    Ok(Statements {
        track: track.unwrap_or_else(|| "?".into()),
        evictions: dealloc_now - dealloc,
        list: rows
            .into_iter()
            .map(|(query, calls, total_ms, rows)| Statement {
                query: query.unwrap_or_else(|| "<query text not visible>".into()),
                calls,
                total_ms,
                rows,
            })
            .collect(),
    })
}

/// Jiffies per second (`getconf CLK_TCK`; 100, Linux's USER_HZ, when that fails).
fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests;
