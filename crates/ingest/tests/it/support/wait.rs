//! Waiting on conditions with a deadline instead of sleeping a fixed time.

use std::fmt::Debug;
use std::time::Duration;

/// How often [`eventually`] and [`settle`] look again.
const POLL_EVERY: Duration = Duration::from_millis(25);

/// Waits for a condition: calls `probe` at once and then every 25 ms until it returns
/// `Ok(value)`, and returns that value. `probe` returns `Err(observed)` while the
/// condition does not hold yet; when `within` has passed, this panics with `what` and the
/// last observed state. A probe may itself panic (assert) on a state that must never be
/// seen on the way.
pub(crate) async fn eventually<T, S: Debug>(
    what: &str,
    within: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, S>,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let observed = match probe().await {
            Ok(value) => return value,
            Err(observed) => observed,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: not within {within:?}; last observed: {observed:#?}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Asserts that nothing more happens within `within`: calls `probe` every 25 ms for the
/// whole of `within`, and once more at its end, and panics with `what` and the observed
/// state as soon as `probe` returns `Err(observed)`. For promises of the form "no second
/// send within X"; prefer [`eventually`] on a positive signal where the system offers one.
pub(crate) async fn settle<S: Debug>(
    what: &str,
    within: Duration,
    mut probe: impl AsyncFnMut() -> Result<(), S>,
) {
    let end = tokio::time::Instant::now() + within;
    loop {
        if let Err(observed) = probe().await {
            panic!("{what}: broken within {within:?}; observed: {observed:#?}");
        }
        let now = tokio::time::Instant::now();
        if now >= end {
            return;
        }
        tokio::time::sleep(POLL_EVERY.min(end - now)).await;
    }
}

impl super::Platform {
    /// Waits (at most `within`, else panics naming `what`) until the relay has published
    /// every outbox row: the outbox table is empty.
    pub(crate) async fn wait_outbox_empty(&self, what: &str, within: Duration) {
        eventually(what, within, async || match self.count("outbox").await {
            0 => Ok(()),
            n => Err(n),
        })
        .await;
    }
}

impl super::Platform {
    /// Waits (at most `within`, else panics naming `what`) until `queue` holds exactly
    /// `n` ready messages.
    pub(crate) async fn wait_queue_depth(&self, queue: &str, n: u32, what: &str, within: Duration) {
        eventually(what, within, async || match self.queue_depth(queue).await {
            depth if depth == n => Ok(()),
            depth => Err(depth),
        })
        .await;
    }

    /// Waits (30 s at most, else panics) until ingest's gRPC health service answers
    /// `SERVING` on [`super::Platform::grpc`] (a restarted or spawned ingest is up).
    pub(crate) async fn wait_serving(&self) {
        eventually("ingest serving", Duration::from_secs(30), async || {
            let status = tonic_health::pb::health_client::HealthClient::new(self.grpc.clone())
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await
                .map(|r| r.into_inner().status);
            match status {
                Ok(1) => Ok(()),
                other => Err(other),
            }
        })
        .await;
    }

    /// Waits (at most `within`, else panics naming `what`) until `table` holds `n` rows.
    pub(crate) async fn wait_count(&self, table: &str, n: i64, what: &str, within: Duration) {
        eventually(what, within, async || match self.count(table).await {
            c if c == n => Ok(()),
            c => Err(c),
        })
        .await;
    }

    /// Waits (10 s at most) until the simulator has seen a call to `provider` (a call
    /// is in progress or done); returns how many it has seen.
    pub(crate) async fn wait_provider_called(&self, provider: &str) -> usize {
        eventually(
            "the provider call started",
            Duration::from_secs(10),
            async || match self.sim_count(provider).await {
                0 => Err(0),
                n => Ok(n),
            },
        )
        .await
    }

    /// Waits (at most `within`) until `event_id`'s fan-out is done; returns the event.
    pub(crate) async fn wait_fanout_done(
        &self,
        event_id: &str,
        within: Duration,
    ) -> notify_proto::v1::GetEventResponse {
        eventually("fan-out done", within, async || {
            let e = self.get_event(event_id).await;
            if e.fanout_status == "done" {
                Ok(e)
            } else {
                Err(e.fanout_status)
            }
        })
        .await
    }

    /// Waits (at most `within`, else panics naming `what`) until MailDev holds exactly `n`
    /// emails to `address`.
    pub(crate) async fn wait_mails(&self, address: &str, n: usize, what: &str, within: Duration) {
        eventually(what, within, async || {
            match self.mails_to(address).await.len() {
                c if c == n => Ok(()),
                c => Err(c),
            }
        })
        .await;
    }

    /// Waits (at most `within`, else panics naming `what`) until the count `sql` returns
    /// with `arg` bound as `$1` is `want`.
    pub(crate) async fn wait_scalar<'q, A>(
        &self,
        what: &str,
        within: Duration,
        sql: &'static str,
        arg: A,
        want: i64,
    ) where
        A: 'q + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Clone,
    {
        eventually(what, within, async || {
            let got: i64 = self.scalar(sql, arg.clone()).await;
            if got == want { Ok(()) } else { Err(got) }
        })
        .await;
    }

    /// Waits (at most `within`, else panics naming `what`) until the count `sql` (no
    /// parameters) returns is `want`.
    pub(crate) async fn wait_query_scalar(
        &self,
        what: &str,
        within: Duration,
        sql: &'static str,
        want: i64,
    ) {
        eventually(what, within, async || {
            let got: i64 = self.query_scalar(sql).await;
            if got == want { Ok(()) } else { Err(got) }
        })
        .await;
    }
}
