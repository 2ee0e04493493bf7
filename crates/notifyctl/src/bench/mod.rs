//! `notifyctl bench`: throughput and latency of the platform, measured against the two
//! ceilings of this machine (RabbitMQ and PostgreSQL) in the same run.
//!
//! Prints, in order: the broker ceiling, the Postgres ceiling for the ingest transaction,
//! ingest `CreateEvent` rate and latency at 32 and 128 clients, end-to-end deliveries per
//! second, event-to-provider latency at a steady 500 events/s, the 100,000- and
//! 1,000,000-recipient fan-out times, the time of a `CancelEvent` of 100,000 pending
//! deliveries, peak memory per process, and the ratios to the ceilings. After each ingest run and the end-to-end phase it prints what one event or
//! delivery cost (statements, rows, WAL, transactions, broker messages, CPU per process;
//! see [`cost`]).

use crate::procs::{Procs, WORKERS, connect_grpc, peak_rss_kib};
use anyhow::Context;
use notify_proto::v1 as pb;
use sqlx::PgPool;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod cancel;
mod ceilings;
mod cost;
mod fanout;
mod figures;

use ceilings::{broker_ceiling, postgres_ceiling};
use figures::{CpuSample, ms, pct};

/// Where the benchmark finds its binaries and services.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Folder with `ingest` and the workers (release build).
    pub bin_dir: PathBuf,
    /// Folder for the processes' logs.
    pub log_dir: PathBuf,
    /// Database of the run (migrated, empty).
    pub database_url: String,
    /// AMQP URL.
    pub amqp_url: String,
    /// gRPC URL of the ingest this tool starts.
    pub grpc_url: String,
    /// provider-sim base URL.
    pub sim_url: String,
    /// Length of each sustained-load phase.
    pub phase: Duration,
    /// The local stack's folder (`pids/postgres.pid`, `pids/rabbitmq.pid`), to split the
    /// CPU time among the processes.
    pub stack_dir: PathBuf,
    /// Phases to run (`ingest`, `e2e`, `latency`, `fanout`, `cancel`, `console`); empty =
    /// all. The two ceilings are always measured.
    pub only: Vec<String>,
}

impl BenchConfig {
    fn wants(&self, phase: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == phase)
    }
}

/// `clients` concurrent callers sending one-recipient, three-channel events for `for_`.
async fn ingest_load(
    grpc: &crate::keys::Grpc,
    clients: usize,
    for_: Duration,
    tag: &str,
) -> anyhow::Result<(f64, Duration, Duration, u64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = pb::ingest_service_client::IngestServiceClient::new(grpc.clone());
        let (stop, errors, tag) = (stop.clone(), errors.clone(), tag.to_string());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let req = pb::CreateEventRequest {
                    event_key: format!("bench:{tag}:{c}:{i}"),
                    r#type: "bench_ingest".into(),
                    recipients: vec![format!("bench-user-{}", i % 1000)],
                    content: Some(pb::Content {
                        title: "ทดสอบ".into(),
                        body: "bench".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let t = Instant::now();
                match client.create_event(req).await {
                    Ok(_) => lat.push(t.elapsed()),
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
            }
            lat
        }));
    }
    tokio::time::sleep(for_).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    let elapsed = started.elapsed();
    all.sort();
    Ok((
        all.len() as f64 / elapsed.as_secs_f64(),
        pct(&all, 0.5),
        pct(&all, 0.99),
        errors.load(Ordering::Relaxed),
        all.len() as u64,
    ))
}

/// Events of the end-to-end warm-up, sent before the measured window.
const WARMUP_EVENTS: usize = 1_000;

