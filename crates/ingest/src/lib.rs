//! The ingest service: the gRPC API (events, recipients, types, health, reflection), the
//! outbox relay, the lease sweeper, the console counts' rollup and the retention purge, in
//! one process that may run as many replicas.
//! `main.rs` only reads configuration and calls [`run`]; tests call [`run`] in-process.

pub mod auth;
pub mod clock;
mod convert;
pub mod error;
pub mod fanout;
pub mod grpc;
pub mod planning;
pub mod reflection;
pub mod relay;
pub mod type_validation;
pub mod types_file;
pub mod undecodable;
pub mod writer;

use notify_broker::Topology;
use notify_proto::v1 as pb;
use notify_store::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

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
            env.parse_with(name, default, |s| {
                notify_core::retry::parse_duration_in(
                    s,
                    Duration::from_secs(1),
                    notify_core::retry::MAX_DURATION,
                )
            })
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
            interval: env.parse_with("NOTIFY_RETENTION_INTERVAL", d.interval, |s| {
                notify_core::retry::parse_duration_in(
                    s,
                    Duration::from_secs(1),
                    Duration::from_secs(86_400),
                )
            }),
            limits: notify_store::retention::PurgeLimits {
                batch: env.number("NOTIFY_RETENTION_BATCH", d.limits.batch, 100, 5_000),
                pause: env.parse_with("NOTIFY_RETENTION_PAUSE", d.limits.pause, |s| {
                    notify_core::retry::parse_duration_in(
                        s,
                        Duration::ZERO,
                        Duration::from_secs(10),
                    )
                }),
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
            request_timeout: env.parse_with(
                "NOTIFY_REQUEST_TIMEOUT",
                Duration::from_secs(30),
                |s| {
                    notify_core::retry::parse_duration_in(
                        s,
                        Duration::from_millis(100),
                        Duration::from_secs(600),
                    )
                },
            ),
            sweep_interval: env
                .parse_with("NOTIFY_SWEEP_INTERVAL", Duration::from_secs(10), dur)
                .max(Duration::from_secs(1)),
            sweep_batch: 500,
            // 0 would republish a waiting backlog on every sweep.
            republish_after: env.parse_with(
                "NOTIFY_REPUBLISH_AFTER",
                Duration::from_secs(300),
                |s| {
                    notify_core::retry::parse_duration_in(
                        s,
                        Duration::from_secs(1),
                        Duration::from_secs(86_400),
                    )
                },
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
            schedule_horizon: env.parse_with(
                "NOTIFY_SCHEDULE_HORIZON",
                Duration::from_secs(30 * 86_400),
                |s| {
                    notify_core::retry::parse_duration_in(
                        s,
                        Duration::from_secs(1),
                        notify_core::retry::MAX_DURATION,
                    )
                },
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

/// Serves the gRPC API on `listener` and runs the relay, the sweeper, the console counts'
/// rollup, the retention purge and the metrics sampler until `shutdown` is cancelled. Then it drains: the health service reports
/// NOT_SERVING for every service (and `/readyz` 503) for `cfg.drain` while requests are
/// still served; after that it stops accepting, finishes in-flight requests and stops the
/// tasks. The admin endpoint listens on `NOTIFY_ADMIN_ADDR` when set. `pools` is one pool
/// (`PgPool`) or [`notify_store::Pools`]: the `LISTEN` connections (relay, fan-out, API
/// keys) and the retention pass (a session advisory lock) use its `session` pool.
pub async fn run(
    cfg: IngestConfig,
    pools: impl Into<notify_store::Pools>,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let notify_store::Pools {
        main: pool,
        session,
    } = pools.into();
    let stats = Arc::new(relay::RelayStats::default());
    // `stop` ends everything once the drain is over; `shutdown` only starts the drain.
    let stop = CancellationToken::new();
    // New deliveries due now are handed to this replica's relay after their commit.
    let (direct, direct_rx) = relay::Direct::new(pool.clone(), cfg.relay.deliveries_per_message);
    let relay_task = tokio::spawn(relay::run(
        pool.clone(),
        session.clone(),
        cfg.relay.clone(),
        stats.clone(),
        direct_rx,
        stop.clone(),
    ));
    let readiness = {
        let (pool, stats) = (pool.clone(), stats.clone());
        notify_telemetry::admin::Readiness::new()
            .with_check("postgres", move || {
                let pool = pool.clone();
                async move { notify_store::ping(&pool).await.map_err(|e| e.to_string()) }
            })
            .with_check("rabbitmq", move || {
                let up = stats.connected.load(std::sync::atomic::Ordering::SeqCst);
                async move {
                    if up {
                        Ok(())
                    } else {
                        Err("the outbox relay is not running (RabbitMQ or Postgres unreachable; see the log)".to_string())
                    }
                }
            })
    };
    notify_telemetry::admin::spawn_from_env("ingest", readiness.clone(), stop.clone()).await;
    let sampler_task = tokio::spawn(sample_gauges(
        pool.clone(),
        cfg.clone(),
        stats.clone(),
        stop.clone(),
    ));
    let sweeper_task = tokio::spawn(sweep(pool.clone(), cfg.clone(), stop.clone()));
    let counts_task = tokio::spawn(roll_up_counts(
        pool.clone(),
        cfg.counts_rollup_interval,
        stop.clone(),
    ));
    let retention_task = tokio::spawn(purge(session.clone(), cfg.retention.clone(), stop.clone()));
    let fanout_task = tokio::spawn(fanout::run(
        pool.clone(),
        session.clone(),
        cfg.max_attempts,
        cfg.fatigue_caps.clone(),
        cfg.clock.clone(),
        cfg.relay.poll,
        Some((direct.clone(), cfg.relay.hold)),
        stop.clone(),
    ));

    let auth = auth::Auth::new(cfg.auth, cfg.clock.clone());
    auth.spawn_refresh(pool.clone(), session, stop.clone())
        .await?;
    let services = grpc::Services::new(
        pool,
        writer::WriterConfig {
            writers: cfg.writers,
            max_batch: cfg.write_batch,
            max_attempts: cfg.max_attempts,
            fatigue_caps: cfg.fatigue_caps.clone(),
            clock: cfg.clock.clone(),
            horizon: cfg.schedule_horizon,
            direct: Some((direct, cfg.relay.hold)),
        },
        auth,
        cfg.links.clone(),
    )
    .map_err(|e| anyhow::anyhow!("starting the event writer's thread: {e}"))?;
    let (mut health, health_service) = tonic_health::server::health_reporter();
    // Every served service, so a check naming any of them answers SERVING (and, during
    // the drain, NOT_SERVING).
    for name in SERVICE_NAMES {
        health
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    // Both reflection versions: grpcurl and current grpcio-reflection clients still
    // speak v1alpha only. Ours, not tonic-reflection's server: an unknown symbol is an
    // ErrorResponse on the stream, which stays open ([`reflection`]).
    let reflection = reflection::Reflection::new(reflection::Index::new(&[
        notify_proto::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
    ])?);
    let reflection_v1 =
        tonic_reflection::pb::v1::server_reflection_server::ServerReflectionServer::new(
            reflection.clone(),
        );
    let reflection_v1alpha =
        tonic_reflection::pb::v1alpha::server_reflection_server::ServerReflectionServer::new(
            reflection,
        );
    info!(addr = %listener.local_addr()?, "gRPC listening");
    let drain_task = {
        let (health, readiness, stop, drain) =
            (health.clone(), readiness.clone(), stop.clone(), cfg.drain);
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = stop.cancelled() => return,
            }
            readiness.start_draining();
            for name in SERVICE_NAMES {
                health
                    .set_service_status(*name, tonic_health::ServingStatus::NotServing)
                    .await;
            }
            info!(
                drain_s = drain.as_secs_f64(),
                "draining: health NOT_SERVING; still accepting until the drain ends"
            );
            tokio::time::sleep(drain).await;
            stop.cancel();
        })
    };
    let _ = &mut health;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &cfg.tls {
        let mut tls_cfg = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&tls.cert, &tls.key));
        if let Some(ca) = &tls.client_ca {
            tls_cfg = tls_cfg
                .client_ca_root(tonic::transport::Certificate::from_pem(ca))
                // With API keys alone a certificate is optional; otherwise it is required.
                .client_auth_optional(cfg.auth == auth::AuthMode::ApiKey);
        }
        builder = builder.tls_config(tls_cfg)?;
    }
    let max = cfg.max_message_bytes;
    builder
        .timeout(cfg.request_timeout)
        .trace_fn(server_span)
        .layer(undecodable::UndecodableLayer)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            pb::ingest_service_server::IngestServiceServer::new(services.clone())
                .max_decoding_message_size(max),
        )
        .add_service(
            pb::recipient_service_server::RecipientServiceServer::new(services.clone())
                .max_decoding_message_size(max),
        )
        .add_service(
            pb::type_service_server::TypeServiceServer::new(services.clone())
                .max_decoding_message_size(max),
        )
        .add_service(
            pb::topic_service_server::TopicServiceServer::new(services.clone())
                .max_decoding_message_size(max),
        )
        .add_service(
            pb::webhook_service_server::WebhookServiceServer::new(services)
                .max_decoding_message_size(max),
        )
        .serve_with_incoming_shutdown(
            // Without TCP_NODELAY, small replies wait for the peer's delayed ACK (~40 ms).
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            stop.cancelled(),
        )
        .await?;
    stop.cancel();
    info!("gRPC stopped; draining the relay");
    let _ = drain_task.await;
    let _ = sampler_task.await;
    let _ = relay_task.await;
    let _ = sweeper_task.await;
    let _ = counts_task.await;
    let _ = retention_task.await;
    let _ = fanout_task.await;
    Ok(())
}

