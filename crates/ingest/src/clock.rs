//! The clock planning decides by (dedup buckets, quiet hours, fatigue windows, digest
//! windows), for the group-commit writer and the topic fan-out.
//!
//! In production it is the database's `now()` of the writing transaction
//! ([`Clock::Database`], the default): the clock due times, claims and leases use, so a
//! skewed ingest host cannot move a quiet window, a dedup bucket or a fatigue window. A
//! test sets the planning instant with a [`ManualClock`] instead of waiting for a bucket
//! or window boundary on the wall clock. Only planning reads it: created times, due-time
//! checks, claims and leases stay on the database clock.

use chrono::{DateTime, Utc};
use notify_store::StoreError;
use notify_store::events;
use std::sync::{Arc, Mutex};

/// Where the planning instant comes from.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The database's `now()` of the transaction that writes the plan (production).
    #[default]
    Database,
    /// An instant the holder of the [`ManualClock`] sets (tests).
    Manual(ManualClock),
}

impl Clock {
    /// The planning instant for the transaction `tx`.
    ///
    /// # Errors
    /// `StoreError` when the database cannot be asked (`Database` only).
    pub async fn now(
        &self,
        tx: &mut notify_store::sqlx::PgConnection,
    ) -> Result<DateTime<Utc>, StoreError> {
        match self {
            Clock::Database => events::database_now(tx).await,
            Clock::Manual(m) => Ok(m.now()),
        }
    }

    /// The planning instant of a transaction whose `now()` is already known as
    /// `database_now` (from [`notify_store::erasure::begin_planning`]): no round trip.
    pub fn at(&self, database_now: DateTime<Utc>) -> DateTime<Utc> {
        match self {
            Clock::Database => database_now,
            Clock::Manual(m) => m.now(),
        }
    }
}

/// A settable instant shared by its clones: set it in a test, and every plan written
/// afterwards is decided at it.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<DateTime<Utc>>>);

impl ManualClock {
    /// A clock showing `at`.
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(Arc::new(Mutex::new(at)))
    }

    /// The instant it shows.
    pub fn now(&self) -> DateTime<Utc> {
        *self.0.lock().expect("manual clock lock")
    }

    /// Makes it show `at`.
    pub fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().expect("manual clock lock") = at;
    }

    /// Moves it by `by` (negative: back).
    pub fn advance(&self, by: chrono::Duration) {
        let mut at = self.0.lock().expect("manual clock lock");
        *at += by;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_is_shared_by_its_clones() {
        let t0 = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let a = ManualClock::new(t0);
        let b = a.clone();
        b.advance(chrono::Duration::seconds(2));
        assert_eq!(a.now(), t0 + chrono::Duration::seconds(2));
        a.set(t0);
        assert_eq!(b.now(), t0);
        assert!(matches!(Clock::default(), Clock::Database));
    }
}
