//! Retry schedule: per-attempt base delays with jitter bounded around each base (so the
//! spacing grows with every attempt), a clamped `Retry-After`, and a floor for rate
//! limiting. Pure arithmetic: randomness is passed in.

use std::time::Duration;

/// When to try again, and when to give up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Base delay before attempt n+1 after attempt n failed (index n-1); the last one is
    /// reused for later attempts.
    pub delays: Vec<Duration>,
    /// Attempts (provider calls) allowed in total, at least 1.
    pub max_attempts: u32,
    /// Largest `Retry-After` honoured; longer values are clamped to it.
    pub max_retry_after: Duration,
    /// Least delay after a rate-limited (429) answer.
    pub rate_limit_floor: Duration,
}

impl Default for RetryPolicy {
    /// 30 s, 2 min, 10 min, 1 h, 6 h; 5 attempts; `Retry-After` up to 6 h; 429 floor 60 s.
    fn default() -> Self {
        Self {
            delays: [30, 120, 600, 3600, 6 * 3600]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
            max_attempts: 5,
            max_retry_after: Duration::from_secs(6 * 3600),
            rate_limit_floor: Duration::from_secs(60),
        }
    }
}

/// Jitter band around each base delay: a retry waits between `base * (1 - JITTER)` and
/// `base * (1 + JITTER)`. With bases that at least double (the default schedule and any
/// `NOTIFY_RETRY_DELAYS` whose steps grow by 1.5x or more) the gaps grow monotonically,
/// and failures at the same instant still spread over 40 % of the base (Svix uses the
/// same +-20 %).
pub const JITTER: f64 = 0.2;

/// Longest duration any setting accepts, and the longest delay the schedule ever
/// returns: 366 days. Postgres stores it (`interval` reaches 178,000,000 years; the
/// millisecond count fits `bigint`), and tokio's timers act on it.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 86_400);

/// A bad `NOTIFY_RETRY_DELAYS`-style schedule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {0:?}: expected a number followed by ms, s, m, h or d (e.g. 30s,2m,1h,1d), at most 366 days"
)]
pub struct BadDuration(pub String);

/// Whole milliseconds of `d` for SQL (`$n * interval '1 millisecond'`), saturating at
/// [`MAX_DURATION`] so no setting or provider answer can overflow the database.
pub fn millis(d: Duration) -> i64 {
    d.min(MAX_DURATION).as_millis() as i64
}

/// Parses `"250ms"`, `"30s"`, `"2m"`, `"6h"`, `"1d"` (a bare number means seconds), at
/// most [`MAX_DURATION`].
///
/// # Errors
/// [`BadDuration`] for another unit, a missing number or more than 366 days.
pub fn parse_duration(s: &str) -> Result<Duration, BadDuration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| BadDuration(s.to_string()))?;
    let secs = |mult: u64| n.checked_mul(mult).map(Duration::from_secs);
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "" | "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => None,
    }
    .filter(|d| *d <= MAX_DURATION)
    .ok_or_else(|| BadDuration(s.to_string()))
}

/// [`parse_duration`] within `min..=max`, for a setting whose zero or huge value would
/// break what it controls (a timeout of 0 fails every call, a republish period of 0
/// republishes on every sweep).
///
/// # Errors
/// The parse error, or `must be from <min> to <max>` (as text, for the config reader).
pub fn parse_duration_in(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d < min || d > max {
        return Err(format!("must be from {min:?} to {max:?}"));
    }
    Ok(d)
}

/// Parses a comma-separated list of durations, e.g. `"30s,2m,10m,1h,6h"`.
pub fn parse_durations(s: &str) -> Result<Vec<Duration>, BadDuration> {
    s.split(',').map(parse_duration).collect()
}

/// Shortest entry of a retry schedule (`NOTIFY_RETRY_DELAYS`,
/// `NOTIFY_WEBHOOK_RETRY_DELAYS`): 1 s. A 0 s delay retries a failing provider or endpoint
/// in a tight loop (8 attempts in 0.4 s) and spends the attempt budget on one outage.
pub const MIN_RETRY_DELAY: Duration = Duration::from_secs(1);

/// Parses a retry schedule: [`parse_durations`], every entry at least [`MIN_RETRY_DELAY`].
/// The one rule of every `*_RETRY_DELAYS` setting.
///
/// # Errors
/// The parse error, or `every delay must be at least 1s` (as text, for the config reader).
pub fn parse_retry_delays(s: &str) -> Result<Vec<Duration>, String> {
    let list = parse_durations(s).map_err(|e| e.to_string())?;
    if list.iter().any(|d| *d < MIN_RETRY_DELAY) {
        return Err(format!(
            "every delay must be at least {}s",
            MIN_RETRY_DELAY.as_secs()
        ));
    }
    Ok(list)
}

