//! What sqlx does to a pooler (docs/pooling.md, "What breaks"): 16 client connections
//! send 200 statements each with a per-client constant (`SELECT $1::int4 + k`), so an
//! answer computed by another client's statement shows as wrong; then session state
//! (`SET`/`SHOW`, a session advisory lock, `LISTEN`). One line per case.
//!
//! Usage: `NOTIFY_PROBE_URL=postgres://postgres@127.0.0.1:<pgbouncer port>/notify cargo run
//! -p notify-store --example pooler_probe`. Against Postgres itself every case is right;
//! its advisory lock key is 4242 (released at the end).

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection};
use std::collections::BTreeMap;
use std::str::FromStr;

/// Client connections per case.
const CLIENTS: usize = 16;
/// Statements per client and case.
const STATEMENTS: i32 = 200;

async fn connections(url: &str, cache: usize, n: usize) -> Vec<PgConnection> {
    let mut v = Vec::new();
    for _ in 0..n {
        let o = PgConnectOptions::from_str(url)
            .expect("NOTIFY_PROBE_URL")
            .statement_cache_capacity(cache);
        v.push(PgConnection::connect_with(&o).await.expect("connect"));
    }
    v
}

/// Right answers, wrong answers and errors (digits removed, so names group).
type Tally = (u32, u32, BTreeMap<String, u32>);

async fn case(label: &str, url: &str, cache: usize, persistent: bool, in_tx: bool) {
    let mut tasks = Vec::new();
    for (i, mut c) in connections(url, cache, CLIENTS)
        .await
        .into_iter()
        .enumerate()
    {
        tasks.push(tokio::spawn(async move {
            let mut t: Tally = (0, 0, BTreeMap::new());
            for k in 0..STATEMENTS {
                let add = (i as i32) * 100_000 + k % 2;
                let sql = sqlx::AssertSqlSafe(format!("SELECT $1::int4 + {add}"));
                let r: Result<i32, _> = if in_tx {
                    let mut tx = c.begin().await.expect("begin");
                    let r = sqlx::query_scalar(sql)
                        .bind(k)
                        .persistent(persistent)
                        .fetch_one(&mut *tx)
                        .await;
                    let _ = tx.commit().await;
                    r
                } else {
                    sqlx::query_scalar(sql)
                        .bind(k)
                        .persistent(persistent)
                        .fetch_one(&mut c)
                        .await
                };
                match r {
                    Ok(x) if x == k + add => t.0 += 1,
                    Ok(_) => t.1 += 1,
                    Err(e) => {
                        let msg = e.to_string().replace(|c: char| c.is_ascii_digit(), "");
                        *t.2.entry(msg).or_default() += 1;
                    }
                }
            }
            t
        }));
    }
    let mut all: Tally = (0, 0, BTreeMap::new());
    for task in tasks {
        let (right, wrong, errors) = task.await.expect("client task");
        all.0 += right;
        all.1 += wrong;
        for (m, n) in errors {
            *all.2.entry(m).or_default() += n;
        }
    }
    println!(
        "{label}: right {}, wrong {}, errors {:?}",
        all.0, all.1, all.2
    );
}

#[tokio::main]
async fn main() {
    let url = std::env::var("NOTIFY_PROBE_URL").expect("set NOTIFY_PROBE_URL");
    case(
        "statement cache 100, no transaction",
        &url,
        100,
        true,
        false,
    )
    .await;
    case("statement cache 0, no transaction", &url, 0, true, false).await;
    case("statement cache 0, in a transaction", &url, 0, true, true).await;
    case(
        "unnamed (persistent(false)), no transaction",
        &url,
        0,
        false,
        false,
    )
    .await;
    case(
        "unnamed (persistent(false)), in a transaction",
        &url,
        0,
        false,
        true,
    )
    .await;

    let opts = PgConnectOptions::from_str(&url)
        .expect("NOTIFY_PROBE_URL")
        .statement_cache_capacity(0);
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(opts)
        .await
        .expect("pool");
    let mut c = pool.acquire().await.expect("acquire");
    let mut others = connections(&url, 0, 3).await;
    sqlx::raw_sql("SET lock_timeout = '123ms'")
        .execute(&mut *c)
        .await
        .expect("SET");
    for o in others.iter_mut() {
        sqlx::raw_sql("SELECT pg_sleep(0.05)")
            .execute(o)
            .await
            .expect("sleep");
    }
    let shown: String = sqlx::query_scalar("SHOW lock_timeout")
        .persistent(false)
        .fetch_one(&mut *c)
        .await
        .expect("SHOW");
    println!("SET lock_timeout = '123ms', then SHOW on the same client connection: {shown}");
    let try_lock = "SELECT pg_try_advisory_lock(4242)";
    let locked: bool = sqlx::query_scalar(try_lock)
        .persistent(false)
        .fetch_one(&mut *c)
        .await
        .expect("lock");
    let mut other = connections(&url, 0, 1).await.remove(0);
    let other_locked: bool = sqlx::query_scalar(try_lock)
        .persistent(false)
        .fetch_one(&mut other)
        .await
        .expect("lock");
    for conn in [&mut *c, &mut other] {
        let _ = sqlx::raw_sql("SELECT pg_advisory_unlock_all()")
            .execute(conn)
            .await;
    }
    println!("session advisory lock 4242: first client {locked}, a second client {other_locked}");
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("listener");
    listener.listen("pooler_probe").await.expect("LISTEN");
    for o in others.iter_mut() {
        sqlx::raw_sql("SELECT 1").execute(o).await.expect("SELECT");
    }
    let sent = sqlx::raw_sql("NOTIFY pooler_probe, 'x'")
        .execute(&mut other)
        .await;
    println!("NOTIFY from a second client: {:?}", sent.map(|_| ()));
    let heard = tokio::time::timeout(std::time::Duration::from_secs(2), listener.recv()).await;
    println!("LISTEN through the same URL heard it: {}", heard.is_ok());
}
