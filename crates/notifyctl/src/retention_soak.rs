//! `notifyctl retention-soak`: the retention soak of issue 20, run by hand (not in `make
//! test`; bench/retention/README.md says how and what a run gave).
//!
//! On a database of its own (created, migrated, dropped at the end unless
//! `NOTIFY_SOAK_KEEP=1`) it starts ingest in-process with retention of minutes and its
//! purge every few seconds, then for the length of the run:
//!
//! - **load**: every second, `NOTIFY_SOAK_RATE` final deliveries written in the shape the
//!   writer and the workers leave them (one event per two deliveries, in-app and email,
//!   UUIDv7 ids, one `sent` attempt each with its rendered content and the provider's
//!   answer, an inbox row per in-app delivery, through the real triggers), until
//!   `NOTIFY_SOAK_DELIVERIES` were written. They age on the real clock: a retention of
//!   minutes is the compressed clock.
//! - **probe**: `CreateEvent` through gRPC every 50 ms (the writer's group commit, dedup
//!   insert, delivery and outbox rows), its latency recorded; the probe's deliveries are
//!   made `sent` by primary key every second, as a worker's record would.
//! - **samples** every `NOTIFY_SOAK_SAMPLE`: `pg_total_relation_size` (heap, indexes,
//!   TOAST) of deliveries, attempts, events and inbox, their live and dead rows, the rows
//!   deleted since the last sample, the console overview's time, and the probe's p50,
//!   p99 and max latency over the interval.
//!
//! Environment: `NOTIFY_DATABASE_URL` (its server gets the soak's database),
//! `NOTIFY_AMQP_URL`, `NOTIFY_SOAK_DELIVERIES` (2,000,000), `NOTIFY_SOAK_RATE` (2,000 per
//! second), `NOTIFY_SOAK_SAMPLE` (10 s), `NOTIFY_SOAK_TAIL` (how long to keep sampling
//! after the load, default 2 x the delivery retention), and the `NOTIFY_RETENTION_*`
//! variables of ingest with soak defaults (content 60 s, deliveries and archived inbox
//! 180 s, a pass every 5 s).

use anyhow::Context;
use notify_proto::v1 as pb;
use sqlx::PgPool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What a soak does; see the module docs.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The server's URL with any database: the soak's database is made beside it.
    pub database_url: String,
    /// Ingest's settings (retention included).
    pub ingest: ingest::IngestConfig,
    /// Deliveries written in all.
    pub deliveries: u64,
    /// Deliveries written per second.
    pub rate: u64,
    /// Time between samples.
    pub sample: Duration,
    /// Sampling goes on this long after the load ended.
    pub tail: Duration,
    /// Keep the database afterwards.
    pub keep: bool,
}

