//! The end users' inbox API over HTTP: authentication, isolation between users, listing
//! with cursors and group labels, read/unread/archive, race-free read-all, live updates
//! over Server-Sent Events with resume, bad input, rate limit, and the OpenAPI file.

use crate::support;

use futures_util::StreamExt;
use notify_core::Channel;
use serde_json::{Value, json};
use std::time::Duration;
use support::{InboxClient, Options, Platform, eventually, hs256, uniq};

/// An HS256 inbox token for `user`, signed with `secret`, expiring in `exp_in` seconds.
fn token(user: &str, secret: &str, exp_in: i64) -> String {
    hs256(
        &json!({"sub": user, "exp": chrono::Utc::now().timestamp() + exp_in}),
        secret,
    )
}

async fn inapp_platform() -> Platform {
    Platform::start_with_workers(&[Channel::InApp]).await
}

async fn notify(p: &Platform, key: &str, user: &str, title: &str) {
    let mut req = p.event(key, "news", &[user]);
    req.content.as_mut().unwrap().title = title.into();
    let ev = p.create_event(req).await;
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
    let ca = InboxClient {
        p: &p,
        token: token(&a, support::INBOX_SECRET, 300),
    };
    let cb = InboxClient {
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
    let a = p.add_bare_recipient("a").await;
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
}

/// A read-all of 1,200 notifications changes them in one statement, announced once: a
/// connected stream sends all 1,200 changes at once, page after page, and then the
/// unread count of 0, instead of one page per wake-up or per 15 s catch-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_all_of_more_than_a_page_reaches_the_stream_at_once() {
    let p = Platform::start_with_workers(&[]).await;
    let a = p.add_bare_recipient("a").await;
    p.exec(
        "INSERT INTO notifications (id, delivery_id, event_id, user_id, type, title, body)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), $1, 'news',
                'ข่าว ' || i, ''
         FROM generate_series(1, 1200) i",
        &a,
    )
    .await;
    let c = InboxClient {
        p: &p,
        token: token(&a, support::INBOX_SECRET, 300),
    };
    let resp = p
        .http
        .get(format!("{}/v1/inbox/stream", p.http_url))
        .bearer_auth(&c.token)
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    assert_eq!(
        read_events(&mut body, &mut buf, "unread_count", 1).await[0].1["unread"],
        1200
    );
    let (status, _) = c.post("/v1/inbox/read-all", "{}").await;
    assert_eq!(status, 200);
    // read_events gives each event 10 s, less than the stream's 15 s catch-up timer.
    let changed = read_events(&mut body, &mut buf, "notification", 1200).await;
    assert!(changed.iter().all(|(_, item)| item["status"] == "read"));
    let seqs: Vec<i64> = changed.iter().map(|(id, _)| id.parse().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in seq order");
    assert_eq!(
        read_events(&mut body, &mut buf, "unread_count", 1).await[0].1["unread"],
        0
    );
}

/// `docs/openapi.json` lists exactly the inbox routes the service serves, and each of them
/// answers (401 without a token, not 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_file_matches_the_routes() {
    let p = Platform::start_with_workers(&[]).await;
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
    // The table the router is built from, so a route served is a route listed.
    let mut served: Vec<(String, String)> = http_api::inbox::ROUTES
        .iter()
        .map(|r| (r.method.as_str().to_lowercase(), r.path.to_string()))
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_manage_their_preferences_quiet_hours_and_devices() {
    let p = Platform::start_with_type(&[], "news", &["inapp", "push"]).await;
    let (a, b) = (uniq("a"), uniq("b"));
    for u in [&a, &b] {
        p.add_recipient(u, "", "", "").await;
    }
    let ca = InboxClient {
        p: &p,
        token: token(&a, support::INBOX_SECRET, 300),
    };
    let cb = InboxClient {
        p: &p,
        token: token(&b, support::INBOX_SECRET, 300),
    };
    let put = |c: &InboxClient, path: &str, body: Value| {
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
    let del = |c: &InboxClient, id: &str| {
        let req =
            c.p.http
                .delete(format!("{}/v1/inbox/devices/{id}", c.p.http_url))
                .bearer_auth(&c.token);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(del(&cb, &id).await, 404, "not B's device");
    assert_eq!(del(&ca, &id).await, 204);
    assert_eq!(del(&ca, &id).await, 204, "idempotent");
    let status: String = p
        .scalar(
            "SELECT status FROM notification_endpoints WHERE id = $1::uuid",
            &id,
        )
        .await;
    assert_eq!(status, "revoked");
}

/// ES256 tokens checked against a JWKS served over HTTP, on a second replica of the
/// service: its stream receives the in-app worker's commit too (Postgres LISTEN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_with_jwks_keys_streams_the_same_inbox() {
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    use p256::pkcs8::DecodePublicKey;
    let p = inapp_platform().await;
    p.add_type("news", &["inapp"]).await;
    let a = p.add_bare_recipient("a").await;

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
        email_events: Default::default(),
        line_channel_secret: "x".into(),
        unsubscribe_secret: "y".into(),
        unsubscribe_ttl: http_api::DEFAULT_UNSUBSCRIBE_TTL,
        inbox: http_api::inbox::InboxConfig {
            jwt_secret: None,
            jwks_json: None,
            jwks_url: Some(jwks_url),
            rate_per_user: 20,
            ..Default::default()
        },
        cors_origins: vec![],
        console: Default::default(),
        links: Default::default(),
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
    eventually(
        "the ES256 token is accepted once the JWKS is fetched",
        Duration::from_secs(10),
        async || {
            let r = p
                .http
                .get(format!("{second}/v1/inbox/unread-count"))
                .bearer_auth(&es256)
                .send()
                .await
                .unwrap();
            if r.status() == 200 {
                Ok(())
            } else {
                Err(r.status())
            }
        },
    )
    .await;
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
}

/// Reads SSE `notification` frames for `window`, or until the stream ends; returns their
/// (event id, notification id) pairs.
async fn notifications_for(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    window: Duration,
) -> Vec<(String, String)> {
    items_for(body, window)
        .await
        .into_iter()
        .map(|(id, item)| (id, item["id"].as_str().unwrap().to_string()))
        .collect()
}

/// Reads SSE `notification` frames for `window`, or until the stream ends; returns their
/// (event id, item) pairs.
async fn items_for(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    window: Duration,
) -> Vec<(String, Value)> {
    let (mut buf, mut out) = (String::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + window;
    while let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(deadline, body.next()).await {
        buf.push_str(&String::from_utf8_lossy(&chunk));
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
            if event == "notification" {
                out.push((id, serde_json::from_str(&data).unwrap()));
            }
        }
    }
    out
}

/// `writers` concurrent writers, each sending `each` `news` events (keys
/// `<prefix>:<writer>:<n>`) to `user`, one after the other; their tasks.
fn burst(
    p: &Platform,
    user: &str,
    prefix: &str,
    writers: usize,
    each: usize,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let mut ingest = p.ingest();
            let reqs: Vec<_> = (0..each)
                .map(|n| p.event(&format!("{prefix}:{w}:{n}"), "news", &[user]))
                .collect();
            tokio::spawn(async move {
                for req in reqs {
                    ingest.create_event(req).await.unwrap();
                }
            })
        })
        .collect()
}

