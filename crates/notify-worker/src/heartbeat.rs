//! The provider call of one delivery: rate-limit wait, call deadline, and the lease
//! heartbeat while it runs.

use crate::consume::Ctx;
use crate::{ChannelSender, Lease};
use notify_core::Channel;
use notify_core::outcome::{AttemptOutcome, ErrorClass};
use notify_store::deliveries::{self, DeliveryJob};
use tracing::{Instrument, info_span, warn};

impl<S: ChannelSender> Ctx<S> {
    /// Calls the provider for `job` under its deadline, extending `lease` every third of
    /// its length while the call runs.
    pub(crate) async fn send_with_heartbeat(
        &self,
        job: &DeliveryJob,
        lease: &Lease,
    ) -> AttemptOutcome {
        // The wait for the provider's rate limit counts as part of the call, under the
        // same lease heartbeat; the call's deadline starts after it.
        let client = info_span!(
            "provider call",
            otel.name = %format!("{} send", job.provider),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            notify.provider = %job.provider,
            notify.channel = %job.channel,
            notify.delivery_id = %job.id,
            notify.event_id = %job.event_id,
            notify.attempt = job.attempt,
            http.response.status_code = tracing::field::Empty,
            smtp.response.code = tracing::field::Empty,
            notify.error = tracing::field::Empty,
        );
        let send = async {
            self.limits.wait(job.provider.as_str()).await;
            let deadline = self.sender.call_deadline();
            let out = match tokio::time::timeout(deadline, self.sender.send(job, lease)).await {
                Ok(out) => out,
                Err(_) => AttemptOutcome::failed(
                    ErrorClass::Transient,
                    format!("{}_timeout", job.provider),
                    serde_json::json!({}),
                )
                .with_response(format!(
                    "no final answer within the call deadline of {} ms",
                    deadline.as_millis()
                ))
                .ambiguous(),
            };
            let span = tracing::Span::current();
            if let Some(status) = out.provider_status {
                let key = if job.channel == Channel::Email {
                    "smtp.response.code"
                } else {
                    "http.response.status_code"
                };
                span.record(key, status);
            }
            if let Some(error) = out.error() {
                span.record("notify.error", error.code.as_str());
                span.record("otel.status_code", "ERROR");
            }
            out
        }
        .instrument(client);
        tokio::pin!(send);
        let mut beat = tokio::time::interval(self.cfg.lease / 3);
        beat.tick().await;
        loop {
            tokio::select! {
                out = &mut send => return out,
                _ = beat.tick(), if !lease.is_lost() => {
                    let asked = tokio::time::Instant::now();
                    match deliveries::extend_lease(&self.pool, job.id, job.lease_token, self.cfg.lease).await {
                        Ok(true) => lease.extended(asked),
                        Ok(false) => {
                            lease.lost();
                            warn!("lease lost while the provider call runs");
                        }
                        Err(e) => warn!(error = %e, "could not extend the lease"),
                    }
                }
            }
        }
    }
}
