//! One delivery of a message as steps that each answer what happens next (the next
//! step's input, or how the message is settled): queue check, claim, due check (defer or
//! skip), render and call, decide and log, record (and its fallback or a late success).

use super::{Settle, withdrawn_failure};
use crate::consume::Ctx;
use crate::db::{DbCall, with_db_retry};
use crate::decide::decide;
use crate::record_metrics::count_recorded;
use crate::{ChannelSender, lease};
use notify_broker::Pointer;
use notify_core::outcome::{AttemptError, AttemptOutcome};
use notify_core::{AttemptLabel, FailReason};
use notify_store::deliveries::{self, AttemptRecord, ClaimOutcome, DeliveryJob, NextState};
use std::ops::ControlFlow;
use std::sync::Arc;
use tracing::{Instrument, error, info, warn};

/// What happens after a step of a delivery: `Continue` with the next step's input, or
/// `Break` with how the message is settled as far as this delivery is concerned.
type Next<T> = ControlFlow<Settle, T>;

/// A claimed delivery after its provider call.
struct Called {
    /// The job, rendered.
    job: Box<DeliveryJob>,
    /// The provider's verdict (or the template's failure).
    outcome: AttemptOutcome,
    /// From the render's start to the provider's answer.
    took: std::time::Duration,
}

/// A called delivery with its next state and the attempt to record.
struct Decided {
    /// The job, shared with the batched record.
    job: Arc<DeliveryJob>,
    /// The delivery's next state.
    next: NextState,
    /// The attempt's row.
    record: AttemptRecord,
    /// The attempt's failure, if it failed.
    error: Option<AttemptError>,
    /// From the render's start to the provider's answer.
    took: std::time::Duration,
}

use notify_telemetry::metrics::delivery_failed;

impl<S: ChannelSender> Ctx<S> {
    /// One delivery of a message from claim to record; answers how the message should be
    /// settled as far as this delivery is concerned. Each step answers what happens next:
    /// the next step's input, or how the message is settled.
    pub(super) async fn handle_delivery(
        &self,
        message_channel: &str,
        pointer: &Pointer,
        tag: u64,
    ) -> Settle {
        let span = self.consumer_span(tag, pointer);
        let s = span.clone();
        async {
            match self.delivery_steps(message_channel, pointer, &s).await {
                ControlFlow::Break(settle) | ControlFlow::Continue(settle) => settle,
            }
        }
        .instrument(span)
        .await
    }

    /// The steps of [`Self::handle_delivery`], in order: queue check, the in-app path
    /// without a claim, claim, due check (defer or skip), render and call, decide, record.
    async fn delivery_steps(
        &self,
        message_channel: &str,
        pointer: &Pointer,
        span: &tracing::Span,
    ) -> Next<Settle> {
        self.check_queue(message_channel, pointer).await?;
        if let Some(settle) = self.deliver_unclaimed(pointer, span).await {
            return ControlFlow::Break(settle);
        }
        // Asked before the claim: the lease is held at least until then + its length.
        let asked = tokio::time::Instant::now();
        let job = self.claim(pointer).await?;
        self.check_due(&job).await?;
        let called = self.render_and_call(job, asked, span).await?;
        let decided = self.decide_attempt(called);
        ControlFlow::Continue(self.record(decided).await)
    }

    /// A message that came through another channel's queue is dead-lettered, and the
    /// delivery it names failed (`unsupported_channel`) if it is still pending.
    async fn check_queue(&self, message_channel: &str, pointer: &Pointer) -> Next<()> {
        if message_channel == self.sender.channel().as_str() {
            return ControlFlow::Continue(());
        }
        warn!(%message_channel, "message for another channel: dead-lettered");
        self.fail_unsupported(pointer).await;
        ControlFlow::Break(Settle::Reject)
    }

