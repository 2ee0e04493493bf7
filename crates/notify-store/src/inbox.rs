//! The in-app inbox as end users see it: list with keyset pagination, unread count, read,
//! archive, and the change feed (`seq`) behind live updates. Every query is scoped to one
//! user: another user's notification is "not found", never shown. `seq` is a per-user
//! position that commits in order (see [`changes_since`]).

use crate::Result;
use crate::row::parse;
use chrono::{DateTime, Utc};
use notify_core::InboxStatus;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

/// One inbox item.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InboxItem {
    /// Notification id.
    pub id: Uuid,
    /// Notification type.
    #[serde(rename = "type")]
    pub type_key: String,
    /// Title.
    pub title: String,
    /// Body.
    pub body: String,
    /// Link, if any.
    pub url: Option<String>,
    /// The event's payload.
    pub data: serde_json::Value,
    /// Where it stands (serialised as `unread`, `read` or `archived`).
    pub status: InboxStatus,
    /// When it arrived.
    pub created_at: DateTime<Utc>,
    /// Last change (digest update, read, archive).
    pub updated_at: DateTime<Utc>,
    /// Events it stands for (more than 1 for a digest group).
    pub item_count: i32,
    /// Position in the user's change feed.
    #[serde(skip)]
    pub seq: i64,
}

fn item(r: sqlx::postgres::PgRow) -> Result<InboxItem> {
    Ok(InboxItem {
        id: r.get("id"),
        type_key: r.get("type"),
        title: r.get("title"),
        body: r.get("body"),
        url: r.get("url"),
        data: r.get("data_json"),
        status: parse(&r, "status")?,
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
        item_count: r.get("item_count"),
        seq: r.get("seq"),
    })
}

const COLUMNS: &str =
    "id, type, title, body, url, data_json, status, created_at, updated_at, item_count, seq";

/// Which items to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Unread and read (not archived).
    Inbox,
    /// Unread only.
    Unread,
    /// Read only.
    Read,
    /// Archived only.
    Archived,
}

/// Up to `limit` items of `user_id`, newest first, strictly after the keyset `after`
/// (`created_at`, `id`) when given.
pub async fn list(
    db: &PgPool,
    user_id: &str,
    filter: Filter,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Vec<InboxItem>> {
    let status = match filter {
        Filter::Inbox => "status <> 'archived'",
        Filter::Unread => "status = 'unread'",
        Filter::Read => "status = 'read'",
        Filter::Archived => "status = 'archived'",
    };
    let (at, id) = after.unzip();
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM notifications
         WHERE user_id = $1 AND {status}
           AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3))
         ORDER BY created_at DESC, id DESC LIMIT $4"
    )))
    .bind(user_id)
    .bind(at)
    .bind(id)
    .bind(limit)
    .fetch_all(db)
    .await?;
    rows.into_iter().map(item).collect()
}

/// Unread items of `user_id`.
pub async fn unread_count(db: impl PgExecutor<'_>, user_id: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM notifications WHERE user_id = $1 AND status = 'unread'",
    )
    .bind(user_id)
    .fetch_one(db)
    .await?)
}

/// Locks `user_id`'s feed counter (`inbox_user_seq`) for the rest of the transaction.
///
/// Every write of a notification takes the user's next `seq` from that row in a trigger,
/// which holds its lock until commit; an `UPDATE` locks its notification rows before the
/// trigger runs, so an update that did not lock the counter first could deadlock with a
/// digest upsert (counter, then row). A user without a counter row has no notifications,
/// so there is nothing to lock.
async fn lock_feed(tx: &mut sqlx::PgConnection, user_id: &str) -> Result<()> {
    sqlx::query("SELECT 1 FROM inbox_user_seq WHERE user_id = $1 FOR UPDATE")
        .bind(user_id)
        .fetch_optional(tx)
        .await?;
    Ok(())
}

/// Sets one item's status (unarchiving is setting it to [`InboxStatus::Read`]).
/// Idempotent. `None` when the user has no such item. A change takes the user's next
/// `seq` (so it reaches live streams, in commit order).
pub async fn set_status(
    db: &PgPool,
    user_id: &str,
    id: Uuid,
    status: InboxStatus,
) -> Result<Option<InboxItem>> {
    let mut tx = db.begin().await?;
    lock_feed(&mut tx, user_id).await?;
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH changed AS (
             UPDATE notifications SET status = $3,
                 read_at = CASE WHEN $3 = 'unread' THEN NULL ELSE coalesce(read_at, now()) END,
                 updated_at = now()
             WHERE id = $2 AND user_id = $1 AND status <> $3
             RETURNING {COLUMNS})
         SELECT {COLUMNS} FROM changed
         UNION ALL
         SELECT {COLUMNS} FROM notifications WHERE id = $2 AND user_id = $1 AND status = $3"
    )))
    .bind(user_id)
    .bind(id)
    .bind(status.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    row.map(item).transpose()
}

/// Marks every unread item of `user_id` read, up to and including the newest one the
/// client has seen (`up_to`, by `seq`; `None` = all at this moment). Items that arrive
/// later stay unread. Returns how many changed; each takes the user's next `seq`.
pub async fn read_all(db: &PgPool, user_id: &str, up_to: Option<i64>) -> Result<u64> {
    let mut tx = db.begin().await?;
    lock_feed(&mut tx, user_id).await?;
    let done = sqlx::query(
        "UPDATE notifications SET status = 'read', read_at = now(), updated_at = now()
         WHERE user_id = $1 AND status = 'unread' AND ($2::bigint IS NULL OR seq <= $2)",
    )
    .bind(user_id)
    .bind(up_to)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// Items of `user_id` changed after feed position `after`, oldest change first.
///
/// Exact under concurrent writers: a user's `seq` values commit in order (each writer
/// holds the user's counter row until it commits), so once a change with seq N is
/// visible, every committed change below N is too, and a reader that moves its position
/// to N skips nothing.
pub async fn changes_since(
    db: &PgPool,
    user_id: &str,
    after: i64,
    limit: i64,
) -> Result<Vec<InboxItem>> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM notifications WHERE user_id = $1 AND seq > $2
         ORDER BY seq LIMIT $3"
    )))
    .bind(user_id)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?;
    rows.into_iter().map(item).collect()
}

/// The user's latest feed position (0 when none).
pub async fn latest_seq(db: &PgPool, user_id: &str) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM notifications WHERE user_id = $1")
            .bind(user_id)
            .fetch_one(db)
            .await?,
    )
}

/// The user's IANA time zone (Asia/Bangkok when unknown).
pub async fn timezone_of(db: &PgPool, user_id: &str) -> Result<String> {
    Ok(
        sqlx::query_scalar("SELECT timezone FROM recipients WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(db)
            .await?
            .unwrap_or_else(|| "Asia/Bangkok".to_string()),
    )
}

/// Revokes one of `user_id`'s push endpoints (the user unregistered the device).
/// `None` when the user has no such endpoint; otherwise whether it was active.
pub async fn revoke_own_endpoint(db: &PgPool, user_id: &str, id: Uuid) -> Result<Option<bool>> {
    let row: Option<(bool,)> = sqlx::query_as(
        "WITH target AS (SELECT id, status FROM notification_endpoints WHERE id = $2 AND user_id = $1),
              upd AS (UPDATE notification_endpoints e SET status = 'revoked',
                          revoked_reason = 'unregistered_by_user', revoked_at = now()
                      FROM target WHERE e.id = target.id AND target.status = 'active' RETURNING e.id)
         SELECT EXISTS (SELECT 1 FROM upd) FROM target",
    )
    .bind(user_id)
    .bind(id)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| r.0))
}
