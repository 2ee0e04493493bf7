//! OpenTelemetry set-up: traces and metrics exported over OTLP/gRPC when the standard
//! `OTEL_*` variables name an endpoint, and metrics always kept for the Prometheus
//! `/metrics` endpoint (see [`crate::admin`]).
//!
//! Variables read (OpenTelemetry specification, "Environment Variable Specification";
//! `opentelemetry-otlp` reads the exporter ones itself):
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//!   `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`: where to export; unset means no export.
//! - `OTEL_EXPORTER_OTLP_PROTOCOL`: only `grpc` is built in; anything else is a
//!   configuration error (exit 64).
//! - `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: `none` turns that signal's export off.
//! - `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`: the resource (default service name:
//!   the binary's).
//! - `OTEL_BSP_*`, `OTEL_METRIC_EXPORT_INTERVAL`: batching and export intervals.
//!
//! Trace context travels as W3C Trace Context (`traceparent`, `tracestate`;
//! <https://www.w3.org/TR/trace-context/>) in gRPC metadata and AMQP message headers.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::sync::OnceLock;

/// The installed providers and the Prometheus registry behind `/metrics`.
pub(crate) struct Installed {
    pub(crate) tracer_provider: SdkTracerProvider,
    pub(crate) meter_provider: SdkMeterProvider,
    pub(crate) registry: prometheus::Registry,
}

pub(crate) static INSTALLED: OnceLock<Installed> = OnceLock::new();

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// What the `OTEL_*` variables ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// Export spans over OTLP.
    pub export_traces: bool,
    /// Export metrics over OTLP (the Prometheus endpoint is always on).
    pub export_metrics: bool,
}

impl OtelSettings {
    /// Reads the variables; every unsupported value is named, one per line.
    pub fn from_env() -> Result<Self, String> {
        let mut problems = Vec::new();
        for name in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        ] {
            if let Some(p) = var(name)
                && p != "grpc"
            {
                problems.push(format!(
                    "{name}={p:?} is invalid: only \"grpc\" (OTLP/gRPC) is built in"
                ));
            }
        }
        for name in ["OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER"] {
            if let Some(v) = var(name)
                && v != "otlp"
                && v != "none"
            {
                problems.push(format!("{name}={v:?} is invalid: must be otlp or none"));
            }
        }
        for name in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        ] {
            if let Some(v) = var(name) {
                let lower = v.to_ascii_lowercase();
                let rest = lower
                    .strip_prefix("http://")
                    .or_else(|| lower.strip_prefix("https://"));
                if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
                    problems.push(format!(
                        "{name}={:?} is invalid: must be http://host:port or https://host:port",
                        crate::redact(&v)
                    ));
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems.join("\n"));
        }
        let any = var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
        let off = |name: &str| var(name).is_some_and(|v| v == "none");
        Ok(Self {
            export_traces: !off("OTEL_TRACES_EXPORTER")
                && (any || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()),
            export_metrics: !off("OTEL_METRICS_EXPORTER")
                && (any || var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").is_some()),
        })
    }
}

/// Builds and installs the global tracer and meter providers and the W3C propagator.
/// Returns the tracer for the tracing layer. Must run inside a Tokio runtime when an
/// endpoint is set (the gRPC exporter's channel lives on it).
pub(crate) fn install(
    service: &str,
    settings: &OtelSettings,
) -> Result<opentelemetry_sdk::trace::Tracer, String> {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let mut resource = Resource::builder();
    if var("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service.to_string());
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();

    let mut traces = SdkTracerProvider::builder().with_resource(resource.clone());
    if settings.export_traces {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| format!("OTLP span exporter: {e}"))?;
        traces = traces.with_batch_exporter(exporter);
    }
    let tracer_provider = traces.build();

    let registry = prometheus::Registry::new();
    let prom = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .without_target_info()
        .scope_info_enabled(false)
        .build()
        .map_err(|e| format!("Prometheus exporter: {e}"))?;
    let mut meters = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(prom);
    if settings.export_metrics {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .build()
            .map_err(|e| format!("OTLP metric exporter: {e}"))?;
        meters = meters.with_reader(PeriodicReader::builder(exporter).build());
    }
    let meter_provider = meters.build();

    let tracer = tracer_provider.tracer("notify");
    opentelemetry::global::set_tracer_provider(tracer_provider.clone());
    opentelemetry::global::set_meter_provider(meter_provider.clone());
    let _ = INSTALLED.set(Installed {
        tracer_provider,
        meter_provider,
        registry,
    });
    Ok(tracer)
}

/// Exports what is buffered and stops the exporters, giving up after 2 s each (a
/// collector that accepts but never answers must not hold up a shutdown). Call once, at
/// the end of `main`.
pub fn shutdown() {
    if let Some(i) = INSTALLED.get() {
        let limit = std::time::Duration::from_secs(2);
        let traces = i.tracer_provider.clone();
        let meters = i.meter_provider.clone();
        // Both may block on the network; run them on a helper thread and stop waiting
        // after the limit.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = traces.shutdown_with_timeout(limit);
            let _ = meters.shutdown_with_timeout(limit);
            let _ = tx.send(());
        });
        if rx.recv_timeout(limit * 2).is_err() {
            tracing::warn!("telemetry export did not finish within 4 s; exiting without it");
        }
    }
}
