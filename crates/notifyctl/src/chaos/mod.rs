//! `notifyctl chaos`: broadcasts under crashes and outages, then checks every provider
//! record against Postgres.
//!
//! Two runs: 2,000 recipients on LINE, email and in-app, then 20,000 on LINE and in-app.
//! During each run the tool kills every worker type and ingest with SIGKILL at random
//! moments, restarts a worker with SIGTERM twice, restarts RabbitMQ once and PostgreSQL
//! once, while the simulator answers 5 % of LINE calls with 503 and adds random latency.
//! It then prints one line per run:
//!
//! `chaos: deliveries=N sent=S failed=F lost=0 duplicates_line=0 duplicates_other=D ambiguous=A stuck=0 max_recovery_s=R`
//!
//! - lost: a delivery not final at the end, or `sent` while the provider has no record;
//! - duplicates_line: LINE pushes accepted (200) more than once for one delivery;
//! - duplicates_other: extra copies on other channels (email by Message-ID);
//! - ambiguous: deliveries with a provider call that was never recorded (a crash after the
//!   claim); every duplicate must be one of them;
//! - max_recovery_s: longest time from a kill until no delivery still held a lease of the
//!   killed worker (the sweeper returned it to pending).
//!
//! Each run also schedules a wave of 40 events to 10 recipients each, due 6 to 25 s
//! ahead while the kills go on, two per cancellation key; every other key is canceled
//! (`CancelEvent`, asked again while ingest or Postgres is down) at least 3 s before its
//! events are due. Its line:
//!
//! `chaos: wave scheduled=N scheduled_sent=S scheduled_lost=0 early=0 canceled=C canceled_sent=0 …`
//!
//! - scheduled_lost: a delivery of a kept event not sent, or sent without a provider record;
//! - early: a delivery sent before its event's `send_at`;
//! - canceled_sent: a canceled delivery a provider has a record of, or a delivery of a
//!   canceled event sent after the cancel was answered.
//!
//! Each run also sends a 1,000-delivery event of a caller with two status-webhook
//! endpoints, served by the Python and the Node receivers of `examples/` (the Standard
//! Webhooks reference libraries), while `worker-webhook` is killed too; one line per
//! receiver (see `hooks.rs`):
//!
//! `chaos: webhooks receiver=python deliveries=1000 messages=M received=R webhooks_lost=0 webhooks_duplicates=D unwritten=0 rejected=0`

mod check;
pub mod ha;
mod hooks;
mod recovery;
mod wave;

pub use check::RunReport;
use check::check;
use recovery::{kill_webhook_worker, snapshot, watch_recovery, webhooks_mid_stream};

use crate::procs::{Procs, connect_grpc};
use anyhow::{Context, bail};
use notify_proto::v1 as pb;
use rand::Rng;
use serde_json::json;
use sqlx::PgPool;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::process::Command;
use uuid::Uuid;

/// Where the chaos run finds its binaries, services and logs.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Folder holding `ingest` and the `worker-*` binaries.
    pub bin_dir: PathBuf,
    /// `deploy/local-stack.sh` (restarts RabbitMQ and PostgreSQL).
    pub stack_script: PathBuf,
    /// Folder for the processes' logs.
    pub log_dir: PathBuf,
    /// Database of the run (migrated).
    pub database_url: String,
    /// gRPC URL of the ingest this tool starts (`NOTIFY_GRPC_ADDR` is derived from it).
    pub grpc_url: String,
    /// MailDev base URL.
    pub maildev_url: String,
    /// provider-sim base URL.
    pub sim_url: String,
    /// Longest wait for a run to finish after the chaos stops (`NOTIFY_CHAOS_SETTLE`,
    /// 900 s); it also ends after 120 s in which no delivery finished.
    pub settle: Duration,
    /// AMQP URL, to clear the run's queues before it starts.
    pub amqp_url: String,
    /// Prefix of the run's exchanges and queues.
    pub amqp_prefix: String,
    /// Python of the examples' virtual environment (`NOTIFY_EXAMPLES_PYTHON`).
    pub examples_python: PathBuf,
    /// The repository's `examples/` folder (`NOTIFY_EXAMPLES_DIR`).
    pub examples_dir: PathBuf,
    /// `make chaos-ha` (`NOTIFY_CHAOS_HA=1`): failovers of a RabbitMQ cluster and of
    /// PostgreSQL instead of restarts of single servers ([`ha`]).
    pub ha: Option<ha::HaConfig>,
}