/// Eight callers send 400 in-app notifications to one user at once, written by two in-app
/// workers whose batches commit in any order (each commit is slowed by a random few
/// milliseconds, as a busy disk or a synchronous replica would); a client that reconnects
/// every 300 ms with `Last-Event-ID` sees every one of them, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reconnecting_every_300_ms_sees_each_of_400_concurrent_notifications_once() {
    let mut p = Platform::start_with(Options::workers(&[Channel::InApp]).concurrency(16)).await;
    p.start_worker_named(Channel::InApp, "second-inapp-worker");
    p.add_type("news", &["inapp"]).await;
    let a = p.add_bare_recipient("a").await;
    p.execute(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_sleep(random() * 0.004); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON notifications
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
    )
    .await;
    let t = token(&a, support::INBOX_SECRET, 600);

    const WRITERS: usize = 8;
    const EACH: usize = 50;
    let writers = burst(&p, &a, "burst", WRITERS, EACH);

    // The client: connected for 300 ms at a time, resuming after the last id it saw.
    let mut seen: Vec<(String, String)> = Vec::new();
    let mut last = "0".to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut settled_rounds = 0;
    while tokio::time::Instant::now() < deadline {
        let resp = p
            .http
            .get(format!("{}/v1/inbox/stream", p.http_url))
            .bearer_auth(&t)
            .header("last-event-id", &last)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        let got = notifications_for(&mut body, Duration::from_millis(300)).await;
        if let Some((id, _)) = got.last() {
            last = id.clone();
        }
        seen.extend(got);
        // Done once every row is committed and two more rounds found nothing new.
        let written: i64 = p
            .scalar("SELECT count(*) FROM notifications WHERE user_id = $1", &a)
            .await;
        if written == (WRITERS * EACH) as i64 {
            settled_rounds += 1;
            if settled_rounds > 2 {
                break;
            }
        }
    }
    for w in writers {
        w.await.unwrap();
    }
    let mut ids: Vec<&str> = seen.iter().map(|(_, id)| id.as_str()).collect();
    ids.sort_unstable();
    let before = ids.len();
    ids.dedup();
    assert_eq!(before, ids.len(), "a notification was sent twice");
    let stored: Vec<String> = p
        .scalars(
            "SELECT id::text FROM notifications WHERE user_id = $1 ORDER BY id",
            &a,
        )
        .await;
    let missing: Vec<&String> = stored
        .iter()
        .filter(|s| ids.binary_search(&s.as_str()).is_err())
        .collect();
    assert_eq!(stored.len(), WRITERS * EACH);
    assert!(
        missing.is_empty(),
        "{} of {} never reached the client",
        missing.len(),
        stored.len()
    );
}

