//! `make chaos-ha`: the chaos runs against a three-node RabbitMQ cluster
//! (`deploy/local-stack.sh rabbitmq-cluster`) and a PostgreSQL primary with a streaming
//! standby behind HAProxy (`deploy/pg-ha.sh`).
//!
//! In this mode the plan's RabbitMQ restart becomes a broker failover (SIGKILL of the
//! node leading the run's LINE queue, started again seconds later) and its PostgreSQL
//! restart a database failover (`pg-ha.sh failover`: SIGKILL of the primary, promotion of
//! the standby, the dead node rebuilt as the new standby). After each, a probe event (one
//! email to `chaos-probe`) measures the recovery: the time from the kill until an event
//! created after it was delivered.
//!
//! Before the broadcasts, [`failover_check`] kills the primary under a stream of
//! `CreateEvent` calls and looks up every acknowledged event on the new primary:
//!
//! `chaos: failover-check sync=on acknowledged=N acknowledged_before_kill=K missing=0 deliveries_missing=0 errors=E`
//!
//! - missing: events whose `CreateEvent` returned OK and that the new primary does not have;
//! - deliveries_missing: events found with fewer deliveries than they were created with.
//!
//! With synchronous replication both must be 0; without it they count what the failover
//! lost (commits the standby had not received at the kill).

use super::ChaosConfig;
use crate::keys::Grpc;
use anyhow::{Context, bail};
use notify_proto::v1 as pb;
use sqlx::PgPool;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::process::Command;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The scripts of the highly available stack.
#[derive(Debug, Clone)]
pub struct HaConfig {
    /// `deploy/pg-ha.sh` (`failover`, `sync on|off`).
    pub pg_ha_script: PathBuf,
}

/// Notification type of the recovery probes: email only, a channel no broadcast of the
/// 20,000-recipient run uses, so a probe measures the failover and not the queue ahead of
/// it (an in-app probe waited behind up to 20,000 in-app deliveries: 60.1 s once).
pub(super) const PROBE_TYPE: &str = "chaos_probe";
/// The recipient of every probe (with an email address).
const PROBE_USER: &str = "chaos-probe";
/// Notification type of the failover check's events.
const CHECK_TYPE: &str = "chaos_failover";
/// Channels of [`CHECK_TYPE`].
const CHECK_CHANNELS: [&str; 2] = ["inapp", "line"];
/// Recipients of every failover-check event.
const CHECK_USERS: [&str; 2] = ["chaos-f-000000", "chaos-f-000001"];
/// Concurrent `CreateEvent` callers of the failover check.
const CHECK_CALLERS: usize = 8;
/// How long the callers run before the primary is killed: the events acknowledged in this
/// window are the ones the acceptance is about (all acknowledged ones are checked).
const CHECK_WARM_UP: Duration = Duration::from_secs(10);
/// Longest wait for a probe (created and delivered).
const PROBE_LIMIT: Duration = Duration::from_secs(180);

