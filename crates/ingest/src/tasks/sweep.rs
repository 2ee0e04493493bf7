//! The sweeper: expired leases back to `pending` (or `failed` after the last attempt
//! allowed), and republishing pending deliveries whose message was lost.

use crate::IngestConfig;
use notify_core::FailReason;
use notify_store::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The sweeper: returns deliveries with an expired lease to `pending`, and republishes
/// pending deliveries whose message was lost. Every statement uses SKIP LOCKED, so any
/// number of ingest replicas may sweep at once.
pub(crate) async fn sweep(pool: PgPool, cfg: IngestConfig, shutdown: CancellationToken) {
    // Whether the lost-message sweep was last found paused (the relay behind), to log the
    // change only.
    let mut paused = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(cfg.sweep_interval) => {}
        }
        match notify_store::deliveries::requeue_expired_leases(&pool, cfg.sweep_batch).await {
            Ok(expired) if expired.is_empty() => {}
            Ok(expired) => {
                let m = notify_telemetry::metrics();
                m.lease_recoveries.add(expired.len() as u64, &[]);
                for f in expired.iter().flat_map(|l| &l.fallback) {
                    notify_telemetry::metrics::count_fallback(
                        f.from.as_str(),
                        f.to.as_str(),
                        FailReason::WorkerLost.as_str(),
                    );
                }
                for lost in &expired {
                    // A call whose worker died: whether the provider got it is unknown.
                    m.deliveries_ambiguous.add(
                        1,
                        &notify_telemetry::metrics::channel_provider(
                            lost.channel.as_str(),
                            lost.provider.as_str(),
                        ),
                    );
                }
                for lost in expired.iter().filter(|l| l.failed) {
                    // The worker died or froze during the last attempt allowed: the
                    // attempt cap holds here as on the worker's own path.
                    tracing::error_span!("lease", delivery_id = %lost.id).in_scope(|| {
                        notify_telemetry::metrics::delivery_failed(
                            lost.channel,
                            lost.provider,
                            lost.attempt,
                            FailReason::WorkerLost,
                            "its worker died or froze during the last attempt allowed",
                        )
                    });
                }
                warn!(
                    recovered = expired.iter().filter(|l| !l.failed).count(),
                    failed = expired.iter().filter(|l| l.failed).count(),
                    "expired leases recovered"
                )
            }
            Err(e) => warn!(error = %e, "lease sweep failed"),
        }
        match notify_store::deliveries::relay_behind(&pool, cfg.republish_after, cfg.sweep_batch)
            .await
        {
            Ok(behind) if behind != paused => {
                paused = behind;
                if behind {
                    warn!(
                        backlog_over = cfg.sweep_batch,
                        due_for_s = cfg.republish_after.as_secs(),
                        "relay behind: the lost-message sweep waits until it catches up"
                    );
                } else {
                    info!("relay caught up: the lost-message sweep runs again");
                }
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "relay backlog probe failed"),
        }
        match notify_store::deliveries::republish_stale(&pool, cfg.republish_after, cfg.sweep_batch)
            .await
        {
            Ok(0) => {}
            Ok(n) => warn!(
                republished = n,
                "pending deliveries without a message were republished"
            ),
            Err(e) => warn!(error = %e, "republish sweep failed"),
        }
    }
}
