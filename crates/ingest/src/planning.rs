//! Planning, once for the group-commit writer and the topic fan-out: one event's
//! recipients become deliveries and skipped pairs through the same steps in the same
//! order, plan → derived deliveries (fallbacks, escalations) → fatigue caps → digest or
//! LINE multicast → ids ([`EventPlan`]), all pure and at a given instant; then
//! [`insert_planned`] writes them, held for the relay or left to its claim.

use crate::clock::Clock;
use chrono::{DateTime, Utc};
use notify_core::event::Schedule;
use notify_core::fatigue::{Counted, OverCap};
use notify_core::plan::{Cause, Derivation};
use notify_core::{
    Channel, FieldViolation, PlannedDelivery, Provider, RecipientFacts, SkippedDelivery,
};
use notify_store::StoreError;
use notify_store::events::{self, NewDelivery};
use notify_store::outbox::OutboxRow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;
use uuid::Uuid;

/// How one event's capped deliveries are grouped before they get their ids.
#[derive(Debug, Clone, Copy)]
pub enum Grouping<'a> {
    /// Each delivery on its own.
    Alone,
    /// Into the digest of `<type_key>/<group>` (the event's `aggregate_key`) for the
    /// window of `window_s` seconds the planning instant falls in
    /// ([`notify_core::plan::digest_window`]).
    Digest {
        /// The event's type.
        type_key: &'a str,
        /// The event's aggregate key.
        group: &'a str,
        /// The type's digest window, seconds (> 0).
        window_s: i64,
    },
    /// A fan-out page's LINE pushes due together merged into multicasts named after the
    /// page's cursor ([`notify_core::plan::merge_line_multicast`]).
    LineMulticast {
        /// The cursor the page starts after.
        page: &'a str,
    },
}

/// What planning one event needs to know besides its recipients: the event, its type's
/// settings and its due time. The same for every page of a fan-out.
#[derive(Debug, Clone, Copy)]
pub struct EventPlan<'a> {
    /// The event's id.
    pub event_id: Uuid,
    /// The channels the event goes on.
    pub channels: &'a [Channel],
    /// A critical type passes quiet hours and fatigue caps.
    pub critical: bool,
    /// What a fatigue cap does to a delivery over it.
    pub over_cap: OverCap,
    /// The type's fallbacks and escalations.
    pub derivation: &'a Derivation,
    /// A scheduled event's due time (`None`: sent now).
    pub send_at: Option<DateTime<Utc>>,
    /// Digest, LINE multicast or neither.
    pub grouping: Grouping<'a>,
    /// Attempts each new delivery gets.
    pub max_attempts: i32,
}

/// One event's plan before the fatigue caps and grouping: planned and derived deliveries
/// and skipped pairs, at the planning instant ([`EventPlan::draft`]).
#[derive(Debug)]
pub struct Draft {
    /// Planned and derived deliveries.
    pub planned: Vec<PlannedDelivery>,
    /// Recipient x channel pairs that get no delivery, with the reason.
    pub skipped: Vec<SkippedDelivery>,
    at: DateTime<Utc>,
}

impl Draft {
    /// Leaves out every delivery and skipped pair of `users` (recipients canceled alone
    /// after the draft was made).
    pub fn without(&mut self, users: &HashSet<String>) {
        if !users.is_empty() {
            self.planned.retain(|p| !users.contains(&p.user_id));
            self.skipped.retain(|s| !users.contains(&s.user_id));
        }
    }
}

impl EventPlan<'_> {
    /// The instant the event is planned at when the clock reads `now`: a scheduled event
    /// at its due time (quiet hours, fatigue and digest windows of the sending time).
    pub fn at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        self.send_at.map_or(now, |t| t.max(now))
    }

    /// Plans `recipients` at `now` ([`notify_core::plan::plan`]) and adds the type's
    /// derived deliveries ([`notify_core::plan::derive`]), so a derived delivery is capped
    /// like a planned one in [`EventPlan::finish`].
    pub fn draft(&self, recipients: &[RecipientFacts], now: DateTime<Utc>) -> Draft {
        let at = self.at(now);
        let scheduled = self.send_at.is_some();
        let (mut planned, mut skipped) = notify_core::plan::plan(
            self.event_id,
            self.critical,
            self.channels,
            recipients,
            at,
            scheduled,
        );
        notify_core::plan::derive(
            self.event_id,
            self.critical,
            self.derivation,
            recipients,
            (at, scheduled),
            &mut planned,
            &mut skipped,
        );
        Draft {
            planned,
            skipped,
            at,
        }
    }

    /// Applies the fatigue `caps` (per channel, per rolling hour; `counted`: what each
    /// user already has scheduled, updated with what this plan adds), then the grouping,
    /// and gives the deliveries their ids.
    pub fn finish(
        &self,
        draft: Draft,
        caps: &BTreeMap<Channel, u32>,
        counted: &mut Counted,
    ) -> (Vec<NewDelivery>, Vec<SkippedDelivery>) {
        let Draft {
            planned,
            mut skipped,
            at,
        } = draft;
        let planned = notify_core::fatigue::apply_caps(
            planned,
            &mut skipped,
            caps,
            self.critical,
            self.over_cap,
            at,
            counted,
        );
        let planned = match self.grouping {
            Grouping::Alone => planned,
            Grouping::Digest {
                type_key,
                group,
                window_s,
            } => notify_core::plan::into_digests(
                planned,
                type_key,
                group,
                notify_core::plan::digest_window(at, window_s),
            ),
            Grouping::LineMulticast { page } => notify_core::plan::merge_line_multicast(
                self.event_id,
                page,
                planned,
                self.send_at.is_some().then_some(at),
            ),
        };
        (new_deliveries(planned, self.max_attempts), skipped)
    }

    /// [`EventPlan::draft`] then [`EventPlan::finish`]: one event's whole plan.
    pub fn plan(
        &self,
        recipients: &[RecipientFacts],
        now: DateTime<Utc>,
        caps: &BTreeMap<Channel, u32>,
        counted: &mut Counted,
    ) -> (Vec<NewDelivery>, Vec<SkippedDelivery>) {
        self.finish(self.draft(recipients, now), caps, counted)
    }
}

/// Inserts planned deliveries, `(event id, delivery)`, with their outbox rows in one
/// statement. With a relay to hand them to (`direct`: it and the hold), the rows of
/// deliveries due now are held for it ([`events::insert_deliveries_held`]) and returned,
/// for [`crate::relay::Direct::publish`] after the commit; without one, every row is left
/// to the relay's claim and none is returned.
///
/// # Errors
/// `StoreError` when a statement fails; the caller's transaction is then to be rolled back.
pub async fn insert_planned(
    tx: &mut notify_store::sqlx::PgConnection,
    rows: &[(Uuid, &NewDelivery)],
    direct: &Option<(crate::relay::Direct, Duration)>,
) -> Result<Vec<OutboxRow>, StoreError> {
    match direct {
        Some((direct, hold)) => {
            events::insert_deliveries_held(tx, rows, *hold, direct.deliveries_per_row()).await
        }
        None => {
            events::insert_deliveries_many(tx, rows).await?;
            Ok(Vec::new())
        }
    }
}

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