impl SoakConfig {
    /// Reads the environment (module docs).
    ///
    /// # Errors
    /// The variables missing; every problem is also recorded in `env`.
    pub fn from_env(
        env: &mut notify_core::config::Env,
    ) -> Result<Self, notify_core::config::Missing> {
        let database_url = env.required("NOTIFY_DATABASE_URL");
        // The soak's defaults for ingest, under whatever the environment sets.
        let mut vars: std::collections::BTreeMap<String, String> = [
            ("NOTIFY_RETENTION_CONTENT", "60s"),
            ("NOTIFY_RETENTION_DELIVERIES", "180s"),
            ("NOTIFY_RETENTION_ARCHIVED_INBOX", "180s"),
            ("NOTIFY_RETENTION_INTERVAL", "5s"),
            ("NOTIFY_GRPC_AUTH", "off"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        vars.extend(std::env::vars().filter(|(k, _)| k.starts_with("NOTIFY_")));
        vars.insert(
            "NOTIFY_AMQP_PREFIX".into(),
            format!("soak{}.", &uuid::Uuid::new_v4().simple().to_string()[..8]),
        );
        let mut ingest_env = notify_core::config::Env::from_vars(vars);
        let ingest = ingest::IngestConfig::from_env(&mut ingest_env);
        if let Err(problems) = ingest_env.finish() {
            env.error(problems);
        }
        let retention = ingest
            .as_ref()
            .map(|i| i.retention.lengths.deliveries)
            .unwrap_or(Duration::from_secs(180));
        let dur = |s: &str| notify_core::retry::parse_duration(s).map_err(|e| e.to_string());
        Ok(Self {
            deliveries: env.number("NOTIFY_SOAK_DELIVERIES", 2_000_000, 1_000, 100_000_000),
            rate: env.number("NOTIFY_SOAK_RATE", 2_000, 10, 100_000),
            sample: env.parse_with("NOTIFY_SOAK_SAMPLE", Duration::from_secs(10), dur),
            tail: env.parse_with("NOTIFY_SOAK_TAIL", retention * 2, dur),
            keep: env.string("NOTIFY_SOAK_KEEP", "") == "1",
            database_url: database_url?,
            ingest: ingest?,
        })
    }
}

/// The tables whose size a sample reports.
const TABLES: [&str; 4] = [
    "notification_deliveries",
    "delivery_attempts",
    "notification_events",
    "notifications",
];

/// Runs the soak and prints its samples and summary; true when the probe's p99 during
/// purges stayed within 100 ms and the deliveries' and attempts' size at the end of the
/// load is within 1.5 x their size at its half.
pub async fn run(cfg: &SoakConfig) -> anyhow::Result<bool> {
    let db_name = format!(
        "notify_soak_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let server = cfg
        .database_url
        .rsplit_once('/')
        .context("NOTIFY_DATABASE_URL has no database name")?
        .0
        .to_string();
    let admin = PgPool::connect(&format!("{server}/postgres")).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
        .execute(&admin)
        .await?;
    let mut pool_cfg = notify_store::PoolConfig::new(format!("{server}/{db_name}"));
    pool_cfg.max_connections = 20;
    let pool = notify_store::connect(&pool_cfg)?;
    notify_store::migrate(&pool).await?;
    let result = soak(cfg, &pool).await;
    pool.close().await;
    if !cfg.keep {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE {db_name} WITH (FORCE)"
        )))
        .execute(&admin)
        .await?;
    } else {
        println!("soak: database {db_name} kept");
    }
    result
}

/// One sample's figures.
#[derive(Debug, Clone)]
struct Sample {
    t_s: f64,
    written: u64,
    bytes: [i64; 4],
    live: [i64; 4],
    dead: [i64; 4],
    deleted: i64,
    overview_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    probes: usize,
}