impl RetryPolicy {
    /// Delay before the next attempt after attempt number `attempts_made` (1-based) failed,
    /// or `None` when no attempt is left.
    ///
    /// `jitter` in `[0, 1)` places the delay in the band `base * (1 +- JITTER)` (0 gives
    /// the shortest, towards 1 the longest). A `retry_after` from the provider is clamped
    /// to `max_retry_after` and used when longer; a rate-limited answer waits at least
    /// `rate_limit_floor`. The result is at most [`MAX_DURATION`]. Never panics or
    /// overflows, for any input.
    pub fn next_delay(
        &self,
        attempts_made: u32,
        retry_after: Option<Duration>,
        rate_limited: bool,
        jitter: f64,
    ) -> Option<Duration> {
        if attempts_made >= self.max_attempts.max(1) {
            return None;
        }
        let base = match self.delays.len() {
            0 => Duration::ZERO,
            n => self.delays[(attempts_made.max(1) as usize - 1).min(n - 1)],
        };
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let factor = 1.0 - JITTER + 2.0 * JITTER * jitter;
        let mut delay = Duration::try_from_secs_f64(base.as_secs_f64() * factor).unwrap_or(base);
        if let Some(after) = retry_after {
            delay = delay.max(after.min(self.max_retry_after));
        }
        if rate_limited {
            delay = delay.max(self.rate_limit_floor);
        }
        Some(delay.min(MAX_DURATION))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn default_schedule_with_bounded_jitter_and_give_up_after_five() {
        let p = RetryPolicy::default();
        let top: Vec<_> = (1..=4)
            .map(|a| p.next_delay(a, None, false, 0.999_999).unwrap().as_secs())
            .collect();
        assert_eq!(top, [35, 143, 719, 4319]);
        let low: Vec<_> = (1..=4)
            .map(|a| p.next_delay(a, None, false, 0.0).unwrap().as_secs())
            .collect();
        assert_eq!(low, [24, 96, 480, 2880]);
        assert_eq!(p.next_delay(5, None, false, 0.5), None);
        assert_eq!(p.next_delay(u32::MAX, None, false, 0.5), None);
    }

    #[test]
    fn retry_after_is_honoured_clamped_and_429_has_a_floor() {
        let p = RetryPolicy::default();
        assert_eq!(p.next_delay(1, Some(secs(90)), false, 0.1), Some(secs(90)));
        assert_eq!(
            p.next_delay(1, Some(secs(10 * 86_400)), false, 0.1),
            Some(secs(6 * 3600))
        );
        assert_eq!(p.next_delay(1, None, true, 0.0), Some(secs(60)));
        assert_eq!(p.next_delay(1, Some(secs(10)), false, 0.0), Some(secs(24)));
        assert_eq!(p.next_delay(1, Some(secs(5)), true, 0.0), Some(secs(60)));
    }

    #[test]
    fn odd_inputs_never_panic() {
        let p = RetryPolicy {
            delays: vec![],
            max_attempts: u32::MAX,
            ..Default::default()
        };
        assert_eq!(
            p.next_delay(u32::MAX - 1, None, false, f64::NAN),
            Some(Duration::ZERO)
        );
        assert_eq!(p.next_delay(0, None, false, 7.0), Some(Duration::ZERO));
        let q = RetryPolicy {
            delays: vec![Duration::MAX],
            ..Default::default()
        };
        assert_eq!(
            q.next_delay(3, Some(Duration::MAX), true, 1.0),
            Some(MAX_DURATION)
        );
        assert_eq!(millis(Duration::MAX), millis(MAX_DURATION));
    }

    /// The acceptance schedule: bases 2, 4, 8 ... 128 s. Whatever the random draws, eight
    /// calls (seven gaps) have gaps that grow, each within +-20 % of its base.
    #[test]
    fn gaps_grow_monotonically_within_the_jitter_band_for_any_draws() {
        let p = RetryPolicy {
            delays: [2, 4, 8, 16, 32, 64, 128].into_iter().map(secs).collect(),
            max_attempts: 8,
            ..Default::default()
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..10_000 {
            let mut last = Duration::ZERO;
            for attempt in 1..8 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let draw = (seed >> 11) as f64 / (1u64 << 53) as f64;
                let gap = p.next_delay(attempt, None, false, draw).unwrap();
                let base = p.delays[attempt as usize - 1].as_secs_f64();
                assert!(gap > last, "gap {gap:?} after {last:?}");
                assert!(gap.as_secs_f64() >= base * 0.8 && gap.as_secs_f64() <= base * 1.2);
                last = gap;
            }
            assert_eq!(p.next_delay(8, None, false, 0.5), None);
        }
    }

    /// 500 deliveries that fail at the same instant: their first retries spread over the
    /// band, so no 100 ms window holds more than 20 % of them (2 s base, the smallest in
    /// the acceptance schedule).
    #[test]
    fn simultaneous_failures_do_not_retry_in_lockstep() {
        let p = RetryPolicy {
            delays: vec![secs(2)],
            ..Default::default()
        };
        let mut seed = 42_u64;
        let mut at: Vec<Duration> = (0..500)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let draw = (seed >> 11) as f64 / (1u64 << 53) as f64;
                p.next_delay(1, None, false, draw).unwrap()
            })
            .collect();
        at.sort();
        let busiest = (0..at.len())
            .map(|i| {
                at[i..]
                    .iter()
                    .take_while(|t| **t < at[i] + Duration::from_millis(100))
                    .count()
            })
            .max()
            .unwrap();
        assert!(
            busiest <= 100,
            "{busiest} of 500 retries in one 100 ms window"
        );
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            parse_durations("30s,2m,10m,1h,6h").unwrap(),
            RetryPolicy::default().delays
        );
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5").unwrap(), secs(5));
        assert_eq!(parse_duration("1d").unwrap(), secs(86_400));
        assert!(parse_duration("5w").is_err());
        assert_eq!(parse_duration("366d").unwrap(), MAX_DURATION);
        assert!(parse_duration_in("0s", secs(1), secs(60)).is_err());
        assert!(parse_duration_in("2m", secs(1), secs(60)).is_err());
        assert_eq!(
            parse_duration_in("30s", secs(1), secs(60)).unwrap(),
            secs(30)
        );
        assert!(parse_duration("99999999999999999999h").is_err());
        // What Postgres could not store, or a timer could not act on, is refused.
        assert!(parse_duration("18446744073709551615s").is_err());
        assert!(parse_duration("367d").is_err());
        assert!(parse_duration("8785h").is_err());
        assert_eq!(parse_duration("8784h").unwrap(), MAX_DURATION);
    }
}
