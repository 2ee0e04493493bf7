//! Helpers for tests of the runtime and of the adapters (feature `testing`; the runtime's
//! own unit tests use [`job`]). Adapter tests call a [`crate::ChannelSender`] directly, with
//! no broker and no database, against the provider simulator started in-process on port 0
//! ([`Sim::start`]), and change its answers with faults ([`Sim::fault`], the JSON of
//! `provider_sim::Fault`).

use notify_core::outcome::{AttemptError, AttemptOutcome, AttemptResult};
use notify_store::deliveries::DeliveryJob;

/// A delivery of `channel` through `provider` (parsed, so it serves typed and text row
/// fields alike), on its first attempt, created now: user
/// `u`, locale `th-TH`, an active endpoint 7 with token `tok`, a title and a body.
pub fn job(channel: &str, provider: &str) -> DeliveryJob {
    DeliveryJob {
        id: uuid::Uuid::new_v4(),
        event_id: uuid::Uuid::new_v4(),
        event_key: "k".into(),
        type_key: "t".into(),
        priority: "normal".parse().expect("a priority"),
        category: "transactional".parse().expect("a category"),
        digest_key: None,
        user_id: "u".into(),
        channel: channel.parse().expect("a channel"),
        provider: provider.parse().expect("a provider"),
        attempt: 1,
        max_attempts: 5,
        idempotency_key: "k".into(),
        retry_key: Some(uuid::Uuid::new_v4()),
        lease_token: uuid::Uuid::nil(),
        started_at: chrono::Utc::now(),
        created_at: chrono::Utc::now(),
        first_attempt_at: chrono::Utc::now(),
        type_updated_at: None,
        address: None,
        display_name: String::new(),
        locale: "th-TH".into(),
        timezone: "Asia/Bangkok".into(),
        payload: serde_json::json!({}),
        content: notify_core::Content {
            title: "Order paid".into(),
            body: "Your order 1234 is paid.".into(),
            ..Default::default()
        },
        endpoint_id: Some(uuid::Uuid::from_u128(7)),
        endpoint_platform: Some(provider.parse().expect("a platform")),
        endpoint_token: Some("tok".into()),
        endpoint_subscription: None,
        endpoint_status: Some(notify_core::EndpointStatus::Active),
        critical: false,
        quiet_hours: Vec::new(),
        due: Default::default(),
        escalation_answered: None,
        cause: notify_core::plan::Cause::Planned,
        state_version: 0,
    }
}

/// The failure of `out`; panics (naming the outcome) when it was sent.
pub fn failure(out: &AttemptOutcome) -> &AttemptError {
    out.error()
        .unwrap_or_else(|| panic!("expected a failure, got {out:?}"))
}

/// Whether `out` is a success, and its provider message id.
pub fn sent_id(out: &AttemptOutcome) -> Option<Option<&str>> {
    match &out.result {
        AttemptResult::Sent {
            provider_message_id,
        } => Some(provider_message_id.as_deref()),
        AttemptResult::Failed(_) => None,
    }
}

/// What one failed row of an adapter's table of answers must come out as.
#[derive(Debug, Clone)]
pub struct Expect {
    /// Its class.
    pub class: notify_core::ErrorClass,
    /// The error code stored with the attempt.
    pub code: &'static str,
    /// The metric reason.
    pub reason: &'static str,
    /// Whether the provider may have accepted it.
    pub ambiguous: bool,
    /// The provider's status.
    pub status: Option<i32>,
    /// The provider's `Retry-After`.
    pub retry_after: Option<std::time::Duration>,
}

impl Expect {
    /// A failure of `class` with `code` whose reason is the code itself, not ambiguous,
    /// with provider status `status` and no `Retry-After`.
    pub fn failed(class: notify_core::ErrorClass, code: &'static str, status: Option<i32>) -> Self {
        Self {
            class,
            code,
            reason: code,
            ambiguous: false,
            status,
            retry_after: None,
        }
    }

    /// With metric reason `reason`.
    pub fn reason(mut self, reason: &'static str) -> Self {
        self.reason = reason;
        self
    }

    /// Ambiguous.
    pub fn ambiguous(mut self) -> Self {
        self.ambiguous = true;
        self
    }

    /// With `Retry-After` `after`.
    pub fn retry_after(mut self, after: std::time::Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Asserts that `out` (the answer of table row `row`) is this failure.
    pub fn check(&self, row: &str, out: &AttemptOutcome) {
        let got = failure(out);
        assert_eq!(got.class, self.class, "{row}: {out:?}");
        assert_eq!(got.code, self.code, "{row}: {out:?}");
        assert_eq!(got.reason.as_str(), self.reason, "{row}");
        assert_eq!(got.ambiguous, self.ambiguous, "{row}");
        assert_eq!(out.provider_status, self.status, "{row}");
        assert_eq!(got.retry_after, self.retry_after, "{row}");
    }
}

#[cfg(feature = "testing")]
pub use sim::*;

#[cfg(feature = "testing")]
mod sim {
    use crate::Lease;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    /// LINE channel token the simulator of [`Sim::start`] expects.
    pub const LINE_TOKEN: &str = "adapter-test-line-token";
    /// FCM project of the simulator of [`Sim::start`].
    pub const FCM_PROJECT: &str = "adapter-test";
    /// APNs key id, team id and topic the simulator of [`Sim::start`] expects.
    pub const APNS: (&str, &str, &str) = ("TESTKEY001", "TESTTEAM01", "test.notify.app");
    /// The service account's email the simulator expects in the assertion.
    const FCM_EMAIL: &str = "adapter@adapter-test.iam.gserviceaccount.com";

