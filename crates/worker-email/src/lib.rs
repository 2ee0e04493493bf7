//! The email channel: SMTP through lettre, multipart/alternative (text + HTML), a stable
//! `Message-ID` per delivery (`<delivery id@domain>`, so a resend after a crash is
//! recognisable as the same message), and UTF-8 headers encoded as RFC 2047 words.
//!
//! Mailbox headers (From, To) with a non-ASCII display name are encoded here rather than
//! by lettre, which puts the address on the line of the last encoded-word and can pass
//! RFC 5322's 78-octet line length: each encoded-word carries whole grapheme clusters (at
//! most 45 bytes, so a word is at most 72 characters, under RFC 2047's 75) on its own
//! folded line, and the address follows as plain ASCII on the last line.
//!
//! Email of a `marketing` type carries `List-Unsubscribe: <url>` (RFC 2369) and
//! `List-Unsubscribe-Post: List-Unsubscribe=One-Click` (RFC 8058); the URL holds a signed
//! token ([`notify_core::signed::UnsubscribeToken`]) that the HTTP service honours with a
//! POST. Transactional email (receipts, security alerts) has neither.
//!
//! The exchange runs step by step ([`smtp`]): `MAIL FROM`, `RCPT TO`, then the lease is
//! confirmed, and only then `DATA` (the point of no return), all within one deadline
//! (`NOTIFY_SMTP_TIMEOUT`, connect to the answer after the data); a server that stops
//! answering ends the attempt as an ambiguous `smtp_timeout`, retried per policy.
//!
//! Classification (RFC 5321 §4.2.1): 4xx replies and connection errors before the end of
//! DATA are transient; 5xx replies are permanent, and a 5xx whose enhanced status (RFC
//! 3463) says the mailbox does not exist (5.1.1, 5.1.6, 5.1.10) is `address_undeliverable`:
//! the recipient's address is marked and later email to it is skipped until it changes.

use base64::Engine;
use lettre::Message;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};
use notify_core::text::words;
use notify_core::{AttemptOutcome, Channel, ErrorClass};
use notify_worker::{ChannelSender, Job, Lease};
use serde_json::json;
use std::time::Duration;
use unicode_segmentation::UnicodeSegmentation;

pub mod attempt;
pub mod breaker;
pub mod layout;
pub mod providers;
pub mod ses;
pub mod smtp;

/// Settings of the email channel.
#[derive(Debug, Clone)]
pub struct EmailConfig {
    /// The providers in order, comma-separated ([`providers::Providers::parse`]):
    /// `smtp://host:port` (plain), `smtp://host:port?tls=required` (STARTTLS) or
    /// `smtps://host:port` (implicit TLS), optionally with `user:password@` (lettre's URL
    /// format), and `ses+https://host?region=…` (Amazon SES v2, [`ses`]).
    pub smtp_url: String,
    /// Each provider's circuit breaker ([`breaker`]).
    pub breaker: breaker::BreakerConfig,
    /// SES access key id and secret (`NOTIFY_SES_ACCESS_KEY_ID`,
    /// `NOTIFY_SES_SECRET_ACCESS_KEY`), when set.
    pub ses_credentials: Option<(String, String)>,
    /// Sender mailbox, e.g. `ฝ่ายบริการลูกค้า <noreply@example.test>`.
    pub from: Mailbox,
    /// Right-hand side of generated Message-IDs; defaults to the sender's domain.
    pub message_id_domain: String,
    /// Total deadline of one SMTP exchange, from connecting to the server's answer after
    /// the data (also the connect timeout).
    pub timeout: Duration,
    /// Public URL of the HTTP service's one-click unsubscribe endpoint, e.g.
    /// `https://notify.example.com/unsubscribe`.
    pub unsubscribe_url: String,
    /// Secret that signs unsubscribe tokens (the HTTP service verifies with the same).
    pub unsubscribe_secret: String,
    /// The HTML layout ([`layout`]; `NOTIFY_EMAIL_LAYOUT`, else the shipped one).
    pub layout: std::sync::Arc<layout::Layout>,
}

