//! A validated `CreateEvent` request and its fingerprint.

use crate::channel::Channel;
use crate::content::Content;
pub use crate::schedule::Schedule;
use crate::schedule::parse_schedule;
use crate::validate::{FieldViolation, Violations};
use sha2::{Digest, Sha256};
use unicode_normalization::UnicodeNormalization;

/// Most bytes an event key may have after NFC normalisation.
pub const MAX_EVENT_KEY_BYTES: usize = 255;
/// Most recipients one event may name.
pub const MAX_RECIPIENTS: usize = 1_000;
/// Most bytes a user id may have.
pub const MAX_USER_ID_BYTES: usize = 255;
/// Most bytes of payload JSON text.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// Deepest nesting of objects and arrays in a payload (the top object is level 1).
/// serde_json itself stops at 128 levels, before any stack trouble.
pub const MAX_PAYLOAD_DEPTH: usize = 16;

/// Nesting depth of a JSON value: 0 for a scalar, 1 for a flat object or array.
pub fn json_depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Object(m) => 1 + m.values().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Array(a) => 1 + a.iter().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}
/// A `CreateEvent` request exactly as received (before validation).
#[derive(Debug, Clone, Default)]
pub struct CreateEventInput {
    /// Caller's idempotency key.
    pub event_key: String,
    /// Notification type key.
    pub type_key: String,
    /// Who caused the event.
    pub actor_id: String,
    /// Recipient user ids.
    pub recipients: Vec<String>,
    /// JSON object text; empty = `{}`.
    pub payload: String,
    /// What the notification says.
    pub content: Content,
    /// Channel names narrowing the type's defaults; empty = all defaults.
    pub channels: Vec<String>,
    /// Topic whose subscribers receive the event, instead of `recipients`; empty = none.
    pub topic: String,
    /// Topic events only: send LINE by multicast batches.
    pub line_multicast: bool,
    /// Groups events of a digest type (e.g. `thread:55`); empty = none.
    pub aggregate_key: String,
    /// Due instant, RFC 3339 with an offset; empty = now.
    pub send_at: String,
    /// Due after this duration ([`crate::retry::parse_duration`]); empty = now.
    pub delay: String,
}

/// A validated event request.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// NFC-normalised event key, 1 to 255 bytes.
    pub event_key: String,
    /// Notification type key (existence is checked by the store).
    pub type_key: String,
    /// Who caused the event, possibly empty.
    pub actor_id: String,
    /// Distinct recipient ids in request order, 1 to 1,000.
    pub recipients: Vec<String>,
    /// The payload, always a JSON object.
    pub payload: serde_json::Value,
    /// What the notification says.
    pub content: Content,
    /// Requested channels, sorted and distinct; empty = the type's defaults.
    pub channels: Vec<Channel>,
    /// Topic to broadcast to (then `recipients` is empty).
    pub topic: Option<String>,
    /// LINE by multicast batches of up to 500 users (topic events only).
    pub line_multicast: bool,
    /// The caller's key when `event_key` was bucketed by the type's dedup window.
    pub caller_key: Option<String>,
    /// Digest group within the type (listed recipients only).
    pub aggregate_key: Option<String>,
    /// W3C `traceparent` of the request that created the event, kept with it so that
    /// every publish of its deliveries (retries and recoveries too) continues that trace.
    /// Not part of the fingerprint.
    pub trace_context: Option<String>,
    /// The authenticated caller (API key or client certificate name) that sent it.
    pub caller: Option<String>,
    /// When it is due, as asked (`send_at` or `delay`); `None` = now. The writer turns it
    /// into a due time at its planning instant ([`Schedule::due`]).
    pub schedule: Option<Schedule>,
    /// The caller's grouping key for `CancelEvent` (1 to 255 bytes), if any. Set by the
    /// API layer after [`NewEvent::parse`], checked like an id (`Violations::check_id`).
    pub cancellation_key: Option<String>,
}