/// The sweeper: returns deliveries with an expired lease to `pending`, and republishes
/// pending deliveries whose message was lost. Every statement uses SKIP LOCKED, so any
/// number of ingest replicas may sweep at once.
async fn sweep(pool: PgPool, cfg: IngestConfig, shutdown: CancellationToken) {
    // Whether the lost-message sweep was last found paused (the relay behind), to log the
    // change only.
    let mut paused = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(cfg.sweep_interval) => {}
        }
        match notify_store::deliveries::requeue_expired_leases(&pool, cfg.sweep_batch).await {
            Ok(expired) if expired.is_empty() => {}
            Ok(expired) => {
                let m = notify_telemetry::metrics();
                m.lease_recoveries.add(expired.len() as u64, &[]);
                for f in expired.iter().flat_map(|l| &l.fallback) {
                    notify_telemetry::metrics::count_fallback(
                        f.from.as_str(),
                        f.to.as_str(),
                        notify_store::deliveries::WORKER_LOST,
                    );
                }
                for lost in &expired {
                    // A call whose worker died: whether the provider got it is unknown.
                    m.deliveries_ambiguous.add(
                        1,
                        &notify_telemetry::metrics::channel_provider(
                            lost.channel.as_str(),
                            lost.provider.as_str(),
                        ),
                    );
                }
                for lost in expired.iter().filter(|l| l.failed) {
                    // The worker died or froze during the last attempt allowed: the
                    // attempt cap holds here as on the worker's own path.
                    let [c, p] = notify_telemetry::metrics::channel_provider(
                        lost.channel.as_str(),
                        lost.provider.as_str(),
                    );
                    m.deliveries_failed.add(
                        1,
                        &[c, p, opentelemetry::KeyValue::new("reason", "worker_lost")],
                    );
                    error!(delivery_id = %lost.id, channel = %lost.channel, attempt = lost.attempt,
                        reason = "worker_lost", alert = "delivery_failed",
                        "delivery failed: its worker died or froze during the last attempt allowed");
                }
                warn!(
                    recovered = expired.iter().filter(|l| !l.failed).count(),
                    failed = expired.iter().filter(|l| l.failed).count(),
                    "expired leases recovered"
                )
            }
            Err(e) => warn!(error = %e, "lease sweep failed"),
        }
        match notify_store::deliveries::relay_behind(&pool, cfg.republish_after, cfg.sweep_batch)
            .await
        {
            Ok(behind) if behind != paused => {
                paused = behind;
                if behind {
                    warn!(
                        backlog_over = cfg.sweep_batch,
                        due_for_s = cfg.republish_after.as_secs(),
                        "relay behind: the lost-message sweep waits until it catches up"
                    );
                } else {
                    info!("relay caught up: the lost-message sweep runs again");
                }
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "relay backlog probe failed"),
        }
        match notify_store::deliveries::republish_stale(&pool, cfg.republish_after, cfg.sweep_batch)
            .await
        {
            Ok(0) => {}
            Ok(n) => warn!(
                republished = n,
                "pending deliveries without a message were republished"
            ),
            Err(e) => warn!(error = %e, "republish sweep failed"),
        }
    }
}

