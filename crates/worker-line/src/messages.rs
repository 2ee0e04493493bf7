//! The LINE message objects of one delivery, built from its rendered content:
//!
//! 1. `overrides.line_messages` when set (a template's or the caller's own Flex card,
//!    text or image messages), sent as they are;
//! 2. else, when the content has an image or actions, one Flex Message ([`flex_card`]);
//! 3. else plain text: title, body and link, split into up to five text objects.
//!
//! Whatever is built is then checked against LINE's limits
//! ([`notify_core::line::check_messages`]) before any call.
//!
//! Buttons. LINE reports nothing when a user taps a URI action, and a postback action
//! cannot open a URL, so each action becomes the one LINE can carry out:
//! - a link LINE can open (`http`, `https`, `line`, `tel`) is a `uri` action: the tap
//!   opens it in LINE's browser (or the phone app), and no click is recorded;
//! - an app deep link (`myshop://...`), which LINE refuses in a URI action, is a
//!   `postback` action with `data` = `d=<delivery id>&a=<action id>` and `displayText` =
//!   the label: the tap shows the label in the chat as the user's reply and LINE posts a
//!   `postback` event to `POST /webhooks/line`, recorded as a click of that action on that
//!   delivery (`delivery_clicks`, source `line`). The app's backend reads the click to act.

use notify_core::Content;
use notify_core::line::{MAX_ALT_TEXT, opens_as_uri, postback_data, units};
use notify_core::text::{TooLong, shorten_to_fit, split_utf16};
use serde_json::{Value, json};
use uuid::Uuid;

/// The message objects to push for `content` of delivery `delivery_id` (see the module
/// docs). `Err` when plain text does not fit five text objects.
pub fn build(content: &Content, delivery_id: Uuid) -> Result<Vec<Value>, TooLong> {
    if !content.overrides.line_messages.is_empty() {
        return Ok(content.overrides.line_messages.clone());
    }
    if !content.image_url.is_empty() || !content.actions.is_empty() {
        return Ok(vec![flex_card(content, delivery_id)]);
    }
    let pieces = split_utf16(
        &content.chat_text(),
        notify_core::line::MAX_TEXT_UTF16,
        notify_core::line::MAX_MESSAGES,
    )?;
    Ok(pieces
        .into_iter()
        .map(|p| json!({"type": "text", "text": p}))
        .collect())
}

/// The Flex card's `altText` (shown in the notification and the chat list): the title and
/// the body on the next line, cut with an ellipsis to [`MAX_ALT_TEXT`] UTF-16 code units.
pub fn alt_text(content: &Content) -> String {
    let full = if content.body.is_empty() {
        content.title.clone()
    } else {
        format!("{}\n{}", content.title, content.body)
    };
    shorten_to_fit(&full, |s| units(s) <= MAX_ALT_TEXT).unwrap_or_default()
}

/// One Flex Message bubble: the image as the hero (`size: full`, 20:13, cover), the title
/// (bold) and body (wrapped) in the body block, one button per action in the footer (the
/// first `primary`, the others `secondary`), and `content.url` as the bubble's tap action
/// when LINE can open it.
pub fn flex_card(content: &Content, delivery_id: Uuid) -> Value {
    let mut bubble = json!({"type": "bubble"});
    if !content.image_url.is_empty() {
        bubble["hero"] = json!({
            "type": "image",
            "url": content.image_url,
            "size": "full",
            "aspectRatio": "20:13",
            "aspectMode": "cover",
        });
    }
    let mut texts = vec![json!({
        "type": "text", "text": content.title, "weight": "bold", "size": "lg", "wrap": true,
    })];
    if !content.body.is_empty() {
        texts.push(json!({
            "type": "text", "text": content.body, "size": "sm", "color": "#555555", "wrap": true,
        }));
    }
    bubble["body"] =
        json!({"type": "box", "layout": "vertical", "spacing": "sm", "contents": texts});
    if !content.actions.is_empty() {
        let buttons: Vec<Value> = content
            .actions
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let action = if opens_as_uri(&a.url) {
                    json!({"type": "uri", "label": a.label, "uri": a.url})
                } else {
                    json!({
                        "type": "postback",
                        "label": a.label,
                        "data": postback_data(delivery_id, &a.id),
                        "displayText": a.label,
                    })
                };
                json!({
                    "type": "button",
                    "style": if i == 0 { "primary" } else { "secondary" },
                    "height": "sm",
                    "action": action,
                })
            })
            .collect();
        bubble["footer"] = json!({
            "type": "box", "layout": "vertical", "spacing": "sm", "contents": buttons,
        });
    }
    if !content.url.is_empty() && opens_as_uri(&content.url) {
        bubble["action"] = json!({"type": "uri", "uri": content.url});
    }
    json!({"type": "flex", "altText": alt_text(content), "contents": bubble})
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify_core::Action;

    fn rich() -> Content {
        Content {
            title: "ชำระเงินแล้ว #1001".into(),
            body: "ขอบคุณที่ใช้บริการ".into(),
            url: "https://shop.example/orders/1001".into(),
            image_url: "https://cdn.shop.example/orders/1001.png".into(),
            actions: vec![
                Action {
                    id: "view".into(),
                    label: "ดูคำสั่งซื้อ".into(),
                    url: "https://shop.example/orders/1001".into(),
                },
                Action {
                    id: "track".into(),
                    label: "ติดตามพัสดุ".into(),
                    url: "myshop://orders/1001/track".into(),
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_link_is_a_uri_button_and_a_deep_link_a_postback_naming_the_delivery() {
        let id = Uuid::now_v7();
        let card = flex_card(&rich(), id);
        let buttons = &card["contents"]["footer"]["contents"];
        assert_eq!(
            buttons[0]["action"],
            json!({"type": "uri", "label": "ดูคำสั่งซื้อ", "uri": "https://shop.example/orders/1001"})
        );
        assert_eq!(
            buttons[1]["action"],
            json!({"type": "postback", "label": "ติดตามพัสดุ",
                "data": format!("d={id}&a=track"), "displayText": "ติดตามพัสดุ"})
        );
        let mut v = notify_core::validate::Violations::default();
        notify_core::line::check_messages("messages", &[card], &mut v);
        assert_eq!(v.0, [], "the card is within LINE's limits");
    }

    #[test]
    fn text_only_content_stays_text_and_overrides_win() {
        let mut c = rich();
        c.image_url.clear();
        c.actions.clear();
        assert_eq!(
            build(&c, Uuid::nil()).unwrap(),
            [
                json!({"type": "text", "text": "ชำระเงินแล้ว #1001\nขอบคุณที่ใช้บริการ\nhttps://shop.example/orders/1001"})
            ]
        );
        c.overrides.line_messages = vec![json!({"type": "text", "text": "เฉพาะ LINE"})];
        assert_eq!(build(&c, Uuid::nil()).unwrap(), c.overrides.line_messages);
    }

    #[test]
    fn alt_text_is_title_and_body_cut_to_1500_units() {
        let mut c = rich();
        assert_eq!(alt_text(&c), "ชำระเงินแล้ว #1001\nขอบคุณที่ใช้บริการ");
        c.body = "ขอบคุณที่ใช้บริการ".repeat(200);
        let alt = alt_text(&c);
        assert!(units(&alt) <= MAX_ALT_TEXT, "{}", units(&alt));
        assert!(
            units(&alt) > MAX_ALT_TEXT - 20,
            "cut near the limit, not far before"
        );
        assert!(alt.ends_with(notify_core::text::ELLIPSIS));
        assert!(alt.starts_with("ชำระเงินแล้ว #1001\nขอบคุณ"));
    }
}
