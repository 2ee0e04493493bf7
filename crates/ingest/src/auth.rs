//! Who may call the gRPC API, and how much.
//!
//! - **Authentication.** An API key sent as `authorization: Bearer <key>` metadata
//!   (RFC 6750 syntax), and/or a TLS client certificate whose subject CN names the caller
//!   (mutual TLS with `NOTIFY_GRPC_CLIENT_CA_FILE`). [`AuthMode`] says which are
//!   required. No valid credential: `UNAUTHENTICATED`. The health service is never
//!   checked.
//! - **Scopes.** A key lists the types it may send (exact keys, or prefixes ending in
//!   `*`) and whether it may manage recipients, endpoints, preferences, topics and types.
//!   Anything else: `PERMISSION_DENIED`. Reading events (`GetEvent`, `ExplainDelivery`)
//!   needs only a valid key.
//! - **Quotas.** Per key, `CreateEvent` calls per second (a token bucket whose burst is
//!   the same number; governor) and listed recipients per event. Over either:
//!   `RESOURCE_EXHAUSTED` with a `RetryInfo` detail (how long to wait) or a
//!   `QuotaFailure` detail. Each key has its own bucket, so one runaway caller cannot
//!   spend another's.
//!
//! Keys are cached in memory: every replica loads the table at start, reloads it when
//! the `api_keys` channel announces a change (a revocation takes effect within
//! milliseconds everywhere) and every 30 s in case a notification was missed.

use crate::clock::Clock as PlanningClock;
use crate::error::ApiError;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use notify_store::PgPool;
use notify_store::api_keys::{self, ApiKey};
use notify_telemetry::reconnect::Reconnect;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often every replica reloads the keys even without an `api_keys` notification.
const KEY_RELOAD_EVERY: Duration = Duration::from_secs(30);

/// Which credentials a call must carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// An API key (default).
    ApiKey,
    /// A client certificate naming an active key's caller (needs mutual TLS).
    ClientCert,
    /// Both, naming the same caller.
    Both,
    /// None: every call is allowed everything (local development only).
    Off,
}

impl std::str::FromStr for AuthMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "api_key" => Ok(Self::ApiKey),
            "client_cert" => Ok(Self::ClientCert),
            "both" => Ok(Self::Both),
            "off" => Ok(Self::Off),
            _ => Err("must be api_key, client_cert, both or off".into()),
        }
    }
}

/// The authenticated caller of one call.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Its name, recorded on the events it sends (`anonymous`,
    /// [`notify_store::events::SHARED_CALLER`], with [`AuthMode::Off`]). Event keys are
    /// unique per caller name: each caller has its own namespace of keys.
    pub name: String,
    /// Its key's row; `None` with [`AuthMode::Off`] (everything allowed).
    pub key: Option<Arc<ApiKey>>,
}

/// What a call needs beyond a valid credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Reading events.
    Read,
    /// Managing recipients, endpoints, preferences, topics and types.
    Manage,
}

/// The clock the rate buckets refill by: monotonic time since start in production
/// ([`PlanningClock::Database`]), the manual instant in tests ([`PlanningClock::Manual`]),
/// so that a test advances the clock instead of waiting for a bucket to refill.
#[derive(Debug, Clone)]
struct QuotaClock {
    start: std::time::Instant,
    planning: PlanningClock,
}

impl Clock for QuotaClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        match &self.planning {
            PlanningClock::Database => Nanos::from(self.start.elapsed()),
            // Nanoseconds since 1970: a manual clock set before then reads as 0.
            PlanningClock::Manual(m) => {
                Nanos::from(m.now().timestamp_nanos_opt().unwrap_or(0).max(0) as u64)
            }
        }
    }
}

/// One key's token bucket.
type KeyLimiter = RateLimiter<NotKeyed, InMemoryState, QuotaClock, NoOpMiddleware<Nanos>>;

#[derive(Default)]
struct Cache {
    by_hash: HashMap<Vec<u8>, Arc<ApiKey>>,
    by_name: HashMap<String, Arc<ApiKey>>,
}

