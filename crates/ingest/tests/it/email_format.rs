//! F04: Thai subject, sender name and a long Thai body survive email intact, checked on
//! the raw message MailDev received (RFC 5322 line limits, RFC 2047 encoded-words,
//! RFC 2045 transfer encodings).

use crate::support;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use notify_core::Channel;
use notify_proto::v1 as pb;
use support::{Platform, SendExt, uniq};

/// Decodes one RFC 2047 encoded-word (`=?charset?B|Q?text?=`) to bytes.
fn decode_word(word: &str) -> Vec<u8> {
    let inner = word
        .strip_prefix("=?")
        .and_then(|w| w.strip_suffix("?="))
        .unwrap_or_else(|| panic!("not an encoded-word: {word}"));
    let mut parts = inner.splitn(3, '?');
    let charset = parts.next().unwrap();
    assert!(charset.eq_ignore_ascii_case("utf-8"), "charset {charset}");
    let enc = parts.next().unwrap();
    let text = parts.next().unwrap();
    if enc.eq_ignore_ascii_case("b") {
        STANDARD
            .decode(text)
            .expect("valid base64 in an encoded-word")
    } else {
        qp_decode(&text.replace('_', " "))
    }
}

fn qp_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'=' {
            if b.get(i + 1) == Some(&b'\r') || b.get(i + 1) == Some(&b'\n') {
                // Soft line break.
                i += if b.get(i + 1) == Some(&b'\r') { 3 } else { 2 };
                continue;
            }
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// Header `name` from the raw message, unfolded, or None.
fn header<'a>(head: &'a [&'a str], name: &str) -> Option<String> {
    let prefix = format!("{}:", name.to_ascii_lowercase());
    let start = head
        .iter()
        .position(|l| l.to_ascii_lowercase().starts_with(&prefix))?;
    let mut value = head[start][name.len() + 1..].to_string();
    for l in &head[start + 1..] {
        if l.starts_with(' ') || l.starts_with('\t') {
            value.push_str(l);
        } else {
            break;
        }
    }
    Some(value)
}

/// The decoded text of a header value made of encoded-words and plain text, ignoring
/// whitespace between adjacent encoded-words (RFC 2047 section 6.2). Each word must
/// decode to whole UTF-8 characters on its own.
fn decode_header(value: &str) -> String {
    let mut out = String::new();
    let mut prev_was_word: Option<bool> = None;
    for token in value.split([' ', '\t']).filter(|t| !t.is_empty()) {
        let is_word = token.starts_with("=?") && token.ends_with("?=");
        // Whitespace between two encoded-words is dropped; anywhere else it is one space.
        if prev_was_word.is_some_and(|prev| !(prev && is_word)) {
            out.push(' ');
        }
        if is_word {
            let text = String::from_utf8(decode_word(token))
                .unwrap_or_else(|_| panic!("{token} splits a UTF-8 character"));
            out.push_str(&text);
        } else {
            out.push_str(token);
        }
        prev_was_word = Some(is_word);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thai_subject_sender_and_long_body_survive_email_intact() {
    let p = Platform::start_with_type(&[Channel::Email], "order_shipped", &["email"]).await;
    let (user, address) = p.add_email_recipient("u1001").await;
    let subject = "แจ้งเตือน: คำสั่งซื้อ #1001 ของคุณจัดส่งแล้ว 📦 กรุณาตรวจสอบสถานะภายใน 7 วัน";
    assert_eq!(subject.chars().count(), 75);
    let text = "ขอบคุณที่ใช้บริการ".repeat(67);
    let mut req = p.event("evt-f04", "order_shipped", &[&user]);
    let c = req.content.as_mut().unwrap();
    c.email_subject = subject.into();
    c.email_text = text.clone();
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent");

    let mails = p.mails_to(&address).await;
    assert_eq!(mails.len(), 1);
    let raw = p
        .http
        .get(format!(
            "{}/api/email/{}/source",
            p.stack.maildev_url,
            mails[0]["id"].as_str().unwrap()
        ))
        .text_body()
        .await;
    let raw = raw.replace("\r\n", "\n");
    let (head, rest) = raw
        .split_once("\n\n")
        .expect("headers end with a blank line");
    let head: Vec<&str> = head.lines().collect();

    for line in &head {
        assert!(line.is_ascii(), "non-ASCII header line: {line}");
        assert!(
            line.len() <= 78,
            "header line of {} octets: {line}",
            line.len()
        );
        for token in line.split([' ', '\t', '"', ',', '<', '>']) {
            if token.starts_with("=?") && token.ends_with("?=") {
                assert!(token.len() <= 75, "encoded-word of {} chars", token.len());
                String::from_utf8(decode_word(token))
                    .unwrap_or_else(|_| panic!("{token} does not decode to whole characters"));
            }
        }
    }
    assert_eq!(
        decode_header(&header(&head, "Subject").expect("Subject")),
        subject,
        "the subject decodes byte for byte, with no added spaces"
    );
    // Each encoded-word of the Subject ends between two words, as the display names'
    // do (issue 44: "การช|ำระ").
    let mut bounds = vec![0];
    for w in notify_core::text::words(subject) {
        bounds.push(bounds.last().unwrap() + w.len());
    }
    let mut at = 0;
    for token in header(&head, "Subject").unwrap().split_whitespace() {
        let part = String::from_utf8(decode_word(token)).unwrap();
        at += part.len();
        assert!(
            bounds.contains(&at),
            "the Subject is cut inside a word after {part:?}"
        );
    }

    let from = header(&head, "From").expect("From");
    let (name_part, addr_part) = from.rsplit_once('<').expect("one angle-addr");
    assert_eq!(
        addr_part.trim(),
        "noreply@example.test>",
        "plain ASCII address"
    );
    assert_eq!(from.matches('<').count(), 1, "exactly one mailbox");
    let name = name_part.trim();
    let name = decode_header(name.trim_matches('"'));
    assert_eq!(name, "ฝ่ายบริการลูกค้า, ร้านตัวอย่าง");

    // The text/plain part.
    let at = rest
        .find("Content-Type: text/plain")
        .expect("a text/plain part");
    let part = &rest[at..];
    let (part_head, part_body) = part.split_once("\n\n").unwrap();
    let part_head_l = part_head.to_ascii_lowercase();
    assert!(part_head_l.contains("charset=utf-8"), "{part_head}");
    let body_raw: String = part_body
        .lines()
        .take_while(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for line in body_raw.lines() {
        assert!(line.len() <= 76, "body line of {} characters", line.len());
    }
    let decoded = if part_head_l.contains("content-transfer-encoding: base64") {
        STANDARD
            .decode(body_raw.split_whitespace().collect::<String>())
            .unwrap()
    } else {
        assert!(
            part_head_l.contains("content-transfer-encoding: quoted-printable"),
            "{part_head}"
        );
        qp_decode(&body_raw)
    };
    let decoded = String::from_utf8(decoded).unwrap();
    assert_eq!(
        decoded.trim_end_matches(['\r', '\n']),
        text,
        "the body byte for byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rich_email_shows_the_image_and_buttons_and_its_text_part_says_the_same() {
    let p = Platform::start_with_type(&[Channel::Email], "order_paid", &["email"]).await;
    let user = uniq("u");
    let address = format!("{user}@example.test");
    p.add_recipient(&user, "สมชาย", &address, "").await;
    let mut req = p.rich_event("order:1001:paid", "order_paid", &[&user]);
    let actions = &mut req.content.as_mut().unwrap().actions;
    actions[1].url = "https://shop.example.test/track/1001".into();
    // A third action with an app deep link: no mail reader opens it, so it is left out.
    actions.push(pb::Action {
        id: "app".into(),
        label: "เปิดในแอป".into(),
        url: "myshop://orders/1001".into(),
    });
    let ev = p.create_event(req).await;
    let done = p.wait_final(&ev.event_id, 30).await;
    assert_eq!(done.deliveries[0].status, "sent");

    let mails = p.mails_to(&address).await;
    assert_eq!(mails.len(), 1);
    assert_eq!(
        mails[0]["text"].as_str().unwrap().replace("\r\n", "\n"),
        "ชำระเงินแล้ว #1001\n\nขอบคุณที่ใช้บริการ\n\n\
         ดูคำสั่งซื้อ: https://shop.example.test/orders/1001\n\
         ติดตามพัสดุ: https://shop.example.test/track/1001",
        "title, body and each action as label: url"
    );
    let html = mails[0]["html"].as_str().unwrap();
    let between = |start: &str, end: &str| -> Vec<String> {
        html.split(start)
            .skip(1)
            .map(|s| s.split(end).next().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        between("<img src=\"", "\""),
        ["https://cdn.shop.example.test/orders/1001.png"]
    );
    assert_eq!(
        between("<a class=\"button\" href=\"", "\""),
        [
            "https://shop.example.test/orders/1001",
            "https://shop.example.test/track/1001"
        ],
        "one button per action, in order"
    );
    let labels: Vec<String> = between("<a class=\"button\"", "</a>")
        .iter()
        .map(|a| a.rsplit('>').next().unwrap().to_string())
        .collect();
    assert_eq!(labels, ["ดูคำสั่งซื้อ", "ติดตามพัสดุ"]);
    assert_eq!(between("<h1", "</h1>").len(), 1);
    assert!(html.contains(">ชำระเงินแล้ว #1001</h1>"), "{html}");
    assert!(html.contains(">ขอบคุณที่ใช้บริการ</p>"), "{html}");
    assert!(html.contains("<html lang=\"th\">"), "{html}");
    assert!(
        !html.contains("ยกเลิกการรับอีเมล"),
        "a transactional type has no unsubscribe footer"
    );
}
