//! The SMTP fault control of the standalone simulator: `POST /_sim/smtp/fault` makes every
//! `MAIL FROM` get that reply, `DELETE` ends it.

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn cfg() -> provider_sim::SimConfig {
    provider_sim::SimConfig {
        line_channel_token: "t".into(),
        line_channel_secret: "s".into(),
        fcm_public_key_pem: String::new(),
        fcm_project_id: "p".into(),
        fcm_client_email: "e".into(),
        apns_public_key_pem: String::new(),
        apns_key_id: String::new(),
        apns_team_id: String::new(),
        apns_topic: String::new(),
    }
}

/// The reply to `MAIL FROM` in a new SMTP session.
async fn mail_from_reply(addr: std::net::SocketAddr) -> String {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (r, mut w) = stream.into_split();
    let mut lines = BufReader::new(r).lines();
    lines.next_line().await.unwrap();
    w.write_all(b"HELO test\r\n").await.unwrap();
    lines.next_line().await.unwrap();
    w.write_all(b"MAIL FROM:<a@example.test>\r\n")
        .await
        .unwrap();
    lines.next_line().await.unwrap().unwrap()
}

#[tokio::test]
async fn an_smtp_fault_set_over_http_answers_every_mail_from_until_cleared() {
    notify_telemetry::init_for_tests();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let smtp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let smtp_addr = smtp_listener.local_addr().unwrap();
    let smtp = provider_sim::smtp::SmtpSim::default();
    tokio::spawn(smtp.clone().serve(smtp_listener, shutdown.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(provider_sim::serve_with_smtp(
        listener,
        cfg(),
        Some(smtp.clone()),
        shutdown.clone(),
    ));
    let http = reqwest::Client::new();
    assert_eq!(mail_from_reply(smtp_addr).await, "250 2.1.0 OK");
    let r = http
        .post(format!("{base}/_sim/smtp/fault"))
        .json(&serde_json::json!({"reply": "421 4.3.2 service not available"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(
        mail_from_reply(smtp_addr).await,
        "421 4.3.2 service not available"
    );
    assert_eq!(
        mail_from_reply(smtp_addr).await,
        "421 4.3.2 service not available"
    );
    let r = http
        .delete(format!("{base}/_sim/smtp/fault"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(mail_from_reply(smtp_addr).await, "250 2.1.0 OK");
    assert_eq!(smtp.mail_commands(), 4);
    shutdown.cancel();
}