/// An HS256 token with these claims, signed with the platform's secret.
fn signed(claims: Value) -> String {
    hs256(&claims, support::INBOX_SECRET)
}

/// `GET {base}/v1/inbox/unread-count` with `token`: the status and the JSON body (Null
/// when the body is not JSON).
async fn unread_with(p: &Platform, base: &str, token: &str) -> (u16, Value) {
    let r = p
        .http
        .get(format!("{base}/v1/inbox/unread-count"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_used_before_its_nbf_gets_401_with_json() {
    let p = Platform::start_with_workers(&[]).await;
    let a = uniq("a");
    let early = signed(json!({"sub": a, "exp": now() + 7200, "nbf": now() + 3600}));
    let (s, e) = unread_with(&p, &p.http_url, &early).await;
    assert_eq!(s, 401, "{e}");
    assert_eq!(e["error"]["field"], "Authorization");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("nbf"),
        "{e}"
    );
    let ready = signed(json!({"sub": a, "exp": now() + 7200, "nbf": now() - 5}));
    assert_eq!(unread_with(&p, &p.http_url, &ready).await.0, 200);
}

/// With `NOTIFY_INBOX_JWT_AUDIENCE` and `NOTIFY_INBOX_JWT_ISSUER` set (here on a second
/// replica), a token must carry both, with those values; without them, neither is looked at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_audience_and_issuer_configured_only_tokens_for_them_are_accepted() {
    let p = Platform::start_with_workers(&[]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let strict = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let cfg = http_api::HttpConfig {
        email_events: Default::default(),
        line_channel_secret: "x".into(),
        unsubscribe_secret: "y".into(),
        unsubscribe_ttl: http_api::DEFAULT_UNSUBSCRIBE_TTL,
        inbox: http_api::inbox::InboxConfig {
            jwt_secret: Some(support::INBOX_SECRET.into()),
            rate_per_user: 100,
            jwt_audience: Some("notify-inbox".into()),
            jwt_issuer: Some("https://login.example.test".into()),
            ..Default::default()
        },
        cors_origins: vec![],
        console: Default::default(),
        links: Default::default(),
    };
    let (pool, s) = (p.pool.clone(), stop.clone());
    tokio::spawn(async move { http_api::serve(listener, pool, cfg, s).await.unwrap() });

    let a = uniq("a");
    let (aud, iss) = ("notify-inbox", "https://login.example.test");
    let exp = now() + 300;
    let good = signed(json!({"sub": a, "exp": exp, "aud": aud, "iss": iss}));
    eventually(
        "the second replica answers",
        Duration::from_secs(10),
        async || match p.http.get(format!("{strict}/healthz")).send().await {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        },
    )
    .await;
    assert_eq!(unread_with(&p, &strict, &good).await.0, 200);
    assert_eq!(
        unread_with(
            &p,
            &strict,
            &signed(json!({"sub": a, "exp": exp, "aud": [aud, "other"], "iss": iss}))
        )
        .await
        .0,
        200,
        "aud may be a list holding ours"
    );
    for (claims, why) in [
        (
            json!({"sub": a, "exp": exp, "aud": "another-app", "iss": iss}),
            "aud",
        ),
        (json!({"sub": a, "exp": exp, "iss": iss}), "aud"),
        (
            json!({"sub": a, "exp": exp, "aud": aud, "iss": "https://evil.example.test"}),
            "iss",
        ),
        (json!({"sub": a, "exp": exp, "aud": aud}), "iss"),
        // RFC 7519: iss is one StringOrURI, not a list (even one holding ours).
        (
            json!({"sub": a, "exp": exp, "aud": aud, "iss": [iss]}),
            "iss",
        ),
        (
            json!({"sub": a, "exp": exp, "aud": aud, "iss": [iss, "https://evil.example.test"]}),
            "iss",
        ),
    ] {
        let (s, e) = unread_with(&p, &strict, &signed(claims.clone())).await;
        assert_eq!(s, 401, "{claims}: {e}");
        assert_eq!(e["error"]["field"], "Authorization");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(why),
            "{claims}: {e}"
        );
    }
    // The platform's own replica has neither configured: any aud and iss pass.
    let elsewhere = signed(json!({"sub": a, "exp": exp, "aud": "another-app", "iss": "x"}));
    assert_eq!(unread_with(&p, &p.http_url, &elsewhere).await.0, 200);
    // But an iss that is not a single string is malformed wherever it is sent.
    let listed = signed(json!({"sub": a, "exp": exp, "iss": ["x", "y"]}));
    let (s, e) = unread_with(&p, &p.http_url, &listed).await;
    assert_eq!(s, 401, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("iss"),
        "{e}"
    );
    stop.cancel();
}

/// The same rule as ingest's for a user id: a `sub` with a NUL (which Postgres cannot
/// hold: 503 before), another control character, an invisible or a bidi control
/// character, surrounding whitespace or nothing visible is refused with 401 and JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_with_a_control_invisible_or_bidi_character_gets_401_with_json() {
    let p = Platform::start_with_workers(&[]).await;
    for sub in [
        "user\u{0}1",
        "user\n1",
        "u\u{200b}1",
        "order\u{202e}1",
        " user-1",
        "\u{feff}",
        "",
        &"x".repeat(256),
    ] {
        let (s, e) = unread_with(
            &p,
            &p.http_url,
            &signed(json!({"sub": sub, "exp": now() + 300})),
        )
        .await;
        assert_eq!(s, 401, "{sub:?}: {e}");
        assert_eq!(e["error"]["field"], "Authorization", "{sub:?}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains("sub"),
            "{sub:?}: {e}"
        );
    }
}

