//! For tests of this and other crates: a fresh database of its own on the local stack's
//! PostgreSQL (`NOTIFY_TEST_DATABASE_URL`, set by `source .stack/env`).

use sqlx::{AssertSqlSafe, PgPool};

/// A fresh, empty database `<prefix>_<uuid>` on the test cluster; dropped (with its
/// connections) by [`TestDb::drop_db`].
pub struct TestDb {
    admin: PgPool,
    name: String,
    /// Its URL (`NOTIFY_TEST_DATABASE_URL` with this database's name).
    pub url: String,
    /// A pool of at most `max_connections` on it.
    pub pool: PgPool,
}

impl TestDb {
    /// Creates the database. Panics when `NOTIFY_TEST_DATABASE_URL` is unset or the
    /// cluster refuses (a test cannot go on without it).
    pub async fn new(prefix: &str, max_connections: u32) -> Self {
        let base = std::env::var("NOTIFY_TEST_DATABASE_URL")
            .expect("NOTIFY_TEST_DATABASE_URL (source .stack/env)");
        let admin = PgPool::connect(&base).await.unwrap();
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .unwrap();
        let url = format!("{}/{name}", base.rsplit_once('/').unwrap().0);
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(&url)
            .await
            .unwrap();
        Self {
            admin,
            name,
            url,
            pool,
        }
    }

    /// Closes the pool and drops the database (`WITH (FORCE)`: other sessions on it end).
    pub async fn drop_db(self) {
        self.pool.close().await;
        sqlx::query(AssertSqlSafe(format!(
            "DROP DATABASE {} WITH (FORCE)",
            self.name
        )))
        .execute(&self.admin)
        .await
        .unwrap();
    }
}
