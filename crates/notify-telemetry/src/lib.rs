//! Process bootstrap shared by every binary: logs, traces and metrics (OpenTelemetry),
//! the admin endpoint (`/healthz`, `/readyz`, `/metrics`), configuration read from the
//! environment with every bad variable reported at once, and shutdown on SIGTERM / SIGINT
//! passed around as a `CancellationToken`.
//!
//! Logs: JSON lines (see [`logfmt`]) unless the log stream is a terminal, where they are
//! human-readable text; `NOTIFY_LOG_FORMAT=json|text` overrides. Services log to stdout;
//! one-shot commands ([`init_cli`]) log to stderr so their own output stays clean. The
//! level comes from `RUST_LOG` (default `info`); spans go to OpenTelemetry at `info` and
//! above whatever `RUST_LOG` says.

pub mod admin;
pub mod logfmt;
pub mod metrics;
pub mod otel;
pub mod propagation;
pub mod reconnect;

pub use metrics::metrics;
pub use otel::shutdown;

use notify_core::config::{Env, Missing};
use tokio_util::sync::CancellationToken;

/// Exit code for bad configuration (`EX_CONFIG`-style usage error, sysexits.h 64).
pub const EXIT_BAD_CONFIG: i32 = 64;

/// Where a process writes its logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

/// Installs logging, tracing and metrics for the long-running service `service` (logs on
/// stdout) and the process-wide rustls crypto provider. Reads the `OTEL_*` variables (see
/// [`otel`]); an unsupported one exits with code 64. Call inside the Tokio runtime.
/// Later calls do nothing.
pub fn init(service: &str) {
    init_stream(service, Stream::Stdout)
}

/// As [`init`] for one-shot commands (`ingest migrate`): logs on stderr.
pub fn init_cli(service: &str) {
    init_stream(service, Stream::Stderr)
}

fn init_stream(service: &str, stream: Stream) {
    use std::io::IsTerminal;
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer, Registry, fmt};
    install_crypto_provider();
    // Problems found here are reported with every other bad variable, by `Env::finish`.
    let settings = match otel::OtelSettings::from_env() {
        Ok(s) => s,
        Err(e) => {
            init_problem(e);
            otel::OtelSettings {
                export_traces: false,
                export_metrics: false,
            }
        }
    };
    let tracer = match otel::install(service, &settings) {
        Ok(t) => t,
        Err(e) => exit_bad_config(service, &e),
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = match stream {
        Stream::Stdout => std::io::stdout().is_terminal(),
        Stream::Stderr => std::io::stderr().is_terminal(),
    };
    let json = match std::env::var("NOTIFY_LOG_FORMAT").as_deref() {
        Ok("json") => true,
        Ok("text") => false,
        Ok("") | Err(_) => !terminal,
        Ok(other) => {
            init_problem(format!(
                "NOTIFY_LOG_FORMAT={other:?} is invalid: must be json or text"
            ));
            !terminal
        }
    };
    let writer = move || -> Box<dyn std::io::Write> {
        match stream {
            Stream::Stdout => Box::new(std::io::stdout()),
            Stream::Stderr => Box::new(std::io::stderr()),
        }
    };
    let logs: Box<dyn Layer<Registry> + Send + Sync> = if json {
        fmt::layer()
            .fmt_fields(fmt::format::JsonFields::new())
            .event_format(logfmt::JsonLines)
            .with_writer(writer)
            .with_filter(filter)
            .boxed()
    } else {
        fmt::layer()
            .with_writer(writer)
            .with_ansi(terminal)
            .with_target(false)
            .with_filter(filter)
            .boxed()
    };
    // No busy/idle timings: they cost a clock read and a span-extension lookup on every
    // poll of an instrumented future, and a span's start and end already give its length.
    let traces = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_filter(LevelFilter::INFO);
    let result = tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init();
    if result.is_ok() {
        tracing::info!(
            service,
            version = env!("CARGO_PKG_VERSION"),
            otlp_traces = settings.export_traces,
            otlp_metrics = settings.export_metrics,
            "starting"
        );
    }
}