/// Ingest stores user ids NFC-normalised; a token naming the same user in decomposed form
/// reads the same inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decomposed_sub_reads_the_inbox_of_the_same_composed_user_id() {
    let p = inapp_platform().await;
    p.add_type("news", &["inapp"]).await;
    let composed = format!("{}-\u{e9}", uniq("u"));
    p.add_recipient(&composed, "", "", "").await;
    notify(&p, "nfc", &composed, "hello").await;
    let decomposed = composed.replace('\u{e9}', "e\u{301}");
    let (s, n) = unread_with(
        &p,
        &p.http_url,
        &signed(json!({"sub": decomposed, "exp": now() + 300})),
    )
    .await;
    assert_eq!((s, n["unread"].as_i64()), (200, Some(1)), "{n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_over_8_kib_gets_401_with_json_before_it_is_parsed() {
    let p = Platform::start_with_workers(&[]).await;
    let a = uniq("a");
    let sized = |pad: usize| signed(json!({"sub": a, "exp": now() + 300, "pad": "x".repeat(pad)}));
    let small = sized(5000);
    assert!(small.len() < 8 * 1024);
    assert_eq!(unread_with(&p, &p.http_url, &small).await.0, 200);
    let large = sized(7000);
    assert!(large.len() > 8 * 1024, "{}", large.len());
    let (s, e) = unread_with(&p, &p.http_url, &large).await;
    assert_eq!(s, 401, "{e}");
    assert_eq!(e["error"]["field"], "Authorization");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("8192 bytes"),
        "{e}"
    );
}