/// Most bytes of a cancellation key.
pub const MAX_CANCELLATION_KEY_BYTES: usize = 255;

/// Start of the dedup bucket holding `now` for a window of `window_s` seconds: buckets
/// are `[k*W, (k+1)*W)` seconds since the Unix epoch, in UTC.
pub fn dedup_bucket(
    now: chrono::DateTime<chrono::Utc>,
    window_s: i64,
) -> chrono::DateTime<chrono::Utc> {
    let w = window_s.max(1);
    let start = now.timestamp().div_euclid(w) * w;
    chrono::DateTime::from_timestamp(start, 0).unwrap_or(now)
}

impl NewEvent {
    /// Scopes the event key to the dedup bucket holding `now`: the stored key becomes
    /// `<key>|dedup@<bucket start, RFC 3339>` and the caller's key is kept. A repeat in the
    /// same bucket is then a duplicate; in the next bucket it is a new event.
    pub fn bucket_key(&mut self, now: chrono::DateTime<chrono::Utc>, window_s: i64) {
        if window_s <= 0 || self.caller_key.is_some() {
            return;
        }
        let bucket = dedup_bucket(now, window_s);
        let caller = std::mem::take(&mut self.event_key);
        self.event_key = format!(
            "{caller}|dedup@{}",
            bucket.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        self.caller_key = Some(caller);
    }
}

/// NFC-normalises an event key so that visually identical keys compare equal.
pub fn normalize_event_key(key: &str) -> String {
    key.nfc().collect()
}

impl NewEvent {
    /// Validates every field and reports every violation at once.
    ///
    /// Rules: `event_key` required, at most 255 bytes after NFC; `type` required;
    /// `actor_id` empty or, like each of the 1 to 1,000 `recipients`, a user id by the one
    /// id rule ([`Violations::id`]: NFC, at most 255 bytes, no control, invisible or
    /// bidirectional control characters; repeated recipients are merged); `payload` empty or a JSON object
    /// of at most 64 KiB; `content.title` required; lengths capped; `content.url` an absolute
    /// http(s) URL; `channels` known names; `send_at` RFC 3339 with an offset, `delay` a
    /// duration ([`crate::retry::parse_duration`]), not both (a violation of `delay`). The
    /// horizon is checked by the writer, against its planning instant.
    pub fn parse(input: CreateEventInput) -> Result<NewEvent, Vec<FieldViolation>> {
        let mut v = Violations::default();

        let event_key = normalize_event_key(&input.event_key);
        v.check_id("event_key", &event_key, MAX_EVENT_KEY_BYTES);
        if input.type_key.trim().is_empty() {
            v.add("type", "is required");
        } else if !crate::validate::is_type_key(input.type_key.trim()) {
            v.add("type", "must be a notification type key: 1 to 64 characters of [a-z0-9_.-] starting with a letter");
        }
        // Optional; when set, a user id like any other (the one id rule, NFC).
        let actor_id = if input.actor_id.is_empty() {
            String::new()
        } else {
            v.id("actor_id", &input.actor_id, MAX_USER_ID_BYTES)
                .unwrap_or_default()
        };

        let topic = Some(input.topic.trim().to_string()).filter(|t| !t.is_empty());
        if let Some(t) = &topic
            && !crate::validate::is_type_key(t)
        {
            v.add(
                "topic",
                "must be 1 to 64 characters of [a-z0-9_.-] starting with a letter",
            );
        }
        let aggregate_key = Some(input.aggregate_key.trim().to_string()).filter(|k| !k.is_empty());
        if let Some(k) = &aggregate_key {
            if k.len() > 255 || k.chars().any(char::is_control) {
                v.add(
                    "aggregate_key",
                    "must be at most 255 bytes without control characters",
                );
            }
            if topic.is_some() {
                v.add("aggregate_key", "must be empty when topic is set");
            }
        }
        if input.line_multicast && topic.is_none() {
            v.add(
                "line_multicast",
                "needs a topic (multicast is for topic broadcasts)",
            );
        }
        let mut recipients: Vec<String> = Vec::with_capacity(input.recipients.len());
        if topic.is_some() {
            if !input.recipients.is_empty() {
                v.add("recipients", "must be empty when topic is set");
            }
        } else if input.recipients.is_empty() {
            v.add(
                "recipients",
                "must name at least 1 recipient (or set topic)",
            );
        } else if input.recipients.len() > MAX_RECIPIENTS {
            v.add(
                "recipients",
                format!(
                    "must name at most {MAX_RECIPIENTS} recipients, got {}",
                    input.recipients.len()
                ),
            );
        } else {
            let mut seen = std::collections::HashSet::new();
            for (i, r) in input.recipients.iter().enumerate() {
                if let Some(r) = v.id(&format!("recipients[{i}]"), r, MAX_USER_ID_BYTES)
                    && seen.insert(r.clone())
                {
                    recipients.push(r);
                }
            }
        }

        let payload = if input.payload.trim().is_empty() {
            serde_json::Value::Object(Default::default())
        } else if input.payload.len() > MAX_PAYLOAD_BYTES {
            v.add(
                "payload",
                format!("must be at most {MAX_PAYLOAD_BYTES} bytes of JSON"),
            );
            serde_json::Value::Null
        } else {
            match serde_json::from_str::<serde_json::Value>(&input.payload) {
                Ok(val @ serde_json::Value::Object(_)) if json_depth(&val) > MAX_PAYLOAD_DEPTH => {
                    v.add(
                        "payload",
                        format!("must not nest objects and arrays deeper than {MAX_PAYLOAD_DEPTH} levels"),
                    );
                    serde_json::Value::Null
                }
                Ok(val @ serde_json::Value::Object(_)) => {
                    v.check_json_text("payload", &val);
                    val
                }
                Ok(_) => {
                    v.add("payload", "must be a JSON object ({...})");
                    serde_json::Value::Null
                }
                Err(e) => {
                    v.add("payload", format!("must be a JSON object: {e}"));
                    serde_json::Value::Null
                }
            }
        };

        input.content.check(&mut v);

        let mut channels = Vec::new();
        for (i, name) in input.channels.iter().enumerate() {
            match name.parse::<Channel>() {
                Ok(ch) => channels.push(ch),
                Err(e) => v.add(format!("channels[{i}]"), e.to_string()),
            }
        }
        channels.sort();
        channels.dedup();

        let schedule = parse_schedule(&input.send_at, &input.delay, &mut v);

        v.into_result(NewEvent {
            event_key,
            type_key: input.type_key.trim().to_string(),
            actor_id,
            recipients,
            payload,
            content: input.content.normalized(),
            channels,
            topic,
            line_multicast: input.line_multicast,
            caller_key: None,
            aggregate_key,
            trace_context: None,
            caller: None,
            schedule,
            cancellation_key: None,
        })
    }

