//! The worker's settings, read from the environment.

use notify_broker::Topology;
use notify_core::RetryPolicy;
use notify_core::config::{Env, Missing};
use std::time::Duration;

/// Settings of a worker process.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// AMQP URL.
    pub amqp_url: String,
    /// Names of exchanges and queues.
    pub topology: Topology,
    /// Deliveries worked on at once; also the consumer prefetch.
    pub concurrency: u16,
    /// Lease length; the lease is extended every third of it while a call runs.
    pub lease: Duration,
    /// Retry schedule for transient failures.
    pub retry: RetryPolicy,
    /// How long to wait for in-flight deliveries after shutdown was requested.
    pub shutdown_grace: Duration,
    /// This instance's name, recorded on every attempt.
    pub worker_id: String,
    /// Most provider calls per second of this process, per provider (`line`, `fcm`,
    /// `apns`, `webpush`, `smtp`, `inbox`); providers not named are not limited.
    pub rate_limits: std::collections::BTreeMap<String, u32>,
    /// The link policy rendered content must obey (as ingest applies it to what callers
    /// send): a template can put a payload value into a link.
    pub links: notify_core::links::LinkPolicy,
}

/// Default [`WorkerConfig::rate_limits`]: LINE allows 2,000 push requests a second per
/// channel (LINE Messaging API reference, rate limits), so one process takes half; FCM's
/// default quota is 600,000 messages a minute per project (10,000/s), so one process takes
/// half of that.
pub const DEFAULT_RATE_LIMITS: &str = "line=1000,fcm=5000";

/// Parses `provider=per_second,...` (e.g. `line=1000,fcm=5000`; empty = no limits).
pub fn parse_rate_limits(s: &str) -> Result<std::collections::BTreeMap<String, u32>, String> {
    notify_telemetry::parse_counts(
        s,
        "provider=per_second",
        "rate",
        |name| Ok(name.to_string()),
    )
}

impl WorkerConfig {
    /// Reads `NOTIFY_AMQP_URL` (required; one URL or the comma-separated nodes of a cluster,
    /// see [`notify_broker::connect`]), `NOTIFY_AMQP_PREFIX` (""),
    /// `NOTIFY_WORKER_CONCURRENCY` (16), `NOTIFY_LEASE` (60s), `NOTIFY_RETRY_DELAYS`
    /// (30s,2m,10m,1h,6h), `NOTIFY_SHUTDOWN_GRACE` (30s), `NOTIFY_WORKER_ID` (`$HOSTNAME-pid`),
    /// `NOTIFY_RATE_LIMITS` ([`DEFAULT_RATE_LIMITS`]; calls per second per process),
    /// `NOTIFY_DEV_HTTP_HOSTS` and `NOTIFY_DEEP_LINK_SCHEMES` (the link policy). The attempt budget is the
    /// delivery's own `max_attempts`, set by ingest.
    ///
    /// # Errors
    /// [`Missing`] when `NOTIFY_AMQP_URL` is unset; every problem is also recorded in `env`.
    pub fn from_env(env: &mut Env) -> Result<Self, Missing> {
        let dur = |s: &str| notify_core::retry::parse_duration(s).map_err(|e| e.to_string());
        // Each delay at least 1 s, as the webhook delays: a 0 s delay retries a failing
        // provider in a tight loop.
        let durs = notify_core::retry::parse_retry_delays;
        let amqp_url = env.url_list("NOTIFY_AMQP_URL", &["amqp", "amqps"]);
        let prefix = env.string("NOTIFY_AMQP_PREFIX", "");
        let concurrency = env.parse_with("NOTIFY_WORKER_CONCURRENCY", 16u16, |s| {
            match s.parse::<u16>() {
                Ok(n) if (1..=1000).contains(&n) => Ok(n),
                _ => Err("must be a whole number from 1 to 1000".into()),
            }
        });
        let lease = env.parse_with("NOTIFY_LEASE", Duration::from_secs(60), dur);
        if lease < Duration::from_secs(3) {
            env.error("NOTIFY_LEASE must be at least 3s");
        }
        let mut retry = RetryPolicy::default();
        retry.delays = env.parse_with("NOTIFY_RETRY_DELAYS", retry.delays.clone(), durs);
        let shutdown_grace = env.parse_with("NOTIFY_SHUTDOWN_GRACE", Duration::from_secs(30), dur);
        let default_id = format!(
            "{}-{}",
            env.get("HOSTNAME").unwrap_or("worker"),
            std::process::id()
        );
        let worker_id = env.string("NOTIFY_WORKER_ID", &default_id);
        let rate_limits = env.parse_with(
            "NOTIFY_RATE_LIMITS",
            parse_rate_limits(DEFAULT_RATE_LIMITS).expect("valid defaults"),
            parse_rate_limits,
        );
        let links = notify_core::links::LinkPolicy::from_env(env);
        Ok(Self {
            links,
            rate_limits,
            amqp_url: amqp_url?,
            topology: Topology::new(prefix),
            concurrency,
            lease,
            retry,
            shutdown_grace,
            worker_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(vars: &[(&str, &str)]) -> String {
        let mut env = notify_core::config::Env::from_vars(
            [("NOTIFY_AMQP_URL", "amqp://127.0.0.1:5672/%2f")]
                .into_iter()
                .chain(vars.iter().copied()),
        );
        let _ = WorkerConfig::from_env(&mut env);
        env.finish().err().unwrap_or_default()
    }

    #[test]
    fn a_retry_delay_under_a_second_is_refused_as_the_webhook_delays_are() {
        for value in ["0s", "30s,0s,1h", "500ms", "0"] {
            let e = errors(&[("NOTIFY_RETRY_DELAYS", value)]);
            let line = e
                .lines()
                .find(|l| l.starts_with("NOTIFY_RETRY_DELAYS"))
                .unwrap_or_else(|| panic!("NOTIFY_RETRY_DELAYS={value} accepted: {e:?}"));
            assert!(line.contains("every delay must be at least 1s"), "{line}");
        }
        for value in ["1s", "1s,2s,5s", "30s,2m,10m,1h,6h"] {
            let e = errors(&[("NOTIFY_RETRY_DELAYS", value)]);
            assert!(!e.contains("NOTIFY_RETRY_DELAYS"), "{value}: {e}");
        }
    }
}
