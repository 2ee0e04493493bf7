//! The ingest service: the gRPC API (events, recipients, types, health, reflection), the
//! outbox relay, the lease sweeper, the console counts' rollup and the retention purge, in
//! one process that may run as many replicas.
//! `main.rs` only reads configuration and calls [`run`]; tests call [`run`] in-process.

pub mod auth;
pub mod clock;
mod config;
mod convert;
pub mod error;
pub mod fanout;
pub mod grpc;
pub mod planning;
pub mod reflection;
pub mod relay;
mod tasks;
pub mod type_validation;
pub mod types_file;
pub mod undecodable;
pub mod writer;

pub use config::{IngestConfig, RetentionConfig, TlsFiles, parse_fatigue_caps};

use notify_proto::v1 as pb;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::info;

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
) -> Result<(), RunError> {
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
    let sampler_task = tokio::spawn(tasks::gauges::sample_gauges(
        pool.clone(),
        cfg.clone(),
        stats.clone(),
        stop.clone(),
    ));
    let sweeper_task = tokio::spawn(tasks::sweep::sweep(pool.clone(), cfg.clone(), stop.clone()));
    let counts_task = tokio::spawn(tasks::roll_up::roll_up_counts(
        pool.clone(),
        cfg.counts_rollup_interval,
        stop.clone(),
    ));
    let retention_task = tokio::spawn(tasks::purge::purge(
        session.clone(),
        cfg.retention.clone(),
        stop.clone(),
    ));
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
        .await
        .map_err(RunError::ApiKeys)?;
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
    .map_err(RunError::WriterThread)?;
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
    info!(addr = %listener.local_addr().map_err(RunError::Listener)?, "gRPC listening");
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
        builder = builder.tls_config(tls_cfg).map_err(RunError::Tls)?;
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
        .await
        .map_err(RunError::Serve)?;
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

/// Why [`run`] could not start or stopped early; each names the part that failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The first load of API keys (or the `LISTEN` for their changes) failed.
    #[error("loading API keys: {0}")]
    ApiKeys(#[source] notify_store::StoreError),
    /// The event writer's OS thread could not be spawned.
    #[error("starting the event writer's thread: {0}")]
    WriterThread(#[source] std::io::Error),
    /// The reflection index could not be built from the compiled descriptor sets.
    #[error(transparent)]
    Reflection(#[from] reflection::BadDescriptorSet),
    /// The listener's local address could not be read.
    #[error("reading the gRPC listener's address: {0}")]
    Listener(#[source] std::io::Error),
    /// The TLS certificate, key or client CA was rejected.
    #[error("configuring TLS: {0}")]
    Tls(#[source] tonic::transport::Error),
    /// The gRPC server stopped with an error.
    #[error("serving gRPC: {0}")]
    Serve(#[source] tonic::transport::Error),
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