async fn soak(cfg: &SoakConfig, pool: &PgPool) -> anyhow::Result<bool> {
    sqlx::query(
        "INSERT INTO notification_types (key, default_channels) VALUES
             ('soak', '{inapp,email}'), ('soak_probe', '{inapp}')",
    )
    .execute(pool)
    .await?;
    sqlx::query("INSERT INTO recipients (user_id, display_name) VALUES ('soak-probe', 'Probe')")
        .execute(pool)
        .await?;
    let r = &cfg.ingest.retention;
    println!(
        "soak: {} deliveries at {}/s; retention content {:?}, deliveries {:?}, archived inbox {:?}; purge every {:?}, batch {}, pause {:?}",
        cfg.deliveries,
        cfg.rate,
        r.lengths.content,
        r.lengths.deliveries,
        r.lengths.archived_inbox,
        r.interval,
        r.limits.batch,
        r.limits.pause
    );
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let ingest = tokio::spawn(ingest::run(
        cfg.ingest.clone(),
        pool.clone(),
        listener,
        shutdown.clone(),
    ));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect_lazy();

    let started = Instant::now();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let load_done = CancellationToken::new();

    let probe = {
        let (latencies, stop) = (latencies.clone(), shutdown.clone());
        let mut client = pb::ingest_service_client::IngestServiceClient::new(channel);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            let mut n = 0u64;
            while !stop.is_cancelled() {
                tick.tick().await;
                n += 1;
                let req = pb::CreateEventRequest {
                    event_key: format!("probe-{n}"),
                    r#type: "soak_probe".into(),
                    recipients: vec!["soak-probe".into()],
                    payload: "{}".into(),
                    content: Some(pb::Content {
                        title: "probe".into(),
                        body: "probe".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let t = Instant::now();
                if client.create_event(req).await.is_ok() {
                    latencies
                        .lock()
                        .expect("latencies")
                        .push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
        })
    };

    let load = {
        let (pool, written, done) = (pool.clone(), written.clone(), load_done.clone());
        let (total, rate) = (cfg.deliveries, cfg.rate);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut next_event = 0u64;
            while written.load(std::sync::atomic::Ordering::Relaxed) < total {
                tick.tick().await;
                let events = (rate / 2).max(1);
                if let Err(e) = write_final(&pool, next_event, events).await {
                    eprintln!("soak: load write failed: {e}");
                }
                next_event += events;
                written.fetch_add(events * 2, std::sync::atomic::Ordering::Relaxed);
                // The probe's deliveries, recorded as a worker would.
                let _ = sqlx::query(
                    "UPDATE notification_deliveries SET status = 'sent', sent_at = now(),
                         updated_at = now(), attempts = 1
                     WHERE user_id = 'soak-probe' AND status = 'pending'",
                )
                .execute(&pool)
                .await;
            }
            done.cancel();
        })
    };

    let mut samples: Vec<Sample> = Vec::new();
    let mut deleted_before = 0i64;
    let mut load_end: Option<f64> = None;
    let mut tail_until: Option<Instant> = None;
    println!(
        "soak: t_s written | MiB deliveries attempts events inbox | live deliveries attempts | dead deliveries attempts | deleted | overview_ms | probe n p50 p99 max ms"
    );
    loop {
        tokio::time::sleep(cfg.sample).await;
        if load_done.is_cancelled() && tail_until.is_none() {
            load_end = Some(started.elapsed().as_secs_f64());
            tail_until = Some(Instant::now() + cfg.tail);
        }
        let s = sample(
            pool,
            started,
            written.load(std::sync::atomic::Ordering::Relaxed),
            &latencies,
            &mut deleted_before,
        )
        .await?;
        let mib = |b: i64| b as f64 / 1_048_576.0;
        println!(
            "soak: {:>6.0} {:>8} | {:>7.1} {:>7.1} {:>6.1} {:>6.1} | {:>8} {:>8} | {:>7} {:>7} | {:>7} | {:>6.1} | {:>4} {:>5.1} {:>6.1} {:>6.1}",
            s.t_s,
            s.written,
            mib(s.bytes[0]),
            mib(s.bytes[1]),
            mib(s.bytes[2]),
            mib(s.bytes[3]),
            s.live[0],
            s.live[1],
            s.dead[0],
            s.dead[1],
            s.deleted,
            s.overview_ms,
            s.probes,
            s.p50_ms,
            s.p99_ms,
            s.max_ms
        );
        samples.push(s);
        if tail_until.is_some_and(|t| Instant::now() >= t) {
            break;
        }
    }
    shutdown.cancel();
    let _ = load.await;
    let _ = probe.await;
    let _ = ingest.await;
    Ok(summary(&samples, load_end))
}

/// Writes `events` events of two final deliveries each (see the module docs).
async fn write_final(pool: &PgPool, from: u64, events: u64) -> anyhow::Result<()> {
    // A UUIDv7 of now: 48-bit milliseconds, version 7, variant 10, random rest.
    let v7 = "(lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7' \
              || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid";
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH ev AS (
             INSERT INTO notification_events (id, event_key, type, recipients, payload_json,
                                              content_json, channels, fingerprint)
             SELECT {v7}, 'soak:' || g, 'soak', ARRAY['soak-user-' || (g % 50000)],
                    jsonb_build_object('order_id', g),
                    jsonb_build_object('title', 'ชำระเงินแล้ว #' || g, 'body', repeat('ขอบคุณที่ใช้บริการ ', 8)),
                    ARRAY['inapp', 'email'], '\\x00'
             FROM generate_series($1::bigint, $2::bigint) AS g
             RETURNING id, recipients[1] AS user_id, content_json),
         d AS (
             INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider,
                                                  address, idempotency_key, status, attempts,
                                                  sent_at)
             SELECT {v7}, ev.id, ev.user_id, c.channel, c.provider,
                    CASE WHEN c.channel = 'email' THEN ev.user_id || '@example.test' END,
                    ev.id || '/' || ev.user_id || '/' || c.channel, 'sent', 1, now()
             FROM ev CROSS JOIN (VALUES ('inapp', 'inbox'), ('email', 'smtp')) AS c (channel, provider)
             RETURNING id, event_id, user_id, channel),
         a AS (
             INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome,
                                            provider_status, provider_response, content_json,
                                            worker_id)
             SELECT d.id, 1, now(), 'sent', 250,
                    '250 2.0.0 Ok: queued as ' || md5(d.id::text) || repeat(' ', 120),
                    ev.content_json, 'soak'
             FROM d JOIN ev ON ev.id = d.event_id)
         INSERT INTO notifications (id, delivery_id, event_id, user_id, type, title, body, status)
         SELECT {v7}, d.id, d.event_id, d.user_id, 'soak', ev.content_json ->> 'title',
                ev.content_json ->> 'body', 'read'
         FROM d JOIN ev ON ev.id = d.event_id WHERE d.channel = 'inapp'"
    )))
    .bind(from as i64)
    .bind((from + events - 1) as i64)
    .execute(pool)
    .await?;
    Ok(())
}

