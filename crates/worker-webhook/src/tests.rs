//! Unit tests of the worker: the headers a receiver verifies, the retry decision, and the
//! client's refusals (redirects, private addresses), against a local axum stand-in.

use super::*;
use axum::Router;
use axum::routing::post as axum_post;
use notify_core::webhook;
use store::PostResult;

fn msg(url: &str, secrets: &[&str]) -> ClaimedMessage {
    ClaimedMessage {
        id: Uuid::now_v7(),
        endpoint_id: Uuid::now_v7(),
        url: url.into(),
        secrets: secrets.iter().map(|s| s.to_string()).collect(),
        endpoint_enabled: true,
        body: r#"{"type":"delivery.sent","data":{}}"#.into(),
        attempt: 1,
        lease_token: Uuid::new_v4(),
        started_at: chrono::Utc::now(),
    }
}

/// An independent reading of the spec's verification: HMAC-SHA256 over
/// `id.timestamp.body`, base64, any `v1,` entry of the header matching.
fn verifies(secret: &str, headers: &[(&str, String)], body: &str) -> bool {
    let get = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| v.clone())
    };
    let (id, ts, sig) = (
        get("webhook-id").unwrap(),
        get("webhook-timestamp").unwrap(),
        get("webhook-signature").unwrap(),
    );
    let want = webhook::sign(secret, &id, ts.parse().unwrap(), body.as_bytes()).unwrap();
    sig.split(' ').any(|s| s == want)
}

#[test]
fn headers_carry_the_message_id_the_timestamp_and_one_signature_per_live_secret() {
    let a = webhook::new_secret(&[7; webhook::SECRET_BYTES]);
    let b = webhook::new_secret(&[9; webhook::SECRET_BYTES]);
    let m = msg("https://example.com/hook", &[&a, &b]);
    let h = post::headers(&m, 1_700_000_000);
    assert_eq!(h[0], ("webhook-id", webhook::message_id(m.id)));
    assert!(h[0].1.starts_with("msg_"));
    assert_eq!(h[1], ("webhook-timestamp", "1700000000".to_string()));
    assert_eq!(h[2].1.split(' ').count(), 2);
    assert!(verifies(&a, &h, &m.body));
    assert!(verifies(&b, &h, &m.body));
    assert!(!verifies(&a, &h, r#"{"type":"delivery.failed","data":{}}"#));
}

#[test]
fn a_2xx_is_sent_a_failure_retries_with_growing_delays_until_the_cap() {
    let retry = RetryPolicy {
        delays: vec![Duration::from_secs(5), Duration::from_secs(300)],
        max_attempts: 3,
        ..RetryPolicy::default()
    };
    let mut m = msg("https://example.com/", &["whsec_AAAA"]);
    let ok = PostResult {
        status_code: Some(204),
        ..Default::default()
    };
    assert_eq!(next_step(&retry, &m, &ok, 0.5), MessageNext::Sent);
    let bad = PostResult {
        status_code: Some(500),
        error: Some("http_500".into()),
        ..Default::default()
    };
    let MessageNext::Retry(first) = next_step(&retry, &m, &bad, 0.5) else {
        panic!("a retry after the first failure")
    };
    m.attempt = 2;
    let MessageNext::Retry(second) = next_step(&retry, &m, &bad, 0.5) else {
        panic!("a retry after the second failure")
    };
    assert!(second > first, "{second:?} > {first:?}");
    m.attempt = 3;
    assert_eq!(next_step(&retry, &m, &bad, 0.5), MessageNext::Failed);
}

async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn dev_policy(hosts: &[&str]) -> LinkPolicy {
    LinkPolicy {
        http_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        deep_link_schemes: vec![],
    }
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_counts_as_a_failure() {
    let app = Router::new()
        .route(
            "/hook",
            axum_post(|| async { axum::response::Redirect::temporary("/elsewhere") }),
        )
        .route("/elsewhere", axum_post(|| async { "followed" }));
    let addr = serve(app).await;
    let policy = dev_policy(&["127.0.0.1"]);
    let http = post::client(&policy, Duration::from_secs(2)).unwrap();
    let m = msg(
        &format!("http://127.0.0.1:{}/hook", addr.port()),
        &["whsec_AAAA"],
    );
    let r = post::post(&http, &policy, &m).await;
    assert_eq!(r.status_code, Some(307));
    assert_eq!(r.error.as_deref(), Some("http_307"));
}

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused_at_connect_time_unless_a_dev_host() {
    let addr = serve(Router::new().route("/hook", axum_post(|| async { "ok" }))).await;
    // The resolver the client connects through: `localhost` is no dev host here, and
    // it resolves to loopback only.
    use reqwest::dns::Resolve;
    let resolver = post::PublicOnly {
        policy: dev_policy(&[]),
    };
    let name: reqwest::dns::Name = "localhost".parse().unwrap();
    let err = match resolver.resolve(name).await {
        Ok(addrs) => panic!("resolved to {:?}", addrs.collect::<Vec<_>>()),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("no public address"), "{err}");

    let policy = dev_policy(&["localhost"]);
    let http = post::client(&policy, Duration::from_secs(2)).unwrap();
    let m = msg(
        &format!("http://localhost:{}/hook", addr.port()),
        &["whsec_AAAA"],
    );
    let r = post::post(&http, &policy, &m).await;
    assert_eq!(r.status_code, Some(200), "{r:?}");
    assert_eq!(r.error, None);
}

#[tokio::test]
async fn a_hanging_endpoint_times_out_within_the_timeout() {
    let app = Router::new().route(
        "/hook",
        axum_post(|| async {
            std::future::pending::<()>().await;
            "never"
        }),
    );
    let addr = serve(app).await;
    let policy = dev_policy(&["127.0.0.1"]);
    let http = post::client(&policy, Duration::from_millis(300)).unwrap();
    let m = msg(
        &format!("http://127.0.0.1:{}/hook", addr.port()),
        &["whsec_AAAA"],
    );
    let r = post::post(&http, &policy, &m).await;
    assert_eq!(r.error.as_deref(), Some("timeout"));
    assert!(r.latency < Duration::from_secs(2), "{:?}", r.latency);
}
