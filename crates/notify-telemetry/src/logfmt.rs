//! JSON-lines log format: one object per event with `timestamp` (RFC 3339, UTC), `level`,
//! `target`, `message`, the event's fields, the fields of every enclosing span (inner
//! spans win; a `notify.` prefix is dropped, so `notify.delivery_id` logs as
//! `delivery_id`; `otel.*` fields are left out) and `trace_id` / `span_id` of the current
//! span. Never pass secrets or message bodies as fields: nothing here redacts them.

use serde_json::{Map, Value};
use std::fmt;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The formatter; use with `fmt_fields(JsonFields::new())` so span fields are stored as
/// JSON.
pub struct JsonLines;

struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(
            field.name().to_string(),
            Value::String(format!("{value:?}")),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
}

fn key_of(name: &str) -> Option<&str> {
    if name.starts_with("otel.") {
        return None;
    }
    Some(name.strip_prefix("notify.").unwrap_or(name))
}

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut obj = Map::new();
        obj.insert(
            "timestamp".into(),
            chrono::Utc::now()
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
                .into(),
        );
        obj.insert("level".into(), meta.level().as_str().into());
        obj.insert("target".into(), meta.target().into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let Some(stored) = ext.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(&stored.fields) {
                    for (k, v) in fields {
                        if let Some(key) = key_of(&k) {
                            obj.insert(key.to_string(), v);
                        }
                    }
                }
            }
        }
        let mut own = Map::new();
        event.record(&mut Fields(&mut own));
        for (k, v) in own {
            if let Some(key) = key_of(&k) {
                obj.insert(key.to_string(), v);
            }
        }
        if let Some((trace_id, span_id)) = crate::propagation::ids_of(&tracing::Span::current()) {
            obj.insert("trace_id".into(), trace_id.into());
            obj.insert("span_id".into(), span_id.into());
        }
        writeln!(writer, "{}", Value::Object(obj))
    }
}
