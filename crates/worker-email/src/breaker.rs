//! A circuit breaker per email provider, pure: every call takes the current instant, so the
//! tests drive it with exact instants. The instants are Tokio's
//! ([`tokio::time::Instant`]: the monotonic clock in production), which
//! [`crate::providers::Providers`] reads, so a test that pauses Tokio's time moves past a
//! cooldown with `tokio::time::advance` instead of waiting it out.
//!
//! - **Closed**: every attempt is admitted. It opens after [`BreakerConfig::failures`]
//!   consecutive transient failures, or when, over the last [`BreakerConfig::window`], at
//!   least [`BreakerConfig::min_calls`] calls were made and more than
//!   [`BreakerConfig::failure_rate`] of them failed transiently.
//! - **Open**: nothing is admitted until [`BreakerConfig::cooldown`] has passed since it
//!   opened; then the next [`Breaker::admit`] turns it half-open and admits that one call as
//!   the probe.
//! - **Half-open**: only the probe is in flight; a success closes the breaker (counts
//!   reset), a transient failure opens it again for another cooldown, and a probe that
//!   ended without an answer either way ([`Breaker::release`]) lets the next call probe.
//!
//! Only transient failures of the provider count (RFC 5321 4xx, connection errors and
//! timeouts; HTTP 5xx and 429). A permanent answer about the address (550 5.1.1) is the
//! provider working, and counts as a success.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// Thresholds of a breaker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive transient failures that open the breaker (`NOTIFY_EMAIL_BREAKER_FAILURES`,
    /// default 5; at least 1).
    pub failures: u32,
    /// How long an open breaker admits nothing before its half-open probe
    /// (`NOTIFY_EMAIL_BREAKER_COOLDOWN`, default 30 s).
    pub cooldown: Duration,
    /// The window of the failure rate (60 s).
    pub window: Duration,
    /// Fewest calls in the window for the failure rate to count (20).
    pub min_calls: u32,
    /// The share of failed calls in the window above which the breaker opens (0.5).
    pub failure_rate: f64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failures: 5,
            cooldown: Duration::from_secs(30),
            window: Duration::from_secs(60),
            min_calls: 20,
            failure_rate: 0.5,
        }
    }
}

/// The state of a breaker; the number is the value of `notify_email_breaker_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Admits every call (0).
    Closed = 0,
    /// Admits one probe (1).
    HalfOpen = 1,
    /// Admits nothing until the cooldown has passed (2).
    Open = 2,
}

impl State {
    /// `closed`, `half_open` or `open` (the console's and the table's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::HalfOpen => "half_open",
            State::Open => "open",
        }
    }
}

/// A state change, for metrics and the `email_provider_states` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
}