impl EmailConfig {
    /// Reads `NOTIFY_SMTP_URL` (required, comma-separated providers),
    /// `NOTIFY_EMAIL_BREAKER_FAILURES` (5), `NOTIFY_EMAIL_BREAKER_COOLDOWN` (30s),
    /// `NOTIFY_SES_ACCESS_KEY_ID` and `NOTIFY_SES_SECRET_ACCESS_KEY` (for an SES provider),
    /// `NOTIFY_EMAIL_FROM` (required),
    /// `NOTIFY_EMAIL_MESSAGE_ID_DOMAIN` (sender's domain), `NOTIFY_SMTP_TIMEOUT` (15s),
    /// `NOTIFY_UNSUBSCRIBE_URL` (required, http(s) URL) and `NOTIFY_UNSUBSCRIBE_SECRET`
    /// (required, at least 16 characters), `NOTIFY_EMAIL_LAYOUT` (a minijinja HTML layout
    /// file; the shipped [`layout::DEFAULT_LAYOUT`]).
    /// `None` when a variable is missing or bad; every problem is recorded in `env`.
    pub fn from_env(env: &mut notify_core::config::Env) -> Option<Self> {
        let smtp_url = env.required("NOTIFY_SMTP_URL");
        let from = env.required("NOTIFY_EMAIL_FROM").ok().and_then(|text| {
            text.parse::<Mailbox>()
                .map_err(|e| env.error(format!("NOTIFY_EMAIL_FROM={text:?} is not a mailbox: {e}")))
                .ok()
        });
        let domain = from
            .as_ref()
            .map(|m| m.email.domain().to_string())
            .unwrap_or_default();
        let message_id_domain = env.string("NOTIFY_EMAIL_MESSAGE_ID_DOMAIN", &domain);
        // A total deadline of 0 would fail every message after it reached the server.
        let timeout = env.duration(
            "NOTIFY_SMTP_TIMEOUT",
            Duration::from_secs(15),
            Duration::from_secs(1),
            Duration::from_secs(600),
        );
        let unsubscribe_url = env.required("NOTIFY_UNSUBSCRIBE_URL");
        if let Ok(url) = &unsubscribe_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            env.error(format!(
                "NOTIFY_UNSUBSCRIBE_URL={url:?} must be an http(s) URL"
            ));
        }
        let unsubscribe_secret = env.required("NOTIFY_UNSUBSCRIBE_SECRET");
        if unsubscribe_secret.as_ref().is_ok_and(|s| s.len() < 16) {
            env.error("NOTIFY_UNSUBSCRIBE_SECRET must be at least 16 characters".to_string());
        }
        let layout = std::sync::Arc::new(layout::Layout::from_env(env));
        let failures = env.parse_with("NOTIFY_EMAIL_BREAKER_FAILURES", 5u32, |s| {
            s.parse::<u32>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| "a whole number of at least 1".to_string())
        });
        let cooldown = env.duration(
            "NOTIFY_EMAIL_BREAKER_COOLDOWN",
            Duration::from_secs(30),
            Duration::from_millis(100),
            Duration::from_secs(3600),
        );
        let breaker = breaker::BreakerConfig {
            failures,
            cooldown,
            ..Default::default()
        };
        let key = env.string("NOTIFY_SES_ACCESS_KEY_ID", "");
        let secret = env.string("NOTIFY_SES_SECRET_ACCESS_KEY", "");
        let ses_credentials = (!key.is_empty() && !secret.is_empty()).then_some((key, secret));
        Some(Self {
            breaker,
            ses_credentials,
            layout,
            unsubscribe_url: unsubscribe_url.ok()?,
            unsubscribe_secret: unsubscribe_secret.ok()?,
            smtp_url: smtp_url.ok()?,
            from: from?,
            message_id_domain,
            timeout,
        })
    }
}