    /// Fails the pointed delivery, still pending, as `unsupported_channel` (best effort:
    /// the message is dead-lettered whatever the answer).
    async fn fail_unsupported(&self, pointer: &Pointer) {
        let _ = deliveries::fail_unclaimed(&self.pool, pointer.id, FailReason::UnsupportedChannel)
            .await;
    }

    /// Claims the delivery: the job to send, or how the message is settled when there is
    /// none (database unreachable or refusing, no such delivery, another channel's, a
    /// duplicate or early message, an attempt budget already spent).
    async fn claim(&self, pointer: &Pointer) -> Next<Box<DeliveryJob>> {
        let claimed = with_db_retry("claim", || self.db.claims.call(pointer.id)).await;
        ControlFlow::Break(match claimed {
            DbCall::Done(ClaimOutcome::Claimed(job)) => return ControlFlow::Continue(job),
            DbCall::Unreachable => Settle::Requeue,
            DbCall::Refused(_) => {
                // Nothing was claimed, so no call was made; the delivery stays as it is
                // and the sweeper republishes it later (with growing spacing).
                warn!("claim refused by the database: dead-lettered");
                Settle::Reject
            }
            DbCall::Done(ClaimOutcome::Missing) => {
                warn!("message names no delivery: dead-lettered");
                Settle::Reject
            }
            DbCall::Done(ClaimOutcome::WrongChannel(actual)) => {
                warn!(%actual, "delivery belongs to another channel: dead-lettered");
                self.fail_unsupported(pointer).await;
                Settle::Reject
            }
            DbCall::Done(ClaimOutcome::NotClaimable(status)) => {
                info!(%status, "duplicate or early message: acked without sending");
                Settle::Ack
            }
            DbCall::Done(ClaimOutcome::Exhausted {
                provider,
                attempts,
                fallback,
                ..
            }) => {
                // Every attempt was spent, the last ones by workers that died during the
                // call: the claim failed it instead of calling the provider again.
                let reason = FailReason::AttemptsSpent;
                for f in fallback {
                    notify_telemetry::metrics::count_fallback(
                        f.from.as_str(),
                        f.to.as_str(),
                        reason.as_str(),
                    );
                }
                delivery_failed(
                    self.sender.channel(),
                    provider,
                    attempts,
                    reason,
                    "its attempt budget was spent (workers died during the calls); no further call",
                );
                Settle::Ack
            }
        })
    }

    /// The rules that decide whether a delivery may go out now are checked here, when it
    /// is due, whatever made it due (first send, scheduled send, retry, fatigue slot,
    /// digest close, recovery), on the database clock of the claim, with the facts
    /// (preferences, follow state, endpoint, address) the claim read: go on when it may go
    /// now, else it is deferred or skipped and the message settled.
    async fn check_due(&self, job: &DeliveryJob) -> Next<()> {
        use notify_core::due::Due;
        ControlFlow::Break(
            match notify_core::due::check(job.started_at, job.due_facts()) {
                Due::Now => return ControlFlow::Continue(()),
                Due::Defer { until, why } => self.defer(job, until, &why).await,
                Due::Skip { reason, why } => self.skip(job, reason, &why).await,
            },
        )
    }

    /// Gives the claim back until `until` (quiet hours) without a call.
    async fn defer(
        &self,
        job: &DeliveryJob,
        until: chrono::DateTime<chrono::Utc>,
        why: &str,
    ) -> Settle {
        match with_db_retry("defer", || {
            deliveries::defer_claimed(&self.pool, job, until, why)
        })
        .await
        {
            DbCall::Unreachable => return Settle::Requeue,
            DbCall::Done(true) => info!(
                until = %until.to_rfc3339(),
                "due inside the recipient's quiet hours: deferred without a call"
            ),
            DbCall::Done(false) => warn!("lease lost before deferring; nothing written"),
            DbCall::Refused(_) => {}
        }
        Settle::Ack
    }

