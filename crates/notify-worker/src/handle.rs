//! Handling one consumed message: its deliveries, each from claim to record
//! (`delivery.rs`: claim, due check (send, defer or skip), template, provider call,
//! decision, record), then its ack. In-app first tries the same without a claim
//! (`deliver_unclaimed`: read, due check, template, one fenced write).

mod delivery;

use crate::ChannelSender;
use crate::consume::Ctx;
use crate::db::{DbCall, with_db_retry};
use crate::decide::decide;
use crate::record_metrics::count_recorded;
use notify_broker::{Inbound, Pointer, Pointers};
use notify_core::AttemptLabel;
use notify_store::deliveries::{self, DeliveryJob};
use std::sync::Arc;
use tracing::{info, info_span, warn};

/// How a message is settled once every delivery it names is done. Ordered by precedence:
/// a message is requeued when any of its deliveries needs it again, else dead-lettered
/// when any cannot be worked on, else acked (a delivery already ended is skipped by its
/// claim when the message comes back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Settle {
    /// Done with: the broker forgets it.
    Ack,
    /// To the dead-letter queue (unparseable, unknown delivery, wrong channel).
    Reject,
    /// Back to the queue (the database stayed unreachable).
    Requeue,
}

/// The logs and metrics of a failure withdrawn by a late success (the delivery had been
/// given up, alerted `delivery_failed` and counted failed; it was sent after all): an
/// `alert_resolved = "delivery_failed"` line naming the delivery, the
/// `notify_deliveries_failure_withdrawn_total` count, and what became of its fallbacks.
fn withdrawn_failure(job: &DeliveryJob, late: &deliveries::LateSuccess) {
    let [c, p] =
        notify_telemetry::metrics::channel_provider(job.channel.as_str(), job.provider.as_str());
    notify_telemetry::metrics()
        .deliveries_failure_withdrawn
        .add(1, &[c, p]);
    let canceled = late.fallbacks.canceled.len();
    let past = late.fallbacks.past_pending.len();
    if past > 0 {
        warn!(
            attempt = job.attempt,
            alert_resolved = "delivery_failed",
            fallbacks_canceled = canceled,
            fallbacks_already_sent = past,
            "a delivery given up was sent after all: its failure is withdrawn, but a fallback had already left (the user may get both)"
        );
    } else {
        warn!(
            attempt = job.attempt,
            alert_resolved = "delivery_failed",
            fallbacks_canceled = canceled,
            "a delivery given up was sent after all: its failure is withdrawn and its pending fallbacks canceled"
        );
    }
}

impl<S: ChannelSender> Ctx<S> {
    /// Handles one message to its end: every delivery it names (`pointers`, parsed by the
    /// consume loop; `None` when it could not be) is handled, as many at once as `permits`
    /// holds, and the message is settled (acked, rejected or requeued) before this
    /// returns. Once every delivery has started, each one that ends gives its permit back,
    /// so a slow delivery holds one permit, not the whole batch's.
    /// Once `stop` is cancelled no further delivery of it is started: the ones in hand
    /// finish and are recorded, and a message with deliveries left unstarted is left
    /// unsettled, so closing the channel returns it to the queue whole (the next claim
    /// skips the deliveries already ended).
    pub(crate) async fn handle_message(
        &self,
        msg: Inbound,
        pointers: Option<Pointers>,
        mut permits: tokio::sync::OwnedSemaphorePermit,
        stop: &tokio_util::sync::CancellationToken,
    ) {
        use futures_util::StreamExt;
        use futures_util::stream::FuturesUnordered;
        let channel = self.sender.channel();
        let Some(pointers) = pointers else {
            warn!(%channel, bytes = msg.body().len(), "unparseable message: dead-lettered");
            msg.reject().await;
            return;
        };
        let tag = msg.delivery_tag();
        let mut waiting = pointers.deliveries.iter();
        let mut running = FuturesUnordered::new();
        let mut settle = Settle::Ack;
        let mut unstarted = false;
        let parallel = permits.num_permits().max(1);
        loop {
            while running.len() < parallel {
                if stop.is_cancelled() {
                    unstarted = waiting.len() > 0;
                    break;
                }
                let Some(p) = waiting.next() else { break };
                running.push(self.handle_delivery(&pointers.channel, p, tag));
            }
            match running.next().await {
                Some(s) => settle = settle.max(s),
                None => break,
            }
            // Nothing left to start: a permit per delivery still running is enough.
            if waiting.len() == 0 {
                while permits.num_permits() > running.len().max(1) {
                    drop(permits.split(1));
                }
            }
        }
        if unstarted {
            info!(
                unstarted = waiting.len(),
                "stopping: the message goes back to the queue with its unstarted deliveries"
            );
            return;
        }
        match settle {
            Settle::Ack => msg.ack().await,
            Settle::Reject => msg.reject().await,
            Settle::Requeue => msg.nack_requeue().await,
        }
    }

