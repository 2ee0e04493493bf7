//! The consuming side of a channel queue: a [`Consumer`] on its own channel with a
//! prefetch limit and manual acks, handing out [`Inbound`] messages that are settled
//! once, by [`Inbound::ack`], [`Inbound::reject`] (to the dead-letter queue) or
//! [`Inbound::nack_requeue`].

use crate::BrokerError;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel as AmqpChannel, Connection};
use tracing::warn;

/// A consumer of one queue, on a channel of its own.
pub struct Consumer {
    channel: AmqpChannel,
    tag: String,
    stream: lapin::Consumer,
}

impl Consumer {
    /// Starts consuming `queue` on a new channel of `conn` under consumer tag `tag`, with
    /// at most `prefetch` unsettled messages in hand.
    pub async fn start(
        conn: &Connection,
        queue: &str,
        tag: &str,
        prefetch: u16,
    ) -> Result<Self, BrokerError> {
        let channel = crate::consumer_channel(conn, prefetch).await?;
        let stream = channel
            .basic_consume(
                queue.into(),
                tag.into(),
                BasicConsumeOptions {
                    // Manual acks: a message is settled only after its delivery's state is
                    // committed, so a worker that dies mid-call leaves it to be redelivered.
                    no_ack: false,
                    // Other workers (replicas) consume the same queue side by side.
                    exclusive: false,
                    // Irrelevant to consumers (it concerns publishes on this connection).
                    no_local: false,
                    // Wait for the broker's consume-ok, so a refused queue is an error here.
                    nowait: false,
                },
                FieldTable::default(),
            )
            .await?;
        Ok(Self {
            channel,
            tag: tag.to_string(),
            stream,
        })
    }

    /// The next message; `None` when the broker ended the consumer (channel or
    /// connection closed, or cancelled).
    pub async fn next(&mut self) -> Option<Result<Inbound, BrokerError>> {
        let next = self.stream.next().await?;
        Some(next.map(Inbound::new).map_err(BrokerError::from))
    }

    /// Stops the broker handing out new messages (`basic.cancel`); messages in hand can
    /// still be settled. Errors are ignored: the channel is being closed anyway.
    pub async fn cancel(&self) {
        let _ = self
            .channel
            .basic_cancel(self.tag.as_str().into(), BasicCancelOptions::default())
            .await;
    }

    /// Closes the channel: messages received but not settled go back to the queue.
    pub async fn close(&self, reason: &str) {
        let _ = self.channel.close(200, reason.into()).await;
    }
}

/// Opens a consuming channel with `prefetch` unacknowledged messages at most, so a worker
/// never holds more messages than it can work on at once.
pub async fn consumer_channel(
    conn: &Connection,
    prefetch: u16,
) -> Result<AmqpChannel, BrokerError> {
    let ch = conn.create_channel().await?;
    // `global: false`: the limit is per consumer (RabbitMQ's reading of basic.qos), and
    // each channel has one consumer.
    ch.basic_qos(prefetch, BasicQosOptions { global: false })
        .await?;
    Ok(ch)
}

/// One consumed message, to be settled once. A settle that fails (the channel is gone) is
/// logged: the broker redelivers the message, and the delivery's claim skips it.
pub struct Inbound {
    delivery: lapin::message::Delivery,
}

impl Inbound {
    fn new(delivery: lapin::message::Delivery) -> Self {
        Self { delivery }
    }

    /// The message body.
    pub fn body(&self) -> &[u8] {
        &self.delivery.data
    }

    /// The broker's delivery tag (unique on its channel).
    pub fn delivery_tag(&self) -> u64 {
        self.delivery.delivery_tag
    }

    /// The message's string-valued headers (see [`crate::string_headers`]).
    pub fn headers(&self) -> std::collections::HashMap<String, String> {
        crate::string_headers(&self.delivery.properties)
    }

    /// Done with: the broker forgets it.
    pub async fn ack(&self) {
        if let Err(e) = self.delivery.acker.ack(BasicAckOptions::default()).await {
            warn!(error = %e, "ack failed; the message will be redelivered and its claim will skip it");
        }
    }

    /// Never workable: to the dead-letter queue (`requeue = false`, so the queue's
    /// dead-letter exchange takes it).
    pub async fn reject(&self) {
        if let Err(e) = self
            .delivery
            .acker
            .reject(BasicRejectOptions { requeue: false })
            .await
        {
            warn!(error = %e, "reject failed");
        }
    }

    /// Not workable now: back to the queue (it counts towards the queue's
    /// `x-delivery-limit`).
    pub async fn nack_requeue(&self) {
        if let Err(e) = self
            .delivery
            .acker
            .nack(BasicNackOptions {
                requeue: true,
                multiple: false,
            })
            .await
        {
            warn!(error = %e, "nack failed");
        }
    }
}