/// A repeated query parameter, an id that is not UTF-8 and a method a route does not serve
/// are answered in the API's JSON error shape, naming the parameter or the methods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_json_errors_naming_the_parameter_or_the_allowed_methods() {
    let p = Platform::start_with_workers(&[]).await;
    let t = token(&uniq("a"), support::INBOX_SECRET, 300);
    let call = |method: reqwest::Method, path: &str| {
        let req = p
            .http
            .request(method, format!("{}{path}", p.http_url))
            .bearer_auth(&t);
        async move {
            let r = req.send().await.unwrap();
            let (status, headers) = (r.status().as_u16(), r.headers().clone());
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, headers, body)
        }
    };
    for (path, field) in [
        (
            "/v1/inbox/notifications?status=read&status=unread",
            "status",
        ),
        ("/v1/inbox/notifications?limit=5&limit=6", "limit"),
        (
            "/v1/inbox/stream?last_event_id=1&last_event_id=2",
            "last_event_id",
        ),
        ("/v1/inbox/notifications?status=%FF", "status"),
    ] {
        let (s, h, e) = call(reqwest::Method::GET, path).await;
        assert_eq!(s, 400, "{path}: {e}");
        assert_eq!(h["content-type"], "application/json", "{path}");
        assert_eq!(e["error"]["field"], field, "{path}: {e}");
    }
    let (s, _, e) = call(reqwest::Method::POST, "/v1/inbox/notifications/%FF/read").await;
    assert_eq!((s, e["error"]["field"].as_str()), (400, Some("id")), "{e}");
    for (method, path, allowed) in [
        (reqwest::Method::DELETE, "/v1/inbox/notifications", "GET"),
        (reqwest::Method::POST, "/v1/inbox/unread-count", "GET"),
        (reqwest::Method::GET, "/v1/inbox/read-all", "POST"),
        (reqwest::Method::POST, "/v1/inbox/preferences", "GET"),
    ] {
        let (s, h, e) = call(method.clone(), path).await;
        assert_eq!(s, 405, "{method} {path}: {e}");
        assert_eq!(h["content-type"], "application/json", "{method} {path}");
        assert_eq!(e["error"]["code"], "method_not_allowed", "{e}");
        assert_eq!(e["error"]["field"], "method", "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(allowed),
            "{method} {path}: {e}"
        );
        assert!(
            h["allow"].to_str().unwrap().contains(allowed),
            "{method} {path}: {h:?}"
        );
    }
}

/// A JSON body of the right shape but a wrong-typed, missing or unknown field is reported
/// by that field's name (its path for nested values), not as `body`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_typed_missing_or_unknown_json_field_is_reported_by_its_name() {
    let p = Platform::start_with_workers(&[]).await;
    let a = p.add_bare_recipient("a").await;
    let t = token(&a, support::INBOX_SECRET, 300);
    for (method, path, body, field) in [
        (
            reqwest::Method::PUT,
            "/v1/inbox/preferences",
            json!({"type": "news", "channel": "push", "enabled": "no"}),
            "enabled",
        ),
        (
            reqwest::Method::PUT,
            "/v1/inbox/preferences",
            json!({"type": "news", "channel": "push"}),
            "enabled",
        ),
        (
            reqwest::Method::PUT,
            "/v1/inbox/preferences",
            json!({"type": "news", "channel": "push", "enabled": true, "colour": 1}),
            "colour",
        ),
        (
            reqwest::Method::PUT,
            "/v1/inbox/quiet-hours",
            json!({"windows": [{"start": "22:00", "end": "07:00"}, {"start": 22, "end": "07:00"}]}),
            "windows[1].start",
        ),
        (
            reqwest::Method::POST,
            "/v1/inbox/read-all",
            json!({"up_to_seq": "42"}),
            "up_to_seq",
        ),
        (
            reqwest::Method::POST,
            "/v1/inbox/devices",
            json!({"platform": "webpush", "web_push": {"endpoint": "https://push.example.test/x", "keys": {"p256dh": "x", "auth": 7}}}),
            "web_push.keys.auth",
        ),
    ] {
        let r = p
            .http
            .request(method.clone(), format!("{}{path}", p.http_url))
            .bearer_auth(&t)
            .json(&body)
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        let e: Value = r.json().await.unwrap();
        assert_eq!(s, 400, "{method} {path} {body}: {e}");
        assert_eq!(e["error"]["field"], field, "{method} {path} {body}: {e}");
        assert!(!e["error"]["message"].as_str().unwrap().is_empty(), "{e}");
    }
}

