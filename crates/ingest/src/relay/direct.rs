//! The handed-over door: held outbox rows given to this replica's relay right after
//! their writer's commit, within a bounded backlog per door; what it cannot take is
//! released to the claim.

use notify_store::PgPool;
use notify_store::outbox::{self, OutboxRow};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::warn;

/// Deliveries named by held rows waiting for the relay, at most, for each of its two
/// doors (the event writers' and the fan-out's, so a broadcast never takes the room of the
/// API's events): a few fan-out pages or a few hundred group commits, about 1 MiB each.
/// Beyond it an event writer releases its rows instead, and the fan-out waits, so memory
/// stays bounded whatever the broker's pace.
pub(super) const DIRECT_BACKLOG: usize = 8_000;

/// Most deliveries the fan-out hands over at once ([`Direct::publish_paced`]): a quarter
/// of its backlog, so a page on several channels fits and the relay takes one part while
/// the next waits.
pub(super) const PACED_CHUNK: usize = DIRECT_BACKLOG / 4;

/// A handed-over batch and its share of [`DIRECT_BACKLOG`], given back when dropped.
type Handed = (Vec<OutboxRow>, tokio::sync::OwnedSemaphorePermit);

/// The writers' door to this replica's relay: outbox rows written held
/// ([`notify_store::events::insert_deliveries_held`]) are handed over after their commit.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct Direct {
    tx: mpsc::UnboundedSender<Handed>,
    /// The event writers' share of the backlog.
    room: Arc<tokio::sync::Semaphore>,
    /// The fan-out's share of the backlog.
    paced_room: Arc<tokio::sync::Semaphore>,
    pool: PgPool,
    per_row: usize,
    /// The runtime `new` was called on (the server's): releases run there, not on the
    /// event writer's own thread ([`crate::writer::EventWriter::start`]), which
    /// [`Direct::publish`] is called from.
    runtime: tokio::runtime::Handle,
}

/// The relay's end of [`Direct`].
#[derive(Debug)]
pub struct DirectRx(pub(super) mpsc::UnboundedReceiver<Handed>);

impl Direct {
    /// A door and its relay end; `pool` releases what the relay cannot take, on the
    /// runtime this is called on; `per_message` is the relay's
    /// [`RelayConfig::deliveries_per_message`].
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(pool: PgPool, per_message: usize) -> (Self, DirectRx) {
        let (tx, rx) = mpsc::unbounded_channel();
        let room = Arc::new(tokio::sync::Semaphore::new(DIRECT_BACKLOG));
        let paced_room = Arc::new(tokio::sync::Semaphore::new(DIRECT_BACKLOG));
        let per_row = per_message.max(1);
        (
            Self {
                tx,
                room,
                paced_room,
                pool,
                per_row,
                runtime: tokio::runtime::Handle::current(),
            },
            DirectRx(rx),
        )
    }

    /// Most deliveries a held outbox row may name
    /// ([`notify_store::events::insert_deliveries_held`]): the relay's
    /// [`RelayConfig::deliveries_per_message`], so that a row fits in one broker message.
    pub fn deliveries_per_row(&self) -> usize {
        self.per_row
    }

    /// Hands committed held rows to the relay without waiting. When the relay cannot take
    /// them (not connected, [`DIRECT_BACKLOG`] deliveries behind, stopped), they are
    /// released in the background ([`outbox::release`]): due now for any relay's claim,
    /// so a delivery waits no longer than a claim round, never the whole hold.
    pub fn publish(&self, rows: Vec<OutboxRow>) {
        if rows.is_empty() {
            return;
        }
        let n = u32::try_from(deliveries(&rows)).unwrap_or(u32::MAX);
        let rows = match self.room.clone().try_acquire_many_owned(n) {
            Ok(permit) => match self.tx.send((rows, permit)) {
                Ok(()) => return,
                Err(mpsc::error::SendError((rows, _))) => rows,
            },
            Err(_) => rows,
        };
        let pool = self.pool.clone();
        self.runtime
            .spawn(async move { release(&pool, &rows).await });
    }

    /// Hands committed held rows to the relay, waiting up to `patience` in all for room
    /// when it is [`DIRECT_BACKLOG`] deliveries behind: the fan-out's back-pressure. A
    /// large topic is then written no faster than the relay publishes it, instead of
    /// releasing page after page (an `UPDATE` of every row, then a claim of each) only
    /// because the relay is busy. The rows go over in parts of at most [`PACED_CHUNK`]
    /// deliveries, from the fan-out's own share of the backlog (an event writer's room is
    /// never taken). What the relay has not taken within `patience` (stopped, not
    /// connected, stalled) is released, and the release awaited. Rows still in the relay's
    /// backlog when their hold ends are claimed by a relay too: published twice, which the
    /// worker's claim makes harmless; `patience` well under the hold keeps that rare.
    pub async fn publish_paced(&self, rows: Vec<OutboxRow>, patience: Duration) {
        if let Err(rows) = self.hand_over_paced(rows, patience).await {
            release(&self.pool, &rows).await;
        }
    }

    /// [`Self::publish_paced`] without the release: `Err` gives back the rows the relay
    /// did not take (the parts handed over before are the relay's).
    pub(super) async fn hand_over_paced(
        &self,
        rows: Vec<OutboxRow>,
        patience: Duration,
    ) -> Result<(), Vec<OutboxRow>> {
        let deadline = tokio::time::Instant::now() + patience;
        let mut rest = rows.into_iter().peekable();
        while rest.peek().is_some() {
            let mut part = Vec::new();
            let mut n = 0;
            while let Some(row) = rest.next_if(|r| n == 0 || n + r.deliveries() <= PACED_CHUNK) {
                n += row.deliveries();
                part.push(row);
            }
            let give_back = |part: Vec<OutboxRow>, rest| part.into_iter().chain(rest).collect();
            if self.tx.is_closed() {
                return Err(give_back(part, rest));
            }
            // A row names at most 500 deliveries, well under the backlog.
            let n = u32::try_from(n.min(DIRECT_BACKLOG)).unwrap_or(u32::MAX);
            let acquired =
                tokio::time::timeout_at(deadline, self.paced_room.clone().acquire_many_owned(n));
            match acquired.await {
                Ok(Ok(permit)) => {
                    if let Err(mpsc::error::SendError((part, _))) = self.tx.send((part, permit)) {
                        return Err(give_back(part, rest));
                    }
                }
                _ => return Err(give_back(part, rest)),
            }
        }
        Ok(())
    }
}

/// How many deliveries `rows` name: what [`DIRECT_BACKLOG`] counts.
pub(super) fn deliveries(rows: &[OutboxRow]) -> usize {
    rows.iter().map(OutboxRow::deliveries).sum()
}

/// Releases held rows; on failure they wait out their hold, then the relay claims them.
pub(super) async fn release(pool: &PgPool, rows: &[OutboxRow]) {
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    if let Err(e) = outbox::release(pool, &ids).await {
        warn!(error = %e, count = ids.len(), "could not release held outbox rows; they are claimed after their hold");
    }
}
