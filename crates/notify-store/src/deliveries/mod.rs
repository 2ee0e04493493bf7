//! The worker side of a delivery: claim with a lease (`claim.rs`), heartbeat and the
//! sweeper that recovers expired leases (`lease.rs`), record the attempt fenced by the
//! lease (`record.rs`), end a claim the due-time rules skip (`skip.rs`), channel pauses
//! and gauges (`channels.rs`) and the inbox rows of in-app deliveries (`inbox_rows.rs`).
//! Everything is re-exported here: callers use `notify_store::deliveries::*`.

use chrono::{DateTime, Utc};
use notify_core::{Category, Channel, Content, EndpointStatus, Priority, Provider};
use uuid::Uuid;

mod channels;
mod claim;
mod inbox_rows;
mod lease;
mod record;
mod skip;

pub use channels::{ChannelGauges, Gauges, gauges, pause_channel, paused_until};
pub use claim::{claim, claim_many, read_due_many};
pub use inbox_rows::{insert_inbox_notifications, record_inbox_sent, upsert_grouped_inbox_row};
pub use lease::{
    ExpiredLease, WORKER_LOST, extend_lease, relay_behind, republish_stale, requeue_expired_leases,
};
pub use record::{
    AttemptRecord, LateSuccess, NextState, defer_claimed, fail_unclaimed, record_attempts,
    record_attempts_with_fallbacks, record_fallback, record_late_success,
};
pub use skip::{UNREACHABLE, skip_claimed};

/// Most bytes of a provider's raw answer kept per attempt.
pub const MAX_PROVIDER_RESPONSE_BYTES: usize = 20 * 1024;

/// Everything a channel needs to send one delivery, read in the claim's round trip.
#[derive(Debug, Clone)]
pub struct DeliveryJob {
    /// Delivery id.
    pub id: Uuid,
    /// Event id.
    pub event_id: Uuid,
    /// Caller's event key.
    pub event_key: String,
    /// Notification type key.
    pub type_key: String,
    /// When the type (and so its templates) was last saved; `None` when the type is gone.
    /// Workers reuse cached templates only for the same value.
    pub type_updated_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The type's priority (drives APNs priority, FCM Android priority and Web Push
    /// `Urgency`); `normal` when the type is gone.
    pub priority: Priority,
    /// The type's category (marketing email gets List-Unsubscribe); `transactional` when
    /// the type is gone.
    pub category: Category,
    /// Digest group: the delivery lists the events in `digest_items` (in-app: the inbox
    /// group, updated in place).
    pub digest_key: Option<String>,
    /// Recipient.
    pub user_id: String,
    /// Channel.
    pub channel: Channel,
    /// Provider.
    pub provider: Provider,
    /// This attempt's number (1-based).
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Unique per channel.
    pub idempotency_key: String,
    /// LINE retry key.
    pub retry_key: Option<Uuid>,
    /// Fences every write of this attempt. Nil for a delivery read without a claim
    /// ([`read_due_many`]), which no lease fences.
    pub lease_token: Uuid,
    /// When the claim (or the read without one) happened (database clock).
    pub started_at: DateTime<Utc>,
    /// When the delivery was created (database clock).
    pub created_at: DateTime<Utc>,
    /// When it was first claimed for a provider call (this claim, for a first attempt):
    /// the LINE retry horizon counts from here.
    pub first_attempt_at: DateTime<Utc>,
    /// Email: the recipient's address as it is at the claim (`None` when they have none
    /// any more). LINE: the user id (or a multicast batch's ids) fixed at planning.
    pub address: Option<String>,
    /// Recipient's display name (may be empty).
    pub display_name: String,
    /// Recipient's locale.
    pub locale: String,
    /// Recipient's time zone.
    pub timezone: String,
    /// Event payload.
    pub payload: serde_json::Value,
    /// What to say.
    pub content: Content,
    /// Push endpoint id.
    pub endpoint_id: Option<Uuid>,
    /// Push platform.
    pub endpoint_platform: Option<String>,
    /// Push token (or Web Push endpoint URL).
    pub endpoint_token: Option<String>,
    /// Web Push subscription keys.
    pub endpoint_subscription: Option<serde_json::Value>,
    /// The push endpoint's state (`None` when the delivery names no endpoint, or its
    /// endpoint is gone).
    pub endpoint_status: Option<EndpointStatus>,
    /// The type is critical (security alert, OTP): quiet hours do not hold it.
    pub critical: bool,
    /// The recipient's quiet hours as they are now (read at the claim, so a window set
    /// after planning still holds the delivery).
    pub quiet_hours: Vec<notify_core::quiet::QuietWindow>,
    /// For an escalation (cause `escalation`): when the delivery it escalates was read
    /// (in-app `notifications.read_at`) or first clicked (`delivery_clicks`), if it was;
    /// read in the claim's statement. `None` for every other delivery.
    pub escalation_answered: Option<DateTime<Utc>>,
    /// Why the delivery exists (planned, fallback, escalation).
    pub cause: notify_core::plan::Cause,
    /// The other facts the due-time rules read ([`notify_core::due`]), as they are at the
    /// claim.
    pub due: DueState,
    /// The delivery's `state_version` when it was claimed or read: a delivery read
    /// without a claim ([`read_due_many`]) is written only while it is still this.
    pub state_version: i32,
}

