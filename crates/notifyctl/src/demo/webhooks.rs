//! The demo's status webhooks: an endpoint of the demo's caller served by the Python
//! receiver of `examples/` (verifying with the `standardwebhooks` reference library),
//! registered before the event; afterwards every delivery of the event must have arrived
//! there as one verified `delivery.sent`.

use crate::keys::Grpc;
use crate::receivers::{Examples, Receiver, free_port};
use anyhow::Context;
use notify_proto::v1 as pb;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// The endpoint and its receiver.
pub(super) struct Hook {
    receiver: Receiver,
    endpoint_id: String,
}

/// Registers the endpoint (`delivery.sent`, `delivery.failed`) and starts its receiver.
pub(super) async fn start(
    grpc: &Grpc,
    examples: &Examples,
    log_dir: &Path,
) -> anyhow::Result<Hook> {
    let port = free_port()?;
    let created = pb::webhook_service_client::WebhookServiceClient::new(grpc.clone())
        .create_webhook_endpoint(pb::CreateWebhookEndpointRequest {
            url: format!("http://127.0.0.1:{port}/hooks/python"),
            event_types: vec!["delivery.sent".into(), "delivery.failed".into()],
            caller: String::new(),
        })
        .await
        .context("CreateWebhookEndpoint")?
        .into_inner();
    let endpoint_id = created.endpoint.context("endpoint")?.id;
    let receiver = examples
        .start(
            "python",
            port,
            &created.secret,
            &log_dir.join("demo-webhooks.jsonl"),
            &log_dir.join("demo-receiver-python.log"),
        )
        .await?;
    println!(
        "  status webhooks of this caller go to {} (examples/python/webhook_receiver.py)",
        receiver.url
    );
    Ok(Hook {
        receiver,
        endpoint_id,
    })
}

/// Waits (up to 20 s) until the receiver has verified a `delivery.sent` for each of
/// `deliveries`, then stops it and deletes the endpoint (the demo's later parts send no
/// webhooks); the check's text and whether it held.
pub(super) async fn check(
    hook: Hook,
    grpc: &Grpc,
    deliveries: &[String],
) -> anyhow::Result<(String, bool)> {
    let (text, held) = wait_for(&hook.receiver, deliveries).await;
    hook.receiver.stop().await;
    pb::webhook_service_client::WebhookServiceClient::new(grpc.clone())
        .delete_webhook_endpoint(pb::DeleteWebhookEndpointRequest {
            id: hook.endpoint_id,
        })
        .await
        .context("DeleteWebhookEndpoint")?;
    Ok((text, held))
}

async fn wait_for(receiver: &Receiver, deliveries: &[String]) -> (String, bool) {
    let want: BTreeSet<&str> = deliveries.iter().map(String::as_str).collect();
    let started = Instant::now();
    loop {
        let got = receiver.received().unwrap_or_default();
        let sent: BTreeSet<&str> = got
            .lines
            .iter()
            .filter(|l| l["type"] == "delivery.sent")
            .filter_map(|l| l["delivery_id"].as_str())
            .collect();
        let sent: BTreeSet<&str> = sent.intersection(&want).copied().collect();
        let done = sent.len() == want.len();
        if done || started.elapsed() > Duration::from_secs(20) {
            return (
                format!(
                    "status webhooks: {} of {} deliveries arrived as a delivery.sent verified by the Python standardwebhooks receiver ({} refused)",
                    sent.len(),
                    want.len(),
                    got.rejected
                ),
                done && got.rejected == 0,
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
