//! LINE Messaging API message limits, checked before anything is sent: at ingest over a
//! caller's `overrides.line_messages` ([`crate::Content::check`]) and in the LINE worker
//! over the messages it is about to push (a card rendered from a template, or the Flex
//! card it builds from the content). A message over a limit is refused with the field and
//! the rule named, instead of a 400 from LINE hours later.
//!
//! Sources. The OpenAPI description (github.com/line/line-openapi, `messaging-api.yml`)
//! states only some of these: `messages` 1 to 5 items, quick reply `items` at most 13,
//! postback and datetime-picker `data` at most 300 characters, a quick-reply item's
//! `imageUrl` at most 2,000 and `altUri.desktop` at most 1,000. It is silent on the rest,
//! which come from the written reference (developers.line.biz/en/reference/messaging-api/):
//! "Flex Message": `altText` max 1,500 characters, a bubble's JSON at most 30 KB, a
//! carousel's at most 50 KB with at most 12 bubbles; "Specifications of the label"
//! (`#action-object-label-spec`): a Flex button's label required and at most 40 characters
//! (other Flex actions: optional, 40), quick reply and template buttons 20, image
//! carousel 12; "URI action": `uri` at most 1,000 characters with scheme `http`, `https`,
//! `line` or `tel`; image URLs (image message, Flex image and icon, quick-reply icon)
//! https, at most 2,000 characters; text messages 5,000 characters counted in UTF-16
//! code units (`#text-character-count`).
//!
//! Two readings are ours where LINE is vague, each the stricter one, so nothing passing
//! here is over the limit under the other reading: "characters" are counted in UTF-16
//! code units (as LINE documents for text; an emoji outside the BMP counts 2, Thai counts
//! 1 per code point either way), and "KB" is 1,000 bytes of the compact JSON.
//!
//! Pure: no I/O.

use crate::validate::Violations;
use serde_json::Value;
use uuid::Uuid;

/// Most message objects in one push or multicast request (`messages`: 1 to 5).
pub const MAX_MESSAGES: usize = 5;
/// Most UTF-16 code units of a text message's `text`.
pub const MAX_TEXT_UTF16: usize = 5_000;
/// Most characters of a Flex, template or imagemap message's `altText`.
pub const MAX_ALT_TEXT: usize = 1_500;
/// Most bytes of one bubble's compact JSON ("30 KB", read as 30,000 bytes).
pub const MAX_BUBBLE_BYTES: usize = 30_000;
/// Most bytes of a carousel's compact JSON ("50 KB", read as 50,000 bytes).
pub const MAX_CAROUSEL_BYTES: usize = 50_000;
/// Most bubbles in a carousel.
pub const MAX_CAROUSEL_BUBBLES: usize = 12;
/// Most quick-reply buttons on one message.
pub const MAX_QUICK_REPLY_ITEMS: usize = 13;
/// Most characters of a Flex Message action label (button: required).
pub const MAX_FLEX_LABEL: usize = 40;
/// Most characters of a quick-reply button label (required).
pub const MAX_QUICK_REPLY_LABEL: usize = 20;
/// Most characters of a template message action label (buttons, confirm, carousel).
pub const MAX_TEMPLATE_LABEL: usize = 20;
/// Most characters of an image-carousel column's action label.
pub const MAX_IMAGE_CAROUSEL_LABEL: usize = 12;
/// Most characters of a postback action's `data` (what the webhook returns).
pub const MAX_POSTBACK_DATA: usize = 300;
/// Most characters of a URI action's `uri`.
pub const MAX_URI: usize = 1_000;
/// Most characters of an image URL.
pub const MAX_IMAGE_URL: usize = 2_000;
/// The schemes a URI action may open.
pub const URI_SCHEMES: [&str; 4] = ["http", "https", "line", "tel"];

/// Length as these rules count it: UTF-16 code units.
pub fn units(s: &str) -> usize {
    s.encode_utf16().count()
}

