//! The names of every exchange and queue (with an optional prefix) and their idempotent
//! declaration and deletion.

use crate::BrokerError;
use lapin::Channel as AmqpChannel;
use lapin::ExchangeKind;
use lapin::options::{
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};

/// Names of every exchange and queue, derived from an optional prefix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// Prepended to every name (e.g. `test-1a2b.`); empty in production.
    pub prefix: String,
    /// `x-delivery-limit` of the channel queues: deliveries of one message before it is
    /// dead-lettered. Set explicitly because RabbitMQ 3.x and 4.x default differently.
    pub delivery_limit: i32,
}

impl Topology {
    /// Topology with `prefix` and the default delivery limit of 5.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            delivery_limit: 5,
        }
    }

    /// The direct exchange deliveries are published to.
    pub fn exchange(&self) -> String {
        format!("{}notify.deliveries", self.prefix)
    }

    /// The dead-letter exchange.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}notify.dead", self.prefix)
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}deliveries.dead", self.prefix)
    }

    /// The queue of one channel (`inapp`, `email`, `push`, `line`).
    pub fn queue(&self, channel: &str) -> String {
        format!("{}deliveries.{channel}", self.prefix)
    }

    /// Declares everything; idempotent (same arguments every time), so every service
    /// calls it at start.
    pub async fn declare(&self, ch: &AmqpChannel, channels: &[&str]) -> Result<(), BrokerError> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let exchanges = [
            (self.exchange(), ExchangeKind::Direct),
            (self.dead_letter_exchange(), ExchangeKind::Fanout),
        ];
        for (name, kind) in exchanges {
            ch.exchange_declare(name.into(), kind, durable, FieldTable::default())
                .await?;
        }
        let queue_opts = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let mut dead_args = FieldTable::default();
        dead_args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        ch.queue_declare(self.dead_letter_queue().into(), queue_opts, dead_args)
            .await?;
        ch.queue_bind(
            self.dead_letter_queue().into(),
            self.dead_letter_exchange().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        for channel in channels {
            let mut args = FieldTable::default();
            // Quorum queues are replicated and count redeliveries per message.
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
            // A message redelivered this many times (crash loops) is dead-lettered instead of
            // looping forever.
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongInt(self.delivery_limit),
            );
            // Rejected and over-limit messages go to the dead-letter queue for operators.
            args.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString(self.dead_letter_exchange().into()),
            );
            ch.queue_declare(self.queue(channel).into(), queue_opts, args)
                .await?;
            ch.queue_bind(
                self.queue(channel).into(),
                self.exchange().into(),
                (*channel).into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        }
        Ok(())
    }

    /// Deletes every queue and exchange of this topology (tests clean up with it).
    pub async fn delete(&self, ch: &AmqpChannel, channels: &[&str]) -> Result<(), BrokerError> {
        for channel in channels {
            ch.queue_delete(self.queue(channel).into(), QueueDeleteOptions::default())
                .await?;
        }
        ch.queue_delete(
            self.dead_letter_queue().into(),
            QueueDeleteOptions::default(),
        )
        .await?;
        ch.exchange_delete(self.exchange().into(), Default::default())
            .await?;
        ch.exchange_delete(self.dead_letter_exchange().into(), Default::default())
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix() {
        let t = Topology::new("t1.");
        assert_eq!(t.exchange(), "t1.notify.deliveries");
        assert_eq!(t.queue("email"), "t1.deliveries.email");
        assert_eq!(t.dead_letter_queue(), "t1.deliveries.dead");
        assert_eq!(Topology::new("").queue("line"), "deliveries.line");
    }
}
