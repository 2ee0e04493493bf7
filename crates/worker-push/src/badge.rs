//! The app icon badge sent with FCM (`android.notification.notification_count`, and
//! `apns.payload.aps.badge` for iOS apps reached through FCM) and APNs (`aps.badge`).
//!
//! [`Badge::UnreadCount`] is the recipient's unread in-app count, read from Postgres on
//! every attempt just before the provider call (a retry reads it again). It counts:
//! - the user's `notifications` rows with status `unread` (a digest group's row counts
//!   once, however many events it holds), and
//! - this event's own in-app delivery to the same user when its row is not written yet
//!   (the delivery is `pending` or `sending`): the in-app and push deliveries of one event
//!   are sent by different workers at the same time, so whether the inbox row already
//!   exists is a race. Counting the row-to-be makes the badge the same either way: it is
//!   the count the user sees once this notification is in the inbox. An in-app delivery
//!   that merges into a digest group row that is already unread adds nothing.
//!
//! Web Push has no badge field in a notification and gets none.

use notify_core::content::Badge;
use notify_store::PgPool;
use notify_worker::Job;

/// Most a badge can show: APNs `badge` and FCM `notification_count` are 32-bit.
pub const MAX_BADGE: u32 = i32::MAX as u32;

/// Why the unread count could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BadgeError {
    /// The sender has no database (built without [`crate::PushSender::with_inbox`]).
    #[error("the badge policy is unread_count but the push sender has no database")]
    NoDatabase,
    /// The query failed.
    #[error("reading the unread count: {0}")]
    Db(#[from] notify_store::sqlx::Error),
}

/// The unread in-app count of `job`'s recipient as described in the module docs.
///
/// # Errors
/// [`BadgeError::Db`] when the query fails.
pub async fn unread_count(db: &PgPool, job: &Job) -> Result<u32, BadgeError> {
    let n: i64 = notify_store::sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM notifications WHERE user_id = $1 AND status = 'unread')
              + (SELECT count(*) FROM notification_deliveries d
                  WHERE d.event_id = $2 AND d.user_id = $1 AND d.channel = 'inapp'
                    AND d.status IN ('pending', 'sending')
                    AND NOT EXISTS (
                        SELECT 1 FROM notifications n
                         WHERE n.user_id = $1
                           AND (n.delivery_id = d.id OR d.id = ANY (n.delivery_ids)
                                OR (d.digest_key IS NOT NULL AND n.group_key = d.digest_key
                                    AND n.status = 'unread'))))",
    )
    .bind(&job.user_id)
    .bind(job.event_id)
    .fetch_one(db)
    .await?;
    Ok(u32::try_from(n).unwrap_or(MAX_BADGE).min(MAX_BADGE))
}

/// The number to send for `job`'s badge policy: `None` for [`Badge::Unchanged`] (no badge
/// field at all), `n` for [`Badge::Count`], the unread count for [`Badge::UnreadCount`].
///
/// # Errors
/// [`BadgeError`] when the unread count is needed and cannot be read.
pub async fn badge_for(db: Option<&PgPool>, job: &Job) -> Result<Option<u32>, BadgeError> {
    match job.content.badge {
        Badge::Unchanged => Ok(None),
        Badge::Count(n) => Ok(Some(n.min(MAX_BADGE))),
        Badge::UnreadCount => match db {
            Some(db) => unread_count(db, job).await.map(Some),
            None => Err(BadgeError::NoDatabase),
        },
    }
}