/// Whether LINE's URI action can open `url` (its scheme is one of [`URI_SCHEMES`]).
pub fn opens_as_uri(url: &str) -> bool {
    url.split_once(':')
        .is_some_and(|(scheme, _)| URI_SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}

/// The postback `data` of a button the LINE worker builds: `d=<delivery id>&a=<action
/// id>`, at most 3 + 36 + 3 + 64 = 106 characters (action ids are at most 64 bytes of
/// `[A-Za-z0-9_.:-]`), so always within [`MAX_POSTBACK_DATA`].
pub fn postback_data(delivery_id: Uuid, action_id: &str) -> String {
    format!("d={delivery_id}&a={action_id}")
}

/// The delivery id and action id of postback `data` built by [`postback_data`]; `None`
/// for any other data (a caller's own postback, a forged or truncated one, one longer
/// than LINE's 300-character postback data, an action id that is not one
/// ([`crate::validate::is_action_id`])).
pub fn parse_postback_data(data: &str) -> Option<(Uuid, String)> {
    if data.chars().count() > 300 {
        return None;
    }
    let (mut delivery, mut action) = (None, None);
    for pair in data.split('&') {
        match pair.split_once('=') {
            Some(("d", v)) => delivery = Uuid::parse_str(v).ok(),
            Some(("a", v)) if crate::validate::is_action_id(v) => action = Some(v.to_string()),
            _ => return None,
        }
    }
    Some((delivery?, action?))
}

/// Where an action stands, which decides its label rule.
#[derive(Debug, Clone, Copy)]
enum Place {
    FlexButton,
    Flex,
    QuickReply,
    Template,
    TemplateDefault,
    ImageCarousel,
}

impl Place {
    /// (label required, most characters, what the rule is called).
    fn label_rule(self) -> (bool, usize, &'static str) {
        match self {
            Place::FlexButton => (true, MAX_FLEX_LABEL, "a Flex Message button"),
            Place::Flex => (false, MAX_FLEX_LABEL, "a Flex Message action"),
            Place::QuickReply => (true, MAX_QUICK_REPLY_LABEL, "a quick reply button"),
            Place::Template => (true, MAX_TEMPLATE_LABEL, "a template message button"),
            Place::TemplateDefault => (false, MAX_TEMPLATE_LABEL, "a template default action"),
            Place::ImageCarousel => (false, MAX_IMAGE_CAROUSEL_LABEL, "an image carousel column"),
        }
    }
}

/// Records every LINE limit `messages` breaks, each message named `{field}[i]` and its
/// parts by their JSON path below it (`{field}[0].altText`,
/// `{field}[0].contents.footer.contents[1].action.label`): 1 to [`MAX_MESSAGES`] objects,
/// each with a `type`; text 1 to [`MAX_TEXT_UTF16`] units; image message URLs; Flex
/// `altText` and container sizes; every action's label, `uri` and `data`; image URLs;
/// quick replies. Types this module does not know pass with only the common checks.
pub fn check_messages(field: &str, messages: &[Value], v: &mut Violations) {
    if messages.is_empty() || messages.len() > MAX_MESSAGES {
        v.add(
            field,
            format!(
                "must have 1 to {MAX_MESSAGES} message objects (LINE push), got {}",
                messages.len()
            ),
        );
    }
    for (i, m) in messages.iter().enumerate() {
        check_message(&format!("{field}[{i}]"), m, v);
    }
}

fn check_message(at: &str, m: &Value, v: &mut Violations) {
    let Some(kind) = m.get("type").and_then(Value::as_str) else {
        v.add(at, "must be a LINE message object with a \"type\"");
        return;
    };
    match kind {
        "text" | "textV2" => match m.get("text").and_then(Value::as_str) {
            Some(t) if !t.is_empty() => {
                if units(t) > MAX_TEXT_UTF16 {
                    v.add(
                        format!("{at}.text"),
                        format!(
                            "must be at most {MAX_TEXT_UTF16} UTF-16 code units (LINE text message), got {}",
                            units(t)
                        ),
                    );
                }
            }
            _ => v.add(format!("{at}.text"), "is required (LINE text message)"),
        },
        "image" => {
            for key in ["originalContentUrl", "previewImageUrl"] {
                image_url(v, &format!("{at}.{key}"), m.get(key), true);
            }
        }
        "flex" => {
            alt_text(v, at, m, "Flex Message");
            flex_container(v, &format!("{at}.contents"), m.get("contents"));
        }
        "template" => {
            alt_text(v, at, m, "template message");
            template(v, &format!("{at}.template"), m.get("template"));
        }
        "imagemap" => alt_text(v, at, m, "imagemap message"),
        _ => {}
    }
    if let Some(q) = m.get("quickReply") {
        quick_reply(v, &format!("{at}.quickReply"), q);
    }
}

fn alt_text(v: &mut Violations, at: &str, m: &Value, what: &str) {
    match m.get("altText").and_then(Value::as_str) {
        Some(t) if !t.trim().is_empty() => {
            if units(t) > MAX_ALT_TEXT {
                v.add(
                    format!("{at}.altText"),
                    format!(
                        "must be at most {MAX_ALT_TEXT} characters (LINE {what} altText), got {}",
                        units(t)
                    ),
                );
            }
        }
        _ => v.add(
            format!("{at}.altText"),
            format!("is required (LINE {what}: shown in notifications and the chat list)"),
        ),
    }
}

fn json_bytes(value: &Value) -> usize {
    serde_json::to_string(value).map_or(0, |s| s.len())
}

fn flex_container(v: &mut Violations, at: &str, c: Option<&Value>) {
    match c.and_then(|c| c.get("type")).and_then(Value::as_str) {
        Some("bubble") => bubble(v, at, c.unwrap_or(&Value::Null)),
        Some("carousel") => {
            let c = c.unwrap_or(&Value::Null);
            let bytes = json_bytes(c);
            if bytes > MAX_CAROUSEL_BYTES {
                v.add(
                    at,
                    format!("must be at most {MAX_CAROUSEL_BYTES} bytes of JSON (LINE carousel: 50 KB), got {bytes}"),
                );
            }
            match c.get("contents").and_then(Value::as_array) {
                Some(bubbles) if (1..=MAX_CAROUSEL_BUBBLES).contains(&bubbles.len()) => {
                    for (j, b) in bubbles.iter().enumerate() {
                        bubble(v, &format!("{at}.contents[{j}]"), b);
                    }
                }
                other => v.add(
                    format!("{at}.contents"),
                    format!(
                        "must hold 1 to {MAX_CAROUSEL_BUBBLES} bubbles (LINE carousel), got {}",
                        other.map_or(0, Vec::len)
                    ),
                ),
            }
        }
        _ => v.add(
            at,
            "must be a Flex container: a \"bubble\" or a \"carousel\"",
        ),
    }
}

fn bubble(v: &mut Violations, at: &str, b: &Value) {
    if b.get("type").and_then(Value::as_str) != Some("bubble") {
        v.add(at, "must be a bubble");
        return;
    }
    let bytes = json_bytes(b);
    if bytes > MAX_BUBBLE_BYTES {
        v.add(
            at,
            format!(
                "must be at most {MAX_BUBBLE_BYTES} bytes of JSON (LINE bubble: 30 KB), got {bytes}"
            ),
        );
    }
    flex_node(v, at, b);
}

/// Walks a Flex tree: actions by where they stand, image URLs of image, icon and video
/// components.
fn flex_node(v: &mut Violations, at: &str, node: &Value) {
    match node {
        Value::Object(map) => {
            let kind = map.get("type").and_then(Value::as_str).unwrap_or("");
            if kind == "button" {
                action(
                    v,
                    &format!("{at}.action"),
                    map.get("action"),
                    Place::FlexButton,
                );
            } else if let Some(a) = map.get("action") {
                action(v, &format!("{at}.action"), Some(a), Place::Flex);
            }
            if matches!(kind, "image" | "icon") {
                image_url(v, &format!("{at}.url"), map.get("url"), true);
            }
            if kind == "video" {
                image_url(v, &format!("{at}.previewUrl"), map.get("previewUrl"), true);
            }
            for (k, x) in map {
                if k != "action" {
                    flex_node(v, &format!("{at}.{k}"), x);
                }
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                flex_node(v, &format!("{at}[{i}]"), x);
            }
        }
        _ => {}
    }
}

fn template(v: &mut Violations, at: &str, t: Option<&Value>) {
    let Some(t) = t else {
        v.add(at, "is required (LINE template message)");
        return;
    };
    let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
    let actions = |v: &mut Violations, at: &str, holder: &Value| {
        if let Some(list) = holder.get("actions").and_then(Value::as_array) {
            for (i, a) in list.iter().enumerate() {
                action(v, &format!("{at}.actions[{i}]"), Some(a), Place::Template);
            }
        }
        if let Some(a) = holder.get("defaultAction") {
            action(
                v,
                &format!("{at}.defaultAction"),
                Some(a),
                Place::TemplateDefault,
            );
        }
        if holder.get("thumbnailImageUrl").is_some() {
            image_url(
                v,
                &format!("{at}.thumbnailImageUrl"),
                holder.get("thumbnailImageUrl"),
                false,
            );
        }
    };
    actions(v, at, t);
    for (j, col) in t
        .get("columns")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let col_at = format!("{at}.columns[{j}]");
        if kind == "image_carousel" {
            action(
                v,
                &format!("{col_at}.action"),
                col.get("action"),
                Place::ImageCarousel,
            );
            image_url(v, &format!("{col_at}.imageUrl"), col.get("imageUrl"), true);
        } else {
            actions(v, &col_at, col);
        }
    }
}

