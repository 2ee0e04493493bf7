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

pub use metrics::metrics;
pub use otel::shutdown;

use std::fmt::Display;
use std::str::FromStr;
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
    let settings = match otel::OtelSettings::from_env() {
        Ok(s) => s,
        Err(e) => exit_bad_config(service, &e),
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
        _ => !terminal,
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
    let traces = tracing_opentelemetry::layer()
        .with_tracer(tracer)
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

/// Reads typed settings from the environment and collects every problem, so that a
/// misconfigured process names all bad variables in one go.
#[derive(Debug, Default)]
pub struct Env {
    errors: Vec<String>,
}

impl Env {
    /// A new reader.
    pub fn new() -> Self {
        Self::default()
    }

    /// A required variable; records an error when it is unset or empty.
    pub fn required(&mut self, name: &str) -> String {
        match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => v,
            _ => {
                self.errors.push(format!("{name} is required"));
                String::new()
            }
        }
    }

    /// An optional text variable with a default.
    pub fn string(&mut self, name: &str, default: &str) -> String {
        std::env::var(name).unwrap_or_else(|_| default.to_string())
    }

    /// An optional variable parsed with `FromStr`, with a default; records an error when
    /// it does not parse.
    pub fn parse<T: FromStr>(&mut self, name: &str, default: T) -> T
    where
        T::Err: Display,
    {
        self.parse_with(name, default, |s| s.parse::<T>().map_err(|e| e.to_string()))
    }

    /// An optional variable parsed with `f`, with a default.
    pub fn parse_with<T>(
        &mut self,
        name: &str,
        default: T,
        f: impl FnOnce(&str) -> Result<T, String>,
    ) -> T {
        match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => match f(v.trim()) {
                Ok(t) => t,
                Err(e) => {
                    self.errors.push(format!("{name}={v:?} is invalid: {e}"));
                    default
                }
            },
            _ => default,
        }
    }

    /// A required URL whose scheme is one of `schemes` (e.g. `["postgres", "postgresql"]`).
    pub fn url(&mut self, name: &str, schemes: &[&str]) -> String {
        let v = self.required(name);
        if !v.is_empty() {
            let scheme = v.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
            if !scheme.is_some_and(|s| schemes.contains(&s.as_str())) {
                let wanted: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
                self.errors.push(format!(
                    "{name}={v:?} is invalid: must start with {}",
                    wanted.join(" or ")
                ));
            }
        }
        v
    }

    /// An optional whole number in `min..=max`, with a default.
    pub fn number<T>(&mut self, name: &str, default: T, min: T, max: T) -> T
    where
        T: FromStr + PartialOrd + Display + Copy,
    {
        self.parse_with(name, default, |s| match s.parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(n),
            _ => Err(format!("must be a whole number from {min} to {max}")),
        })
    }

    /// Records a problem found while validating related settings.
    pub fn error(&mut self, message: impl Into<String>) {
        self.errors.push(message.into());
    }

    /// `Ok` when every variable was fine, else every problem, one per line.
    pub fn finish(self) -> Result<(), String> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors.join("\n"))
        }
    }
}

/// Exits the process with [`EXIT_BAD_CONFIG`] after printing `problems`.
pub fn exit_bad_config(service: &str, problems: &str) -> ! {
    eprintln!("{service}: invalid configuration:\n{problems}");
    std::process::exit(EXIT_BAD_CONFIG)
}

/// A token cancelled on the first SIGTERM or SIGINT.
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
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
        t.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_variable_is_reported() {
        // The process environment is not modified (set_var is unsafe in edition 2024).
        let mut env = Env::new();
        let a: u32 = env.parse_with("A_TEST_ONLY", 1, |_| Err("not a number".into()));
        let _ = env.required("NOTIFY_TELEMETRY_TEST_SURELY_UNSET");
        assert_eq!(a, 1);
        // parse_with only runs `f` for a set variable, so only `required` fails here.
        let err = env.finish().unwrap_err();
        assert_eq!(err, "NOTIFY_TELEMETRY_TEST_SURELY_UNSET is required");
    }
}
