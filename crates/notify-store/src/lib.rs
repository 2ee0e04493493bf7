//! PostgreSQL access for the platform (sqlx, runtime-checked queries). Repository
//! functions take an executor or a pool; callers that need atomicity pass a transaction
//! and own the commit. Migrations live in `migrations/` at the repository root and run
//! only when [`migrate`] is called (the `ingest migrate` command).

pub mod api_keys;
pub mod cancel;
pub mod catalog;
pub mod clicks;
pub mod console;
pub mod deliveries;
pub mod derived;
pub mod erasure;
pub mod events;
pub mod export;
pub mod inbox;
pub mod outbox;
pub mod retention;
mod row;
pub mod testing;
pub mod topics;
pub mod webhooks;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::str::FromStr;
use std::time::Duration;

pub use sqlx;
pub use sqlx::PgPool;

/// Errors of the store. SQL text never leaves this crate in an error shown to callers.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or a query failed.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A referenced row does not exist (the string names it).
    #[error("not found: {0}")]
    NotFound(String),
    /// A column holds text that is not one of its domain's names (a channel, a status, a
    /// priority ...): a row written by another version, or by hand. Never transient.
    #[error("column {column} holds an unreadable value: {message}")]
    BadValue {
        /// The column read.
        column: &'static str,
        /// What is wrong with it (names the value).
        message: String,
    },
    /// A call that ran in a batch with others failed (see `notify-worker`'s batcher);
    /// `transient` carries [`StoreError::is_transient`] of the batch's error.
    #[error("database error: {message}")]
    Batch {
        /// The error as text.
        message: String,
        /// Whether trying again may help.
        transient: bool,
    },
}

impl StoreError {
    /// Whether trying the same call again may help: the database could not be reached
    /// (I/O, TLS, pool timeout, a closed pool, SQLSTATE class 08), is shutting down or out
    /// of resources (57P01-57P03, class 53), cancelled the statement (57014, statement
    /// timeout), or lost a serialization or deadlock race (40001, 40P01, 55P03). Anything
    /// else (a value Postgres cannot store, a constraint, a decode error) fails the same
    /// way every time: retrying would loop.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Db(e) => match e {
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
                | sqlx::Error::Protocol(_) => true,
                sqlx::Error::Database(db) => db.code().is_some_and(|c| {
                    c.starts_with("08")
                        || c.starts_with("53")
                        || matches!(
                            &*c,
                            "57P01" | "57P02" | "57P03" | "57014" | "40001" | "40P01" | "55P03"
                        )
                }),
                _ => false,
            },
            StoreError::Batch { transient, .. } => *transient,
            StoreError::Migrate(_) | StoreError::NotFound(_) | StoreError::BadValue { .. } => false,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What sits between the binaries and Postgres (`NOTIFY_DATABASE_POOLER`; docs/pooling.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// Postgres itself (`none`, the default): `statement_timeout` is sent as the startup
    /// parameter `options`.
    #[default]
    None,
    /// pgbouncer (`pgbouncer`): it refuses the startup parameters `options` (SQLSTATE
    /// 08P01, "unsupported startup parameter") and, unless listed in its
    /// `ignore_startup_parameters`, `extra_float_digits`, so neither is sent;
    /// `statement_timeout` comes from the pooler's `connect_query` (or the role's
    /// settings). Needs `pool_mode = session`, or `transaction` from pgbouncer 1.21 on
    /// with `max_prepared_statements` > 0: sqlx names its prepared statements per
    /// client connection, which transaction pooling before 1.21 mixes up between clients.
    PgBouncer,
}

impl std::str::FromStr for Pooler {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Pooler::None),
            "pgbouncer" => Ok(Pooler::PgBouncer),
            other => Err(format!("{other:?} is not a pooler: use none or pgbouncer")),
        }
    }
}

impl Pooler {
    /// Reads `NOTIFY_DATABASE_POOLER` (`none` when unset); another value is recorded in
    /// `env` as an error naming the variable and the allowed values.
    pub fn from_env(env: &mut notify_core::config::Env) -> Pooler {
        env.parse("NOTIFY_DATABASE_POOLER", Pooler::None)
    }
}

