//! The retention purge: deletes what is older than its retention length, in batches.

use crate::RetentionConfig;
use notify_store::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The retention purge: a pass every `cfg.interval` (after the last one ended), at the
/// instant of `cfg.clock`. Any number of ingest replicas may run it: one pass runs at a
/// time, the others skip their turn ([`notify_store::retention::purge`]).
pub(crate) async fn purge(pool: PgPool, cfg: RetentionConfig, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(cfg.interval) => {}
        }
        let now = match pool.acquire().await {
            Ok(mut conn) => cfg.clock.now(&mut conn).await,
            Err(e) => Err(e.into()),
        };
        let now = match now {
            Ok(now) => now,
            Err(e) => {
                warn!(error = %e, "retention purge could not read the clock");
                continue;
            }
        };
        let started = std::time::Instant::now();
        match notify_store::retention::purge(&pool, &cfg.lengths, cfg.limits, now, &shutdown).await
        {
            Ok(None) => {}
            Ok(Some(p)) if p.is_nothing() => {}
            Ok(Some(p)) => info!(
                deliveries = p.deliveries,
                attempts = p.attempts,
                attempts_cleared = p.attempts_cleared,
                events = p.events,
                inbox = p.inbox,
                batches = p.batches,
                batches_skipped = p.batches_skipped,
                took_ms = started.elapsed().as_millis() as u64,
                "retention purge"
            ),
            Err(e) => warn!(error = %e, "retention purge failed"),
        }
    }
}
