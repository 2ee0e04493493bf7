//! Trying again after a failure, with a wait that grows: the one backoff schedule of every
//! service (broker reconnects, database retries, the relay, the API key listener) and the
//! reconnect loop of everything that holds a connection until shutdown.

use std::fmt::Display;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::error;

/// First wait of [`Backoff::standard`]: 0.2 s.
pub const FIRST_WAIT: Duration = Duration::from_millis(200);

/// Longest wait of [`Backoff::standard`]: 10 s.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// Waits between tries, each twice the one before, up to a ceiling.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Waits of `first`, doubling up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            next: first,
            max,
        }
    }

    /// Starts the schedule again from its first wait (after a try that succeeded).
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// Waits of 0.2 s doubling up to 10 s ([`FIRST_WAIT`], [`MAX_WAIT`]).
    pub const fn standard() -> Self {
        Self::new(FIRST_WAIT, MAX_WAIT)
    }

    /// The wait before the next try; the one after is twice as long (at most the ceiling).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }
}

/// The waits between the lives of something that holds a connection until shutdown (a
/// consumer, a publisher): after each failed life, [`Reconnect::wait_after`] logs the
/// failure and waits the [`Backoff::standard`] schedule (not reset by a life that ran a
/// while), or ends at once at shutdown.
///
/// ```ignore
/// let mut reconnect = Reconnect::new("broker connection failed", &shutdown);
/// while let Err(e) = run_connected(&shutdown).await {
///     if !reconnect.wait_after(&e).await {
///         break;
///     }
/// }
/// ```
#[derive(Debug)]
pub struct Reconnect<'a> {
    failed: &'static str,
    shutdown: &'a CancellationToken,
    backoff: Backoff,
}

impl<'a> Reconnect<'a> {
    /// `failed` names the failure in the log line (`"<failed>; reconnecting"`).
    pub fn new(failed: &'static str, shutdown: &'a CancellationToken) -> Self {
        Self {
            failed,
            shutdown,
            backoff: Backoff::standard(),
        }
    }

    /// Starts the waits again from the first (after a connection that came up healthy).
    pub fn reset(&mut self) {
        self.backoff.reset();
    }

    /// Logs `error` (with the wait, `retry_in_ms`) and waits before the next try.
    /// `false` when `shutdown` was cancelled first: do not try again.
    pub async fn wait_after(&mut self, error: &(dyn Display + Sync)) -> bool {
        let wait = self.backoff.next_wait();
        error!(
            error = %error,
            retry_in_ms = wait.as_millis() as u64,
            "{}; reconnecting",
            self.failed
        );
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(wait) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_ceiling() {
        let mut b = Backoff::standard();
        let waits: Vec<u64> = (0..8).map(|_| b.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
        b.reset();
        assert_eq!(b.next_wait().as_millis(), 200);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_early_at_shutdown() {
        let shutdown = CancellationToken::new();
        let mut r = Reconnect::new("test failed", &shutdown);
        assert!(r.wait_after(&"boom").await);
        shutdown.cancel();
        assert!(!r.wait_after(&"boom").await);
    }
}
