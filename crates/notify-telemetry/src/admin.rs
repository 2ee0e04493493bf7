//! The admin HTTP endpoint every long-running process serves on `NOTIFY_ADMIN_ADDR`
//! (the HTTP service serves the same routes on its own port):
//!
//! - `GET /healthz`: 200 `{"status":"alive"}` while the process runs (liveness);
//! - `GET /readyz`: 200 `{"status":"ready"}` when its dependencies answer and it is not
//!   draining, else 503 `{"status":"not_ready","problems":[...]}` (readiness);
//! - `GET /metrics`: Prometheus text exposition (format 0.0.4) of every instrument.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;

/// A dependency check: `Ok` when reachable, else what is wrong.
pub type Check =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Readiness of one process: named dependency checks plus a draining flag set on
/// shutdown.
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Vec<(&'static str, Check)>,
    draining: Arc<AtomicBool>,
}

impl Readiness {
    /// No checks yet; ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a check named `name` (e.g. `postgres`, `rabbitmq`).
    pub fn with_check<F, Fut>(mut self, name: &'static str, f: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        self.checks.push((name, Arc::new(move || Box::pin(f()))));
        self
    }

    /// Marks the process as draining: `/readyz` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether [`Readiness::start_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Every problem (empty when ready). Each check gets 2 s.
    pub async fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.is_draining() {
            problems.push("draining: shutting down".to_string());
        }
        for (name, check) in &self.checks {
            match tokio::time::timeout(std::time::Duration::from_secs(2), check()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("{name}: {e}")),
                Err(_) => problems.push(format!("{name}: no answer within 2 s")),
            }
        }
        problems
    }
}

async fn healthz() -> Response {
    json(StatusCode::OK, serde_json::json!({"status": "alive"}))
}

async fn readyz(State(r): State<Readiness>) -> Response {
    let problems = r.problems().await;
    if problems.is_empty() {
        json(StatusCode::OK, serde_json::json!({"status": "ready"}))
    } else {
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"status": "not_ready", "problems": problems}),
        )
    }
}

/// `GET /metrics`.
pub async fn metrics_handler() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render_prometheus(),
    )
        .into_response()
}

fn json(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The three routes, for merging into another router.
pub fn routes(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_handler))
        .with_state(readiness)
}

/// Serves [`routes`] on `listener` until `stop` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    readiness: Readiness,
    stop: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, routes(readiness))
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await
}

/// `NOTIFY_ADMIN_ADDR` resolved (`host:port`, a name such as `localhost` allowed):
/// `Ok(None)` when unset or empty.
fn addr_from_env() -> Result<Option<std::net::SocketAddr>, String> {
    use std::net::ToSocketAddrs;
    let Ok(raw) = std::env::var("NOTIFY_ADMIN_ADDR") else {
        return Ok(None);
    };
    if raw.trim().is_empty() {
        return Ok(None);
    }
    match raw.trim().to_socket_addrs() {
        Ok(mut addrs) => addrs.next().map(Some).ok_or_else(|| {
            format!("NOTIFY_ADMIN_ADDR={raw:?} is invalid: it resolves to no address")
        }),
        Err(e) => Err(format!(
            "NOTIFY_ADMIN_ADDR={raw:?} is invalid: {e} (expected host:port)"
        )),
    }
}

/// Checks `NOTIFY_ADMIN_ADDR` with the other settings (reported by `env.finish()`).
pub fn check_env(env: &mut crate::Env) {
    if let Err(e) = addr_from_env() {
        env.error(e);
    }
}

/// Binds `NOTIFY_ADMIN_ADDR` (when set) and serves the admin routes in the background
/// until `stop`. Exits with code 64 when the address is invalid or cannot be bound.
pub async fn spawn_from_env(service: &str, readiness: Readiness, stop: CancellationToken) {
    let addr = match addr_from_env() {
        Ok(Some(a)) => a,
        Ok(None) => return,
        Err(e) => crate::exit_bad_config(service, &e),
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => crate::exit_bad_config(
            service,
            &format!("NOTIFY_ADMIN_ADDR={addr}: cannot listen: {e}"),
        ),
    };
    tracing::info!(%addr, "admin endpoint (/healthz, /readyz, /metrics) listening");
    tokio::spawn(async move {
        if let Err(e) = serve(listener, readiness, stop).await {
            tracing::error!(error = %e, "admin endpoint stopped");
        }
    });
}