fn quick_reply(v: &mut Violations, at: &str, q: &Value) {
    let Some(items) = q.get("items").and_then(Value::as_array) else {
        v.add(
            format!("{at}.items"),
            "must be an array of quick reply buttons",
        );
        return;
    };
    if items.len() > MAX_QUICK_REPLY_ITEMS {
        v.add(
            format!("{at}.items"),
            format!(
                "must have at most {MAX_QUICK_REPLY_ITEMS} buttons (LINE quick reply), got {}",
                items.len()
            ),
        );
    }
    for (i, item) in items.iter().enumerate() {
        let item_at = format!("{at}.items[{i}]");
        action(
            v,
            &format!("{item_at}.action"),
            item.get("action"),
            Place::QuickReply,
        );
        if item.get("imageUrl").is_some() {
            image_url(
                v,
                &format!("{item_at}.imageUrl"),
                item.get("imageUrl"),
                false,
            );
        }
    }
}

fn action(v: &mut Violations, at: &str, a: Option<&Value>, place: Place) {
    let (required, max, what) = place.label_rule();
    let Some(a) = a.filter(|a| a.is_object()) else {
        v.add(at, format!("must be a LINE action object ({what})"));
        return;
    };
    match a.get("label") {
        Some(Value::String(l)) if !l.trim().is_empty() => {
            if units(l) > max {
                v.add(
                    format!("{at}.label"),
                    format!(
                        "must be at most {max} characters (LINE label of {what}), got {}",
                        units(l)
                    ),
                );
            }
        }
        None if !required => {}
        _ => v.add(
            format!("{at}.label"),
            format!("is required, 1 to {max} characters (LINE label of {what})"),
        ),
    }
    match a.get("type").and_then(Value::as_str) {
        Some("uri") => {
            uri(v, &format!("{at}.uri"), a.get("uri"));
            if let Some(desktop) = a.get("altUri").and_then(|u| u.get("desktop")) {
                uri(v, &format!("{at}.altUri.desktop"), Some(desktop));
            }
        }
        Some("postback" | "datetimepicker") => match a.get("data").and_then(Value::as_str) {
            Some(d) if units(d) <= MAX_POSTBACK_DATA => {}
            Some(d) => v.add(
                format!("{at}.data"),
                format!(
                    "must be at most {MAX_POSTBACK_DATA} characters (LINE postback data), got {}",
                    units(d)
                ),
            ),
            None => v.add(format!("{at}.data"), "is required (LINE postback data)"),
        },
        Some(_) => {}
        None => v.add(format!("{at}.type"), "is required (LINE action type)"),
    }
}

