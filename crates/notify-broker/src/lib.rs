//! RabbitMQ for the platform (lapin): the topology every service declares at start, a
//! confirmed publisher, a consumer with typed settling ([`Consumer`], [`Inbound`]), and
//! the typed message that points at a delivery row.
//!
//! Topology (names get an optional prefix so that tests and tenants can share a broker):
//! - exchange `notify.deliveries` (direct, durable), routing key = channel name;
//! - one durable quorum queue per channel, `deliveries.<channel>`, with an explicit
//!   `x-delivery-limit` and `x-dead-letter-exchange = notify.dead`;
//! - exchange `notify.dead` (fanout, durable) bound to quorum queue `deliveries.dead`.

pub use lapin;

mod connection;
mod consumer;
mod dead_letters;
mod message;
mod publisher;
mod topology;
pub use connection::{FRAME_MAX, HEARTBEAT_S, addresses, connect};
pub use consumer::{Consumer, Inbound, consumer_channel};
pub use dead_letters::{dead_letter_depth, requeue_dead_letters};
pub use message::{
    DeliveryBatch, DeliveryMessage, MAX_DELIVERIES_PER_MESSAGE, Pointer, Pointers, string_headers,
};
pub use publisher::{PublishOutcome, Publisher};
pub use topology::Topology;

use std::time::Duration;

/// Errors talking to the broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A protocol or connection error from lapin.
    #[error("amqp error: {0}")]
    Amqp(#[from] lapin::Error),
    /// A publisher confirm did not arrive in time; the outcome is unknown.
    #[error("publisher confirm timed out after {0:?}")]
    ConfirmTimeout(Duration),
    /// A dead-lettered message could not be republished; it stays dead-lettered.
    #[error("republishing failed: {0}")]
    Republish(String),
}
