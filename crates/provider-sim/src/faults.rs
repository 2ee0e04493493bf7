//! The control plane: recorded requests (`/_sim/requests`), injected faults
//! (`/_sim/faults`), random latency (`/_sim/latency`), and how a provider handler
//! records a request and takes a fault.

use super::{Sim, answer};
use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

/// A recorded request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recorded {
    /// `line`, `fcm`, `oauth`, `apns` or `webpush`.
    pub provider: String,
    /// Request path.
    pub path: String,
    /// Request headers (lowercase names; repeated headers joined with ", ").
    pub headers: HashMap<String, String>,
    /// JSON body, or the body text as a JSON string when it is not JSON.
    pub body: Value,
    /// Status the simulator answered.
    pub status: u16,
    /// RFC 3339 time of arrival.
    pub received_at: String,
}

/// A fault to inject: the next matching requests get this answer instead of the normal
/// one (after auth checks).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    /// `line`, `fcm`, `apns` or `webpush`.
    pub provider: String,
    /// Only requests whose target (LINE `to`, FCM `message.token`, APNs device token, Web
    /// Push endpoint URL) contains this.
    #[serde(default)]
    pub target_contains: Option<String>,
    /// HTTP status to answer.
    pub status: u16,
    /// Body to answer.
    #[serde(default)]
    pub body: Value,
    /// `Retry-After` seconds to send.
    #[serde(default)]
    pub retry_after: Option<u64>,
    /// Delay before answering, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// How many requests it applies to; `None` = until cleared.
    #[serde(default)]
    pub times: Option<u32>,
    /// Chance in `[0, 1]` that a matching request gets the fault; `None` = always.
    #[serde(default)]
    pub probability: Option<f64>,
}

/// Body of `POST /_sim/latency`: every answer of `provider` waits a random time in
/// `[min_ms, max_ms]`.
#[derive(Debug, Deserialize)]
pub(crate) struct LatencyRequest {
    provider: String,
    min_ms: u64,
    max_ms: u64,
}

impl Sim {
    /// Records a request of `provider` and the status it got.
    pub(crate) fn record(
        &self,
        provider: &str,
        path: &str,
        headers: &HeaderMap,
        body: &Value,
        status: u16,
    ) {
        let headers = headers
            .iter()
            .fold(HashMap::<String, String>::new(), |mut m, (k, v)| {
                let v = String::from_utf8_lossy(v.as_bytes()).to_string();
                m.entry(k.as_str().to_string())
                    .and_modify(|e| {
                        e.push_str(", ");
                        e.push_str(&v)
                    })
                    .or_insert(v);
                m
            });
        self.inner
            .lock()
            .expect("sim lock")
            .requests
            .push(Recorded {
                provider: provider.into(),
                path: path.into(),
                headers,
                body: body.clone(),
                status,
                received_at: chrono::Utc::now().to_rfc3339(),
            });
    }

    /// The first fault for `provider` matching `target`, counted as used.
    pub(crate) fn take_fault(&self, provider: &str, target: &str) -> Option<Fault> {
        let mut inner = self.inner.lock().expect("sim lock");
        let idx = inner.faults.iter().position(|f| {
            f.provider == provider
                && f.times != Some(0)
                && f.target_contains
                    .as_deref()
                    .is_none_or(|t| target.contains(t))
                && f.probability.is_none_or(|p| rand::random::<f64>() < p)
        })?;
        let f = &mut inner.faults[idx];
        if let Some(n) = f.times.as_mut() {
            *n -= 1;
        }
        Some(f.clone())
    }

    /// Sleeps for the provider's configured random latency, if any.
    pub(crate) async fn latency(&self, provider: &str) {
        let range = self
            .inner
            .lock()
            .expect("sim lock")
            .latency
            .get(provider)
            .copied();
        if let Some((min, max)) = range {
            let ms = if max > min {
                min + rand::random::<u64>() % (max - min + 1)
            } else {
                min
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct ProviderFilter {
    provider: Option<String>,
}

/// `GET /_sim/requests?provider=`: the recorded requests, oldest first.
pub(crate) async fn list_requests(
    State(sim): State<Sim>,
    Query(q): Query<ProviderFilter>,
) -> Json<Vec<Recorded>> {
    let inner = sim.inner.lock().expect("sim lock");
    Json(
        inner
            .requests
            .iter()
            .filter(|r| q.provider.as_deref().is_none_or(|p| r.provider == p))
            .cloned()
            .collect(),
    )
}

/// `DELETE /_sim/requests`: forgets the recorded requests and the accepted LINE retry keys.
pub(crate) async fn clear_requests(State(sim): State<Sim>) -> StatusCode {
    let mut inner = sim.inner.lock().expect("sim lock");
    inner.requests.clear();
    inner.line_accepted.clear();
    StatusCode::NO_CONTENT
}

/// `POST /_sim/faults`: adds a [`Fault`].
pub(crate) async fn add_fault(State(sim): State<Sim>, Json(f): Json<Fault>) -> StatusCode {
    sim.inner.lock().expect("sim lock").faults.push(f);
    StatusCode::CREATED
}

/// `POST /_sim/latency`: random latency for one provider (400 when `max_ms < min_ms`).
pub(crate) async fn set_latency(
    State(sim): State<Sim>,
    Json(l): Json<LatencyRequest>,
) -> StatusCode {
    if l.max_ms < l.min_ms {
        return StatusCode::BAD_REQUEST;
    }
    sim.inner
        .lock()
        .expect("sim lock")
        .latency
        .insert(l.provider, (l.min_ms, l.max_ms));
    StatusCode::CREATED
}

/// `DELETE /_sim/latency`: no more added latency.
pub(crate) async fn clear_latency(State(sim): State<Sim>) -> StatusCode {
    sim.inner.lock().expect("sim lock").latency.clear();
    StatusCode::NO_CONTENT
}

/// `DELETE /_sim/faults`: removes every fault.
pub(crate) async fn clear_faults(State(sim): State<Sim>) -> StatusCode {
    sim.inner.lock().expect("sim lock").faults.clear();
    StatusCode::NO_CONTENT
}

/// Answers with fault `f` (after its delay), adding `extra` headers and its `Retry-After`.
pub(crate) async fn apply_fault(f: Fault, extra: Vec<(&'static str, String)>) -> Response {
    if f.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.delay_ms)).await;
    }
    let mut extra = extra;
    if let Some(s) = f.retry_after {
        extra.push(("retry-after", s.to_string()));
    }
    answer(f.status, f.body, &extra)
}
