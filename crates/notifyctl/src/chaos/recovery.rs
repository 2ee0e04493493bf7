//! What a kill leaves in flight and when it is recovered: the snapshot of the leases a
//! killed worker held, and the watcher that times their recovery (`max_recovery_s`).

use crate::procs::{Procs, WEBHOOK_WORKER};
use rand::Rng;
use sqlx::PgPool;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// What a kill left in flight: deliveries `sending` on the killed worker's channel, with
/// the lease tokens the dead worker held. Recovered once no delivery holds one of those
/// tokens any more (the sweeper returned it to pending, or another attempt finished it).
pub(super) struct KillSnapshot {
    pub(super) at: Instant,
    pub(super) ids: Vec<Uuid>,
    pub(super) tokens: Vec<Uuid>,
    pub(super) recovered_after: Option<Duration>,
    /// Leases of webhook messages rather than of deliveries.
    pub(super) webhooks: bool,
}

impl KillSnapshot {
    /// The snapshot, taken now, of `(id, lease token)` rows.
    fn of(rows: Vec<(Uuid, Uuid)>, webhooks: bool) -> Self {
        let (ids, tokens) = rows.into_iter().unzip();
        Self {
            at: Instant::now(),
            ids,
            tokens,
            recovered_after: None,
            webhooks,
        }
    }
}

pub(super) async fn snapshot(
    pool: &PgPool,
    event_id: Uuid,
    channel: &str,
) -> anyhow::Result<KillSnapshot> {
    let rows: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "SELECT id, lease_token FROM notification_deliveries
         WHERE event_id = $1 AND status = 'sending' AND channel = $2",
    )
    .bind(event_id)
    .bind(channel)
    .fetch_all(pool)
    .await?;
    Ok(KillSnapshot::of(rows, false))
}

/// [`snapshot`] of the webhook messages `sending` (worker-webhook's leases).
pub(super) async fn snapshot_webhooks(pool: &PgPool) -> anyhow::Result<KillSnapshot> {
    let rows: Vec<(Uuid, Uuid)> =
        sqlx::query_as("SELECT id, lease_token FROM webhook_messages WHERE status = 'sending'")
            .fetch_all(pool)
            .await?;
    Ok(KillSnapshot::of(rows, true))
}

/// Whether this run's webhook messages (of `endpoints`) are flowing: at least 50 sent
/// and 50 still to go. (Counting every endpoint's, an earlier run's sent messages made
/// the second run's kill fire as soon as 50 were queued, before any POST.)
pub(super) async fn webhooks_mid_stream(pool: &PgPool, endpoints: &[Uuid]) -> bool {
    let counts: Result<(i64, i64), _> = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status = 'sent'),
                count(*) FILTER (WHERE status IN ('pending', 'sending'))
         FROM webhook_messages WHERE endpoint_id = ANY($1)",
    )
    .bind(endpoints)
    .fetch_one(pool)
    .await;
    matches!(counts, Ok((done, open)) if done >= 50 && open >= 50)
}

/// Kills worker-webhook with SIGKILL; the messages still `sending` right after (before
/// a new one starts) are the POSTs it was making, watched until a sweeper frees them.
pub(super) async fn kill_webhook_worker(
    pool: &PgPool,
    procs: &mut Procs,
    snapshots: &tokio::sync::Mutex<Vec<KillSnapshot>>,
) -> anyhow::Result<()> {
    procs.kill9(WEBHOOK_WORKER).await?;
    let in_flight = match snapshot_webhooks(pool).await {
        Ok(s) => {
            let n = s.ids.len();
            snapshots.lock().await.push(s);
            n
        }
        Err(_) => 0,
    };
    println!("  kill -9 {WEBHOOK_WORKER} ({in_flight} webhooks in flight)");
    tokio::time::sleep(Duration::from_millis(rand::rng().random_range(100..1_000))).await;
    procs.spawn(WEBHOOK_WORKER)
}

/// Checks every unrecovered snapshot every 500 ms until `stop`.
pub(super) async fn watch_recovery(
    pool: PgPool,
    snapshots: std::sync::Arc<tokio::sync::Mutex<Vec<KillSnapshot>>>,
    stop: tokio_util::sync::CancellationToken,
) {
    while !stop.is_cancelled() {
        {
            let mut snaps = snapshots.lock().await;
            for s in snaps.iter_mut().filter(|s| s.recovered_after.is_none()) {
                let held: Result<i64, _> = sqlx::query_scalar(if s.webhooks {
                    "SELECT count(*) FROM webhook_messages
                     WHERE id = ANY($1) AND status = 'sending' AND lease_token = ANY($2)"
                } else {
                    "SELECT count(*) FROM notification_deliveries
                     WHERE id = ANY($1) AND status = 'sending' AND lease_token = ANY($2)"
                })
                .bind(&s.ids)
                .bind(&s.tokens)
                .fetch_one(&pool)
                .await;
                if let Ok(0) = held {
                    s.recovered_after = Some(s.at.elapsed());
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
