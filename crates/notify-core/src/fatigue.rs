//! Fatigue caps: at most N non-critical notifications per user per channel in any rolling
//! hour (N configured per channel). A notification counts at the time it is scheduled to
//! go out (its creation, or the end of its quiet-hours deferral); several push endpoints
//! of one event count once. Over the cap, a delivery is deferred to the next free slot, or
//! dropped with reason `throttled` when its type says so. Critical types are neither
//! counted nor capped.

use crate::channel::Channel;
use crate::plan::{PlannedDelivery, SkipReason, SkippedDelivery};
use chrono::{DateTime, Duration, Utc};
use std::collections::{BTreeMap, HashMap};

/// The rolling window.
pub const WINDOW: Duration = Duration::hours(1);

crate::named::named_enum! {
    /// What a type does with a notification over the cap (`notification_types.over_cap`).
    #[derive(Default)]
    pub enum OverCap("over_cap") {
        /// Send it at the next free slot. The default (the column's).
        #[default]
        Defer = "defer",
        /// Do not send it (skip reason `throttled`).
        Drop = "drop",
    }
}

/// The earliest instant at or after `base` at which one more notification keeps every
/// rolling hour that contains it within `cap`, given the scheduled times already counted.
pub fn next_free_slot(
    base: DateTime<Utc>,
    scheduled: &[DateTime<Utc>],
    cap: usize,
) -> DateTime<Utc> {
    if cap == 0 {
        return base;
    }
    let mut times = scheduled.to_vec();
    times.sort();
    let fits = |c: DateTime<Utc>| {
        // Every hour window (x - 1h, x] with c <= x < c + 1h holds c; the counts only
        // change at scheduled times, so checking x = c and x = each time in range suffices.
        std::iter::once(c)
            .chain(times.iter().copied().filter(|&t| t > c && t < c + WINDOW))
            .all(|x| times.iter().filter(|&&t| t > x - WINDOW && t <= x).count() < cap)
    };
    let mut candidates: Vec<DateTime<Utc>> = std::iter::once(base)
        .chain(times.iter().map(|&t| t + WINDOW).filter(|&t| t > base))
        .collect();
    candidates.sort();
    candidates.into_iter().find(|&c| fits(c)).unwrap_or(base)
}

/// Scheduled times already counted, per (user, channel).
pub type Counted = HashMap<(String, Channel), Vec<DateTime<Utc>>>;