/// Sends `events` events of `type_key` (one recipient each, round robin over the 1,000
/// bench users) from 32 concurrent callers, and returns when every call has been answered.
async fn e2e_burst(
    channel: &crate::keys::Grpc,
    type_key: &'static str,
    events: usize,
) -> anyhow::Result<()> {
    let mut sends = Vec::new();
    for w in 0..32 {
        let mut client = pb::ingest_service_client::IngestServiceClient::new(channel.clone());
        sends.push(tokio::spawn(async move {
            for i in (w..events).step_by(32) {
                let _ = client
                    .create_event(pb::CreateEventRequest {
                        event_key: format!("{type_key}:{i}"),
                        r#type: type_key.into(),
                        recipients: vec![format!("bench-user-{}", i % 1000)],
                        content: Some(pb::Content {
                            title: "e2e".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .await;
            }
        }));
    }
    for s in sends {
        s.await?;
    }
    Ok(())
}

/// Deliveries of events of `type_key` still `pending` or `sending`.
///
/// Found through the two partial indexes on those statuses (`notification_deliveries_channel_due`
/// and `_lease`), so a poll costs in proportion to the deliveries still open, not to the
/// table: written as `status IN ('pending', 'sending')` it was a sequential scan, 17 ms
/// at 46,000 deliveries and about ten times that after the ingest phases, run every 100 ms
/// of the phase's tail on the cores the phase is measuring.
async fn open_deliveries(pool: &PgPool, type_key: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "/* notifyctl-bench */ SELECT count(*)
         FROM (SELECT event_id FROM notification_deliveries WHERE status = 'pending'
               UNION ALL
               SELECT event_id FROM notification_deliveries WHERE status = 'sending') AS o
         JOIN notification_events e ON e.id = o.event_id
         WHERE e.type = $1",
    )
    .bind(type_key)
    .fetch_one(pool)
    .await?)
}

/// Runs every measurement and prints the figures.
pub async fn run(cfg: &BenchConfig) -> anyhow::Result<()> {
    let observed = crate::observe::Observer::new(&cfg.sim_url, None);
    observed.reset().await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&cfg.database_url)
        .await?;
    if let Err(e) = cost::prepare(&pool).await {
        println!("cost table: no pg_stat_statements ({e})");
    }
    let broker_counters = cost::BrokerCounters::new(&cfg.amqp_url, &cfg.stack_dir);

    // notifyctl is built with the binaries it starts (deploy/common.sh `prepare`).
    let build = if cfg!(debug_assertions) {
        "debug build (NOTIFY_BENCH_PROFILE=debug: checks the path, the figures mean nothing)"
    } else {
        "release build"
    };
    println!(
        "bench: phases of {:?}; {build}; 2 cores shared by everything",
        cfg.phase
    );
    let broker = broker_ceiling(&cfg.amqp_url, 50_000)
        .await
        .context("broker ceiling")?;
    println!(
        "broker ceiling: {broker:.0} msg/s (persistent 256 B, confirms window 500, prefetch 200, manual acks, quorum queue)"
    );
    let pg = postgres_ceiling(&pool, Duration::from_secs(10))
        .await
        .context("postgres ceiling")?;
    println!("postgres ceiling: {pg:.0} tx/s (1 event + 3 deliveries + 3 outbox rows, one client)");

    let mut procs = Procs::new(&cfg.bin_dir, &cfg.log_dir, "bench");
    procs.spawn("ingest")?;
    let channel = connect_grpc(&cfg.grpc_url).await?;
    let mut types = pb::type_service_client::TypeServiceClient::new(channel.clone());
    for (key, channels) in [
        ("bench_ingest", vec!["inapp", "email", "line"]),
        ("bench_e2e", vec!["inapp", "line"]),
        ("bench_fanout", vec!["inapp"]),
        ("bench_warmup", vec!["inapp", "line"]),
        ("bench_cancel", cancel::CHANNELS.to_vec()),
    ] {
        types
            .upsert_notification_type(pb::UpsertNotificationTypeRequest {
                key: key.into(),
                priority: "normal".into(),
                default_channels: channels.into_iter().map(String::from).collect(),
                critical: false,
                ..Default::default()
            })
            .await?;
    }
    // Recipients with an email address and a LINE id.
    let users: Vec<String> = (0..1000).map(|i| format!("bench-user-{i}")).collect();
    let emails: Vec<String> = users.iter().map(|u| format!("{u}@example.test")).collect();
    let lines: Vec<String> = (0..1000)
        .map(|i| format!("U{:032x}", 0xbe00_0000u64 + i))
        .collect();
    sqlx::query(
        "INSERT INTO recipients (user_id, email, line_user_id) SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[])
         ON CONFLICT DO NOTHING",
    )
    .bind(&users)
    .bind(&emails)
    .bind(&lines)
    .execute(&pool)
    .await?;

    let mut ingest_rate = 0.0;
    let ingest_clients: &[usize] = if cfg.wants("ingest") { &[32, 128] } else { &[] };
    for &clients in ingest_clients {
        let window = cost::Window::start(
            &pool,
            &procs,
            &cfg.stack_dir,
            &broker_counters,
            format!("ingest at {clients} clients, 3 deliveries each"),
            cost::Unit::Event,
            cost::STATS_SETTLE,
        )
        .await?;
        let before = CpuSample::take(&procs, &cfg.stack_dir);
        let (rate, p50, p99, errors, accepted) =
            ingest_load(&channel, clients, cfg.phase, &format!("c{clients}")).await?;
        let after = CpuSample::take(&procs, &cfg.stack_dir);
        let ended = window
            .end(&pool, &procs, &cfg.stack_dir, &broker_counters)
            .await?;
        println!("{}", before.report(&after));
        if clients == 32 {
            ingest_rate = rate;
        }
        println!(
            "ingest: {rate:.0} events/s at {clients} clients (1 recipient x 3 channels), p50 {:.1} ms, p99 {:.1} ms, errors {errors}",
            ms(p50),
            ms(p99)
        );
        println!("{}", ended.measure(&pool, accepted).await?);
    }
    // Clear what the load phases queued (no workers ran) before the end-to-end phase.
    sqlx::query("DELETE FROM outbox").execute(&pool).await?;
    sqlx::query("UPDATE notification_deliveries SET status = 'canceled' WHERE status = 'pending'")
        .execute(&pool)
        .await?;
    // Let the later phases run on a settled database rather than beside autovacuum
    // cleaning up after this bench's own mass update.
    sqlx::raw_sql("VACUUM ANALYZE").execute(&pool).await?;
    procs.terminate("ingest").await?;
    if let Ok(conn) = notify_broker::connect(&cfg.amqp_url, "bench-purge").await {
        let ch = conn.create_channel().await?;
        let topo =
            notify_broker::Topology::new(std::env::var("NOTIFY_AMQP_PREFIX").unwrap_or_default());
        for c in ["inapp", "email", "line", "push"] {
            let _ = ch
                .queue_purge(topo.queue(c).into(), Default::default())
                .await;
        }
    }
    procs.spawn("ingest")?;
    for w in WORKERS {
        procs.spawn(w)?;
    }
    let channel = connect_grpc(&cfg.grpc_url).await?;

    // End to end: a burst of events, until every delivery is final.
    let events = if cfg.wants("e2e") { 5_000usize } else { 0 };
    if events > 0 || cfg.wants("latency") {
        // The processes just started: their pools open connections and Postgres plans each
        // statement anew for its first runs on each of them. A warm-up burst of the same
        // shape, under its own type, does that before the window, as the peer's worker
        // is measured after draining its ingest phase. The latency phase, run alone, gets
        // it too: cold, its first 1.5 s of events took about 600 ms each.
        let started = Instant::now();
        e2e_burst(&channel, "bench_warmup", WARMUP_EVENTS).await?;
        while open_deliveries(&pool, "bench_warmup").await? > 0 {
            if started.elapsed() > Duration::from_secs(120) {
                anyhow::bail!("end-to-end warm-up did not finish in 120 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!(
            "warm-up: {WARMUP_EVENTS} events (type bench_warmup) delivered in {:.1} s before the measured phases",
            started.elapsed().as_secs_f64()
        );
    }
    let window = if events > 0 {
        Some(
            cost::Window::start(
                &pool,
                &procs,
                &cfg.stack_dir,
                &broker_counters,
                "end to end",
                cost::Unit::Delivery,
                cost::STATS_SETTLE,
            )
            .await?,
        )
    } else {
        None
    };
    let before = CpuSample::take(&procs, &cfg.stack_dir);
    let started = Instant::now();
    let started_at = chrono::Utc::now();
    // Polled once every call has been answered, as the peer polls once its producers end.
    e2e_burst(&channel, "bench_e2e", events).await?;
    while open_deliveries(&pool, "bench_e2e").await? > 0 {
        if let Some(w) = &window {
            w.count_own();
        }
        if started.elapsed() > Duration::from_secs(300) {
            anyhow::bail!("end-to-end phase did not finish in 300 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = CpuSample::take(&procs, &cfg.stack_dir);
    let mut e2e = 0.0;
    if let Some(window) = window {
        window.count_own(); // the poll that found none open
        let ended = window
            .end(&pool, &procs, &cfg.stack_dir, &broker_counters)
            .await?;
        let (completed, last) = cost::final_deliveries(&ended, &pool, "bench_e2e").await?;
        let last = last.context("no end-to-end delivery reached a final state")?;
        let took = (last - started_at).num_microseconds().unwrap_or(0) as f64 / 1e6;
        anyhow::ensure!(
            took > 0.0,
            "the last end-to-end record is before the phase began"
        );
        e2e = (events * 2) as f64 / took;
        println!(
            "end to end: {e2e:.0} deliveries/s ({} events x in-app + LINE, zero-latency simulator, one replica per worker)",
            events
        );
        println!("{}", before.report(&after));
        println!("{}", ended.measure(&pool, completed).await?);
    }

    // Latency at a steady 500 events/s (LINE only: the simulator stamps arrival).
    observed.clear_requests().await?;
    let client = pb::ingest_service_client::IngestServiceClient::new(channel.clone());
    let mut sent_at = std::collections::HashMap::new();
    let total = if cfg.wants("latency") {
        (500.0 * cfg.phase.as_secs_f64().min(10.0)) as usize
    } else {
        0
    };
    let tick = Duration::from_micros(2_000);
    let mut next = tokio::time::Instant::now();
    let mut inflight = Vec::new();
    for i in 0..total {
        next += tick;
        tokio::time::sleep_until(next).await;
        let key = format!("bench:lat:{i}");
        sent_at.insert(key.clone(), chrono::Utc::now());
        let mut c = client.clone();
        let user = format!("bench-user-{}", i % 1000);
        inflight.push(tokio::spawn(async move {
            c.create_event(pb::CreateEventRequest {
                event_key: key.clone(),
                r#type: "bench_e2e".into(),
                recipients: vec![user],
                channels: vec!["line".into()],
                content: Some(pb::Content {
                    title: key,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().event_id)
        }));
    }
    for t in inflight {
        let _ = t.await?;
    }
    while open_deliveries(&pool, "bench_e2e").await? > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recs = observed.requests("line").await?;
    let mut lat: Vec<Duration> = recs
        .iter()
        .filter_map(|r| {
            let key = r["body"]["messages"][0]["text"].as_str()?.lines().next()?;
            let sent = sent_at.get(key)?;
            let got = chrono::DateTime::parse_from_rfc3339(r["received_at"].as_str()?).ok()?;
            (got.with_timezone(&chrono::Utc) - *sent).to_std().ok()
        })
        .collect();
    lat.sort();
    if total > 0 {
        println!(
            "event to provider at 500 events/s: p50 {:.1} ms, p99 {:.1} ms ({} events)",
            ms(pct(&lat, 0.5)),
            ms(pct(&lat, 0.99)),
            lat.len()
        );
    }

    let mut inapp_peak = procs.pid("worker-inapp").and_then(peak_rss_kib);
    if cfg.wants("fanout") {
        inapp_peak = procs.pid("worker-inapp").and_then(peak_rss_kib);
        procs.terminate("worker-inapp").await?; // measure the fan-out alone
        for subscribers in fanout::SIZES {
            fanout::measure(&pool, &channel, subscribers).await?;
        }
    }
    if cfg.wants("cancel") {
        cancel::measure(&pool, &channel).await?;
    }
    if cfg.wants("console") {
        let http_url =
            std::env::var("NOTIFY_HTTP_URL").unwrap_or_else(|_| "http://127.0.0.1:58090".into());
        crate::console_bench::run(&pool, &mut procs, &http_url).await?;
    }
    for name in [
        "ingest",
        "worker-line",
        "worker-email",
        "worker-push",
        "worker-inapp",
    ] {
        let kib = if name == "worker-inapp" {
            inapp_peak
        } else {
            procs.pid(name).and_then(peak_rss_kib)
        };
        if let Some(kib) = kib {
            println!("peak memory {name}: {:.1} MiB", kib as f64 / 1024.0);
        }
    }
    println!(
        "ratios: ingest {:.0}% of the postgres ceiling; end to end {:.0}% of the broker ceiling",
        100.0 * ingest_rate / pg,
        100.0 * e2e / broker
    );
    procs.stop_all().await;
    if let Ok(conn) = notify_broker::connect(&cfg.amqp_url, "bench-cleanup").await
        && let Ok(ch) = conn.create_channel().await
    {
        let prefix = std::env::var("NOTIFY_AMQP_PREFIX").unwrap_or_default();
        let _ = notify_broker::Topology::new(prefix)
            .delete(&ch, &ingest::relay::QUEUE_CHANNELS)
            .await;
    }
    Ok(())
}
