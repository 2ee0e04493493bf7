//! The console counts' rollup: folds the delivery count deltas into the summary the
//! console and `/v1/overview` read.

use notify_store::PgPool;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Most deltas folded per rollup transaction.
const COUNTS_ROLLUP_BATCH: i64 = 10_000;

/// The console counts' rollup: every `interval`, folds the delivery count deltas into the
/// summary until none are left (a full batch means there may be more). Any number of
/// ingest replicas may roll up at once ([`notify_store::console::roll_up_counts`]).
pub(crate) async fn roll_up_counts(pool: PgPool, interval: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        loop {
            match notify_store::console::roll_up_counts(&pool, COUNTS_ROLLUP_BATCH).await {
                Ok(n) if n as i64 >= COUNTS_ROLLUP_BATCH && !shutdown.is_cancelled() => {}
                Ok(_) => break,
                Err(e) => {
                    warn!(error = %e, "delivery counts rollup failed");
                    break;
                }
            }
        }
    }
}
