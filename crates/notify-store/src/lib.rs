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

/// Pool settings.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// `postgres://user@host:port/db`.
    pub url: String,
    /// Most connections this process opens.
    pub max_connections: u32,
    /// How long a caller waits for a free connection before failing.
    pub acquire_timeout: Duration,
    /// Server-side `statement_timeout` for every statement of this pool.
    pub statement_timeout: Duration,
}

impl PoolConfig {
    /// Defaults: 10 connections, 5 s acquire timeout, 30 s statement timeout.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
        }
    }
}

/// Opens a pool. Fails fast when the URL is malformed; connections are made lazily so a
/// process can start while Postgres is still coming up.
pub fn connect(cfg: &PoolConfig) -> Result<PgPool> {
    let opts = PgConnectOptions::from_str(&cfg.url)?
        .application_name("notify")
        .options([(
            "statement_timeout",
            format!("{}", cfg.statement_timeout.as_millis()),
        )]);
    // Broken connections (a primary killed in a failover) are dropped by sqlx's
    // `test_before_acquire`, on by default; a new connection that lands on a node in
    // recovery (a standby, or the old primary before it is rebuilt) is refused here, so
    // the pool never keeps one that would fail every write with SQLSTATE 25006.
    Ok(PgPoolOptions::new()
        .max_connections(cfg.max_connections)
        .acquire_timeout(cfg.acquire_timeout)
        .test_before_acquire(true)
        .after_connect(|conn, _meta| Box::pin(refuse_standby(conn)))
        .connect_lazy_with(opts))
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
    fn truncation_keeps_whole_thai_characters() {
        let s = "สวัสดี".repeat(10); // 3 bytes per character
        let t = truncate_utf8(&s, 20);
        assert!(t.len() <= 20);
        assert!(t.ends_with("..."));
        assert_eq!(truncate_utf8("short", 20), "short");
    }
}