/// Sender for email through the ordered providers ([`providers`]).
pub struct EmailSender {
    providers: providers::Providers,
    cfg: EmailConfig,
}

impl EmailSender {
    /// Builds the providers. Errors (naming what is wrong, never a password or secret)
    /// when a URL is malformed.
    pub fn new(cfg: EmailConfig) -> Result<Self, String> {
        let providers = providers::Providers::parse(
            &cfg.smtp_url,
            cfg.timeout,
            cfg.breaker,
            cfg.ses_credentials.clone(),
        )?;
        Ok(Self { providers, cfg })
    }

    /// Records breaker state changes in `email_provider_states` (the console reads them).
    pub fn with_states(mut self, pool: sqlx::PgPool) -> Self {
        self.providers = self.providers.with_states(pool);
        self
    }

    /// The providers, in order, with their breakers.
    pub fn providers(&self) -> &providers::Providers {
        &self.providers
    }

    /// Builds the message for `job`: From, To (with the recipient's display name),
    /// Subject, Message-ID `<delivery id@domain>`, text and HTML parts.
    pub fn build_message(&self, job: &Job) -> Result<Message, String> {
        let address = job
            .address
            .as_deref()
            .ok_or("no email address on the delivery")?;
        let email = address
            .parse()
            .map_err(|e| format!("invalid recipient address {address:?}: {e}"))?;
        let name = Some(job.display_name.clone()).filter(|n| !n.trim().is_empty());
        let to = Mailbox::new(name, email);
        let mut builder = Message::builder()
            .message_id(Some(message_id(job, &self.cfg.message_id_domain)))
            .from(self.cfg.from.clone())
            .to(to.clone())
            .subject(job.content.subject());
        if let Some(url) = self.unsubscribe_link(job) {
            builder = builder
                .raw_header(HeaderValue::new(
                    HeaderName::new_from_ascii_str("List-Unsubscribe"),
                    format!("<{url}>"),
                ))
                .raw_header(HeaderValue::new(
                    HeaderName::new_from_ascii_str("List-Unsubscribe-Post"),
                    "List-Unsubscribe=One-Click".to_string(),
                ));
        }
        for (header, mailbox) in [("From", &self.cfg.from), ("To", &to)] {
            if let Some(value) = folded_mailbox(header, mailbox) {
                builder = builder.raw_header(value);
            }
        }
        if let Some(value) = folded_subject(job.content.subject()) {
            builder = builder.raw_header(value);
        }
        let (text, html) = self.parts(job)?;
        builder
            .multipart(MultiPart::alternative_plain_html(text, html))
            .map_err(|e| format!("cannot build message: {e}"))
    }

    /// The text and HTML parts of `job`'s email ([`layout`]).
    ///
    /// # Errors
    /// The layout fails to render.
    pub fn parts(&self, job: &Job) -> Result<(String, String), String> {
        let unsubscribe = self.unsubscribe_link(job);
        let parts = layout::Parts {
            content: &job.content,
            locale: &job.locale,
            unsubscribe_url: unsubscribe.as_deref(),
        };
        Ok((layout::text_part(parts), self.cfg.layout.html(parts)?))
    }
}

impl EmailSender {
    /// The one-click unsubscribe URL for a marketing delivery (`None` for transactional
    /// types): `<NOTIFY_UNSUBSCRIBE_URL>?token=<signed user, type, channel, issue time>`
    /// (http-api lets it expire after `NOTIFY_UNSUBSCRIBE_TTL`).
    pub fn unsubscribe_link(&self, job: &Job) -> Option<String> {
        (job.category == notify_core::Category::Marketing).then(|| {
            let token = notify_core::signed::UnsubscribeToken {
                user_id: job.user_id.clone(),
                type_key: job.type_key.clone(),
                channel: notify_core::Channel::Email.as_str().into(),
                issued_at: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
            }
            .sign(&self.cfg.unsubscribe_secret);
            let sep = if self.cfg.unsubscribe_url.contains('?') {
                '&'
            } else {
                '?'
            };
            format!("{}{sep}token={token}", self.cfg.unsubscribe_url)
        })
    }
}

