//! The publish loop's one step: outbox rows to broker messages (several deliveries of one
//! channel per message), published with confirms and each row settled by its confirms.

use super::{RelayConfig, RelayError, RelayStats};
use notify_broker::{DeliveryBatch, DeliveryMessage, Pointer, PublishOutcome, Publisher};
use notify_store::PgPool;
use notify_store::outbox::{self, OutboxRow};
use std::sync::atomic::Ordering;
use tracing::{error, warn};

/// Default of [`RelayConfig::deliveries_per_message`]: the broker's cost is per message
/// (0.22 ms of CPU per delivery at one per message, measured in `make bench`), and a
/// group commit or a fan-out page hands over tens to thousands of one channel's rows at
/// once. 50 keeps a message near 5 KB and spreads a burst over several worker replicas.
pub const DELIVERIES_PER_MESSAGE: usize = 50;

/// Publishes `rows` with confirms and settles each: deleted once confirmed; kept, with the
/// failure counted and recorded, and due again after `cfg.retry_in` otherwise. A row
/// naming several deliveries is settled once every message naming them is confirmed.
/// Fails when the publisher's channel is gone (the caller reconnects).
pub(super) async fn publish_rows(
    pool: &PgPool,
    cfg: &RelayConfig,
    stats: &RelayStats,
    publisher: &Publisher,
    rows: Vec<OutboxRow>,
) -> Result<(), RelayError> {
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
            channel: rows[units[g[0]].row].queue.to_string(),
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
            channel: rows[units[g[0]].row].queue.to_string(),
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
            return Err(RelayError::PublisherClosed(last_error));
        }
    }
    Ok(())
}

/// One delivery named by a row being published: its row (an index into the rows), its
/// producer span and that span's propagation headers.
pub(super) struct Unit {
    pub(super) row: usize,
    pub(super) delivery_id: uuid::Uuid,
    pub(super) span: tracing::Span,
    pub(super) context: std::collections::HashMap<String, String>,
}

/// The deliveries of each message, as indexes into `units` (every delivery of `rows`, row
/// by row): the rows of one channel share messages in their order, `per_message`
/// deliveries at most to a message, and a row starts a new message when it does not fit
/// whole in the channel's open one (a row naming more than `per_message`, written before
/// the limit was lowered, is cut at it); webhook rows go one to a message (worker-webhook
/// reads version-1 messages only). `per_message` 1: one version-1 message per delivery.
pub(super) fn message_groups(
    rows: &[OutboxRow],
    units: &[Unit],
    per_message: usize,
) -> Vec<Vec<usize>> {
    let per_message = per_message.max(1);
    let mut open: std::collections::HashMap<outbox::OutboxQueue, usize> =
        std::collections::HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut row_started: Option<usize> = None; // the row whose first unit was placed
    for (u, unit) in units.iter().enumerate() {
        let row = &rows[unit.row];
        let batched = per_message > 1 && row.queue.batches();
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
        match open.get(&row.queue) {
            Some(&g) if fits(g) => groups[g].push(u),
            _ => {
                open.insert(row.queue, groups.len());
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
    let queue = cfg.topology.queue(row.queue.as_str());
    let span = tracing::info_span!(
        "publish",
        otel.name = %format!("{queue} publish"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "rabbitmq",
        messaging.operation.type = "publish",
        messaging.operation.name = "publish",
        messaging.destination.name = %queue,
        messaging.rabbitmq.destination.routing_key = %row.queue,
        messaging.message.id = %delivery_id,
        notify.delivery_id = %delivery_id,
        notify.event_id = tracing::field::Empty,
        notify.channel = %row.queue,
        notify.publish_outcome = tracing::field::Empty,
    );
    if let Some(id) = origin.and_then(|o| o.event_id) {
        span.record("notify.event_id", tracing::field::display(id));
    }
    let trace = origin.and_then(|o| o.trace_context.as_deref());
    notify_telemetry::propagation::continue_trace(&span, trace, None);
    span
}
