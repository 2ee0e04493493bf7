//! `notifyctl`: operator command line.
//!
//! `notifyctl chaos` runs the crash and outage test (see [`chaos`]); `notifyctl bench`
//! the benchmarks (see [`bench`]).
//! `notifyctl keys create|list|revoke` manages the API keys of calling services (see
//! [`crate::keys`]); every gRPC call this tool makes sends `NOTIFY_API_KEY`.
//! `notifyctl erase-recipient USER_ID` and `notifyctl export-recipient USER_ID [--out FILE]`
//! call `EraseRecipient` and `ExportRecipientData` (see [`crate::data`]).
//! `notifyctl retention-soak` runs the retention soak by hand (see
//! [`crate::retention_soak`] and bench/retention/README.md).
//! `notifyctl demo` runs the demo scenario against a running ingest and workers and exits
//! 0 only when every recipient x channel ended as expected. Environment:
//! `NOTIFY_GRPC_URL` (http://127.0.0.1:50051), `NOTIFY_DATABASE_URL`, `NOTIFY_MAILDEV_URL`,
//! `NOTIFY_SIM_URL` (required for the checks).

// A binary: its modules' `pub` items are this crate's own (no library to export them from).
#![allow(unreachable_pub)]

mod bench;
mod chaos;
mod console_bench;
mod data;
mod demo;
mod keys;
mod observe;
mod procs;
mod receivers;
mod retention_soak;

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    notify_telemetry::install_crypto_provider();
    match std::env::args().nth(1).as_deref() {
        Some("demo") => {
            let mut env = notify_telemetry::env();
            let database_url = env.required("NOTIFY_DATABASE_URL");
            let maildev_url = env.required("NOTIFY_MAILDEV_URL");
            let sim_url = env.required("NOTIFY_SIM_URL");
            let http_url = env.required("NOTIFY_HTTP_URL");
            let inbox_jwt_secret = env.required("NOTIFY_INBOX_JWT_SECRET");
            let examples_python = env.required("NOTIFY_EXAMPLES_PYTHON");
            let examples_dir = env.required("NOTIFY_EXAMPLES_DIR");
            let log_dir = env.required("NOTIFY_LOG_DIR");
            let cfg = (|| {
                Ok(crate::demo::DemoConfig {
                    grpc_url: env.string("NOTIFY_GRPC_URL", "http://127.0.0.1:50051"),
                    database_url: database_url?,
                    maildev_url: maildev_url?,
                    sim_url: sim_url?,
                    http_url: http_url?,
                    inbox_jwt_secret: inbox_jwt_secret?,
                    examples: crate::receivers::Examples {
                        python: examples_python?.into(),
                        dir: examples_dir?.into(),
                    },
                    log_dir: log_dir?.into(),
                })
            })();
            let cfg = notify_telemetry::config_or_exit("notifyctl", env, cfg);
            exit_code("demo", crate::demo::run(&cfg).await)
        }
        Some("chaos") => {
            let mut env = notify_telemetry::env();
            let bin_dir = env.required("NOTIFY_BIN_DIR");
            let stack_script = env.required("NOTIFY_STACK_SCRIPT");
            let log_dir = env.required("NOTIFY_LOG_DIR");
            let database_url = env.required("NOTIFY_DATABASE_URL");
            let maildev_url = env.required("NOTIFY_MAILDEV_URL");
            let sim_url = env.required("NOTIFY_SIM_URL");
            let amqp_url = env.required("NOTIFY_AMQP_URL");
            let examples_python = env.required("NOTIFY_EXAMPLES_PYTHON");
            let examples_dir = env.required("NOTIFY_EXAMPLES_DIR");
            let ha = env
                .parse("NOTIFY_CHAOS_HA", false)
                .then(|| crate::chaos::ha::HaConfig {
                    pg_ha_script: env.string("NOTIFY_PG_HA_SCRIPT", "deploy/pg-ha.sh").into(),
                });
            let cfg = (|| {
                Ok(crate::chaos::ChaosConfig {
                    examples_python: examples_python?.into(),
                    examples_dir: examples_dir?.into(),
                    grpc_url: env.string("NOTIFY_GRPC_URL", "http://127.0.0.1:50051"),
                    settle: env.parse_with(
                        "NOTIFY_CHAOS_SETTLE",
                        std::time::Duration::from_secs(900),
                        |s| notify_core::retry::parse_duration(s).map_err(|e| e.to_string()),
                    ),
                    amqp_prefix: env.string("NOTIFY_AMQP_PREFIX", ""),
                    bin_dir: bin_dir?.into(),
                    stack_script: stack_script?.into(),
                    log_dir: log_dir?.into(),
                    database_url: database_url?,
                    maildev_url: maildev_url?,
                    sim_url: sim_url?,
                    amqp_url: amqp_url?,
                    ha,
                })
            })();
            let cfg = notify_telemetry::config_or_exit("notifyctl", env, cfg);
            let outcome = crate::chaos::run(&cfg).await;
            if let Ok(false) = outcome {
                eprintln!("chaos: a promise was broken (see the lines above)");
            }
            exit_code("chaos", outcome)
        }
        Some("bench") => {
            let mut env = notify_telemetry::env();
            let bin_dir = env.required("NOTIFY_BIN_DIR");
            let log_dir = env.required("NOTIFY_LOG_DIR");
            let database_url = env.required("NOTIFY_DATABASE_URL");
            let amqp_url = env.required("NOTIFY_AMQP_URL");
            let sim_url = env.required("NOTIFY_SIM_URL");
            let cfg = (|| {
                Ok(crate::bench::BenchConfig {
                    grpc_url: env.string("NOTIFY_GRPC_URL", "http://127.0.0.1:50051"),
                    stack_dir: env.string("NOTIFY_STACK_DIR", ".stack").into(),
                    phase: env.parse_with(
                        "NOTIFY_BENCH_PHASE",
                        std::time::Duration::from_secs(30),
                        |s| notify_core::retry::parse_duration(s).map_err(|e| e.to_string()),
                    ),
                    only: env.parse_with("NOTIFY_BENCH_ONLY", Vec::new(), |s| {
                        s.split(',')
                        .map(|p| p.trim())
                        .filter(|p| !p.is_empty())
                        .map(|p| match p {
                            "ingest" | "e2e" | "latency" | "fanout" | "cancel" | "console" => {
                                Ok(p.to_string())
                            }
                            _ => Err(format!(
                                "{p:?} is not a phase; use ingest, e2e, latency, fanout, cancel or console"
                            )),
                        })
                        .collect()
                    }),
                    bin_dir: bin_dir?.into(),
                    log_dir: log_dir?.into(),
                    database_url: database_url?,
                    amqp_url: amqp_url?,
                    sim_url: sim_url?,
                })
            })();
            let cfg = notify_telemetry::config_or_exit("notifyctl", env, cfg);
            exit_code("bench", crate::bench::run(&cfg).await.map(|()| true))
        }
        Some("retention-soak") => {
            let mut env = notify_telemetry::env();
            let cfg = crate::retention_soak::SoakConfig::from_env(&mut env);
            let cfg = notify_telemetry::config_or_exit("notifyctl", env, cfg);
            exit_code("retention-soak", crate::retention_soak::run(&cfg).await)
        }
        Some("keys") => {
            if std::env::args()
                .skip(2)
                .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
                || std::env::args().nth(2).is_none()
            {
                println!(
                    "usage: notifyctl keys create NAME --types PATTERNS [--manage] [--rate N] [--max-recipients N]\n       notifyctl keys list\n       notifyctl keys revoke NAME\n  PATTERNS: type keys or prefixes ending in * (order_*,security_login), or * for all.\n  --rate: CreateEvent calls per second (default 50); --max-recipients: per event (default 1000).\n  Talks to Postgres at NOTIFY_DATABASE_URL. create prints the key once, on stdout.\n  Revoked names stay taken."
                );
                return ExitCode::SUCCESS;
            }
            let mut env = notify_telemetry::env();
            let database_url = env.required("NOTIFY_DATABASE_URL");
            let database_url = notify_telemetry::config_or_exit("notifyctl", env, database_url);
            let args: Vec<String> = std::env::args().skip(2).collect();
            match crate::keys::run(&database_url, &args).await {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("notifyctl keys: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(command @ ("erase-recipient" | "export-recipient")) => {
            let args: Vec<String> = std::env::args().skip(2).collect();
            if args
                .iter()
                .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
            {
                println!("{}", crate::data::USAGE);
                return ExitCode::SUCCESS;
            }
            let mut env = notify_telemetry::env();
            let grpc_url = env.string("NOTIFY_GRPC_URL", "http://127.0.0.1:50051");
            let grpc_url = notify_telemetry::config_or_exit("notifyctl", env, Ok(grpc_url));
            match crate::data::run(&grpc_url, command, &args).await {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("notifyctl {command}: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!(
                "usage: notifyctl demo | notifyctl chaos | notifyctl bench | notifyctl retention-soak | notifyctl erase-recipient USER_ID | notifyctl export-recipient USER_ID [--out FILE] | notifyctl keys (create NAME --types PATTERNS [--manage] [--rate N] [--max-recipients N] | list | revoke NAME)"
            );
            ExitCode::from(64)
        }
    }
}

/// The exit code of a run that checks promises: 0 when every one held, 1 when one broke
/// or the run itself failed (said on stderr as `<command> failed: ...`).
fn exit_code(command: &str, outcome: anyhow::Result<bool>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{command} failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}
