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

use notify_broker::{DeliveryBatch, DeliveryMessage, Pointer, PublishOutcome, Publisher, Topology};
use notify_core::Channel;
use notify_store::PgPool;
use notify_store::outbox::{self, OutboxRow};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Deliveries named by held rows waiting for the relay, at most, for each of its two
/// doors (the event writers' and the fan-out's, so a broadcast never takes the room of the
/// API's events): a few fan-out pages or a few hundred group commits, about 1 MiB each.
/// Beyond it an event writer releases its rows instead, and the fan-out waits, so memory
/// stays bounded whatever the broker's pace.
const DIRECT_BACKLOG: usize = 8_000;

/// Most deliveries the fan-out hands over at once ([`Direct::publish_paced`]): a quarter
/// of its backlog, so a page on several channels fits and the relay takes one part while
/// the next waits.
const PACED_CHUNK: usize = DIRECT_BACKLOG / 4;

/// Default of [`RelayConfig::deliveries_per_message`]: the broker's cost is per message
/// (0.22 ms of CPU per delivery at one per message, measured in `make bench`), and a
/// group commit or a fan-out page hands over tens to thousands of one channel's rows at
/// once. 50 keeps a message near 5 KB and spreads a burst over several worker replicas.
pub const DELIVERIES_PER_MESSAGE: usize = 50;

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
pub struct DirectRx(mpsc::UnboundedReceiver<Handed>);

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
    async fn hand_over_paced(
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
fn deliveries(rows: &[OutboxRow]) -> usize {
    rows.iter().map(OutboxRow::deliveries).sum()
}

/// Releases held rows; on failure they wait out their hold, then the relay claims them.
async fn release(pool: &PgPool, rows: &[OutboxRow]) {
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    if let Err(e) = outbox::release(pool, &ids).await {
        warn!(error = %e, count = ids.len(), "could not release held outbox rows; they are claimed after their hold");
    }
}

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
    let mut backoff = Duration::from_millis(200);
    while !shutdown.is_cancelled() {
        let result = run_connected(&pool, &listen_pool, &cfg, &stats, &mut direct, &shutdown).await;
        stats.connected.store(false, Ordering::SeqCst);
        match result {
            Ok(()) => break,
            Err(e) => {
                error!(error = %e, retry_in_ms = backoff.as_millis() as u64, "relay failed; reconnecting");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
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
) -> anyhow::Result<()> {
    let conn = notify_broker::connect(&cfg.amqp_url, "ingest-relay").await?;
    let setup = conn.create_channel().await?;
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

/// Publishes `rows` with confirms and settles each: deleted once confirmed; kept, with the
/// failure counted and recorded, and due again after `cfg.retry_in` otherwise. A row
/// naming several deliveries is settled once every message naming them is confirmed.
/// Fails when the publisher's channel is gone (the caller reconnects).
async fn publish_rows(
    pool: &PgPool,
    cfg: &RelayConfig,
    stats: &RelayStats,
    publisher: &Publisher,
    rows: Vec<OutboxRow>,
) -> anyhow::Result<()> {
    // One producer span per delivery, a child of the event's stored trace context; its
    // own context travels to the worker (in the message headers, or beside the delivery's
    // id in a batch message) and parents the consumer span of that delivery.
    let units: Vec<Unit> = rows
        .iter()
        .enumerate()
        .flat_map(|(row, r)| {
            r.delivery_ids()
                .enumerate()
                .map(move |(i, id)| (row, i, id))
        })
        .map(|(row, i, id)| {
            let span = producer_span(cfg, &rows[row], id, rows[row].origin(i));
            let context = notify_telemetry::propagation::headers_of(&span);
            Unit {
                row,
                delivery_id: id,
                span,
                context,
            }
        })
        .collect();
    let groups = message_groups(&rows, &units, cfg.deliveries_per_message);
    // A message of one delivery stays version 1, as every webhook message does.
    let (singles, batches): (Vec<&Vec<usize>>, Vec<&Vec<usize>>) =
        groups.iter().partition(|g| g.len() == 1);
    let single_messages: Vec<DeliveryMessage> = singles
        .iter()
        .map(|g| DeliveryMessage {
            v: 1,
            delivery_id: units[g[0]].delivery_id,
            channel: rows[units[g[0]].row].channel.clone(),
        })
        .collect();
    let single_headers: Vec<_> = singles
        .iter()
        .map(|g| units[g[0]].context.clone())
        .collect();
    let batch_messages: Vec<DeliveryBatch> = batches
        .iter()
        .map(|g| DeliveryBatch {
            v: 2,
            channel: rows[units[g[0]].row].channel.clone(),
            deliveries: g
                .iter()
                .map(|&u| Pointer {
                    id: units[u].delivery_id,
                    traceparent: units[u].context.get("traceparent").cloned(),
                    tracestate: units[u].context.get("tracestate").cloned(),
                })
                .collect(),
        })
        .collect();
    let (single_out, batch_out) = tokio::join!(
        publisher.publish_batch_with_headers(&single_messages, &single_headers),
        publisher.publish_delivery_batches(&batch_messages),
    );
    // Every delivery shares the outcome of the message that named it; a row, the first
    // failure among its deliveries (a delivery no outcome names was not published).
    let mut named = vec![PublishOutcome::Unknown("not published".into()); units.len()];
    for (group, outcome) in singles
        .iter()
        .chain(batches.iter())
        .zip(single_out.into_iter().chain(batch_out))
    {
        for &u in group.iter() {
            named[u] = outcome.clone();
        }
    }
    let mut outcomes = vec![PublishOutcome::Confirmed; rows.len()];
    for (unit, outcome) in units.iter().zip(named) {
        if outcome != PublishOutcome::Confirmed {
            unit.span.record("otel.status_code", "ERROR");
            unit.span
                .record("notify.publish_outcome", format!("{outcome:?}"));
            if outcomes[unit.row] == PublishOutcome::Confirmed {
                outcomes[unit.row] = outcome;
            }
        }
    }
    drop(units);
    let mut done = Vec::new();
    let mut unroutable = Vec::new();
    let mut failed = Vec::new();
    let mut last_error = String::new();
    for (row, outcome) in rows.iter().zip(outcomes) {
        match outcome {
            PublishOutcome::Confirmed => done.push(row.id),
            PublishOutcome::Unroutable => unroutable.push(row.id),
            PublishOutcome::Nacked => {
                last_error = "nacked by broker".into();
                failed.push(row.id)
            }
            PublishOutcome::Unknown(e) => {
                last_error = e;
                failed.push(row.id)
            }
        }
    }
    outbox::delete(pool, &done).await?;
    stats
        .published
        .fetch_add(done.len() as u64, Ordering::Relaxed);
    if !unroutable.is_empty() {
        stats
            .unroutable
            .fetch_add(unroutable.len() as u64, Ordering::Relaxed);
        error!(
            count = unroutable.len(),
            "unroutable: no queue bound for the routing key; kept in the outbox"
        );
        outbox::publish_failed(pool, &unroutable, "unroutable", cfg.retry_in).await?;
    }
    if !failed.is_empty() {
        stats
            .failed
            .fetch_add(failed.len() as u64, Ordering::Relaxed);
        warn!(count = failed.len(), error = %last_error, "publish not confirmed; kept in the outbox");
        outbox::publish_failed(pool, &failed, &last_error, cfg.retry_in).await?;
        if !publisher.is_healthy() {
            anyhow::bail!("publisher channel closed: {last_error}");
        }
    }
    Ok(())
}

/// One delivery named by a row being published: its row (an index into the rows), its
/// producer span and that span's propagation headers.
struct Unit {
    row: usize,
    delivery_id: uuid::Uuid,
    span: tracing::Span,
    context: std::collections::HashMap<String, String>,
}

/// The deliveries of each message, as indexes into `units` (every delivery of `rows`, row
/// by row): the rows of one channel share messages in their order, `per_message`
/// deliveries at most to a message, and a row starts a new message when it does not fit
/// whole in the channel's open one (a row naming more than `per_message`, written before
/// the limit was lowered, is cut at it); webhook rows go one to a message (worker-webhook
/// reads version-1 messages only). `per_message` 1: one version-1 message per delivery.
fn message_groups(rows: &[OutboxRow], units: &[Unit], per_message: usize) -> Vec<Vec<usize>> {
    let per_message = per_message.max(1);
    let mut open: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut row_started: Option<usize> = None; // the row whose first unit was placed
    for (u, unit) in units.iter().enumerate() {
        let row = &rows[unit.row];
        let batched = per_message > 1 && row.channel != notify_store::webhooks::OUTBOX_CHANNEL;
        if !batched {
            groups.push(vec![u]);
            continue;
        }
        let first_of_row = row_started != Some(unit.row);
        row_started = Some(unit.row);
        let fits = |g: usize| {
            let room = per_message - groups[g].len();
            if first_of_row {
                room >= row.deliveries().min(per_message)
            } else {
                room > 0
            }
        };
        match open.get(row.channel.as_str()) {
            Some(&g) if fits(g) => groups[g].push(u),
            _ => {
                open.insert(row.channel.as_str(), groups.len());
                groups.push(vec![u]);
            }
        }
    }
    groups
}

/// The producer span of one publish (OpenTelemetry messaging semantic conventions:
/// `messaging.system = rabbitmq`, operation `publish`).
fn producer_span(
    cfg: &RelayConfig,
    row: &outbox::OutboxRow,
    delivery_id: uuid::Uuid,
    origin: Option<&outbox::Origin>,
) -> tracing::Span {
    let queue = cfg.topology.queue(&row.channel);
    let span = tracing::info_span!(
        "publish",
        otel.name = %format!("{queue} publish"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "rabbitmq",
        messaging.operation.type = "publish",
        messaging.operation.name = "publish",
        messaging.destination.name = %queue,
        messaging.rabbitmq.destination.routing_key = %row.channel,
        messaging.message.id = %delivery_id,
        notify.delivery_id = %delivery_id,
        notify.event_id = tracing::field::Empty,
        notify.channel = %row.channel,
        notify.publish_outcome = tracing::field::Empty,
    );
    if let Some(id) = origin.and_then(|o| o.event_id) {
        span.record("notify.event_id", tracing::field::display(id));
    }
    let trace = origin.and_then(|o| o.trace_context.as_deref());
    notify_telemetry::propagation::continue_trace(&span, trace, None);
    span
}

#[cfg(test)]
mod tests {
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
            channel: channel.into(),
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