use crate::procs::{WEBHOOK_WORKER, WORKERS};

async fn stack(cfg: &ChaosConfig, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(&cfg.stack_script)
        .args(args)
        .output()
        .await
        .context("running local-stack.sh")?;
    if !out.status.success() {
        bail!(
            "local-stack.sh {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// One run's audience.
struct Audience {
    label: &'static str,
    type_key: &'static str,
    channels: &'static [&'static str],
    topic: &'static str,
    users: usize,
    with_email: bool,
}

async fn setup(pool: &PgPool, grpc: &crate::keys::Grpc, a: &Audience) -> anyhow::Result<()> {
    pb::type_service_client::TypeServiceClient::new(grpc.clone())
        .upsert_notification_type(pb::UpsertNotificationTypeRequest {
            key: a.type_key.into(),
            priority: "normal".into(),
            default_channels: a.channels.iter().map(|c| c.to_string()).collect(),
            critical: false,
            ..Default::default()
        })
        .await?;
    pb::topic_service_client::TopicServiceClient::new(grpc.clone())
        .create_topic(pb::CreateTopicRequest {
            key: a.topic.into(),
        })
        .await?;
    // Bulk set-up straight in SQL: 20,000 gRPC calls would only slow the tool down.
    let ids: Vec<String> = (0..a.users)
        .map(|i| format!("{}-{i:06}", a.label))
        .collect();
    let emails: Vec<Option<String>> = ids
        .iter()
        .map(|u| a.with_email.then(|| format!("{u}@example.test")))
        .collect();
    let lines: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, _)| format!("U{:016x}{:016x}", a.users as u64, i as u64))
        .collect();
    sqlx::query(
        "INSERT INTO recipients (user_id, display_name, email, line_user_id)
         SELECT u, 'ลูกค้า ' || u, e, l FROM UNNEST($1::text[], $2::text[], $3::text[]) AS t(u, e, l)
         ON CONFLICT (user_id) DO NOTHING",
    )
    .bind(&ids)
    .bind(&emails)
    .bind(&lines)
    .execute(pool)
    .await?;
    sqlx::query("INSERT INTO topic_subscriptions (topic, user_id) SELECT $1, u FROM UNNEST($2::text[]) AS u ON CONFLICT DO NOTHING")
        .bind(a.topic)
        .bind(&ids)
        .execute(pool)
        .await?;
    Ok(())
}

fn channel_of(worker: &str) -> Option<&str> {
    worker.strip_prefix("worker-")
}