/// Applies `caps` to one event's plan at `now`: each capped, non-critical delivery is
/// deferred to its next free slot (its `throttle_at`) or, with [`OverCap::Drop`], moved to
/// `skipped` as `throttled`. `counted` holds what is already scheduled and is updated, so
/// a batch of events shares it. Push deliveries of one user count once.
pub fn apply_caps(
    planned: Vec<PlannedDelivery>,
    skipped: &mut Vec<SkippedDelivery>,
    caps: &BTreeMap<Channel, u32>,
    critical: bool,
    over: OverCap,
    now: DateTime<Utc>,
    counted: &mut Counted,
) -> Vec<PlannedDelivery> {
    if critical || caps.is_empty() {
        return planned;
    }
    // One decision per (user, channel): push endpoints share it.
    let mut decided: HashMap<(String, Channel), Option<DateTime<Utc>>> = HashMap::new();
    let mut out = Vec::with_capacity(planned.len());
    for mut d in planned {
        let Some(&cap) = caps.get(&d.channel) else {
            out.push(d);
            continue;
        };
        let key = (d.user_id.clone(), d.channel);
        let slot = *decided.entry(key.clone()).or_insert_with(|| {
            let base = d.first_attempt_at().unwrap_or(now).max(now);
            let times = counted.entry(key.clone()).or_default();
            let slot = next_free_slot(base, times, cap as usize);
            if slot > base && over == OverCap::Drop {
                return None;
            }
            times.push(slot);
            Some(slot)
        });
        match slot {
            None => {
                if !skipped
                    .iter()
                    .any(|s| s.user_id == d.user_id && s.channel == d.channel)
                {
                    skipped.push(SkippedDelivery {
                        user_id: d.user_id.clone(),
                        channel: d.channel,
                        reason: SkipReason::Throttled,
                        decision: format!(
                            "{}\nfatigue cap: {cap} per hour on {} reached; dropped (type setting)",
                            d.decision, d.channel
                        ),
                    });
                }
            }
            Some(slot) => {
                let base = d.first_attempt_at().unwrap_or(now).max(now);
                if slot > base {
                    d.deferred_until = Some(slot);
                    d.decision.push_str(&format!(
                        "\nfatigue cap: {cap} per hour on {} reached; deferred until {}",
                        d.channel,
                        slot.to_rfc3339()
                    ));
                }
                d.throttle_at = Some(slot);
                out.push(d);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn the_next_slot_opens_when_the_oldest_leaves_the_hour() {
        let sent = [
            t("2026-11-30T10:00:00Z"),
            t("2026-11-30T10:20:00Z"),
            t("2026-11-30T10:40:00Z"),
        ];
        let now = t("2026-11-30T10:50:00Z");
        assert_eq!(next_free_slot(now, &sent, 4), now, "under the cap");
        assert_eq!(next_free_slot(now, &sent, 3), t("2026-11-30T11:00:00Z"));
        assert_eq!(next_free_slot(now, &sent, 2), t("2026-11-30T11:20:00Z"));
        // A deferred one already scheduled in the future also holds its hour.
        let with_future = [t("2026-11-30T11:30:00Z")];
        assert_eq!(
            next_free_slot(t("2026-11-30T11:00:00Z"), &with_future, 1),
            t("2026-11-30T12:30:00Z"),
            "11:00 would share an hour with 11:30"
        );
    }

    fn planned(user: &str, channel: Channel, endpoint: u128) -> PlannedDelivery {
        PlannedDelivery {
            user_id: user.into(),
            channel,
            provider: crate::Provider::Line,
            endpoint_id: (endpoint > 0).then(|| Uuid::from_u128(endpoint)),
            address: None,
            idempotency_key: format!("{user}/{channel}/{endpoint}"),
            deferred_until: None,
            scheduled_for: None,
            decision: String::new(),
            throttle_at: None,
            digest_key: None,
            cause: crate::plan::Cause::Planned,
            parent_key: None,
        }
    }

    #[test]
    fn over_the_cap_defers_or_drops_per_type_and_critical_passes() {
        let caps = BTreeMap::from([(Channel::Line, 2), (Channel::Push, 1)]);
        let now = t("2026-11-30T10:00:00Z");
        let mut counted = Counted::new();
        let mut skipped = Vec::new();
        let mut sent = Vec::new();
        for _ in 0..3 {
            sent.extend(apply_caps(
                vec![
                    planned("u1", Channel::Line, 0),
                    planned("u1", Channel::Push, 1),
                    planned("u1", Channel::Push, 2),
                ],
                &mut skipped,
                &caps,
                false,
                OverCap::Defer,
                now,
                &mut counted,
            ));
        }
        let line: Vec<_> = sent
            .iter()
            .filter(|d| d.channel == Channel::Line)
            .map(|d| d.deferred_until)
            .collect();
        assert_eq!(line, [None, None, Some(t("2026-11-30T11:00:00Z"))]);
        let push: Vec<_> = sent
            .iter()
            .filter(|d| d.channel == Channel::Push)
            .map(|d| d.deferred_until)
            .collect();
        assert_eq!(
            push,
            [
                None,
                None,
                Some(t("2026-11-30T11:00:00Z")),
                Some(t("2026-11-30T11:00:00Z")),
                Some(t("2026-11-30T12:00:00Z")),
                Some(t("2026-11-30T12:00:00Z"))
            ],
            "two endpoints of one event count once"
        );
        let kept = apply_caps(
            vec![planned("u1", Channel::Line, 0)],
            &mut skipped,
            &caps,
            false,
            OverCap::Drop,
            now,
            &mut counted,
        );
        assert!(kept.is_empty());
        assert_eq!(skipped[0].reason, SkipReason::Throttled);
        let critical = apply_caps(
            vec![planned("u1", Channel::Line, 0)],
            &mut skipped,
            &caps,
            true,
            OverCap::Drop,
            now,
            &mut counted,
        );
        assert_eq!(critical[0].deferred_until, None);
    }
}