async fn sample(
    pool: &PgPool,
    started: Instant,
    written: u64,
    latencies: &Mutex<Vec<f64>>,
    deleted_before: &mut i64,
) -> anyhow::Result<Sample> {
    let mut bytes = [0i64; 4];
    let mut live = [0i64; 4];
    let mut dead = [0i64; 4];
    let mut deleted = 0i64;
    for (i, table) in TABLES.iter().enumerate() {
        let (b, l, d, del): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT pg_total_relation_size(relid), n_live_tup, n_dead_tup, n_tup_del
             FROM pg_stat_user_tables WHERE relname = $1",
        )
        .bind(table)
        .fetch_one(pool)
        .await?;
        bytes[i] = b;
        live[i] = l;
        dead[i] = d;
        if i == 0 {
            deleted = del;
        }
    }
    let t = Instant::now();
    notify_store::console::overview(pool).await?;
    let overview_ms = t.elapsed().as_secs_f64() * 1000.0;
    let mut window = std::mem::take(&mut *latencies.lock().expect("latencies"));
    window.sort_by(f64::total_cmp);
    let q = |p: f64| {
        if window.is_empty() {
            0.0
        } else {
            window[((window.len() as f64 - 1.0) * p).round() as usize]
        }
    };
    let s = Sample {
        t_s: started.elapsed().as_secs_f64(),
        written,
        bytes,
        live,
        dead,
        deleted: deleted - *deleted_before,
        overview_ms,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        max_ms: q(1.0),
        probes: window.len(),
    };
    *deleted_before = deleted;
    // Keep the whole run's latencies for the summary, tagged by whether rows were
    // deleted in this interval.
    ALL.lock()
        .expect("all latencies")
        .extend(window.iter().map(|&ms| (ms, s.deleted > 0)));
    Ok(s)
}

/// Every probe latency of the run, with whether its interval saw purge deletes.
static ALL: Mutex<Vec<(f64, bool)>> = Mutex::new(Vec::new());

fn summary(samples: &[Sample], load_end: Option<f64>) -> bool {
    let all = ALL.lock().expect("all latencies").clone();
    let pct = |mut v: Vec<f64>, p: f64| {
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            0.0
        } else {
            v[((v.len() as f64 - 1.0) * p).round() as usize]
        }
    };
    let during: Vec<f64> = all.iter().filter(|(_, d)| *d).map(|(ms, _)| *ms).collect();
    let quiet: Vec<f64> = all.iter().filter(|(_, d)| !*d).map(|(ms, _)| *ms).collect();
    let (n_during, n_quiet) = (during.len(), quiet.len());
    let p99_during = pct(during.clone(), 0.99);
    println!(
        "soak: probe CreateEvent during purges: n={n_during} p50={:.1} ms p99={p99_during:.1} ms max={:.1} ms; without purges: n={n_quiet} p50={:.1} ms p99={:.1} ms",
        pct(during.clone(), 0.5),
        pct(during, 1.0),
        pct(quiet.clone(), 0.5),
        pct(quiet, 0.99),
    );
    let overview_max = samples.iter().map(|s| s.overview_ms).fold(0.0, f64::max);
    println!("soak: console overview slowest sample {overview_max:.1} ms");
    let Some(end) = load_end else {
        return false;
    };
    let in_load: Vec<&Sample> = samples.iter().filter(|s| s.t_s <= end + 1.0).collect();
    let (Some(half), Some(last)) = (in_load.get(in_load.len() / 2), in_load.last()) else {
        return false;
    };
    let flat = |i: usize| last.bytes[i] as f64 <= half.bytes[i] as f64 * 1.5;
    println!(
        "soak: deliveries {:.1} MiB at t={:.0} s, {:.1} MiB at the end of the load (t={:.0} s); attempts {:.1} -> {:.1} MiB",
        half.bytes[0] as f64 / 1_048_576.0,
        half.t_s,
        last.bytes[0] as f64 / 1_048_576.0,
        last.t_s,
        half.bytes[1] as f64 / 1_048_576.0,
        last.bytes[1] as f64 / 1_048_576.0,
    );
    flat(0) && flat(1) && p99_during <= 100.0
}
