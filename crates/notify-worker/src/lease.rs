//! The lease of one claimed delivery, as the provider adapter sees it.
//!
//! Fencing the record by the lease token keeps a worker whose lease was taken from
//! writing; it does not keep it from calling the provider. So every adapter calls
//! [`Lease::confirm`] at its call's point of no return (before SMTP `DATA`, before the
//! HTTP request is written, before the inbox insert) and abandons the call when the lease
//! is gone: the runtime then writes nothing and acks the message.
//!
//! The lease is known live until a local monotonic deadline: the moment the claim or the
//! last successful extension was *asked* (before the database set `now() + lease`), plus
//! the lease length. Tokio's `Instant` is `CLOCK_MONOTONIC`, which keeps running while a
//! process is stopped (SIGSTOP) or the host is suspended, so a worker resumed after its
//! lease ran out never takes the fast path.

use notify_store::PgPool;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// The lease of one claimed delivery: whether the heartbeat found it lost, and until when
/// (local monotonic clock) it is known to be held.
#[derive(Debug)]
pub struct Lease {
    pool: Option<PgPool>,
    delivery_id: Uuid,
    token: Uuid,
    length: Duration,
    state: Mutex<State>,
    abandoned: AtomicBool,
}

#[derive(Debug)]
struct State {
    /// The heartbeat or a confirmation found the lease taken (final).
    lost: bool,
    /// Held at least until then.
    live_until: Instant,
}

/// Why [`Lease::confirm`] refused: the provider must not be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLost {
    /// Another claim or the sweeper took the lease (the delivery is no longer `sending`
    /// under this token).
    #[error("the lease was taken: another worker or the sweeper owns the delivery")]
    Taken,
    /// The lease ran out on the local clock and the database could not be asked.
    #[error("the lease could not be confirmed: the database did not answer")]
    Unconfirmed,
}

impl LeaseLost {
    /// The attempt outcome an adapter returns for an abandoned call. The runtime records
    /// nothing for it (see [`Lease::abandoned`]); the code only names it in traces.
    pub fn outcome(self, content: serde_json::Value) -> notify_core::AttemptOutcome {
        notify_core::AttemptOutcome::failed(
            notify_core::ErrorClass::Transient,
            "lease_lost",
            content,
        )
        .with_response(self.to_string())
    }
}

impl Lease {
    /// The lease of delivery `delivery_id` under `token`, `length` long, claimed by a
    /// statement asked at `asked_at` (local monotonic clock).
    pub fn new(
        pool: PgPool,
        delivery_id: Uuid,
        token: Uuid,
        length: Duration,
        asked_at: Instant,
    ) -> Self {
        Self {
            pool: Some(pool),
            delivery_id,
            token,
            length,
            state: Mutex::new(State {
                lost: false,
                live_until: asked_at + length,
            }),
            abandoned: AtomicBool::new(false),
        }
    }

    /// A lease that never needs the database: held for `length` from now. For adapter
    /// tests outside the runtime.
    pub fn held_for(length: Duration) -> Self {
        Self {
            pool: None,
            delivery_id: Uuid::nil(),
            token: Uuid::nil(),
            length,
            state: Mutex::new(State {
                lost: false,
                live_until: Instant::now() + length,
            }),
            abandoned: AtomicBool::new(false),
        }
    }

    /// The lease length.
    pub fn length(&self) -> Duration {
        self.length
    }

    /// Whether the heartbeat (or a confirmation) found the lease taken.
    pub fn is_lost(&self) -> bool {
        self.lock().lost
    }

    /// Whether an adapter was refused by [`Lease::confirm`]: no provider call was made
    /// after that, and the runtime writes nothing for the attempt.
    pub fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// An extension asked at `asked_at` succeeded.
    pub(crate) fn extended(&self, asked_at: Instant) {
        let mut s = self.lock();
        s.live_until = s.live_until.max(asked_at + self.length);
    }

    /// An extension found the lease taken.
    pub(crate) fn lost(&self) {
        self.lock().lost = true;
    }

    /// Confirms the lease at the call's point of no return. Without a database round trip
    /// when the lease is held for at least a third of its length more by the monotonic
    /// clock; otherwise extends it once in the database. `Err` means: do not call the
    /// provider, return [`LeaseLost::outcome`].
    pub async fn confirm(&self) -> Result<(), LeaseLost> {
        let result = self.check().await;
        if result.is_err() {
            self.abandoned.store(true, Ordering::SeqCst);
        }
        result
    }

    async fn check(&self) -> Result<(), LeaseLost> {
        {
            let s = self.lock();
            if s.lost {
                return Err(LeaseLost::Taken);
            }
            if Instant::now() + self.length / 3 <= s.live_until {
                return Ok(());
            }
        }
        let Some(pool) = &self.pool else {
            return Err(LeaseLost::Unconfirmed);
        };
        let asked = Instant::now();
        match notify_store::deliveries::extend_lease(
            pool,
            self.delivery_id,
            self.token,
            self.length,
        )
        .await
        {
            Ok(true) => {
                self.extended(asked);
                Ok(())
            }
            Ok(false) => {
                self.lost();
                Err(LeaseLost::Taken)
            }
            Err(_) => Err(LeaseLost::Unconfirmed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_past_its_monotonic_deadline_is_not_confirmed_without_the_database() {
        let lease = Lease::held_for(Duration::from_secs(30));
        assert_eq!(lease.confirm().await, Ok(()));
        assert!(!lease.abandoned());
        // Frozen for 25 s: less than a third of the lease left.
        tokio::time::advance(Duration::from_secs(25)).await;
        assert_eq!(lease.confirm().await, Err(LeaseLost::Unconfirmed));
        assert!(lease.abandoned());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_the_heartbeat_found_lost_is_refused_at_once() {
        let lease = Lease::held_for(Duration::from_secs(30));
        lease.lost();
        assert!(lease.is_lost());
        assert_eq!(lease.confirm().await, Err(LeaseLost::Taken));
        assert!(lease.abandoned());
    }

    #[tokio::test(start_paused = true)]
    async fn an_extension_moves_the_deadline() {
        let lease = Lease::held_for(Duration::from_secs(30));
        tokio::time::advance(Duration::from_secs(25)).await;
        lease.extended(Instant::now());
        assert_eq!(lease.confirm().await, Ok(()));
    }
}