/// Read changes take a feed position the same way: while two in-app workers write 200
/// notifications (slow commits again, on inserts and updates), a client that reconnects
/// every 300 ms while it marks read, every 100 ms, everything it has seen (`read-all` up
/// to its last id) receives the read version of every notification, with ids that only
/// grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_changes_made_during_a_burst_reach_a_resuming_client_in_order() {
    let mut p = Platform::start_with(Options::workers(&[Channel::InApp]).concurrency(16)).await;
    p.start_worker_named(Channel::InApp, "second-inapp-worker");
    p.add_type("news", &["inapp"]).await;
    let a = p.add_bare_recipient("a").await;
    p.execute(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_sleep(random() * 0.004); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON notifications
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
    )
    .await;
    let c = InboxClient {
        p: &p,
        token: token(&a, support::INBOX_SECRET, 600),
    };
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    let writers = burst(&p, &a, "read-burst", WRITERS, EACH);

    let mut status: std::collections::HashMap<String, String> = Default::default();
    let mut last: i64 = 0;
    // Marks read up to the last id seen, concurrently with the stream.
    let seen_up_to = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let stop_marking = tokio_util::sync::CancellationToken::new();
    let marker = {
        let (http, url, t) = (p.http.clone(), p.http_url.clone(), c.token.clone());
        let (up_to, stop) = (seen_up_to.clone(), stop_marking.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let up_to = up_to.load(std::sync::atomic::Ordering::SeqCst);
                let r = http
                    .post(format!("{url}/v1/inbox/read-all"))
                    .bearer_auth(&t)
                    .json(&json!({"up_to_seq": up_to}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                // Pacing: a reader who reads every 100 ms during the burst.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut settled_rounds = 0;
    while tokio::time::Instant::now() < deadline {
        let resp = p
            .http
            .get(format!("{}/v1/inbox/stream", p.http_url))
            .bearer_auth(&c.token)
            .header("last-event-id", last.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        for (id, item) in items_for(&mut body, Duration::from_millis(300)).await {
            let seq: i64 = id.parse().unwrap();
            assert!(seq > last, "id {seq} after {last}");
            last = seq;
            seen_up_to.store(seq, std::sync::atomic::Ordering::SeqCst);
            status.insert(
                item["id"].as_str().unwrap().to_string(),
                item["status"].as_str().unwrap().to_string(),
            );
        }
        drop(body);
        let (_, r) = c.get("/v1/inbox/unread-count").await;
        let written: i64 = p
            .scalar("SELECT count(*) FROM notifications WHERE user_id = $1", &a)
            .await;
        if written == (WRITERS * EACH) as i64 && r["unread"] == 0 {
            settled_rounds += 1;
            if settled_rounds > 2 {
                break;
            }
        }
    }
    stop_marking.cancel();
    marker.await.unwrap();
    for w in writers {
        w.await.unwrap();
    }
    assert_eq!(
        status.len(),
        WRITERS * EACH,
        "every notification reached the client"
    );
    let unread: Vec<&String> = status
        .iter()
        .filter(|(_, s)| s.as_str() != "read")
        .map(|(id, _)| id)
        .collect();
    assert!(
        unread.is_empty(),
        "{} read changes never reached the client",
        unread.len()
    );
}
