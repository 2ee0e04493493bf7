//! Scheduled sends: the `send_at` or `delay` a `CreateEvent` asks for, and its due time
//! within the schedule horizon.

use crate::validate::{FieldViolation, Violations};

/// When a scheduled event is due, as the caller asked (`send_at` or `delay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// At this instant (`send_at`).
    At(chrono::DateTime<chrono::Utc>),
    /// This long after the planning instant (`delay`).
    After(std::time::Duration),
}

/// Renders a duration the way the settings take it (`30d`, `2h`, `90s`, `250ms`).
pub fn duration_text(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() != 0 || s == 0 {
        format!("{}ms", d.as_millis())
    } else if s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s.is_multiple_of(3_600) {
        format!("{}h", s / 3_600)
    } else if s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

impl Schedule {
    /// The request field the caller set: `send_at` or `delay`.
    pub fn field(self) -> &'static str {
        match self {
            Schedule::At(_) => "send_at",
            Schedule::After(_) => "delay",
        }
    }

    /// The due time when planning at `now`: `None` when it is not after `now` (a
    /// `send_at` in the past, a zero delay: sent now).
    ///
    /// # Errors
    /// A violation of [`Schedule::field`] naming the horizon when the due time is more
    /// than `horizon` after `now`.
    pub fn due(
        self,
        now: chrono::DateTime<chrono::Utc>,
        horizon: std::time::Duration,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, FieldViolation> {
        let horizon_c = chrono::Duration::from_std(horizon).unwrap_or(chrono::Duration::MAX);
        let due = match self {
            Schedule::At(t) => t,
            Schedule::After(d) => match chrono::Duration::from_std(d)
                .ok()
                .and_then(|d| now.checked_add_signed(d))
            {
                Some(t) => t,
                None => chrono::DateTime::<chrono::Utc>::MAX_UTC,
            },
        };
        if due - now > horizon_c {
            return Err(FieldViolation::new(
                self.field(),
                format!(
                    "must be at most {} ahead (the schedule horizon, NOTIFY_SCHEDULE_HORIZON)",
                    duration_text(horizon)
                ),
            ));
        }
        Ok((due > now).then_some(due))
    }
}

/// A number and one of the units [`crate::retry::parse_duration`] reads, whatever its size.
fn well_formed(s: &str) -> bool {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    !num.is_empty() && ["", "ms", "s", "m", "h", "d"].contains(&unit)
}

/// `send_at` and `delay` of a request (blank = unset), with their violations.
pub(crate) fn parse_schedule(send_at: &str, delay: &str, v: &mut Violations) -> Option<Schedule> {
    let (send_at, delay) = (send_at.trim(), delay.trim());
    let at = (!send_at.is_empty()).then(|| {
        chrono::DateTime::parse_from_rfc3339(send_at)
            .map(|t| t.with_timezone(&chrono::Utc))
            .map_err(|_| {
                v.add(
                    "send_at",
                    "must be an RFC 3339 timestamp with an offset, e.g. 2026-12-02T09:00:00+07:00",
                )
            })
            .ok()
    });
    let after = (!delay.is_empty()).then(|| {
        crate::retry::parse_duration(delay)
            // Well formed but longer than any duration the system stores: beyond every
            // horizon, so [`Schedule::due`] refuses it naming the horizon.
            .or_else(|e| {
                if well_formed(delay) {
                    Ok(crate::retry::MAX_DURATION + std::time::Duration::from_secs(1))
                } else {
                    Err(e)
                }
            })
            .map_err(|_| {
                v.add(
                    "delay",
                    "must be a duration: a number followed by ms, s, m, h or d (e.g. 90s, 15m, 2h, 1d)",
                )
            })
            .ok()
    });
    match (at, after) {
        (Some(_), Some(_)) => {
            v.add("delay", "send_at and delay are exclusive: set one of them");
            None
        }
        (Some(at), None) => at.map(Schedule::At),
        (None, Some(after)) => after.map(Schedule::After),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schedule of `send_at` and `delay`, or the violations' fields and descriptions.
    fn parse(send_at: &str, delay: &str) -> Result<Option<Schedule>, Vec<FieldViolation>> {
        let mut v = Violations::default();
        let schedule = parse_schedule(send_at, delay, &mut v);
        v.into_result(schedule)
    }

    fn fields(errs: &[FieldViolation]) -> Vec<&str> {
        errs.iter().map(|f| f.field.as_str()).collect()
    }

    #[test]
    fn send_at_and_delay_are_checked_by_field() {
        let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
        let e = parse("2026-12-02T09:00:00+07:00", "").unwrap();
        assert_eq!(e, Some(Schedule::At(at("2026-12-02T02:00:00Z"))));
        let e = parse("", "90s").unwrap();
        assert_eq!(e, Some(Schedule::After(std::time::Duration::from_secs(90))));

        let errs = parse("2026-12-02 09:00", "").unwrap_err();
        assert_eq!(fields(&errs), ["send_at"]);
        assert!(errs[0].description.contains("RFC 3339"), "{errs:?}");
        assert_eq!(
            fields(&parse("2026-12-02T09:00:00", "").unwrap_err()),
            ["send_at"],
            "an offset is required"
        );
        let errs = parse("", "5 minutes").unwrap_err();
        assert_eq!(fields(&errs), ["delay"]);
        assert!(errs[0].description.contains("15m"), "{errs:?}");
        let errs = parse("2026-12-02T09:00:00Z", "5s").unwrap_err();
        assert_eq!(fields(&errs), ["delay"]);
        assert_eq!(
            errs[0].description,
            "send_at and delay are exclusive: set one of them"
        );
    }

    #[test]
    fn the_due_time_is_within_the_horizon_and_the_past_means_now() {
        let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
        let now = at("2026-12-01T00:00:00Z");
        let horizon = std::time::Duration::from_secs(30 * 86_400);
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(
            Schedule::After(day * 30).due(now, horizon),
            Ok(Some(at("2026-12-31T00:00:00Z")))
        );
        let err = Schedule::After(day * 30 + std::time::Duration::from_secs(1))
            .due(now, horizon)
            .unwrap_err();
        assert_eq!(err.field, "delay");
        assert!(err.description.contains("30d"), "{err:?}");
        let err = Schedule::At(at("2026-12-31T00:00:01Z"))
            .due(now, horizon)
            .unwrap_err();
        assert_eq!(err.field, "send_at");
        assert_eq!(
            Schedule::At(at("2026-11-30T23:00:00Z")).due(now, horizon),
            Ok(None),
            "the past means now"
        );
        assert_eq!(
            Schedule::After(std::time::Duration::ZERO).due(now, horizon),
            Ok(None)
        );
        assert_eq!(duration_text(std::time::Duration::from_secs(90)), "90s");
        assert_eq!(
            duration_text(std::time::Duration::from_millis(1500)),
            "1500ms"
        );
        assert_eq!(duration_text(std::time::Duration::from_secs(7200)), "2h");
    }
}