fn uri(v: &mut Violations, at: &str, u: Option<&Value>) {
    let Some(u) = u.and_then(Value::as_str).filter(|u| !u.is_empty()) else {
        v.add(at, "is required (LINE URI action)");
        return;
    };
    if !opens_as_uri(u) {
        v.add(
            at,
            format!(
                "must use a scheme LINE opens: {} (LINE URI action); an app deep link cannot be a LINE button",
                URI_SCHEMES.join(", ")
            ),
        );
    } else if units(u) > MAX_URI {
        v.add(
            at,
            format!(
                "must be at most {MAX_URI} characters (LINE URI action), got {}",
                units(u)
            ),
        );
    }
}

fn image_url(v: &mut Violations, at: &str, u: Option<&Value>, required: bool) {
    match u.and_then(Value::as_str).filter(|u| !u.is_empty()) {
        None if required => v.add(at, "is required (LINE image URL)"),
        None => {}
        Some(u)
            if !u
                .get(..8)
                .is_some_and(|p| p.eq_ignore_ascii_case("https://")) =>
        {
            v.add(
                at,
                "must be an https:// URL (LINE fetches images over TLS 1.2 or later only)",
            )
        }
        Some(u) if units(u) > MAX_IMAGE_URL => v.add(
            at,
            format!(
                "must be at most {MAX_IMAGE_URL} characters (LINE image URL), got {}",
                units(u)
            ),
        ),
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests;
