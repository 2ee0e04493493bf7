//! An ingest process's settings, read from the environment by `main.rs`
//! ([`IngestConfig::from_env`]) or built by tests.

use crate::{auth, clock, relay};
use notify_broker::Topology;
use std::time::Duration;

/// Settings of an ingest process.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Relay settings (AMQP URL, topology, batching).
    pub relay: relay::RelayConfig,
    /// Attempts each new delivery gets.
    pub max_attempts: i32,
    /// Longest a request may run when the caller sets no shorter deadline.
    pub request_timeout: Duration,
    /// How often expired leases are recovered.
    pub sweep_interval: Duration,
    /// Most deliveries recovered per sweep.
    pub sweep_batch: i64,
    /// A pending delivery due this long with no outbox row is republished.
    pub republish_after: Duration,
    /// How often the console's delivery counts are rolled up
    /// ([`notify_store::console::roll_up_counts`]).
    pub counts_rollup_interval: Duration,
    /// Group-commit writer tasks for `CreateEvent` (transactions in flight at once). One
    /// by default: with Postgres' CPU the limit, a second transaction in flight only
    /// splits the waiting requests into two smaller batches, and each group commit costs
    /// about 1.2 ms of Postgres CPU before its first event (docs/scaling.md, 2026-12-05).
    /// More can help when commits are slow and the database has cores to spare.
    pub writers: usize,
    /// Most `CreateEvent` requests written in one transaction.
    pub write_batch: usize,
    /// Fatigue caps per channel: most non-critical notifications per user per rolling hour.
    pub fatigue_caps: std::collections::BTreeMap<notify_core::Channel, u32>,
    /// After SIGTERM, how long the gRPC health service reports NOT_SERVING (and `/readyz`
    /// 503) while requests are still accepted, so load balancers stop routing here first.
    pub drain: Duration,
    /// How often the database and queue gauges are sampled for the metrics.
    pub metrics_interval: Duration,
    /// Which credentials callers must present.
    pub auth: auth::AuthMode,
    /// TLS for the gRPC listener (and mutual TLS with a client CA).
    pub tls: Option<TlsFiles>,
    /// Which `http://` link hosts are allowed.
    pub links: notify_core::links::LinkPolicy,
    /// Largest gRPC request accepted, in bytes.
    pub max_message_bytes: usize,
    /// The instant planning decides by (writer and fan-out): the database's `now()` of
    /// the writing transaction in production; tests set it.
    pub clock: clock::Clock,
    /// Furthest ahead of the planning instant a `CreateEvent` may be scheduled
    /// (`send_at`, `delay`): `NOTIFY_SCHEDULE_HORIZON`, 1 s to 366 days, default 30 days.
    pub schedule_horizon: Duration,
    /// What old data goes and when, and how the purge task goes about it.
    pub retention: RetentionConfig,
}

/// The retention purge task's settings ([`notify_store::retention`]).
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// The global lengths (`NOTIFY_RETENTION_CONTENT`, `NOTIFY_RETENTION_DELIVERIES`,
    /// `NOTIFY_RETENTION_ARCHIVED_INBOX`); a type's own lengths override them.
    pub lengths: notify_store::retention::Retention,
    /// Time between the end of one purge pass and the start of the next
    /// (`NOTIFY_RETENTION_INTERVAL`, 1 s to 1 day, default 5 min).
    pub interval: Duration,
    /// Rows per statement (`NOTIFY_RETENTION_BATCH`, 100 to 5,000, default 1,000) and the
    /// pause after each batch (`NOTIFY_RETENTION_PAUSE`, 0 to 10 s, default 20 ms).
    pub limits: notify_store::retention::PurgeLimits,
    /// The instant a pass measures ages from: the database's `now()` in production; a
    /// test sets it (this clock is the purge's own, not the planning clock).
    pub clock: clock::Clock,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            lengths: Default::default(),
            interval: Duration::from_secs(300),
            limits: Default::default(),
            clock: clock::Clock::Database,
        }
    }
}

