//! The outbox relay: publishes outbox rows to RabbitMQ with publisher confirms and
//! deletes each row only after its confirm. Two doors lead to it:
//!
//! - **Handed over** ([`Direct`]): the event writer and the fan-out write the outbox rows
//!   of deliveries due now already claimed (held for [`RelayConfig::hold`]) and hand them
//!   to this replica's relay right after their commit, so a new delivery costs no claim
//!   and no wake-up round trip. Rows the relay cannot take now (not connected, too far
//!   behind, stopping) are released: made due at once for any relay's claim. The fan-out
//!   first waits a while for room ([`Direct::publish_paced`]), the event writer does not.
//! - **Claimed** ([`outbox::claim_due`]): every other row (retries, deferrals, scheduled
//!   sends, released rows, and held rows whose writer died before the confirm once their
//!   hold has passed). Wakes on `LISTEN notify_outbox` (announced when a row due now is
//!   written), at the due time of the next row written for later, and polls as a
//!   fallback; runs safely in any number of ingest replicas (claims use SKIP LOCKED).

use notify_broker::{BrokerError, Publisher, Topology};
use notify_core::Channel;
use notify_store::PgPool;
use notify_store::outbox::{self, OutboxRow};
use notify_telemetry::reconnect::Reconnect;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

mod direct;
mod publish;

/// Why one life of the relay ended (it reconnects after each).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The broker: connecting, declaring the topology, opening the publisher.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The `LISTEN notify_outbox` connection.
    #[error("outbox listener: {0}")]
    Listener(#[from] sqlx::Error),
    /// Claiming, deleting or settling outbox rows.
    #[error(transparent)]
    Store(#[from] notify_store::StoreError),
    /// The publisher's channel closed under a batch (the last publish error).
    #[error("publisher channel closed: {0}")]
    PublisherClosed(String),
}

pub use direct::{Direct, DirectRx};
use direct::{deliveries, release};
pub use publish::DELIVERIES_PER_MESSAGE;
use publish::publish_rows;

/// Relay settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// AMQP URL.
    pub amqp_url: String,
    /// Exchange and queue names.
    pub topology: Topology,
    /// Deliveries claimed and published per round: whole outbox rows up to this many
    /// deliveries in all (at least one row, [`outbox::claim_due`]), and handed-over rows
    /// up to about as many.
    pub batch: i64,
    /// Most deliveries of one channel a message names (a version-2
    /// [`notify_broker::DeliveryBatch`]); 1 publishes version-1 messages only, which a
    /// worker older than version 2 reads (set it while such workers still run).
    pub deliveries_per_message: usize,
    /// Poll interval when no notification arrives.
    pub poll: Duration,
    /// How long claimed rows are hidden from other relays while being published.
    pub hold: Duration,
    /// Longest wait for a batch's confirms.
    pub confirm_timeout: Duration,
    /// Delay before a failed publish is tried again.
    pub retry_in: Duration,
}

/// Counters of the relay, for logs and tests.
#[derive(Debug, Default)]
pub struct RelayStats {
    /// Outbox rows whose messages the broker confirmed (a row names one delivery, or up
    /// to [`RelayConfig::deliveries_per_message`] of one channel).
    pub published: AtomicU64,
    /// Outbox rows kept because a message naming their deliveries came back unroutable.
    pub unroutable: AtomicU64,
    /// Outbox rows kept because a message naming their deliveries was nacked or has an
    /// unknown outcome.
    pub failed: AtomicU64,
    /// Whether the relay holds a broker connection now (readiness).
    pub connected: std::sync::atomic::AtomicBool,
}

