//! The database's CHECK constraints on state columns list exactly the names of the Rust
//! enums written to them (migration `20261207000042_state_checks.sql`): every name of the
//! enum is accepted, a misspelt one written by hand is refused with SQLSTATE 23514, and
//! the constraint lists no name the enum lacks. Runs against the local stack's Postgres
//! (`NOTIFY_TEST_DATABASE_URL`, `source .stack/env`), in a database of its own.

use notify_core::{AttemptLabel, Channel, DeliveryStatus, EndpointStatus, MessageStatus};

/// A state column: its table, its CHECK constraint, the names its enum writes, and a row
/// insert binding the state as `$1` (foreign keys are off in the test's transaction, so
/// the row needs no parents; the CHECKs still hold).
struct StateColumn {
    table: &'static str,
    constraint: &'static str,
    names: Vec<&'static str>,
    insert: &'static str,
}

fn columns() -> Vec<StateColumn> {
    let mut queues: Vec<&'static str> = Channel::ALL.iter().map(|c| c.as_str()).collect();
    queues.push(notify_store::webhooks::OUTBOX_CHANNEL);
    vec![
        StateColumn {
            table: "notification_deliveries",
            constraint: "notification_deliveries_status_check",
            names: DeliveryStatus::NAMES.to_vec(),
            insert: "INSERT INTO notification_deliveries
                         (id, idempotency_key, event_id, user_id, channel, provider, status,
                          lease_token, lease_expires_at)
                     VALUES (gen_random_uuid(), gen_random_uuid()::text, gen_random_uuid(),
                             'u-state', 'email', 'smtp', $1, gen_random_uuid(), now())",
        },
        StateColumn {
            table: "delivery_attempts",
            constraint: "delivery_attempts_outcome_check",
            names: AttemptLabel::NAMES.to_vec(),
            insert: "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome)
                     VALUES (gen_random_uuid(), 1, now(), $1)",
        },
        StateColumn {
            table: "notification_endpoints",
            constraint: "notification_endpoints_status_check",
            names: EndpointStatus::NAMES.to_vec(),
            insert: "INSERT INTO notification_endpoints (id, user_id, platform, token, status)
                     VALUES (gen_random_uuid(), 'u-state', 'fcm', gen_random_uuid()::text, $1)",
        },
        StateColumn {
            table: "webhook_messages",
            constraint: "webhook_messages_status_check",
            names: MessageStatus::NAMES.to_vec(),
            insert: "INSERT INTO webhook_messages
                         (id, endpoint_id, event_type, payload, delivery_id, state_version,
                          status, lease_token, lease_expires_at)
                     VALUES (gen_random_uuid(), gen_random_uuid(), 'delivery.sent', '{}',
                             gen_random_uuid(), 0, $1, gen_random_uuid(), now())",
        },
        StateColumn {
            table: "outbox",
            constraint: "outbox_channel_check",
            names: queues,
            insert: "INSERT INTO outbox (delivery_id, channel) VALUES (gen_random_uuid(), $1)",
        },
    ]
}

/// A fresh, migrated database on the test cluster.
struct TestDb(notify_store::testing::TestDb);

impl TestDb {
    async fn new() -> Self {
        let db = notify_store::testing::TestDb::new("notify_states", 2).await;
        notify_store::migrate(&db.pool).await.unwrap();
        Self(db)
    }

    /// Writes `state` with `column`'s insert in a transaction that is rolled back;
    /// the database's error, if it refused.
    async fn write(&self, column: &StateColumn, state: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.0.pool.begin().await?;
        sqlx::query("SET LOCAL session_replication_role = replica")
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query(column.insert)
            .bind(state)
            .execute(&mut *tx)
            .await;
        tx.rollback().await?;
        done.map(|_| ())
    }

    async fn drop_db(self) {
        self.0.drop_db().await;
    }
}

/// The quoted names of a `CHECK (col = ANY (ARRAY['a'::text, ...]))` definition.
fn listed_names(definition: &str) -> Vec<String> {
    definition
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn every_state_column_accepts_exactly_its_enum_and_refuses_a_misspelling() {
    let db = TestDb::new().await;
    for column in columns() {
        let definition: String = sqlx::query_scalar(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint
             WHERE conrelid = $1::regclass AND conname = $2",
        )
        .bind(column.table)
        .bind(column.constraint)
        .fetch_one(&db.0.pool)
        .await
        .unwrap_or_else(|e| panic!("{} has no {}: {e}", column.table, column.constraint));
        let mut listed = listed_names(&definition);
        listed.sort();
        let mut names: Vec<String> = column.names.iter().map(|s| s.to_string()).collect();
        names.sort();
        assert_eq!(listed, names, "{}: {definition}", column.constraint);
        for name in &column.names {
            db.write(&column, name)
                .await
                .unwrap_or_else(|e| panic!("{} refused {name:?}: {e}", column.table));
        }
        for misspelt in [
            format!("{}x", column.names[0]),
            column.names[0].to_uppercase(),
            String::new(),
        ] {
            let err = db
                .write(&column, &misspelt)
                .await
                .expect_err(&format!("{} took {misspelt:?}", column.table));
            let code = err
                .as_database_error()
                .and_then(|e| e.code())
                .map(|c| c.into_owned());
            assert_eq!(
                code.as_deref(),
                Some("23514"),
                "{} {misspelt:?}: {err}",
                column.table
            );
        }
    }
    db.drop_db().await;
}