/// The stable Message-ID of a delivery: `<delivery-id@domain>` (RFC 5322 §3.6.4).
pub fn message_id(job: &Job, domain: &str) -> String {
    format!("<{}@{}>", job.id, domain)
}

impl ChannelSender for EmailSender {
    fn channel(&self) -> Channel {
        Channel::Email
    }

    /// `NOTIFY_SMTP_TIMEOUT` (15 s) per provider (an attempt may fail over through all of
    /// them) and a second for the adapter to say which step hung.
    fn call_deadline(&self) -> Duration {
        self.cfg.timeout * u32::try_from(self.providers.len()).unwrap_or(1).max(1)
            + Duration::from_secs(1)
    }

    async fn send(&self, job: &Job, lease: &Lease) -> AttemptOutcome {
        let (text, html) = match self.parts(job) {
            Ok(parts) => parts,
            Err(e) => {
                return AttemptOutcome::failed(
                    ErrorClass::Permanent,
                    "template_error",
                    json!({"layout": "NOTIFY_EMAIL_LAYOUT"}),
                )
                .with_response(e);
            }
        };
        let content = json!({
            "to": job.address,
            "display_name": job.display_name,
            "from": self.cfg.from.to_string(),
            "message_id": message_id(job, &self.cfg.message_id_domain),
            "subject": job.content.subject(),
            "text": text,
            "html": html,
            "list_unsubscribe": self.unsubscribe_link(job),
        });
        let message = match self.build_message(job) {
            Ok(m) => m,
            Err(e) => {
                return AttemptOutcome::failed(ErrorClass::Permanent, "invalid_address", content)
                    .with_response(e);
            }
        };
        let envelope = message.envelope().clone();
        let bytes = message.formatted();
        let outgoing = providers::Outgoing {
            from: envelope.from().cloned(),
            to: envelope.to(),
            bytes: &bytes,
            content: &content,
            message_id: message_id(job, &self.cfg.message_id_domain),
        };
        self.providers.send(&outgoing, lease).await
    }
}

/// Whether a permanent SMTP reply says the mailbox does not exist: enhanced status 5.1.1
/// (bad destination mailbox), 5.1.10 (null MX) or 5.1.6 (mailbox moved), RFC 3463 §3.2.
pub fn mailbox_does_not_exist(reply: &str) -> bool {
    reply
        .split(|c: char| c.is_whitespace() || c == ':' || c == ',')
        .any(|w| matches!(w, "5.1.1" | "5.1.10" | "5.1.6"))
}

/// Most bytes of UTF-8 in one encoded-word: base64 of 45 bytes is 60 characters, and with
/// `=?utf-8?b?` and `?=` the word is 72 characters, so `From: ` plus a word fits in 78.
const WORD_BYTES: usize = 45;

/// Most bytes of UTF-8 in one encoded-word of the Subject: base64 of 42 bytes is 56
/// characters, the word 68, so `Subject: ` plus a word is 77 (RFC 5322 §2.1.1: 78).
const SUBJECT_WORD_BYTES: usize = 42;

/// Splits `text` into RFC 2047 base64 encoded-words ("=?utf-8?b?…?=", RFC 2047 §2, §4.1)
/// of whole words ([`notify_core::text::words`]: dictionary word boundaries in Thai, so a
/// reader's client that shows the words apart never shows a word broken). A word longer
/// than [`WORD_BYTES`] is split between grapheme clusters, and a cluster longer than that
/// between characters, so no word ever holds part of a UTF-8 character (RFC 2047 §5 (3)).
/// Display names and the Subject are split by this one function.
pub fn encoded_words(text: &str) -> Vec<String> {
    encoded_words_of(text, WORD_BYTES)
}

