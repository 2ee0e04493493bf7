//! What a notification says: the text every channel has, the rich parts (image, actions,
//! badge, thread) that channels render where the platform supports them, and per-channel
//! overrides. [`Content::check`] holds the rules every edge applies; the link policy
//! ([`crate::links`]) and the LINE message limits are checked on top.

use crate::validate::Violations;
pub use crate::validate::{MAX_ACTION_ID_BYTES, is_action_id};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most characters of a title or an email subject.
pub const MAX_TITLE_CHARS: usize = 255;
/// Most characters of a body.
pub const MAX_BODY_CHARS: usize = 20_000;
/// Most characters of an email HTML or text part.
pub const MAX_EMAIL_PART_CHARS: usize = 256 * 1024;

/// What a notification says. The email parts fall back to title and body when empty (the
/// email layout of `worker-email` builds them).
///
/// New fields serialise only when set, so the stored content and the fingerprint of an
/// event without them are what they were before the fields existed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Content {
    /// Short title (inbox, device, default email subject).
    pub title: String,
    /// Main text.
    pub body: String,
    /// Optional link, empty if none.
    #[serde(default)]
    pub url: String,
    /// Email subject; empty = title.
    #[serde(default)]
    pub email_subject: String,
    /// Email HTML part: a fragment shown in the email layout in place of the body, or a
    /// whole document (with `<html`) sent as it is; empty = the body as paragraphs.
    #[serde(default)]
    pub email_html: String,
    /// Email text part; empty = title, body, actions (or url) as text (`worker-email`).
    #[serde(default)]
    pub email_text: String,
    /// An https image shown with the notification (push big picture, LINE hero image,
    /// email and inbox image); empty = none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_url: String,
    /// Up to [`MAX_ACTIONS`] buttons, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<Action>,
    /// What the app icon's badge shows on push.
    #[serde(default, skip_serializing_if = "Badge::is_unchanged")]
    pub badge: Badge,
    /// Groups notifications on the device and in LINE-free channels (APNs `thread-id`,
    /// Android `tag`, Web Push `tag`); empty = none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub thread: String,
    /// Per-channel settings that replace what the fields above would give.
    #[serde(default, skip_serializing_if = "Overrides::is_empty")]
    pub overrides: Overrides,
}

impl Content {
    /// The email subject to send: `email_subject`, else `title`.
    pub fn subject(&self) -> &str {
        if self.email_subject.is_empty() {
            &self.title
        } else {
            &self.email_subject
        }
    }

    /// Plain message text for chat channels (LINE): title, body and url on their own lines.
    pub fn chat_text(&self) -> String {
        let mut parts: Vec<&str> = vec![&self.title];
        if !self.body.is_empty() {
            parts.push(&self.body);
        }
        if !self.url.is_empty() {
            parts.push(&self.url);
        }
        parts.join("\n")
    }
}

/// Escapes `& < > " '` for HTML text and attribute values.
pub fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// Most actions one notification may carry. Three is what every channel can show: APNs
/// and FCM notification categories commonly declare up to 3 buttons on a banner, and a
/// Flex bubble footer fits three buttons on a phone.
pub const MAX_ACTIONS: usize = 3;
/// Most characters of an action label: the label limit of LINE action objects (Messaging
/// API reference, "Action objects": `label` max 20 characters), the strictest channel.
pub const MAX_ACTION_LABEL_CHARS: usize = 20;
/// Most characters of an image URL: LINE's limit for image URLs (Messaging API
/// reference, image message `originalContentUrl`: max 2000 characters).
pub const MAX_IMAGE_URL_CHARS: usize = 2_000;
/// Most bytes of a thread key. APNs `apns-collapse-id` allows 64 bytes; the thread key
/// also becomes the Android and Web Push `tag`, so the same bound keeps it portable.
pub const MAX_THREAD_BYTES: usize = 64;
/// Largest fixed badge number (APNs `badge` and Android `notification_count` are ints;
/// no launcher shows more than a few digits).
pub const MAX_BADGE: u32 = 99_999;
/// Most keys of the FCM `data` override.
pub const MAX_FCM_DATA_KEYS: usize = 100;
/// Most LINE message objects in one request (Messaging API reference, push message:
/// `messages` 1 to 5).
pub const MAX_LINE_MESSAGES: usize = crate::line::MAX_MESSAGES;

