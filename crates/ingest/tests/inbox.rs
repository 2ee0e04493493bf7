//! The end users' inbox API over HTTP: authentication, isolation between users, listing
//! with cursors and group labels, read/unread/archive, race-free read-all, live updates
//! over Server-Sent Events with resume, bad input, rate limit, and the OpenAPI file.

mod support;

use futures_util::StreamExt;
use notify_core::Channel;
use serde_json::{Value, json};
use std::time::Duration;
use support::{Options, Platform, uniq};

fn token(user: &str, secret: &str, exp_in: i64) -> String {
    let claims = json!({"sub": user, "exp": chrono::Utc::now().timestamp() + exp_in});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

struct Client<'a> {
    p: &'a Platform,
    token: String,
}

impl Client<'_> {
    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .p
            .http
            .get(format!("{}{path}", self.p.http_url))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .p
            .http
            .post(format!("{}{path}", self.p.http_url))
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }
}

async fn inapp_platform() -> Platform {
    Platform::start_with(Options {
        workers: vec![Channel::InApp],
        ..Default::default()
    })
    .await
}

async fn notify(p: &Platform, key: &str, user: &str, title: &str) {
    let mut req = p.event(key, "news", &[user]);
    req.content.as_mut().unwrap().title = title.into();
    let ev = p.ingest().create_event(req).await.unwrap().into_inner();
    p.wait_final(&ev.event_id, 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_see_and_change_only_their_own_notifications() {
    let p = inapp_platform().await;
    p.add_type("news", &["inapp"]).await;
    let (a, b) = (uniq("a"), uniq("b"));
    for u in [&a, &b] {
        p.add_recipient(u, "", "", "").await;
    }
    for n in 1..=3 {
        notify(&p, &format!("n{n}"), &a, &format!("ข่าวที่ {n}")).await;
    }
    notify(&p, "nb", &b, "for b").await;
    let ca = Client {
        p: &p,
        token: token(&a, support::INBOX_SECRET, 300),
    };
    let cb = Client {
        p: &p,
        token: token(&b, support::INBOX_SECRET, 300),
    };

    // Newest first, two per page, with a cursor; labelled Today.
    let (s, page1) = ca.get("/v1/inbox/notifications?limit=2").await;
    assert_eq!(s, 200, "{page1}");
    let titles: Vec<&str> = page1["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, ["ข่าวที่ 3", "ข่าวที่ 2"]);
    assert_eq!(page1["items"][0]["group"], "Today");
    let cursor = page1["next_cursor"].as_str().unwrap();
    let (_, page2) = ca
        .get(&format!("/v1/inbox/notifications?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(page2["items"].as_array().unwrap().len(), 1);
    assert!(page2["next_cursor"].is_null());
    assert_eq!(ca.get("/v1/inbox/unread-count").await.1["unread"], 3);

    // B cannot read or change A's notification: 404, and nothing leaks.
    let id = page1["items"][0]["id"].as_str().unwrap().to_string();
    let (s, body) = cb
        .post(&format!("/v1/inbox/notifications/{id}/read"), "")
        .await;
    assert_eq!(s, 404);
    assert!(!body.to_string().contains("ข่าว"), "{body}");
    assert_eq!(
        cb.get("/v1/inbox/notifications").await.1["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // Read, idempotently; unread; archive hides it from the default list.
    for _ in 0..2 {
        let (s, item) = ca
            .post(&format!("/v1/inbox/notifications/{id}/read"), "")
            .await;
        assert_eq!((s, item["status"].as_str()), (200, Some("read")));
    }
    assert_eq!(ca.get("/v1/inbox/unread-count").await.1["unread"], 2);
    assert_eq!(
        ca.post(&format!("/v1/inbox/notifications/{id}/unread"), "")
            .await
            .1["status"],
        "unread"
    );
    assert_eq!(
        ca.post(&format!("/v1/inbox/notifications/{id}/archive"), "")
            .await
            .1["status"],
        "archived"
    );
    assert_eq!(
        ca.get("/v1/inbox/notifications").await.1["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        ca.get("/v1/inbox/notifications?status=archived").await.1["items"][0]["id"],
        id.as_str()
    );
    assert_eq!(
        ca.post(&format!("/v1/inbox/notifications/{id}/unarchive"), "")
            .await
            .1["status"],
        "read"
    );

    // Read-all up to what the client saw; a later arrival stays unread.
    let (_, all) = ca.get("/v1/inbox/notifications").await;
    let newest_seq = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["seq"].as_i64().unwrap())
        .max()
        .unwrap();
    notify(&p, "n4", &a, "ข่าวที่ 4").await;
    let (s, r) = ca
        .post(
            "/v1/inbox/read-all",
            &json!({"up_to_seq": newest_seq}).to_string(),
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        r["unread"], 1,
        "the one that arrived after stays unread: {r}"
    );
    assert_eq!(
        cb.get("/v1/inbox/unread-count").await.1["unread"],
        1,
        "B untouched"
    );

    // Bad input: a clear JSON error naming the field.
    for (path, field) in [
        ("/v1/inbox/notifications?cursor=garbage", "cursor"),
        ("/v1/inbox/notifications?limit=0", "limit"),
        ("/v1/inbox/notifications?status=deleted", "status"),
    ] {
        let (s, e) = ca.get(path).await;
        assert_eq!(
            (s, e["error"]["field"].as_str()),
            (400, Some(field)),
            "{path}: {e}"
        );
    }
    let (s, e) = ca.post("/v1/inbox/notifications/not-a-uuid/read", "").await;
    assert_eq!((s, e["error"]["field"].as_str()), (400, Some("id")));
    let (s, _) = ca
        .post(
            &format!("/v1/inbox/notifications/{}/read", uuid::Uuid::new_v4()),
            "",
        )
        .await;
    assert_eq!(s, 404);
    let (s, e) = ca.post("/v1/inbox/read-all", "{not json").await;
    assert_eq!((s, e["error"]["field"].as_str()), (400, Some("body")));
    let (s, e) = ca.post("/v1/inbox/read-all", &"x".repeat(2 << 20)).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (413, Some("body_too_large"))
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_get_401_and_a_busy_user_gets_429() {
    let p = inapp_platform().await;
    let a = uniq("a");
    let url = format!("{}/v1/inbox/unread-count", p.http_url);
    let none = p.http.get(&url).send().await.unwrap();
    assert_eq!(none.status(), 401);
    assert_eq!(none.headers()["www-authenticate"], "Bearer");
    let forged = token(&a, "another-secret-of-at-least-32-characters", 300);
    let expired = token(&a, support::INBOX_SECRET, -3600);
    let unsigned = {
        let b64 = |v: Value| {
            base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                v.to_string(),
            )
        };
        format!(
            "{}.{}.",
            b64(json!({"alg": "none", "typ": "JWT"})),
            b64(json!({"sub": a, "exp": 9999999999u64}))
        )
    };
    for t in [forged, expired, unsigned, "garbage".to_string()] {
        let r = p.http.get(&url).bearer_auth(&t).send().await.unwrap();
        assert_eq!(r.status(), 401, "{t}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["field"], "Authorization");
    }
    // 20 requests a second per user: a burst of 40 sees 429 with Retry-After.
    let good = token(&a, support::INBOX_SECRET, 300);
    let mut limited = 0;
    for _ in 0..40 {
        let r = p.http.get(&url).bearer_auth(&good).send().await.unwrap();
        if r.status() == 429 {
            assert!(r.headers().contains_key("retry-after"));
            limited += 1;
        }
    }
    assert!(limited >= 10, "{limited} of 40 limited");
    // CORS for the configured origin only.
    let pre = p
        .http
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "https://app.example.test")
        .header("access-control-request-method", "GET")
        .header("access-control-request-headers", "authorization")
        .send()
        .await
        .unwrap();
    assert_eq!(
        pre.headers()["access-control-allow-origin"],
        "https://app.example.test"
    );
    let other = p
        .http
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "https://evil.example.test")
        .header("access-control-request-method", "GET")
        .send()
        .await
        .unwrap();
    assert!(!other.headers().contains_key("access-control-allow-origin"));
    p.stop().await;
}

/// Reads SSE frames until `want` events of type `kind` arrived; returns (id, data) pairs.
async fn read_events(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buf: &mut String,
    kind: &str,
    want: usize,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while out.len() < want {
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().into();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().into();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            if event == kind {
                out.push((id, serde_json::from_str(&data).unwrap()));
            }
        }
        if out.len() >= want {
            break;
        }
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .expect("event within 10 s")
            .expect("stream open")
            .unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_delivers_new_notifications_live_and_resumes_after_a_reconnect() {
    let p = inapp_platform().await;
    p.add_type("news", &["inapp"]).await;
    let a = uniq("a");
    p.add_recipient(&a, "", "", "").await;
    let t = token(&a, support::INBOX_SECRET, 300);
    let open = |last: Option<String>| {
        let mut r = p
            .http
            .get(format!("{}/v1/inbox/stream", p.http_url))
            .bearer_auth(&t);
        if let Some(l) = last {
            r = r.header("last-event-id", l);
        }
        r.send()
    };
    let resp = open(None).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    assert_eq!(
        read_events(&mut body, &mut buf, "unread_count", 1).await[0].1["unread"],
        0
    );
    let started = std::time::Instant::now();
    notify(&p, "live:1", &a, "สดๆ").await;
    let got = read_events(&mut body, &mut buf, "notification", 1).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(got[0].1["title"], "สดๆ");
    let last_id = got[0].0.clone();
    assert_eq!(
        read_events(&mut body, &mut buf, "unread_count", 1).await[0].1["unread"],
        1
    );
    drop(body);

    // While disconnected, two more arrive; resuming from the last id replays exactly them.
    notify(&p, "live:2", &a, "สอง").await;
    notify(&p, "live:3", &a, "สาม").await;
    let mut body = open(Some(last_id)).await.unwrap().bytes_stream();
    let mut buf = String::new();
    let replay = read_events(&mut body, &mut buf, "notification", 2).await;
    let titles: Vec<&str> = replay
        .iter()
        .map(|(_, d)| d["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, ["สอง", "สาม"]);
    p.stop().await;
}

/// `docs/openapi.json` lists exactly the inbox routes the service serves, and each of them
/// answers (401 without a token, not 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_file_matches_the_routes() {
    let p = Platform::start_with(Options {
        workers: vec![],
        ..Default::default()
    })
    .await;
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/openapi.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in spec["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            if path.starts_with("/v1/inbox") {
                documented.push((method.clone(), path.clone()));
            }
        }
    }
    documented.sort();
    let mut served: Vec<(String, String)> = http_api::inbox::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    served.sort();
    assert_eq!(documented, served);
    for (method, path) in &served {
        let url = format!(
            "{}{}",
            p.http_url,
            path.replace("{id}", &uuid::Uuid::new_v4().to_string())
        );
        let r = p
            .http
            .request(method.to_uppercase().parse().unwrap(), url)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            401,
            "{method} {path} is served and needs a token"
        );
    }
    let r = p
        .http
        .get(format!("{}/v1/inbox/nope", p.http_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "not_found");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_manage_their_preferences_quiet_hours_and_devices() {
    let p = Platform::start_with(Options {
        workers: vec![],
        ..Default::default()
    })
    .await;
    p.add_type("news", &["inapp", "push"]).await;
    let (a, b) = (uniq("a"), uniq("b"));
    for u in [&a, &b] {
        p.add_recipient(u, "", "", "").await;
    }
    let ca = Client {
        p: &p,
        token: token(&a, support::INBOX_SECRET, 300),
    };
    let cb = Client {
        p: &p,
        token: token(&b, support::INBOX_SECRET, 300),
    };
    let put = |c: &Client, path: &str, body: Value| {
        let req =
            c.p.http
                .put(format!("{}{path}", c.p.http_url))
                .bearer_auth(&c.token)
                .json(&body);
        async move {
            let r = req.send().await.unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (s, prefs) = put(
        &ca,
        "/v1/inbox/preferences",
        json!({"type": "news", "channel": "push", "enabled": false}),
    )
    .await;
    assert_eq!(s, 200, "{prefs}");
    assert_eq!(
        prefs["preferences"],
        json!([{"type": "news", "channel": "push", "enabled": false}])
    );
    let (s, e) = put(
        &ca,
        "/v1/inbox/preferences",
        json!({"type": "*", "channel": "*", "enabled": false}),
    )
    .await;
    assert_eq!((s, e["error"]["field"].as_str()), (400, Some("channel")));
    let (s, e) = put(
        &ca,
        "/v1/inbox/preferences",
        json!({"type": "nope", "channel": "push", "enabled": false}),
    )
    .await;
    assert_eq!((s, e["error"]["field"].as_str()), (404, Some("type")));
    let (s, prefs) = put(
        &ca,
        "/v1/inbox/quiet-hours",
        json!({"windows": [{"start": "22:00", "end": "07:00"}]}),
    )
    .await;
    assert_eq!(
        (s, prefs["quiet_hours"][0]["end"].as_str()),
        (200, Some("07:00"))
    );
    let (s, e) = put(
        &ca,
        "/v1/inbox/quiet-hours",
        json!({"windows": [{"start": "22:00", "end": "22:00"}]}),
    )
    .await;
    assert_eq!((s, e["error"]["field"].as_str()), (400, Some("windows[0]")));
    assert!(
        cb.get("/v1/inbox/preferences").await.1["preferences"]
            .as_array()
            .unwrap()
            .is_empty(),
        "B's own"
    );
    // The push opt-out applies to A's next event; B is untouched.
    let ev = p.send("prefs-http", "news", &[&a, &b]).await;
    assert!(
        ev.skipped
            .iter()
            .any(|s| s.user_id == a && s.channel == "push" && s.reason == "opted_out")
    );

    // Devices: register, a bad one named, another user's cannot be removed.
    let (s, dev) = ca
        .post(
            "/v1/inbox/devices",
            &json!({"platform": "fcm", "token": format!("fcm-tok-{a}")}).to_string(),
        )
        .await;
    assert_eq!(s, 201, "{dev}");
    let id = dev["endpoint_id"].as_str().unwrap().to_string();
    let (s, e) = ca
        .post("/v1/inbox/devices", &json!({"platform": "webpush", "web_push": {"endpoint": "http://insecure.test/x", "keys": {"p256dh": "x", "auth": "y"}}}).to_string())
        .await;
    assert_eq!(s, 400);
    let fields: Vec<&str> = e["error"]["violations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        fields,
        ["web_push.endpoint", "web_push.p256dh", "web_push.auth"]
    );
    let del = |c: &Client, id: &str| {
        let req =
            c.p.http
                .delete(format!("{}/v1/inbox/devices/{id}", c.p.http_url))
                .bearer_auth(&c.token);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(del(&cb, &id).await, 404, "not B's device");
    assert_eq!(del(&ca, &id).await, 204);
    assert_eq!(del(&ca, &id).await, 204, "idempotent");
    let status: String =
        sqlx::query_scalar("SELECT status FROM notification_endpoints WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&p.pool)
            .await
            .unwrap();
    assert_eq!(status, "revoked");
    p.stop().await;
}

/// ES256 tokens checked against a JWKS served over HTTP, on a second replica of the
/// service: its stream receives the in-app worker's commit too (Postgres LISTEN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_with_jwks_keys_streams_the_same_inbox() {
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    use p256::pkcs8::DecodePublicKey;
    let p = inapp_platform().await;
    p.add_type("news", &["inapp"]).await;
    let a = uniq("a");
    p.add_recipient(&a, "", "", "").await;

    // The app's signing key (any P-256 key; the stack's APNs test key will do) as a JWKS.
    let public = p256::PublicKey::from_public_key_pem(
        &std::fs::read_to_string(&p.stack.apns_public_key_file).unwrap(),
    )
    .unwrap();
    let point = public.to_encoded_point(false);
    let b64 =
        |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, b);
    let jwks = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "app-1", "alg": "ES256", "use": "sig",
                                "x": b64(point.x().unwrap()), "y": b64(point.y().unwrap())}]});
    let keys = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let jwks_url = format!("http://{}/jwks.json", keys.local_addr().unwrap());
    tokio::spawn(async move {
        let app = axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || async move { axum::Json(jwks.clone()) }),
        );
        axum::serve(keys, app).await.unwrap();
    });

    // Replica two: ES256 keys from the URL only.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let second = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let cfg = http_api::HttpConfig {
        line_channel_secret: "x".into(),
        unsubscribe_secret: "y".into(),
        unsubscribe_ttl: http_api::DEFAULT_UNSUBSCRIBE_TTL,
        inbox: http_api::inbox::InboxConfig {
            jwt_secret: None,
            jwks_json: None,
            jwks_url: Some(jwks_url),
            rate_per_user: 20,
        },
        cors_origins: vec![],
        console: Default::default(),
    };
    let (pool, s) = (p.pool.clone(), stop.clone());
    tokio::spawn(async move { http_api::serve(listener, pool, cfg, s).await.unwrap() });

    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("app-1".into());
    let es256 = jsonwebtoken::encode(
        &header,
        &json!({"sub": a, "exp": chrono::Utc::now().timestamp() + 300}),
        &jsonwebtoken::EncodingKey::from_ec_pem(
            std::fs::read_to_string(&p.stack.apns_key_file)
                .unwrap()
                .as_bytes(),
        )
        .unwrap(),
    )
    .unwrap();
    let mut accepted = false;
    for _ in 0..50 {
        let r = p
            .http
            .get(format!("{second}/v1/inbox/unread-count"))
            .bearer_auth(&es256)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            accepted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        accepted,
        "the ES256 token is accepted once the JWKS is fetched"
    );
    let hs256 = token(&a, support::INBOX_SECRET, 300);
    let r = p
        .http
        .get(format!("{second}/v1/inbox/unread-count"))
        .bearer_auth(&hs256)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no HS256 secret on this replica");

    let resp = p
        .http
        .get(format!("{second}/v1/inbox/stream"))
        .bearer_auth(&es256)
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    read_events(&mut body, &mut buf, "unread_count", 1).await;
    notify(&p, "replica", &a, "ผ่านอีกเครื่อง").await;
    let got = read_events(&mut body, &mut buf, "notification", 1).await;
    assert_eq!(got[0].1["title"], "ผ่านอีกเครื่อง");
    drop(body);
    stop.cancel();
    p.stop().await;
}
