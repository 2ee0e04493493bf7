//! The feed: pages of the user's notifications, the unread count, and the read /
//! archive changes.

use super::extract::{Params, json_body_or_empty, path_id};
use super::{MAX_PAGE, User};
use crate::AppState;
use crate::error::ApiError;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use notify_core::InboxStatus;
use notify_store::inbox::{self, Filter, InboxItem};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

/// "Today", "Yesterday" or "Earlier" for `at`, in `tz`, seen at `now`.
pub fn group_label(at: DateTime<Utc>, now: DateTime<Utc>, tz: chrono_tz::Tz) -> &'static str {
    let day = at.with_timezone(&tz).date_naive();
    let today = now.with_timezone(&tz).date_naive();
    if day >= today {
        "Today"
    } else if Some(day) == today.pred_opt() {
        "Yesterday"
    } else {
        "Earlier"
    }
}

pub(super) fn item_json(i: &InboxItem, now: DateTime<Utc>, tz: chrono_tz::Tz) -> Value {
    let mut v = serde_json::to_value(i).unwrap_or_default();
    v["seq"] = json!(i.seq);
    v["group"] = json!(group_label(i.created_at, now, tz));
    v
}

fn encode_cursor(i: &InboxItem) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}:{}", i.created_at.timestamp_micros(), i.id))
}

fn decode_cursor(c: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(c).ok()?).ok()?;
    let (micros, id) = text.split_once(':')?;
    Some((
        DateTime::from_timestamp_micros(micros.parse().ok()?)?,
        Uuid::parse_str(id).ok()?,
    ))
}

pub(super) async fn tz_of(app: &AppState, user: &str) -> chrono_tz::Tz {
    inbox::timezone_of(&app.pool, user)
        .await
        .ok()
        .and_then(|t| notify_core::validate::parse_timezone(&t))
        .unwrap_or(chrono_tz::Asia::Bangkok)
}

/// What a `POST /v1/inbox/notifications/{id}/...` route does to an item. The one place
/// where the routes' names meet the store's inbox status values.
#[derive(Debug, Clone, Copy)]
pub(super) enum Change {
    /// `.../read`.
    Read,
    /// `.../unread`.
    Unread,
    /// `.../archive`.
    Archive,
    /// `.../unarchive`: back to the inbox, read.
    Unarchive,
}

impl Change {
    /// The inbox status the item gets.
    fn status(self) -> InboxStatus {
        match self {
            Change::Read | Change::Unarchive => InboxStatus::Read,
            Change::Unread => InboxStatus::Unread,
            Change::Archive => InboxStatus::Archived,
        }
    }
}

/// The `status` query parameter of a page: the inbox (unread and read) when absent.
fn filter_of(status: Option<&str>) -> Result<Filter, ApiError> {
    match status {
        None | Some("") => Ok(Filter::Inbox),
        Some(s) => match s.parse::<InboxStatus>() {
            Ok(InboxStatus::Unread) => Ok(Filter::Unread),
            Ok(InboxStatus::Read) => Ok(Filter::Read),
            Ok(InboxStatus::Archived) => Ok(Filter::Archived),
            Err(_) => Err(ApiError::invalid(
                "status",
                "must be unread, read or archived",
            )),
        },
    }
}