/// Runs the relay until `shutdown`; reconnects to the broker after failures.
/// Held rows handed over while it is not connected wait in `direct` (up to
/// [`DIRECT_BACKLOG`] deliveries from each door; the writers release the rest, the fan-out
/// after waiting); the ones still there when it
/// stops are released. Its `LISTEN notify_outbox` connection comes from `listen_pool`
/// (`notify_store::Pools::session`).
pub async fn run(
    pool: PgPool,
    listen_pool: PgPool,
    cfg: RelayConfig,
    stats: Arc<RelayStats>,
    mut direct: DirectRx,
    shutdown: CancellationToken,
) {
    let mut reconnect = Reconnect::new("relay failed", &shutdown);
    loop {
        let result = run_connected(&pool, &listen_pool, &cfg, &stats, &mut direct, &shutdown).await;
        stats.connected.store(false, Ordering::SeqCst);
        match result {
            Ok(()) => break,
            Err(e) => {
                if !reconnect.wait_after(&e).await {
                    break;
                }
            }
        }
    }
    // What was handed over and not published goes to another replica's claim at once.
    direct.0.close();
    let mut left = Vec::new();
    while let Ok((rows, _room)) = direct.0.try_recv() {
        left.extend(rows);
    }
    release(&pool, &left).await;
}

/// The channel of every queue the relay declares and publishes to: the delivery
/// channels' and the status webhooks' (webhook messages share the outbox, channel
/// `webhook`, and so the exchange). Whoever removes a topology deletes these.
pub const QUEUE_CHANNELS: [&str; 5] = [
    Channel::InApp.as_str(),
    Channel::Email.as_str(),
    Channel::Push.as_str(),
    Channel::Line.as_str(),
    notify_store::webhooks::OUTBOX_CHANNEL,
];

async fn run_connected(
    pool: &PgPool,
    listen_pool: &PgPool,
    cfg: &RelayConfig,
    stats: &RelayStats,
    direct: &mut DirectRx,
    shutdown: &CancellationToken,
) -> Result<(), RelayError> {
    let conn = notify_broker::connect(&cfg.amqp_url, "ingest-relay").await?;
    let setup = conn.create_channel().await.map_err(BrokerError::from)?;
    cfg.topology.declare(&setup, &QUEUE_CHANNELS).await?;
    let _ = setup.close(200, "topology declared".into()).await;
    let publisher = Publisher::new(&conn, &cfg.topology, cfg.confirm_timeout).await?;
    let mut listener = sqlx::postgres::PgListener::connect_with(listen_pool).await?;
    listener.listen("notify_outbox").await?;
    info!("relay connected");
    stats.connected.store(true, Ordering::SeqCst);
    loop {
        if shutdown.is_cancelled() {
            let _ = conn.close(200, "ingest stopping".into()).await;
            return Ok(());
        }
        let mut rows = outbox::claim_due(pool, cfg.batch, cfg.hold).await?;
        if !rows.is_empty() {
            if let Err(e) = outbox::read_origins(pool, &mut rows).await {
                warn!(error = %e, count = rows.len(), "could not read the claimed rows' events; publishing them without their traces");
            }
            publish_rows(pool, cfg, stats, &publisher, rows).await?;
            // Handed-over rows do not wait behind a long claimed backlog.
            if let Some(rows) = take_handed_over(direct, cfg.batch) {
                publish_rows(pool, cfg, stats, &publisher, rows).await?;
            }
            continue;
        }
        // Until the next row is due (a retry written by a worker is announced when
        // written, but due later), a row due now is announced, or the poll interval:
        // publish what the writers hand over.
        let wait = outbox::next_due_in(pool)
            .await?
            .map_or(cfg.poll, |d| d.min(cfg.poll));
        let until = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                n = listener.recv() => { n?; break; }
                _ = tokio::time::sleep_until(until) => break,
                handed = direct.0.recv(), if !direct.0.is_closed() => {
                    let Some((mut rows, _room)) = handed else { continue };
                    if let Some(more) = take_handed_over(direct, cfg.batch - deliveries(&rows) as i64) {
                        rows.extend(more);
                    }
                    publish_rows(pool, cfg, stats, &publisher, rows).await?;
                }
            }
        }
    }
}

