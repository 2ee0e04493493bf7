//! The push channel: one delivery per endpoint. FCM HTTP v1 is implemented
//! (`POST {base}/v1/projects/{project}/messages:send`,
//! firebase.google.com/docs/reference/fcm/rest/v1/projects.messages/send) with an OAuth2
//! access token obtained from the service-account key by gcp_auth (signed JWT grant to the
//! key's `token_uri`, cached and refreshed by gcp_auth before expiry); the message itself
//! is built in [`fcm`].
//!
//! Answers are sorted per the FCM error-code table: UNREGISTERED (404), SENDER_ID_MISMATCH
//! (403) and an invalid registration token (400 on `message.token`) deactivate the
//! endpoint; QUOTA_EXCEEDED (429) waits for Retry-After; UNAVAILABLE / INTERNAL (5xx) retry;
//! 401 UNAUTHENTICATED retries with a fresh access token; a 400 INVALID_ARGUMENT saying
//! the message is too big fails as `payload_too_large`; other 400s and 401
//! THIRD_PARTY_AUTH_ERROR fail at once. APNs endpoints go through [`apns`] and Web Push
//! subscriptions through [`webpush`] when those are configured; without their
//! configuration they fail permanently with `provider_not_configured`.
//!
//! The type's priority sets the platform overrides: FCM `android.priority` (`high` for
//! high, else `normal`), APNs `apns-priority` (10, or 5 for low) and Web Push `Urgency`.
//! The badge ([`badge`]) is read just before the FCM or APNs call.
//!
//! FCM limits a message's payload to 4,096 bytes (firebase.google.com/docs/cloud-messaging/concept-options,
//! "notification messages with optional data payload"). We count the whole `message`
//! object as JSON, which is stricter. What gives way when a payload does not fit is
//! [`fit`]'s rule for every provider: the body is shortened down to a minimum, and then
//! the delivery fails with `payload_too_large` naming the largest parts.

pub mod apns;
pub mod badge;
pub mod fcm;
pub mod fit;
pub mod webpush;

#[cfg(test)]
mod payload_tests;

pub use fcm::{FCM_MAX_PAYLOAD_BYTES, classify_fcm_error};

use gcp_auth::{CustomServiceAccount, TokenProvider};
use notify_core::{AttemptOutcome, Channel, ErrorClass};
use notify_store::PgPool;
use notify_worker::{ChannelSender, Job, Lease};
use serde_json::json;
use std::time::Duration;

/// OAuth2 scope for FCM sends.
pub const FCM_SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";

/// Settings of the push channel.
#[derive(Debug, Clone)]
pub struct PushConfig {
    /// FCM API base, `https://fcm.googleapis.com` in production.
    pub fcm_api_base: String,
    /// Path of the service-account key JSON (its `token_uri` is where tokens come from).
    pub fcm_service_account_file: String,
    /// Firebase project id; defaults to the key's `project_id`.
    pub fcm_project_id: Option<String>,
    /// Timeout of one HTTP call.
    pub timeout: Duration,
    /// APNs, when configured.
    pub apns: Option<apns::ApnsConfig>,
    /// Web Push, when configured.
    pub webpush: Option<webpush::WebPushConfig>,
}

