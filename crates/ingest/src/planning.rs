//! Planning helpers shared by the group-commit writer and the topic fan-out: what turns
//! `notify_core`'s planned deliveries into rows to insert.

use crate::clock::Clock;
use chrono::{DateTime, Utc};
use notify_core::event::Schedule;
use notify_core::plan::{Cause, Derivation};
use notify_core::{FieldViolation, Provider};
use notify_store::StoreError;
use notify_store::events::NewDelivery;
use std::collections::HashMap;
use uuid::Uuid;

/// The due time of each scheduled request (`send_at` or `delay`) at the planning clock's
/// instant, read once (not at all when nothing is scheduled): `Ok(None)` for a request
/// sent now (unscheduled, a `send_at` in the past, a zero delay), a violation of the
/// field for one due more than `horizon` after that instant.
///
/// # Errors
/// `StoreError` when the clock (the database) cannot be read.
pub async fn due_times(
    conn: &mut notify_store::sqlx::PgConnection,
    clock: &Clock,
    horizon: std::time::Duration,
    schedules: &[Option<Schedule>],
) -> Result<Vec<Result<Option<DateTime<Utc>>, FieldViolation>>, StoreError> {
    if schedules.iter().all(Option::is_none) {
        return Ok(vec![Ok(None); schedules.len()]);
    }
    let now = clock.now(conn).await?;
    Ok(schedules
        .iter()
        .map(|s| s.map_or(Ok(None), |s| s.due(now, horizon)))
        .collect())
}

/// Gives planned deliveries their ids (and LINE its retry key, fixed before any call), each
/// with `max_attempts` attempts. An escalation gets `caused_by` = the id given here to the
/// delivery it escalates (its `parent_key`), when that delivery is in the same list.
pub fn new_deliveries(
    planned: Vec<notify_core::PlannedDelivery>,
    max_attempts: i32,
) -> Vec<NewDelivery> {
    let mut out: Vec<NewDelivery> = planned
        .into_iter()
        .map(|p| NewDelivery {
            // Time-ordered (RFC 9562 version 7): new rows land at the right edge of the
            // primary-key index instead of on random pages.
            id: Uuid::now_v7(),
            retry_key: matches!(p.provider, Provider::Line | Provider::LineMulticast)
                .then(Uuid::new_v4),
            plan: p,
            max_attempts,
            caused_by: None,
        })
        .collect();
    if out.iter().any(|d| d.plan.parent_key.is_some()) {
        let ids: HashMap<String, Uuid> = out
            .iter()
            .map(|d| (d.plan.idempotency_key.clone(), d.id))
            .collect();
        for d in &mut out {
            d.caused_by = d.plan.parent_key.as_ref().and_then(|k| ids.get(k).copied());
        }
    }
    out
}

/// Adds the type's derived deliveries (fallbacks for unreachable channels, escalations) to
/// one planning run's output: [`notify_core::plan::derive`], called between `plan` and the
/// fatigue caps, so a derived delivery is capped like a planned one. `at` is the planning
/// instant and whether the event is scheduled (see [`notify_core::plan::plan`]).
pub fn add_derived(
    event_id: Uuid,
    critical: bool,
    derivation: &Derivation,
    recipients: &[notify_core::RecipientFacts],
    at: (chrono::DateTime<chrono::Utc>, bool),
    planned: &mut Vec<notify_core::PlannedDelivery>,
    skipped: &mut Vec<notify_core::SkippedDelivery>,
) {
    notify_core::plan::derive(
        event_id, critical, derivation, recipients, at, planned, skipped,
    );
}

/// Counts the derived deliveries of a committed planning run:
/// `notify_fallbacks_total{from,to,cause="unreachable"}` (`from`: the first channel of
/// the list the user was skipped on) and `notify_escalations_total{outcome="created"}`.
pub fn count_derived(
    derivation: &Derivation,
    deliveries: &[NewDelivery],
    skipped: &[notify_core::SkippedDelivery],
) {
    if derivation.is_empty() {
        return;
    }
    let m = notify_telemetry::metrics();
    for d in deliveries {
        match d.plan.cause {
            Cause::Fallback => {
                let from = derivation
                    .fallback_channels
                    .iter()
                    .find(|c| {
                        skipped
                            .iter()
                            .any(|s| s.user_id == d.plan.user_id && s.channel == **c)
                    })
                    .map_or("", |c| c.as_str());
                m.fallbacks.add(
                    1,
                    &notify_telemetry::metrics::fallback_labels(
                        from,
                        d.plan.channel.as_str(),
                        "unreachable",
                    ),
                );
            }
            Cause::Escalation => m
                .escalations
                .add(1, &[opentelemetry::KeyValue::new("outcome", "created")]),
            Cause::Planned => {}
        }
    }
}