/// What the due-time rules read about a claimed delivery besides quiet hours, read in the
/// claim's statement (each by primary or unique key): the recipient's preference settings
/// for the type and channel, and whether the channel still reaches the user.
#[derive(Debug, Clone, Default)]
pub struct DueState {
    /// Preference settings (type x channel, type-wide, channel-wide) with when each was
    /// set.
    pub preferences: notify_core::due::Preferences,
    /// LINE: when the delivery's LINE user id unfollowed the official account, if that is
    /// its last follow event (`line_followers`).
    pub line_unfollowed_at: Option<DateTime<Utc>>,
    /// Push: when the endpoint was revoked (`revoked_at`), if it is revoked.
    pub endpoint_revoked_at: Option<DateTime<Utc>>,
    /// Push: why the endpoint was revoked, if it is revoked.
    pub endpoint_revoked_reason: Option<String>,
    /// Email: when the delivery's address was marked undeliverable, if it is still the
    /// recipient's address and still marked.
    pub email_undeliverable_at: Option<DateTime<Utc>>,
    /// A topic event's delivery whose recipient is no longer subscribed to the topic
    /// (`topic_subscriptions`, by primary key).
    pub topic_unsubscribed: bool,
    /// Email: since when the delivery's category is suppressed for the user or the
    /// address (`email_suppressions`), if it is.
    pub email_suppressed_at: Option<DateTime<Utc>>,
}

impl DeliveryJob {
    /// The facts [`notify_core::due::check`] reads, from this claim.
    pub fn due_facts(&self) -> notify_core::due::DueFacts<'_> {
        use notify_core::due::{DueFacts, Endpoint};
        let endpoint = match (self.channel, self.endpoint_status) {
            (Channel::Push, None) => Endpoint::Gone,
            (Channel::Push, Some(EndpointStatus::Revoked)) => Endpoint::Revoked {
                at: self.due.endpoint_revoked_at,
                reason: self.due.endpoint_revoked_reason.as_deref(),
            },
            _ => Endpoint::Usable,
        };
        DueFacts {
            batch: self.provider == Provider::LineMulticast,
            preferences: self.due.preferences,
            line_unfollowed_at: self.due.line_unfollowed_at,
            endpoint,
            email_undeliverable_at: self.due.email_undeliverable_at,
            email_address_gone: self.channel == Channel::Email && self.address.is_none(),
            unsubscribed: self.due.topic_unsubscribed,
            email_suppressed_at: self.due.email_suppressed_at,
            escalation_answered: self.escalation_answered,
            ..DueFacts::new(
                self.channel,
                self.critical,
                notify_core::validate::parse_timezone(&self.timezone),
                &self.quiet_hours,
            )
        }
    }
}

/// Why a message did not lead to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Claimed: send it.
    Claimed(Box<DeliveryJob>),
    /// No such delivery: the message is poison.
    Missing,
    /// The delivery belongs to another channel than the queue it came from.
    WrongChannel(Channel),
    /// Already being sent under a live lease, already final, or not due yet: a duplicate
    /// or early message, to be acked without a provider call. Carries the status.
    NotClaimable(String),
    /// Its attempt budget was spent (every attempt was claimed, the last ones by workers
    /// that died or froze during the call): the claim made it `failed` instead, without a
    /// call. Carries the attempts made and the error now on the delivery.
    Exhausted {
        /// The delivery's provider.
        provider: Provider,
        /// Attempts made (each a claim that may have reached the provider).
        attempts: i32,
        /// `last_error` as written.
        error: String,
        /// The fallback deliveries created with the failure (one per user of a LINE
        /// multicast batch), if any.
        fallback: Vec<crate::derived::FallbackMade>,
    },
}

impl PartialEq for DeliveryJob {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.lease_token == other.lease_token
    }
}
impl Eq for DeliveryJob {}

/// After the state change `done` of delivery `id` in `tx`: false when it changed no row
/// (the delivery was not in the state the change requires, so nothing is written and the
/// caller rolls back by dropping `tx`); otherwise queues the status webhook `event` for
/// it and returns true.
async fn announce_change(
    tx: &mut sqlx::PgConnection,
    done: sqlx::postgres::PgQueryResult,
    id: Uuid,
    event: crate::webhooks::EventType,
) -> crate::Result<bool> {
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    crate::webhooks::enqueue_for_deliveries(tx, &[(id, event)]).await?;
    Ok(true)
}