    /// A one-shot fault for `provider` answering `status`, with `extra` fields of
    /// `provider_sim::Fault` (`body`, `retry_after`, `delay_ms`, `target_contains`).
    pub fn fault(provider: &str, status: u16, extra: serde_json::Value) -> serde_json::Value {
        let mut f = serde_json::json!({"provider": provider, "status": status, "times": 1});
        if let (Some(f), Some(extra)) = (f.as_object_mut(), extra.as_object()) {
            f.extend(extra.clone());
        }
        f
    }

    /// A lease held for a minute that never asks a database.
    pub fn lease() -> Lease {
        Lease::held_for(Duration::from_secs(60))
    }

    /// The provider simulator (HTTP providers and SMTP) running in this process on
    /// ports chosen by the system; stopped on drop.
    pub struct Sim {
        /// Base URL of the HTTP providers (`http://127.0.0.1:<port>`).
        pub url: String,
        /// URL of the SMTP server (`smtp://127.0.0.1:<port>`).
        pub smtp_url: String,
        /// The SMTP server's state (accepted messages).
        pub smtp: provider_sim::smtp::SmtpSim,
        /// PEM (PKCS #8) of the APNs signing key the simulator trusts.
        pub apns_key_pem: String,
        /// A service-account key file whose `token_uri` is this simulator.
        pub fcm_key_file: std::path::PathBuf,
        http: reqwest::Client,
        stop: CancellationToken,
    }

    impl Sim {
        /// Starts the simulator, with a fresh APNs key and the test FCM key.
        pub async fn start() -> Sim {
            use p256::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
            notify_telemetry::install_crypto_provider();
            let apns = p256::SecretKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
            let apns_key_pem = apns.to_pkcs8_pem(LineEnding::LF).expect("pem").to_string();
            let apns_public = apns
                .public_key()
                .to_public_key_pem(LineEnding::LF)
                .expect("pem");
            let stop = CancellationToken::new();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let cfg = provider_sim::SimConfig {
                line_channel_token: LINE_TOKEN.into(),
                line_channel_secret: "adapter-test-line-secret".into(),
                fcm_public_key_pem: include_str!("../testdata/fcm-test-public.pem").into(),
                fcm_project_id: FCM_PROJECT.into(),
                fcm_client_email: FCM_EMAIL.into(),
                apns_public_key_pem: apns_public,
                apns_key_id: APNS.0.into(),
                apns_team_id: APNS.1.into(),
                apns_topic: APNS.2.into(),
            };
            tokio::spawn(provider_sim::serve(listener, cfg, stop.clone()));
            let smtp_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let smtp_url = format!("smtp://{}", smtp_listener.local_addr().unwrap());
            let smtp = provider_sim::smtp::SmtpSim::default();
            tokio::spawn(smtp.clone().serve(smtp_listener, stop.clone()));
            let key = serde_json::json!({
                "type": "service_account",
                "project_id": FCM_PROJECT,
                "private_key_id": "adapter-test",
                "private_key": include_str!("../testdata/fcm-test-key.pem"),
                "client_email": FCM_EMAIL,
                "token_uri": format!("{url}/token"),
            });
            let fcm_key_file = std::env::temp_dir()
                .join(format!("notify-adapter-fcm-{}.json", uuid::Uuid::new_v4()));
            std::fs::write(&fcm_key_file, key.to_string()).unwrap();
            Sim {
                url,
                smtp_url,
                smtp,
                apns_key_pem,
                fcm_key_file,
                http: reqwest::Client::new(),
                stop,
            }
        }

        /// Adds a fault (`provider_sim::Fault` as JSON, e.g. `{"provider": "line",
        /// "status": 500}`); it answers the next matching requests.
        pub async fn fault(&self, fault: serde_json::Value) {
            let resp = self.post("/_sim/faults", &fault).await;
            assert!(resp.status().is_success(), "fault refused: {fault}");
        }

        /// Answers each row's fault with one call of `send`, checking the row's outcome.
        pub async fn run_table<F, Fut>(
            &self,
            table: &[(&str, serde_json::Value, crate::testing::Expect)],
            send: F,
        ) where
            F: Fn() -> Fut,
            Fut: std::future::Future<Output = notify_core::AttemptOutcome>,
        {
            for (row, fault, want) in table {
                self.fault(fault.clone()).await;
                want.check(row, &send().await);
                self.clear_faults().await;
            }
        }

        /// Removes every fault.
        pub async fn clear_faults(&self) {
            self.http
                .delete(format!("{}/_sim/faults", self.url))
                .send()
                .await
                .expect("simulator reachable");
        }

        /// `POST` of `body` to a control endpoint (`/_sim/...`), answering its JSON.
        pub async fn control(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
            self.post(path, &body)
                .await
                .json()
                .await
                .unwrap_or_default()
        }

        async fn post(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
            let url = format!("{}{path}", self.url);
            let sent = self.http.post(url).json(body).send().await;
            sent.expect("simulator reachable")
        }
    }

    impl Drop for Sim {
        fn drop(&mut self) {
            self.stop.cancel();
            let _ = std::fs::remove_file(&self.fcm_key_file);
        }
    }
}
