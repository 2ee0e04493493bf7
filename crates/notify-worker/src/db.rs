//! The worker's batched database calls and their retry while the database is unreachable.

use crate::batch::Batcher;
use crate::reconnect::Backoff;
use notify_core::Channel;
use notify_store::PgPool;
use notify_store::deliveries::{self, AttemptRecord, ClaimOutcome, DeliveryJob, NextState};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, warn};

/// The worker's batched database calls: claims of one channel, and attempt records.
#[derive(Clone)]
pub(crate) struct DbBatches {
    pub(crate) claims: Batcher<uuid::Uuid, ClaimOutcome>,
    pub(crate) records: Batcher<(Arc<DeliveryJob>, NextState, AttemptRecord), bool>,
    /// In-app only: deliveries without a claim ([`crate::handle`]).
    pub(crate) unclaimed: Option<UnclaimedBatches>,
}

/// The batched calls of deliveries made without a claim (in-app: the inbox row is the
/// whole delivery): reads of due deliveries, and their records with the inbox rows.
#[derive(Clone)]
pub(crate) struct UnclaimedBatches {
    pub(crate) reads: Batcher<uuid::Uuid, Option<DeliveryJob>>,
    pub(crate) records: Batcher<(Arc<DeliveryJob>, AttemptRecord), bool>,
}

/// Most claims or records in one statement or transaction.
const DB_BATCH: usize = 100;

/// Batches of one kind in flight at once. One: the calls that arrive while a batch runs
/// wait for it and go together in the next, so under load a batch grows with the time a
/// statement takes instead of being split between loops. Measured end to end (`make
/// bench`, 64 messages in flight): with two loops claims carried 7.7 deliveries each and
/// cost 0.249 ms of statement time per delivery, with one 14 and 0.168 ms (records 0.175
/// to 0.119 ms), 922 to 1,078 deliveries/s. Under light load a batch is one call either
/// way and waits for nothing.
const DB_LOOPS: usize = 1;

impl DbBatches {
    pub(crate) fn start(pool: &PgPool, channel: Channel, lease: Duration) -> Self {
        let p = pool.clone();
        let claims = Batcher::start(DB_LOOPS, DB_BATCH, move |ids: Vec<uuid::Uuid>| {
            let p = p.clone();
            async move { deliveries::claim_many(&p, &ids, channel, lease).await }
        });
        let p = pool.clone();
        let records = Batcher::start(
            DB_LOOPS,
            DB_BATCH,
            move |batch: Vec<(Arc<DeliveryJob>, NextState, AttemptRecord)>| {
                let p = p.clone();
                async move {
                    let refs: Vec<(&DeliveryJob, &NextState, &AttemptRecord)> =
                        batch.iter().map(|(j, n, r)| (&**j, n, r)).collect();
                    let (recorded, fallbacks) =
                        deliveries::record_attempts_with_fallbacks(&p, &refs).await?;
                    // Counted after the commit that created them.
                    for f in fallbacks {
                        notify_telemetry::metrics::count_fallback(
                            f.from.as_str(),
                            f.to.as_str(),
                            notify_core::FailReason::AttemptFailed.as_str(),
                        );
                    }
                    Ok(recorded)
                }
            },
        );
        let unclaimed = (channel == Channel::InApp).then(|| {
            let p = pool.clone();
            let reads = Batcher::start(DB_LOOPS, DB_BATCH, move |ids: Vec<uuid::Uuid>| {
                let p = p.clone();
                async move { deliveries::read_due_many(&p, &ids, channel).await }
            });
            let p = pool.clone();
            let records = Batcher::start(
                DB_LOOPS,
                DB_BATCH,
                move |batch: Vec<(Arc<DeliveryJob>, AttemptRecord)>| {
                    let p = p.clone();
                    async move {
                        let refs: Vec<(&DeliveryJob, &AttemptRecord)> =
                            batch.iter().map(|(j, r)| (&**j, r)).collect();
                        deliveries::record_inbox_sent(&p, &refs, lease).await
                    }
                },
            );
            UnclaimedBatches { reads, records }
        });
        Self {
            claims,
            records,
            unclaimed,
        }
    }
}

/// How a database call of the worker ended after [`with_db_retry`].
pub(crate) enum DbCall<T> {
    /// It succeeded.
    Done(T),
    /// The database stayed unreachable through every retry: give the message back.
    Unreachable,
    /// The database refused the call for a reason retrying cannot change (see
    /// [`notify_store::StoreError::is_transient`]).
    Refused(notify_store::StoreError),
}

/// Retries a database operation with backoff while it fails for a transient reason; an
/// error that retrying cannot change ends it at once. 10 tries, each followed on failure
/// by a wait of 0.2 s doubling up to 10 s (52.6 s of waits in all); a try against an
/// unreachable database itself waits up to the pool's 5 s acquire timeout, so an outage
/// is given up on after about 100 s.
pub(crate) async fn with_db_retry<T, F, Fut>(what: &str, mut f: F) -> DbCall<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = notify_store::Result<T>>,
{
    let mut backoff = Backoff::standard();
    for attempt in 1..=10 {
        match f().await {
            Ok(v) => return DbCall::Done(v),
            Err(e) if !e.is_transient() => {
                error!(error = %e, what, "the database refused the call; not retrying");
                return DbCall::Refused(e);
            }
            Err(e) => {
                warn!(error = %e, attempt, what, "database call failed; retrying");
                tokio::time::sleep(backoff.next_wait()).await;
            }
        }
    }
    error!(
        what,
        "database unreachable; giving the message back to the broker"
    );
    DbCall::Unreachable
}