    /// Ends the claimed delivery `skipped` for `reason` without a call, and counts it.
    async fn skip(&self, job: &DeliveryJob, reason: notify_core::SkipReason, why: &str) -> Settle {
        match with_db_retry("skip", || {
            deliveries::skip_claimed(&self.pool, job, reason, why)
        })
        .await
        {
            DbCall::Unreachable => return Settle::Requeue,
            DbCall::Done(true) => {
                let m = notify_telemetry::metrics();
                m.deliveries_skipped.add(
                    1,
                    &[
                        opentelemetry::KeyValue::new("channel", job.channel.as_str()),
                        opentelemetry::KeyValue::new("reason", reason.as_str()),
                    ],
                );
                if reason == notify_core::SkipReason::Read {
                    m.escalations.add(
                        1,
                        &[opentelemetry::KeyValue::new("outcome", "skipped_read")],
                    );
                }
                info!(reason = reason.as_str(), "skipped when due");
            }
            DbCall::Done(false) => warn!("lease lost before skipping; nothing written"),
            // Nothing was written: the lease runs out and the sweeper returns the
            // delivery to pending, where the next claim decides again.
            DbCall::Refused(_) => warn!(
                reason = reason.as_str(),
                "skip refused by the database; left to the sweeper"
            ),
        }
        Settle::Ack
    }

    /// Renders the claimed delivery's templates and makes the provider call under the
    /// lease's heartbeat: the outcome, or an ack when the lease was found lost before the
    /// call (whoever holds the delivery now, or the sweeper, sends it; any record would
    /// match nothing).
    async fn render_and_call(
        &self,
        mut job: Box<DeliveryJob>,
        asked: tokio::time::Instant,
        span: &tracing::Span,
    ) -> Next<Called> {
        span.record("notify.event_id", tracing::field::display(job.event_id));
        span.record("notify.attempt", job.attempt);
        span.record("notify.provider", job.provider.as_str());
        let lease = lease::Lease::new(
            self.pool.clone(),
            job.id,
            job.lease_token,
            self.cfg.lease,
            asked,
        );
        let started = std::time::Instant::now();
        let outcome = match self.templates.apply(&self.pool, &mut job).await {
            Ok(()) => self.send_with_heartbeat(&job, &lease).await,
            Err(failed) => failed,
        };
        let took = started.elapsed();
        if lease.abandoned() {
            warn!(
                attempt = job.attempt,
                "lease lost before the provider call: call abandoned, nothing written"
            );
            return ControlFlow::Break(Settle::Ack);
        }
        ControlFlow::Continue(Called { job, outcome, took })
    }

    /// The delivery's next state and the attempt's record, from the call's outcome, and
    /// its log line. Logs name the failure's class and the provider status only: the full
    /// error (which can quote payload values or provider text) goes to Postgres, where
    /// the console shows it.
    fn decide_attempt(&self, called: Called) -> Decided {
        let Called { job, outcome, took } = called;
        let error = outcome.error().cloned();
        let jitter: f64 = rand::random();
        let (next, mut record) = decide(
            &self.cfg.retry,
            self.sender.retry_horizon(),
            &job,
            outcome,
            jitter,
        );
        record.worker_id = self.cfg.worker_id.clone();
        // A retry's delay counts from the provider's answer.
        record.call_took = took;
        let reason = error
            .as_ref()
            .map(|e| e.reason.as_str())
            .unwrap_or_default();
        let status = record.provider_status.unwrap_or(0);
        match &next {
            NextState::Sent { .. } => info!(attempt = job.attempt, "{}", AttemptLabel::Sent),
            NextState::Retry { after, .. } => warn!(
                attempt = job.attempt,
                retry_in_ms = after.as_millis() as u64,
                %reason,
                provider_status = status,
                "attempt failed; retry scheduled"
            ),
            // Counted with the record, after its commit (`count_recorded`).
            NextState::Failed { .. } => error!(
                attempt = job.attempt,
                %reason,
                provider_status = status,
                alert = "delivery_failed",
                "delivery failed; the full error is on the delivery (GetEvent, console)"
            ),
            NextState::Paused { after, .. } => error!(
                %reason,
                paused_for_s = after.as_secs(),
                alert = "channel_paused",
                "channel paused (provider quota spent); its deliveries wait without spending attempts"
            ),
            // No alert line per wake-up: the pause is the `notify_channel_paused` gauge,
            // and the breakers' own transitions are logged and counted.
            NextState::Unavailable { after, .. } => warn!(
                %reason,
                paused_for_ms = after.as_millis() as u64,
                "no provider can take the call (every breaker open): claim given back, no attempt; channel paused"
            ),
        }
        Decided {
            job: Arc::new(*job),
            next,
            record,
            error,
            took,
        }
    }

