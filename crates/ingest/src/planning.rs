//! Planning helpers shared by the group-commit writer and the topic fan-out: what turns
//! `notify_core`'s planned deliveries into rows to insert.

use crate::clock::Clock;
use chrono::{DateTime, Utc};
use notify_core::event::Schedule;
use notify_core::{FieldViolation, Provider};
use notify_store::events::NewDelivery;
use notify_store::{PgPool, StoreError};
use uuid::Uuid;

/// The due time of each scheduled request (`send_at` or `delay`) at the planning clock's
/// instant, read once (not at all when nothing is scheduled): `Ok(None)` for a request
/// sent now (unscheduled, a `send_at` in the past, a zero delay), a violation of the
/// field for one due more than `horizon` after that instant.
///
/// # Errors
/// `StoreError` when the clock (the database) cannot be read.
pub async fn due_times(
    pool: &PgPool,
    clock: &Clock,
    horizon: std::time::Duration,
    schedules: &[Option<Schedule>],
) -> Result<Vec<Result<Option<DateTime<Utc>>, FieldViolation>>, StoreError> {
    if schedules.iter().all(Option::is_none) {
        return Ok(vec![Ok(None); schedules.len()]);
    }
    let mut conn = pool.acquire().await?;
    let now = clock.now(&mut conn).await?;
    Ok(schedules
        .iter()
        .map(|s| s.map_or(Ok(None), |s| s.due(now, horizon)))
        .collect())
}

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
