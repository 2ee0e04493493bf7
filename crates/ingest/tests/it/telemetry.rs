//! Observability end to end, with `ingest` and `worker-line` as real processes exporting
//! OTLP to an in-process collector: one notification is one trace from the caller to the
//! provider (retries included), `/metrics` counts exactly what was sent, logs are JSON
//! lines carrying trace and delivery ids but no message text or secrets, and SIGTERM makes
//! ingest report NOT_SERVING while it still accepts requests.

use crate::support;

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span::SpanKind};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{Options, Platform, eventually, free_addr, line_id, uniq};

/// What the collector received: spans with their resource's `service.name`, and the
/// names of metrics.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
    metrics: Arc<Mutex<Vec<String>>>,
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| text(&kv.value))
}

fn service_of(resource: &Option<Resource>) -> String {
    resource
        .as_ref()
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
        .map(|kv| text(&kv.value))
        .unwrap_or_default()
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in req.into_inner().resource_spans {
            let service = service_of(&rs.resource);
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let mut names = self.metrics.lock().unwrap();
        for rm in req.into_inner().resource_metrics {
            for sm in rm.scope_metrics {
                names.extend(sm.metrics.into_iter().map(|m| m.name));
            }
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

impl Collector {
    /// Serves OTLP/gRPC on a free port; returns the collector and its URL.
    async fn start() -> (Collector, String) {
        let c = Collector::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(c.clone()))
            .add_service(MetricsServiceServer::new(c.clone()));
        tokio::spawn(async move {
            server
                .serve_with_incoming(tokio_stream_from(listener))
                .await
                .unwrap()
        });
        (c, url)
    }

    fn trace(&self, trace_id: &[u8]) -> Vec<(String, Span)> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| s.trace_id == trace_id)
            .cloned()
            .collect()
    }
}

fn tokio_stream_from(listener: tokio::net::TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener)
}

/// A platform whose ingest (and workers) the test starts as processes.
fn ingest_as_a_process() -> Options {
    Options {
        workers: vec![],
        ingest_in_process: false,
        ..Default::default()
    }
}

/// OTLP settings for a platform process exporting to `url` quickly.
fn otel_env(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", url.to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "500".into()),
    ]
}

async fn health_status(p: &Platform) -> Option<i32> {
    let mut health = tonic_health::pb::health_client::HealthClient::new(p.grpc.clone());
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "notify.v1.IngestService".into(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().status)
}

const SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
const NOT_SERVING: i32 = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;

/// Waits until ingest's health service answers SERVING.
async fn wait_serving(p: &Platform) {
    eventually(
        "ingest SERVING",
        Duration::from_secs(30),
        async || match health_status(p).await {
            Some(SERVING) => Ok(()),
            other => Err(other),
        },
    )
    .await;
}

