//! What reached the outside: the simulator's recorded requests (and its faults), MailDev's
//! mail, table row counts and queue depths.

use super::{Platform, SendExt};
use notify_proto::v1 as pb;
use serde_json::Value;

impl Platform {
    /// Waits (up to 10 s, panicking with `what`) until a session of this test's database
    /// waits for a lock while running a statement whose text contains `query_contains`
    /// (`""`: any statement).
    pub(crate) async fn wait_for_a_lock_wait(&self, what: &str, query_contains: &str) {
        super::eventually(what, std::time::Duration::from_secs(10), async || {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND strpos(query, $1) > 0",
            )
            .bind(query_contains)
            .fetch_one(&self.pool)
            .await
            .unwrap();
            if waiting > 0 { Ok(()) } else { Err(waiting) }
        })
        .await;
    }

    /// `ExplainDelivery` for `user`'s delivery of `event_id` on `channel`; panics on an
    /// error.
    pub(crate) async fn explain(
        &self,
        event_id: &str,
        user: &str,
        channel: &str,
    ) -> pb::ExplainDeliveryResponse {
        self.ingest()
            .explain_delivery(pb::ExplainDeliveryRequest {
                event_id: event_id.into(),
                user_id: user.into(),
                channel: channel.into(),
            })
            .await
            .expect("ExplainDelivery")
            .into_inner()
    }

    /// Requests the simulator recorded for `provider`.
    pub(crate) async fn sim_requests(&self, provider: &str) -> Vec<Value> {
        self.http
            .get(format!(
                "{}/_sim/requests?provider={provider}",
                self.sim_url
            ))
            .json_body()
            .await
    }

    /// How many requests the simulator recorded for `provider`.
    pub(crate) async fn sim_count(&self, provider: &str) -> usize {
        self.sim_requests(provider).await.len()
    }

    /// Installs a fault at the simulator (`POST /_sim/faults`); panics unless it is taken.
    pub(crate) async fn sim_fault(&self, fault: Value) {
        let r = self
            .http
            .post(format!("{}/_sim/faults", self.sim_url))
            .json(&fault)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }

    /// LINE takes `delay_ms` to answer the next push to `line_user_id`, then accepts it
    /// (200, sent message id `message_id`): a provider call that is slow but succeeds.
    pub(crate) async fn slow_line_once(&self, line_user_id: &str, message_id: &str, delay_ms: u64) {
        self.sim_fault(serde_json::json!({
            "provider": "line", "target_contains": line_user_id, "status": 200,
            "body": {"sentMessages": [{"id": message_id}]}, "delay_ms": delay_ms, "times": 1,
        }))
        .await;
    }

    /// The `text` of every message of the `i`-th LINE call the simulator recorded (a
    /// message without text, such as a Flex card, gives an empty string).
    pub(crate) async fn line_texts(&self, i: usize) -> Vec<String> {
        self.sim_requests("line").await[i]["body"]["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["text"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// How many of `user_id`'s inbox notifications are unread, in the database.
    pub(crate) async fn unread_count(&self, user_id: &str) -> i64 {
        self.scalar(
            "SELECT count(*) FROM notifications WHERE user_id = $1 AND status = 'unread'",
            user_id,
        )
        .await
    }

    /// Emails in MailDev addressed to `address`.
    pub(crate) async fn mails_to(&self, address: &str) -> Vec<Value> {
        let all: Vec<Value> = self
            .http
            .get(format!("{}/api/email", self.stack.maildev_url))
            .json_body()
            .await;
        all.into_iter()
            .filter(|m| {
                m["to"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|a| a["address"] == address))
            })
            .collect()
    }

    /// The one value `sql` (no parameters) returns; panics naming the statement when it
    /// fails or returns no row.
    pub(crate) async fn query_scalar<O>(&self, sql: &'static str) -> O
    where
        (O,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
        O: Send + Unpin,
    {
        self.query_row::<(O,)>(sql).await.0
    }

    /// Every value `sql` (no parameters) returns.
    pub(crate) async fn query_scalars<O>(&self, sql: &'static str) -> Vec<O>
    where
        (O,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
        O: Send + Unpin,
    {
        let rows: Vec<(O,)> = self.query_rows(sql).await;
        rows.into_iter().map(|(o,)| o).collect()
    }

    /// The one row `sql` (no parameters) returns, as `O` (a tuple or a `FromRow` struct).
    pub(crate) async fn query_row<O>(&self, sql: &'static str) -> O
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        sqlx::query_as(sql)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Every row `sql` (no parameters) returns, as `O`.
    pub(crate) async fn query_rows<O>(&self, sql: &'static str) -> Vec<O>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
    {
        sqlx::query_as(sql)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs `sql` (no parameters; several statements are fine); panics naming it when it
    /// fails.
    pub(crate) async fn execute(&self, sql: &'static str) {
        sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The one value `sql` returns with `arg` bound as `$1`; panics naming the statement
    /// when it fails or returns no row.
    pub(crate) async fn scalar<'q, O, A>(&self, sql: &'static str, arg: A) -> O
    where
        (O,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
        O: Send + Unpin,
        A: 'q + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    {
        self.row::<(O,), A>(sql, arg).await.0
    }

    /// Every value `sql` returns with `arg` bound as `$1`.
    pub(crate) async fn scalars<'q, O, A>(&self, sql: &'static str, arg: A) -> Vec<O>
    where
        (O,): for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>,
        O: Send + Unpin,
        A: 'q + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    {
        let rows: Vec<(O,)> = self.rows(sql, arg).await;
        rows.into_iter().map(|(o,)| o).collect()
    }

    /// The one row `sql` returns with `arg` bound as `$1`, as `O` (a tuple or a
    /// `FromRow` struct).
    pub(crate) async fn row<'q, O, A>(&self, sql: &'static str, arg: A) -> O
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
        A: 'q + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    {
        sqlx::query_as(sql)
            .bind(arg)
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Every row `sql` returns with `arg` bound as `$1`, as `O`.
    pub(crate) async fn rows<'q, O, A>(&self, sql: &'static str, arg: A) -> Vec<O>
    where
        O: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
        A: 'q + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    {
        sqlx::query_as(sql)
            .bind(arg)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs `sql` with `arg` bound as `$1`; the number of rows it touched.
    pub(crate) async fn exec<'q, A>(&self, sql: &'static str, arg: A) -> u64
    where
        A: 'q + sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    {
        sqlx::query(sql)
            .bind(arg)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .rows_affected()
    }

    /// Row count of `table`.
    pub(crate) async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// An AMQP channel on the stack's broker.
    pub(crate) async fn amqp(&self) -> (lapin::Connection, lapin::Channel) {
        let conn = notify_broker::connect(&self.stack.amqp_url, "tests")
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        (conn, ch)
    }

    /// Messages ready in `queue` (passive declare).
    pub(crate) async fn queue_depth(&self, queue: &str) -> u32 {
        let (_conn, ch) = self.amqp().await;
        let q = ch
            .queue_declare(
                queue.into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .unwrap();
        q.message_count()
    }
}