/// Most deltas folded per rollup transaction.
const COUNTS_ROLLUP_BATCH: i64 = 10_000;

/// The console counts' rollup: every `interval`, folds the delivery count deltas into the
/// summary until none are left (a full batch means there may be more). Any number of
/// ingest replicas may roll up at once ([`notify_store::console::roll_up_counts`]).
async fn roll_up_counts(pool: PgPool, interval: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        loop {
            match notify_store::console::roll_up_counts(&pool, COUNTS_ROLLUP_BATCH).await {
                Ok(n) if n as i64 >= COUNTS_ROLLUP_BATCH && !shutdown.is_cancelled() => {}
                Ok(_) => break,
                Err(e) => {
                    warn!(error = %e, "delivery counts rollup failed");
                    break;
                }
            }
        }
    }
}

/// The retention purge: a pass every `cfg.interval` (after the last one ended), at the
/// instant of `cfg.clock`. Any number of ingest replicas may run it: one pass runs at a
/// time, the others skip their turn ([`notify_store::retention::purge`]).
async fn purge(pool: PgPool, cfg: RetentionConfig, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(cfg.interval) => {}
        }
        let now = match pool.acquire().await {
            Ok(mut conn) => cfg.clock.now(&mut conn).await,
            Err(e) => Err(e.into()),
        };
        let now = match now {
            Ok(now) => now,
            Err(e) => {
                warn!(error = %e, "retention purge could not read the clock");
                continue;
            }
        };
        let started = std::time::Instant::now();
        match notify_store::retention::purge(&pool, &cfg.lengths, cfg.limits, now, &shutdown).await
        {
            Ok(None) => {}
            Ok(Some(p)) if p.is_nothing() => {}
            Ok(Some(p)) => info!(
                deliveries = p.deliveries,
                attempts = p.attempts,
                attempts_cleared = p.attempts_cleared,
                events = p.events,
                inbox = p.inbox,
                batches = p.batches,
                batches_skipped = p.batches_skipped,
                took_ms = started.elapsed().as_millis() as u64,
                "retention purge"
            ),
            Err(e) => warn!(error = %e, "retention purge failed"),
        }
    }
}