/// One button of a notification.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    /// Returned in the tap or click callback (LINE postback `data`, the inbox click, push
    /// `data.action_id`). Empty in a request = `action<N>` (1-based position).
    #[serde(default)]
    pub id: String,
    /// What the button says, 1 to [`MAX_ACTION_LABEL_CHARS`] characters.
    pub label: String,
    /// Where it goes: an https link, or a deep link whose scheme the link policy allows.
    pub url: String,
}

impl Action {
    /// Whether the action opens a web page (`https://` or `http://`), as opposed to an app
    /// deep link, which email and browsers cannot open.
    pub fn is_web_link(&self) -> bool {
        let lower = self.url.get(..8).unwrap_or(&self.url).to_ascii_lowercase();
        lower.starts_with("https://") || lower.starts_with("http://")
    }
}

/// What the app icon's badge shows (APNs `aps.badge`, FCM Android `notification_count`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Badge {
    /// No badge field is sent; the device keeps what it shows.
    #[default]
    Unchanged,
    /// The recipient's unread in-app count when the push is sent (the number of their
    /// inbox notifications with status `unread`, this one included once it is stored).
    UnreadCount,
    /// A fixed number; 0 clears the badge.
    Count(u32),
}

impl Badge {
    /// Whether no badge is sent.
    pub fn is_unchanged(&self) -> bool {
        matches!(self, Badge::Unchanged)
    }
}

/// Per-channel settings. An empty field means "derive it from the common content".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// LINE: the message objects to send instead of the text built from title and body
    /// (1 to [`MAX_LINE_MESSAGES`]: text, image, flex, with quick replies), as LINE's
    /// Messaging API defines them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub line_messages: Vec<serde_json::Value>,
    /// FCM: extra `data` for the app (string values; FCM HTTP v1 `message.data`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fcm_data: BTreeMap<String, String>,
    /// FCM: Android notification channel id (`android.notification.channel_id`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub android_channel_id: String,
    /// APNs: `aps.category`, the app's registered category whose buttons are shown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub apns_category: String,
    /// APNs: `aps.thread-id`; empty = [`Content::thread`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub apns_thread_id: String,
    /// APNs: `aps.sound` (a sound file name in the app bundle, or `default`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub apns_sound: String,
    /// APNs: `aps.interruption-level`: `passive`, `active`, `time-sensitive` or
    /// `critical` (Apple, "Generating a remote notification").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub apns_interruption_level: String,
    /// Web Push: the notification `icon` (https); empty = none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub webpush_icon: String,
    /// Web Push: the notification `image` (https); empty = [`Content::image_url`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub webpush_image: String,
    /// Web Push: the notification `actions`; empty = [`Content::actions`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webpush_actions: Vec<Action>,
}

impl Overrides {
    /// Whether nothing is overridden.
    pub fn is_empty(&self) -> bool {
        self == &Overrides::default()
    }
}

/// APNs interruption levels (Apple, "Generating a remote notification", `aps`).
pub const APNS_INTERRUPTION_LEVELS: [&str; 4] = ["passive", "active", "time-sensitive", "critical"];

/// FCM `data` keys FCM refuses (FCM HTTP v1 reference, `Message.data`: reserved words
/// `from`, `notification`, `message_type` and any key starting with `google` or `gcm`).
pub fn is_reserved_fcm_key(key: &str) -> bool {
    let lower = key.to_ascii_lowercase();
    matches!(lower.as_str(), "from" | "notification" | "message_type")
        || lower.starts_with("google")
        || lower.starts_with("gcm")
}