/// `GET /v1/inbox/notifications?status=unread|read|archived&limit=1..100&cursor=`:
/// `{"items", "next_cursor", "feed_seq", "timezone"}`. `feed_seq` is the user's feed
/// position read just before the page (open the stream with it as `Last-Event-ID` to
/// miss nothing that arrives after the page); `timezone` is the user's, which the
/// `group` labels follow.
pub(super) async fn list(
    State(app): State<AppState>,
    User(user): User,
    q: Params,
) -> Result<Json<Value>, ApiError> {
    let filter = filter_of(q.get("status"))?;
    let limit = match q.get("limit").map(str::parse::<i64>) {
        None => 20,
        Some(Ok(n)) if (1..=MAX_PAGE).contains(&n) => n,
        Some(_) => {
            return Err(ApiError::invalid(
                "limit",
                "must be a whole number from 1 to 100",
            ));
        }
    };
    let after =
        match q.get("cursor") {
            None | Some("") => None,
            Some(c) => Some(decode_cursor(c).ok_or_else(|| {
                ApiError::invalid("cursor", "must be a next_cursor from this API")
            })?),
        };
    // Read before the page: every change up to it is committed (seq commits in order),
    // so the page holds it; a stream resumed from it replays whatever came after.
    let feed_seq = inbox::latest_seq(&app.pool, &user).await?;
    let items = inbox::list(&app.pool, &user, filter, after, limit + 1).await?;
    let more = items.len() as i64 > limit;
    let items = &items[..items.len().min(limit as usize)];
    let (now, tz) = (Utc::now(), tz_of(&app, &user).await);
    Ok(Json(json!({
        "items": items.iter().map(|i| item_json(i, now, tz)).collect::<Vec<_>>(),
        "next_cursor": if more { items.last().map(encode_cursor) } else { None },
        "feed_seq": feed_seq,
        "timezone": tz.name(),
    })))
}

/// `GET /v1/inbox/unread-count`.
pub(super) async fn unread_count(
    State(app): State<AppState>,
    User(user): User,
) -> Result<Json<Value>, ApiError> {
    let n = inbox::unread_count(&app.pool, &user).await?;
    Ok(Json(json!({"unread": n})))
}

/// `POST /v1/inbox/notifications/{id}/read|unread|archive|unarchive`: the changed item.
pub(super) async fn change(
    State(app): State<AppState>,
    User(user): User,
    id: Result<Path<String>, PathRejection>,
    change: Change,
) -> Result<Json<Value>, ApiError> {
    let id = path_id(id, "a notification")?;
    let item = inbox::set_status(&app.pool, &user, id, change.status())
        .await?
        .ok_or(ApiError::not_found("id", "no such notification"))?;
    let tz = tz_of(&app, &user).await;
    Ok(Json(item_json(&item, Utc::now(), tz)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReadAll {
    #[serde(default)]
    up_to_seq: Option<i64>,
}

/// `POST /v1/inbox/read-all` `{"up_to_seq": N}` (optional): marks read every unread item
/// up to the newest change the client has seen, so one that arrives meanwhile stays
/// unread.
pub(super) async fn read_all(
    State(app): State<AppState>,
    User(user): User,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let req: ReadAll = json_body_or_empty(body)?;
    let marked = inbox::read_all(&app.pool, &user, req.up_to_seq).await?;
    let unread = inbox::unread_count(&app.pool, &user).await?;
    Ok(Json(json!({"marked_read": marked, "unread": unread})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_labels_follow_the_users_calendar() {
        let bkk = chrono_tz::Asia::Bangkok;
        let now: DateTime<Utc> = "2026-11-30T18:00:00Z".parse().unwrap(); // 01:00 Dec 1 in Bangkok
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        assert_eq!(group_label(at("2026-11-30T17:30:00Z"), now, bkk), "Today"); // 00:30 Dec 1
        assert_eq!(
            group_label(at("2026-11-30T16:30:00Z"), now, bkk),
            "Yesterday"
        ); // 23:30 Nov 30
        assert_eq!(group_label(at("2026-11-29T16:30:00Z"), now, bkk), "Earlier");
        // The same instants in UTC would all be "Today" or "Yesterday" differently.
        assert_eq!(
            group_label(at("2026-11-30T16:30:00Z"), now, chrono_tz::UTC),
            "Today"
        );
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let i = InboxItem {
            id: Uuid::from_u128(7),
            type_key: "t".into(),
            title: String::new(),
            body: String::new(),
            url: None,
            image_url: None,
            actions: Vec::new(),
            clicked_action: None,
            clicked_at: None,
            data: json!({}),
            status: InboxStatus::Unread,
            created_at: "2026-11-30T18:00:00.123456Z".parse().unwrap(),
            updated_at: Utc::now(),
            item_count: 1,
            seq: 1,
            delivery_id: Uuid::from_u128(8),
        };
        assert_eq!(
            decode_cursor(&encode_cursor(&i)),
            Some((i.created_at, i.id))
        );
        assert_eq!(decode_cursor("nope"), None);
        assert_eq!(decode_cursor(""), None);
    }
}