/// The key cache, the rate limiters and the mode.
pub struct Auth {
    mode: AuthMode,
    cache: RwLock<Cache>,
    limiters: Mutex<HashMap<uuid::Uuid, (i32, Arc<KeyLimiter>)>>,
    /// Every call of a key (reads and management too): ten times its event rate, at
    /// least 100 per second.
    call_limiters: Mutex<HashMap<uuid::Uuid, (i32, Arc<KeyLimiter>)>>,
    clock: QuotaClock,
}

/// `true` when `type_key` matches one of `patterns` (an exact key, `prefix*`, or `*`).
pub fn type_allowed(patterns: &[String], type_key: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => type_key.starts_with(prefix),
        None => p == type_key,
    })
}

/// The subject CN of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string)
}

impl Auth {
    /// An empty cache in `mode`; call [`Auth::reload`] (or [`Auth::spawn_refresh`]).
    /// The rate buckets refill by monotonic time, or by `clock`'s instant when it is
    /// [`PlanningClock::Manual`] (tests).
    pub fn new(mode: AuthMode, clock: PlanningClock) -> Arc<Self> {
        Arc::new(Self {
            mode,
            cache: RwLock::new(Cache::default()),
            limiters: Mutex::new(HashMap::new()),
            call_limiters: Mutex::new(HashMap::new()),
            clock: QuotaClock {
                start: std::time::Instant::now(),
                planning: clock,
            },
        })
    }

    /// The mode.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Loads every active key.
    pub async fn reload(&self, pool: &PgPool) -> Result<usize, notify_store::StoreError> {
        let keys = api_keys::list(pool).await?;
        let mut cache = Cache::default();
        for k in keys.into_iter().filter(|k| k.revoked_at.is_none()) {
            let k = Arc::new(k);
            cache.by_hash.insert(k.key_hash.clone(), k.clone());
            cache.by_name.insert(k.name.clone(), k);
        }
        let n = cache.by_hash.len();
        *self.cache.write().expect("key cache lock") = cache;
        Ok(n)
    }

    /// Loads the keys now, then keeps them fresh: on every `api_keys` notification, and
    /// every 30 s, until `stop`. The `LISTEN` connection comes from `listen_pool`
    /// (`notify_store::Pools::session`).
    pub async fn spawn_refresh(
        self: &Arc<Self>,
        pool: PgPool,
        listen_pool: PgPool,
        stop: CancellationToken,
    ) -> Result<(), notify_store::StoreError> {
        if self.mode == AuthMode::Off {
            warn!("NOTIFY_GRPC_AUTH=off: every caller may do everything (local development only)");
            return Ok(());
        }
        let n = self.reload(&pool).await?;
        info!(keys = n, mode = ?self.mode, "API keys loaded");
        let auth = self.clone();
        tokio::spawn(async move {
            let mut reconnect = Reconnect::new("API key listener failed", &stop);
            while let Err(e) = auth
                .follow_changes(&pool, &listen_pool, &stop, &mut reconnect)
                .await
            {
                if !reconnect.wait_after(&e).await {
                    break;
                }
            }
        });
        Ok(())
    }

