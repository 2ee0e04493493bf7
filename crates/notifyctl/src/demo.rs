//! The demo scenario: one `order_paid` event to three Thai recipients on in-app, email,
//! LINE and push (FCM phones, an APNs iPhone and a Web Push browser), sent twice, then every outcome read back and checked against what the
//! real SMTP server (MailDev), the provider simulator and Postgres received; last, the
//! shipped type file's Thai LINE Flex card ([`line_card`]).

use anyhow::{Context, bail};
use notify_core::{Channel, DeliveryStatus};
use notify_proto::v1 as pb;
use pb::ingest_service_client::IngestServiceClient;
use pb::recipient_service_client::RecipientServiceClient;
use pb::type_service_client::TypeServiceClient;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

mod line_card;
mod webhooks;

// The names `GetEvent` answers with (proto fields are text).
const PENDING: &str = DeliveryStatus::Pending.as_str();
const SENT: &str = DeliveryStatus::Sent.as_str();
const INAPP: &str = Channel::InApp.as_str();

/// Where the demo finds the platform and the places it checks.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Ingest gRPC URL.
    pub grpc_url: String,
    /// Database of the running platform (for the in-app inbox count).
    pub database_url: String,
    /// MailDev web/REST base URL.
    pub maildev_url: String,
    /// provider-sim base URL.
    pub sim_url: String,
    /// http-api base URL (console and example inbox).
    pub http_url: String,
    /// HS256 secret of end-user inbox tokens.
    pub inbox_jwt_secret: String,
    /// The Standard Webhooks receivers of `examples/`.
    pub examples: crate::receivers::Examples,
    /// Folder of the demo's logs (the receiver's request log goes there).
    pub log_dir: std::path::PathBuf,
}

struct Person {
    user_id: &'static str,
    name: &'static str,
    email: &'static str,
    line: &'static str,
    /// Push endpoints: (platform, FCM/APNs token or Web Push endpoint URL).
    devices: &'static [(&'static str, &'static str)],
    email_off: bool,
}

const PEOPLE: [Person; 3] = [
    Person {
        user_id: "somchai",
        name: "สมชาย ใจดี",
        email: "somchai@example.test",
        line: "U5f1c2a9e8d7b6c4a3e2f1d0c9b8a7e6d",
        devices: &[
            ("fcm", "fcm-somchai-phone"),
            ("fcm", "fcm-somchai-tablet"),
            ("webpush", WEBPUSH_ENDPOINT),
        ],
        email_off: false,
    },
    Person {
        user_id: "somying",
        name: "สมหญิง รักไทย",
        email: "somying@example.test",
        line: "",
        devices: &[
            ("fcm", "fcm-somying-phone"),
            ("apns", "apns-somying-iphone"),
        ],
        email_off: false,
    },
    Person {
        user_id: "wichai",
        name: "วิชัย ศรีสุข",
        email: "wichai@example.test",
        line: "U0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a",
        devices: &[],
        email_off: true,
    },
];

const EVENT_KEY: &str = "order:123:paid";

/// somchai's browser subscription at the simulator's push service.
const WEBPUSH_ENDPOINT: &str = "https://push.example.test/sub/somchai-firefox";

fn check(ok: bool, what: &str, failures: &mut Vec<String>) {
    println!("  [{}] {what}", if ok { "ok" } else { "FAIL" });
    if !ok {
        failures.push(what.to_string());
    }
}