/// Configuration problems found while setting up telemetry, handed to the first
/// [`env`] so that they are reported together with every other bad variable.
static INIT_PROBLEMS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn init_problem(p: String) {
    INIT_PROBLEMS.lock().expect("init problems").push(p);
}

pub use notify_core::config::redact;

/// Logging for tests: output goes through libtest's capture, so it shows only for a
/// failing test. Safe to call from every test.
pub fn init_for_tests() {
    install_crypto_provider();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_target(false)
        .try_init();
}

/// Installs ring as rustls' process-wide crypto provider (no-op when one is installed).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The settings reader over this process's environment (`notify_core::config::Env`),
/// holding any problem telemetry set-up found (see [`init`]) so that it is reported with
/// every other bad variable.
pub fn env() -> Env {
    let mut env = Env::from_vars(std::env::vars());
    for problem in std::mem::take(&mut *INIT_PROBLEMS.lock().expect("init problems")) {
        env.error(problem);
    }
    env
}

/// The configuration a binary read, or the end of the process: when `env` recorded any
/// problem, prints them all and exits with [`EXIT_BAD_CONFIG`]; else returns `value`
/// (whose [`Missing`] errors `env` has recorded, so after a clean `finish` it is `Ok`).
pub fn config_or_exit<T>(service: &str, env: Env, value: Result<T, Missing>) -> T {
    if let Err(problems) = env.finish() {
        exit_bad_config(service, &problems);
    }
    value.unwrap_or_else(|missing| exit_bad_config(service, &missing.to_string()))
}

/// When the command line asks for help (`-h`, `--help` or `help`), prints `usage` and
/// exits 0; otherwise returns. Call first thing in `main`, before reading configuration.
pub fn exit_if_help(usage: &str) {
    if std::env::args()
        .skip(1)
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
    {
        println!("{usage}");
        std::process::exit(0);
    }
}

/// Exits the process with [`EXIT_BAD_CONFIG`] after printing `problems`.
pub fn exit_bad_config(service: &str, problems: &str) -> ! {
    eprintln!("{service}: invalid configuration:\n{problems}");
    std::process::exit(EXIT_BAD_CONFIG)
}

/// A token cancelled on the first SIGTERM or SIGINT. A second signal ends the process at
/// once with exit code 130 (an operator who does not want to wait for the drain; work in
/// hand is recovered as after a crash: leases expire, outbox rows stay).
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down (a second signal exits at once)"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down (a second signal exits at once)"),
        }
        t.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::warn!("second signal: exiting without finishing the drain");
        std::process::exit(130);
    });
    token
}

/// Parses a list `name=n,...` of whole numbers above 0 (empty: none), such as
/// `line=1000,fcm=5000`. `key` reads each name; `shape` (`provider=per_second`) and `noun`
/// (`rate`) name the entries in errors.
pub fn parse_counts<K: Ord>(
    s: &str,
    shape: &str,
    noun: &str,
    key: impl Fn(&str) -> Result<K, String>,
) -> Result<std::collections::BTreeMap<K, u32>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, n) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not {shape}"))?;
            let name = key(name.trim())?;
            match n.trim().parse::<u32>() {
                Ok(n) if n > 0 => Ok((name, n)),
                _ => Err(format!(
                    "{pair:?}: the {noun} must be a whole number above 0"
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_parse_per_name_and_refuse_zero() {
        let parse =
            |s| super::parse_counts(s, "provider=per_second", "rate", |n| Ok(n.to_string()));
        let ok = parse(" line=1000, fcm=5 ,").unwrap();
        assert_eq!(ok.get("line"), Some(&1000));
        assert_eq!(ok.get("fcm"), Some(&5));
        assert!(parse("").unwrap().is_empty());
        assert_eq!(
            parse("line").unwrap_err(),
            "\"line\" is not provider=per_second"
        );
        assert_eq!(
            parse("line=0").unwrap_err(),
            "\"line=0\": the rate must be a whole number above 0"
        );
    }
}