/// [`encoded_words`] with at most `max` bytes of text in each encoded-word.
fn encoded_words_of(text: &str, max: usize) -> Vec<String> {
    let pieces = words(text).into_iter().flat_map(|w| -> Vec<&str> {
        if w.len() <= max {
            return vec![w];
        }
        w.graphemes(true)
            .flat_map(|g| -> Vec<&str> {
                if g.len() <= max {
                    vec![g]
                } else {
                    g.char_indices()
                        .map(|(i, c)| &g[i..i + c.len_utf8()])
                        .collect()
                }
            })
            .collect()
    });
    let mut chunks: Vec<String> = vec![String::new()];
    for piece in pieces {
        let last = chunks.last_mut().expect("never empty");
        if !last.is_empty() && last.len() + piece.len() > max {
            chunks.push(piece.to_string());
        } else {
            last.push_str(piece);
        }
    }
    chunks
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| {
            format!(
                "=?utf-8?b?{}?=",
                base64::engine::general_purpose::STANDARD.encode(c)
            )
        })
        .collect()
}

/// The Subject header, folded to at most 78 octets per line between encoded-words of whole
/// words ([`encoded_words`], as display names are), when it is not ASCII; `None` leaves it
/// to lettre (which would cut the text every so many bytes, inside Thai words).
fn folded_subject(subject: &str) -> Option<HeaderValue> {
    Some(HeaderValue::dangerous_new_pre_encoded(
        HeaderName::new_from_ascii_str("Subject"),
        subject.to_string(),
        encoded_subject(subject)?,
    ))
}

/// The folded value of [`folded_subject`] (lines joined by CRLF and a space).
fn encoded_subject(subject: &str) -> Option<String> {
    (!subject.is_ascii()).then(|| encoded_words_of(subject, SUBJECT_WORD_BYTES).join("\r\n "))
}

