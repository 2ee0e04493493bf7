//! `ingest`: the gRPC API, outbox relay and lease sweeper.
//!
//! Usage: `ingest [serve]` runs the service; `ingest migrate` applies database migrations
//! and exits; `ingest load-types FILE` applies a versioned notification-type file.
//! Configuration comes from the environment (see README). Exit codes: 0 done, 64 bad
//! usage or configuration, 65 a type file refused (nothing written), 66 a file that
//! cannot be read, 1 a database or broker failure.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let command = std::env::args().nth(1).unwrap_or_else(|| "serve".into());
    let wants_help = |a: &str| matches!(a, "-h" | "--help" | "help");
    if wants_help(&command) || std::env::args().skip(2).any(|a| wants_help(&a)) {
        println!(
            "usage: ingest [serve | migrate | load-types FILE]\n  serve       gRPC API, outbox relay and lease sweeper (default)\n  migrate     apply database migrations and exit\n  load-types  apply a versioned notification-type file (JSON) to NOTIFY_DATABASE_URL and exit:\n              a higher version is applied in one transaction, the same content again is a\n              no-op, other content under a used version or a lower version is refused;\n              types the file does not name stay. Exit 65: refused, nothing written.\nConfiguration: environment variables, see README."
        );
        return Ok(ExitCode::SUCCESS);
    }
    if command == "serve" {
        notify_telemetry::init("ingest");
    } else {
        notify_telemetry::init_cli("ingest");
    }
    let mut env = notify_telemetry::env();
    let database_url = env.url("NOTIFY_DATABASE_URL", &["postgres", "postgresql"]);
    let pool_size = env.number("NOTIFY_DB_POOL_SIZE", 16, 1, 1000);
    let pooler = notify_store::Pooler::from_env(&mut env);
    let direct_url = notify_store::direct_url_from_env(&mut env, pooler);
    let pool_cfg = |url: String| {
        let mut pool_cfg = notify_store::PoolConfig::new(url);
        pool_cfg.max_connections = pool_size;
        pool_cfg.pooler = pooler;
        pool_cfg
    };
    match command.as_str() {
        "load-types" => {
            let Some(path) = std::env::args().nth(2) else {
                eprintln!("usage: ingest load-types FILE");
                return Ok(ExitCode::from(64));
            };
            let pool_cfg = pool_cfg(notify_telemetry::config_or_exit(
                "ingest",
                env,
                database_url,
            ));
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("ingest load-types: cannot read {path}: {e}");
                    return Ok(ExitCode::from(66));
                }
            };
            let pool = notify_store::connect(&pool_cfg)?;
            match ingest::types_file::load(&pool, &text).await {
                Ok(ingest::types_file::Loaded::Applied { version, types }) => {
                    println!("loaded {path}: version {version}, {types} types");
                    Ok(ExitCode::SUCCESS)
                }
                Ok(ingest::types_file::Loaded::AlreadyLoaded { version }) => {
                    println!("{path}: version {version} is already loaded; nothing to do");
                    Ok(ExitCode::SUCCESS)
                }
                Err(ingest::types_file::LoadError::Store(e)) => {
                    eprintln!("ingest load-types {path}: database failure: {e}");
                    Ok(ExitCode::FAILURE)
                }
                Err(e) => {
                    eprintln!("ingest load-types {path}: {e}");
                    Ok(ExitCode::from(65))
                }
            }
        }
        "migrate" => {
            let pool_cfg = pool_cfg(notify_telemetry::config_or_exit(
                "ingest",
                env,
                database_url,
            ));
            // The migrator holds a session advisory lock: Postgres itself, not a pooler.
            let pool = match &direct_url {
                Some(url) => notify_store::connect(&notify_store::PoolConfig::new(url.clone()))?,
                None => notify_store::connect(&pool_cfg)?,
            };
            notify_store::migrate(&pool).await?;
            tracing::info!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        "serve" => {
            let addr = env
                .parse::<std::net::SocketAddr>("NOTIFY_GRPC_ADDR", ([127, 0, 0, 1], 50051).into());
            let cfg = ingest::IngestConfig::from_env(&mut env);
            notify_telemetry::admin::check_env(&mut env);
            if let Ok(cfg) = &cfg
                && matches!(
                    cfg.auth,
                    ingest::auth::AuthMode::ClientCert | ingest::auth::AuthMode::Both
                )
                && cfg.tls.as_ref().is_none_or(|t| t.client_ca.is_none())
            {
                env.error(
                    "NOTIFY_GRPC_AUTH=client_cert or both needs mutual TLS: set NOTIFY_GRPC_TLS_CERT_FILE, NOTIFY_GRPC_TLS_KEY_FILE and NOTIFY_GRPC_CLIENT_CA_FILE",
                );
            }
            let (database_url, cfg) = notify_telemetry::config_or_exit(
                "ingest",
                env,
                database_url.and_then(|url| Ok((url, cfg?))),
            );
            let pools =
                notify_store::connect_pools(&pool_cfg(database_url), direct_url.as_deref())?;
            let listener = match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => notify_telemetry::exit_bad_config(
                    "ingest",
                    &format!("NOTIFY_GRPC_ADDR={addr}: cannot listen: {e}"),
                ),
            };
            let result =
                ingest::run(cfg, pools, listener, notify_telemetry::shutdown_on_signal()).await;
            notify_telemetry::shutdown();
            result?;
            Ok(ExitCode::SUCCESS)
        }
        other => {
            eprintln!(
                "ingest: unknown command {other:?}; use `ingest serve`, `ingest migrate` or `ingest load-types FILE`"
            );
            Ok(ExitCode::from(64))
        }
    }
}
