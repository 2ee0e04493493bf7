//! Per-provider rate limits of one worker process (governor's GCRA): a call waits for its
//! provider's next free slot, so a burst of deliveries is spread out instead of turning into
//! a wall of 429 answers. Limits are per process: with N replicas, the provider sees up to
//! N times the configured rate.
//!
//! Callers waiting for one provider take their slots in arrival order, and only the first
//! of them sleeps on the limiter (on a tokio timer); the rest wait on a fair lock. With
//! governor's own `until_ready` every waiter slept to the same instant on futures-timer's
//! thread and all but one went back to sleep: at 64 deliveries in hand and 1,000 LINE calls
//! a second that doubled worker-line's CPU per delivery (docs/scaling.md, 2026-12-05).
//!
//! The limiter reads Tokio's clock ([`TokioClock`]), the clock it sleeps on and the one
//! the lease reads: in production that is the monotonic clock, and a test that pauses
//! Tokio's time (`#[tokio::test(start_paused = true)]`) advances it instead of waiting.

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;

/// Tokio's clock as governor's: `tokio::time::Instant::now()`, the monotonic clock, or the
/// paused and advanced one of a test.
#[derive(Debug, Clone, Copy, Default)]
struct TokioClock;

impl Clock for TokioClock {
    type Instant = std::time::Instant;

    fn now(&self) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }
}

/// One provider's limiter and the queue of callers waiting for it.
struct Limit {
    limiter: RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<std::time::Instant>>,
    /// Held by the caller whose turn is next; tokio's lock is fair (first come, first
    /// served).
    turn: tokio::sync::Mutex<()>,
}

/// One limiter per configured provider.
#[derive(Default)]
pub struct RateLimits(HashMap<String, Limit>);

impl RateLimits {
    /// Limiters for `per_second` (provider name → calls per second; a burst of up to one
    /// second's worth is allowed at once).
    pub fn new(per_second: &BTreeMap<String, u32>) -> Self {
        Self(
            per_second
                .iter()
                .filter_map(|(p, n)| {
                    let n = NonZeroU32::new(*n)?;
                    let limit = Limit {
                        limiter: RateLimiter::direct_with_clock(Quota::per_second(n), TokioClock),
                        turn: tokio::sync::Mutex::new(()),
                    };
                    Some((p.clone(), limit))
                })
                .collect(),
        )
    }

    /// Waits until a call to `provider` may start (at once for providers without a limit),
    /// after the callers that started waiting for it earlier.
    pub async fn wait(&self, provider: &str) {
        let Some(limit) = self.0.get(provider) else {
            return;
        };
        let _turn = limit.turn.lock().await;
        while let Err(not_until) = limit.limiter.check() {
            let now = limit.limiter.clock().now();
            tokio::time::sleep(not_until.wait_time_from(now)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    // Tokio's time is paused: the limiter's sleeps advance it at once, and the elapsed
    // time is exactly the limiter's waits.

    #[tokio::test(start_paused = true)]
    async fn calls_beyond_the_rate_wait_for_their_slot() {
        let limits = RateLimits::new(&BTreeMap::from([("line".to_string(), 10)]));
        let started = Instant::now();
        for _ in 0..25 {
            limits.wait("line").await;
        }
        // 10 at once, then one every 100 ms: the 25th starts 1.5 s after the first.
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(1500) && waited < Duration::from_millis(1600),
            "{waited:?}"
        );
        let started = Instant::now();
        for _ in 0..1000 {
            limits.wait("fcm").await;
        }
        assert_eq!(started.elapsed(), Duration::ZERO, "no limit");
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_get_their_slots_in_arrival_order() {
        let limits =
            std::sync::Arc::new(RateLimits::new(&BTreeMap::from([("line".to_string(), 20)])));
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let started = Instant::now();
        // The current-thread runtime first polls the tasks in the order they were spawned,
        // so they line up in that order.
        let tasks: Vec<_> = (0..30)
            .map(|i| {
                let (limits, done) = (limits.clone(), done_tx.clone());
                tokio::spawn(async move {
                    limits.wait("line").await;
                    done.send(i).unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        drop(done_tx);
        let mut order = Vec::new();
        while let Some(i) = done_rx.recv().await {
            order.push(i);
        }
        assert_eq!(
            order,
            (0..30).collect::<Vec<_>>(),
            "first come, first served"
        );
        // 20 at once, then one every 50 ms: the 30th starts 0.5 s after the first.
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(500) && waited < Duration::from_millis(600),
            "{waited:?}"
        );
    }
}
