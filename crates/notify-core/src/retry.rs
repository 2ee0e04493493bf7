//! Retry schedule: per-attempt base delays with full jitter, a clamped `Retry-After`,
//! and a floor for rate limiting. Pure arithmetic: randomness is passed in.

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

/// A bad `NOTIFY_RETRY_DELAYS`-style schedule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected a number followed by ms, s, m or h (e.g. 30s,2m,1h)")]
pub struct BadDuration(pub String);

/// Parses `"250ms"`, `"30s"`, `"2m"`, `"6h"` (a bare number means seconds).
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
        _ => None,
    }
    .ok_or_else(|| BadDuration(s.to_string()))
}

/// Parses a comma-separated list of durations, e.g. `"30s,2m,10m,1h,6h"`.
pub fn parse_durations(s: &str) -> Result<Vec<Duration>, BadDuration> {
    s.split(',').map(parse_duration).collect()
}

impl RetryPolicy {
    /// Delay before the next attempt after attempt number `attempts_made` (1-based) failed,
    /// or `None` when no attempt is left.
    ///
    /// `jitter` in `[0, 1)` scales the base delay (full jitter). A `retry_after` from the
    /// provider is clamped to `max_retry_after` and used when longer; a rate-limited answer
    /// waits at least `rate_limit_floor`. Never panics or overflows, for any input.
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
        let mut delay = Duration::try_from_secs_f64(base.as_secs_f64() * jitter).unwrap_or(base);
        if let Some(after) = retry_after {
            delay = delay.max(after.min(self.max_retry_after));
        }
        if rate_limited {
            delay = delay.max(self.rate_limit_floor);
        }
        Some(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn default_schedule_with_full_jitter_and_give_up_after_five() {
        let p = RetryPolicy::default();
        let top: Vec<_> = (1..=4)
            .map(|a| p.next_delay(a, None, false, 0.999_999).unwrap().as_secs())
            .collect();
        assert_eq!(top, [29, 119, 599, 3599]);
        assert_eq!(p.next_delay(1, None, false, 0.0), Some(Duration::ZERO));
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
        assert!(q.next_delay(3, Some(Duration::MAX), true, 1.0).is_some());
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            parse_durations("30s,2m,10m,1h,6h").unwrap(),
            RetryPolicy::default().delays
        );
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5").unwrap(), secs(5));
        assert!(parse_duration("5d").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }
}
