//! The status-webhook part of a chaos run: a calling service (`chaos-hooks`) with two
//! endpoints, one served by the Python receiver and one by the Node receiver of
//! `examples/` (each verifying with the Standard Webhooks reference library of its
//! language), and an event of 500 recipients on LINE and in-app (1,000 deliveries) sent
//! while the run kills `worker-webhook`, ingest (whose relay publishes the messages) and
//! the rest. Afterwards every message written for either endpoint must have reached its
//! receiver verified, and every delivery's final state must have its message.
//!
//! Its line, one per receiver:
//!
//! `chaos: webhooks receiver=python deliveries=1000 messages=M received=R webhooks_lost=0 webhooks_duplicates=D unwritten=0 rejected=0`
//!
//! - webhooks_lost: a message of the endpoint whose `webhook-id` the receiver never
//!   verified (or that ended `failed`), plus `unwritten`;
//! - unwritten: a delivery in a final state (sent, failed, canceled, skipped) without the
//!   message of that state at its final `state_version` (a change without its message);
//! - webhooks_duplicates: verified requests beyond the first per `webhook-id` (allowed:
//!   delivery is at least once);
//! - rejected: requests the library refused (a signature the platform got wrong).

use super::ChaosConfig;
use crate::keys::{ApiKeyAuth, Grpc};
use anyhow::{Context, bail};
use notify_proto::v1 as pb;
use notify_store::api_keys::{self, NewApiKey};
use serde_json::Value;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};
use tonic::service::interceptor::InterceptedService;
use uuid::Uuid;

/// The caller whose deliveries the receivers get.
const CALLER: &str = "chaos-hooks";
/// Recipients of the webhook event (two channels each).
const RECIPIENTS: usize = 500;

/// One receiver process and its endpoint.
struct Receiver {
    name: &'static str,
    endpoint_id: Uuid,
    log: PathBuf,
    child: Child,
}

/// The webhook part of one run, under way.
pub(super) struct Hooks {
    receivers: Vec<Receiver>,
    event_id: Uuid,
}

/// What one receiver got.
#[derive(Debug, Default)]
pub(super) struct HooksReport {
    /// `python` or `node`.
    pub receiver: &'static str,
    /// Deliveries of the webhook event.
    pub deliveries: i64,
    /// Messages written for the receiver's endpoint.
    pub messages: usize,
    /// Verified requests, duplicates included.
    pub received: usize,
    /// Messages never verified by the receiver, or ended failed; plus `unwritten`.
    pub lost: usize,
    /// Verified requests beyond the first per webhook-id.
    pub duplicates: usize,
    /// Final states without their message.
    pub unwritten: i64,
    /// Requests the reference library refused.
    pub rejected: usize,
    /// The webhook event's deliveries themselves kept their promises (none lost, stuck
    /// or sent twice unexplained); set by the run after its delivery check.
    pub deliveries_ok: bool,
}

impl HooksReport {
    /// The summary line.
    pub(super) fn line(&self) -> String {
        format!(
            "chaos: webhooks receiver={} deliveries={} messages={} received={} webhooks_lost={} webhooks_duplicates={} unwritten={} rejected={}",
            self.receiver,
            self.deliveries,
            self.messages,
            self.received,
            self.lost,
            self.duplicates,
            self.unwritten,
            self.rejected
        )
    }

    /// Nothing lost, nothing refused.
    pub(super) fn ok(&self) -> bool {
        self.lost == 0 && self.rejected == 0 && self.messages > 0 && self.deliveries_ok
    }
}

/// A free loopback port (bound and released; the receiver binds it a moment later).
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts a receiver and waits for its `listening on` line.
async fn spawn_receiver(
    cfg: &ChaosConfig,
    name: &'static str,
    port: u16,
    secret: &str,
    log: &PathBuf,
) -> anyhow::Result<Child> {
    let mut cmd = match name {
        "python" => {
            let mut c = Command::new(&cfg.examples_python);
            c.arg(cfg.examples_dir.join("python/webhook_receiver.py"));
            c
        }
        _ => {
            let mut c = Command::new("node");
            c.arg(cfg.examples_dir.join("node/webhook-receiver.mjs"));
            c
        }
    };
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(cfg.log_dir.join(format!("chaos-receiver-{name}.log")))?;
    let mut child = cmd
        .env("WEBHOOK_SECRET", secret)
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .env("WEBHOOK_LOG", log)
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting the {name} webhook receiver"))?;
    let stdout = child.stdout.take().context("receiver stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(l) = lines.next_line().await? {
            if l.starts_with("listening on") {
                return Ok::<_, std::io::Error>(true);
            }
        }
        Ok(false)
    })
    .await;
    match ready {
        Ok(Ok(true)) => {}
        _ => bail!(
            "the {name} webhook receiver did not start (see {})",
            cfg.log_dir
                .join(format!("chaos-receiver-{name}.log"))
                .display()
        ),
    }
    // Keep draining its stdout so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(child)
}