/// Runs both scenarios; returns whether every run kept its promises.
pub async fn run(cfg: &ChaosConfig) -> anyhow::Result<bool> {
    // Start from empty queues: messages of an earlier run point at rows that are gone.
    if let Ok(conn) = notify_broker::connect(&cfg.amqp_url, "chaos").await
        && let Ok(ch) = conn.create_channel().await
    {
        let _ = notify_broker::Topology::new(cfg.amqp_prefix.clone())
            .delete(&ch, &ingest::relay::QUEUE_CHANNELS)
            .await;
    }
    let observed = crate::observe::Observer::new(&cfg.sim_url, Some(&cfg.maildev_url));
    observed.reset().await?;
    observed
        .configure(
            "faults",
            &json!({"provider": "line", "status": 503, "body": {"message": "chaos"}, "probability": 0.05}),
        )
        .await?;
    observed
        .configure(
            "latency",
            &json!({"provider": "line", "min_ms": 5, "max_ms": 400}),
        )
        .await?;

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&cfg.database_url)
        .await?;
    let mut procs = Procs::new(&cfg.bin_dir, &cfg.log_dir, "chaos");
    procs.spawn("ingest")?;
    for w in WORKERS {
        procs.spawn(w)?;
    }
    procs.spawn(WEBHOOK_WORKER)?;
    let grpc = connect_grpc(&cfg.grpc_url).await?;
    let mut all_ok = true;
    pb::type_service_client::TypeServiceClient::new(grpc.clone())
        .upsert_notification_type(pb::UpsertNotificationTypeRequest {
            key: "chaos_hooks".into(),
            priority: "normal".into(),
            default_channels: vec!["line".into(), "inapp".into()],
            critical: false,
            ..Default::default()
        })
        .await?;

    if let Some(h) = &cfg.ha {
        ha::setup(&pool, &grpc).await?;
        // Without synchronous replication first (measured), then with it (nothing
        // acknowledged may be lost); the broadcasts run with it on.
        for sync in [false, true] {
            let report = ha::failover_check(h, &pool, &grpc, sync).await;
            let report = match report {
                Ok(r) => r,
                Err(e) => {
                    procs.stop_all().await;
                    return Err(e);
                }
            };
            println!("{}", report.line());
            all_ok &= report.ok();
        }
    }

    let audiences = [
        Audience {
            label: "chaos-a",
            type_key: "chaos_small",
            channels: &["line", "email", "inapp"],
            topic: "chaos.small",
            users: 2_000,
            with_email: true,
        },
        Audience {
            label: "chaos-b",
            type_key: "chaos_large",
            channels: &["line", "inapp"],
            topic: "chaos.large",
            users: 20_000,
            with_email: false,
        },
    ];
    for (n, a) in audiences.iter().enumerate() {
        setup(&pool, &grpc, a).await?;
        let report = chaos_run(cfg, &pool, &mut procs, a, n).await;
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                procs.stop_all().await;
                return Err(e);
            }
        };
        let (report, wave, hooks) = report;
        println!("{}", report.line());
        println!("{}", wave.line());
        all_ok &= wave.ok();
        for h in &hooks {
            println!("{}", h.line());
            all_ok &= h.ok();
        }
        if report.unexplained_duplicates > 0 {
            println!(
                "  {} duplicate(s) not matched by an ambiguous retry",
                report.unexplained_duplicates
            );
        }
        all_ok &= report.ok();
    }
    procs.stop_all().await;
    Ok(all_ok)
}

