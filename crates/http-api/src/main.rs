//! `http-api`: the HTTP service (LINE webhook, one-click unsubscribe). See the library
//! docs for the routes.
//!
//! Environment: `NOTIFY_HTTP_ADDR` (127.0.0.1:8080), `NOTIFY_DATABASE_URL` (required),
//! `NOTIFY_DB_POOL_SIZE` (10), `NOTIFY_DATABASE_POOLER` (`none`; `pgbouncer`, see
//! docs/pooling.md), `NOTIFY_DATABASE_DIRECT_URL` (unset: the inbox's `LISTEN` uses
//! `NOTIFY_DATABASE_URL`), `NOTIFY_LINE_CHANNEL_SECRET` (required),
//! `NOTIFY_UNSUBSCRIBE_SECRET` (required), `NOTIFY_INBOX_JWT_SECRET` or
//! `NOTIFY_INBOX_JWKS_FILE` (one required), `NOTIFY_INBOX_RATE` (20),
//! `NOTIFY_CORS_ORIGINS` (empty), the console's `NOTIFY_CONSOLE_*` (README).
//!
//! `http-api hash-password` reads a password from standard input (one line) and prints
//! its argon2id PHC string, for `NOTIFY_CONSOLE_USERS`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    notify_telemetry::exit_if_help(
        "usage: http-api [hash-password]\n  serves the LINE webhook, one-click unsubscribe, the inbox API, the operations\n  console, /healthz, /readyz and /metrics on NOTIFY_HTTP_ADDR until SIGTERM.\n\n  hash-password: reads a password on standard input and prints its argon2id hash\n  for NOTIFY_CONSOLE_USERS.\nConfiguration: environment variables, see README.",
    );
    if std::env::args().nth(1).as_deref() == Some("hash-password") {
        let mut password = String::new();
        std::io::stdin().read_line(&mut password)?;
        let password = password.trim_end_matches(['\r', '\n']);
        if password.is_empty() {
            anyhow::bail!("hash-password: type the password on standard input");
        }
        println!("{}", http_api::console::password_hash(password));
        return Ok(());
    }
    notify_telemetry::init("http-api");
    let mut env = notify_telemetry::env();
    let addr = env.parse::<std::net::SocketAddr>("NOTIFY_HTTP_ADDR", ([127, 0, 0, 1], 8080).into());
    let database_url = env.url("NOTIFY_DATABASE_URL", &["postgres", "postgresql"]);
    let pool_size = env.number("NOTIFY_DB_POOL_SIZE", 10, 1, 1000);
    let pooler = notify_store::Pooler::from_env(&mut env);
    let direct_url = notify_store::direct_url_from_env(&mut env, pooler);
    let cfg = http_api::HttpConfig::from_env(&mut env);
    let (database_url, cfg) =
        notify_telemetry::config_or_exit("http-api", env, database_url.and_then(|d| Ok((d, cfg?))));
    let mut pool_cfg = notify_store::PoolConfig::new(database_url);
    pool_cfg.max_connections = pool_size;
    pool_cfg.pooler = pooler;
    if let Err(problem) = http_api::inbox::Verifier::new(&cfg.inbox) {
        notify_telemetry::exit_bad_config("http-api", &problem);
    }
    let pool = notify_store::connect_pools(&pool_cfg, direct_url.as_deref())?;
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => notify_telemetry::exit_bad_config(
            "http-api",
            &format!("NOTIFY_HTTP_ADDR={addr}: cannot listen: {e}"),
        ),
    };
    tracing::info!(%addr, "http-api listening");
    let served = http_api::serve(listener, pool, cfg, notify_telemetry::shutdown_on_signal()).await;
    notify_telemetry::shutdown();
    served?;
    Ok(())
}
