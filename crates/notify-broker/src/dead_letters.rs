//! The dead-letter queue: its depth, and moving its messages back to their channel's
//! queue.

use crate::{BrokerError, DeliveryBatch, DeliveryMessage, PublishOutcome, Publisher, Topology};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel as AmqpChannel, Connection};
use std::time::Duration;

/// Messages waiting in the dead-letter queue (a passive declare: nothing is created).
pub async fn dead_letter_depth(conn: &Connection, topology: &Topology) -> Result<u32, BrokerError> {
    let ch = conn.create_channel().await?;
    let q = ch
        .queue_declare(
            topology.dead_letter_queue().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    let _ = ch.close(200, "done".into()).await;
    Ok(q.message_count())
}

/// Moves up to `limit` dead-lettered messages back to their channel's queue: each valid
/// delivery pointer (a version-1 message, or a version-2 batch, republished as the same
/// batch) is republished (persistent, confirmed) and only then removed from the
/// dead-letter queue; a message that is not a pointer stays there. Workers then skip a
/// pointer whose delivery is already final. Returns (moved, left in place).
pub async fn requeue_dead_letters(
    conn: &Connection,
    topology: &Topology,
    limit: u32,
) -> Result<(u32, u32), BrokerError> {
    use lapin::options::{BasicAckOptions, BasicGetOptions};
    let ch = conn.create_channel().await?;
    let publisher = Publisher::new(conn, topology, Duration::from_secs(10)).await?;
    let (mut moved, mut left) = (0, 0);
    // Messages that are not pointers are held (unacked) until the end and only then put
    // back, so basic_get does not hand them out again and again.
    let mut held = Vec::new();
    for _ in 0..limit {
        let Some(msg) = ch
            .basic_get(
                topology.dead_letter_queue().into(),
                BasicGetOptions { no_ack: false },
            )
            .await?
        else {
            break;
        };
        let tag = msg.delivery.delivery_tag;
        let data = &msg.delivery.data;
        // Either version: a batch goes back as the same batch.
        let republished = if let Some(m) = DeliveryMessage::parse(data) {
            Some((
                m.delivery_id,
                publisher
                    .publish_batch(std::slice::from_ref(&m))
                    .await
                    .pop(),
            ))
        } else if let Some(b) = DeliveryBatch::parse(data) {
            Some((
                b.deliveries[0].id,
                publisher
                    .publish_delivery_batches(std::slice::from_ref(&b))
                    .await
                    .pop(),
            ))
        } else {
            None
        };
        match republished {
            Some((_, Some(PublishOutcome::Confirmed))) => {
                ch.basic_ack(tag, BasicAckOptions::default()).await?;
                moved += 1;
            }
            Some((first, other)) => {
                nack_requeue(&ch, tag).await?;
                return Err(BrokerError::Republish(format!(
                    "delivery {first}: {other:?}"
                )));
            }
            None => {
                held.push(tag);
                left += 1;
            }
        }
    }
    for tag in held {
        nack_requeue(&ch, tag).await?;
    }
    let _ = ch.close(200, "done".into()).await;
    Ok((moved, left))
}

/// Puts the message `tag` of `ch` back on its queue.
async fn nack_requeue(ch: &AmqpChannel, tag: u64) -> Result<(), lapin::Error> {
    let requeue = lapin::options::BasicNackOptions {
        requeue: true,
        multiple: false,
    };
    ch.basic_nack(tag, requeue).await
}
