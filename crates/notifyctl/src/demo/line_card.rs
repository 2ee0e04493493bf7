//! The demo's last step: the shipped type file (`deploy/notification-types.json`, built
//! into this binary) is loaded as `ingest load-types` loads it, and one `order_paid` event
//! goes to somchai on LINE, rendered by the file's Thai LINE template into a Flex Message
//! card (amount in baht, paid time in Thai, a "ดูคำสั่งซื้อ" button). The check reads the
//! card back from the simulator's recorded request.

use super::{PEOPLE, SENT, check, event_by_id};
use anyhow::bail;
use notify_proto::v1 as pb;
use pb::ingest_service_client::IngestServiceClient;
use serde_json::Value;
use std::time::{Duration, Instant};

/// The shipped type file.
const TYPES_FILE: &str = include_str!("../../../../deploy/notification-types.json");

/// Loads the type file, sends the card, checks what LINE received; returns the URL where
/// the received request can be read.
pub(super) async fn run(
    ingest: &mut IngestServiceClient<crate::keys::Grpc>,
    pool: &sqlx::PgPool,
    observed: &crate::observe::Observer,
    cfg: &super::DemoConfig,
    failures: &mut Vec<String>,
) -> anyhow::Result<String> {
    println!();
    println!("== 10. the shipped type file's Thai order-paid LINE Flex card");
    match ingest::types_file::load(pool, TYPES_FILE).await {
        Ok(loaded) => println!("  deploy/notification-types.json: {loaded:?}"),
        Err(e) => bail!("loading deploy/notification-types.json: {e}"),
    }
    let file: Value = serde_json::from_str(TYPES_FILE)?;
    let sample = file["types"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["key"] == "order_paid"))
        .map(|t| t["sample_payload"].to_string())
        .unwrap_or_else(|| "{}".into());
    let somchai = &PEOPLE[0];
    let created = ingest
        .create_event(pb::CreateEventRequest {
            event_key: "order:1001:paid".into(),
            r#type: "order_paid".into(),
            actor_id: "shop-checkout".into(),
            recipients: vec![somchai.user_id.into()],
            payload: sample,
            content: Some(pb::Content {
                title: "ชำระเงินสำเร็จ คำสั่งซื้อ #1001".into(),
                ..Default::default()
            }),
            channels: vec!["line".into()],
            ..Default::default()
        })
        .await?
        .into_inner();
    let started = Instant::now();
    let delivery = loop {
        let ev = event_by_id(ingest, &created.event_id).await?;
        if let Some(d) = ev
            .deliveries
            .into_iter()
            .find(|d| d.status != super::PENDING && d.status != "sending")
        {
            break d;
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the LINE card is not final after 30 s; see .stack/logs/demo-worker-line.log");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let line: Vec<Value> = observed.requests("line").await?;
    let card = line
        .iter()
        .rev()
        .find(|r| r["body"]["to"] == somchai.line)
        .map(|r| (r["status"].clone(), r["body"]["messages"][0].clone()));
    let (status, card) = card.unwrap_or_default();
    let button = &card["contents"]["footer"]["contents"][0]["action"];
    let body = card["contents"]["body"].to_string();
    println!("  altText: {}", card["altText"].as_str().unwrap_or("-"));
    check(
        delivery.status == SENT
            && status == 200
            && card["type"] == "flex"
            && card["contents"]["type"] == "bubble"
            && card["altText"] == "ชำระเงินสำเร็จ คำสั่งซื้อ #1001 ยอด 1,250.00 บาท"
            && body.contains("1,250.00 บาท")
            && body.contains("2569")
            && button["type"] == "uri"
            && button["label"] == "ดูคำสั่งซื้อ"
            && button["uri"] == "https://shop.example/orders/1001",
        "LINE: the Thai order-paid card arrived as a Flex Message (amount in baht, Buddhist-era date, a \"ดูคำสั่งซื้อ\" button to the order)",
        failures,
    );
    Ok(format!("{}/_sim/requests?provider=line", cfg.sim_url))
}
