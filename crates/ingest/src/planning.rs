//! Planning helpers shared by the group-commit writer and the topic fan-out: what turns
//! `notify_core`'s planned deliveries into rows to insert.

use notify_core::Provider;
use notify_store::events::NewDelivery;
use uuid::Uuid;

/// Gives planned deliveries their ids (and LINE its retry key, fixed before any call), each
/// with `max_attempts` attempts.
pub fn new_deliveries(
    planned: Vec<notify_core::PlannedDelivery>,
    max_attempts: i32,
) -> Vec<NewDelivery> {
    planned
        .into_iter()
        .map(|p| NewDelivery {
            // Time-ordered (RFC 9562 version 7): new rows land at the right edge of the
            // primary-key index instead of on random pages.
            id: Uuid::now_v7(),
            retry_key: matches!(p.provider, Provider::Line | Provider::LineMulticast)
                .then(Uuid::new_v4),
            plan: p,
            max_attempts,
        })
        .collect()
}