impl RetentionConfig {
    /// Reads the `NOTIFY_RETENTION_*` variables (see the fields); every length is 1 s to
    /// 366 days (`30d`, `180d`, `90d` by default; `90s` in a test of minutes).
    pub fn from_env(env: &mut notify_core::config::Env) -> Self {
        let d = Self::default();
        let length = |env: &mut notify_core::config::Env, name: &str, default: Duration| {
            env.duration(
                name,
                default,
                Duration::from_secs(1),
                notify_core::retry::MAX_DURATION,
            )
        };
        Self {
            lengths: notify_store::retention::Retention {
                content: length(env, "NOTIFY_RETENTION_CONTENT", d.lengths.content),
                deliveries: length(env, "NOTIFY_RETENTION_DELIVERIES", d.lengths.deliveries),
                archived_inbox: length(
                    env,
                    "NOTIFY_RETENTION_ARCHIVED_INBOX",
                    d.lengths.archived_inbox,
                ),
            },
            interval: env.duration(
                "NOTIFY_RETENTION_INTERVAL",
                d.interval,
                Duration::from_secs(1),
                Duration::from_secs(86_400),
            ),
            limits: notify_store::retention::PurgeLimits {
                batch: env.number("NOTIFY_RETENTION_BATCH", d.limits.batch, 100, 5_000),
                pause: env.duration(
                    "NOTIFY_RETENTION_PAUSE",
                    d.limits.pause,
                    Duration::ZERO,
                    Duration::from_secs(10),
                ),
            },
            clock: clock::Clock::Database,
        }
    }
}

/// PEM files for the gRPC listener's TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Server certificate chain.
    pub cert: String,
    /// Its private key.
    pub key: String,
    /// CA whose client certificates are accepted (mutual TLS); `None`: no client
    /// certificates.
    pub client_ca: Option<String>,
}

impl TlsFiles {
    /// Reads `NOTIFY_GRPC_TLS_CERT_FILE`, `NOTIFY_GRPC_TLS_KEY_FILE` and
    /// `NOTIFY_GRPC_CLIENT_CA_FILE`: none set means plain TCP; cert and key must come
    /// together; a client CA needs them.
    pub fn from_env(env: &mut notify_core::config::Env) -> Option<Self> {
        let read = |env: &mut notify_core::config::Env, name: &str| -> Option<String> {
            let path = env.string(name, "");
            if path.trim().is_empty() {
                return None;
            }
            match std::fs::read_to_string(path.trim()) {
                Ok(pem) => Some(pem),
                Err(e) => {
                    env.error(format!("{name}={path:?} cannot be read: {e}"));
                    None
                }
            }
        };
        let cert = read(env, "NOTIFY_GRPC_TLS_CERT_FILE");
        let key = read(env, "NOTIFY_GRPC_TLS_KEY_FILE");
        let client_ca = read(env, "NOTIFY_GRPC_CLIENT_CA_FILE");
        match (cert, key) {
            (Some(cert), Some(key)) => Some(Self {
                cert,
                key,
                client_ca,
            }),
            (None, None) if client_ca.is_none() => None,
            _ => {
                env.error(
                    "NOTIFY_GRPC_TLS_CERT_FILE and NOTIFY_GRPC_TLS_KEY_FILE must be set together (and are required with NOTIFY_GRPC_CLIENT_CA_FILE)",
                );
                None
            }
        }
    }
}

/// Parses `channel=n,...` (e.g. `email=5,line=10`; empty = no caps).
pub fn parse_fatigue_caps(
    s: &str,
) -> Result<std::collections::BTreeMap<notify_core::Channel, u32>, String> {
    notify_telemetry::parse_counts(s, "channel=per_hour", "cap", |name| {
        name.parse::<notify_core::Channel>()
            .map_err(|e| e.to_string())
    })
}