fn check_image(v: &mut Violations, field: &str, url: &str) {
    if url.is_empty() {
        return;
    }
    if !url.to_ascii_lowercase().starts_with("https://") {
        v.add(
            field,
            "must be an https:// URL (providers fetch images over TLS only)",
        );
    } else if url.chars().count() > MAX_IMAGE_URL_CHARS {
        v.add(
            field,
            format!("must be at most {MAX_IMAGE_URL_CHARS} characters"),
        );
    }
}

fn check_actions(v: &mut Violations, field: &str, actions: &[Action]) {
    if actions.len() > MAX_ACTIONS {
        v.add(
            field,
            format!(
                "must have at most {MAX_ACTIONS} actions, got {}",
                actions.len()
            ),
        );
        return;
    }
    let mut ids = std::collections::HashSet::new();
    for (i, a) in actions.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if a.label
            .chars()
            .all(|c| c.is_whitespace() || crate::validate::is_zero_width(c))
        {
            v.add(format!("{at}.label"), "is required and must not be blank");
        } else if a
            .label
            .chars()
            .any(|c| crate::validate::is_zero_width(c) || crate::validate::is_bidi_control(c))
        {
            v.add(
                format!("{at}.label"),
                "must not contain invisible or bidirectional control characters",
            );
        } else {
            v.check_len(&format!("{at}.label"), &a.label, MAX_ACTION_LABEL_CHARS);
            v.check_single_line(&format!("{at}.label"), &a.label);
        }
        if a.url.is_empty() {
            v.add(format!("{at}.url"), "is required");
        }
        // The id the action will have: its own, or `action<N>` (Content::normalized).
        let id = if a.id.is_empty() {
            format!("action{}", i + 1)
        } else {
            a.id.clone()
        };
        if !is_action_id(&id) {
            v.add(
                format!("{at}.id"),
                format!("must be 1 to {MAX_ACTION_ID_BYTES} characters of [A-Za-z0-9_.:-]"),
            );
        } else if !ids.insert(id) {
            v.add(
                format!("{at}.id"),
                "must differ from the other actions' ids (an action without an id is action<N> by its position)",
            );
        }
    }
}

impl Content {
    /// Records every rule `self` breaks, with field paths under `content.`: title
    /// required; lengths capped ([`MAX_TITLE_CHARS`], [`MAX_BODY_CHARS`],
    /// [`MAX_EMAIL_PART_CHARS`]); `url` an absolute http(s) URL; `image_url` and the Web Push
    /// icon and image https; at most [`MAX_ACTIONS`] actions, each with a label of 1 to
    /// [`MAX_ACTION_LABEL_CHARS`] characters and a URL; `thread` at most
    /// [`MAX_THREAD_BYTES`] without control characters; FCM `data` keys not reserved; APNs
    /// interruption level one of [`APNS_INTERRUPTION_LEVELS`]; LINE messages within LINE's
    /// documented limits ([`crate::line::check_messages`]: 1 to [`MAX_LINE_MESSAGES`]
    /// objects, `altText`, Flex size, labels, URI schemes, image URLs). Which schemes a link may use is
    /// the link policy's rule ([`crate::links::LinkPolicy::check`]).
    pub fn check(&self, v: &mut Violations) {
        if self.title.trim().is_empty() {
            v.add("content.title", "is required");
        }
        v.check_len("content.title", &self.title, MAX_TITLE_CHARS);
        v.check_len("content.body", &self.body, MAX_BODY_CHARS);
        v.check_url("content.url", &self.url);
        v.check_len(
            "content.email_subject",
            &self.email_subject,
            MAX_TITLE_CHARS,
        );
        v.check_len("content.email_html", &self.email_html, MAX_EMAIL_PART_CHARS);
        v.check_len("content.email_text", &self.email_text, MAX_EMAIL_PART_CHARS);
        v.check_single_line("content.title", &self.title);
        v.check_single_line("content.email_subject", &self.email_subject);
        check_image(v, "content.image_url", &self.image_url);
        check_actions(v, "content.actions", &self.actions);
        if self.thread.len() > MAX_THREAD_BYTES || self.thread.chars().any(char::is_control) {
            v.add(
                "content.thread",
                format!("must be at most {MAX_THREAD_BYTES} bytes without control characters"),
            );
        }
        if let Badge::Count(n) = self.badge
            && n > MAX_BADGE
        {
            v.add(
                "content.badge_count",
                format!("must be at most {MAX_BADGE}"),
            );
        }
        let o = &self.overrides;
        if !o.line_messages.is_empty() {
            crate::line::check_messages(
                "content.overrides.line_messages_json",
                &o.line_messages,
                v,
            );
        }
        if o.fcm_data.len() > MAX_FCM_DATA_KEYS {
            v.add(
                "content.overrides.fcm_data",
                format!("must have at most {MAX_FCM_DATA_KEYS} keys"),
            );
        }
        for key in o.fcm_data.keys() {
            if key.is_empty() || is_reserved_fcm_key(key) {
                v.add(
                    format!("content.overrides.fcm_data[{key}]"),
                    "is a key FCM reserves (from, notification, message_type, google*, gcm*) or empty",
                );
            }
        }
        for (field, value, max) in [
            (
                "content.overrides.android_channel_id",
                &o.android_channel_id,
                255,
            ),
            ("content.overrides.apns_category", &o.apns_category, 255),
            ("content.overrides.apns_thread_id", &o.apns_thread_id, 255),
            ("content.overrides.apns_sound", &o.apns_sound, 255),
        ] {
            v.check_len(field, value, max);
            v.check_single_line(field, value);
        }
        if !o.apns_interruption_level.is_empty()
            && !APNS_INTERRUPTION_LEVELS.contains(&o.apns_interruption_level.as_str())
        {
            v.add(
                "content.overrides.apns_interruption_level",
                "must be one of passive, active, time-sensitive, critical",
            );
        }
        check_image(v, "content.overrides.webpush_icon", &o.webpush_icon);
        check_image(v, "content.overrides.webpush_image", &o.webpush_image);
        check_actions(v, "content.overrides.webpush_actions", &o.webpush_actions);
    }