/// Every gRPC service name the health service reports on ("" is the server as a whole).
const SERVICE_NAMES: &[&str] = &[
    "",
    "notify.v1.IngestService",
    "notify.v1.RecipientService",
    "notify.v1.TypeService",
    "notify.v1.TopicService",
    "notify.v1.WebhookService",
];

/// The server span of one gRPC call (OpenTelemetry RPC semantic conventions), continuing
/// the caller's trace from its `traceparent` metadata. Health checks and reflection get
/// none (probes would flood the traces).
fn server_span(req: &http::Request<()>) -> tracing::Span {
    let path = req.uri().path().trim_start_matches('/');
    if path.starts_with("grpc.") {
        return tracing::Span::none();
    }
    let (service, method) = path.split_once('/').unwrap_or((path, ""));
    let span = tracing::info_span!(
        "rpc",
        otel.name = %path,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
        rpc.grpc.status_code = tracing::field::Empty,
    );
    notify_telemetry::propagation::set_parent(
        &span,
        notify_telemetry::propagation::context_from_headers(req.headers()),
    );
    span
}

/// Samples the gauges every `cfg.metrics_interval`: outbox size and age, pending
/// deliveries and the oldest due one per channel, paused channels, webhook messages
/// pending for over a minute (from Postgres) and the
/// dead-letter queue's depth (from RabbitMQ). Every replica samples the same values.
async fn sample_gauges(
    pool: PgPool,
    cfg: IngestConfig,
    relay: Arc<relay::RelayStats>,
    stop: CancellationToken,
) {
    use notify_core::Channel;
    use opentelemetry::KeyValue;
    let m = notify_telemetry::metrics();
    let mut amqp: Option<notify_broker::lapin::Connection> = None;
    loop {
        match notify_store::deliveries::gauges(&pool).await {
            Ok(g) => {
                m.outbox_messages.record(g.outbox_rows as u64, &[]);
                m.outbox_oldest_age.record(g.outbox_oldest_s, &[]);
                for c in Channel::ALL {
                    let label = [KeyValue::new("channel", c.as_str())];
                    let row = g.channels.iter().find(|r| r.channel == c);
                    m.deliveries_pending
                        .record(row.map_or(0, |r| r.pending as u64), &label);
                    m.oldest_pending_age
                        .record(row.map_or(0.0, |r| r.oldest_due_s), &label);
                    m.deliveries_scheduled
                        .record(row.map_or(0, |r| r.scheduled as u64), &label);
                    m.channel_paused
                        .record(u64::from(row.is_some_and(|r| r.paused)), &label);
                }
            }
            Err(e) => warn!(error = %e, "metrics: database gauges not sampled"),
        }
        match notify_store::webhooks::pending_backlog(&pool).await {
            Ok(n) => m.webhook_messages_pending.record(n.max(0) as u64, &[]),
            Err(e) => warn!(error = %e, "metrics: webhook backlog not sampled"),
        }
        // The relay declares the queues when it connects; before that the dead-letter
        // queue may not exist yet.
        let declared = relay.connected.load(std::sync::atomic::Ordering::SeqCst);
        if declared && amqp.as_ref().is_none_or(|c| !c.status().connected()) {
            amqp = notify_broker::connect(&cfg.relay.amqp_url, "ingest-metrics")
                .await
                .ok();
        }
        if let Some(conn) = &amqp {
            match notify_broker::dead_letter_depth(conn, &cfg.relay.topology).await {
                Ok(n) => m.dead_letter_messages.record(u64::from(n), &[]),
                Err(e) => warn!(error = %e, "metrics: dead-letter depth not sampled"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(cfg.metrics_interval) => {}
        }
    }
    if let Some(conn) = amqp {
        let _ = conn.close(200, "ingest stopping".into()).await;
    }
}
