//! The in-app channel: writes the recipient's inbox row (`notifications`), idempotent on
//! the delivery id, so a redelivered message never shows a notification twice.

use notify_core::{AttemptOutcome, Channel, ErrorClass};
use notify_store::PgPool;
use notify_worker::{ChannelSender, Job};
use serde_json::json;

/// Sender for the in-app inbox.
pub struct InAppSender {
    pool: PgPool,
}

impl InAppSender {
    /// A sender writing through `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

impl ChannelSender for InAppSender {
    fn channel(&self) -> Channel {
        Channel::InApp
    }

    async fn send(&self, job: &Job) -> AttemptOutcome {
        let content = json!({
            "user_id": job.user_id,
            "title": job.content.title,
            "body": job.content.body,
            "url": job.content.url,
        });
        match notify_store::deliveries::insert_inbox_notification(&self.pool, job).await {
            Ok(created) => AttemptOutcome::sent(None, content).with_response(if created {
                "inbox row written"
            } else {
                "inbox row already present"
            }),
            Err(e) => AttemptOutcome::failed(ErrorClass::Transient, "inbox_write_failed", content)
                .with_response(e.to_string()),
        }
    }
}