/// Handed-over batches waiting now, up to about `limit` deliveries (whole batches).
fn take_handed_over(direct: &mut DirectRx, limit: i64) -> Option<Vec<OutboxRow>> {
    let mut out: Vec<OutboxRow> = Vec::new();
    let mut taken = 0;
    while taken < limit {
        match direct.0.try_recv() {
            // Its room is given back now: the rows are about to be published.
            Ok((rows, _room)) => {
                taken += deliveries(&rows) as i64;
                out.extend(rows);
            }
            Err(_) => break,
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::direct::{DIRECT_BACKLOG, PACED_CHUNK};
    use super::publish::{Unit, message_groups};
    use super::*;

    #[test]
    fn the_declared_queues_are_every_delivery_channel_and_the_webhooks() {
        let mut want: Vec<&str> = Channel::ALL.iter().map(|c| c.as_str()).collect();
        want.push(notify_store::webhooks::OUTBOX_CHANNEL);
        want.sort_unstable();
        let mut got = QUEUE_CHANNELS.to_vec();
        got.sort_unstable();
        assert_eq!(got, want);
    }

    fn row(id: i64, channel: &str) -> OutboxRow {
        OutboxRow {
            id,
            delivery_id: uuid::Uuid::new_v4(),
            more_delivery_ids: Vec::new(),
            queue: channel.parse().expect("an outbox queue"),
            origins: Vec::new(),
        }
    }

    /// The units of `rows` as `publish_rows` makes them (spans disabled here).
    fn units(rows: &[OutboxRow]) -> Vec<Unit> {
        rows.iter()
            .enumerate()
            .flat_map(|(row, r)| r.delivery_ids().map(move |id| (row, id)))
            .map(|(row, delivery_id)| Unit {
                row,
                delivery_id,
                span: tracing::Span::none(),
                context: Default::default(),
            })
            .collect()
    }

    fn groups(rows: &[OutboxRow], per_message: usize) -> Vec<Vec<usize>> {
        message_groups(rows, &units(rows), per_message)
    }

    /// A door whose fan-out backlog is full: [`DIRECT_BACKLOG`] deliveries handed over
    /// at the pace's parts, none taken by the relay yet.
    async fn full_door() -> (Direct, DirectRx) {
        let pool = notify_store::PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("a lazy pool never connects here");
        let (direct, rx) = Direct::new(pool, 50);
        let backlog: Vec<OutboxRow> = (0..DIRECT_BACKLOG as i64)
            .map(|i| row(i, "inapp"))
            .collect();
        assert_eq!(
            direct
                .hand_over_paced(backlog, Duration::ZERO)
                .await
                .map_err(|r| r.len()),
            Ok(())
        );
        (direct, rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_hand_over_waits_while_the_relay_is_behind_and_goes_through_when_it_catches_up()
    {
        let (direct, mut rx) = full_door().await;
        // An event writer's rows are not held up by the full fan-out backlog.
        direct.publish(vec![row(50_000, "line")]);
        let page: Vec<OutboxRow> = (100_000..102_000).map(|i| row(i, "inapp")).collect();
        let pacer = direct.clone();
        let waiting = tokio::spawn(async move {
            pacer
                .hand_over_paced(page, Duration::from_secs(10))
                .await
                .map_err(|rows| rows.len())
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished(), "no room yet: the page waits");
        // The relay takes a part of the backlog: its room comes back and the page goes.
        let (first, room) = rx.0.recv().await.expect("the backlog's first part");
        assert_eq!(first.len(), PACED_CHUNK);
        drop(room);
        assert_eq!(waiting.await.unwrap(), Ok(()));
        let mut handed: Vec<Vec<OutboxRow>> = Vec::new();
        while let Ok((rows, _room)) = rx.0.try_recv() {
            handed.push(rows);
        }
        assert_eq!(
            handed.len(),
            5,
            "three parts of the backlog, the writer's, the page"
        );
        assert_eq!(handed[3].first().map(|r| r.id), Some(50_000));
        let page = handed.last().unwrap();
        assert_eq!(page.first().map(|r| r.id), Some(100_000));
        assert_eq!(page.len(), 2_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_paced_hand_over_gives_back_what_the_relay_did_not_take_in_time_or_is_gone() {
        let (direct, mut rx) = full_door().await;
        // Room for one part comes after 4 s: the first part goes, the rest comes back.
        let page: Vec<OutboxRow> = (100_000..100_000 + PACED_CHUNK as i64 + 10)
            .map(|i| row(i, "inapp"))
            .collect();
        let started = tokio::time::Instant::now();
        let (back, ()) = tokio::join!(
            direct.hand_over_paced(page.clone(), Duration::from_secs(10)),
            async {
                tokio::time::sleep(Duration::from_secs(4)).await;
                let (_part, room) = rx.0.recv().await.expect("the backlog's first part");
                drop(room);
            }
        );
        let back = back.expect_err("no room for the second part within its patience");
        assert_eq!(back.len(), 10);
        assert_eq!(back[0].id, 100_000 + PACED_CHUNK as i64);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(10),
            "patience is for the whole page"
        );
        // A stopped relay: given back at once, whatever the room.
        drop(rx);
        let started = tokio::time::Instant::now();
        let back = direct
            .hand_over_paced(page, Duration::from_secs(10))
            .await
            .expect_err("the relay is gone");
        assert_eq!(back.len(), PACED_CHUNK + 10);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[test]
    fn rows_share_messages_by_channel_in_order_up_to_the_limit_and_webhooks_go_alone() {
        let rows: Vec<OutboxRow> = [
            "line", "inapp", "line", "webhook", "line", "webhook", "inapp", "line",
        ]
        .iter()
        .enumerate()
        .map(|(i, c)| row(i as i64, c))
        .collect();
        assert_eq!(
            groups(&rows, 3),
            vec![vec![0, 2, 4], vec![1, 6], vec![3], vec![5], vec![7]]
        );
        // One per message: every row its own (version-1) message.
        assert_eq!(groups(&rows, 1).len(), rows.len());
        assert!(groups(&[], 50).is_empty());
    }

    #[test]
    fn rows_naming_several_deliveries_share_messages_whole_when_they_fit_and_are_cut_at_the_limit()
    {
        let several = |id: i64, n: usize| {
            let mut r = row(id, "inapp");
            r.more_delivery_ids = (1..n).map(|_| uuid::Uuid::new_v4()).collect();
            r
        };
        let rows = vec![
            row(0, "inapp"),
            several(1, 5),
            row(2, "inapp"),
            row(3, "line"),
        ];
        // Units: 0 (row 0), 1..=5 (row 1's five deliveries), 6 (row 2), 7 (row 3).
        assert_eq!(
            groups(&rows, 50),
            vec![vec![0, 1, 2, 3, 4, 5, 6], vec![7]],
            "one message a channel: a group commit's rows go together"
        );
        assert_eq!(
            groups(&rows, 6),
            vec![vec![0, 1, 2, 3, 4, 5], vec![6], vec![7]],
            "the single row after a full message starts the next"
        );
        assert_eq!(
            groups(&rows, 5),
            vec![vec![0], vec![1, 2, 3, 4, 5], vec![6], vec![7]],
            "a row that does not fit in the open message starts its own, whole"
        );
        assert_eq!(
            groups(&rows, 3),
            vec![vec![0], vec![1, 2, 3], vec![4, 5, 6], vec![7]],
            "cut at the limit when it was lowered after the row was written"
        );
        assert_eq!(
            groups(&rows, 1).len(),
            8,
            "version-1 messages only: one per delivery, the row's included"
        );
        // A fan-out's full rows: one message each.
        let full = vec![several(10, 50), several(11, 50), several(12, 7)];
        let sizes: Vec<usize> = groups(&full, 50).iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![50, 50, 7]);
    }
}