    /// SHA-256 over a canonical form of everything the caller sent, so that a replay of the
    /// same `event_key` with other content can be told from an honest retry. Object keys
    /// are sorted (serde_json's map is ordered), channels and recipients sorted, so the
    /// order in which a caller lists them does not matter.
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut recipients = self.recipients.clone();
        recipients.sort();
        let canonical = serde_json::json!({
            "event_key": self.caller_key.as_ref().unwrap_or(&self.event_key),
            "type": self.type_key,
            "actor_id": self.actor_id,
            "recipients": recipients,
            "payload": self.payload,
            "content": self.content,
            "channels": self.channels.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
            "topic": self.topic,
        });
        let mut canonical = canonical;
        // Only when set, so fingerprints of events without it stay as they were.
        if self.line_multicast {
            canonical["line_multicast"] = serde_json::json!(true);
        }
        if let Some(k) = &self.aggregate_key {
            canonical["aggregate_key"] = serde_json::json!(k);
        }
        // The instant asked for (not its spelling: +07:00 and Z of one instant match), or
        // the delay in milliseconds.
        match self.schedule {
            Some(Schedule::At(t)) => {
                canonical["send_at"] =
                    serde_json::json!(t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
            }
            Some(Schedule::After(d)) => {
                canonical["delay_ms"] = serde_json::json!(d.as_millis() as u64)
            }
            None => {}
        }
        if let Some(k) = &self.cancellation_key {
            canonical["cancellation_key"] = serde_json::json!(k);
        }
        Sha256::digest(canonical.to_string().as_bytes()).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> CreateEventInput {
        CreateEventInput {
            event_key: "order:123:paid".into(),
            type_key: "order_paid".into(),
            actor_id: "shop".into(),
            recipients: vec!["u1".into(), "u2".into(), "u1".into()],
            payload: r#"{"order_id":123,"total":"450.00"}"#.into(),
            content: Content {
                title: "ชำระเงินแล้ว".into(),
                body: "คำสั่งซื้อ #123".into(),
                ..Default::default()
            },
            channels: vec![],
            topic: String::new(),
            line_multicast: false,
            aggregate_key: String::new(),
            send_at: String::new(),
            delay: String::new(),
        }
    }

    fn fields(errs: &[FieldViolation]) -> Vec<&str> {
        errs.iter().map(|f| f.field.as_str()).collect()
    }

    #[test]
    fn valid_request_merges_repeated_recipients() {
        let e = NewEvent::parse(input()).unwrap();
        assert_eq!(e.recipients, ["u1", "u2"]);
        assert!(e.payload.is_object());
    }

    #[test]
    fn event_key_is_nfc_normalised_before_the_length_check() {
        // "é" as e + combining acute (3 bytes) becomes U+00E9 (2 bytes).
        let mut i = input();
        i.event_key = "e\u{301}".repeat(127) + "x"; // 382 bytes decomposed, 255 composed
        let e = NewEvent::parse(i).unwrap();
        assert_eq!(e.event_key.len(), 255);
        assert_eq!(
            e.event_key,
            normalize_event_key(&("\u{e9}".repeat(127) + "x"))
        );

        let mut i = input();
        i.event_key = "k".repeat(256);
        assert_eq!(fields(&NewEvent::parse(i).unwrap_err()), ["event_key"]);
    }

    #[test]
    fn dedup_buckets_are_aligned_to_the_epoch() {
        let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
        // A 10-minute window: [17:00, 17:10) and [17:10, 17:20).
        assert_eq!(
            dedup_bucket(at("2026-11-30T17:09:59Z"), 600),
            at("2026-11-30T17:00:00Z")
        );
        assert_eq!(
            dedup_bucket(at("2026-11-30T17:10:00Z"), 600),
            at("2026-11-30T17:10:00Z")
        );
        // A day: UTC midnight, which is 07:00 in Bangkok.
        assert_eq!(
            dedup_bucket(at("2026-11-30T23:59:59Z"), 86_400),
            at("2026-11-30T00:00:00Z")
        );
        let mut e = NewEvent::parse(input()).unwrap();
        let fingerprint = e.fingerprint();
        e.bucket_key(at("2026-11-30T17:09:59Z"), 600);
        assert_eq!(e.event_key, "order:123:paid|dedup@2026-11-30T17:00:00Z");
        assert_eq!(e.caller_key.as_deref(), Some("order:123:paid"));
        assert_eq!(
            e.fingerprint(),
            fingerprint,
            "the caller's key is fingerprinted"
        );
    }

    #[test]
    fn every_bad_field_is_reported_at_once() {
        let i = CreateEventInput {
            event_key: "".into(),
            type_key: "".into(),
            recipients: vec!["ok".into(), "".into()],
            payload: "[1,2]".into(),
            channels: vec!["line".into(), "fax".into()],
            content: Content {
                url: "javascript:alert(1)".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let errs = NewEvent::parse(i).unwrap_err();
        assert_eq!(
            fields(&errs),
            [
                "event_key",
                "type",
                "recipients[1]",
                "payload",
                "content.title",
                "content.url",
                "channels[1]"
            ]
        );
    }

    #[test]
    fn a_topic_replaces_the_recipient_list() {
        let mut i = input();
        i.recipients.clear();
        i.topic = "shop.th.promotions".into();
        let e = NewEvent::parse(i).unwrap();
        assert_eq!(e.topic.as_deref(), Some("shop.th.promotions"));
        assert!(e.recipients.is_empty());
        let mut i = input();
        i.topic = "shop".into();
        assert_eq!(fields(&NewEvent::parse(i).unwrap_err()), ["recipients"]);
        let mut i = input();
        i.recipients.clear();
        i.topic = "Bad Topic".into();
        assert_eq!(fields(&NewEvent::parse(i).unwrap_err()), ["topic"]);
        let mut i = input();
        i.line_multicast = true;
        assert_eq!(
            fields(&NewEvent::parse(i).unwrap_err()),
            ["line_multicast"],
            "multicast needs a topic"
        );
    }

    #[test]
    fn recipient_count_bounds() {
        let mut i = input();
        i.recipients = vec![];
        assert_eq!(fields(&NewEvent::parse(i).unwrap_err()), ["recipients"]);
        let mut i = input();
        i.recipients = (0..1001).map(|n| format!("u{n}")).collect();
        let errs = NewEvent::parse(i).unwrap_err();
        assert!(errs[0].description.contains("1001"));
        let mut i = input();
        i.recipients = (0..1000).map(|n| format!("u{n}")).collect();
        assert_eq!(NewEvent::parse(i).unwrap().recipients.len(), 1000);
    }

    #[test]
    fn nul_characters_and_hidden_line_breaks_are_rejected() {
        let mut i = input();
        i.payload = r#"{"a":"x\u0000y"}"#.into();
        i.content.body = "a\0b".into();
        i.content.title = "a\u{2028}b".into();
        i.recipients = vec!["e\u{301}".into(), "\u{e9}".into()];
        let errs = NewEvent::parse(i).unwrap_err();
        assert_eq!(fields(&errs), ["payload", "content.body", "content.title"]);
        let mut i = input();
        i.recipients = vec!["e\u{301}".into(), "\u{e9}".into()];
        assert_eq!(
            NewEvent::parse(i).unwrap().recipients,
            ["\u{e9}"],
            "recipient ids are NFC-normalised"
        );
    }

    #[test]
    fn fingerprint_ignores_key_and_recipient_order_but_not_content() {
        let a = NewEvent::parse(input()).unwrap();
        let mut i = input();
        i.recipients.reverse();
        assert_eq!(a.fingerprint(), NewEvent::parse(i).unwrap().fingerprint());
        let mut i = input();
        i.payload = r#"{ "total":"450.00", "order_id":123 }"#.into();
        let b = NewEvent::parse(i).unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        let mut i = input();
        i.content.body = "คำสั่งซื้อ #124".into();
        assert_ne!(a.fingerprint(), NewEvent::parse(i).unwrap().fingerprint());
    }

    #[test]
    fn the_due_time_asked_for_is_part_of_the_fingerprint() {
        let base = NewEvent::parse(input()).unwrap().fingerprint();
        let with = |send_at: &str, delay: &str| {
            let mut i = input();
            i.send_at = send_at.into();
            i.delay = delay.into();
            NewEvent::parse(i).unwrap().fingerprint()
        };
        let a = with("2026-12-02T09:00:00+07:00", "");
        assert_ne!(a, base);
        assert_eq!(
            a,
            with("2026-12-02T02:00:00Z", ""),
            "one instant, two spellings"
        );
        assert_ne!(a, with("2026-12-02T09:00:01+07:00", ""));
        assert_eq!(with("", "90s"), with("", "90s"));
        assert_ne!(with("", "90s"), with("", "91s"));
        assert_eq!(with("", ""), base, "unscheduled fingerprints are unchanged");
    }
}
