//! The writer tasks' supervision: a task that panics is started again.

use tracing::error;

/// Runs the task `start` makes, and a new one in its place each time one panics, until
/// one returns or is cancelled.
///
/// A writer task that panicked (no such path is known) would otherwise leave its replica
/// with one writer fewer; with one writer, the default, every later `CreateEvent` would
/// fail until a restart. The requests of the panicked batch are answered as if the writer
/// had stopped (`UNAVAILABLE`); callers retry them under the same `event_key`, which finds
/// any that did commit.
pub(super) async fn restart_on_panic<F, Fut>(what: &'static str, mut start: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        match tokio::spawn(start()).await {
            Err(e) if e.is_panic() => {
                error!(task = what, error = %e, "task panicked; starting it again")
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::restart_on_panic;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_task_that_panics_is_started_again_and_one_that_returns_is_not() {
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        restart_on_panic("test task", move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    panic!("writer bug number {n}");
                }
            }
        })
        .await;
        // Two panics, each followed by a new start; the third returned and ended it.
        assert_eq!(starts.load(Ordering::SeqCst), 3);
    }
}
