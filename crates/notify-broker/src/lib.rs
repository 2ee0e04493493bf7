//! RabbitMQ for the platform (lapin): the topology every service declares at start, a
//! confirmed publisher, a consumer with typed settling ([`Consumer`], [`Inbound`]), and
//! the typed message that points at a delivery row.
//!
//! Topology (names get an optional prefix so that tests and tenants can share a broker):
//! - exchange `notify.deliveries` (direct, durable), routing key = channel name;
//! - one durable quorum queue per channel, `deliveries.<channel>`, with an explicit
//!   `x-delivery-limit` and `x-dead-letter-exchange = notify.dead`;
//! - exchange `notify.dead` (fanout, durable) bound to quorum queue `deliveries.dead`.

use lapin::Confirmation;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{
    BasicProperties, Channel as AmqpChannel, Connection, ConnectionProperties, ExchangeKind,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use uuid::Uuid;

pub use lapin;

mod consumer;
pub use consumer::{Consumer, Inbound, consumer_channel};

/// Errors talking to the broker.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A protocol or connection error from lapin.
    #[error("amqp error: {0}")]
    Amqp(#[from] lapin::Error),
    /// A publisher confirm did not arrive in time; the outcome is unknown.
    #[error("publisher confirm timed out after {0:?}")]
    ConfirmTimeout(Duration),
    /// A dead-lettered message could not be republished; it stays dead-lettered.
    #[error("republishing failed: {0}")]
    Republish(String),
}

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

/// The addresses of a broker setting: `urls` split at commas, trimmed, empty entries
/// dropped (`NOTIFY_AMQP_URL` may name every node of a cluster).
pub fn addresses(urls: &str) -> Vec<&str> {
    urls.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// Where the next [`connect`] of this process starts in its address list, so that
/// successive connects and reconnects spread over a cluster's nodes and one dead node is
/// not always tried first.
static NEXT_ADDRESS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The largest AMQP frame this client accepts, in bytes, when the URL names none
/// (`?frame_max=`): 16 KiB. The connection uses the smaller of this and the broker's
/// `frame_max` (AMQP 0-9-1, `connection.tune-ok`; RabbitMQ's default is 131,072). lapin
/// keeps a receive and a send buffer of 32 frames for each connection, written through
/// when they are made: at RabbitMQ's default that is 8 MiB of memory a connection, at
/// 16 KiB 1 MiB. A message names deliveries: at the relay's default of 50 a message
/// about 6 KB, at its maximum of 500 up to about 58 KB with trace headers, carried in
/// several body frames (its header frame stays small).
pub const FRAME_MAX: u32 = 16 * 1024;

/// The AMQP heartbeat this client asks for, in seconds, when the URL names none
/// (`?heartbeat=`): 10. The connection uses the smaller of this and the broker's
/// (`connection.tune-ok`; RabbitMQ's default is 60). RabbitMQ closes a connection whose
/// peer sent nothing for two heartbeat intervals and returns every message that
/// connection held unacknowledged, its prefetched ones included, to the queue for other
/// consumers. lapin sends the heartbeats from a task on the process's own Tokio runtime,
/// so a process that is stopped (SIGSTOP, a VM paused) sends none: within three intervals
/// (30 s, as measured on RabbitMQ 3.10) the broker takes back what it holds, instead of
/// the 60 s default's three minutes, and a
/// delivery the sweeper recovers from a frozen worker goes to a live one (issue 44,
/// item 9). Short enough for that, long enough that a busy but live process, whose
/// runtime is never blocked for seconds, keeps its connection.
pub const HEARTBEAT_S: u16 = 10;

/// `address` parsed, with [`FRAME_MAX`] and [`HEARTBEAT_S`] unless it names its own
/// `frame_max` or `heartbeat`.
fn tuned(address: &str) -> Result<lapin::uri::AMQPUri, BrokerError> {
    let mut uri: lapin::uri::AMQPUri = address
        .parse()
        .map_err(|e: String| lapin::Error::from(std::io::Error::other(e)))?;
    uri.query.frame_max.get_or_insert(FRAME_MAX);
    uri.query.heartbeat.get_or_insert(HEARTBEAT_S);
    Ok(uri)
}

/// Connects to the first reachable of `urls`: one `amqp://user:pass@host:port/vhost` or
/// several separated by commas (the nodes of a cluster). Each call starts at the next
/// address of the list (round robin) and goes on through the others; every reconnect
/// loop calls it again, so a process reaches any live node. Frames are at most
/// [`FRAME_MAX`] bytes, and the heartbeat [`HEARTBEAT_S`], unless the URL says otherwise.
///
/// # Errors
/// The last address's error when none of them accepts the connection (a malformed
/// address is such an error).
pub async fn connect(urls: &str, name: &str) -> Result<Connection, BrokerError> {
    let mut list = addresses(urls);
    if list.is_empty() {
        list.push(urls);
    }
    let n = list.len();
    let start = NEXT_ADDRESS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n;
    let mut tried = 0;
    loop {
        let at = (start + tried) % n;
        let props = ConnectionProperties::default().with_connection_name(name.into());
        let connected: Result<Connection, BrokerError> = match tuned(list[at]) {
            Ok(uri) => Connection::connect_uri(uri, props)
                .await
                .map_err(Into::into),
            Err(e) => Err(e),
        };
        match connected {
            Ok(conn) => return Ok(conn),
            Err(e) if tried + 1 >= n => return Err(e),
            Err(e) => {
                tracing::warn!(address = at + 1, of = n, error = %e, "broker address refused the connection; trying the next");
                tried += 1;
            }
        }
    }
}

/// The message body on a channel queue: a pointer to a delivery row. Workers read the row;
/// the message carries no content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryMessage {
    /// Format version, 1.
    pub v: u8,
    /// The delivery to send.
    pub delivery_id: Uuid,
    /// Its channel (must match the queue).
    pub channel: String,
}

/// String-valued headers of a consumed message (e.g. `traceparent`); others are skipped.
pub fn string_headers(props: &BasicProperties) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    if let Some(table) = props.headers() {
        for (k, v) in table.inner() {
            let text = match v {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.as_str().to_string(),
                _ => continue,
            };
            out.insert(k.as_str().to_string(), text);
        }
    }
    out
}

