//! The confirmed publisher: persistent, mandatory messages on a confirm-mode channel,
//! pipelined, one [`PublishOutcome`] per message.

use crate::{BrokerError, DeliveryBatch, DeliveryMessage, Topology};
use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel as AmqpChannel, Connection};
use std::time::Duration;
use uuid::Uuid;

/// How one publish ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The broker confirmed and routed it to a queue.
    Confirmed,
    /// Confirmed but returned as unroutable (`mandatory`): no queue is bound for it.
    Unroutable,
    /// The broker refused it (nack).
    Nacked,
    /// The channel failed or the confirm did not arrive; the outcome is unknown.
    Unknown(String),
}

/// One message for [`Publisher::publish_bodies`].
struct Outgoing<'a> {
    routing_key: &'a str,
    body: Vec<u8>,
    message_id: Uuid,
    headers: &'a std::collections::HashMap<String, String>,
}

/// A publisher on its own channel in confirm mode. Publishes are pipelined: a batch is
/// written in full, then its confirms are awaited together.
pub struct Publisher {
    channel: AmqpChannel,
    exchange: String,
    confirm_timeout: Duration,
}

impl Publisher {
    /// Opens a confirm-mode channel on `conn` publishing to `topology`'s exchange.
    pub async fn new(
        conn: &Connection,
        topology: &Topology,
        confirm_timeout: Duration,
    ) -> Result<Self, BrokerError> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            channel,
            exchange: topology.exchange(),
            confirm_timeout,
        })
    }

    /// Whether the channel is still usable.
    pub fn is_healthy(&self) -> bool {
        self.channel.status().connected()
    }

    /// Publishes `messages` (routing key = channel) as persistent, mandatory messages and
    /// returns one outcome per message, in order. Never waits longer than the confirm
    /// timeout in total.
    pub async fn publish_batch(&self, messages: &[DeliveryMessage]) -> Vec<PublishOutcome> {
        self.publish_batch_with_headers(messages, &[]).await
    }

    /// As [`Publisher::publish_batch`], with message headers: `headers[i]` (string
    /// values, e.g. W3C `traceparent` / `tracestate`) go with `messages[i]`; missing
    /// entries mean no headers.
    pub async fn publish_batch_with_headers(
        &self,
        messages: &[DeliveryMessage],
        headers: &[std::collections::HashMap<String, String>],
    ) -> Vec<PublishOutcome> {
        let none = std::collections::HashMap::new();
        self.publish_bodies(messages.iter().enumerate().map(|(i, m)| Outgoing {
            routing_key: &m.channel,
            body: serde_json::to_vec(m).unwrap_or_default(),
            message_id: m.delivery_id,
            headers: headers.get(i).unwrap_or(&none),
        }))
        .await
    }

    /// Publishes version-2 messages ([`DeliveryBatch`], routing key = channel) as
    /// persistent, mandatory messages; one outcome per message, in order, which holds for
    /// every delivery it names. The message id is the first delivery's id. Never waits
    /// longer than the confirm timeout in total.
    pub async fn publish_delivery_batches(&self, batches: &[DeliveryBatch]) -> Vec<PublishOutcome> {
        let none = std::collections::HashMap::new();
        self.publish_bodies(batches.iter().map(|b| Outgoing {
            routing_key: &b.channel,
            body: serde_json::to_vec(b).unwrap_or_default(),
            message_id: b.deliveries.first().map(|p| p.id).unwrap_or_default(),
            headers: &none,
        }))
        .await
    }

    async fn publish_bodies<'a>(
        &self,
        messages: impl Iterator<Item = Outgoing<'a>>,
    ) -> Vec<PublishOutcome> {
        let mut pending = Vec::with_capacity(messages.size_hint().0);
        for m in messages {
            let body = m.body;
            let mut table = FieldTable::default();
            for (k, v) in m.headers {
                table.insert(k.clone().into(), AMQPValue::LongString(v.clone().into()));
            }
            let props = BasicProperties::default()
                .with_headers(table)
                // 2 = persistent: the message survives a broker restart.
                .with_delivery_mode(2)
                .with_content_type("application/json".into())
                .with_message_id(m.message_id.to_string().into());
            let res = self
                .channel
                .basic_publish(
                    self.exchange.clone().into(),
                    m.routing_key.into(),
                    // mandatory: an unroutable message comes back instead of vanishing.
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &body,
                    props,
                )
                .await;
            pending.push(res);
        }
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            let outcome = match p {
                Err(e) => PublishOutcome::Unknown(e.to_string()),
                Ok(confirm) => match tokio::time::timeout_at(deadline, confirm).await {
                    Err(_) => PublishOutcome::Unknown(
                        BrokerError::ConfirmTimeout(self.confirm_timeout).to_string(),
                    ),
                    Ok(Err(e)) => PublishOutcome::Unknown(e.to_string()),
                    Ok(Ok(Confirmation::Ack(Some(_)))) => PublishOutcome::Unroutable,
                    Ok(Ok(Confirmation::Ack(None))) => PublishOutcome::Confirmed,
                    Ok(Ok(Confirmation::Nack(_))) => PublishOutcome::Nacked,
                    Ok(Ok(Confirmation::NotRequested)) => {
                        PublishOutcome::Unknown("confirms not enabled".into())
                    }
                },
            };
            out.push(outcome);
        }
        out
    }
}
