//! Quiet hours: daily windows of local wall-clock time in the recipient's IANA time zone
//! during which a delivery waits instead of making a noise.
//!
//! A window `start`–`end` holds the local times `t` with `start <= t < end` (start
//! inclusive, end exclusive); when `start > end` it crosses midnight (`t >= start` or
//! `t < end`). `start == end` is refused when the window is set. A delivery created inside
//! a window is deferred to the window's end: the first instant at which the local clock
//! shows `end` on the right day. Across daylight-saving changes (tz database via
//! chrono-tz):
//!
//! - an `end` that falls in a gap (the clock jumps from 02:00 to 03:00) ends the window at
//!   the first instant after the gap;
//! - an `end` that happens twice (the clock goes back from 02:00 to 01:00) ends the window
//!   at its first occurrence.
//!
//! Windows that meet or overlap chain: the deferral is re-checked at the end instant until
//! no window holds it.

use crate::channel::Channel;
use chrono::{DateTime, Duration, LocalResult, NaiveDate, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// One daily quiet window, as stored in `recipients.quiet_hours_json` (a JSON array).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuietWindow {
    /// Local start time, `HH:MM` (inclusive).
    pub start: String,
    /// Local end time, `HH:MM` (exclusive).
    pub end: String,
    /// Channels the window applies to; empty = every channel but in-app.
    #[serde(default)]
    pub channels: Vec<Channel>,
}

/// Most quiet windows per user.
pub const MAX_WINDOWS: usize = 10;

/// Records a violation per bad window (`windows[i]`) and when there are too many.
pub fn check_windows(v: &mut crate::validate::Violations, windows: &[QuietWindow]) {
    if windows.len() > MAX_WINDOWS {
        v.add("windows", format!("at most {MAX_WINDOWS} windows"));
    }
    for (i, w) in windows.iter().enumerate() {
        if let Some(problem) = w.problem() {
            v.add(format!("windows[{i}]"), problem);
        }
    }
}

/// Parses `HH:MM` (00:00 to 23:59).
pub fn parse_hhmm(s: &str) -> Option<NaiveTime> {
    let (h, m) = s.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    NaiveTime::from_hms_opt(h.parse().ok()?, m.parse().ok()?, 0)
}

impl QuietWindow {
    /// Why this window is not valid, if it is not.
    pub fn problem(&self) -> Option<&'static str> {
        match (parse_hhmm(&self.start), parse_hhmm(&self.end)) {
            (Some(s), Some(e)) if s == e => Some("start and end must differ"),
            (Some(_), Some(_)) => {
                if self.channels.contains(&Channel::InApp) {
                    Some("in-app makes no noise and has no quiet hours")
                } else {
                    None
                }
            }
            _ => Some("start and end must be HH:MM (00:00 to 23:59)"),
        }
    }

    fn applies_to(&self, channel: Channel) -> bool {
        channel != Channel::InApp && (self.channels.is_empty() || self.channels.contains(&channel))
    }

    /// When this window, holding `local` (a wall-clock time on `date`), ends, as a local
    /// date and time; `None` if it does not hold that time.
    fn end_of(&self, date: NaiveDate, local: NaiveTime) -> Option<(NaiveDate, NaiveTime)> {
        let (start, end) = (parse_hhmm(&self.start)?, parse_hhmm(&self.end)?);
        if start < end {
            (start <= local && local < end).then_some((date, end))
        } else if local >= start {
            Some((date.succ_opt()?, end))
        } else if local < end {
            Some((date, end))
        } else {
            None
        }
    }
}

/// The first instant at which the clock in `tz` shows `time` on `date`: the first of two
/// when it shows it twice, the end of the gap when it never does.
pub fn first_instant(tz: Tz, date: NaiveDate, time: NaiveTime) -> DateTime<Utc> {
    let mut naive = date.and_time(time);
    // A gap is at most a few hours; step a minute at a time until the clock exists.
    for _ in 0..(24 * 60) {
        match tz.from_local_datetime(&naive) {
            LocalResult::Single(t) => return t.with_timezone(&Utc),
            LocalResult::Ambiguous(first, _) => return first.with_timezone(&Utc),
            LocalResult::None => naive += Duration::minutes(1),
        }
    }
    Utc.from_utc_datetime(&date.and_time(time))
}

