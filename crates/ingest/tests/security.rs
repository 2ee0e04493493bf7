//! The ingest API as a trust boundary: API keys with scopes and quotas, revocation on
//! every replica, mutual TLS, the sensitive-data guard, links and input limits.

mod support;

use notify_proto::v1 as pb;
use notify_store::api_keys::{self, NewApiKey};
use serde_json::json;
use std::time::{Duration, Instant};
use support::{Options, Platform, line_id, uniq};
use tonic::Code;
use tonic_types::StatusExt;

fn with_key<T>(msg: T, key: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    req
}

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

fn ingest(
    ch: &tonic::transport::Channel,
) -> pb::ingest_service_client::IngestServiceClient<tonic::transport::Channel> {
    pb::ingest_service_client::IngestServiceClient::new(ch.clone())
}

/// Waits until `admin` works on `ch` (the replica's key cache got the new key).
async fn wait_key_works(ch: &tonic::transport::Channel, admin: &str) {
    let mut types = pb::type_service_client::TypeServiceClient::new(ch.clone());
    for _ in 0..100 {
        let r = types
            .upsert_notification_type(with_key(
                pb::UpsertNotificationTypeRequest {
                    key: "order_paid".into(),
                    priority: "normal".into(),
                    default_channels: vec!["inapp".into()],
                    ..Default::default()
                },
                admin,
            ))
            .await;
        if r.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the admin key never worked");
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
    sqlx::query_scalar("SELECT caller FROM notification_events WHERE id = $1::uuid")
        .bind(event_id)
        .fetch_one(&p.pool)
        .await
        .unwrap()
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
    let ok = ingest(&p.grpc)
        .create_event(with_key(
            p.event(&uniq("o"), "order_paid", &[&user]),
            &orders,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        caller_of(&p, &ok.event_id).await.as_deref(),
        Some("shop-orders")
    );

    // Another caller's event is "not found" to a key without the manage scope.
    let other = key(&p, "forum-replies", &["forum_*"], false, 1000, 1000).await;
    let get = |k: &str| {
        let (mut c, k) = (ingest(&p.grpc), k.to_string());
        let id = ok.event_id.clone();
        async move {
            c.get_event(with_key(
                pb::GetEventRequest {
                    selector: Some(pb::get_event_request::Selector::EventId(id)),
                    ..Default::default()
                },
                &k,
            ))
            .await
        }
    };
    // (Until the replica's cache has the new key, it is unknown.)
    let mut code = Code::Unauthenticated;
    for _ in 0..100 {
        code = get(&other).await.unwrap_err().code();
        if code != Code::Unauthenticated {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM notification_events WHERE event_key = $1")
            .bind(&key_login)
            .fetch_one(&p.pool)
            .await
            .unwrap();
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
        .get_event(with_key(
            pb::GetEventRequest {
                selector: Some(pb::get_event_request::Selector::EventId(
                    ok.event_id.clone(),
                )),
                ..Default::default()
            },
            &orders,
        ))
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
    p.stop().await;
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
        loop {
            let r = ingest(ch)
                .create_event(with_key(
                    p.event(&uniq("o"), "order_paid", &[&user]),
                    &caller,
                ))
                .await;
            match r {
                Err(e) if e.code() == Code::Unauthenticated => break,
                Err(e) => panic!("unexpected {e:?}"),
                Ok(_) => {
                    assert!(
                        revoked.elapsed() < Duration::from_secs(1),
                        "still accepted after 1 s"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        denied_after.push(revoked.elapsed());
    }
    assert!(
        denied_after.iter().all(|d| *d < Duration::from_secs(1)),
        "{denied_after:?}"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_quota_is_refused_while_another_key_goes_through() {
    let p = Platform::start_with(secured()).await;
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
    // A burst of 5, plus what refilled (one per 200 ms) while they were sent.
    assert!(
        (5..=10).contains(&accepted),
        "refused after {accepted} events"
    );
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
    ingest(&p.grpc)
        .create_event(with_key(
            p.event(&uniq("c"), "order_paid", &[&user]),
            &checkout,
        ))
        .await
        .expect("another key is not starved");

    // After the delay the runaway key may send again.
    tokio::time::sleep(delay + Duration::from_millis(20)).await;
    ingest(&p.grpc)
        .create_event(with_key(
            p.event(&uniq("r"), "order_paid", &[&user]),
            &runaway,
        ))
        .await
        .expect("allowed again after the retry delay");

    // Recipients per event: over the key's limit of 2.
    let others: Vec<String> = (0..3).map(|_| uniq("u")).collect();
    let refs: Vec<&str> = others.iter().map(String::as_str).collect();
    tokio::time::sleep(Duration::from_millis(250)).await;
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
    p.stop().await;
}

/// A CA, a server certificate for 127.0.0.1 and client certificates, made with openssl.
struct Pki {
    dir: std::path::PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!("notify-pki-{}", uniq("t")));
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        pki.run(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=notify-test-ca",
        ]);
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
        self.run(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={cn}"),
        ]);
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
    let mut ok = false;
    for _ in 0..100 {
        let r = types
            .upsert_notification_type(pb::UpsertNotificationTypeRequest {
                key: "order_paid".into(),
                priority: "normal".into(),
                default_channels: vec!["inapp".into()],
                ..Default::default()
            })
            .await;
        if r.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "the certificate's caller was never accepted");
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
    p.stop().await;
}

fn violations(err: &tonic::Status) -> Vec<(String, String)> {
    err.get_error_details()
        .bad_request()
        .map(|b| {
            b.field_violations
                .iter()
                .map(|v| (v.field.clone(), v.description.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensitive_data_is_rejected_by_default_and_masked_when_the_type_says_so() {
    // Callers are not authenticated here: the guard applies to every caller alike.
    let p = Platform::start_with(Options {
        workers: vec![notify_core::Channel::Line, notify_core::Channel::InApp],
        ..Default::default()
    })
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
    let stored: i64 =
        sqlx::query_scalar("SELECT count(*) FROM notification_events WHERE event_key = $1")
            .bind(&event_key)
            .fetch_one(&p.pool)
            .await
            .unwrap();
    assert_eq!(stored, 0, "nothing is stored on reject");

    // Other spellings are found too, and identifiers may never carry an id.
    let mut req = p.event(&uniq("kyc"), "kyc_check", &[&user]);
    req.payload = json!({"doc": "1.1037.00123.45.8", "pass": ["x"]}).to_string();
    let v = violations(
        &ingest(&p.grpc)
            .create_event(with_key(req, &admin))
            .await
            .unwrap_err(),
    );
    let fields: Vec<&str> = v.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["payload.doc", "payload.pass"]);
    let mut req = p.event("citizen:1103700123458", "order_paid", &[&user]);
    req.payload = "{}".into();
    let v = violations(
        &ingest(&p.grpc)
            .create_event(with_key(req, &admin))
            .await
            .unwrap_err(),
    );
    assert_eq!(v[0].0, "event_key", "{v:?}");
    assert!(!v[0].1.contains("1103700123458"));
    // Encoded in HTML, on a type that masks: masking cannot reach it, so it is refused.
    let mut req = p.event(&uniq("paid"), "order_paid", &[&user]);
    req.content.as_mut().unwrap().email_html = "<p>&#49;103700<b>123458</b></p>".into();
    let v = violations(
        &ingest(&p.grpc)
            .create_event(with_key(req, &admin))
            .await
            .unwrap_err(),
    );
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
    let (stored_payload, stored_content): (serde_json::Value, serde_json::Value) = sqlx::query_as(
        "SELECT payload_json, content_json FROM notification_events WHERE id = $1::uuid",
    )
    .bind(&ev.event_id)
    .fetch_one(&p.pool)
    .await
    .unwrap();
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
    let sent = p.sim_requests("line").await;
    let text = sent.last().unwrap().to_string();
    assert!(
        text.contains("XXXX XXXX XXXX 1111") && !text.contains("4111 1111"),
        "{text}"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_must_be_https_and_oversized_or_deep_input_is_refused() {
    let p = Platform::start_with(Options {
        workers: vec![],
        ..Default::default()
    })
    .await;
    p.add_type("order_paid", &["inapp"]).await;
    let user = uniq("u");
    p.add_recipient(&user, "", "", "").await;
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
    p.stop().await;
}