/// One provider's breaker.
#[derive(Debug, Clone)]
pub struct Breaker {
    cfg: BreakerConfig,
    state: State,
    consecutive: u32,
    /// Calls in the window: (when, failed).
    calls: VecDeque<(Instant, bool)>,
    opened_at: Option<Instant>,
    probe_in_flight: bool,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg,
            state: State::Closed,
            consecutive: 0,
            calls: VecDeque::new(),
            opened_at: None,
            probe_in_flight: false,
        }
    }

    /// The current state (an open breaker whose cooldown has passed still says `Open`
    /// until a call is admitted as its probe).
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether a call may go to this provider at `now`, and the transition it caused (open
    /// to half-open when the cooldown has passed: this call is the probe).
    pub fn admit(&mut self, now: Instant) -> (bool, Option<Transition>) {
        match self.state {
            State::Closed => (true, None),
            State::HalfOpen if self.probe_in_flight => (false, None),
            State::HalfOpen => {
                self.probe_in_flight = true;
                (true, None)
            }
            State::Open => {
                let opened = self.opened_at.unwrap_or(now);
                if now.saturating_duration_since(opened) >= self.cfg.cooldown {
                    self.probe_in_flight = true;
                    (true, self.go(State::HalfOpen))
                } else {
                    (false, None)
                }
            }
        }
    }

    /// How long from `now` until this breaker admits a call again: zero when closed (or
    /// half-open with no probe out), the rest of the cooldown when open, and one second
    /// when its half-open probe is still out (its answer decides).
    pub fn admits_again_in(&self, now: Instant) -> Duration {
        match self.state {
            State::Closed => Duration::ZERO,
            State::HalfOpen if self.probe_in_flight => Duration::from_secs(1),
            State::HalfOpen => Duration::ZERO,
            State::Open => {
                let opened = self.opened_at.unwrap_or(now);
                self.cfg
                    .cooldown
                    .saturating_sub(now.saturating_duration_since(opened))
            }
        }
    }

    /// The admitted call got an answer that shows the provider working (accepted, or a
    /// permanent answer about the message or address).
    pub fn success(&mut self, now: Instant) -> Option<Transition> {
        self.probe_in_flight = false;
        self.consecutive = 0;
        self.push(now, false);
        match self.state {
            State::HalfOpen | State::Open => {
                self.calls.clear();
                self.opened_at = None;
                self.go(State::Closed)
            }
            State::Closed => None,
        }
    }

    /// The admitted call failed transiently (4xx, connection error, timeout, HTTP 5xx or
    /// 429).
    pub fn failure(&mut self, now: Instant) -> Option<Transition> {
        self.probe_in_flight = false;
        self.consecutive = self.consecutive.saturating_add(1);
        self.push(now, true);
        let open = match self.state {
            State::HalfOpen => true,
            State::Open => false,
            State::Closed => self.consecutive >= self.cfg.failures.max(1) || self.rate_exceeded(),
        };
        if open {
            self.opened_at = Some(now);
            self.go(State::Open)
        } else {
            None
        }
    }

    /// The admitted call ended without telling anything about the provider (the lease was
    /// lost before sending): a half-open breaker lets the next call probe.
    pub fn release(&mut self) {
        self.probe_in_flight = false;
    }

    fn push(&mut self, now: Instant, failed: bool) {
        self.calls.push_back((now, failed));
        while let Some(&(at, _)) = self.calls.front() {
            if now.saturating_duration_since(at) > self.cfg.window {
                self.calls.pop_front();
            } else {
                break;
            }
        }
    }

    fn rate_exceeded(&self) -> bool {
        let total = self.calls.len();
        if total == 0 || total < self.cfg.min_calls as usize {
            return false;
        }
        let failed = self.calls.iter().filter(|(_, f)| *f).count();
        failed as f64 / total as f64 > self.cfg.failure_rate
    }

    fn go(&mut self, to: State) -> Option<Transition> {
        let from = self.state;
        self.state = to;
        (from != to).then_some(Transition { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            failures: 3,
            cooldown: Duration::from_secs(30),
            window: Duration::from_secs(60),
            min_calls: 10,
            failure_rate: 0.5,
        }
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn opens_after_n_consecutive_failures_and_probes_after_the_cooldown() {
        let t0 = Instant::now();
        let mut b = Breaker::new(cfg());
        assert_eq!(b.admit(t0), (true, None));
        assert_eq!(b.failure(t0), None);
        assert_eq!(b.failure(at(t0, 1)), None);
        // A success in between resets the count.
        assert_eq!(b.success(at(t0, 2)), None);
        assert_eq!(b.failure(at(t0, 3)), None);
        assert_eq!(b.failure(at(t0, 4)), None);
        assert_eq!(
            b.failure(at(t0, 5)),
            Some(Transition {
                from: State::Closed,
                to: State::Open
            })
        );
        assert_eq!(b.state(), State::Open);
        assert_eq!(b.admits_again_in(at(t0, 5)), Duration::from_secs(30));
        assert_eq!(b.admits_again_in(at(t0, 20_005)), Duration::from_secs(10));
        // Nothing is admitted until exactly 30 s after it opened.
        assert_eq!(b.admit(at(t0, 5)), (false, None));
        assert_eq!(b.admit(at(t0, 30_004)), (false, None));
        assert_eq!(
            b.admit(at(t0, 30_005)),
            (
                true,
                Some(Transition {
                    from: State::Open,
                    to: State::HalfOpen
                })
            )
        );
        // One probe at a time; its answer decides, so look again in a second.
        assert_eq!(b.admit(at(t0, 30_006)), (false, None));
        assert_eq!(b.admits_again_in(at(t0, 30_006)), Duration::from_secs(1));
        // A failed probe opens it again, for a new cooldown from the failure.
        assert_eq!(
            b.failure(at(t0, 30_100)),
            Some(Transition {
                from: State::HalfOpen,
                to: State::Open
            })
        );
        assert_eq!(b.admit(at(t0, 60_099)), (false, None));
        assert!(b.admit(at(t0, 60_100)).0);
        // A successful probe closes it.
        assert_eq!(
            b.success(at(t0, 60_200)),
            Some(Transition {
                from: State::HalfOpen,
                to: State::Closed
            })
        );
        assert_eq!(b.admit(at(t0, 60_201)), (true, None));
        // Counts start again from zero after closing.
        assert_eq!(b.failure(at(t0, 60_300)), None);
        assert_eq!(b.failure(at(t0, 60_400)), None);
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn a_released_probe_lets_the_next_call_probe() {
        let t0 = Instant::now();
        let mut b = Breaker::new(BreakerConfig {
            failures: 1,
            ..cfg()
        });
        b.failure(t0);
        assert!(b.admit(at(t0, 30_000)).0);
        assert!(!b.admit(at(t0, 30_001)).0);
        b.release();
        assert_eq!(b.state(), State::HalfOpen);
        assert_eq!(b.admit(at(t0, 30_002)), (true, None));
    }

    #[test]
    fn opens_on_the_failure_rate_over_the_window() {
        let t0 = Instant::now();
        let mut b = Breaker::new(cfg());
        // 10 calls, alternating: never 3 failures in a row, 5 of 10 failed = 50%, not over.
        for i in 0..10u64 {
            if i % 2 == 0 {
                assert_eq!(b.failure(at(t0, i * 1000)), None);
            } else {
                assert_eq!(b.success(at(t0, i * 1000)), None);
            }
        }
        assert_eq!(b.state(), State::Closed);
        // The 11th call fails: 6 of 11 > 50%.
        assert_eq!(
            b.failure(at(t0, 10_000)),
            Some(Transition {
                from: State::Closed,
                to: State::Open
            })
        );
    }

    #[test]
    fn calls_older_than_the_window_do_not_count() {
        let t0 = Instant::now();
        let mut b = Breaker::new(cfg());
        for i in 0..9u64 {
            b.failure(at(t0, i));
            b.success(at(t0, i));
        }
        // 18 calls at t0.., 9 failed. 61 s later they are out of the window: one failure
        // alone is neither 3 in a row nor 10 calls.
        assert_eq!(b.failure(at(t0, 61_000)), None);
        assert_eq!(b.state(), State::Closed);
    }
}
