//! The worker runtime shared by `worker-email`, `worker-push`, `worker-line` and
//! `worker-inapp`. A channel implements [`ChannelSender`]; the runtime does the rest:
//!
//! 1. consume the channel's queue with prefetch = concurrency and manual acks;
//! 2. claim the delivery row with a lease (database clock); a message whose delivery is
//!    already claimed, final or not due yet is acked without a provider call;
//! 3. call the provider with no transaction open, extending the lease while it runs; the
//!    adapter confirms the lease ([`Lease::confirm`]) at the call's point of no return and
//!    abandons a call whose lease is gone (nothing is written, the message is acked); the
//!    call has a total deadline ([`ChannelSender::call_deadline`]), after which it ends as
//!    an ambiguous `<provider>_timeout`, retried per policy;
//! 4. record the attempt and the new state in one transaction fenced by the lease token;
//! 5. ack only after that commit. Unparseable messages and messages naming a delivery that
//!    does not exist (or belongs to another channel) are rejected to the dead-letter queue.

pub mod batch;
mod bin_main;
mod config;
mod consume;
mod db;
mod decide;
mod handle;
mod heartbeat;
pub mod http;
pub mod lease;
pub mod limit;
mod readiness;
pub use notify_telemetry::reconnect;
mod record_metrics;
pub mod templates;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use bin_main::{main_with, serve_admin};
pub use config::{DEFAULT_RATE_LIMITS, WorkerConfig, parse_rate_limits};
pub use consume::{Handler, WorkerError, run, serve};
pub use decide::decide;
pub use lease::{Lease, LeaseLost};
pub use notify_store::deliveries::DeliveryJob as Job;
pub use readiness::Readiness;

use notify_core::Channel;
use notify_core::outcome::AttemptOutcome;
use notify_store::deliveries::DeliveryJob;
use std::future::Future;
use std::time::Duration;

/// [`ChannelSender::call_deadline`] of a channel that does not state its own.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_secs(30);

/// One channel's provider adapter. It sorts every provider answer into an
/// [`AttemptOutcome`]; it never touches the delivery state itself.
pub trait ChannelSender: Send + Sync + 'static {
    /// The channel this sender serves (its queue is `deliveries.<channel>`).
    fn channel(&self) -> Channel;

    /// How long after a delivery's creation a retry may still start, if the provider limits
    /// it (LINE: a retry key is honoured for 24 hours). `None`: no limit beyond the policy.
    fn retry_horizon(&self) -> Option<Duration> {
        None
    }

    /// The total deadline of one [`ChannelSender::send`], from its start to the provider's
    /// final answer. The runtime ends a call still running then, as an ambiguous
    /// `<provider>_timeout` (the provider may have accepted it), retried per policy.
    /// Adapters enforce their own timeouts within it, so they can say which step hung.
    fn call_deadline(&self) -> Duration {
        DEFAULT_CALL_DEADLINE
    }

    /// A channel whose delivery is the inbox row in our own database (in-app) answers the
    /// row's content here; the default, `None`, is a channel with a provider call. With
    /// `Some`, the runtime delivers without a claim or lease: it reads the due delivery,
    /// checks the due-time rules, renders it, then writes `sent`, the attempt and this
    /// inbox row in one transaction fenced by what it read
    /// ([`notify_store::deliveries::record_inbox_sent`]). Whatever that path cannot
    /// finish (a rule that defers or skips, a template error, a digest group, a delivery
    /// changed in between) goes through the claim and [`ChannelSender::send`] instead.
    fn inbox_content(&self, _job: &DeliveryJob) -> Option<serde_json::Value> {
        None
    }

    /// Makes one provider call for `job` and reports what happened. Must not panic on
    /// provider errors. Right before its point of no return (SMTP `DATA`, writing the HTTP
    /// request, the inbox insert) it must call [`Lease::confirm`] on `lease` and, when
    /// that fails, make no call and return [`LeaseLost::outcome`].
    fn send(&self, job: &DeliveryJob, lease: &Lease)
    -> impl Future<Output = AttemptOutcome> + Send;
}