impl IngestConfig {
    /// Reads `NOTIFY_AMQP_URL` (required; one URL or the comma-separated nodes of a cluster,
    /// see [`notify_broker::connect`]), `NOTIFY_AMQP_PREFIX` (""), `NOTIFY_MAX_ATTEMPTS`
    /// (5), `NOTIFY_REQUEST_TIMEOUT` (30s), `NOTIFY_RELAY_BATCH` (500),
    /// `NOTIFY_RELAY_DELIVERIES_PER_MESSAGE` (50; 1 to 500, 1 = version-1 messages only),
    /// `NOTIFY_RELAY_POLL` (1s), `NOTIFY_SWEEP_INTERVAL` (10s), `NOTIFY_REPUBLISH_AFTER` (5m), `NOTIFY_INGEST_WRITERS`
    /// (1), `NOTIFY_INGEST_BATCH` (200), `NOTIFY_FATIGUE_CAPS` (empty: no caps; e.g.
    /// `email=5,line=10,push=10` per user per rolling hour), `NOTIFY_DRAIN_SECONDS` (5),
    /// `NOTIFY_METRICS_INTERVAL` (15s), `NOTIFY_GRPC_AUTH` (`api_key`), the TLS files (see
    /// [`TlsFiles::from_env`]), `NOTIFY_DEV_HTTP_HOSTS` and
    /// `NOTIFY_DEEP_LINK_SCHEMES` (empty; [`notify_core::links::LinkPolicy::from_env`]), `NOTIFY_GRPC_MAX_MESSAGE_BYTES`
    /// (1 MiB), `NOTIFY_SCHEDULE_HORIZON` (30d; 1 s to 366 days), the `NOTIFY_RETENTION_*`
    /// variables ([`RetentionConfig::from_env`]).
    ///
    /// # Errors
    /// [`Missing`](notify_core::config::Missing) without `NOTIFY_AMQP_URL`; every problem
    /// is also recorded in `env`.
    pub fn from_env(
        env: &mut notify_core::config::Env,
    ) -> Result<Self, notify_core::config::Missing> {
        let dur = |s: &str| notify_core::retry::parse_duration(s).map_err(|e| e.to_string());
        let amqp_url = env.url_list("NOTIFY_AMQP_URL", &["amqp", "amqps"]);
        // Fields are evaluated in the order written: every variable is read before the
        // `?`, so every problem is recorded.
        Ok(Self {
            max_attempts: env.number("NOTIFY_MAX_ATTEMPTS", 5, 1, 100),
            request_timeout: env.duration(
                "NOTIFY_REQUEST_TIMEOUT",
                Duration::from_secs(30),
                Duration::from_millis(100),
                Duration::from_secs(600),
            ),
            sweep_interval: env
                .parse_with("NOTIFY_SWEEP_INTERVAL", Duration::from_secs(10), dur)
                .max(Duration::from_secs(1)),
            sweep_batch: 500,
            // 0 would republish a waiting backlog on every sweep.
            republish_after: env.duration(
                "NOTIFY_REPUBLISH_AFTER",
                Duration::from_secs(300),
                Duration::from_secs(1),
                Duration::from_secs(86_400),
            ),
            // Deltas wait at most this long; the overview reads them anyway, so this only
            // bounds how many it sums.
            counts_rollup_interval: env
                .parse_with("NOTIFY_COUNTS_ROLLUP_INTERVAL", Duration::from_secs(5), dur)
                .max(Duration::from_secs(1)),
            writers: env.number("NOTIFY_INGEST_WRITERS", 1, 1, 64),
            write_batch: env.number("NOTIFY_INGEST_BATCH", 200, 1, 1000),
            fatigue_caps: env.parse_with(
                "NOTIFY_FATIGUE_CAPS",
                Default::default(),
                parse_fatigue_caps,
            ),
            drain: Duration::from_secs(env.number("NOTIFY_DRAIN_SECONDS", 5, 0, 300)),
            metrics_interval: env
                .parse_with("NOTIFY_METRICS_INTERVAL", Duration::from_secs(15), dur)
                .max(Duration::from_secs(1)),
            auth: env.parse("NOTIFY_GRPC_AUTH", auth::AuthMode::ApiKey),
            tls: TlsFiles::from_env(env),
            links: notify_core::links::LinkPolicy::from_env(env),
            max_message_bytes: env.number(
                "NOTIFY_GRPC_MAX_MESSAGE_BYTES",
                1 << 20,
                64 << 10,
                16 << 20,
            ),
            clock: clock::Clock::Database,
            schedule_horizon: env.duration(
                "NOTIFY_SCHEDULE_HORIZON",
                Duration::from_secs(30 * 86_400),
                Duration::from_secs(1),
                notify_core::retry::MAX_DURATION,
            ),
            retention: RetentionConfig::from_env(env),
            relay: relay::RelayConfig {
                topology: Topology::new(env.string("NOTIFY_AMQP_PREFIX", "")),
                batch: env.number("NOTIFY_RELAY_BATCH", 500, 1, 10_000),
                deliveries_per_message: env.number(
                    "NOTIFY_RELAY_DELIVERIES_PER_MESSAGE",
                    relay::DELIVERIES_PER_MESSAGE,
                    1,
                    notify_broker::MAX_DELIVERIES_PER_MESSAGE,
                ),
                // At most 10 s: rows written due later than that are not announced
                // (migrations/20261201000028_delivery_write_cost.sql), the poll finds them.
                poll: env
                    .parse_with("NOTIFY_RELAY_POLL", Duration::from_secs(1), dur)
                    .clamp(Duration::from_millis(10), Duration::from_secs(10)),
                hold: Duration::from_secs(30),
                confirm_timeout: Duration::from_secs(10),
                retry_in: Duration::from_secs(5),
                amqp_url: amqp_url?,
            },
        })
    }
}