/// Until when a delivery on `channel` created at `now` must wait because of `windows` in
/// `tz`: `None` when no window holds `now`.
pub fn quiet_until(
    now: DateTime<Utc>,
    tz: Tz,
    windows: &[QuietWindow],
    channel: Channel,
) -> Option<DateTime<Utc>> {
    let mut at = now;
    let mut deferred = None;
    // Chained or overlapping windows: follow them, at most one day's worth.
    for _ in 0..=windows.len() {
        let local = at.with_timezone(&tz);
        let end = windows
            .iter()
            .filter(|w| w.applies_to(channel))
            .filter_map(|w| w.end_of(local.date_naive(), local.time()))
            .map(|(d, t)| first_instant(tz, d, t))
            .filter(|&e| e > at)
            .max();
        match end {
            Some(e) => {
                at = e;
                deferred = Some(e);
            }
            None => break,
        }
    }
    deferred
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: &str, end: &str) -> QuietWindow {
        QuietWindow {
            start: start.into(),
            end: end.into(),
            channels: vec![],
        }
    }

    fn utc(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    const BKK: Tz = chrono_tz::Asia::Bangkok;
    const NY: Tz = chrono_tz::America::New_York;

    #[test]
    fn bangkok_window_across_midnight_start_inclusive_end_exclusive() {
        let night = [w("22:00", "07:00")];
        let cases = [
            // (now UTC, expected end UTC); Bangkok is UTC+7 all year.
            ("2026-11-30T14:59:59Z", None), // 21:59:59
            ("2026-11-30T15:00:00Z", Some("2026-12-01T00:00:00Z")), // 22:00 exactly: inside
            ("2026-11-30T16:30:00Z", Some("2026-12-01T00:00:00Z")), // 23:30
            ("2026-11-30T17:00:00Z", Some("2026-12-01T00:00:00Z")), // 00:00 next day
            ("2026-11-30T23:59:59Z", Some("2026-12-01T00:00:00Z")), // 06:59:59
            ("2026-12-01T00:00:00Z", None), // 07:00 exactly: outside
        ];
        for (now, want) in cases {
            assert_eq!(
                quiet_until(utc(now), BKK, &night, Channel::Line),
                want.map(utc),
                "{now}"
            );
        }
        assert_eq!(
            quiet_until(utc("2026-11-30T16:30:00Z"), BKK, &night, Channel::InApp),
            None,
            "in-app is never deferred"
        );
    }

    #[test]
    fn windows_for_some_channels_only_and_chained_windows() {
        let email_only = [QuietWindow {
            channels: vec![Channel::Email],
            ..w("12:00", "13:00")
        }];
        let noon = utc("2026-11-30T05:30:00Z"); // 12:30 Bangkok
        assert_eq!(
            quiet_until(noon, BKK, &email_only, Channel::Email),
            Some(utc("2026-11-30T06:00:00Z"))
        );
        assert_eq!(quiet_until(noon, BKK, &email_only, Channel::Line), None);
        let chained = [w("22:00", "01:00"), w("01:00", "06:00")];
        assert_eq!(
            quiet_until(utc("2026-11-30T16:00:00Z"), BKK, &chained, Channel::Push),
            Some(utc("2026-11-30T23:00:00Z")),
            "23:00 -> 01:00 -> 06:00 Bangkok"
        );
    }

    #[test]
    fn new_york_across_the_spring_forward_gap() {
        // 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
        let ends_in_gap = [w("23:00", "02:30")];
        assert_eq!(
            quiet_until(
                utc("2026-03-08T05:00:00Z"),
                NY,
                &ends_in_gap,
                Channel::Email
            ), // 00:00 EST
            Some(utc("2026-03-08T07:00:00Z")),
            "02:30 does not exist that night: the window ends when the clock shows 03:00 EDT"
        );
        let night = [w("22:00", "07:00")];
        // 23:00 EST on the 7th -> 07:00 EDT on the 8th = 11:00 UTC (an hour shorter night).
        assert_eq!(
            quiet_until(utc("2026-03-08T04:00:00Z"), NY, &night, Channel::Email),
            Some(utc("2026-03-08T11:00:00Z"))
        );
        // 03:30 EDT, just after the jump, is inside.
        assert_eq!(
            quiet_until(utc("2026-03-08T07:30:00Z"), NY, &night, Channel::Email),
            Some(utc("2026-03-08T11:00:00Z"))
        );
    }

    #[test]
    fn new_york_across_the_fall_back_overlap() {
        // 2026-11-01: 02:00 EDT goes back to 01:00 EST (06:00 UTC); 01:30 happens twice.
        let ends_twice = [w("00:00", "01:30")];
        assert_eq!(
            quiet_until(utc("2026-11-01T04:30:00Z"), NY, &ends_twice, Channel::Line), // 00:30 EDT
            Some(utc("2026-11-01T05:30:00Z")),
            "the first 01:30 (EDT) ends it"
        );
        // 01:45 EST (the second pass, 06:45 UTC) is outside 00:00-01:30.
        assert_eq!(
            quiet_until(utc("2026-11-01T06:45:00Z"), NY, &ends_twice, Channel::Line),
            None
        );
        let night = [w("22:00", "07:00")];
        // 23:00 EDT on Oct 31 -> 07:00 EST on Nov 1 = 12:00 UTC (an hour longer night).
        assert_eq!(
            quiet_until(utc("2026-11-01T03:00:00Z"), NY, &night, Channel::Line),
            Some(utc("2026-11-01T12:00:00Z"))
        );
    }

    #[test]
    fn bad_windows_are_named() {
        assert!(w("22:00", "22:00").problem().is_some());
        assert!(w("7:00", "08:00").problem().is_some());
        assert!(w("24:00", "08:00").problem().is_some());
        assert!(w("22:00", "07:00").problem().is_none());
        let inapp = QuietWindow {
            channels: vec![Channel::InApp],
            ..w("22:00", "07:00")
        };
        assert!(inapp.problem().is_some());
    }
}
