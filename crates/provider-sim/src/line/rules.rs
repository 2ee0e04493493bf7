//! What LINE's push and multicast refuse in a message object, beyond text length: a Flex
//! Message without `altText` or with one over 1,500 characters, a bubble over 30 KB or a
//! carousel over 50 KB or 12 bubbles, an action label over its limit (Flex 40, quick reply
//! 20), a URI action whose scheme is not `http`, `https`, `line` or `tel`, an image URL
//! that is not https (developers.line.biz/en/reference/messaging-api/, "Flex Message",
//! "Action objects", "Specifications of the label", "URI action").
//!
//! Written apart from `notify_core::line` on purpose, so the platform's own checks are
//! tested against a second reading of LINE's reference rather than against themselves.
//! The simulator counts characters as Unicode scalar values and KB as 1,024 bytes (the
//! platform counts stricter). Each problem is one `details` entry, `{"message",
//! "property"}`, as LINE's 400 answer lists them; the property is LINE's JSON path
//! (`messages[0].contents.footer.contents[1].action.label`), the message our wording.

use serde_json::{Value, json};

/// Bytes of a bubble's JSON LINE accepts: 30 KB.
const BUBBLE_BYTES: usize = 30 * 1024;
/// Bytes of a carousel's JSON LINE accepts: 50 KB.
const CAROUSEL_BYTES: usize = 50 * 1024;

struct Details(Vec<Value>);

impl Details {
    fn add(&mut self, property: &str, message: impl Into<String>) {
        self.0
            .push(json!({"message": message.into(), "property": property}));
    }
}

/// Every `details` entry LINE would answer for message object `m` at `at`
/// (`messages[i]`).
pub(super) fn message_details(at: &str, m: &Value) -> Vec<Value> {
    let mut d = Details(Vec::new());
    match m["type"].as_str() {
        Some("flex") => {
            match m["altText"].as_str() {
                Some(t) if !t.trim().is_empty() => {
                    if t.chars().count() > 1500 {
                        d.add(
                            &format!("{at}.altText"),
                            "Length must be between 0 and 1500",
                        );
                    }
                }
                _ => d.add(&format!("{at}.altText"), "must be specified"),
            }
            container(&mut d, &format!("{at}.contents"), &m["contents"]);
        }
        Some("image") => {
            for key in ["originalContentUrl", "previewImageUrl"] {
                image(&mut d, &format!("{at}.{key}"), &m[key]);
            }
        }
        _ => {}
    }
    if let Some(items) = m["quickReply"]["items"].as_array() {
        if items.len() > 13 {
            d.add(
                &format!("{at}.quickReply.items"),
                "Size must be between 0 and 13",
            );
        }
        for (i, item) in items.iter().enumerate() {
            action(
                &mut d,
                &format!("{at}.quickReply.items[{i}].action"),
                &item["action"],
                20,
                true,
            );
        }
    }
    d.0
}

fn size(v: &Value) -> usize {
    v.to_string().len()
}

fn container(d: &mut Details, at: &str, c: &Value) {
    match c["type"].as_str() {
        Some("bubble") => bubble(d, at, c),
        Some("carousel") => {
            if size(c) > CAROUSEL_BYTES {
                d.add(at, "The size of a carousel must be 50KB or less");
            }
            match c["contents"].as_array() {
                Some(b) if (1..=12).contains(&b.len()) => {
                    for (j, x) in b.iter().enumerate() {
                        bubble(d, &format!("{at}.contents[{j}]"), x);
                    }
                }
                _ => d.add(&format!("{at}.contents"), "Size must be between 1 and 12"),
            }
        }
        _ => d.add(
            &format!("{at}.type"),
            "must be one of the following values: [bubble, carousel]",
        ),
    }
}

fn bubble(d: &mut Details, at: &str, b: &Value) {
    if size(b) > BUBBLE_BYTES {
        d.add(at, "The size of a bubble must be 30KB or less");
    }
    component(d, at, b);
}

fn component(d: &mut Details, at: &str, node: &Value) {
    match node {
        Value::Object(map) => {
            let kind = map.get("type").and_then(Value::as_str).unwrap_or("");
            if kind == "button" || map.contains_key("action") {
                action(
                    d,
                    &format!("{at}.action"),
                    &node["action"],
                    40,
                    kind == "button",
                );
            }
            if matches!(kind, "image" | "icon") {
                image(d, &format!("{at}.url"), &node["url"]);
            }
            for (k, x) in map {
                if k != "action" {
                    component(d, &format!("{at}.{k}"), x);
                }
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                component(d, &format!("{at}[{i}]"), x);
            }
        }
        _ => {}
    }
}