impl DeliveryMessage {
    /// Parses a message body; `None` for anything that is not a version-1 message.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice::<Self>(body)
            .ok()
            .filter(|m| m.v == 1)
    }
}

/// Most deliveries one [`DeliveryBatch`] may name; a message naming more is refused by
/// [`Pointers::parse`] (dead-lettered), so a worker's memory per message stays bounded.
pub const MAX_DELIVERIES_PER_MESSAGE: usize = 500;

/// The version-2 message body: pointers to several delivery rows of one channel, so the
/// broker's work (publish, confirm, store, deliver, ack: its cost is per message) is
/// shared by them. Each pointer carries its own W3C trace context, since the deliveries
/// of one message may belong to different events (one trace each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryBatch {
    /// Format version, 2.
    pub v: u8,
    /// The channel of every delivery named (must match the queue).
    pub channel: String,
    /// The deliveries to send, 1 to [`MAX_DELIVERIES_PER_MESSAGE`].
    pub deliveries: Vec<Pointer>,
}

/// One delivery named by a message, with the trace context its consumer span continues
/// (W3C Trace Context `traceparent` / `tracestate`, <https://www.w3.org/TR/trace-context/>).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pointer {
    /// The delivery row's id.
    pub id: Uuid,
    /// The producer span's `traceparent`, when tracing is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The producer span's `tracestate`, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// What a channel-queue message points at, whichever version it is: a version-1
/// [`DeliveryMessage`] (one delivery, its trace context in the message headers) or a
/// version-2 [`DeliveryBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointers {
    /// The channel the message names.
    pub channel: String,
    /// The deliveries, in message order.
    pub deliveries: Vec<Pointer>,
}