    /// One life of the key listener: `LISTEN api_keys`, then a reload of the keys (for
    /// changes made while no `LISTEN` was active), then one on every notification and
    /// every 30 s, until `stop` (`Ok`) or the listener fails (the error).
    async fn follow_changes(
        &self,
        pool: &PgPool,
        listen_pool: &PgPool,
        stop: &CancellationToken,
        reconnect: &mut Reconnect<'_>,
    ) -> Result<(), sqlx::Error> {
        let mut listener = sqlx::postgres::PgListener::connect_with(listen_pool).await?;
        listener.listen("api_keys").await?;
        reconnect.reset();
        loop {
            if let Err(e) = self.reload(pool).await {
                warn!(error = %e, "API keys not reloaded; keeping the ones I have");
            }
            tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                n = listener.recv() => { n?; }
                _ = tokio::time::sleep(KEY_RELOAD_EVERY) => {}
            }
        }
    }

    /// Authenticates `req` and checks `need`. Errors: `UNAUTHENTICATED` without a valid
    /// credential, `PERMISSION_DENIED` without the scope. Never echoes the key.
    pub fn caller<T>(&self, req: &tonic::Request<T>, need: Need) -> Result<Caller, ApiError> {
        let caller = self.authenticate(req)?;
        if let Some(key) = &caller.key {
            let per_second = key
                .events_per_second
                .saturating_mul(10)
                .clamp(100, 1_000_000);
            self.spend(&self.call_limiters, key, per_second, &caller.name, "calls")?;
        }
        if need == Need::Manage && caller.key.as_ref().is_some_and(|k| !k.can_manage) {
            return Err(ApiError::PermissionDenied(format!(
                "the key of {:?} may not manage recipients, endpoints, preferences, topics or types",
                caller.name
            )));
        }
        Ok(caller)
    }

    fn authenticate<T>(&self, req: &tonic::Request<T>) -> Result<Caller, ApiError> {
        if self.mode == AuthMode::Off {
            return Ok(Caller {
                name: notify_store::events::SHARED_CALLER.into(),
                key: None,
            });
        }
        let cache = self.cache.read().expect("key cache lock");
        let by_key = match req.metadata().get("authorization") {
            None => None,
            Some(v) => {
                let presented = v
                    .to_str()
                    .ok()
                    .and_then(|s| {
                        s.strip_prefix("Bearer ")
                            .or_else(|| s.strip_prefix("bearer "))
                    })
                    .map(str::trim)
                    .ok_or_else(|| {
                        ApiError::Unauthenticated(
                            "authorization metadata must be `Bearer <API key>`".into(),
                        )
                    })?;
                Some(
                    cache
                        .by_hash
                        .get(&api_keys::hash_key(presented))
                        .cloned()
                        .ok_or_else(|| {
                            ApiError::Unauthenticated("unknown or revoked API key".into())
                        })?,
                )
            }
        };
        let by_cert = match req.peer_certs() {
            None => None,
            Some(certs) => {
                let cn = certs.first().and_then(|c| common_name(c.as_ref()));
                match cn.and_then(|cn| cache.by_name.get(&cn).cloned()) {
                    Some(k) => Some(k),
                    None if self.mode == AuthMode::ApiKey => None,
                    None => {
                        return Err(ApiError::Unauthenticated(
                            "the client certificate's CN names no active caller".into(),
                        ));
                    }
                }
            }
        };
        let key = match (self.mode, by_key, by_cert) {
            (AuthMode::ApiKey, Some(k), _) => k,
            (AuthMode::ClientCert, _, Some(c)) => c,
            (AuthMode::Both, Some(k), Some(c)) if k.id == c.id => k,
            (AuthMode::Both, Some(_), Some(_)) => {
                return Err(ApiError::Unauthenticated(
                    "the API key and the client certificate name different callers".into(),
                ));
            }
            (AuthMode::ApiKey | AuthMode::Both, None, _) => {
                return Err(ApiError::Unauthenticated(
                    "missing `authorization: Bearer <API key>` metadata".into(),
                ));
            }
            (AuthMode::ClientCert | AuthMode::Both, _, None) => {
                return Err(ApiError::Unauthenticated(
                    "a client certificate is required".into(),
                ));
            }
            (AuthMode::Off, ..) => unreachable!("handled above"),
        };
        Ok(Caller {
            name: key.name.clone(),
            key: Some(key),
        })
    }

    /// Whether `caller` may read an event sent by `sender`: its own events, or any with the
    /// manage scope (operators' tools). Others' events are "not found", so event ids
    /// cannot be probed.
    pub fn may_read(&self, caller: &Caller, sender: &str) -> bool {
        self.reads_every_event(caller) || sender == caller.name
    }

    /// Whether `caller` may read every caller's events: with the manage scope, or with
    /// [`AuthMode::Off`] (where every call is the one shared caller anyway).
    pub fn reads_every_event(&self, caller: &Caller) -> bool {
        caller.key.as_ref().is_none_or(|k| k.can_manage)
    }

    /// Checks that `caller` may send `type_key` to `recipients` listed recipients now,
    /// spending one token of its rate. Scope first, then size, then rate, so a refused
    /// call spends nothing.
    pub fn check_send(
        &self,
        caller: &Caller,
        type_key: &str,
        recipients: usize,
    ) -> Result<(), ApiError> {
        let Some(key) = &caller.key else {
            return Ok(());
        };
        if !type_allowed(&key.send_types, type_key) {
            // Never echo unbounded input.
            let shown: String = type_key.chars().take(64).collect();
            return Err(ApiError::PermissionDenied(format!(
                "the key of {:?} may not send type {shown:?} (it may send: {})",
                caller.name,
                if key.send_types.is_empty() {
                    "nothing".to_string()
                } else {
                    key.send_types.join(", ")
                }
            )));
        }
        // Over the API's own limit, validation names the field (INVALID_ARGUMENT).
        if recipients > key.max_recipients as usize
            && recipients <= notify_core::event::MAX_RECIPIENTS
        {
            return Err(ApiError::QuotaExceeded {
                subject: format!("api_key:{}", caller.name),
                description: format!(
                    "recipients: at most {} per event for this key, got {recipients}",
                    key.max_recipients
                ),
                retry_after: None,
            });
        }
        self.spend(
            &self.limiters,
            key,
            key.events_per_second,
            &caller.name,
            "events",
        )
    }

    /// Takes one token from `key`'s bucket in `map` (made at `per_second`, remade when
    /// that changes); `RESOURCE_EXHAUSTED` with the wait when it is empty.
    fn spend(
        &self,
        map: &Mutex<HashMap<uuid::Uuid, (i32, Arc<KeyLimiter>)>>,
        key: &ApiKey,
        per_second: i32,
        name: &str,
        what: &str,
    ) -> Result<(), ApiError> {
        let limiter = {
            let mut map = map.lock().expect("limiter lock");
            let entry = map
                .entry(key.id)
                .or_insert_with(|| (per_second, Arc::new(self.limiter(per_second))));
            if entry.0 != per_second {
                *entry = (per_second, Arc::new(self.limiter(per_second)));
            }
            entry.1.clone()
        };
        if let Err(not_until) = limiter.check() {
            let wait = not_until.wait_time_from(self.clock.now());
            return Err(ApiError::QuotaExceeded {
                subject: format!("api_key:{name}"),
                description: format!("{what}: at most {per_second} per second for this key"),
                retry_after: Some(wait.max(Duration::from_millis(1))),
            });
        }
        Ok(())
    }

    /// A bucket of `per_second` tokens (at least 1), refilled at that rate.
    fn limiter(&self, per_second: i32) -> KeyLimiter {
        let n = NonZeroU32::new(per_second.max(1) as u32).expect("at least 1");
        RateLimiter::direct_with_clock(Quota::per_second(n), self.clock.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_patterns_match_exact_keys_and_prefixes() {
        let p = vec!["order_*".to_string(), "security_login".to_string()];
        assert!(type_allowed(&p, "order_paid"));
        assert!(type_allowed(&p, "security_login"));
        assert!(!type_allowed(&p, "security_login_new_device"));
        assert!(!type_allowed(&p, "orders"));
        assert!(type_allowed(&["*".to_string()], "anything"));
        assert!(!type_allowed(&[], "order_paid"));
    }

    /// Production's clock (no manual one) is the monotonic time since the `Auth` was made,
    /// so the buckets refill as real time passes; the refill arithmetic is the one the
    /// manual-clock test below checks.
    #[test]
    fn buckets_read_monotonic_time_since_start_without_a_manual_clock() {
        let clock = QuotaClock {
            start: std::time::Instant::now() - Duration::from_secs(5),
            planning: PlanningClock::Database,
        };
        let (a, b) = (clock.now(), clock.now());
        assert!(Duration::from(a) >= Duration::from_secs(5), "{a:?}");
        assert!(b >= a, "never backwards");
    }

    #[test]
    fn buckets_refill_by_the_manual_clock_when_a_test_sets_one() {
        let manual = crate::clock::ManualClock::new(chrono::Utc::now());
        let auth = Auth::new(AuthMode::ApiKey, PlanningClock::Manual(manual.clone()));
        let bucket = auth.limiter(2);
        assert!(bucket.check().is_ok() && bucket.check().is_ok());
        let refused = bucket.check().expect_err("the burst of 2 is spent");
        assert_eq!(
            refused.wait_time_from(auth.clock.now()),
            Duration::from_millis(500)
        );
        // Time stands still until the test moves it.
        assert!(bucket.check().is_err());
        manual.advance(chrono::Duration::milliseconds(500));
        assert!(bucket.check().is_ok());
        assert!(bucket.check().is_err());
    }
}