fn action(d: &mut Details, at: &str, a: &Value, max_label: usize, label_required: bool) {
    match a["label"].as_str() {
        Some(l) if l.chars().count() > max_label => {
            d.add(
                &format!("{at}.label"),
                format!("Length must be between 0 and {max_label}"),
            );
        }
        None | Some("") if label_required => d.add(&format!("{at}.label"), "must be specified"),
        _ => {}
    }
    match a["type"].as_str() {
        Some("uri") => {
            let uri = a["uri"].as_str().unwrap_or("");
            let scheme = uri.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
            if !matches!(scheme.as_deref(), Some("http" | "https" | "line" | "tel")) {
                d.add(&format!("{at}.uri"), "invalid uri scheme");
            } else if uri.chars().count() > 1000 {
                d.add(&format!("{at}.uri"), "Length must be between 0 and 1000");
            }
        }
        Some("postback") if a["data"].as_str().is_none_or(|s| s.chars().count() > 300) => {
            d.add(&format!("{at}.data"), "Length must be between 0 and 300");
        }
        Some(_) => {}
        None => d.add(&format!("{at}.type"), "must be specified"),
    }
}

fn image(d: &mut Details, at: &str, url: &Value) {
    let url = url.as_str().unwrap_or("");
    if !url.to_ascii_lowercase().starts_with("https://") {
        d.add(at, "must be a valid HTTPS URL");
    } else if url.chars().count() > 2000 {
        d.add(at, "Length must be between 0 and 2000");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(alt: Value, contents: Value) -> Value {
        json!({"type": "flex", "altText": alt, "contents": contents})
    }

    fn bubble_with(buttons: Value) -> Value {
        json!({"type": "bubble",
            "hero": {"type": "image", "url": "https://cdn.example/a.png"},
            "body": {"type": "box", "layout": "vertical", "contents": [{"type": "text", "text": "t"}]},
            "footer": {"type": "box", "layout": "vertical", "contents": buttons}})
    }

    fn one(m: Value) -> Vec<(String, String)> {
        message_details("messages[0]", &m)
            .into_iter()
            .map(|d| {
                (
                    d["property"].as_str().unwrap().to_string(),
                    d["message"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn link(label: &str, uri: &str) -> Value {
        json!({"type": "button", "action": {"type": "uri", "label": label, "uri": uri}})
    }

    #[test]
    fn a_good_card_passes_and_each_refusal_names_its_property() {
        let good = bubble_with(json!([link("ดูคำสั่งซื้อ", "https://shop.example/o/1"),
            {"type": "button", "action": {"type": "postback", "label": "ติดตาม", "data": "d=x&a=y"}}]));
        assert_eq!(one(card(json!("ชำระเงินแล้ว"), good.clone())), []);

        let footer = "messages[0].contents.footer.contents[0].action";
        let table: Vec<(&str, Value, (String, &str))> = vec![
            (
                "no altText",
                card(Value::Null, good.clone()),
                ("messages[0].altText".into(), "must be specified"),
            ),
            (
                "altText over 1,500 characters",
                card(json!("ก".repeat(1501)), good.clone()),
                (
                    "messages[0].altText".into(),
                    "Length must be between 0 and 1500",
                ),
            ),
            (
                "a bubble over 30 KB",
                card(json!("x"), {
                    let mut b = good.clone();
                    b["body"]["contents"][0]["text"] = json!("a".repeat(31 * 1024));
                    b
                }),
                (
                    "messages[0].contents".into(),
                    "The size of a bubble must be 30KB or less",
                ),
            ),
            (
                "a Flex button label over 40 characters",
                card(
                    json!("x"),
                    bubble_with(json!([link(&"ก".repeat(41), "https://a.example/")])),
                ),
                (format!("{footer}.label"), "Length must be between 0 and 40"),
            ),
            (
                "a non-https hero image",
                card(json!("x"), {
                    let mut b = good.clone();
                    b["hero"]["url"] = json!("http://cdn.example/a.png");
                    b
                }),
                (
                    "messages[0].contents.hero.url".into(),
                    "must be a valid HTTPS URL",
                ),
            ),
            (
                "an app deep link in a URI action",
                card(
                    json!("x"),
                    bubble_with(json!([link("ติดตาม", "myshop://orders/1")])),
                ),
                (format!("{footer}.uri"), "invalid uri scheme"),
            ),
            (
                "13 bubbles in a carousel",
                card(
                    json!("x"),
                    json!({"type": "carousel", "contents": vec![good.clone(); 13]}),
                ),
                (
                    "messages[0].contents.contents".into(),
                    "Size must be between 1 and 12",
                ),
            ),
            (
                "a quick reply label over 20 characters",
                json!({"type": "text", "text": "t", "quickReply": {"items": [{"type": "action",
                    "action": {"type": "message", "label": "ก".repeat(21), "text": "x"}}]}}),
                (
                    "messages[0].quickReply.items[0].action.label".into(),
                    "Length must be between 0 and 20",
                ),
            ),
        ];
        for (name, m, (property, message)) in table {
            assert_eq!(one(m), [(property, message.to_string())], "{name}");
        }
    }
}
