//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>) in and out of text carriers:
//! gRPC metadata / HTTP headers, AMQP message headers, and the `traceparent` stored with
//! an event so that every later publish of its deliveries continues the caller's trace.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
use std::collections::HashMap;
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct HeaderExtract<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct MapInject<'a>(&'a mut HashMap<String, String>);

impl Injector for MapInject<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_string(), value);
    }
}

struct MapExtract<'a>(&'a HashMap<String, String>);

impl Extractor for MapExtract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|s| s.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The trace context carried by HTTP headers or gRPC metadata (`traceparent`,
/// `tracestate`); an empty context when there is none or it is malformed.
pub fn context_from_headers(headers: &http::HeaderMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtract(headers)))
}

/// The carrier headers (`traceparent` and, when set, `tracestate`) for `span`; empty when
/// the span has no valid trace context (tracing not installed).
pub fn headers_of(span: &tracing::Span) -> HashMap<String, String> {
    let cx = span.context();
    let mut map = HashMap::new();
    if cx.span().span_context().is_valid() {
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut MapInject(&mut map))
        });
    }
    map
}

/// The `traceparent` value of `span`, e.g.
/// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`; `None` without a valid
/// trace context.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    headers_of(span).remove("traceparent")
}

/// The context named by a stored or received `traceparent` (and optional `tracestate`).
pub fn context_from_traceparent(traceparent: &str, tracestate: Option<&str>) -> Context {
    let mut map = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    if let Some(s) = tracestate {
        map.insert("tracestate".into(), s.to_string());
    }
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&MapExtract(&map)))
}

/// Sets `span`'s parent to `cx` when `cx` carries a valid remote span context.
pub fn set_parent(span: &tracing::Span, cx: Context) {
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Sets `span`'s parent to the context named by `traceparent` (and `tracestate`), when
/// there is one and it is valid: a stored event's trace, or a message's headers.
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    if let Some(tp) = traceparent {
        set_parent(span, context_from_traceparent(tp, tracestate));
    }
}

/// `(trace_id, span_id)` in lowercase hex of `span`, if it has a valid context.
pub fn ids_of(span: &tracing::Span) -> Option<(String, String)> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips_through_headers() {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let cx = context_from_traceparent(tp, None);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let mut h = http::HeaderMap::new();
        h.insert("traceparent", tp.parse().unwrap());
        let cx = context_from_headers(&h);
        assert_eq!(
            cx.span().span_context().span_id().to_string(),
            "00f067aa0ba902b7"
        );
        // Garbage gives an empty context, not an error.
        let cx = context_from_traceparent("00-zz-01", None);
        assert!(!cx.span().span_context().is_valid());
    }
}