/// Polls `url` (a `/readyz`) until it answers 200; panics with the last answer after 10 s.
async fn wait_ready(url: &str) {
    eventually(
        &format!("{url} ready"),
        Duration::from_secs(20),
        async || match reqwest::get(url).await {
            Ok(r) if r.status() == 200 => Ok(()),
            Ok(r) => Err(format!(
                "{} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            )),
            Err(e) => Err(e.to_string()),
        },
    )
    .await;
}

/// GET `url`: status and body.
async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.expect(url);
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The sum of the samples of `name` whose labels include every `k="v"` pair of `labels`
/// (comma-separated, any order; empty = all) in a Prometheus text exposition; 0 if none.
fn sample(exposition: &str, name: &str, labels: &str) -> f64 {
    let wanted: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, have) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let have: Vec<&str> = have.split(',').collect();
            (metric == name && wanted.iter().all(|w| have.contains(w)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_notification_is_one_trace_from_the_caller_to_the_provider_retry_included() {
    let (collector, otlp_url) = Collector::start().await;
    let p = Platform::start_with(ingest_as_a_process()).await;
    let env = otel_env(&otlp_url);
    let _ingest = p.spawn("ingest", &["serve"], &env);
    let _worker = p.spawn("worker-line", &[], &env);
    wait_serving(&p).await;
    p.add_type("order_paid", &["line"]).await;
    let (user, lid) = (uniq("u"), line_id());
    p.add_recipient(&user, "สมชาย", "", &lid).await;
    // The first LINE call fails with 500, so the delivery is retried once.
    p.sim_fault(
        json!({"provider": "line", "target_contains": lid, "status": 500,
        "body": {"message": "internal"}, "times": 1}),
    )
    .await;

    // The calling service's own span, and its traceparent on the request.
    let trace_id: [u8; 16] = *uuid::Uuid::new_v4().as_bytes();
    let caller_id: [u8; 8] = uuid::Uuid::new_v4().as_bytes()[..8].try_into().unwrap();
    let traceparent = format!("00-{}-{}-01", hex::encode(trace_id), hex::encode(caller_id));
    let started = std::time::SystemTime::now();
    let mut req = tonic::Request::new(p.event(&uniq("order"), "order_paid", &[&user]));
    req.metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    let ev = p.create_event(req).await;
    let nanos = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    };
    let caller = Span {
        trace_id: trace_id.to_vec(),
        span_id: caller_id.to_vec(),
        name: "checkout: order paid".into(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: nanos(started),
        end_time_unix_nano: nanos(std::time::SystemTime::now()),
        ..Default::default()
    };
    TraceServiceClient::connect(otlp_url.clone())
        .await
        .unwrap()
        .export(ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue("shop-checkout".into())),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![caller],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
        .await
        .unwrap();

    let done = p.wait_final(&ev.event_id, 30).await;
    let d = &done.deliveries[0];
    assert_eq!((d.status.as_str(), d.attempts), ("sent", 2), "{d:?}");

    // Wait for every span to arrive (each process exports on its own schedule), then
    // half a second more so that any extra span would show.
    let kind = |s: &Span, k: SpanKind| s.kind == k as i32;
    let span_names = || {
        collector
            .trace(&trace_id)
            .iter()
            .map(|(svc, s)| format!("{svc}: {}", s.name))
            .collect::<Vec<_>>()
    };
    eventually(
        "8 spans in the trace",
        Duration::from_secs(30),
        async || {
            let names = span_names();
            if names.len() >= 8 { Ok(()) } else { Err(names) }
        },
    )
    .await;
    support::settle(
        "no span beyond the 8 expected arrives",
        Duration::from_millis(500),
        async || {
            let names = span_names();
            if names.len() <= 8 { Ok(()) } else { Err(names) }
        },
    )
    .await;
    let spans = collector.trace(&trace_id);
    let summary: Vec<String> = spans
        .iter()
        .map(|(svc, s)| format!("{svc}: {} kind={}", s.name, s.kind))
        .collect();
    let find = |svc: &str, k: SpanKind| -> Vec<Span> {
        spans
            .iter()
            .filter(|(service, s)| service == svc && kind(s, k))
            .map(|(_, s)| s.clone())
            .collect()
    };

    // 1. The caller's span is the root.
    let callers = find("shop-checkout", SpanKind::Client);
    assert_eq!(callers.len(), 1, "{summary:#?}");
    assert!(callers[0].parent_span_id.is_empty());

    // 2. The ingest server span continues it (RPC semantic conventions).
    let servers = find("ingest", SpanKind::Server);
    assert_eq!(servers.len(), 1, "{summary:#?}");
    let server = &servers[0];
    assert_eq!(server.name, "notify.v1.IngestService/CreateEvent");
    assert_eq!(server.parent_span_id, caller_id.to_vec());
    assert_eq!(attr(server, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attr(server, "rpc.service").as_deref(),
        Some("notify.v1.IngestService")
    );
    assert_eq!(attr(server, "rpc.method").as_deref(), Some("CreateEvent"));

    // 3. One relay producer span per publish (first send and retry), children of the
    //    server span, though the retry was published from the outbox seconds later.
    let queue = format!("{}deliveries.line", p.amqp_prefix);
    let producers = find("ingest", SpanKind::Producer);
    assert_eq!(producers.len(), 2, "{summary:#?}");
    for s in &producers {
        assert_eq!(s.name, format!("{queue} publish"));
        assert_eq!(s.parent_span_id, server.span_id);
        assert_eq!(attr(s, "messaging.system").as_deref(), Some("rabbitmq"));
        assert_eq!(
            attr(s, "messaging.operation.type").as_deref(),
            Some("publish")
        );
        assert_eq!(
            attr(s, "messaging.destination.name").as_deref(),
            Some(queue.as_str())
        );
        assert_eq!(
            attr(s, "notify.delivery_id").as_deref(),
            Some(d.delivery_id.as_str())
        );
        assert_eq!(
            attr(s, "notify.event_id").as_deref(),
            Some(ev.event_id.as_str())
        );
    }

    // 4. One worker consumer span per attempt, each a child of one producer span.
    let mut consumers = find("worker-line", SpanKind::Consumer);
    consumers.sort_by_key(|s| attr(s, "notify.attempt"));
    assert_eq!(consumers.len(), 2, "{summary:#?}");
    for (i, s) in consumers.iter().enumerate() {
        assert_eq!(s.name, format!("{queue} process"));
        assert!(producers.iter().any(|p| p.span_id == s.parent_span_id));
        assert_eq!(attr(s, "messaging.system").as_deref(), Some("rabbitmq"));
        assert_eq!(
            attr(s, "messaging.operation.type").as_deref(),
            Some("process")
        );
        assert_eq!(
            attr(s, "messaging.destination.name").as_deref(),
            Some(queue.as_str())
        );
        assert_eq!(attr(s, "notify.attempt"), Some((i + 1).to_string()));
        assert_eq!(
            attr(s, "notify.delivery_id").as_deref(),
            Some(d.delivery_id.as_str())
        );
        assert_eq!(
            attr(s, "notify.event_id").as_deref(),
            Some(ev.event_id.as_str())
        );
        assert_eq!(attr(s, "notify.channel").as_deref(), Some("line"));
    }
    assert_ne!(consumers[0].parent_span_id, consumers[1].parent_span_id);

    // 5. One provider client span per call, under its consumer span: the first with
    //    LINE's 500 and our normalised error, the second accepted.
    let clients = find("worker-line", SpanKind::Client);
    assert_eq!(clients.len(), 2, "{summary:#?}");
    for (consumer, status, error) in [
        (&consumers[0], "500", Some("line_500")),
        (&consumers[1], "200", None),
    ] {
        let c = clients
            .iter()
            .find(|c| c.parent_span_id == consumer.span_id)
            .expect("a client span under each consumer span");
        assert_eq!(c.name, "line send");
        assert_eq!(attr(c, "notify.provider").as_deref(), Some("line"));
        assert_eq!(
            attr(c, "http.response.status_code").as_deref(),
            Some(status)
        );
        assert_eq!(attr(c, "notify.error").as_deref(), error);
        assert_eq!(attr(c, "notify.attempt"), attr(consumer, "notify.attempt"));
        assert_eq!(
            attr(c, "notify.delivery_id").as_deref(),
            Some(d.delivery_id.as_str())
        );
    }
    // 1 caller + 1 server + 2 producers + 2 consumers + 2 clients: nothing else in it.
    assert_eq!(spans.len(), 8, "{summary:#?}");

    // Metrics went out over OTLP too.
    eventually(
        "notify_deliveries_sent over OTLP",
        Duration::from_secs(20),
        async || {
            let metrics = collector.metrics.lock().unwrap().clone();
            if metrics.iter().any(|m| m == "notify_deliveries_sent") {
                Ok(())
            } else {
                Err(metrics)
            }
        },
    )
    .await;
    assert!(
        collector
            .metrics
            .lock()
            .unwrap()
            .iter()
            .any(|m| m == "notify_deliveries_sent"),
        "no notify_deliveries_sent over OTLP"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exactly_the_deliveries_sent_and_logs_carry_ids_but_no_content() {
    let p = Platform::start_with(ingest_as_a_process()).await;
    let (ingest_admin, worker_admin) = (free_addr(), free_addr());
    let ingest = p.spawn(
        "ingest",
        &["serve"],
        &[
            ("NOTIFY_ADMIN_ADDR", ingest_admin.to_string()),
            ("NOTIFY_METRICS_INTERVAL", "1s".into()),
        ],
    );
    let worker = p.spawn(
        "worker-line",
        &[],
        &[("NOTIFY_ADMIN_ADDR", worker_admin.to_string())],
    );
    wait_serving(&p).await;
    let worker_url = format!("http://{worker_admin}");
    let ingest_url = format!("http://{ingest_admin}");
    wait_ready(&format!("{worker_url}/readyz")).await;
    wait_ready(&format!("{ingest_url}/readyz")).await;
    assert_eq!(get(&format!("{worker_url}/healthz")).await.0, 200);
    assert_eq!(
        get(&format!("{worker_url}/readyz")).await,
        (200, r#"{"status":"ready"}"#.to_string())
    );

    p.add_type("order_paid", &["line"]).await;
    let users: Vec<(String, String)> = (0..5).map(|_| (uniq("u"), line_id())).collect();
    for (u, l) in &users {
        p.add_recipient(u, "", "", l).await;
    }
    // A sixth recipient whose LINE account rejects the message for good.
    let (bad, bad_line) = p.add_line_recipient("u").await;
    p.sim_fault(
        json!({"provider": "line", "target_contains": bad_line, "status": 400,
        "body": {"message": "The request body has 1 error(s)"}}),
    )
    .await;

    let line = r#"channel="line",provider="line""#;
    let before = get(&format!("{worker_url}/metrics")).await.1;
    let sent_before = sample(&before, "notify_deliveries_sent_total", line);
    let failed_before = sample(&before, "notify_deliveries_failed_total", line);

    let secret_body = format!("รหัสลับ {}", uniq("body"));
    let mut ids = Vec::new();
    for (i, (u, _)) in users.iter().enumerate() {
        let mut req = p.event(&uniq(&format!("m{i}")), "order_paid", &[u]);
        if i == 0 {
            req.recipients.push(bad.clone());
        }
        req.content.as_mut().unwrap().body = secret_body.clone();
        ids.push(p.create_event(req).await.event_id);
    }
    for id in &ids {
        p.wait_final(id, 30).await;
    }
    let after = get(&format!("{worker_url}/metrics")).await.1;
    assert_eq!(
        sample(&after, "notify_deliveries_sent_total", line) - sent_before,
        5.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, "notify_deliveries_failed_total", line) - failed_before,
        1.0,
        "{after}"
    );
    assert!(
        after.contains(
            r#"notify_deliveries_failed_total{channel="line",provider="line",reason="line_4xx"}"#
        ),
        "{after}"
    );
    assert_eq!(
        sample(&after, "notify_attempt_duration_seconds_count", line),
        6.0,
        "{after}"
    );
    assert_eq!(
        sample(&after, "notify_event_to_provider_seconds_count", line),
        5.0
    );

    // Ingest samples the queue gauges (every 1 s here): nothing is left pending.
    let expected = [
        "notify_deliveries_pending{channel=\"line\"} 0",
        "notify_oldest_pending_age_seconds{channel=\"line\"} 0",
        "notify_channel_paused{channel=\"line\"} 0",
        "notify_outbox_messages 0",
        "notify_dead_letter_messages 0",
    ];
    let gauges = eventually(
        "the queue gauges sampled at 0",
        Duration::from_secs(20),
        async || {
            let gauges = get(&format!("{ingest_url}/metrics")).await.1;
            let missing: Vec<&str> = expected
                .iter()
                .copied()
                .filter(|name| !gauges.contains(name))
                .collect();
            if missing.is_empty() {
                Ok(gauges)
            } else {
                Err(format!("{missing:?} missing in:\n{gauges}"))
            }
        },
    )
    .await;
    for name in expected {
        assert!(gauges.contains(name), "{name} missing in:\n{gauges}");
    }

    // Logs: JSON lines with trace and delivery ids; no message text, no token.
    let log = worker.log();
    let sent_lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["message"] == "sent")
        .collect();
    assert_eq!(sent_lines.len(), 5, "{log}");
    for l in &sent_lines {
        for key in [
            "trace_id",
            "span_id",
            "delivery_id",
            "event_id",
            "channel",
            "timestamp",
            "level",
        ] {
            assert!(l[key].is_string(), "{key} missing in {l}");
        }
        assert_eq!(l["trace_id"].as_str().unwrap().len(), 32);
    }
    for (name, text) in [("worker", log), ("ingest", ingest.log())] {
        assert!(!text.is_empty());
        assert!(!text.contains(&secret_body), "{name} logged a message body");
        assert!(!text.contains("รหัสลับ"), "{name} logged message text");
        assert!(
            !text.contains(support::LINE_TOKEN),
            "{name} logged the LINE token"
        );
        assert!(!text.contains(&p.db_url), "{name} logged the database URL");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_ingest_reports_not_serving_before_it_stops_accepting() {
    let p = Platform::start_with(ingest_as_a_process()).await;
    let admin = free_addr();
    let mut ingest = p.spawn(
        "ingest",
        &["serve"],
        &[
            ("NOTIFY_DRAIN_SECONDS", "3".into()),
            ("NOTIFY_ADMIN_ADDR", admin.to_string()),
        ],
    );
    wait_serving(&p).await;
    p.add_type("order_paid", &["inapp"]).await;
    let u = p.add_bare_recipient("u").await;
    // Ready once the relay holds its broker connection.
    wait_ready(&format!("http://{admin}/readyz")).await;

    ingest.terminate();
    let signalled = tokio::time::Instant::now();
    // NOT_SERVING comes first ...
    eventually(
        "NOT_SERVING within 2 s of SIGTERM",
        Duration::from_secs(2),
        async || match health_status(&p).await {
            Some(s) if s == NOT_SERVING => Ok(()),
            Some(s) if s == SERVING => Err("still SERVING"),
            other => panic!("ingest stopped answering before reporting NOT_SERVING: {other:?}"),
        },
    )
    .await;
    // ... for every served service, not only the one polled above.
    let mut health = tonic_health::pb::health_client::HealthClient::new(p.grpc.clone());
    for service in [
        "",
        "notify.v1.IngestService",
        "notify.v1.RecipientService",
        "notify.v1.TypeService",
        "notify.v1.TopicService",
    ] {
        let status = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("{service:?}: {e:?}"))
            .into_inner()
            .status;
        assert_eq!(status, NOT_SERVING, "{service:?} during the drain");
    }
    let (status, body) = get(&format!("http://{admin}/readyz")).await;
    assert_eq!(status, 503);
    assert!(body.contains("draining"), "{body}");
    // ... while requests are still accepted and written.
    let ev = p.send(&uniq("during-drain"), "order_paid", &[&u]).await;
    assert!(!ev.event_id.is_empty());
    let stored: i64 = p
        .scalar(
            "SELECT count(*) FROM notification_events WHERE id = $1::uuid",
            &ev.event_id,
        )
        .await;
    assert_eq!(stored, 1);
    assert!(signalled.elapsed() < Duration::from_secs(3));

    // Then it stops accepting and exits cleanly.
    let exit = tokio::time::timeout(Duration::from_secs(15), ingest.child.wait())
        .await
        .expect("ingest exits after the drain")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    assert!(
        signalled.elapsed() >= Duration::from_secs(3),
        "stopped before the drain ended"
    );
    let after = tokio::time::timeout(Duration::from_secs(2), health_status(&p)).await;
    assert!(
        matches!(after, Ok(None) | Err(_)),
        "still answering after exit: {after:?}"
    );
}

/// `notify_escalations_total` in the worker of the escalated channel (worker-line as a
/// process): `sent` once for an in-app notification left unread and escalated to LINE,
/// `skipped_read` once for one read before its escalation was due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_escalation_metric_counts_each_escalation_sent_or_skipped_once() {
    let p = Platform::start_with(
        Options::workers(&[notify_core::Channel::InApp]).ingest_in_process(false),
    )
    .await;
    let (ingest_admin, worker_admin) = (free_addr(), free_addr());
    let _ingest = p.spawn(
        "ingest",
        &["serve"],
        &[("NOTIFY_ADMIN_ADDR", ingest_admin.to_string())],
    );
    let _worker = p.spawn(
        "worker-line",
        &[],
        &[("NOTIFY_ADMIN_ADDR", worker_admin.to_string())],
    );
    wait_serving(&p).await;
    let worker_url = format!("http://{worker_admin}");
    wait_ready(&format!("{worker_url}/readyz")).await;
    p.add_derived_type("invoice_due", &["inapp"], &[], Some(("inapp", "line", 10)))
        .await;
    let (unread, reader) = (uniq("u"), uniq("u"));
    p.add_recipient(&unread, "", "", &line_id()).await;
    p.add_recipient(&reader, "", "", &line_id()).await;
    let left = p.send(&uniq("invoice"), "invoice_due", &[&unread]).await;
    let read = p.send(&uniq("invoice"), "invoice_due", &[&reader]).await;
    // Read within 6 s (or the test stops there), before the escalation's 10 s.
    support::InboxClient::of(&p, &reader)
        .read_newest(Duration::from_secs(6))
        .await;
    let left = p.wait_final(&left.event_id, 30).await;
    let read = p.wait_final(&read.event_id, 30).await;
    let on_line = |e: &notify_proto::v1::GetEventResponse| {
        e.deliveries
            .iter()
            .find(|d| d.channel == "line")
            .map(|d| d.status.clone())
    };
    assert_eq!(on_line(&left).as_deref(), Some("sent"), "{left:#?}");
    assert_eq!(on_line(&read).as_deref(), Some("skipped"), "{read:#?}");
    let after = get(&format!("{worker_url}/metrics")).await.1;
    assert_eq!(
        sample(&after, "notify_escalations_total", r#"outcome="sent""#),
        1.0,
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            "notify_escalations_total",
            r#"outcome="skipped_read""#
        ),
        1.0,
        "{after}"
    );
}