/// The `header` (From or To) for `mailbox`, folded to at most 78 octets per line, when its
/// display name is not ASCII; `None` leaves it to lettre.
fn folded_mailbox(header: &'static str, mailbox: &Mailbox) -> Option<HeaderValue> {
    let name = mailbox.name.as_deref().filter(|n| !n.is_ascii())?;
    let mut encoded = encoded_words(name).join("\r\n ");
    encoded.push_str(&format!("\r\n <{}>", mailbox.email));
    Some(HeaderValue::dangerous_new_pre_encoded(
        HeaderName::new_from_ascii_str(header),
        mailbox.to_string(),
        encoded,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonexistent_mailboxes_are_told_from_other_rejections() {
        assert!(mailbox_does_not_exist(
            "permanent error (550): 5.1.1 <nouser@example.test>: mailbox does not exist"
        ));
        assert!(mailbox_does_not_exist("550 5.1.10 null MX"));
        assert!(!mailbox_does_not_exist(
            "permanent error (554): 5.7.1 message refused by policy"
        ));
        assert!(!mailbox_does_not_exist("550 5.1.12 other"));
    }

    /// The text of each encoded-word, checked to be whole UTF-8 within the header limits.
    fn decoded(words: &[String]) -> Vec<String> {
        words
            .iter()
            .map(|w| {
                assert!(w.len() <= 72, "{w}");
                let b64 = w
                    .strip_prefix("=?utf-8?b?")
                    .unwrap()
                    .strip_suffix("?=")
                    .unwrap();
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap();
                assert!(bytes.len() <= WORD_BYTES);
                String::from_utf8(bytes).expect("whole UTF-8 characters")
            })
            .collect()
    }

    /// Byte offsets of the word boundaries of `text`.
    fn word_bounds(text: &str) -> Vec<usize> {
        let mut at = 0;
        let mut bounds = vec![0];
        for w in words(text) {
            at += w.len();
            bounds.push(at);
        }
        bounds
    }

    #[test]
    fn encoded_words_carry_whole_thai_words() {
        let name = "ฝ่ายบริการลูกค้า, ร้านตัวอย่าง 👨‍👩‍👧";
        // Hand-checked: a cut at 45 bytes would fall inside "ลูกค้า"; the words stay whole.
        assert_eq!(
            decoded(&encoded_words(name)),
            ["ฝ่ายบริการ", "ลูกค้า, ร้าน", "ตัวอย่าง 👨‍👩‍👧"]
        );
        for text in [
            "เราได้รับชำระเงินเรียบร้อยแล้ว ขอบคุณที่ใช้บริการ แจ้งเตือนการเข้าสู่ระบบใหม่จากอุปกรณ์ที่ไม่รู้จัก",
            "คำสั่งซื้อหมายเลข 12345 ของคุณถูกจัดส่งแล้ว พัสดุจะถึงภายในวันพรุ่งนี้ ติดตามสถานะได้ที่แอป",
        ] {
            let parts = decoded(&encoded_words(text));
            assert!(parts.len() >= 5);
            assert_eq!(parts.concat(), text);
            let bounds = word_bounds(text);
            let mut at = 0;
            for p in &parts {
                at += p.len();
                assert!(bounds.contains(&at), "a word is cut after {p:?}");
                assert!(!p.ends_with(['เ', 'แ', 'โ', 'ใ', 'ไ']), "{p:?}");
            }
        }
    }

    #[test]
    fn a_thai_subject_is_folded_between_whole_words() {
        // Issue 44: lettre cut these inside "การชำระ" and "ยืนยันเรียบร้อย".
        for subject in [
            "ยืนยันการชำระเงินสำหรับคำสั่งซื้อ #1001 ของคุณเรียบร้อยแล้ว",
            "ยืนยันเรียบร้อยแล้ว: การชำระเงินของคุณได้รับการตรวจสอบแล้ว ขอบคุณที่ใช้บริการ",
        ] {
            let encoded = encoded_subject(subject).expect("not ASCII");
            let lines: Vec<&str> = encoded.split("\r\n").collect();
            assert!(lines.len() >= 3, "{encoded}");
            for (i, line) in lines.iter().enumerate() {
                // The first line follows "Subject: ", the others start with the fold's space.
                let len = if i == 0 {
                    "Subject: ".len() + line.len()
                } else {
                    line.len()
                };
                assert!(len <= 78, "line of {len} octets: {line}");
            }
            let words: Vec<String> = lines.iter().map(|l| l.trim().to_string()).collect();
            let parts = decoded(&words);
            assert_eq!(parts.concat(), subject);
            let bounds = word_bounds(subject);
            let mut at = 0;
            for p in &parts {
                at += p.len();
                assert!(bounds.contains(&at), "a word is cut after {p:?}");
            }
            assert!(
                parts
                    .iter()
                    .all(|p| !p.ends_with("การช") && !p.ends_with("ยืนยันเ")),
                "{parts:?}"
            );
        }
        assert!(folded_subject("Your order #1001 shipped").is_none());
        assert!(folded_subject(&"ยืนยัน".repeat(3)).is_some());
    }

    #[test]
    fn a_word_longer_than_an_encoded_word_is_cut_between_grapheme_clusters() {
        // One word of 30 clusters "é" (e + U+0301, 3 bytes each): 15 clusters per word.
        let name = "e\u{301}".repeat(30);
        assert_eq!(words(&name).len(), 1);
        assert_eq!(
            decoded(&encoded_words(&name)),
            vec!["e\u{301}".repeat(15); 2]
        );
        // A cluster longer than a word is split between characters, never inside one.
        let long = format!("a{}", "\u{301}".repeat(30)); // one cluster of 61 bytes
        let parts = decoded(&encoded_words(&long));
        assert_eq!(parts.concat(), long);
        assert_eq!(parts.len(), 2);
    }
}
