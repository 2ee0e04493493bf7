//! The channel workers a platform runs in-process, each with the sender its worker
//! binary builds, pointed at this platform's simulator, MailDev or the simulator's SMTP
//! server.

use super::{
    APNS_KEY_ID, APNS_TEAM_ID, APNS_TOPIC, LINE_TOKEN, Platform, UNSUBSCRIBE_SECRET, VAPID_SUBJECT,
};
use notify_core::{Channel, RetryPolicy};
use notify_worker::WorkerConfig;
use std::sync::Arc;
use std::time::Duration;

impl Platform {
    /// The settings of a worker of this platform: its broker prefix and the test
    /// [`super::Options`] (concurrency, lease, retry delays, rate limits).
    pub(crate) fn worker_config(&self) -> WorkerConfig {
        WorkerConfig {
            amqp_url: self.stack.amqp_url.clone(),
            topology: self.topology.clone(),
            concurrency: self.opts.concurrency,
            lease: self.opts.lease,
            retry: RetryPolicy {
                delays: self.opts.retry_delays.clone(),
                ..RetryPolicy::default()
            },
            shutdown_grace: Duration::from_secs(10),
            worker_id: "test-worker".into(),
            rate_limits: self.opts.rate_limits.clone(),
            links: self.opts.links.clone(),
        }
    }

    /// Starts one channel's worker in-process.
    pub(crate) fn start_worker(&mut self, channel: Channel) {
        self.start_worker_named(channel, "test-worker");
    }

    /// Starts one channel's worker in-process, recording `worker_id` on its attempts.
    pub(crate) fn start_worker_named(&mut self, channel: Channel, worker_id: &str) {
        let mut cfg = self.worker_config();
        cfg.worker_id = worker_id.into();
        // The worker's own pool, configured as `notify_worker::main_with` does (generic
        // plans), so every test runs the workers' statements as production plans them.
        let mut c = notify_store::PoolConfig::new(self.db_url.clone());
        c.max_connections = self.opts.worker_pool_size.unwrap_or(5);
        c.generic_plans = true;
        let pool = notify_store::connect(&c).expect("worker pool");
        let s = self.worker_shutdown.clone();
        let task = match channel {
            Channel::InApp => {
                let sender = Arc::new(worker_inapp::InAppSender::new(pool.clone()));
                spawn_worker(cfg, pool, sender, s)
            }
            Channel::Email => {
                let sender = Arc::new(
                    worker_email::EmailSender::new(worker_email::EmailConfig {
                        breaker: self.opts.email_breaker,
                        ses_credentials: Some(("AKIDEXAMPLE".into(), "test-ses-secret".into())),
                        smtp_url: std::iter::once(if self.opts.smtp_sim {
                            self.smtp_sim_url.clone()
                        } else {
                            self.stack.smtp_url.clone()
                        })
                        .chain(self.opts.email_backups.iter().cloned())
                        .collect::<Vec<_>>()
                        .join(","),
                        from: lettre::message::Mailbox::new(
                            Some("ฝ่ายบริการลูกค้า, ร้านตัวอย่าง".into()),
                            "noreply@example.test".parse().unwrap(),
                        ),
                        message_id_domain: "example.test".into(),
                        timeout: Duration::from_secs(10),
                        unsubscribe_url: format!("{}/unsubscribe", self.http_url),
                        unsubscribe_secret: UNSUBSCRIBE_SECRET.into(),
                        layout: Default::default(),
                    })
                    .unwrap()
                    .with_states(pool.clone()),
                );
                spawn_worker(cfg, pool, sender, s)
            }
            Channel::Line => {
                let sender = Arc::new(
                    worker_line::LineSender::new(worker_line::LineConfig {
                        api_base: self.sim_url.clone(),
                        channel_token: LINE_TOKEN.into(),
                        timeout: Duration::from_secs(5),
                    })
                    .unwrap(),
                );
                spawn_worker(cfg, pool, sender, s)
            }
            Channel::Push => {
                let sender = Arc::new(
                    worker_push::PushSender::new(worker_push::PushConfig {
                        fcm_api_base: self.sim_url.clone(),
                        fcm_service_account_file: self.service_account_file.0.display().to_string(),
                        fcm_project_id: None,
                        timeout: Duration::from_secs(5),
                        apns: Some(worker_push::apns::ApnsConfig {
                            api_base: self.sim_url.clone(),
                            key_pem: std::fs::read_to_string(&self.stack.apns_key_file)
                                .expect("apns key"),
                            key_id: APNS_KEY_ID.into(),
                            team_id: APNS_TEAM_ID.into(),
                            topic: APNS_TOPIC.into(),
                            timeout: Duration::from_secs(5),
                        }),
                        webpush: Some(worker_push::webpush::WebPushConfig {
                            vapid_key_pem: std::fs::read_to_string(&self.stack.vapid_key_file)
                                .expect("vapid key"),
                            vapid_subject: VAPID_SUBJECT.into(),
                            base_override: format!("{}/webpush", self.sim_url),
                            ttl: Duration::from_secs(3600),
                            timeout: Duration::from_secs(5),
                            links: super::test_links(),
                        }),
                    })
                    .unwrap()
                    .with_inbox(pool.clone()),
                );
                spawn_worker(cfg, pool, sender, s)
            }
        };
        self.workers.push(task);
    }
}

/// Runs `sender`'s worker loop as a task until `shutdown`; the task panics if the loop
/// ends with an error.
fn spawn_worker<S: notify_worker::ChannelSender>(
    cfg: WorkerConfig,
    pool: sqlx::PgPool,
    sender: Arc<S>,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        notify_worker::run(cfg, pool, sender, Default::default(), shutdown)
            .await
            .unwrap()
    })
}