/// Registers the caller's endpoints, starts both receivers and sends the webhook event
/// of run `run` to `users[..RECIPIENTS]` on LINE and in-app.
pub(super) async fn start(
    cfg: &ChaosConfig,
    pool: &PgPool,
    grpc_url: &str,
    users: &[String],
    run: usize,
) -> anyhow::Result<Hooks> {
    let key = match api_keys::create(
        pool,
        &NewApiKey {
            name: format!("{CALLER}-{run}"),
            send_types: vec!["*".into()],
            can_manage: false,
            events_per_second: 1_000,
            max_recipients: RECIPIENTS as i32,
        },
    )
    .await
    {
        Ok((key, _)) => key,
        Err(e) => bail!("creating the {CALLER} API key: {e}"),
    };
    let channel = tonic::transport::Endpoint::from_shared(grpc_url.to_string())?
        .connect()
        .await?;
    let grpc: Grpc = InterceptedService::new(channel, ApiKeyAuth::bearer(&key)?);
    let mut receivers = Vec::new();
    for name in ["python", "node"] {
        let port = free_port()?;
        let created = pb::webhook_service_client::WebhookServiceClient::new(grpc.clone())
            .create_webhook_endpoint(pb::CreateWebhookEndpointRequest {
                url: format!("http://127.0.0.1:{port}/hooks/{name}"),
                event_types: vec![],
                caller: String::new(),
            })
            .await
            .context("CreateWebhookEndpoint")?
            .into_inner();
        let endpoint_id: Uuid = created.endpoint.context("endpoint")?.id.parse()?;
        let log = cfg
            .log_dir
            .join(format!("chaos-webhooks-{run}-{name}.jsonl"));
        let _ = std::fs::remove_file(&log);
        let child = spawn_receiver(cfg, name, port, &created.secret, &log).await?;
        receivers.push(Receiver {
            name,
            endpoint_id,
            log,
            child,
        });
    }
    let reply = pb::ingest_service_client::IngestServiceClient::new(grpc)
        .create_event(pb::CreateEventRequest {
            event_key: format!("chaos:hooks:{run}:{}", Uuid::new_v4().simple()),
            r#type: "chaos_hooks".into(),
            actor_id: "chaos".into(),
            recipients: users[..RECIPIENTS].to_vec(),
            content: Some(pb::Content {
                title: format!("สถานะคำสั่งซื้อ รอบที่ {}", run + 1),
                body: "คำสั่งซื้อของคุณได้รับการชำระเงินแล้ว".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .context("CreateEvent of the webhook event")?
        .into_inner();
    Ok(Hooks {
        receivers,
        event_id: reply.event_id.parse()?,
    })
}

impl Hooks {
    /// The webhook event.
    pub(super) fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// Waits (up to `settle`) until no message of the receivers' endpoints is pending or
    /// sending, stops the receivers and checks their logs against Postgres.
    pub(super) async fn finish(
        self,
        pool: &PgPool,
        settle: Duration,
    ) -> anyhow::Result<Vec<HooksReport>> {
        let endpoints: Vec<Uuid> = self.receivers.iter().map(|r| r.endpoint_id).collect();
        let started = Instant::now();
        loop {
            let open: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM webhook_messages
                 WHERE endpoint_id = ANY($1) AND status IN ('pending', 'sending')",
            )
            .bind(&endpoints)
            .fetch_one(pool)
            .await
            .unwrap_or(-1);
            if open == 0 {
                break;
            }
            if started.elapsed() > settle {
                println!("  webhooks not settled after {settle:?}: {open} messages open");
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let deliveries: i64 =
            sqlx::query_scalar("SELECT count(*) FROM notification_deliveries WHERE event_id = $1")
                .bind(self.event_id)
                .fetch_one(pool)
                .await?;
        let mut reports = Vec::new();
        for mut r in self.receivers {
            let _ = r.child.start_kill();
            let _ = r.child.wait().await;
            let messages: Vec<(Uuid, String)> =
                sqlx::query_as("SELECT id, status FROM webhook_messages WHERE endpoint_id = $1")
                    .bind(r.endpoint_id)
                    .fetch_all(pool)
                    .await?;
            // Every final state has its message, at the final state_version.
            let unwritten: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM notification_deliveries d
                 WHERE d.event_id = $1 AND d.status IN ('sent', 'failed', 'canceled', 'skipped')
                   AND NOT EXISTS (
                       SELECT 1 FROM webhook_messages m
                       WHERE m.endpoint_id = $2 AND m.delivery_id = d.id
                         AND m.state_version = d.state_version
                         AND m.event_type = CASE d.status WHEN 'sent' THEN 'delivery.sent'
                             WHEN 'failed' THEN 'delivery.failed'
                             WHEN 'canceled' THEN 'delivery.cancelled'
                             ELSE 'delivery.skipped' END)",
            )
            .bind(self.event_id)
            .bind(r.endpoint_id)
            .fetch_one(pool)
            .await?;
            let text = std::fs::read_to_string(&r.log).unwrap_or_default();
            let mut verified: HashMap<String, usize> = HashMap::new();
            let mut rejected = 0;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let v: Value = serde_json::from_str(line)
                    .with_context(|| format!("a line of {}: {line}", r.log.display()))?;
                let id = v["webhook_id"].as_str().unwrap_or_default().to_string();
                if v["verified"] == Value::Bool(true) {
                    *verified.entry(id).or_default() += 1;
                } else {
                    rejected += 1;
                }
            }
            let ids: HashSet<String> = messages
                .iter()
                .filter(|(_, status)| status == "sent")
                .map(|(id, _)| format!("msg_{}", id.simple()))
                .collect();
            let lost = messages.len() - ids.iter().filter(|id| verified.contains_key(*id)).count();
            reports.push(HooksReport {
                receiver: r.name,
                deliveries,
                messages: messages.len(),
                received: verified.values().sum(),
                lost: lost + unwritten as usize,
                duplicates: verified.values().map(|n| n - 1).sum(),
                unwritten,
                rejected,
                deliveries_ok: false,
            });
        }
        Ok(reports)
    }
}
