//! The standard `main` of a worker binary.

use crate::{ChannelSender, Readiness, WorkerConfig, WorkerError, run};
use notify_store::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Standard `main` body of a worker binary: reads the configuration (exit 64 listing every
/// bad variable), sets up logging, builds the sender with `build` (given the environment
/// reader and the database pool), and runs until SIGTERM.
///
/// # Errors
/// What stopped the worker ([`WorkerError`]: the broker, after its reconnects).
pub async fn main_with<S, F>(service: &str, build: F) -> Result<(), WorkerError>
where
    S: ChannelSender,
    F: FnOnce(&mut notify_core::config::Env, Option<&PgPool>) -> Option<S>,
{
    notify_telemetry::exit_if_help(&format!(
        "usage: {service}\n  consumes its channel's queue and delivers until SIGTERM; /healthz, /readyz and\n  /metrics on NOTIFY_ADMIN_ADDR when set.\nConfiguration: environment variables, see README."
    ));
    notify_telemetry::init(service);
    let mut env = notify_telemetry::env();
    let database_url = env.url("NOTIFY_DATABASE_URL", &["postgres", "postgresql"]);
    let pool_size = env.number("NOTIFY_DB_POOL_SIZE", 10, 1, 1000);
    let pooler = notify_store::Pooler::from_env(&mut env);
    // Claims, records and inbox rows are found by key: one plan fits every batch.
    let generic_plans = env.parse("NOTIFY_DB_GENERIC_PLANS", true);
    let cfg = WorkerConfig::from_env(&mut env);
    notify_telemetry::admin::check_env(&mut env);
    let pool = database_url.as_ref().ok().and_then(|url| {
        let mut pool_cfg = notify_store::PoolConfig::new(url.clone());
        pool_cfg.max_connections = pool_size;
        pool_cfg.pooler = pooler;
        pool_cfg.generic_plans = generic_plans;
        notify_store::connect(&pool_cfg)
            .map_err(|e| env.error(format!("NOTIFY_DATABASE_URL is invalid: {e}")))
            .ok()
    });
    // The sender reads its own variables even when others are bad, so every problem is
    // reported in one go.
    let sender = build(&mut env, pool.as_ref());
    let cfg = notify_telemetry::config_or_exit(service, env, cfg);
    let (Some(pool), Some(sender)) = (pool, sender) else {
        notify_telemetry::exit_bad_config(service, "the channel sender could not be built");
    };
    let shutdown = notify_telemetry::shutdown_on_signal();
    let consuming = Readiness::new();
    let admin_stop = serve_admin(service, &pool, &consuming, "its queue", &shutdown).await;
    let result = run(cfg, pool, Arc::new(sender), consuming, shutdown).await;
    admin_stop.cancel();
    notify_telemetry::shutdown();
    result
}

/// Serves a worker's admin endpoint (`/healthz`, `/readyz`, `/metrics` on
/// `NOTIFY_ADMIN_ADDR` when set): ready while Postgres answers and `consuming` says the
/// consumer of `queue` (named in the 503's reason) is open; 503 from `shutdown` on, while
/// in-flight deliveries drain, with `/healthz` still 200. The endpoint outlives the drain:
/// cancel the returned token to stop it.
pub async fn serve_admin(
    service: &str,
    pool: &PgPool,
    consuming: &Readiness,
    queue: &str,
    shutdown: &CancellationToken,
) -> CancellationToken {
    let not_consuming = format!(
        "not consuming from {queue} (starting, draining, or RabbitMQ unreachable; see the log)"
    );
    let (pool, consuming) = (pool.clone(), consuming.clone());
    let readiness = notify_telemetry::admin::Readiness::new()
        .with_check("postgres", move || {
            let pool = pool.clone();
            async move { notify_store::ping(&pool).await.map_err(|e| e.to_string()) }
        })
        .with_check("rabbitmq", move || {
            let ready = if consuming.is_consuming() {
                Ok(())
            } else {
                Err(not_consuming.clone())
            };
            async move { ready }
        });
    let admin_stop = CancellationToken::new();
    notify_telemetry::admin::spawn_from_env(service, readiness.clone(), admin_stop.clone()).await;
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        readiness.start_draining();
    });
    admin_stop
}