/// Runs the scenario and prints the outcome. Returns whether every check passed.
pub async fn run(cfg: &DemoConfig) -> anyhow::Result<bool> {
    let observed = crate::observe::Observer::new(&cfg.sim_url, Some(&cfg.maildev_url));
    observed.reset().await?;

    let channel = tonic::transport::Endpoint::from_shared(cfg.grpc_url.clone())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to ingest at {}", cfg.grpc_url))?;
    let channel = crate::keys::authed(channel);
    let grpc = channel.clone();
    let hooks = webhooks::start(&grpc, &cfg.examples, &cfg.log_dir).await?;
    let mut types = TypeServiceClient::new(channel.clone());
    let mut recipients = RecipientServiceClient::new(channel.clone());
    let mut ingest = IngestServiceClient::new(channel);

    println!("== 1. register notification type order_paid (inapp, email, line, push)");
    types
        .upsert_notification_type(pb::UpsertNotificationTypeRequest {
            key: "order_paid".into(),
            priority: "high".into(),
            default_channels: vec!["inapp".into(), "email".into(), "line".into(), "push".into()],
            critical: false,
            ..Default::default()
        })
        .await?;

    println!("== 2. recipients");
    for p in &PEOPLE {
        recipients
            .upsert_recipient(pb::UpsertRecipientRequest {
                user_id: p.user_id.into(),
                display_name: p.name.into(),
                email: p.email.into(),
                line_user_id: p.line.into(),
                locale: "th-TH".into(),
                timezone: "Asia/Bangkok".into(),
            })
            .await?;
        for (platform, token) in p.devices {
            let mut request = pb::RegisterEndpointRequest {
                user_id: p.user_id.into(),
                platform: (*platform).into(),
                token: (*token).into(),
                web_push: None,
            };
            if *platform == "webpush" {
                // The browser subscribes at its push service and hands us the result.
                let sub = observed.subscribe_webpush(token).await?;
                request.token = String::new();
                request.web_push = Some(pb::WebPushSubscription {
                    endpoint: (*token).into(),
                    p256dh: sub["keys"]["p256dh"].as_str().unwrap_or_default().into(),
                    auth: sub["keys"]["auth"].as_str().unwrap_or_default().into(),
                });
            }
            recipients.register_endpoint(request).await?;
        }
        if p.email_off {
            recipients
                .set_preference(pb::SetPreferenceRequest {
                    user_id: p.user_id.into(),
                    r#type: "order_paid".into(),
                    channel: "email".into(),
                    enabled: false,
                })
                .await?;
        }
        println!(
            "  {:<8} {}  email={}{}  line={}  devices={}",
            p.user_id,
            p.name,
            p.email,
            if p.email_off { " (turned off)" } else { "" },
            if p.line.is_empty() { "-" } else { p.line },
            p.devices.len()
        );
    }

    let request = pb::CreateEventRequest {
        event_key: EVENT_KEY.into(),
        r#type: "order_paid".into(),
        actor_id: "shop-checkout".into(),
        recipients: PEOPLE.iter().map(|p| p.user_id.to_string()).collect(),
        payload: r#"{"order_id":123,"total":"1,250.00","currency":"THB"}"#.into(),
        content: Some(pb::Content {
            title: "ชำระเงินสำเร็จ คำสั่งซื้อ #123".into(),
            body: "เราได้รับชำระเงิน 1,250.00 บาท เรียบร้อยแล้ว ขอบคุณที่ใช้บริการ".into(),
            url: "https://shop.example.test/orders/123".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    println!("== 3. CreateEvent {EVENT_KEY}");
    let first = ingest.create_event(request.clone()).await?.into_inner();
    println!(
        "  event_id={} duplicate={}",
        first.event_id, first.duplicate
    );
    for c in &first.planned {
        println!("  planned {:<6} {}", c.channel, c.count);
    }
    for s in &first.skipped {
        println!("  skipped {:<8} {:<6} {}", s.user_id, s.channel, s.reason);
    }
    println!("== 4. CreateEvent {EVENT_KEY} again");
    let second = ingest.create_event(request).await?.into_inner();
    println!(
        "  event_id={} duplicate={}",
        second.event_id, second.duplicate
    );

    println!("== 5. waiting until every delivery is final");
    let started = Instant::now();
    let event = loop {
        let ev = event_by_id(&mut ingest, &first.event_id).await?;
        let open = ev
            .deliveries
            .iter()
            .filter(|d| d.status == PENDING || d.status == DeliveryStatus::Sending.as_str())
            .count();
        if open == 0 {
            break ev;
        }
        if started.elapsed() > Duration::from_secs(90) {
            bail!("{open} deliveries still not final after 90 s; see .stack/logs/demo-*.log");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!("  all final after {:.1} s", started.elapsed().as_secs_f64());

    println!("== 6. outcome per recipient x channel (read back through GetEvent)");
    println!(
        "  {:<8} {:<6} {:<8} {:<9} {:<8} detail",
        "user", "channel", "provider", "status", "attempts"
    );
    let mut rows: Vec<_> = event.deliveries.iter().collect();
    rows.sort_by_key(|d| (d.user_id.clone(), d.channel.clone()));
    for d in &rows {
        let detail = if !d.last_error.is_empty() {
            d.last_error.clone()
        } else {
            d.provider_message_id.clone()
        };
        println!(
            "  {:<8} {:<6} {:<8} {:<9} {:<8} {}",
            d.user_id, d.channel, d.provider, d.status, d.attempts, detail
        );
    }
    for s in &event.skipped {
        println!(
            "  {:<8} {:<6} {:<8} {:<9} {:<8} {}",
            s.user_id, s.channel, "-", "skipped", "-", s.reason
        );
    }

    println!("== 7. checks");
    let mut failures = Vec::new();
    check(
        !first.duplicate && second.duplicate && first.event_id == second.event_id,
        "second send: duplicate = true with the same event_id",
        &mut failures,
    );
    check(
        event.deliveries.len() == 12
            && event
                .deliveries
                .iter()
                .all(|d| d.status == SENT && d.attempts == 1),
        "12 deliveries, all sent on the first attempt",
        &mut failures,
    );
    let skipped: BTreeMap<(String, String), String> = event
        .skipped
        .iter()
        .map(|s| ((s.user_id.clone(), s.channel.clone()), s.reason.clone()))
        .collect();
    let expected_skips: BTreeMap<(String, String), String> = [
        ("somying", "line", "no_line_user_id"),
        ("wichai", "email", "opted_out"),
        ("wichai", "push", "no_push_endpoint"),
    ]
    .into_iter()
    .map(|(u, c, r)| ((u.to_string(), c.to_string()), r.to_string()))
    .collect();
    check(
        skipped == expected_skips,
        "skipped pairs and reasons as expected",
        &mut failures,
    );

    let mails: Vec<Value> = observed.mails().await?;
    let mut per_address: BTreeMap<String, usize> = BTreeMap::new();
    for m in &mails {
        for to in m["to"].as_array().into_iter().flatten() {
            *per_address
                .entry(to["address"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    let expected_mail: BTreeMap<String, usize> = [
        ("somchai@example.test".to_string(), 1),
        ("somying@example.test".to_string(), 1),
    ]
    .into();
    check(
        per_address == expected_mail,
        &format!(
            "MailDev holds exactly one email per recipient with email on (got {per_address:?})"
        ),
        &mut failures,
    );
    check(
        mails
            .iter()
            .all(|m| m["subject"] == "ชำระเงินสำเร็จ คำสั่งซื้อ #123"),
        "the Thai subject arrived intact",
        &mut failures,
    );

    let line: Vec<Value> = observed.requests("line").await?;
    let line_to: Vec<&str> = line
        .iter()
        .filter_map(|r| r["body"]["to"].as_str())
        .collect();
    let retry_keys: HashSet<&str> = line
        .iter()
        .filter_map(|r| r["headers"]["x-line-retry-key"].as_str())
        .collect();
    let mut line_sorted = line_to.clone();
    line_sorted.sort();
    check(
        line_sorted == [PEOPLE[2].line, PEOPLE[0].line] && retry_keys.len() == 2,
        "LINE: exactly one push per recipient with a LINE id, each with its own retry key",
        &mut failures,
    );
    let fcm: Vec<Value> = observed.requests("fcm").await?;
    let mut tokens: Vec<&str> = fcm
        .iter()
        .filter_map(|r| r["body"]["message"]["token"].as_str())
        .collect();
    tokens.sort();
    check(
        tokens
            == [
                "fcm-somchai-phone",
                "fcm-somchai-tablet",
                "fcm-somying-phone",
            ],
        "FCM: exactly one request per registered device",
        &mut failures,
    );
    let apns: Vec<Value> = observed.requests("apns").await?;
    check(
        apns.len() == 1
            && apns[0]["path"] == "/3/device/apns-somying-iphone"
            && apns[0]["body"]["aps"]["alert"]["title"] == "ชำระเงินสำเร็จ คำสั่งซื้อ #123",
        "APNs: one HTTP/2 request to somying's iPhone with the Thai title",
        &mut failures,
    );
    let webpush: Vec<Value> = observed.requests("webpush").await?;
    check(
        webpush.len() == 1
            && webpush[0]["status"] == 201
            && webpush[0]["body"]["endpoint"] == WEBPUSH_ENDPOINT
            && webpush[0]["body"]["payload"]["title"] == "ชำระเงินสำเร็จ คำสั่งซื้อ #123",
        "Web Push: one encrypted message to somchai's browser, decrypted intact by the push service",
        &mut failures,
    );

    let pool = sqlx::PgPool::connect(&cfg.database_url).await?;
    let inbox: Vec<(String,)> = sqlx::query_as(
        "SELECT user_id FROM notifications WHERE event_id = $1::uuid ORDER BY user_id",
    )
    .bind(&first.event_id)
    .fetch_all(&pool)
    .await?;
    let inbox: Vec<String> = inbox.into_iter().map(|r| r.0).collect();
    check(
        inbox == ["somchai", "somying", "wichai"],
        "one in-app notification per recipient",
        &mut failures,
    );

    let ids: Vec<String> = event
        .deliveries
        .iter()
        .map(|d| d.delivery_id.clone())
        .collect();
    let (what, held) = webhooks::check(hooks, &grpc, &ids).await?;
    check(held, &what, &mut failures);

    quiet_hours_part(&mut ingest, &mut recipients, &pool, &mut failures).await?;
    let inbox_link = inbox_part(cfg, &mut failures).await?;
    let card_link = line_card::run(&mut ingest, &pool, &observed, cfg, &mut failures).await?;

    println!();
    println!("Read the emails in MailDev: {}/", cfg.maildev_url);
    println!(
        "Operations console: {}/console (sign in as ops / notify-local)",
        cfg.http_url
    );
    println!("somchai's inbox (token valid 24 h): {inbox_link}");
    println!("The Thai order-paid LINE Flex card as LINE received it: {card_link}");
    println!(
        "What LINE, FCM, APNs and Web Push received: {}/_sim/requests",
        cfg.sim_url
    );
    if failures.is_empty() {
        println!("DEMO OK: every recipient x channel ended as expected.");
        Ok(true)
    } else {
        println!("DEMO FAILED: {} check(s) failed.", failures.len());
        Ok(false)
    }
}

/// Part two: นภา is inside her quiet hours (a window around the current time in
/// Asia/Bangkok). Her in-app notification arrives at once; LINE waits in Postgres until the
/// window ends, and `ExplainDelivery` says why.
async fn quiet_hours_part(
    ingest: &mut IngestServiceClient<crate::keys::Grpc>,
    recipients: &mut RecipientServiceClient<crate::keys::Grpc>,
    pool: &sqlx::PgPool,
    failures: &mut Vec<String>,
) -> anyhow::Result<()> {
    let now = chrono::Utc::now().with_timezone(&chrono_tz::Asia::Bangkok);
    let (start, end) = (
        (now - chrono::Duration::hours(1))
            .format("%H:%M")
            .to_string(),
        (now + chrono::Duration::hours(1))
            .format("%H:%M")
            .to_string(),
    );
    println!();
    println!(
        "== 8. quiet hours: napa (นภา สายชล) is quiet {start}-{end} Asia/Bangkok (it is {} there)",
        now.format("%H:%M")
    );
    recipients
        .upsert_recipient(pb::UpsertRecipientRequest {
            user_id: "napa".into(),
            display_name: "นภา สายชล".into(),
            line_user_id: "U7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d".into(),
            locale: "th-TH".into(),
            timezone: "Asia/Bangkok".into(),
            ..Default::default()
        })
        .await?;
    recipients
        .set_quiet_hours(pb::SetQuietHoursRequest {
            user_id: "napa".into(),
            windows: vec![pb::QuietWindow {
                start,
                end,
                channels: vec![],
            }],
        })
        .await?;
    let reply = ingest
        .create_event(pb::CreateEventRequest {
            event_key: "order:124:paid".into(),
            r#type: "order_paid".into(),
            recipients: vec!["napa".into()],
            content: Some(pb::Content {
                title: "ชำระเงินสำเร็จ คำสั่งซื้อ #124".into(),
                body: "เราได้รับชำระเงิน 890.00 บาท เรียบร้อยแล้ว".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    let started = Instant::now();
    let event = loop {
        let ev = event_by_id(ingest, &reply.event_id).await?;
        if ev
            .deliveries
            .iter()
            .any(|d| d.channel == INAPP && d.status == SENT)
            || started.elapsed() > Duration::from_secs(30)
        {
            break ev;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for d in &event.deliveries {
        let deferred = d
            .deferred_until
            .as_ref()
            .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
            .map(|t| {
                format!(
                    "deferred until {}",
                    t.with_timezone(&chrono_tz::Asia::Bangkok)
                        .format("%Y-%m-%d %H:%M %Z")
                )
            })
            .unwrap_or_default();
        println!(
            "  napa     {:<6} {:<8} {:<9} {deferred}",
            d.channel, d.provider, d.status
        );
    }
    let why = ingest
        .explain_delivery(pb::ExplainDeliveryRequest {
            event_id: reply.event_id.clone(),
            user_id: "napa".into(),
            channel: "line".into(),
        })
        .await?
        .into_inner();
    println!("  ExplainDelivery(napa, line):");
    for line in &why.trail {
        println!("    {line}");
    }
    let line = event
        .deliveries
        .iter()
        .find(|d| d.channel == Channel::Line.as_str());
    let inapp = event.deliveries.iter().find(|d| d.channel == INAPP);
    check(
        inapp.is_some_and(|d| d.status == SENT)
            && line.is_some_and(|d| d.status == PENDING && d.deferred_until.is_some()),
        "quiet hours: in-app sent at once, LINE deferred to the end of the window",
        failures,
    );
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox o JOIN notification_deliveries d ON d.id = o.delivery_id
         WHERE d.event_id = $1::uuid AND d.channel = 'line' AND o.available_at > now()",
    )
    .bind(&reply.event_id)
    .fetch_one(pool)
    .await?;
    check(
        waiting == 1 && why.trail.iter().any(|l| l.contains("quiet hours")),
        "the deferred LINE message waits in Postgres (outbox due at the window's end) and the explanation names quiet hours",
        failures,
    );
    Ok(())
}

/// Part three: somchai's in-app notification through the inbox API, as his app would read
/// it, and a ready-to-open link to the example inbox page. Returns the link.
async fn inbox_part(cfg: &DemoConfig, failures: &mut Vec<String>) -> anyhow::Result<String> {
    println!();
    println!(
        "== 9. somchai's inbox over HTTP ({}/v1/inbox)",
        cfg.http_url
    );
    let claims =
        serde_json::json!({"sub": "somchai", "exp": chrono::Utc::now().timestamp() + 86_400});
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(cfg.inbox_jwt_secret.as_bytes())?,
    )?;
    let http = reqwest::Client::new();
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(r) = http
            .get(format!("{}/v1/inbox/notifications", cfg.http_url))
            .bearer_auth(&token)
            .send()
            .await
            && r.status().is_success()
        {
            let page: Value = r.json().await?;
            for item in page["items"].as_array().into_iter().flatten() {
                println!(
                    "  [{}] {} · {} · {}",
                    item["group"].as_str().unwrap_or(""),
                    item["status"].as_str().unwrap_or(""),
                    item["title"].as_str().unwrap_or(""),
                    item["body"].as_str().unwrap_or("")
                );
            }
            ok = page["items"].as_array().is_some_and(|i| {
                i.iter()
                    .any(|n| n["title"] == "ชำระเงินสำเร็จ คำสั่งซื้อ #123" && n["group"] == "Today")
            });
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    check(
        ok,
        "the inbox API lists somchai's notification under Today",
        failures,
    );
    Ok(format!("{}/inbox-example/#token={token}", cfg.http_url))
}

/// The event `event_id` with its deliveries, as ingest reports it now.
async fn event_by_id(
    ingest: &mut IngestServiceClient<crate::keys::Grpc>,
    event_id: &str,
) -> anyhow::Result<pb::GetEventResponse> {
    Ok(ingest
        .get_event(pb::GetEventRequest {
            selector: Some(pb::get_event_request::Selector::EventId(
                event_id.to_string(),
            )),
            ..Default::default()
        })
        .await?
        .into_inner())
}
