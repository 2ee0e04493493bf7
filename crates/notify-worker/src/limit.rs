//! Per-provider rate limits of one worker process (governor's GCRA): a call waits for its
//! provider's next free slot, so a burst of deliveries is spread out instead of turning into
//! a wall of 429 answers. Limits are per process: with N replicas, the provider sees up to
//! N times the configured rate.

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;

/// One limiter per configured provider.
#[derive(Default)]
pub struct RateLimits(HashMap<String, DefaultDirectRateLimiter>);

impl RateLimits {
    /// Limiters for `per_second` (provider name → calls per second; a burst of up to one
    /// second's worth is allowed at once).
    pub fn new(per_second: &BTreeMap<String, u32>) -> Self {
        Self(
            per_second
                .iter()
                .filter_map(|(p, n)| {
                    let n = NonZeroU32::new(*n)?;
                    Some((p.clone(), RateLimiter::direct(Quota::per_second(n))))
                })
                .collect(),
        )
    }

    /// Waits until a call to `provider` may start (at once for providers without a limit).
    pub async fn wait(&self, provider: &str) {
        if let Some(limiter) = self.0.get(provider) {
            limiter.until_ready().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_beyond_the_rate_wait_for_their_slot() {
        let limits = RateLimits::new(&BTreeMap::from([("line".to_string(), 10)]));
        let started = std::time::Instant::now();
        for _ in 0..25 {
            limits.wait("line").await;
        }
        // 10 at once, then one every 100 ms: the 25th starts after about 1.5 s.
        assert!(started.elapsed() >= std::time::Duration::from_millis(1400));
        let started = std::time::Instant::now();
        for _ in 0..1000 {
            limits.wait("fcm").await;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_millis(500),
            "no limit"
        );
    }
}
