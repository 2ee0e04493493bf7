//! The in-app inbox as end users see it: list with keyset pagination, unread count, read,
//! archive, and the change feed (`seq`) behind live updates. Every query is scoped to one
//! user: another user's notification is "not found", never shown. `seq` is a per-user
//! position that commits in order (see [`changes_since`]).

use crate::Result;
use crate::clicks::{ClickSource, NewClick, record_click};
use crate::row::parse;
use chrono::{DateTime, Utc};
use notify_core::InboxStatus;
use notify_core::content::Action;
use sqlx::types::Json;
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
    /// The https image shown with it, if any.
    pub image_url: Option<String>,
    /// Its buttons (`id`, `label`, `url`), in order; empty when none.
    pub actions: Vec<Action>,
    /// The id of the last action clicked (`""`: the notification itself); `None` when
    /// never clicked.
    pub clicked_action: Option<String>,
    /// When [`Self::clicked_action`] was clicked.
    pub clicked_at: Option<DateTime<Utc>>,
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
    /// The delivery whose content the item shows (a digest group's latest one).
    #[serde(skip)]
    pub delivery_id: Uuid,
}

fn item(r: sqlx::postgres::PgRow) -> Result<InboxItem> {
    Ok(InboxItem {
        id: r.get("id"),
        type_key: r.get("type"),
        title: r.get("title"),
        body: r.get("body"),
        url: r.get("url"),
        image_url: r.get("image_url"),
        actions: r.try_get::<Json<Vec<Action>>, _>("actions")?.0,
        clicked_action: r.get("clicked_action"),
        clicked_at: r.get("clicked_at"),
        data: r.get("data_json"),
        status: parse(&r, "status")?,
        created_at: r.get("created_at"),
        updated_at: r.get("updated_at"),
        item_count: r.get("item_count"),
        seq: r.get("seq"),
        delivery_id: r.get("shown_delivery_id"),
    })
}

const COLUMNS: &str = "id, type, title, body, url, image_url, actions, clicked_action, clicked_at,
     data_json, status, created_at, updated_at, item_count, seq,
     coalesce(delivery_ids[cardinality(delivery_ids)], delivery_id) AS shown_delivery_id";

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
             RETURNING *)
         SELECT {COLUMNS} FROM changed
         UNION ALL
         SELECT {COLUMNS} FROM notifications WHERE id = $2 AND user_id = $1 AND status = $3"
    )))
    .bind(user_id)
    .bind(id)
    .bind(status.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let row = row.map(item).transpose()?;
    if status == InboxStatus::Read
        && let Some(it) = &row
        && newly_read(&mut tx, id).await?
    {
        crate::webhooks::enqueue_for_deliveries(
            &mut tx,
            &[(it.delivery_id, crate::webhooks::EventType::NotificationRead)],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(row)
}

/// Whether item `id`'s read happened in this transaction (its `read_at` is the
/// transaction's `now()`): the first read writes `notification.read`, a repeat does not.
async fn newly_read(tx: &mut sqlx::PgConnection, id: Uuid) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(read_at = now(), false) FROM notifications WHERE id = $1",
    )
    .bind(id)
    .fetch_one(tx)
    .await?)
}

/// What [`click`] did.
#[derive(Debug, Clone)]
pub enum ClickOutcome {
    /// The click is recorded: the item after it (read unless archived, with
    /// `clicked_action` set) and the link to open (the action's, or the item's own for
    /// `""`; `None` when the item has none).
    Opened {
        /// The item after the click.
        item: Box<InboxItem>,
        /// Where the click goes.
        url: Option<String>,
        /// False when this action of this content was clicked before (counted once).
        counted: bool,
    },
    /// The item has no action with that id: nothing changed. Carries the ids it has.
    UnknownAction(Vec<String>),
}

/// Records that `user_id` clicked action `action_id` of item `id` (`""`: the item
/// itself): marks it read (an archived item stays archived), stores `clicked_action` and
/// `clicked_at`, and records the click against the delivery the item shows
/// ([`record_click`], source in-app, dedup key `inapp:<delivery id>:<action id>`, so a
/// double click counts once). The change takes the user's next `seq` unless the item was
/// already read with that action clicked. `None` when the user has no such item.
pub async fn click(
    db: &PgPool,
    user_id: &str,
    id: Uuid,
    action_id: &str,
) -> Result<Option<ClickOutcome>> {
    let mut tx = db.begin().await?;
    lock_feed(&mut tx, user_id).await?;
    let Some(row) = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM notifications WHERE id = $2 AND user_id = $1 FOR UPDATE"
    )))
    .bind(user_id)
    .bind(id)
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Ok(None);
    };
    let before = item(row)?;
    let url = if action_id.is_empty() {
        before.url.clone()
    } else {
        match before.actions.iter().find(|a| a.id == action_id) {
            Some(a) => Some(a.url.clone()),
            None => {
                return Ok(Some(ClickOutcome::UnknownAction(
                    before.actions.iter().map(|a| a.id.clone()).collect(),
                )));
            }
        }
    };
    let changed = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE notifications SET
             status = CASE WHEN status = 'unread' THEN 'read' ELSE status END,
             read_at = coalesce(read_at, now()),
             clicked_action = $3, clicked_at = now(), updated_at = now()
         WHERE id = $2 AND user_id = $1
           AND (status = 'unread' OR clicked_action IS DISTINCT FROM $3)
         RETURNING {COLUMNS}"
    )))
    .bind(user_id)
    .bind(id)
    .bind(action_id)
    .fetch_optional(&mut *tx)
    .await?;
    let after = match changed {
        Some(r) => item(r)?,
        None => before,
    };
    let dedup = format!("inapp:{}:{action_id}", after.delivery_id);
    let counted = record_click(
        &mut *tx,
        &NewClick {
            delivery_id: after.delivery_id,
            user_id,
            action_id,
            source: ClickSource::InApp,
            dedup_key: Some(&dedup),
        },
    )
    .await?;
    if counted {
        crate::webhooks::enqueue_for_deliveries(
            &mut tx,
            &[(
                after.delivery_id,
                crate::webhooks::EventType::NotificationClicked,
            )],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Some(ClickOutcome::Opened {
        item: Box::new(after),
        url,
        counted,
    }))
}

/// Marks every unread item of `user_id` read, up to and including the newest one the
/// client has seen (`up_to`, by `seq`; `None` = all at this moment). Items that arrive
/// later stay unread. Returns how many changed; each takes the user's next `seq`.
pub async fn read_all(db: &PgPool, user_id: &str, up_to: Option<i64>) -> Result<u64> {
    let mut tx = db.begin().await?;
    lock_feed(&mut tx, user_id).await?;
    let read: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE notifications SET status = 'read', read_at = now(), updated_at = now()
         WHERE user_id = $1 AND status = 'unread' AND ($2::bigint IS NULL OR seq <= $2)
         RETURNING delivery_id",
    )
    .bind(user_id)
    .bind(up_to)
    .fetch_all(&mut *tx)
    .await?;
    let typed: Vec<(Uuid, crate::webhooks::EventType)> = read
        .iter()
        .map(|d| (*d, crate::webhooks::EventType::NotificationRead))
        .collect();
    crate::webhooks::enqueue_for_deliveries(&mut tx, &typed).await?;
    tx.commit().await?;
    Ok(read.len() as u64)
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