impl PushConfig {
    /// Reads `NOTIFY_FCM_API_BASE` (https://fcm.googleapis.com),
    /// `NOTIFY_FCM_SERVICE_ACCOUNT_FILE` (required), `NOTIFY_FCM_PROJECT_ID` (from the key),
    /// `NOTIFY_HTTP_TIMEOUT` (10s); APNs when `NOTIFY_APNS_KEY_FILE` is set (the `.p8` key),
    /// with `NOTIFY_APNS_KEY_ID`, `NOTIFY_APNS_TEAM_ID`, `NOTIFY_APNS_TOPIC` (all required
    /// then) and `NOTIFY_APNS_API_BASE` (https://api.push.apple.com); Web Push when
    /// `NOTIFY_VAPID_PRIVATE_KEY_FILE` is set (PEM, PKCS #8, P-256), with
    /// `NOTIFY_VAPID_SUBJECT` (required then: `mailto:` or `https:`), `NOTIFY_WEBPUSH_TTL`
    /// (1d), `NOTIFY_WEBPUSH_BASE_OVERRIDE` (empty; a simulator's base URL) and the link
    /// policy's `NOTIFY_WEB_PUSH_HOSTS` and `NOTIFY_DEV_HTTP_HOSTS`.
    ///
    /// # Errors
    /// [`Missing`](notify_core::config::Missing) when a required variable is unset; every
    /// problem is also recorded in `env`.
    pub fn from_env(
        env: &mut notify_core::config::Env,
    ) -> Result<Self, notify_core::config::Missing> {
        let timeout = env.duration(
            "NOTIFY_HTTP_TIMEOUT",
            Duration::from_secs(10),
            Duration::from_secs(1),
            Duration::from_secs(600),
        );
        let apns = optional_key_file(env, "NOTIFY_APNS_KEY_FILE").map(|key_pem| {
            let api_base = env.base_url("NOTIFY_APNS_API_BASE", "https://api.push.apple.com");
            let key_id = env.required("NOTIFY_APNS_KEY_ID");
            let team_id = env.required("NOTIFY_APNS_TEAM_ID");
            let topic = env.required("NOTIFY_APNS_TOPIC");
            Ok(apns::ApnsConfig {
                api_base,
                key_pem,
                key_id: key_id?,
                team_id: team_id?,
                topic: topic?,
                timeout,
            })
        });
        let webpush =
            optional_key_file(env, "NOTIFY_VAPID_PRIVATE_KEY_FILE").map(|vapid_key_pem| {
                let vapid_subject = env.required("NOTIFY_VAPID_SUBJECT");
                Ok(webpush::WebPushConfig {
                    vapid_key_pem,
                    base_override: env.string("NOTIFY_WEBPUSH_BASE_OVERRIDE", ""),
                    ttl: env.parse_with("NOTIFY_WEBPUSH_TTL", Duration::from_secs(86_400), |s| {
                        notify_core::retry::parse_duration(s).map_err(|e| e.to_string())
                    }),
                    timeout,
                    links: notify_core::links::LinkPolicy::from_env(env),
                    vapid_subject: vapid_subject?,
                })
            });
        // Every variable is read before the first `?`, so every problem is recorded.
        Ok(Self {
            fcm_api_base: env.base_url("NOTIFY_FCM_API_BASE", "https://fcm.googleapis.com"),
            fcm_project_id: Some(env.string("NOTIFY_FCM_PROJECT_ID", "")).filter(|s| !s.is_empty()),
            fcm_service_account_file: env.required("NOTIFY_FCM_SERVICE_ACCOUNT_FILE")?,
            apns: apns.transpose()?,
            webpush: webpush.transpose()?,
            timeout,
        })
    }
}

/// The contents of the key file named by the optional variable `var`: `None` when it is
/// unset; an error on `env` (and an empty key) when the file cannot be read.
fn optional_key_file(env: &mut notify_core::config::Env, var: &str) -> Option<String> {
    let path = env.string(var, "");
    if path.is_empty() {
        return None;
    }
    Some(std::fs::read_to_string(&path).unwrap_or_else(|e| {
        env.error(format!("{var}={path:?} cannot be read: {e}"));
        String::new()
    }))
}