/// Runs `script args…`; returns its standard output, or an error with its standard error.
async fn script(path: &std::path::Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(path)
        .args(args)
        .output()
        .await
        .with_context(|| format!("running {}", path.display()))?;
    if !out.status.success() {
        bail!(
            "{} {args:?} failed: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Creates the probe and failover-check types and recipients (idempotent).
pub(super) async fn setup(pool: &PgPool, grpc: &Grpc) -> anyhow::Result<()> {
    let types = pb::type_service_client::TypeServiceClient::new(grpc.clone());
    for (key, channels) in [
        (PROBE_TYPE, &["email"][..]),
        (CHECK_TYPE, &CHECK_CHANNELS[..]),
    ] {
        types
            .clone()
            .upsert_notification_type(pb::UpsertNotificationTypeRequest {
                key: key.into(),
                priority: "normal".into(),
                default_channels: channels.iter().map(|c| c.to_string()).collect(),
                critical: false,
                ..Default::default()
            })
            .await?;
    }
    sqlx::query(
        "INSERT INTO recipients (user_id, display_name, line_user_id)
         SELECT u, 'ลูกค้า ' || u, 'U' || md5(u) FROM UNNEST($1::text[]) AS u
         ON CONFLICT (user_id) DO NOTHING",
    )
    .bind(&CHECK_USERS[..])
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO recipients (user_id, display_name, email) VALUES ($1, 'ผู้ตรวจสอบ', $1 || '@example.test')
         ON CONFLICT (user_id) DO NOTHING",
    )
    .bind(PROBE_USER)
    .execute(pool)
    .await?;
    Ok(())
}

/// A failover of the plan and the probe measuring its recovery.
pub(super) struct Failover {
    /// `broker` or `db`.
    pub(super) kind: &'static str,
    probe: JoinHandle<anyhow::Result<Duration>>,
}

impl Failover {
    /// Seconds from the kill until the probe was delivered (the whole limit when it never was).
    pub(super) async fn recovery_s(self) -> (&'static str, f64) {
        let took = match self.probe.await {
            Ok(Ok(d)) => d.as_secs_f64(),
            Ok(Err(e)) => {
                println!("  {} failover probe failed: {e:#}", self.kind);
                PROBE_LIMIT.as_secs_f64()
            }
            Err(e) => {
                println!("  {} failover probe panicked: {e}", self.kind);
                PROBE_LIMIT.as_secs_f64()
            }
        };
        (self.kind, took)
    }
}

/// Creates one probe event (an email to [`PROBE_USER`]), retried until ingest answers OK (same
/// `event_key`, so a retry of an accepted call is a duplicate), then waits until its
/// delivery is `sent`; returns the time since `since`.
async fn probe(grpc: Grpc, pool: PgPool, since: Instant) -> anyhow::Result<Duration> {
    let key = format!("chaos:probe:{}", Uuid::new_v4());
    let event_id: Uuid = loop {
        if since.elapsed() > PROBE_LIMIT {
            bail!("ingest did not accept the probe within {PROBE_LIMIT:?}");
        }
        let mut client = pb::ingest_service_client::IngestServiceClient::new(grpc.clone());
        let call = client.create_event(pb::CreateEventRequest {
            event_key: key.clone(),
            r#type: PROBE_TYPE.into(),
            actor_id: "chaos".into(),
            recipients: vec![PROBE_USER.to_string()],
            content: Some(pb::Content {
                title: "ตรวจสอบการกู้คืน".into(),
                body: "probe".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        match tokio::time::timeout(Duration::from_secs(10), call).await {
            Ok(Ok(r)) => break r.into_inner().event_id.parse()?,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    loop {
        if since.elapsed() > PROBE_LIMIT {
            bail!("probe event {event_id} not delivered within {PROBE_LIMIT:?}");
        }
        let sent: Result<i64, _> = sqlx::query_scalar(
            "SELECT count(*) FROM notification_deliveries WHERE event_id = $1 AND status = 'sent'",
        )
        .bind(event_id)
        .fetch_one(&pool)
        .await;
        if let Ok(n) = sent
            && n > 0
        {
            return Ok(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SIGKILL of the RabbitMQ node leading `queue`; started again 3 to 8 s later. The probe
/// starts at the kill.
pub(super) async fn broker_failover(
    cfg: &ChaosConfig,
    pool: &PgPool,
    grpc: &Grpc,
) -> anyhow::Result<Failover> {
    let queue = format!("{}deliveries.line", cfg.amqp_prefix);
    let stack = &cfg.stack_script;
    let leader = script(stack, &["rabbitmq-cluster", "leader", &queue]).await?;
    script(stack, &["rabbitmq-cluster", "kill", &leader]).await?;
    let at = Instant::now();
    let probe = tokio::spawn(probe(grpc.clone(), pool.clone(), at));
    println!("  kill -9 RabbitMQ node {leader} (leader of {queue})");
    let down = Duration::from_millis(rand::Rng::random_range(&mut rand::rng(), 3_000..8_000));
    tokio::time::sleep(down).await;
    script(stack, &["rabbitmq-cluster", "start", &leader]).await?;
    println!(
        "  RabbitMQ node {leader} started again, back in its queues {:.1} s after the kill",
        at.elapsed().as_secs_f64()
    );
    Ok(Failover {
        kind: "broker",
        probe,
    })
}

/// `pg-ha.sh failover`; the probe starts just before it (the script kills the primary
/// first).
pub(super) async fn db_failover(
    ha: &HaConfig,
    pool: &PgPool,
    grpc: &Grpc,
) -> anyhow::Result<Failover> {
    let at = Instant::now();
    let probe = tokio::spawn(probe(grpc.clone(), pool.clone(), at));
    let said = script(&ha.pg_ha_script, &["failover"]).await?;
    println!("  {said}");
    Ok(Failover { kind: "db", probe })
}

/// One failover-check caller's acknowledged events (with when) and failed calls.
type CallerResult = (Vec<(Uuid, Instant)>, usize);

/// What [`failover_check`] found.
#[derive(Debug, Default)]
pub struct FailoverCheck {
    /// Synchronous replication on during the check.
    pub sync: bool,
    /// `CreateEvent` calls answered OK.
    pub acknowledged: usize,
    /// Of those, answered before the primary was killed.
    pub acknowledged_before_kill: usize,
    /// Acknowledged events the new primary does not have.
    pub missing: usize,
    /// Acknowledged events found with fewer deliveries than created.
    pub deliveries_missing: usize,
    /// Calls that failed (during the failover; the caller would retry them).
    pub errors: usize,
}

impl FailoverCheck {
    /// The summary line.
    pub fn line(&self) -> String {
        format!(
            "chaos: failover-check sync={} acknowledged={} acknowledged_before_kill={} missing={} deliveries_missing={} errors={}",
            if self.sync { "on" } else { "off" },
            self.acknowledged,
            self.acknowledged_before_kill,
            self.missing,
            self.deliveries_missing,
            self.errors
        )
    }

    /// With synchronous replication nothing acknowledged may be lost; without it the
    /// check only measures.
    pub fn ok(&self) -> bool {
        !self.sync || (self.missing == 0 && self.deliveries_missing == 0)
    }
}

/// Sets synchronous replication, runs [`CHECK_CALLERS`] callers of `CreateEvent` (2
/// recipients x 2 channels each), fails the primary over [`CHECK_WARM_UP`] in, keeps calling 3 s after
/// the script returns, then looks every acknowledged event up through the new primary.
pub async fn failover_check(
    ha: &HaConfig,
    pool: &PgPool,
    grpc: &Grpc,
    sync: bool,
) -> anyhow::Result<FailoverCheck> {
    script(&ha.pg_ha_script, &["sync", if sync { "on" } else { "off" }]).await?;
    let stop = CancellationToken::new();
    let callers: Vec<JoinHandle<CallerResult>> = (0..CHECK_CALLERS)
        .map(|c| {
            let grpc = grpc.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut acked = Vec::new();
                let mut errors = 0;
                let mut n = 0u64;
                while !stop.is_cancelled() {
                    n += 1;
                    let mut client =
                        pb::ingest_service_client::IngestServiceClient::new(grpc.clone());
                    let call = client.create_event(pb::CreateEventRequest {
                        event_key: format!("chaos:failover:{c}:{n}:{}", Uuid::new_v4()),
                        r#type: CHECK_TYPE.into(),
                        actor_id: "chaos".into(),
                        recipients: CHECK_USERS.iter().map(|u| u.to_string()).collect(),
                        content: Some(pb::Content {
                            title: "ทดสอบการสลับฐานข้อมูล".into(),
                            body: format!("ครั้งที่ {n}"),
                            ..Default::default()
                        }),
                        ..Default::default()
                    });
                    match tokio::time::timeout(Duration::from_secs(10), call).await {
                        Ok(Ok(r)) => match r.into_inner().event_id.parse() {
                            Ok(id) => acked.push((id, Instant::now())),
                            Err(_) => errors += 1,
                        },
                        _ => {
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                (acked, errors)
            })
        })
        .collect();
    tokio::time::sleep(CHECK_WARM_UP).await;
    let killed_at = Instant::now();
    let said = script(&ha.pg_ha_script, &["failover"]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    let mut report = FailoverCheck {
        sync,
        ..Default::default()
    };
    let mut ids = Vec::new();
    for c in callers {
        let (acked, errors) = c.await?;
        report.errors += errors;
        report.acknowledged_before_kill += acked.iter().filter(|(_, at)| *at < killed_at).count();
        ids.extend(acked.into_iter().map(|(id, _)| id));
    }
    println!("  {}", said?);
    report.acknowledged = ids.len();
    let want = (CHECK_USERS.len() * CHECK_CHANNELS.len()) as i64;
    let found: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT e.id, count(d.id) FROM notification_events e
         LEFT JOIN notification_deliveries d ON d.event_id = e.id
         WHERE e.id = ANY($1) GROUP BY e.id",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    report.missing = ids.len() - found.len();
    report.deliveries_missing = found.iter().filter(|(_, n)| *n < want).count();
    Ok(report)
}