    /// Records the attempt and the delivery's next state, fenced by the lease, and counts
    /// it once committed; a record the database refuses ends the delivery
    /// ([`Self::record_fallback`]); a success whose lease was lost is recorded if nobody
    /// claimed the delivery since ([`Self::record_late_success`]).
    async fn record(&self, d: Decided) -> Settle {
        let recorded = with_db_retry("record attempt", || {
            self.db
                .records
                .call((d.job.clone(), d.next.clone(), d.record.clone()))
        })
        .await;
        match recorded {
            DbCall::Unreachable => Settle::Requeue,
            DbCall::Refused(e) => self.record_fallback(&d, &e).await,
            DbCall::Done(false) if matches!(d.next, NextState::Sent { .. }) => {
                self.record_late_success(&d).await
            }
            DbCall::Done(false) => {
                warn!(
                    "lease lost before recording: another worker owns this delivery now; nothing written"
                );
                Settle::Ack
            }
            DbCall::Done(true) => {
                count_recorded(&d.job, &d.next, &d.record, d.error.as_ref(), d.took);
                Settle::Ack
            }
        }
    }

    /// The full record cannot be stored (and never will be): end the delivery visibly
    /// rather than let its lease expire and call again.
    async fn record_fallback(&self, d: &Decided, refused: &notify_store::StoreError) -> Settle {
        let job = &d.job;
        let sent = match &d.next {
            NextState::Sent {
                provider_message_id,
            } => Some(provider_message_id.clone()),
            _ => None,
        };
        let why = format!(
            "{}: the attempt's record was refused by the database ({}); the delivery was ended instead of being sent again",
            FailReason::RecordFailed,
            notify_store::truncate_utf8(&refused.to_string(), 300)
        );
        let ended = with_db_retry("record fallback", || {
            deliveries::record_fallback(&self.pool, job, sent.clone(), &why)
        })
        .await;
        if matches!(ended, DbCall::Unreachable) {
            return Settle::Requeue;
        }
        if sent.is_none() {
            delivery_failed(
                job.channel,
                job.provider,
                job.attempt,
                FailReason::RecordFailed,
                "its attempt could not be recorded; ended without another call",
            );
        }
        Settle::Ack
    }

    /// The provider accepted after the lease was taken. If the sweeper put the delivery
    /// back and nobody claimed it again, this success is the truth: record it rather than
    /// sending a second time.
    async fn record_late_success(&self, d: &Decided) -> Settle {
        let late = with_db_retry("record late success", || {
            deliveries::record_late_success(&self.pool, &d.job, &d.next, &d.record)
        })
        .await;
        match late {
            DbCall::Done(Some(late)) => {
                warn!(
                    attempt = d.job.attempt,
                    "lease lost during the call, but the provider accepted and nobody claimed the delivery again: success recorded"
                );
                count_recorded(&d.job, &d.next, &d.record, d.error.as_ref(), d.took);
                if late.was_failed {
                    withdrawn_failure(&d.job, &late);
                }
            }
            DbCall::Done(None) => warn!(
                "lease lost before recording: another worker owns this delivery now; nothing written"
            ),
            DbCall::Unreachable | DbCall::Refused(_) => {}
        }
        Settle::Ack
    }
}