impl Pointers {
    /// Parses a message body with its string `headers` ([`string_headers`]); `None` for
    /// an unknown version, a malformed body, or a batch naming no delivery or more than
    /// [`MAX_DELIVERIES_PER_MESSAGE`].
    pub fn parse(body: &[u8], headers: &std::collections::HashMap<String, String>) -> Option<Self> {
        if let Some(one) = DeliveryMessage::parse(body) {
            return Some(Self {
                channel: one.channel,
                deliveries: vec![Pointer {
                    id: one.delivery_id,
                    traceparent: headers.get("traceparent").cloned(),
                    tracestate: headers.get("tracestate").cloned(),
                }],
            });
        }
        let batch = DeliveryBatch::parse(body)?;
        Some(Self {
            channel: batch.channel,
            deliveries: batch.deliveries,
        })
    }
}

impl DeliveryBatch {
    /// Parses a message body; `None` for anything that is not a version-2 message naming
    /// 1 to [`MAX_DELIVERIES_PER_MESSAGE`] deliveries.
    pub fn parse(body: &[u8]) -> Option<Self> {
        serde_json::from_slice::<Self>(body)
            .ok()
            .filter(|b| b.v == 2 && (1..=MAX_DELIVERIES_PER_MESSAGE).contains(&b.deliveries.len()))
    }
}

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

    #[test]
    fn only_version_1_pointers_parse() {
        let m = DeliveryMessage {
            v: 1,
            delivery_id: Uuid::nil(),
            channel: "email".into(),
        };
        let body = serde_json::to_vec(&m).unwrap();
        assert_eq!(DeliveryMessage::parse(&body), Some(m));
        assert_eq!(DeliveryMessage::parse(&[0xFF, 0xFE, 0x00]), None);
        assert_eq!(
            DeliveryMessage::parse(
                br#"{"v":2,"delivery_id":"00000000-0000-0000-0000-000000000000","channel":"x"}"#
            ),
            None
        );
    }

    #[test]
    fn both_versions_parse_to_pointers_and_bad_batches_do_not() {
        let mut headers = std::collections::HashMap::new();
        headers.insert("traceparent".to_string(), "00-aa-bb-01".to_string());
        let one = serde_json::to_vec(&DeliveryMessage {
            v: 1,
            delivery_id: Uuid::nil(),
            channel: "line".into(),
        })
        .unwrap();
        let p = Pointers::parse(&one, &headers).unwrap();
        assert_eq!(p.channel, "line");
        assert_eq!(p.deliveries.len(), 1);
        assert_eq!(p.deliveries[0].traceparent.as_deref(), Some("00-aa-bb-01"));

        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
        let batch = DeliveryBatch {
            v: 2,
            channel: "inapp".into(),
            deliveries: ids
                .iter()
                .map(|id| Pointer {
                    id: *id,
                    traceparent: Some(format!("00-{}-01", id.simple())),
                    tracestate: None,
                })
                .collect(),
        };
        let body = serde_json::to_vec(&batch).unwrap();
        // The message headers do not apply to a batch: each pointer has its own context.
        let p = Pointers::parse(&body, &headers).unwrap();
        assert_eq!(p.channel, "inapp");
        assert_eq!(p.deliveries.iter().map(|d| d.id).collect::<Vec<_>>(), ids);
        assert_eq!(
            p.deliveries[2].traceparent,
            Some(format!("00-{}-01", ids[2].simple()))
        );
        // A version-1 reader (an older worker) does not take a batch for one delivery.
        assert_eq!(DeliveryMessage::parse(&body), None);

        let empty = br#"{"v":2,"channel":"inapp","deliveries":[]}"#;
        assert_eq!(Pointers::parse(empty, &headers), None);
        let too_many = DeliveryBatch {
            deliveries: vec![batch.deliveries[0].clone(); MAX_DELIVERIES_PER_MESSAGE + 1],
            ..batch.clone()
        };
        let body = serde_json::to_vec(&too_many).unwrap();
        assert_eq!(Pointers::parse(&body, &headers), None);
        let v3 = br#"{"v":3,"channel":"inapp","deliveries":[{"id":"00000000-0000-0000-0000-000000000000"}]}"#;
        assert_eq!(Pointers::parse(v3, &headers), None);
    }
}

