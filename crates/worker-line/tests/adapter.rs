//! The LINE adapter called directly (no broker, no database) against the provider
//! simulator on port 0, through a table of answers: each maps to one typed outcome.

use notify_core::ErrorClass;
use notify_worker::ChannelSender;
use notify_worker::testing::{Expect, LINE_TOKEN, Sim, failure, fault, job, lease, sent_id};
use serde_json::json;
use std::time::Duration;
use worker_line::{LineConfig, LineSender};

/// The adapter's HTTP timeout here; the timeout row answers later than it.
const TIMEOUT: Duration = Duration::from_millis(500);

fn sender(sim: &Sim) -> LineSender {
    LineSender::new(LineConfig {
        api_base: sim.url.clone(),
        channel_token: LINE_TOKEN.into(),
        timeout: TIMEOUT,
    })
    .unwrap()
}

fn line_job() -> notify_worker::Job {
    let mut j = job("line", "line");
    j.address = Some(format!("U{}", "0123456789abcdef".repeat(2)));
    j
}

#[tokio::test]
async fn every_failed_answer_maps_to_its_typed_outcome() {
    use ErrorClass::*;
    let sim = Sim::start().await;
    let line = sender(&sim);
    let table = [
        (
            "429 with Retry-After",
            fault(
                "line",
                429,
                json!({"retry_after": 7, "body": {"message": "Too many requests"}}),
            ),
            Expect::failed(RateLimited, "line_rate_limited", Some(429))
                .retry_after(Duration::from_secs(7)),
        ),
        (
            "5xx",
            fault("line", 503, json!({"body": {"message": "unavailable"}})),
            Expect::failed(Transient, "line_503", Some(503)).reason("line_5xx"),
        ),
        (
            "4xx",
            fault(
                "line",
                400,
                json!({"body": {"message": "The request body has 1 error(s)"}}),
            ),
            Expect::failed(Permanent, "line_400", Some(400)).reason("line_4xx"),
        ),
        (
            "malformed body on an error status",
            fault("line", 500, json!({"body": "<html>oops"})),
            Expect::failed(Transient, "line_500", Some(500)).reason("line_5xx"),
        ),
        (
            "timeout (the answer comes after the call's timeout)",
            fault(
                "line",
                200,
                json!({"delay_ms": 2 * TIMEOUT.as_millis() as u64}),
            ),
            Expect::failed(Transient, "line_timeout", None).ambiguous(),
        ),
    ];
    sim.run_table(&table, || async { line.send(&line_job(), &lease()).await })
        .await;

    // 429 naming the monthly limit: the channel pauses until the quota month ends.
    let quota = json!({"body": {"message": "You have reached your monthly limit."}});
    sim.fault(fault("line", 429, quota)).await;
    let out = line.send(&line_job(), &lease()).await;
    let got = failure(&out);
    assert_eq!(
        (got.class.clone(), got.code.as_str()),
        (QuotaExhausted, "line_monthly_quota")
    );
    assert!(got.retry_after.is_some_and(|d| d > Duration::ZERO));
}

#[tokio::test]
async fn a_success_and_a_resent_retry_key_are_both_sent() {
    let sim = Sim::start().await;
    let line = sender(&sim);
    let j = line_job();
    // 200: the id of the first message sent.
    let first = line.send(&j, &lease()).await;
    assert!(sent_id(&first).is_some_and(|id| id.is_some()), "{first:?}");
    assert_eq!(first.provider_status, Some(200));
    // 409, the same retry key again: LINE already accepted it, so it counts as sent.
    let again = line.send(&j, &lease()).await;
    assert!(sent_id(&again).is_some_and(|id| id.is_some()), "{again:?}");
    assert_eq!(again.provider_status, Some(409));
    // A 200 whose body is not LINE's shape is still a success, named by the request id.
    sim.fault(fault("line", 200, json!({"body": "not json{"})))
        .await;
    let odd = line.send(&line_job(), &lease()).await;
    assert!(sent_id(&odd).is_some_and(|id| id.is_some()), "{odd:?}");
}