    /// A delivery of a channel with no provider call (in-app), made without a claim: read
    /// it due, check the due-time rules, render it, then write `sent` with its attempt and
    /// inbox row in one transaction fenced by what was read (see
    /// [`ChannelSender::inbox_content`]), and only within one lease length of the read
    /// (database clock), as a lease would have bounded it: a worker frozen longer has its
    /// rules decided again by the claim. No lease is needed, since nothing leaves the
    /// database in between and the write is whole or nothing. `None` when this path does
    /// not apply or cannot finish: the caller then goes through the claim, which decides
    /// again from the delivery as it is by then (defers, skips, fails or acks it).
    async fn deliver_unclaimed(&self, pointer: &Pointer, span: &tracing::Span) -> Option<Settle> {
        let batches = self.db.unclaimed.as_ref()?;
        let mut job = match with_db_retry("read", || batches.reads.call(pointer.id)).await {
            DbCall::Done(Some(job)) => job,
            DbCall::Unreachable => return Some(Settle::Requeue),
            DbCall::Done(None) | DbCall::Refused(_) => return None,
        };
        let due = notify_core::due::check(job.started_at, job.due_facts());
        if job.digest_key.is_some() || due != notify_core::due::Due::Now {
            return None;
        }
        let started = std::time::Instant::now();
        self.templates.apply(&self.pool, &mut job).await.ok()?;
        let content = self.sender.inbox_content(&job)?;
        span.record("notify.event_id", tracing::field::display(job.event_id));
        span.record("notify.attempt", job.attempt);
        span.record("notify.provider", job.provider.as_str());
        let outcome = notify_core::outcome::AttemptOutcome::sent(None, content)
            .with_response("inbox row written");
        let took = started.elapsed();
        let (next, mut record) = decide(
            &self.cfg.retry,
            self.sender.retry_horizon(),
            &job,
            outcome,
            rand::random(),
        );
        record.worker_id = self.cfg.worker_id.clone();
        record.call_took = took;
        let job = Arc::new(job);
        match with_db_retry("record inbox row", || {
            batches.records.call((job.clone(), record.clone()))
        })
        .await
        {
            DbCall::Done(true) => {
                info!(attempt = job.attempt, "{}", AttemptLabel::Sent);
                // The inbox write is this channel's call: its time counts, as the claim
                // path's `send` does.
                count_recorded(&job, &next, &record, None, started.elapsed());
                Some(Settle::Ack)
            }
            DbCall::Unreachable => Some(Settle::Requeue),
            DbCall::Done(false) | DbCall::Refused(_) => None,
        }
    }

    /// The consumer span of one message (OpenTelemetry messaging semantic conventions),
    /// a child of the relay's producer span named by the message's `traceparent` header.
    fn consumer_span(&self, tag: u64, pointer: &Pointer) -> tracing::Span {
        let channel = self.sender.channel();
        let queue = self.cfg.topology.queue(channel.as_str());
        let span = info_span!(
            "process",
            otel.name = %format!("{queue} process"),
            otel.kind = "consumer",
            otel.status_code = tracing::field::Empty,
            messaging.system = "rabbitmq",
            messaging.operation.type = "process",
            messaging.operation.name = "process",
            messaging.destination.name = %queue,
            messaging.message.id = %pointer.id,
            messaging.rabbitmq.message.delivery_tag = tag,
            notify.delivery_id = %pointer.id,
            notify.channel = %channel,
            notify.event_id = tracing::field::Empty,
            notify.attempt = tracing::field::Empty,
            notify.provider = tracing::field::Empty,
        );
        notify_telemetry::propagation::continue_trace(
            &span,
            pointer.traceparent.as_deref(),
            pointer.tracestate.as_deref(),
        );
        span
    }
}
