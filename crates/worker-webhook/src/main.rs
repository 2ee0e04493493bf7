//! `worker-webhook`: consumes `deliveries.webhook` and POSTs signed status webhooks.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    const SERVICE: &str = "worker-webhook";
    notify_telemetry::exit_if_help(
        "usage: worker-webhook\n  delivers status webhooks to callers' endpoints until SIGTERM; /healthz, /readyz and\n  /metrics on NOTIFY_ADMIN_ADDR when set.\nConfiguration: environment variables, see README and docs/webhooks.md.",
    );
    notify_telemetry::init(SERVICE);
    let mut env = notify_telemetry::env();
    let database_url = env.url("NOTIFY_DATABASE_URL", &["postgres", "postgresql"]);
    let pool_size = env.number("NOTIFY_DB_POOL_SIZE", 10, 1, 1000);
    let pooler = notify_store::Pooler::from_env(&mut env);
    let cfg = worker_webhook::WebhookConfig::from_env(&mut env);
    notify_telemetry::admin::check_env(&mut env);
    let pool = database_url.as_ref().ok().and_then(|url| {
        let mut pool_cfg = notify_store::PoolConfig::new(url.clone());
        pool_cfg.max_connections = pool_size;
        pool_cfg.pooler = pooler;
        notify_store::connect(&pool_cfg)
            .map_err(|e| env.error(format!("NOTIFY_DATABASE_URL is invalid: {e}")))
            .ok()
    });
    if let Err(problems) = env.finish() {
        notify_telemetry::exit_bad_config(SERVICE, &problems);
    }
    let (Some(cfg), Some(pool)) = (cfg, pool) else {
        notify_telemetry::exit_bad_config(SERVICE, "incomplete configuration");
    };
    let shutdown = notify_telemetry::shutdown_on_signal();
    // Ready while Postgres answers and the consumer of deliveries.webhook is open, as for
    // the channel workers (notify-worker's bin_main); 503 while draining.
    let consuming = notify_worker::Readiness::new();
    let admin_stop =
        notify_worker::serve_admin(SERVICE, &pool, &consuming, "deliveries.webhook", &shutdown)
            .await;
    let result = worker_webhook::run_with_readiness(cfg, pool, consuming, shutdown).await;
    admin_stop.cancel();
    notify_telemetry::shutdown();
    Ok(result?)
}
