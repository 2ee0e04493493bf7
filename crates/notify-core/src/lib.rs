//! Domain types and pure logic of the notification platform. No I/O lives here: the
//! store, the broker, the gRPC edge and the workers are adapters around this crate.

pub mod channel;
pub mod config;
pub mod content;
pub mod due;
pub mod event;
pub mod explain;
pub mod fatigue;
pub mod guard;
pub mod line;
pub mod link_keys;
pub mod links;
pub mod named;
pub mod notification_type;
pub mod outcome;
pub mod plan;
pub mod push_endpoint;
pub mod quiet;
pub mod retry;
pub mod schedule;
pub mod sensitive;
pub mod signed;
pub mod spellings;
pub mod states;
pub mod status;
pub mod template;
#[cfg(test)]
mod test_fixtures;
pub mod text;
pub mod validate;
pub mod webhook;

pub use channel::{Channel, DeliveryStatus, Provider};
pub use content::{Action, Badge, Content, Overrides};
pub use event::NewEvent;
pub use named::UnknownValue;
pub use notification_type::{Category, Priority, SensitiveData};
pub use outcome::{AttemptOutcome, ErrorClass};
pub use plan::{PlannedDelivery, RecipientFacts, SkipReason, SkippedDelivery};
pub use retry::RetryPolicy;
pub use states::{AttemptLabel, EndpointStatus, FailReason, MessageStatus};
pub use status::{FanoutStatus, InboxStatus};
pub use validate::FieldViolation;
