//! Whether a worker consumes from its queue now, for the admin `/readyz` check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a worker runtime consumes from RabbitMQ now. [`crate::run`] sets it while its
/// consumer is open; clones share the state, so `main_with` gives one clone to `run` and
/// reads another in `/readyz`. A fresh value is not consuming.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    consuming: Arc<AtomicBool>,
}

impl Readiness {
    /// A handle that is not consuming yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the worker consumes from its queue now.
    pub fn is_consuming(&self) -> bool {
        self.consuming.load(Ordering::SeqCst)
    }

    /// Records that the consumer started (`true`) or stopped (`false`) (also used by
    /// `worker-webhook`, which runs its own consumer).
    pub fn set_consuming(&self, consuming: bool) {
        self.consuming.store(consuming, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_state() {
        let a = Readiness::new();
        let b = a.clone();
        assert!(!b.is_consuming());
        a.set_consuming(true);
        assert!(b.is_consuming());
        a.set_consuming(false);
        assert!(!b.is_consuming());
    }
}