/// Pool settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// `postgres://user@host:port/db`.
    pub url: String,
    /// Most connections this process opens.
    pub max_connections: u32,
    /// How long a caller waits for a free connection before failing.
    pub acquire_timeout: Duration,
    /// Server-side `statement_timeout` for every statement of this pool (sent only with
    /// [`Pooler::None`]; behind a pooler its own setting applies).
    pub statement_timeout: Duration,
    /// What the URL points at.
    pub pooler: Pooler,
    /// Plans every prepared statement once per connection, for any parameters
    /// (`plan_cache_mode = force_generic_plan`; sent only with [`Pooler::None`]). For a
    /// process whose statements find rows by key, as the workers' do: Postgres otherwise
    /// plans each statement anew for its first five runs on every connection, and the
    /// claim's twelve-table join took 9 ms to plan against 2.3 ms to run (`make bench`,
    /// `pg_stat_statements.track_planning`). Not for statements whose best plan depends
    /// on their parameters' values.
    pub generic_plans: bool,
}

impl PoolConfig {
    /// Defaults: 10 connections, 5 s acquire timeout, 30 s statement timeout, no pooler,
    /// Postgres' own choice between generic and custom plans.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            pooler: Pooler::None,
            generic_plans: false,
        }
    }
}

/// A pooled connection idle this long or longer is pinged (one `Sync` round trip) before
/// it is handed out. One returned sooner skips the ping: sqlx pinged it when it was
/// released, so a second round trip would prove nothing new. Measured end to end (`make
/// bench`): sqlx's default, a ping on every acquire as well as on every release, cost each
/// statement two extra round trips; the claim, the record and the writer's statements
/// follow each other on the same connections within milliseconds.
pub const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// Opens a pool. Fails fast when the URL is malformed; connections are made lazily so a
/// process can start while Postgres is still coming up.
pub fn connect(cfg: &PoolConfig) -> Result<PgPool> {
    // Broken connections (a primary killed in a failover) are dropped by a ping before
    // a connection idle for `PING_IDLE_AFTER` or longer is handed out, and by the ping
    // sqlx sends on every release; a new connection that lands on a node in recovery (a
    // standby, or the old primary before it is rebuilt) is refused here, so the pool never
    // keeps one that would fail every write with SQLSTATE 25006.
    Ok(PgPoolOptions::new()
        .max_connections(cfg.max_connections)
        .acquire_timeout(cfg.acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IDLE_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .after_connect(|conn, _meta| Box::pin(refuse_standby(conn)))
        .connect_lazy_with(connect_options(cfg)?))
}

/// The connection options of [`connect`]: the URL's, `application_name` = notify, and the
/// startup parameters [`PoolConfig::pooler`] allows.
pub fn connect_options(cfg: &PoolConfig) -> Result<PgConnectOptions> {
    let opts = PgConnectOptions::from_str(&cfg.url)?.application_name("notify");
    Ok(match cfg.pooler {
        Pooler::None => {
            let mut options = vec![(
                "statement_timeout",
                cfg.statement_timeout.as_millis().to_string(),
            )];
            if cfg.generic_plans {
                options.push(("plan_cache_mode", "force_generic_plan".to_string()));
            }
            opts.options(options)
        }
        Pooler::PgBouncer => opts.extra_float_digits(None),
    })
}

/// The pools of a process: `main` for its statements, `session` for the connections that
/// keep session state from one transaction to the next (`LISTEN` through `PgListener`,
/// which holds one of its connections; session advisory locks). Without a pooler, or behind
/// one in session mode, both are the same pool; behind a transaction pooler `session`
/// reaches Postgres directly (`NOTIFY_DATABASE_DIRECT_URL`, docs/pooling.md).
#[derive(Debug, Clone)]
pub struct Pools {
    /// Every statement that ends with its transaction.
    pub main: PgPool,
    /// `LISTEN` and session advisory locks.
    pub session: PgPool,
}

impl From<PgPool> for Pools {
    fn from(pool: PgPool) -> Self {
        Pools {
            session: pool.clone(),
            main: pool,
        }
    }
}

/// Connections of a separate session pool: ingest's three listeners (relay, fan-out, API
/// keys) and its retention pass, or http-api's inbox listener, with room for a reconnect.
pub const SESSION_POOL_SIZE: u32 = 6;

/// Opens [`Pools`]: `cfg`'s pool as both without `direct_url`; else `session` is a pool
/// of [`SESSION_POOL_SIZE`] on `direct_url` (no pooler, `cfg`'s timeouts).
///
/// # Errors
/// `StoreError::Db` when a URL is malformed.
pub fn connect_pools(cfg: &PoolConfig, direct_url: Option<&str>) -> Result<Pools> {
    let main = connect(cfg)?;
    let Some(url) = direct_url else {
        return Ok(main.into());
    };
    let mut direct = cfg.clone();
    direct.url = url.to_string();
    direct.pooler = Pooler::None;
    direct.max_connections = SESSION_POOL_SIZE;
    Ok(Pools {
        main,
        session: connect(&direct)?,
    })
}

/// Reads `NOTIFY_DATABASE_DIRECT_URL`: Postgres itself, for the connections that must
/// bypass a transaction pooler ([`Pools::session`], `ingest migrate`). Errors recorded in
/// `env`: set while `pooler` is [`Pooler::None`] (nothing to bypass), or not a
/// `postgres://` URL.
pub fn direct_url_from_env(env: &mut notify_core::config::Env, pooler: Pooler) -> Option<String> {
    const NAME: &str = "NOTIFY_DATABASE_DIRECT_URL";
    let url = env
        .get(NAME)
        .map(str::trim)
        .filter(|v| !v.is_empty())?
        .to_string();
    if pooler == Pooler::None {
        env.error(format!(
            "{NAME} is set but NOTIFY_DATABASE_POOLER is none: the direct URL is only for the connections that bypass a pooler; set NOTIFY_DATABASE_POOLER=pgbouncer or unset {NAME}"
        ));
        return None;
    }
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        || PgConnectOptions::from_str(&url).is_err()
    {
        env.error(format!(
            "{NAME}={:?} is invalid: use postgres://user@host:port/database (Postgres itself, not the pooler)",
            notify_core::config::redact(&url)
        ));
        return None;
    }
    Some(url)
}

/// Fails when the server behind `conn` is in recovery (`pg_is_in_recovery()`: a hot
/// standby, read-only), so the pool drops the connection and the caller's retry path
/// (the same as for any database error) reconnects, through the failover switch point,
/// to the primary.
async fn refuse_standby(conn: &mut sqlx::PgConnection) -> std::result::Result<(), sqlx::Error> {
    let in_recovery: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
        .fetch_one(&mut *conn)
        .await?;
    if in_recovery {
        return Err(sqlx::Error::Protocol(
            "NOTIFY_DATABASE_URL reached a PostgreSQL server in recovery (a standby); \
             the URL must lead to the primary"
                .into(),
        ));
    }
    Ok(())
}

/// One round trip to the database (`SELECT 1`), for readiness checks.
pub async fn ping(pool: &PgPool) -> Result<()> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}