/// Why the push sender could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PushSetupError {
    /// The service-account key could not be read or parsed.
    #[error("NOTIFY_FCM_SERVICE_ACCOUNT_FILE={path:?} cannot be used: {source}")]
    Key {
        /// The configured path.
        path: String,
        /// Why.
        source: gcp_auth::Error,
    },
    /// No project id in the key and none configured.
    #[error("no FCM project id: set NOTIFY_FCM_PROJECT_ID or use a key with project_id")]
    NoProject,
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// APNs is configured but cannot be used.
    #[error("APNs: {0}")]
    Apns(#[from] apns::ApnsSetupError),
    /// Web Push is configured but cannot be used.
    #[error("Web Push: {0}")]
    WebPush(#[from] webpush::WebPushSetupError),
}

/// Sender for push endpoints.
pub struct PushSender {
    http: reqwest::Client,
    /// Token source; replaced (dropping its cached token) when FCM answers 401.
    fcm_auth: std::sync::RwLock<std::sync::Arc<CustomServiceAccount>>,
    fcm_key_file: String,
    fcm_send_url: String,
    apns: Option<apns::Apns>,
    webpush: Option<webpush::WebPush>,
    /// Total deadline of one send (OAuth token included): `NOTIFY_HTTP_TIMEOUT`.
    timeout: Duration,
    /// Where the unread in-app count for [`notify_core::content::Badge::UnreadCount`] is
    /// read; `None` fails such deliveries (`badge_unavailable`).
    inbox: Option<PgPool>,
}

impl PushSender {
    /// Reads the key and builds the client.
    pub fn new(cfg: PushConfig) -> Result<Self, PushSetupError> {
        let fcm_auth =
            CustomServiceAccount::from_file(&cfg.fcm_service_account_file).map_err(|source| {
                PushSetupError::Key {
                    path: cfg.fcm_service_account_file.clone(),
                    source,
                }
            })?;
        let project = cfg
            .fcm_project_id
            .clone()
            .or_else(|| fcm_auth.project_id().map(str::to_string))
            .ok_or(PushSetupError::NoProject)?;
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .user_agent(concat!("notify-worker-push/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let apns = cfg.apns.clone().map(apns::Apns::new).transpose()?;
        let webpush = cfg.webpush.clone().map(webpush::WebPush::new).transpose()?;
        Ok(Self {
            inbox: None,
            timeout: cfg.timeout,
            apns,
            webpush,
            http,
            fcm_auth: std::sync::RwLock::new(std::sync::Arc::new(fcm_auth)),
            fcm_key_file: cfg.fcm_service_account_file.clone(),
            fcm_send_url: format!(
                "{}/v1/projects/{project}/messages:send",
                cfg.fcm_api_base.trim_end_matches('/')
            ),
        })
    }

    /// Reads the unread in-app count for the badge from `pool` (the notifications
    /// database); see [`badge`].
    pub fn with_inbox(mut self, pool: PgPool) -> Self {
        self.inbox = Some(pool);
        self
    }

    /// The badge to send with `job`, read now; `Err` is the attempt's outcome when it
    /// cannot be read (transient for a database error).
    pub(crate) async fn badge(
        &self,
        job: &Job,
        content: &serde_json::Value,
    ) -> Result<Option<u32>, Box<AttemptOutcome>> {
        badge::badge_for(self.inbox.as_ref(), job)
            .await
            .map_err(|e| {
                let class = match e {
                    badge::BadgeError::NoDatabase => ErrorClass::Permanent,
                    badge::BadgeError::Db(_) => ErrorClass::Transient,
                };
                Box::new(
                    AttemptOutcome::failed(class, "badge_unavailable", content.clone())
                        .with_response(e.to_string()),
                )
            })
    }

    async fn send_fcm(
        &self,
        job: &Job,
        token: &str,
        badge: Option<u32>,
        lease: &Lease,
    ) -> AttemptOutcome {
        let fit = fit::Fit {
            provider: "FCM",
            limit: FCM_MAX_PAYLOAD_BYTES,
            build: fcm::message(job, token, badge),
            parts: fcm::FCM_PARTS,
        };
        let body = match fit.fit(&job.content.body, |v| v["message"].to_string().len()) {
            Ok(body) => body,
            Err(too_large) => return *too_large,
        };
        let content = json!({"request": body});
        let auth = self
            .fcm_auth
            .read()
            .map(|a| a.clone())
            .unwrap_or_else(|e| e.into_inner().clone());
        let access = match auth.token(&[FCM_SCOPE]).await {
            Ok(t) => t,
            Err(e) => {
                return AttemptOutcome::failed(ErrorClass::Transient, "fcm_oauth", content)
                    .with_response(e.to_string());
            }
        };
        let request = self
            .http
            .post(&self.fcm_send_url)
            .bearer_auth(access.as_str())
            .json(&body);
        let answer = match notify_worker::http::send(request, "fcm", lease).await {
            Ok(a) => a,
            Err(e) => return e.into_outcome(content),
        };
        let (status, retry_after, parsed) = (answer.status, answer.retry_after, answer.json());
        if status == 401 {
            // The cached access token was revoked or expired early: start over with a fresh
            // token source, so the retry fetches a new token.
            if let Ok(fresh) = CustomServiceAccount::from_file(&self.fcm_key_file)
                && let Ok(mut slot) = self.fcm_auth.write()
            {
                *slot = std::sync::Arc::new(fresh);
            }
        }
        let out = if status == 200 {
            AttemptOutcome::sent(parsed["name"].as_str().map(str::to_string), content)
        } else {
            let (class, code) = classify_fcm_error(status, &parsed);
            AttemptOutcome::failed(class, code, content).with_retry_after(retry_after)
        };
        out.with_status(status as i32).with_response(answer.body)
    }
}

impl ChannelSender for PushSender {
    fn channel(&self) -> Channel {
        Channel::Push
    }

    /// `NOTIFY_HTTP_TIMEOUT` (10 s): the whole send, access token and request included.
    fn call_deadline(&self) -> Duration {
        self.timeout
    }

    async fn send(&self, job: &Job, lease: &Lease) -> AttemptOutcome {
        let platform = job.endpoint_platform.as_deref().unwrap_or("");
        let content = json!({"endpoint_id": job.endpoint_id, "platform": platform});
        if job.endpoint_status != Some(notify_core::EndpointStatus::Active) {
            return AttemptOutcome::failed(ErrorClass::Permanent, "endpoint_revoked", content);
        }
        // Actions without an id get `action<N>`, as at ingest (a template may render one).
        let job = &Job {
            content: job.content.clone().normalized(),
            ..job.clone()
        };
        let not_configured = || {
            AttemptOutcome::failed(
                ErrorClass::Permanent,
                "provider_not_configured",
                content.clone(),
            )
        };
        match (platform, job.endpoint_token.as_deref()) {
            ("fcm", Some(token)) => match self.badge(job, &content).await {
                Ok(badge) => self.send_fcm(job, token, badge, lease).await,
                Err(failed) => *failed,
            },
            ("apns", Some(token)) => match &self.apns {
                Some(apns) => match self.badge(job, &content).await {
                    Ok(badge) => apns.send(job, token, badge, lease).await,
                    Err(failed) => *failed,
                },
                None => not_configured(),
            },
            ("webpush", Some(endpoint)) => match &self.webpush {
                Some(webpush) => webpush.send(job, endpoint, lease).await,
                None => not_configured(),
            },
            _ => not_configured(),
        }
    }
}
