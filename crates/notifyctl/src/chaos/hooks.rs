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
use crate::receivers::{Examples, Receiver, free_port};
use anyhow::{Context, bail};
use notify_proto::v1 as pb;
use notify_store::api_keys::{self, NewApiKey};
use sqlx::PgPool;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tonic::service::interceptor::InterceptedService;
use uuid::Uuid;

/// The caller whose deliveries the receivers get.
const CALLER: &str = "chaos-hooks";
/// Recipients of the webhook event (two channels each).
const RECIPIENTS: usize = 500;

/// One receiver process and its endpoint.
struct Hooked {
    receiver: Receiver,
    endpoint_id: Uuid,
}

/// The webhook part of one run, under way.
pub(super) struct Hooks {
    receivers: Vec<Hooked>,
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
    // Ingest learns of a new key through a NOTIFY (milliseconds, asynchronously): ask
    // until it knows it.
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let asked = pb::webhook_service_client::WebhookServiceClient::new(grpc.clone())
            .list_webhook_endpoints(pb::ListWebhookEndpointsRequest::default())
            .await;
        match asked {
            Ok(_) => break,
            Err(e) if e.code() == tonic::Code::Unauthenticated && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => bail!("ingest does not take the new {CALLER} key: {e}"),
        }
    }
    let examples = Examples {
        python: cfg.examples_python.clone(),
        dir: cfg.examples_dir.clone(),
    };
    let mut receivers = Vec::new();
    for lang in ["python", "node"] {
        let port = free_port()?;
        let created = pb::webhook_service_client::WebhookServiceClient::new(grpc.clone())
            .create_webhook_endpoint(pb::CreateWebhookEndpointRequest {
                url: format!("http://127.0.0.1:{port}/hooks/{lang}"),
                event_types: vec![],
                caller: String::new(),
            })
            .await
            .context("CreateWebhookEndpoint")?
            .into_inner();
        let endpoint_id: Uuid = created.endpoint.context("endpoint")?.id.parse()?;
        let receiver = examples
            .start(
                lang,
                port,
                &created.secret,
                &cfg.log_dir
                    .join(format!("chaos-webhooks-{run}-{lang}.jsonl")),
                &cfg.log_dir.join(format!("chaos-receiver-{lang}.log")),
            )
            .await?;
        receivers.push(Hooked {
            receiver,
            endpoint_id,
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

    /// The run's two endpoints.
    pub(super) fn endpoints(&self) -> Vec<Uuid> {
        self.receivers.iter().map(|r| r.endpoint_id).collect()
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
        for r in self.receivers {
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
            let got = r.receiver.received()?;
            let lang = r.receiver.lang;
            r.receiver.stop().await;
            let ids: HashSet<String> = messages
                .iter()
                .filter(|(_, status)| status == "sent")
                .map(|(id, _)| format!("msg_{}", id.simple()))
                .collect();
            let lost = messages.len()
                - ids
                    .iter()
                    .filter(|id| got.verified.contains_key(*id))
                    .count();
            reports.push(HooksReport {
                receiver: lang,
                deliveries,
                messages: messages.len(),
                received: got.verified.values().sum(),
                lost: lost + unwritten as usize,
                duplicates: got.verified.values().map(|n| n - 1).sum(),
                unwritten,
                rejected: got.rejected,
                deliveries_ok: false,
            });
        }
        Ok(reports)
    }
}
