//! The ingest API as a trust boundary: API keys with scopes and quotas, revocation on
//! every replica, mutual TLS, the sensitive-data guard, links and input limits.

use crate::support;

use notify_proto::v1 as pb;
use notify_store::api_keys::{self, NewApiKey};
use serde_json::json;
use std::time::{Duration, Instant};
use support::{
    Options, Platform, event_request, eventually, line_id, type_request, uniq, violations, with_key,
};
use tonic::Code;
use tonic_types::StatusExt;

async fn key(
    p: &Platform,
    name: &str,
    types: &[&str],
    manage: bool,
    rate: i32,
    max: i32,
) -> String {
    let (key, _) = api_keys::create(
        &p.pool,
        &NewApiKey {
            name: name.into(),
            send_types: types.iter().map(|t| t.to_string()).collect(),
            can_manage: manage,
            events_per_second: rate,
            max_recipients: max,
        },
    )
    .await
    .unwrap();
    key
}

/// `CreateEvent` of an `order_paid` event (key `uniq(prefix)`) for `user`, sent with
/// API key `key`: ingest's answer.
async fn send_as(
    p: &Platform,
    key: &str,
    prefix: &str,
    user: &str,
) -> Result<tonic::Response<pb::CreateEventResponse>, tonic::Status> {
    ingest(&p.grpc)
        .create_event(with_key(p.event(&uniq(prefix), "order_paid", &[user]), key))
        .await
}

fn ingest(
    ch: &tonic::transport::Channel,
) -> pb::ingest_service_client::IngestServiceClient<tonic::transport::Channel> {
    pb::ingest_service_client::IngestServiceClient::new(ch.clone())
}

/// Waits until `admin` works on `ch` (the replica's key cache got the new key).
async fn wait_key_works(ch: &tonic::transport::Channel, admin: &str) {
    let mut types = pb::type_service_client::TypeServiceClient::new(ch.clone());
    eventually("the admin key works", Duration::from_secs(5), async || {
        types
            .upsert_notification_type(with_key(type_request("order_paid", &["inapp"]), admin))
            .await
            .map(|_| ())
    })
    .await;
}

async fn setup(p: &Platform, admin: &str, types: &[(&str, &str)]) -> String {
    wait_key_works(&p.grpc, admin).await;
    let mut t = pb::type_service_client::TypeServiceClient::new(p.grpc.clone());
    for (key, sensitive) in types {
        t.upsert_notification_type(with_key(
            pb::UpsertNotificationTypeRequest {
                key: key.to_string(),
                priority: "normal".into(),
                default_channels: vec!["inapp".into(), "line".into()],
                sensitive_data: sensitive.to_string(),
                ..Default::default()
            },
            admin,
        ))
        .await
        .unwrap();
    }
    let user = uniq("u");
    pb::recipient_service_client::RecipientServiceClient::new(p.grpc.clone())
        .upsert_recipient(with_key(
            pb::UpsertRecipientRequest {
                user_id: user.clone(),
                display_name: "สมชาย".into(),
                line_user_id: line_id(),
                locale: "th-TH".into(),
                timezone: "Asia/Bangkok".into(),
                ..Default::default()
            },
            admin,
        ))
        .await
        .unwrap();
    user
}

/// The caller recorded on an event.
async fn caller_of(p: &Platform, event_id: &str) -> Option<String> {
    p.scalar(
        "SELECT caller FROM notification_events WHERE id = $1::uuid",
        event_id,
    )
    .await
}

