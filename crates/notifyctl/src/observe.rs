//! What the providers received: the simulator's request log and MailDev's mailbox, read
//! and reset over their HTTP APIs. Used by `demo`, `chaos` and `bench` to check the
//! platform against the outside world.

use anyhow::Context;
use serde_json::Value;

/// Reads and resets the simulator and MailDev.
#[derive(Clone)]
pub struct Observer {
    http: reqwest::Client,
    sim_url: String,
    maildev_url: Option<String>,
}

impl Observer {
    /// An observer of the simulator at `sim_url` and, if given, MailDev at `maildev_url`.
    pub fn new(sim_url: &str, maildev_url: Option<&str>) -> Self {
        Self {
            http: reqwest::Client::new(),
            sim_url: sim_url.trim_end_matches('/').to_string(),
            maildev_url: maildev_url.map(|u| u.trim_end_matches('/').to_string()),
        }
    }

    /// Clears the simulator's request log, faults and latency, and MailDev's mailbox.
    pub async fn reset(&self) -> anyhow::Result<()> {
        for what in ["requests", "faults", "latency"] {
            self.http
                .delete(format!("{}/_sim/{what}", self.sim_url))
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .with_context(|| format!("clearing the simulator's {what}"))?;
        }
        if let Some(maildev) = &self.maildev_url {
            self.http
                .delete(format!("{maildev}/api/email/all"))
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .context("clearing MailDev")?;
        }
        Ok(())
    }

    /// Clears only the simulator's request log.
    pub async fn clear_requests(&self) -> anyhow::Result<()> {
        self.http
            .delete(format!("{}/_sim/requests", self.sim_url))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Sends a control request (`faults`, `latency`) to the simulator.
    pub async fn configure(&self, what: &str, body: &Value) -> anyhow::Result<()> {
        self.http
            .post(format!("{}/_sim/{what}", self.sim_url))
            .json(body)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Has the simulator's push service issue a Web Push subscription for `endpoint`, as a
    /// browser's `PushManager.subscribe` would: `{"endpoint", "keys": {"p256dh", "auth"}}`.
    pub async fn subscribe_webpush(&self, endpoint: &str) -> anyhow::Result<Value> {
        Ok(self
            .http
            .post(format!("{}/_sim/webpush/subscriptions", self.sim_url))
            .json(&serde_json::json!({"endpoint": endpoint}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    /// Requests the simulator recorded for `provider` (`line`, `fcm`, `oauth`, `apns`,
    /// `webpush`), oldest first.
    pub async fn requests(&self, provider: &str) -> anyhow::Result<Vec<Value>> {
        Ok(self
            .http
            .get(format!(
                "{}/_sim/requests?provider={provider}",
                self.sim_url
            ))
            .send()
            .await?
            .json()
            .await?)
    }

    /// Every email in MailDev (empty when no MailDev is observed).
    pub async fn mails(&self) -> anyhow::Result<Vec<Value>> {
        let Some(maildev) = &self.maildev_url else {
            return Ok(Vec::new());
        };
        Ok(self
            .http
            .get(format!("{maildev}/api/email"))
            .send()
            .await?
            .json()
            .await?)
    }
}
