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
        ..Default::default()
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
    let resolver = notify_worker::http::PublicOnly::new(dev_policy(&[]));
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

/// An endpoint stored before the URL rule read hosts as reqwest does (a loopback address
/// spelt `127.1`, `0x7f000001` ...: as a claimed message carries it from the database) is
/// refused when the worker is about to connect: the attempt says `refused`, and the
/// listener on that port accepts no connection.
#[tokio::test]
async fn a_stored_loopback_spelling_is_refused_before_any_connection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let policy = dev_policy(&[]);
    let http = post::client(&policy, Duration::from_secs(2)).unwrap();
    for host in [
        "127.1",
        "2130706433",
        "0x7f000001",
        "0177.0.0.1",
        "127.0.0.1.",
        "%31%32%37.0.0.1",
        "127\u{3002}0\u{3002}0\u{3002}1",
        "[::ffff:127.0.0.1]",
    ] {
        let m = msg(&format!("https://{host}:{port}/hook"), &["whsec_AAAA"]);
        let r = post::post(&http, &policy, &m).await;
        let err = r.error.clone().unwrap_or_default();
        assert!(err.starts_with("refused: "), "{host}: {r:?}");
        assert_eq!(r.status_code, None, "{host}");
    }
    // Everything above ran to its result: had any attempt connected, the connection
    // would be waiting in the backlog now.
    let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(accepted.is_err(), "a connection was made: {accepted:?}");

    // The same listener does accept when the URL is allowed (the probe works).
    let policy = dev_policy(&["127.0.0.1"]);
    let http = post::client(&policy, Duration::from_millis(500)).unwrap();
    let m = msg(&format!("http://127.0.0.1:{port}/hook"), &["whsec_AAAA"]);
    let (r, accepted) = tokio::join!(post::post(&http, &policy, &m), listener.accept());
    assert!(accepted.is_ok(), "{r:?}");
}

fn config_errors(vars: &[(&str, &str)]) -> String {
    let mut env = notify_core::config::Env::from_vars(vars.iter().copied());
    let _ = WebhookConfig::from_env(&mut env);
    env.finish().err().unwrap_or_default()
}

#[test]
fn the_timeout_the_retry_delays_and_the_disable_period_are_bounded() {
    for (var, value, rule) in [
        ("NOTIFY_WEBHOOK_TIMEOUT", "0s", "must be from 1s to 600s"),
        ("NOTIFY_WEBHOOK_TIMEOUT", "500ms", "must be from 1s to 600s"),
        ("NOTIFY_WEBHOOK_TIMEOUT", "11m", "must be from 1s to 600s"),
        (
            "NOTIFY_WEBHOOK_RETRY_DELAYS",
            "5s,0s,1m",
            "every delay must be at least 1s",
        ),
        (
            "NOTIFY_WEBHOOK_RETRY_DELAYS",
            "500ms",
            "every delay must be at least 1s",
        ),
        ("NOTIFY_WEBHOOK_DISABLE_AFTER", "59s", "must be from 60s to"),
        ("NOTIFY_WEBHOOK_DISABLE_AFTER", "0s", "must be from 60s to"),
    ] {
        let errors = config_errors(&[(var, value)]);
        let line = errors
            .lines()
            .find(|l| l.starts_with(var))
            .unwrap_or_else(|| panic!("{var}={value} accepted: {errors}"));
        assert!(line.contains(rule), "{var}={value}: {line}");
    }
    for (var, value) in [
        ("NOTIFY_WEBHOOK_TIMEOUT", "1s"),
        ("NOTIFY_WEBHOOK_TIMEOUT", "10m"),
        ("NOTIFY_WEBHOOK_RETRY_DELAYS", "1s,2s,5s"),
        ("NOTIFY_WEBHOOK_DISABLE_AFTER", "1m"),
    ] {
        let errors = config_errors(&[(var, value)]);
        assert!(!errors.contains(var), "{var}={value}: {errors}");
    }
}
