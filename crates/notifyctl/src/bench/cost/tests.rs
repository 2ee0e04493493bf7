//! The cost of a window measured against a real Postgres (`NOTIFY_TEST_DATABASE_URL`, the
//! local stack's), in a database of its own: one with `pg_stat_statements` and one without.

use super::*;
use sqlx::Connection as _;

use notify_store::testing::TestDb;

/// Runs `sql` on a connection of its own, which then closes (a closing backend publishes
/// its counters).
async fn run(db: &TestDb, sql: &[&'static str]) {
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for s in sql {
        sqlx::raw_sql(*s).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
}

/// A broker counter source that cannot run, and no stack processes: those parts say n/a.
fn no_broker() -> BrokerCounters {
    BrokerCounters {
        ctl: "/nonexistent/rabbitmqctl".into(),
        node: "none@localhost".into(),
        home: "/nonexistent".into(),
    }
}

/// Ten rows before the window; in it, three transactions: 10 updates of an unindexed
/// column (HOT), 10 inserts, 5 deletes. Returns the table for 10 deliveries.
async fn measure_writes(db: &TestDb) -> String {
    run(
        db,
        &[
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)",
            "INSERT INTO t SELECT g, 0 FROM generate_series(1, 10) g",
        ],
    )
    .await;
    let procs = Procs::new(Path::new("/nonexistent"), Path::new("/nonexistent"), "t");
    let stack = Path::new("/nonexistent");
    let broker = no_broker();
    let window = Window::start(
        &db.pool,
        &procs,
        stack,
        &broker,
        "end to end",
        Unit::Delivery,
        STATS_SETTLE,
    )
    .await
    .unwrap();
    run(
        db,
        &[
            "UPDATE t SET v = v + 1",
            "INSERT INTO t SELECT g, 0 FROM generate_series(11, 20) g",
            "DELETE FROM t WHERE id > 15",
        ],
    )
    .await;
    let ended = window.end(&db.pool, &procs, stack, &broker).await.unwrap();
    ended.measure(&db.pool, 10).await.unwrap()
}

#[tokio::test]
async fn without_pg_stat_statements_the_table_says_so_and_counts_the_rest() {
    let db = TestDb::new("notify_cost", 1).await; // the extension is not created in it
    let out = measure_writes(&db).await;
    db.drop_db().await;
    let line = out.lines().next().unwrap();
    assert!(
        line.starts_with(
            "cost per delivery (end to end, 10 deliveries): statements: n/a (pg_stat_statements not loaded), \
             2.50 rows written (1.00 ins / 1.00 upd / 0.500 del), 100% HOT updates, "
        ),
        "{out}"
    );
    assert!(line.contains(" WAL bytes ("), "{line}");
    assert_transactions(line);
    assert!(
        line.ends_with(
            " transactions, broker messages: n/a (/nonexistent/rabbitmqctl: No such file or directory (os error 2)), \
             CPU ms: ingest n/a, worker-inapp n/a, worker-line n/a, postgres n/a, rabbitmq n/a"
        ),
        "{line}"
    );
    assert!(
        out.contains(
            "\n    t                                   1.00 /    1.00 /   0.500  HOT 100%\n"
        ),
        "{out}"
    );
    assert!(!out.contains("top statements"), "{out}");
    assert!(out.contains("(1 of the bench's own left out)"), "{out}");
}

#[tokio::test]
async fn counts_the_statements_of_the_window_but_not_the_bench_s_own() {
    let db = TestDb::new("notify_cost", 1).await;
    // The local stack preloads pg_stat_statements; the bench creates it per database.
    prepare(&db.pool).await.unwrap();
    let out = measure_writes(&db).await;
    db.drop_db().await;
    let line = out.lines().next().unwrap();
    assert!(
        line.starts_with(
            "cost per delivery (end to end, 10 deliveries): 0.300 statements (top 5: \
             0.100 DELETE FROM t WHERE id > $1; 0.100 INSERT INTO t SELECT g, $1 FROM generat…; 0.100 UPDATE t SET v = v + $1), \
             2.50 rows written (1.00 ins / 1.00 upd / 0.500 del), 100% HOT updates, "
        ),
        "{out}"
    );
    assert_transactions(line);
    assert!(
        out.contains(
            "  top statements by calls (per delivery: calls, ms, rows; query):\n     0.100 "
        ),
        "{out}"
    );
    assert!(out.contains("UPDATE t SET v = v + $1\n"), "{out}");
    // The snapshot, the reset, and the two reads of pg_stat_statements.
    assert!(out.contains("(4 of the bench's own left out)"), "{out}");
}

/// The window's transactions: three statements and the writing connection's start (a new
/// backend commits one transaction to start), per 10 deliveries; the bench's own are left
/// out. Autovacuum may visit the new database during the window (a visit commits two
/// transactions, more when it analyses tables; up to 7 seen), which the count includes.
fn assert_transactions(line: &str) {
    let x: f64 = line
        .split(", ")
        .find_map(|part| part.strip_suffix(" transactions"))
        .unwrap_or_else(|| panic!("no transactions in {line}"))
        .parse()
        .unwrap();
    assert!(
        (0.4..=1.2).contains(&x),
        "{x} transactions per delivery: {line}"
    );
}