/// A read-only transaction on one snapshot (`REPEATABLE READ READ ONLY`, PostgreSQL docs
/// §13.2.2): every read in it sees the database as of its first statement, so a view
/// assembled from several queries (an event, its deliveries and its skips) never shows a
/// fallback's skip beside the delivery that caused it still `sending`. It takes no locks
/// and never fails on serialization (it writes nothing); drop or commit it when done.
///
/// # Errors
/// No connection, or the `BEGIN` failed.
pub async fn snapshot(pool: &PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    Ok(pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .await?)
}

/// Applies every migration in `migrations/` that is not applied yet (idempotent; safe to
/// run from several processes, sqlx takes an advisory lock).
pub async fn migrate(pool: &PgPool) -> Result<()> {
    sqlx::migrate!("../../migrations").run(pool).await?;
    Ok(())
}

/// Truncates `s` to at most `max` bytes on a character boundary, marking the cut.
pub fn truncate_utf8(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_pool_asked_for_generic_plans_sends_plan_cache_mode_and_never_through_a_pooler() {
        let mut cfg = PoolConfig::new("postgres://u@127.0.0.1:5432/db");
        let plain = connect_options(&cfg).unwrap();
        let plain = plain.get_options().unwrap_or_default();
        assert!(plain.contains("statement_timeout=30000"), "{plain}");
        assert!(!plain.contains("plan_cache_mode"), "{plain}");
        cfg.generic_plans = true;
        let generic = connect_options(&cfg).unwrap();
        let generic = generic.get_options().unwrap_or_default();
        assert!(generic.contains("statement_timeout=30000"), "{generic}");
        assert!(
            generic.contains("plan_cache_mode=force_generic_plan"),
            "{generic}"
        );
        cfg.pooler = Pooler::PgBouncer;
        let pooled = connect_options(&cfg).unwrap();
        assert_eq!(pooled.get_options(), None);
    }

    #[test]
    fn the_pooler_setting_names_the_variable_and_the_allowed_values() {
        let mut env = notify_core::config::Env::from_vars([("NOTIFY_DATABASE_POOLER", "pgpool")]);
        assert_eq!(Pooler::from_env(&mut env), Pooler::None);
        let err = env.finish().unwrap_err();
        assert!(err.contains("NOTIFY_DATABASE_POOLER"), "{err}");
        assert!(err.contains("use none or pgbouncer"), "{err}");
        let mut env =
            notify_core::config::Env::from_vars([("NOTIFY_DATABASE_POOLER", "pgbouncer")]);
        assert_eq!(Pooler::from_env(&mut env), Pooler::PgBouncer);
        let mut env = notify_core::config::Env::from_vars(Vec::<(String, String)>::new());
        assert_eq!(Pooler::from_env(&mut env), Pooler::None);
    }

    #[test]
    fn the_direct_url_is_refused_without_a_pooler_and_when_it_is_not_postgres() {
        let url = "postgres://u@127.0.0.1:5432/notify";
        let mut env = notify_core::config::Env::from_vars([("NOTIFY_DATABASE_DIRECT_URL", url)]);
        assert_eq!(direct_url_from_env(&mut env, Pooler::None), None);
        let err = env.finish().unwrap_err();
        assert!(
            err.contains("NOTIFY_DATABASE_DIRECT_URL is set but NOTIFY_DATABASE_POOLER is none"),
            "{err}"
        );
        let mut env =
            notify_core::config::Env::from_vars([("NOTIFY_DATABASE_DIRECT_URL", "http://x")]);
        assert_eq!(direct_url_from_env(&mut env, Pooler::PgBouncer), None);
        assert!(
            env.finish()
                .unwrap_err()
                .contains("NOTIFY_DATABASE_DIRECT_URL=\"http://x\" is invalid")
        );
        let mut env = notify_core::config::Env::from_vars([("NOTIFY_DATABASE_DIRECT_URL", url)]);
        assert_eq!(
            direct_url_from_env(&mut env, Pooler::PgBouncer).as_deref(),
            Some(url)
        );
        assert!(env.finish().is_ok());
    }

    #[test]
    fn behind_pgbouncer_no_startup_parameter_it_refuses_is_sent() {
        let mut cfg = PoolConfig::new("postgres://u@127.0.0.1:6432/notify");
        let direct = connect_options(&cfg).unwrap();
        assert!(
            direct
                .get_options()
                .is_some_and(|o| o.contains("statement_timeout"))
        );
        cfg.pooler = Pooler::PgBouncer;
        let pooled = connect_options(&cfg).unwrap();
        assert_eq!(pooled.get_options(), None);
    }

    #[test]
    fn truncation_keeps_whole_thai_characters() {
        let s = "สวัสดี".repeat(10); // 3 bytes per character
        let t = truncate_utf8(&s, 20);
        assert!(t.len() <= 20);
        assert!(t.ends_with("..."));
        assert_eq!(truncate_utf8("short", 20), "short");
    }
}
