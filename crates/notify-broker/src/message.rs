//! The message bodies on a channel queue: the version-1 [`DeliveryMessage`] (one
//! delivery), the version-2 [`DeliveryBatch`] (several of one channel) and [`Pointers`],
//! what either points at.

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

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

#[cfg(test)]
mod tests {
    use super::*;

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
