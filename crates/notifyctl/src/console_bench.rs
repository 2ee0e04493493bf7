//! The console at scale (`make bench`, phase `console`): seeds a million deliveries (100,000
//! events of 10 recipients, spread over 30 days, with UUIDv7 ids like the real ones),
//! starts `http-api`, signs in and times each console page five times, printing the median
//! and the slowest against the 300 ms goal.

use anyhow::Context;
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// Seeds, times and prints. `http_url` is where the started `http-api` listens.
pub async fn run(
    pool: &PgPool,
    procs: &mut crate::procs::Procs,
    http_url: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    sqlx::query(
        "INSERT INTO notification_types (key, default_channels) VALUES ('bench_console', '{inapp,line}')
         ON CONFLICT DO NOTHING",
    )
    .execute(pool)
    .await?;
    // A UUIDv7 for time `ts`: 48-bit milliseconds, version 7, variant 10, random rest.
    let v7 = "(lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0') || '7' || substr(md5(random()::text), 1, 3) \
              || '8' || substr(md5(random()::text), 1, 15))::uuid";
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO notification_events (id, event_key, type, recipients, payload_json, content_json, channels, fingerprint, created_at)
         SELECT {v7}, 'console-bench:' || g, 'bench_console', ARRAY['cb-user-' || (g % 20000)], '{{}}', '{{\"title\": \"bench\"}}',
                ARRAY['inapp', 'line'], '\\x00', ts
         FROM (SELECT g, now() - (g * interval '25 seconds') AS ts FROM generate_series(1, 100000) AS g) s"
    )))
    .execute(pool)
    .await
    .context("seeding events")?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, idempotency_key, status, attempts, created_at)
         SELECT {v7}, e.id, 'cb-user-' || ((n * 7919 + k) % 20000), CASE WHEN k % 2 = 0 THEN 'inapp' ELSE 'line' END,
                CASE WHEN k % 2 = 0 THEN 'inbox' ELSE 'line' END, e.id || '/' || k,
                CASE WHEN k = 9 AND n % 50 = 0 THEN 'failed' ELSE 'sent' END, 1, ts
         FROM (SELECT id, created_at AS ts, row_number() OVER () AS n FROM notification_events WHERE type = 'bench_console') e,
              generate_series(0, 9) AS k"
    )))
    .execute(pool)
    .await
    .context("seeding deliveries")?;
    for table in ["notification_deliveries", "notification_events"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("ANALYZE {table}")))
            .execute(pool)
            .await?;
    }
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM notification_deliveries")
        .fetch_one(pool)
        .await?;
    println!(
        "console: seeded {total} deliveries in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let (event_id, key): (uuid::Uuid, String) = sqlx::query_as(
        "SELECT id, event_key FROM notification_events WHERE type = 'bench_console' ORDER BY id LIMIT 1 OFFSET 50000",
    )
    .fetch_one(pool)
    .await?;

    procs.spawn("http-api")?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let mut cookie = None;
    for _ in 0..100 {
        if let Ok(r) = http
            .post(format!("{http_url}/console/login"))
            .form(&[("user", "ops"), ("password", "notify-local")])
            .send()
            .await
            && let Some(c) = r.headers().get("set-cookie")
        {
            cookie = Some(c.to_str()?.split(';').next().unwrap_or("").to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cookie = cookie.context("console sign-in (NOTIFY_CONSOLE_USERS from .stack/env)")?;
    for (name, path) in [
        ("overview", "/console".to_string()),
        (
            "search by user",
            "/console/search?q=cb-user-4242".to_string(),
        ),
        (
            "search by event key",
            format!("/console/search?q={}", key.replace(':', "%3A")),
        ),
        ("event page", format!("/console/events/{event_id}")),
        ("audit log", "/console/audit".to_string()),
    ] {
        let mut times = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let r = http
                .get(format!("{http_url}{path}"))
                .header("cookie", &cookie)
                .send()
                .await?;
            anyhow::ensure!(r.status().is_success(), "{name}: {}", r.status());
            r.text().await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "console {name}: median {:.0} ms, slowest {:.0} ms ({} the 300 ms goal)",
            times[2],
            times[4],
            if times[4] <= 300.0 { "within" } else { "OVER" }
        );
    }
    procs.terminate("http-api").await?;
    Ok(())
}
