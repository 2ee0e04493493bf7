//! The per-user request rate limit of the inbox API (`NOTIFY_INBOX_RATE`).

use crate::error::ApiError;
use std::num::NonZeroU32;

/// Per-user request rate limit.
pub type UserLimiter = governor::RateLimiter<
    String,
    governor::state::keyed::HashMapStateStore<String>,
    governor::clock::QuantaClock,
>;

/// Builds the per-user limiter.
pub fn user_limiter(per_second: u32) -> UserLimiter {
    governor::RateLimiter::hashmap(governor::Quota::per_second(
        NonZeroU32::new(per_second.max(1)).expect("above 0"),
    ))
}

/// Counts one request of `user`: `Err` is the 429 answer, with how long to wait.
pub(crate) fn check(limiter: &UserLimiter, user: &String) -> Result<(), ApiError> {
    limiter.check_key(user).map_err(|not_until| {
        use governor::clock::Clock;
        ApiError::RateLimited(
            not_until.wait_time_from(governor::clock::QuantaClock::default().now()),
        )
    })
}