async fn chaos_run(
    cfg: &ChaosConfig,
    pool: &PgPool,
    procs: &mut Procs,
    a: &Audience,
    run: usize,
) -> anyhow::Result<(RunReport, wave::WaveReport, Vec<hooks::HooksReport>)> {
    let grpc = connect_grpc(&cfg.grpc_url).await?;
    let reply = pb::ingest_service_client::IngestServiceClient::new(grpc.clone())
        .create_event(pb::CreateEventRequest {
            event_key: format!("chaos:{}:{}", a.topic, Uuid::new_v4()),
            r#type: a.type_key.into(),
            actor_id: "chaos".into(),
            topic: a.topic.into(),
            content: Some(pb::Content {
                title: format!("ทดสอบระบบ รอบที่ {}", run + 1),
                body: "ข้อความทดสอบความทนทาน".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    let event_id: Uuid = reply.event_id.parse()?;
    println!(
        "run {}: event {event_id} to {} subscribers of {}",
        run + 1,
        a.users,
        a.topic
    );
    let wave_users: Vec<String> = (0..a.users)
        .map(|i| format!("{}-{i:06}", a.label))
        .collect();
    let wave = wave::start(&grpc, a.type_key, &wave_users, run).await?;
    let hooks = hooks::start(cfg, pool, &cfg.grpc_url, &wave_users, run).await?;
    let mut watched = wave.ids();
    watched.push(event_id);
    watched.push(hooks.event_id());
    println!(
        "  wave: {} events scheduled 6-25 s ahead, half of them to be canceled by cancellation key",
        watched.len() - 2
    );
    println!(
        "  webhooks: event {} to 500 recipients on LINE and in-app, status webhooks to the Python and Node receivers",
        hooks.event_id()
    );

    // The chaos plan: every worker type and ingest killed, two SIGTERM restarts, one
    // RabbitMQ and one PostgreSQL restart, in random order and at random moments.
    let mut plan: Vec<&'static str> = vec![
        "kill:worker-line",
        "kill:worker-email",
        "kill:worker-inapp",
        "kill:worker-push",
        "kill:worker-webhook",
        "kill:ingest",
        "kill:worker-line",
        "term:worker-line",
        "term:worker-inapp",
        "restart:rabbitmq",
        "restart:postgres",
    ];
    if cfg.ha.is_some() {
        for action in &mut plan {
            *action = match *action {
                "restart:rabbitmq" => "failover:rabbitmq",
                "restart:postgres" => "failover:postgres",
                other => other,
            };
        }
    }
    let mut failovers: Vec<ha::Failover> = Vec::new();
    {
        let mut rng = rand::rng();
        for i in (1..plan.len()).rev() {
            let j = rng.random_range(0..=i);
            plan.swap(i, j);
        }
    }
    let snapshots = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let stop_watch = tokio_util::sync::CancellationToken::new();
    let watcher = tokio::spawn(watch_recovery(
        pool.clone(),
        snapshots.clone(),
        stop_watch.clone(),
    ));
    // Besides the plan, worker-webhook is killed once in the middle of the webhook
    // event's messages (the plan's own kill may find it idle; the event's deliveries
    // queue behind the broadcast): looked for between the plan's actions and after them
    // (up to 60 s). The POSTs it was making go out again after their lease, duplicated,
    // never lost.
    let mut webhook_kill_due = true;
    let hook_endpoints = hooks.endpoints();
    for action in plan {
        let wait = Duration::from_millis(rand::rng().random_range(500..2_500));
        let until = Instant::now() + wait;
        while Instant::now() < until {
            if webhook_kill_due && webhooks_mid_stream(pool, &hook_endpoints).await {
                kill_webhook_worker(pool, procs, &snapshots).await?;
                webhook_kill_due = false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (verb, target) = action.split_once(':').unwrap_or((action, ""));
        let target: &'static str = match target {
            "worker-line" => "worker-line",
            "worker-email" => "worker-email",
            "worker-inapp" => "worker-inapp",
            "worker-push" => "worker-push",
            "worker-webhook" => WEBHOOK_WORKER,
            "ingest" => "ingest",
            "rabbitmq" => "rabbitmq",
            _ => "postgres",
        };
        match verb {
            "kill" => {
                let mut in_flight = 0;
                if target == WEBHOOK_WORKER {
                    kill_webhook_worker(pool, procs, &snapshots).await?;
                    continue;
                }
                if let Some(channel) = channel_of(target) {
                    // Kill during provider calls: wait (up to 5 s) until the worker holds some.
                    let until = Instant::now() + Duration::from_secs(5);
                    loop {
                        match snapshot(pool, event_id, channel).await {
                            Ok(s) if !s.ids.is_empty() || Instant::now() > until => {
                                in_flight = s.ids.len();
                                snapshots.lock().await.push(s);
                                break;
                            }
                            Err(_) if Instant::now() > until => break,
                            _ => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                    }
                }
                procs.kill9(target).await?;
                println!("  kill -9 {target} ({in_flight} in flight)");
                tokio::time::sleep(Duration::from_millis(rand::rng().random_range(100..1_000)))
                    .await;
                procs.spawn(target)?;
            }
            "term" => {
                let clean = procs.terminate(target).await?;
                println!(
                    "  SIGTERM {target}: {}",
                    if clean {
                        "exited 0"
                    } else {
                        "did NOT exit cleanly"
                    }
                );
                if !clean {
                    bail!("{target} did not exit 0 within 40 s of SIGTERM");
                }
                procs.spawn(target)?;
            }
            "failover" => {
                let ha = cfg
                    .ha
                    .as_ref()
                    .context("a failover needs NOTIFY_CHAOS_HA")?;
                failovers.push(if target == "rabbitmq" {
                    ha::broker_failover(cfg, pool, &grpc).await?
                } else {
                    ha::db_failover(ha, pool, &grpc).await?
                });
            }
            _ => {
                stack(cfg, &["stop", target]).await?;
                println!("  {target} stopped");
                tokio::time::sleep(Duration::from_secs(2)).await;
                stack(cfg, &["up"]).await?;
                println!("  {target} started again");
            }
        }
    }

    let until = Instant::now() + Duration::from_secs(60);
    while webhook_kill_due {
        if webhooks_mid_stream(pool, &hook_endpoints).await || Instant::now() > until {
            kill_webhook_worker(pool, procs, &snapshots).await?;
            webhook_kill_due = false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Let it settle with every process up: until nothing is open, or nothing has
    // finished for `STALLED` (stuck, not slow: a loaded machine drains slowly), or the
    // hard limit `cfg.settle`.
    const STALLED: Duration = Duration::from_secs(120);
    let started = Instant::now();
    let mut last_open = i64::MAX;
    let mut progressed = Instant::now();
    loop {
        let fanout: Option<String> =
            sqlx::query_scalar("SELECT fanout_status FROM notification_events WHERE id = $1")
                .bind(event_id)
                .fetch_optional(pool)
                .await
                .ok()
                .flatten();
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM notification_deliveries WHERE event_id = ANY($1) AND status IN ('pending', 'sending')",
        )
        .bind(&watched)
        .fetch_one(pool)
        .await
        .unwrap_or(-1);
        if fanout.as_deref() == Some("done") && open == 0 {
            break;
        }
        if open >= 0 && open < last_open {
            last_open = open;
            progressed = Instant::now();
        }
        if started.elapsed() > cfg.settle || progressed.elapsed() > STALLED {
            println!(
                "  not settled after {:.0} s ({:.0} s without progress): fan-out {fanout:?}, {open} deliveries open",
                started.elapsed().as_secs_f64(),
                progressed.elapsed().as_secs_f64()
            );
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "  settled in {:.0} s after the last kill or restart",
        started.elapsed().as_secs_f64()
    );
    let mut counts = (0, 0);
    let mut failover_recovery_s = 0f64;
    for f in failovers {
        let (kind, took) = f.recovery_s().await;
        println!(
            "  {kind} failover: a probe event created after the kill was delivered {took:.1} s after it"
        );
        if kind == "broker" {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
        failover_recovery_s = failover_recovery_s.max(took);
    }
    let hooks_event = hooks.event_id();
    let hooks = hooks.finish(pool, cfg.settle).await?;
    stop_watch.cancel();
    let _ = watcher.await;
    let mut report = check(cfg, pool, &[event_id]).await?;
    let wave = wave.finish(cfg, pool).await?;
    let hooks_deliveries = check(cfg, pool, &[hooks_event]).await?;
    println!(
        "  webhook event's deliveries: {}",
        hooks_deliveries.line().trim_start_matches("chaos: ")
    );
    let mut hooks = hooks;
    for h in &mut hooks {
        h.deliveries_ok = hooks_deliveries.ok();
    }
    for s in snapshots.lock().await.iter() {
        // Not recovered by the end: count the whole time.
        let took = s.recovered_after.unwrap_or_else(|| s.at.elapsed());
        report.max_recovery_s = report.max_recovery_s.max(took.as_secs_f64());
    }
    if cfg.ha.is_some() {
        report.max_recovery_s = report.max_recovery_s.max(failover_recovery_s);
        report.failovers = Some(counts);
    }
    Ok((report, wave, hooks))
}