    /// `self` with defaults filled in: an action without an id gets `action<N>` (its
    /// 1-based position).
    pub fn normalized(mut self) -> Self {
        for list in [&mut self.actions, &mut self.overrides.webpush_actions] {
            for (i, a) in list.iter_mut().enumerate() {
                if a.id.is_empty() {
                    a.id = format!("action{}", i + 1);
                }
            }
        }
        self
    }

    /// Every link the content carries with its field path (empty ones left out): `url`,
    /// `image_url`, the actions' URLs, the Web Push icon, image and actions, and every
    /// string under a link-naming key ([`crate::link_keys::is_link_key`]: `uri`,
    /// `originalContentUrl`, `linkUri`, ...) in the LINE messages.
    pub fn links(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut push = |field: String, url: &str| {
            if !url.is_empty() {
                out.push((field, url.to_string()));
            }
        };
        push("content.url".into(), &self.url);
        push("content.image_url".into(), &self.image_url);
        for (i, a) in self.actions.iter().enumerate() {
            push(format!("content.actions[{i}].url"), &a.url);
        }
        let o = &self.overrides;
        push("content.overrides.webpush_icon".into(), &o.webpush_icon);
        push("content.overrides.webpush_image".into(), &o.webpush_image);
        for (i, a) in o.webpush_actions.iter().enumerate() {
            push(
                format!("content.overrides.webpush_actions[{i}].url"),
                &a.url,
            );
        }
        let mut found = Vec::new();
        for (i, m) in o.line_messages.iter().enumerate() {
            crate::link_keys::walk(
                &format!("content.overrides.line_messages_json[{i}]"),
                m,
                false,
                &mut found,
            );
        }
        out.extend(found.into_iter().filter(|(_, u)| !u.is_empty()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_text_puts_title_body_and_url_on_their_own_lines() {
        let c = Content {
            title: "สวัสดี <ลูกค้า>".into(),
            body: "a & b\nline2".into(),
            url: "https://x.test/o?a=1&b=2".into(),
            ..Default::default()
        };
        assert_eq!(c.subject(), "สวัสดี <ลูกค้า>");
        assert_eq!(
            c.chat_text(),
            "สวัสดี <ลูกค้า>\na & b\nline2\nhttps://x.test/o?a=1&b=2"
        );
        assert_eq!(
            escape_html("<a href='x'>&</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&lt;/a&gt;"
        );
    }

    /// `content` checked and normalised as `CreateEvent` does, or the violations' fields.
    fn parse(content: Content) -> Result<Content, Vec<String>> {
        let mut v = Violations::default();
        content.check(&mut v);
        v.into_result(content.normalized())
            .map_err(|errs| errs.into_iter().map(|f| f.field).collect())
    }

    fn action(label: &str, url: &str) -> Action {
        Action {
            id: String::new(),
            label: label.into(),
            url: url.into(),
        }
    }

    fn rich() -> Content {
        Content {
            title: "ชำระเงินสำเร็จ".into(),
            image_url: "https://cdn.shop.example/o/1001.png".into(),
            actions: vec![
                action("ดูคำสั่งซื้อ", "https://shop.example/o/1001"),
                action("ติดต่อร้าน", "https://shop.example/help"),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn actions_get_positional_ids_and_rich_fields_survive_parsing() {
        let e = parse(rich()).unwrap();
        let ids: Vec<&str> = e.actions.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, ["action1", "action2"]);
        assert_eq!(e.image_url, "https://cdn.shop.example/o/1001.png");
    }

    #[test]
    fn bad_rich_content_names_each_field() {
        let mut c = rich();
        c.actions.push(action("", "https://shop.example/x"));
        c.actions.push(action("สี่", "https://shop.example/4"));
        c.image_url = "http://cdn.shop.example/a.png".into();
        assert_eq!(
            parse(c).unwrap_err(),
            ["content.image_url", "content.actions"],
            "4 actions are refused as a whole"
        );
        let mut c = rich();
        c.actions[0].label = String::new();
        c.actions[1].label = "ป้ายที่ยาวเกินยี่สิบตัวอักษรแน่นอน".into();
        c.actions[1].url = String::new();
        c.thread = "t".repeat(65);
        c.overrides.apns_interruption_level = "loud".into();
        c.overrides.fcm_data.insert("google.x".into(), "1".into());
        c.overrides.line_messages = vec![serde_json::json!({"text": "no type"})];
        assert_eq!(
            parse(c).unwrap_err(),
            [
                "content.actions[0].label",
                "content.actions[1].label",
                "content.actions[1].url",
                "content.thread",
                "content.overrides.line_messages_json[0]",
                "content.overrides.fcm_data[google.x]",
                "content.overrides.apns_interruption_level",
            ]
        );
        let mut c = rich();
        c.actions[1].id = "action1".into();
        c.actions[0].id = "action1".into();
        assert_eq!(parse(c).unwrap_err(), ["content.actions[1].id"]);
    }

    #[test]
    fn an_event_without_rich_fields_keeps_its_stored_form_and_fingerprint() {
        let plain = Content {
            title: "t".into(),
            body: "b".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            serde_json::json!({"title": "t", "body": "b", "url": "", "email_subject": "",
                "email_html": "", "email_text": ""})
        );
        let back: Content = serde_json::from_value(serde_json::to_value(rich()).unwrap()).unwrap();
        assert_eq!(back, rich());
    }

    #[test]
    fn links_lists_every_link_with_its_path() {
        let mut c = rich();
        c.overrides.line_messages = vec![serde_json::json!({"type": "flex", "altText": "x",
            "contents": {"type": "bubble", "footer": {"type": "box", "contents": [
                {"type": "button", "action": {"type": "uri", "label": "ดู", "uri": "myshop://o/1"}}]}}})];
        let fields: Vec<String> = c.links().into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "content.image_url",
                "content.actions[0].url",
                "content.actions[1].url",
                "content.overrides.line_messages_json[0].contents.footer.contents[0].action.uri",
            ]
        );
    }
}