#[cfg(test)]
mod address_tests {
    use super::*;

    #[test]
    fn a_list_of_addresses_is_split_at_commas_and_trimmed() {
        assert_eq!(
            addresses(" amqp://a:5672/%2f ,amqp://b:5673/%2f,"),
            vec!["amqp://a:5672/%2f", "amqp://b:5673/%2f"]
        );
        assert_eq!(addresses("amqp://a"), vec!["amqp://a"]);
    }

    /// Against the local stack's broker (`NOTIFY_AMQP_URL`, as `make test` sets it): a
    /// list whose other address is a closed port still connects, whichever address the
    /// round robin starts at; a list of closed ports fails.
    #[tokio::test]
    async fn connect_goes_on_to_the_next_address_when_one_node_is_down() {
        let live = std::env::var("NOTIFY_AMQP_URL").expect("NOTIFY_AMQP_URL (source .stack/env)");
        let live = addresses(&live)[0].to_string();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            drop(l);
            format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
        };
        let both = format!("{closed},{live}");
        for _ in 0..3 {
            let conn = connect(&both, "test-addresses")
                .await
                .expect("the live node");
            assert!(conn.status().connected());
            conn.close(200, "done".into()).await.unwrap();
        }
        let none = format!("{closed}, {closed}");
        assert!(connect(&none, "test-addresses").await.is_err());
        assert!(connect("not a url", "test-addresses").await.is_err());
    }

    /// Frames of at most [`FRAME_MAX`] bytes are agreed with the broker unless the URL asks
    /// for its own size; a message larger than a frame still arrives whole.
    #[tokio::test]
    async fn the_connection_agrees_on_small_frames_unless_the_url_names_its_own() {
        let live = std::env::var("NOTIFY_AMQP_URL").expect("NOTIFY_AMQP_URL (source .stack/env)");
        let live = addresses(&live)[0].to_string();
        let conn = connect(&live, "test-frames").await.expect("broker");
        assert_eq!(conn.configuration().frame_max(), FRAME_MAX);
        let ch = conn.create_channel().await.unwrap();
        let q = ch
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let body: Vec<u8> = (0..3 * FRAME_MAX).map(|i| (i % 251) as u8).collect();
        ch.basic_publish(
            "".into(),
            q.name().as_str().into(),
            BasicPublishOptions::default(),
            &body,
            BasicProperties::default(),
        )
        .await
        .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(m) = ch
                    .basic_get(
                        q.name().as_str().into(),
                        lapin::options::BasicGetOptions { no_ack: true },
                    )
                    .await
                    .unwrap()
                {
                    break m;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the message back within 10 s");
        assert_eq!(got.delivery.data, body);
        conn.close(200, "done".into()).await.unwrap();

        let sep = if live.contains('?') { '&' } else { '?' };
        let own = connect(&format!("{live}{sep}frame_max=65536"), "test-frames")
            .await
            .expect("broker");
        assert_eq!(own.configuration().frame_max(), 65536);
        own.close(200, "done".into()).await.unwrap();
    }

    /// The connection agrees on a [`HEARTBEAT_S`] heartbeat (the broker's 60 s default
    /// would let a stopped process hold its unacknowledged messages for two minutes),
    /// unless the URL names its own.
    #[tokio::test]
    async fn the_connection_agrees_on_a_short_heartbeat_unless_the_url_names_its_own() {
        let live = std::env::var("NOTIFY_AMQP_URL").expect("NOTIFY_AMQP_URL (source .stack/env)");
        let live = addresses(&live)[0].to_string();
        let conn = connect(&live, "test-heartbeat").await.expect("broker");
        assert_eq!(conn.configuration().heartbeat(), HEARTBEAT_S);
        conn.close(200, "done".into()).await.unwrap();
        let sep = if live.contains('?') { '&' } else { '?' };
        let own = connect(&format!("{live}{sep}heartbeat=5"), "test-heartbeat")
            .await
            .expect("broker");
        assert_eq!(own.configuration().heartbeat(), 5);
        own.close(200, "done".into()).await.unwrap();
    }
}