/// The requests the simulator recorded for `provider`, oldest first.
async fn recorded(sim: &Sim, provider: &str) -> Vec<serde_json::Value> {
    let url = format!("{}/_sim/requests?provider={provider}", sim.url);
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn a_long_thai_text_is_sent_as_objects_cut_between_dictionary_words() {
    let sim = Sim::start().await;
    let line = sender(&sim);
    let mut j = line_job();
    j.content.title = "แจ้งเตือน".into();
    // Payment received, thank you, new-device sign-in: run together with no space, so
    // only the dictionary finds where a word ends. About 7,900 UTF-16 units.
    j.content.body =
        "เราได้รับชำระเงินเรียบร้อยแล้วขอบคุณที่ใช้บริการแจ้งเตือนการเข้าสู่ระบบใหม่จากอุปกรณ์ที่ไม่รู้จัก".repeat(85);
    j.content.url = String::new();
    let out = line.send(&j, &lease()).await;
    assert!(sent_id(&out).is_some_and(|id| id.is_some()), "{out:?}");

    let reqs = recorded(&sim, "line").await;
    let texts: Vec<&str> = reqs[0]["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    let whole = j.content.chat_text();
    assert!(whole.encode_utf16().count() > 6_000);
    assert_eq!(texts.len(), 2);
    assert_eq!(texts.concat(), whole, "the objects join back into the text");
    // Hand-checked: the limit falls inside "บริการ" ("service"), which goes whole.
    assert!(
        texts[0].ends_with("ขอบคุณที่ใช้"),
        "…{}",
        &texts[0][texts[0].len() - 30..]
    );
    assert!(texts[1].starts_with("บริการแจ้งเตือน"));
    let mut bounds = vec![0];
    for w in notify_core::text::words(&whole) {
        bounds.push(bounds.last().unwrap() + w.len());
    }
    let cut = texts[0].len();
    assert!(
        bounds.contains(&cut),
        "cut inside a word: …{}",
        &texts[0][cut - 30..]
    );
    assert!(texts[0].encode_utf16().count() <= 5000);
    assert!(
        !texts[0].ends_with(['เ', 'แ', 'โ', 'ใ', 'ไ']),
        "a dangling leading vowel"
    );
    // As full as whole words allow: the next word would not have fitted.
    let next = bounds.iter().find(|&&b| b > cut).unwrap();
    assert!(whole[..*next].encode_utf16().count() > 5000);
}

async fn line_requests(sim: &Sim) -> Vec<serde_json::Value> {
    reqwest::get(format!("{}/_sim/requests?provider=line", sim.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn rich_content_is_one_flex_card_and_a_card_over_line_limits_is_never_sent() {
    let sim = Sim::start().await;
    let line = sender(&sim);
    let mut rich = line_job();
    rich.content.image_url = "https://cdn.shop.example/orders/1234.png".into();
    rich.content.actions = vec![notify_core::Action {
        id: "view".into(),
        label: "ดูคำสั่งซื้อ".into(),
        url: "https://shop.example/orders/1234".into(),
    }];
    let out = line.send(&rich, &lease()).await;
    assert_eq!(out.provider_status, Some(200), "{out:?}");
    let sent = line_requests(&sim).await;
    assert_eq!(sent.len(), 1);
    let card = &sent[0]["body"]["messages"][0];
    assert_eq!(card["type"], "flex");
    assert_eq!(card["altText"], "Order paid\nYour order 1234 is paid.");
    assert_eq!(
        card["contents"]["hero"]["url"],
        "https://cdn.shop.example/orders/1234.png"
    );

    // Cards the simulator (like LINE) would refuse with a 400: refused before the call,
    // permanently, the field and the rule named.
    let flex = |alt: String, uri: &str| {
        json!({"type": "flex", "altText": alt, "contents": {"type": "bubble",
            "footer": {"type": "box", "layout": "vertical", "contents": [
                {"type": "button", "action": {"type": "uri", "label": "ดู", "uri": uri}}]}}})
    };
    for (card, field) in [
        (
            flex("ก".repeat(1_501), "https://shop.example/o/1"),
            "messages[0].altText: must be at most 1500 characters",
        ),
        (
            flex("ok".into(), "myshop://orders/1"),
            "messages[0].contents.footer.contents[0].action.uri: must use a scheme LINE opens",
        ),
    ] {
        let mut j = line_job();
        j.content.overrides.line_messages = vec![card];
        let out = line.send(&j, &lease()).await;
        let got = failure(&out);
        assert_eq!(
            (got.class.clone(), got.code.as_str()),
            (ErrorClass::Permanent, "content_invalid")
        );
        let said = out.provider_response.clone().unwrap_or_default();
        assert!(said.starts_with(field), "{said}");
        assert_eq!(out.provider_status, None, "no provider answer");
    }
    assert_eq!(
        line_requests(&sim).await.len(),
        1,
        "LINE was not called again"
    );
}
