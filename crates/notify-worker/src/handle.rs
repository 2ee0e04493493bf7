//! Handling one consumed message: parse, claim, due check (send, defer or skip), template,
//! provider call, decision, record, ack. In-app first tries the same without a claim
//! (`deliver_unclaimed`: read, due check, template, one fenced write).

use crate::consume::Ctx;
use crate::db::{DbCall, with_db_retry};
use crate::decide::decide;
use crate::record_metrics::count_recorded;
use crate::{ChannelSender, lease};
use notify_broker::{Inbound, Pointer, Pointers};
use notify_core::{AttemptLabel, FailReason};
use notify_store::deliveries::{self, ClaimOutcome, NextState};
use std::sync::Arc;
use tracing::{Instrument, error, info, info_span, warn};

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
fn withdrawn_failure(job: &notify_store::deliveries::DeliveryJob, late: &deliveries::LateSuccess) {
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

    /// One delivery of a message from claim to record; answers how the message should be
    /// settled as far as this delivery is concerned.
    async fn handle_delivery(&self, message_channel: &str, pointer: &Pointer, tag: u64) -> Settle {
        let channel = self.sender.channel();
        let span = self.consumer_span(tag, pointer);
        let s = span.clone();
        async {
            if message_channel != channel.as_str() {
                warn!(%message_channel, "message for another channel: dead-lettered");
                let _ = deliveries::fail_unclaimed(&self.pool, pointer.id, FailReason::UnsupportedChannel).await;
                return Settle::Reject;
            }
            if let Some(settle) = self.deliver_unclaimed(pointer, &s).await {
                return settle;
            }
            // Asked before the claim: the lease is held at least until then + its length.
            let asked = tokio::time::Instant::now();
            let claimed = with_db_retry("claim", || self.db.claims.call(pointer.id)).await;
            let job = match claimed {
                DbCall::Unreachable => return Settle::Requeue,
                DbCall::Refused(_) => {
                    // Nothing was claimed, so no call was made; the delivery stays as it is
                    // and the sweeper republishes it later (with growing spacing).
                    warn!("claim refused by the database: dead-lettered");
                    return Settle::Reject;
                }
                DbCall::Done(ClaimOutcome::Missing) => {
                    warn!("message names no delivery: dead-lettered");
                    return Settle::Reject;
                }
                DbCall::Done(ClaimOutcome::WrongChannel(actual)) => {
                    warn!(%actual, "delivery belongs to another channel: dead-lettered");
                    let _ = deliveries::fail_unclaimed(&self.pool, pointer.id, FailReason::UnsupportedChannel).await;
                    return Settle::Reject;
                }
                DbCall::Done(ClaimOutcome::NotClaimable(status)) => {
                    info!(%status, "duplicate or early message: acked without sending");
                    return Settle::Ack;
                }
                DbCall::Done(ClaimOutcome::Exhausted { provider, attempts, fallback, .. }) => {
                    // Every attempt was spent, the last ones by workers that died during the
                    // call: the claim failed it instead of calling the provider again.
                    for f in fallback {
                        notify_telemetry::metrics::count_fallback(f.from.as_str(), f.to.as_str(), FailReason::AttemptsSpent.as_str());
                    }
                    let m = notify_telemetry::metrics();
                    let [c, p] = notify_telemetry::metrics::channel_provider(channel.as_str(), provider.as_str());
                    m.deliveries_failed.add(1, &[c, p, opentelemetry::KeyValue::new("reason", FailReason::AttemptsSpent.as_str())]);
                    error!(attempts, reason = FailReason::AttemptsSpent.as_str(), alert = "delivery_failed",
                        "delivery failed: its attempt budget was spent (workers died during the calls); no further call");
                    return Settle::Ack;
                }
                DbCall::Done(ClaimOutcome::Claimed(job)) => job,
            };
            // The rules that decide whether a delivery may go out now are checked here,
            // when it is due, whatever made it due (first send, scheduled send, retry,
            // fatigue slot, digest close, recovery), on the database clock of the claim,
            // with the facts (preferences, follow state, endpoint, address) the claim read.
            match notify_core::due::check(job.started_at, job.due_facts()) {
                notify_core::due::Due::Now => {}
                notify_core::due::Due::Defer { until, why } => {
                    match with_db_retry("defer", || deliveries::defer_claimed(&self.pool, &job, until, &why)).await {
                        DbCall::Unreachable => return Settle::Requeue,
                        DbCall::Done(true) => info!(until = %until.to_rfc3339(), "due inside the recipient's quiet hours: deferred without a call"),
                        DbCall::Done(false) => warn!("lease lost before deferring; nothing written"),
                        DbCall::Refused(_) => {}
                    }
                    return Settle::Ack;
                }
                notify_core::due::Due::Skip { reason, why } => {
                    match with_db_retry("skip", || deliveries::skip_claimed(&self.pool, &job, reason, &why)).await {
                        DbCall::Unreachable => return Settle::Requeue,
                        DbCall::Done(true) => {
                            let m = notify_telemetry::metrics();
                            m.deliveries_skipped.add(1, &[
                                opentelemetry::KeyValue::new("channel", job.channel.as_str()),
                                opentelemetry::KeyValue::new("reason", reason.as_str()),
                            ]);
                            if reason == notify_core::SkipReason::Read {
                                m.escalations.add(1, &[opentelemetry::KeyValue::new("outcome", "skipped_read")]);
                            }
                            info!(reason = reason.as_str(), "skipped when due");
                        }
                        DbCall::Done(false) => warn!("lease lost before skipping; nothing written"),
                        // Nothing was written: the lease runs out and the sweeper returns the
                        // delivery to pending, where the next claim decides again.
                        DbCall::Refused(_) => warn!(reason = reason.as_str(), "skip refused by the database; left to the sweeper"),
                    }
                    return Settle::Ack;
                }
            }
            let mut job = job;
            s.record("notify.event_id", tracing::field::display(job.event_id));
            s.record("notify.attempt", job.attempt);
            s.record("notify.provider", job.provider.as_str());
            let lease = lease::Lease::new(self.pool.clone(), job.id, job.lease_token, self.cfg.lease, asked);
            let started = std::time::Instant::now();
            let outcome = match self.templates.apply(&self.pool, &mut job).await {
                Ok(()) => self.send_with_heartbeat(&job, &lease).await,
                Err(failed) => failed,
            };
            let took = started.elapsed();
            if lease.abandoned() {
                // No provider call was made after the lease was found gone; whoever holds
                // the delivery now (or the sweeper) sends it. Any record would match nothing.
                warn!(attempt = job.attempt, "lease lost before the provider call: call abandoned, nothing written");
                return Settle::Ack;
            }
            let error = outcome.error().cloned();
            let jitter: f64 = rand::random();
            let (next, mut record) = decide(&self.cfg.retry, self.sender.retry_horizon(), &job, outcome, jitter);
            record.worker_id = self.cfg.worker_id.clone();
            // A retry's delay counts from the provider's answer.
            record.call_took = took;
            // Logs name the failure's class and the provider status only: the full error
            // (which can quote payload values or provider text) goes to Postgres, where
            // the console shows it.
            let reason = error.as_ref().map(|e| e.reason.as_str()).unwrap_or_default();
            let status = record.provider_status.unwrap_or(0);
            match &next {
                NextState::Sent { .. } => info!(attempt = job.attempt, "{}", AttemptLabel::Sent),
                NextState::Retry { after, .. } => {
                    warn!(attempt = job.attempt, retry_in_ms = after.as_millis() as u64, %reason, provider_status = status, "attempt failed; retry scheduled")
                }
                NextState::Failed { .. } => {
                    error!(attempt = job.attempt, %reason, provider_status = status, alert = "delivery_failed", "delivery failed; the full error is on the delivery (GetEvent, console)")
                }
                NextState::Paused { after, .. } => {
                    error!(%reason, paused_for_s = after.as_secs(), alert = "channel_paused",
                        "channel paused (provider quota spent); its deliveries wait without spending attempts")
                }
                NextState::Unavailable { after, .. } => {
                    // No alert line per wake-up: the pause is the `notify_channel_paused`
                    // gauge, and the breakers' own transitions are logged and counted.
                    warn!(%reason, paused_for_ms = after.as_millis() as u64,
                        "no provider can take the call (every breaker open): claim given back, no attempt; channel paused")
                }
            }
            let job = Arc::new(*job);
            let recorded = with_db_retry("record attempt", || {
                self.db.records.call((job.clone(), next.clone(), record.clone()))
            })
            .await;
            match recorded {
                DbCall::Unreachable => Settle::Requeue,
                DbCall::Refused(e) => {
                    // The full record cannot be stored (and never will be): end the
                    // delivery visibly rather than let its lease expire and call again.
                    let sent = match &next {
                        NextState::Sent { provider_message_id } => Some(provider_message_id.clone()),
                        _ => None,
                    };
                    let why = format!(
                        "{}: the attempt's record was refused by the database ({}); the delivery was ended instead of being sent again",
                        FailReason::RecordFailed,
                        notify_store::truncate_utf8(&e.to_string(), 300)
                    );
                    let ended = with_db_retry("record fallback", || {
                        deliveries::record_fallback(&self.pool, &job, sent.clone(), &why)
                    })
                    .await;
                    if matches!(ended, DbCall::Unreachable) {
                        return Settle::Requeue;
                    }
                    if sent.is_none() {
                        let m = notify_telemetry::metrics();
                        let labels = notify_telemetry::metrics::channel_provider(job.channel.as_str(), job.provider.as_str());
                        let [c, p] = labels;
                        m.deliveries_failed.add(1, &[c, p, opentelemetry::KeyValue::new("reason", FailReason::RecordFailed.as_str())]);
                        error!(attempt = job.attempt, reason = FailReason::RecordFailed.as_str(), alert = "delivery_failed",
                            "delivery failed: its attempt could not be recorded; ended without another call");
                    }
                    Settle::Ack
                }
                DbCall::Done(false) if matches!(next, NextState::Sent { .. }) => {
                    // The provider accepted after the lease was taken. If the sweeper put the
                    // delivery back and nobody claimed it again, this success is the truth:
                    // record it rather than sending a second time.
                    let late = with_db_retry("record late success", || {
                        deliveries::record_late_success(&self.pool, &job, &next, &record)
                    })
                    .await;
                    match late {
                        DbCall::Done(Some(late)) => {
                            warn!(attempt = job.attempt, "lease lost during the call, but the provider accepted and nobody claimed the delivery again: success recorded");
                            count_recorded(&job, &next, &record, error.as_ref(), took);
                            if late.was_failed {
                                withdrawn_failure(&job, &late);
                            }
                        }
                        DbCall::Done(None) => warn!("lease lost before recording: another worker owns this delivery now; nothing written"),
                        DbCall::Unreachable | DbCall::Refused(_) => {}
                    }
                    Settle::Ack
                }
                DbCall::Done(false) => {
                    warn!("lease lost before recording: another worker owns this delivery now; nothing written");
                    Settle::Ack
                }
                DbCall::Done(true) => {
                    count_recorded(&job, &next, &record, error.as_ref(), took);
                    Settle::Ack
                }
            }
        }
        .instrument(span)
        .await
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