fn secured() -> Options {
    Options {
        auth: ingest::auth::AuthMode::ApiKey,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_scoped_and_recorded_on_the_event() {
    let p = Platform::start_with(secured()).await;
    let admin = key(&p, "ops-admin", &["*"], true, 1000, 1000).await;
    let orders = key(&p, "shop-orders", &["order_*"], false, 1000, 1000).await;
    let user = setup(&p, &admin, &[("order_paid", ""), ("security_login", "")]).await;

    // In scope: accepted, and the caller is recorded.
    let ok = send_as(&p, &orders, "o", &user).await.unwrap().into_inner();
    assert_eq!(
        caller_of(&p, &ok.event_id).await.as_deref(),
        Some("shop-orders")
    );

    // Another caller's event is "not found" to a key without the manage scope.
    let other = key(&p, "forum-replies", &["forum_*"], false, 1000, 1000).await;
    let get = |k: &str| {
        let (mut c, k) = (ingest(&p.grpc), k.to_string());
        let id = ok.event_id.clone();
        async move { c.get_event(with_key(event_request(&id), &k)).await }
    };
    // (Until the replica's cache has the new key, it is unknown.)
    let code = eventually(
        "the replica knows the new key",
        Duration::from_secs(5),
        async || match get(&other).await.unwrap_err().code() {
            Code::Unauthenticated => Err(Code::Unauthenticated),
            code => Ok(code),
        },
    )
    .await;
    assert_eq!(code, Code::NotFound);
    get(&admin)
        .await
        .expect("the manage scope reads every event");

    // Out of scope: denied, nothing written.
    let key_login = uniq("login");
    let err = ingest(&p.grpc)
        .create_event(with_key(
            p.event(&key_login, "security_login", &[&user]),
            &orders,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("security_login") && err.message().contains("order_*"));
    assert!(!err.message().contains(&orders), "the key is never echoed");
    let stored: i64 = p
        .scalar(
            "SELECT count(*) FROM notification_events WHERE event_key = $1",
            &key_login,
        )
        .await;
    assert_eq!(stored, 0);

    // Managing recipients needs the manage scope.
    let err = pb::recipient_service_client::RecipientServiceClient::new(p.grpc.clone())
        .upsert_recipient(with_key(
            pb::UpsertRecipientRequest {
                user_id: uniq("u"),
                ..Default::default()
            },
            &orders,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);

    // No key, a garbage key, a malformed header: unauthenticated.
    let no_key = ingest(&p.grpc)
        .create_event(p.event(&uniq("o"), "order_paid", &[&user]))
        .await
        .unwrap_err();
    assert_eq!(no_key.code(), Code::Unauthenticated);
    let forged = format!("{}x", &orders[..orders.len() - 1]);
    for bad in [forged.as_str(), "nk_00000000_nothing"] {
        let err = ingest(&p.grpc)
            .create_event(with_key(p.event(&uniq("o"), "order_paid", &[&user]), bad))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
    }
    let mut req = tonic::Request::new(p.event(&uniq("o"), "order_paid", &[&user]));
    req.metadata_mut()
        .insert("authorization", "Basic b3BzOm9wcw==".parse().unwrap());
    assert_eq!(
        ingest(&p.grpc).create_event(req).await.unwrap_err().code(),
        Code::Unauthenticated
    );

    // Reading needs only a valid key; the health service needs none.
    ingest(&p.grpc)
        .get_event(with_key(event_request(&ok.event_id), &orders))
        .await
        .unwrap();
    let health = tonic_health::pb::health_client::HealthClient::new(p.grpc.clone())
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_denied_within_a_second_on_every_replica() {
    let mut p = Platform::start_with(secured()).await;
    let replica = p.start_ingest_replica().await;
    let admin = key(&p, "ops-admin", &["*"], true, 1000, 1000).await;
    let caller = key(&p, "shop-checkout", &["order_*"], false, 1000, 1000).await;
    let user = setup(&p, &admin, &[("order_paid", "")]).await;
    wait_key_works(&replica, &admin).await;
    for ch in [&p.grpc, &replica] {
        ingest(ch)
            .create_event(with_key(
                p.event(&uniq("o"), "order_paid", &[&user]),
                &caller,
            ))
            .await
            .unwrap();
    }

    assert!(api_keys::revoke(&p.pool, "shop-checkout").await.unwrap());
    let revoked = Instant::now();
    let mut denied_after = Vec::new();
    for ch in [&p.grpc, &replica] {
        eventually(
            "denied within 1 s of the revocation",
            Duration::from_secs(1).saturating_sub(revoked.elapsed()),
            async || {
                let r = ingest(ch)
                    .create_event(with_key(
                        p.event(&uniq("o"), "order_paid", &[&user]),
                        &caller,
                    ))
                    .await;
                match r {
                    Err(e) if e.code() == Code::Unauthenticated => Ok(()),
                    Err(e) => panic!("unexpected {e:?}"),
                    Ok(_) => Err("still accepted"),
                }
            },
        )
        .await;
        denied_after.push(revoked.elapsed());
    }
    assert!(
        denied_after.iter().all(|d| *d < Duration::from_secs(1)),
        "{denied_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_quota_is_refused_while_another_key_goes_through() {
    // The buckets refill by the platform's clock: the test moves it instead of waiting.
    let clock = ingest::clock::ManualClock::new(chrono::Utc::now());
    let p =
        Platform::start_with(secured().clock(ingest::clock::Clock::Manual(clock.clone()))).await;
    let admin = key(&p, "ops-admin", &["*"], true, 1000, 1000).await;
    let runaway = key(&p, "runaway-batch", &["order_*"], false, 5, 2).await;
    let checkout = key(&p, "shop-checkout", &["order_*"], false, 50, 1000).await;
    let user = setup(&p, &admin, &[("order_paid", "")]).await;

    // The runaway key spends its burst of 5, then is refused with a retry delay ...
    let mut refused = None;
    for i in 0..20 {
        match ingest(&p.grpc)
            .create_event(with_key(
                p.event(&uniq(&format!("r{i}")), "order_paid", &[&user]),
                &runaway,
            ))
            .await
        {
            Ok(_) => {}
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let (accepted, err) = refused.expect("the runaway key was never refused");
    // The clock stands still: the burst of 5 and nothing refilled.
    assert_eq!(accepted, 5, "refused after {accepted} events");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let details = err.get_error_details();
    let retry = details.retry_info().expect("RetryInfo detail");
    let delay = retry.retry_delay.expect("a retry delay");
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_millis(250),
        "{delay:?}"
    );
    let quota = details.quota_failure().expect("QuotaFailure detail");
    assert_eq!(quota.violations[0].subject, "api_key:runaway-batch");

    // ... while the other key, at the same moment, is served.
    send_as(&p, &checkout, "c", &user)
        .await
        .expect("another key is not starved");

    // Just before the announced delay the runaway key is still refused; after it, it may
    // send again.
    clock.advance(chrono::Duration::from_std(delay).unwrap() - chrono::Duration::milliseconds(5));
    let early = send_as(&p, &runaway, "early", &user).await.unwrap_err();
    assert_eq!(early.code(), Code::ResourceExhausted, "{early:?}");
    clock.advance(chrono::Duration::milliseconds(10));
    send_as(&p, &runaway, "r", &user)
        .await
        .expect("allowed again after the retry delay");

    // Recipients per event: over the key's limit of 2.
    let others: Vec<String> = (0..3).map(|_| uniq("u")).collect();
    let refs: Vec<&str> = others.iter().map(String::as_str).collect();
    // A refilled token, so that the refusal below is for the recipients, not the rate.
    clock.advance(chrono::Duration::milliseconds(250));
    let err = ingest(&p.grpc)
        .create_event(with_key(
            p.event(&uniq("many"), "order_paid", &refs),
            &runaway,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("at most 2"), "{}", err.message());
    assert!(err.get_error_details().retry_info().is_none());
}

/// A CA, a server certificate for 127.0.0.1 and client certificates, made with openssl.
struct Pki {
    dir: std::path::PathBuf,
}

/// `openssl req` arguments for a new, unencrypted P-256 key, written to the file named next.
const NEW_P256_KEY: [&str; 6] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
    "-keyout",
];

impl Pki {
    fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!("notify-pki-{}", uniq("t")));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        pki.run(
            &[
                &["req", "-x509"][..],
                &NEW_P256_KEY,
                &[
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=notify-test-ca",
                ],
            ]
            .concat(),
        );
        pki.issue(
            "server",
            "localhost",
            Some("subjectAltName=DNS:localhost,IP:127.0.0.1"),
        );
        pki
    }

    fn run(&self, args: &[&str]) {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Issues `<name>.pem` / `<name>.key` with subject CN `cn`, signed by the CA.
    fn issue(&self, name: &str, cn: &str, ext: Option<&str>) {
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        let subject = format!("/CN={cn}");
        self.run(
            &[
                &["req"][..],
                &NEW_P256_KEY,
                &[key.as_str(), "-out", &csr, "-subj", &subject],
            ]
            .concat(),
        );
        let ext_file = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&ext_file),
            ext.unwrap_or("extendedKeyUsage=clientAuth"),
        )
        .unwrap();
        self.run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "1",
            "-extfile",
            &ext_file,
        ]);
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn tls_channel(
    p: &Platform,
    pki: &Pki,
    client: Option<&str>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let mut tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pki.read("ca.pem")))
        .domain_name("localhost");
    if let Some(name) = client {
        tls = tls.identity(tonic::transport::Identity::from_pem(
            pki.read(&format!("{name}.pem")),
            pki.read(&format!("{name}.key")),
        ));
    }
    tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{}", p.grpc_addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_names_the_caller_by_its_certificate() {
    let pki = Pki::new();
    pki.issue("checkout", "shop-checkout", None);
    pki.issue("stranger", "nobody-we-know", None);
    let p = Platform::start_with(Options {
        auth: ingest::auth::AuthMode::ClientCert,
        tls: Some(ingest::TlsFiles {
            cert: pki.read("server.pem"),
            key: pki.read("server.key"),
            client_ca: Some(pki.read("ca.pem")),
        }),
        workers: vec![],
        ..Default::default()
    })
    .await;
    key(&p, "shop-checkout", &["*"], true, 1000, 1000).await;
    let ch = tls_channel(&p, &pki, Some("checkout"))
        .await
        .expect("TLS with a client certificate");
    let mut types = pb::type_service_client::TypeServiceClient::new(ch.clone());
    eventually(
        "the certificate's caller accepted",
        Duration::from_secs(5),
        async || {
            types
                .upsert_notification_type(type_request("order_paid", &["inapp"]))
                .await
                .map(|_| ())
        },
    )
    .await;
    let ev = ingest(&ch)
        .create_event(p.event(&uniq("o"), "order_paid", &[&uniq("u")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        caller_of(&p, &ev.event_id).await.as_deref(),
        Some("shop-checkout")
    );

    // A certificate from our CA naming no caller: unauthenticated.
    let stranger = tls_channel(&p, &pki, Some("stranger")).await.unwrap();
    let err = ingest(&stranger)
        .create_event(p.event(&uniq("o"), "order_paid", &[&uniq("u")]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");

    // No certificate: the TLS handshake itself is refused.
    let anonymous = match tls_channel(&p, &pki, None).await {
        Err(_) => None,
        Ok(ch) => Some(
            ingest(&ch)
                .create_event(p.event(&uniq("o"), "order_paid", &[&uniq("u")]))
                .await
                .unwrap_err(),
        ),
    };
    if let Some(err) = anonymous {
        // The server ends the handshake; the client sees the connection close.
        assert!(
            matches!(
                err.code(),
                Code::Unavailable | Code::Unknown | Code::Cancelled
            ),
            "{err:?}"
        );
    }
}

/// The violations (field, description) of `CreateEvent` for `req` sent with `key`,
/// which must refuse it as `INVALID_ARGUMENT`.
async fn refusal(p: &Platform, req: pb::CreateEventRequest, key: &str) -> Vec<(String, String)> {
    violations(
        &ingest(&p.grpc)
            .create_event(with_key(req, key))
            .await
            .unwrap_err(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensitive_data_is_rejected_by_default_and_masked_when_the_type_says_so() {
    // Callers are not authenticated here: the guard applies to every caller alike.
    let p =
        Platform::start_with_workers(&[notify_core::Channel::Line, notify_core::Channel::InApp])
            .await;
    let admin = key(&p, "ops-admin", &["*"], true, 1000, 1000).await;
    let user = setup(&p, &admin, &[("kyc_check", ""), ("order_paid", "mask")]).await;
    // A valid Thai id (check digit 8), with dashes, nested; a card with spaces in Thai text.
    let payload = json!({
        "order_id": 1001,
        "customer": {"name": "สมชาย", "documents": [{"id_card": "1-1037-00123-45-8"}]},
        "login": {"password": "hunter2"},
    });
    let mut req = p.event(&uniq("kyc"), "kyc_check", &[&user]);
    req.payload = payload.to_string();
    req.content.as_mut().unwrap().body = "ชำระด้วยบัตร 4111 1111 1111 1111 เรียบร้อย".into();
    let event_key = req.event_key.clone();
    let err = ingest(&p.grpc)
        .create_event(with_key(req, &admin))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let v = violations(&err);
    let fields: Vec<&str> = v.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "payload.customer.documents[0].id_card",
            "payload.login.password",
            "content.body"
        ]
    );
    assert!(v[0].1.contains("Thai national id"), "{v:?}");
    assert!(v[2].1.contains("payment card"), "{v:?}");
    for leaked in ["1037-00123", "4111", "hunter2"] {
        assert!(
            !format!("{err:?}").contains(leaked),
            "the value {leaked} was echoed"
        );
    }
    let stored: i64 = p
        .scalar(
            "SELECT count(*) FROM notification_events WHERE event_key = $1",
            &event_key,
        )
        .await;
    assert_eq!(stored, 0, "nothing is stored on reject");

    // Other spellings are found too, and identifiers may never carry an id.
    let mut req = p.event(&uniq("kyc"), "kyc_check", &[&user]);
    req.payload = json!({"doc": "1.1037.00123.45.8", "pass": ["x"]}).to_string();
    let v = refusal(&p, req, &admin).await;
    let fields: Vec<&str> = v.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["payload.doc", "payload.pass"]);
    let mut req = p.event("citizen:1103700123458", "order_paid", &[&user]);
    req.payload = "{}".into();
    let v = refusal(&p, req, &admin).await;
    assert_eq!(v[0].0, "event_key", "{v:?}");
    assert!(!v[0].1.contains("1103700123458"));
    // Encoded in HTML, on a type that masks: masking cannot reach it, so it is refused.
    let mut req = p.event(&uniq("paid"), "order_paid", &[&user]);
    req.content.as_mut().unwrap().email_html = "<p>&#49;103700<b>123458</b></p>".into();
    let v = refusal(&p, req, &admin).await;
    assert_eq!(v[0].0, "content.email_html", "{v:?}");

    // Lookalikes pass: a wrong check digit, a card number failing Luhn, an order number.
    let mut req = p.event(&uniq("kyc"), "kyc_check", &[&user]);
    req.payload = json!({"ref": "1-1037-00123-45-7", "card": "4111 1111 1111 1112", "order": 1001})
        .to_string();
    ingest(&p.grpc)
        .create_event(with_key(req, &admin))
        .await
        .unwrap();

    // The mask policy stores (and sends) a masked copy.
    let mut req = p.event(&uniq("paid"), "order_paid", &[&user]);
    req.payload = payload.to_string();
    req.content.as_mut().unwrap().body = "ชำระด้วยบัตร 4111 1111 1111 1111 เรียบร้อย".into();
    let ev = ingest(&p.grpc)
        .create_event(with_key(req, &admin))
        .await
        .unwrap()
        .into_inner();
    let (stored_payload, stored_content): (serde_json::Value, serde_json::Value) = p
        .row(
            "SELECT payload_json, content_json FROM notification_events WHERE id = $1::uuid",
            &ev.event_id,
        )
        .await;
    assert_eq!(
        stored_payload["customer"]["documents"][0]["id_card"],
        "X-XXXX-XXXX3-45-8"
    );
    assert_eq!(stored_payload["login"]["password"], "[REDACTED]");
    assert_eq!(
        stored_content["body"],
        "ชำระด้วยบัตร XXXX XXXX XXXX 1111 เรียบร้อย"
    );
    p.wait_final(&ev.event_id, 30).await;
    // (The lookalike event above is sent too, in either order.)
    let sent = p.sim_requests("line").await;
    let text = sent
        .iter()
        .map(|r| r.to_string())
        .find(|t| t.contains("ชำระด้วยบัตร"))
        .expect("the masked event's LINE push");
    assert!(
        text.contains("XXXX XXXX XXXX 1111") && !text.contains("4111 1111"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_must_be_https_and_oversized_or_deep_input_is_refused() {
    let p = Platform::start_with_type(&[], "order_paid", &["inapp"]).await;
    let user = p.add_bare_recipient("u").await;
    let send = |req: pb::CreateEventRequest| {
        let mut c = p.ingest();
        async move { c.create_event(req).await }
    };
    for (url, payload) in [
        ("http://shop.example.test/orders/1", json!({})),
        ("javascript:alert(1)", json!({})),
        (
            "https://shop.example.test/ok",
            json!({"tracking_url": "data:text/html,<script>alert(1)</script>"}),
        ),
        (
            "https://shop.example.test/ok",
            json!({"links": [{"url": "http://evil.example/"}]}),
        ),
        (
            "https://shop.example.test/ok",
            json!({"imageUrl": "javascript:alert(1)"}),
        ),
        (
            "https://shop.example.test/ok",
            json!({"deep_link": ["javascript:alert(1)"]}),
        ),
        ("http://evil.example\\@localhost/", json!({})),
        ("https://user:hunter2@shop.example.test/", json!({})),
        ("https://", json!({})),
    ] {
        let mut req = p.event(&uniq("link"), "order_paid", &[&user]);
        req.content.as_mut().unwrap().url = url.into();
        req.payload = payload.to_string();
        let err = send(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{url} {payload}");
        let v = violations(&err);
        assert!(
            v.iter()
                .any(|(f, d)| (f == "content.url" || f.starts_with("payload."))
                    && (d.contains("https") || d.contains("host"))),
            "{v:?}"
        );
    }
    // Words that merely contain "uri" or "link" are not links.
    let mut req = p.event(&uniq("words"), "order_paid", &[&user]);
    req.payload =
        json!({"security_level": "high", "unlinked_items": "3", "image_url": ""}).to_string();
    send(req).await.expect("not links");

    // 40 levels of nesting.
    let mut deep = json!("x");
    for _ in 0..40 {
        deep = json!({ "a": deep });
    }
    let mut req = p.event(&uniq("deep"), "order_paid", &[&user]);
    req.payload = deep.to_string();
    let err = send(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(violations(&err)[0].1.contains("deeper than 16"), "{err:?}");

    // A 2 MiB request: over the gRPC message limit (1 MiB), refused before decoding.
    let mut req = p.event(&uniq("big"), "order_paid", &[&user]);
    req.content.as_mut().unwrap().email_html = "ก".repeat(700_000);
    let err = send(req).await.unwrap_err();
    assert!(err.code() == Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("too large"), "{}", err.message());
}

/// GetEvent by key as `k`.
async fn get_by_key(
    p: &Platform,
    k: &str,
    event_key: &str,
) -> Result<pb::GetEventResponse, tonic::Status> {
    ingest(&p.grpc)
        .get_event(with_key(
            pb::GetEventRequest {
                selector: Some(pb::get_event_request::Selector::EventKey(event_key.into())),
                ..Default::default()
            },
            k,
        ))
        .await
        .map(|r| r.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_callers_with_one_event_key_each_get_their_own_event_and_learn_nothing_of_the_other() {
    let p = Platform::start_with(secured()).await;
    let admin = key(&p, "ops-admin", &["*"], true, 1000, 1000).await;
    let a = key(&p, "shop-orders", &["order_*"], false, 1000, 1000).await;
    let b = key(&p, "forum-replies", &["order_*"], false, 1000, 1000).await;
    let user = setup(&p, &admin, &[("order_paid", "")]).await;
    // A type with a dedup window: its keys are stored as `<key>|dedup@<bucket>`.
    pb::type_service_client::TypeServiceClient::new(p.grpc.clone())
        .upsert_notification_type(with_key(
            pb::UpsertNotificationTypeRequest {
                key: "order_windowed".into(),
                priority: "normal".into(),
                default_channels: vec!["inapp".into()],
                dedup_window_seconds: 3600,
                ..Default::default()
            },
            &admin,
        ))
        .await
        .unwrap();
    let create = |k: &str, req: pb::CreateEventRequest| {
        let k = k.to_string();
        let mut c = ingest(&p.grpc);
        async move {
            c.create_event(with_key(req, &k))
                .await
                .map(|r| r.into_inner())
        }
    };
    // (Until the replica's cache has the new keys, they are unknown.)
    for k in [&a, &b] {
        eventually(
            "the key works",
            Duration::from_secs(5),
            async || match get_by_key(&p, k, "none").await {
                Err(e) if e.code() == Code::NotFound => Ok(()),
                other => Err(other.map(|_| ())),
            },
        )
        .await;
    }

    for type_key in ["order_paid", "order_windowed"] {
        let event_key = uniq("order-1001");
        let same = p.event(&event_key, type_key, &[&user]);
        let first_a = create(&a, same.clone()).await.unwrap();
        assert!(!first_a.duplicate);
        let a_ids: Vec<String> = std::iter::once(first_a.event_id.clone())
            .chain(first_a.deliveries.iter().map(|d| d.delivery_id.clone()))
            .collect();
        let learns_nothing_of_a = |what: &str, text: String| {
            for id in &a_ids {
                assert!(
                    !text.contains(id.as_str()),
                    "{type_key}: {what} names A's {id}: {text}"
                );
            }
        };

        // B, the very same request: a new event of B's own, recorded and planned.
        let first_b = create(&b, same.clone()).await.unwrap();
        assert!(
            !first_b.duplicate,
            "{type_key}: B's event was taken for A's"
        );
        assert_ne!(first_b.event_id, first_a.event_id);
        assert_eq!(first_b.deliveries.len(), first_a.deliveries.len());
        learns_nothing_of_a("B's answer", format!("{first_b:?}"));
        assert_eq!(
            caller_of(&p, &first_b.event_id).await.as_deref(),
            Some("forum-replies")
        );

        // B, A's key with other content (a key only A has used): new, not ALREADY_EXISTS.
        let only_a = uniq("order-1002");
        create(&a, p.event(&only_a, type_key, &[&user]))
            .await
            .unwrap();
        let mut other = p.event(&only_a, type_key, &[&user]);
        other.payload = r#"{"order_id":9999}"#.into();
        let probe = create(&b, other).await;
        let probe = probe.unwrap_or_else(|e| panic!("{type_key}: B probed A's key: {e:?}"));
        assert!(!probe.duplicate);
        // ... and GetEvent by a key only A has is "not found" to B.
        let only_a_2 = uniq("order-1003");
        create(&a, p.event(&only_a_2, type_key, &[&user]))
            .await
            .unwrap();
        let err = get_by_key(&p, &b, &only_a_2).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{type_key}");
        learns_nothing_of_a("B's not found", format!("{err:?}"));

        // Each caller's replay is a duplicate of its own event.
        let again_a = create(&a, same.clone()).await.unwrap();
        assert!(again_a.duplicate);
        assert_eq!(again_a.event_id, first_a.event_id);
        let again_b = create(&b, same.clone()).await.unwrap();
        assert!(again_b.duplicate);
        assert_eq!(again_b.event_id, first_b.event_id);
        learns_nothing_of_a("B's replay", format!("{again_b:?}"));
        // Other content under B's key names B's event only.
        let mut changed = same.clone();
        changed.payload = r#"{"order_id":4242}"#.into();
        let err = create(&b, changed).await.unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists);
        assert!(err.message().contains(&first_b.event_id), "{err:?}");
        learns_nothing_of_a("B's conflict", format!("{err:?}"));

        // GetEvent by key looks in the caller's own namespace.
        assert_eq!(
            get_by_key(&p, &a, &event_key).await.unwrap().event_id,
            first_a.event_id
        );
        let got_b = get_by_key(&p, &b, &event_key).await.unwrap();
        assert_eq!(got_b.event_id, first_b.event_id);
        learns_nothing_of_a("B's GetEvent", format!("{got_b:?}"));
        // A key that may manage reads any caller's event by key.
        let got = get_by_key(&p, &admin, &event_key).await.unwrap();
        assert!([&first_a.event_id, &first_b.event_id].contains(&&got.event_id));
    }
}

/// The migration to caller-scoped keys keeps existing events: a replay by the caller that
/// sent one is still a duplicate of it (events from before callers were recorded belong to
/// the shared caller), while another caller's same key is a new event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_from_before_keys_were_scoped_stay_duplicates_for_their_caller() {
    use notify_core::event::CreateEventInput;
    use notify_store::events::{self, SHARED_CALLER};
    let stack = support::Stack::get();
    let admin = sqlx::PgPool::connect(&stack.admin_db_url).await.unwrap();
    let db_name = format!(
        "notify_t_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db_name}")))
        .execute(&admin)
        .await
        .unwrap();
    let db_url = format!(
        "{}/{db_name}",
        stack.admin_db_url.rsplit_once('/').unwrap().0
    );
    let pool = sqlx::PgPool::connect(&db_url).await.unwrap();
    // The schema as it was before this migration.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    sqlx::migrate::Migrator::new(dir)
        .await
        .unwrap()
        .run_to(20261201000016, &pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO notification_types (key, default_channels) VALUES ('order_paid', '{inapp}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let event = |key: &str, caller: Option<&str>| {
        let mut e = notify_core::NewEvent::parse(CreateEventInput {
            event_key: key.into(),
            type_key: "order_paid".into(),
            actor_id: String::new(),
            recipients: vec!["u1".into()],
            payload: String::new(),
            content: notify_core::Content {
                title: "paid".into(),
                ..Default::default()
            },
            ..Default::default()
        })
        .unwrap();
        e.caller = caller.map(str::to_string);
        e
    };
    let (legacy, recorded) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    for (id, key, caller) in [
        (legacy, "before-callers", None),
        (recorded, "sent-by-shop", Some("shop-orders")),
    ] {
        let e = event(key, caller);
        sqlx::query(
            "INSERT INTO notification_events
                 (id, event_key, type, recipients, payload_json, content_json, channels,
                  fingerprint, caller)
             VALUES ($1, $2, 'order_paid', '{u1}', '{}', $3, '{inapp}', $4, $5)",
        )
        .bind(id)
        .bind(key)
        .bind(serde_json::to_value(&e.content).unwrap())
        .bind(e.fingerprint().to_vec())
        .bind(caller)
        .execute(&pool)
        .await
        .unwrap();
    }

    notify_store::migrate(&pool).await.unwrap();

    let mut conn = pool.acquire().await.unwrap();
    let inapp = [notify_core::Channel::InApp];
    for (key, caller, id) in [
        ("before-callers", None, legacy),
        ("sent-by-shop", Some("shop-orders"), recorded),
    ] {
        let e = event(key, caller);
        let found =
            events::insert_event_or_get_existing(&mut conn, uuid::Uuid::now_v7(), &e, &inapp)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{key}: a replay by its caller made a new event"));
        assert_eq!(found.id, id, "{key}");
        assert_eq!(found.fingerprint, e.fingerprint().to_vec(), "{key}");
    }
    let owner: String = sqlx::query_scalar("SELECT caller FROM notification_events WHERE id = $1")
        .bind(legacy)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(owner, SHARED_CALLER);
    // Another caller's same key: a new event of its own.
    let e = event("sent-by-shop", Some("forum-replies"));
    let other = events::insert_event_or_get_existing(&mut conn, uuid::Uuid::now_v7(), &e, &inapp)
        .await
        .unwrap();
    assert_eq!(other, None);
    // No key may take the shared caller's name.
    let taken = api_keys::create(
        &pool,
        &NewApiKey {
            name: SHARED_CALLER.into(),
            send_types: vec!["*".into()],
            can_manage: false,
            events_per_second: 10,
            max_recipients: 10,
        },
    )
    .await;
    assert!(taken.is_err(), "a key named {SHARED_CALLER:?} was created");
    drop(conn);
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {db_name}")))
        .execute(&admin)
        .await
        .unwrap();
}

/// Every method but health goes through the one authenticate-then-call wrapper: each of
/// the 13 refuses a call without a key, and each method that changes recipients, types
/// or topics refuses a key that may not manage, before looking at the request (the
/// requests here are empty, so a handler that ran first would answer INVALID_ARGUMENT).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_authenticates_and_manage_methods_refuse_a_sending_key() {
    use pb::recipient_service_client::RecipientServiceClient as Recipients;
    use pb::topic_service_client::TopicServiceClient as Topics;
    use pb::type_service_client::TypeServiceClient as Types;
    let p = Platform::start_with(secured()).await;
    let admin = key(&p, "ops-admin", &["*"], true, 1000, 1000).await;
    let sender = key(&p, "shop-orders", &["order_*"], false, 1000, 1000).await;
    wait_key_works(&p.grpc, &admin).await;
    let ch = &p.grpc;
    // (method, needs manage, the code for this key or none)
    let codes = async |key: Option<&str>| -> Vec<(&'static str, bool, Code)> {
        vec![
            (
                "CreateEvent",
                false,
                code_of(ingest(ch).create_event(req(Default::default(), key)).await),
            ),
            (
                "GetEvent",
                false,
                code_of(ingest(ch).get_event(req(Default::default(), key)).await),
            ),
            (
                "ExplainDelivery",
                false,
                code_of(
                    ingest(ch)
                        .explain_delivery(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "UpsertRecipient",
                true,
                code_of(
                    Recipients::new(ch.clone())
                        .upsert_recipient(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "RegisterEndpoint",
                true,
                code_of(
                    Recipients::new(ch.clone())
                        .register_endpoint(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "RevokeEndpoint",
                true,
                code_of(
                    Recipients::new(ch.clone())
                        .revoke_endpoint(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "SetPreference",
                true,
                code_of(
                    Recipients::new(ch.clone())
                        .set_preference(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "GetPreferences",
                true,
                code_of(
                    Recipients::new(ch.clone())
                        .get_preferences(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "SetQuietHours",
                true,
                code_of(
                    Recipients::new(ch.clone())
                        .set_quiet_hours(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "CreateTopic",
                true,
                code_of(
                    Topics::new(ch.clone())
                        .create_topic(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "Subscribe",
                true,
                code_of(
                    Topics::new(ch.clone())
                        .subscribe(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "Unsubscribe",
                true,
                code_of(
                    Topics::new(ch.clone())
                        .unsubscribe(req(Default::default(), key))
                        .await,
                ),
            ),
            (
                "UpsertNotificationType",
                true,
                code_of(
                    Types::new(ch.clone())
                        .upsert_notification_type(req(Default::default(), key))
                        .await,
                ),
            ),
        ]
    };
    for (method, _, code) in codes(None).await {
        assert_eq!(code, Code::Unauthenticated, "{method} without a key");
    }
    for (method, manage, code) in codes(Some(&sender)).await {
        if manage {
            assert_eq!(code, Code::PermissionDenied, "{method} with a sending key");
        } else {
            // Authenticated; CreateEvent then checks the (empty) type against the key's
            // scope, the read methods let the key through.
            assert_ne!(code, Code::Unauthenticated, "{method} with a sending key");
        }
    }
    for (method, _, code) in codes(Some(&admin)).await {
        assert_ne!(code, Code::Unauthenticated, "{method} with the admin key");
        assert_ne!(code, Code::PermissionDenied, "{method} with the admin key");
    }
}

/// `msg` with `key` as the bearer token, or with no credentials.
fn req<T>(msg: T, key: Option<&str>) -> tonic::Request<T> {
    match key {
        Some(k) => with_key(msg, k),
        None => tonic::Request::new(msg),
    }
}

/// The status code of a call's outcome (`Ok` for an answer).
fn code_of<R>(res: Result<tonic::Response<R>, tonic::Status>) -> Code {
    res.map_or_else(|s| s.code(), |_| Code::Ok)
}
