//! The in-app channel: writes the recipient's inbox row (`notifications`), idempotent on
//! the delivery id, so a redelivered message never shows a notification twice. Most
//! deliveries are written by the runtime without a claim, in the transaction that records
//! them sent ([`ChannelSender::inbox_content`]); the rest (digest groups, deliveries the
//! runtime hands to the claim) go through [`InAppSender`]'s `send`, whose rows of
//! concurrent deliveries are written together, one statement per batch. The row keeps
//! the rendered content: title, body, link, image and actions (the inbox shows them and
//! a click on an action is recorded against the delivery).

use notify_core::{AttemptOutcome, Channel, ErrorClass};
use notify_store::PgPool;
use notify_worker::batch::Batcher;
use notify_worker::{ChannelSender, Job, Lease};
use serde_json::json;
use std::sync::Arc;

/// Total deadline of one inbox write: twice the database pool's 5 s acquire timeout.
pub const INBOX_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Sender for the in-app inbox.
pub struct InAppSender {
    inbox: Batcher<Arc<Job>, bool>,
}

impl InAppSender {
    /// A sender writing through `pool`, up to 100 rows per statement, one statement at a
    /// time (the rows that arrive meanwhile go in the next: bigger statements under load,
    /// see `notify_worker`'s claim and record batches). Call it inside a Tokio runtime:
    /// it starts the batching loop.
    pub fn new(pool: PgPool) -> Self {
        let inbox = Batcher::start(1, 100, move |jobs: Vec<Arc<Job>>| {
            let pool = pool.clone();
            async move {
                let refs: Vec<&Job> = jobs.iter().map(|j| &**j).collect();
                notify_store::deliveries::insert_inbox_notifications(&pool, &refs).await
            }
        });
        Self { inbox }
    }
}

impl ChannelSender for InAppSender {
    fn channel(&self) -> Channel {
        Channel::InApp
    }

    /// [`INBOX_DEADLINE`].
    fn call_deadline(&self) -> std::time::Duration {
        INBOX_DEADLINE
    }

    /// The inbox row's content: what [`InAppSender::send`] records as sent.
    fn inbox_content(&self, job: &Job) -> Option<serde_json::Value> {
        Some(content(job))
    }

    async fn send(&self, job: &Job, lease: &Lease) -> AttemptOutcome {
        let content = content(job);
        if let Err(lost) = lease.confirm().await {
            return lost.outcome(content);
        }
        match self.inbox.call(Arc::new(job.clone())).await {
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

/// What an attempt records as sent: the inbox row's rendered content and its user.
fn content(job: &Job) -> serde_json::Value {
    json!({
        "user_id": job.user_id,
        "title": job.content.title,
        "body": job.content.body,
        "url": job.content.url,
        "image_url": job.content.image_url,
        "actions": job.content.actions,
    })
}
