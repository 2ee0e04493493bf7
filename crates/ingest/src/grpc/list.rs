//! `ListEvents` (`IngestService`): the caller's events, newest first, filtered by type,
//! creation time and recipient, paged by event id. Authorised like `GetEvent`: a caller
//! sees the events it sent, a caller that may manage sees every caller's.

use super::Services;
use crate::auth::Caller;
use crate::convert::ts;
use crate::error::ApiError;
use chrono::{DateTime, Utc};
use notify_core::validate::Violations;
use notify_proto::v1 as pb;
use notify_store::events::{self, EventFilter};
use uuid::Uuid;

/// Events per page when the request leaves `page_size` at 0.
pub(super) const DEFAULT_PAGE: u32 = 100;
/// Most events per page.
pub(super) const PAGE_MAX: u32 = 1_000;

/// A protobuf timestamp as an instant; a violation of `field` when it is out of range
/// (nanos outside 0..1e9, seconds beyond chrono's range).
fn instant(
    v: &mut Violations,
    field: &str,
    t: Option<prost_types::Timestamp>,
) -> Option<DateTime<Utc>> {
    let t = t?;
    let nanos = u32::try_from(t.nanos).ok().filter(|n| *n < 1_000_000_000);
    match nanos.and_then(|n| DateTime::from_timestamp(t.seconds, n)) {
        Some(d) => Some(d),
        None => {
            v.add(field, "must be a valid timestamp (nanos 0 to 999,999,999)");
            None
        }
    }
}

impl Services {
    pub(super) async fn list_events(
        &self,
        caller: Caller,
        r: pb::ListEventsRequest,
    ) -> Result<pb::ListEventsResponse, ApiError> {
        let mut v = Violations::default();
        let type_key = Some(r.r#type.trim().to_string()).filter(|t| !t.is_empty());
        if let Some(t) = &type_key {
            v.check_id("type", t, 255);
        }
        let recipient = Some(r.recipient.clone())
            .filter(|u| !u.is_empty())
            .and_then(|u| v.id("recipient", &u, 255));
        let created_after = instant(&mut v, "created_after", r.created_after);
        let created_before = instant(&mut v, "created_before", r.created_before);
        if let (Some(a), Some(b)) = (created_after, created_before)
            && a >= b
        {
            v.add("created_before", "must be later than created_after");
        }
        let page_size = match r.page_size {
            0 => DEFAULT_PAGE,
            n if n <= PAGE_MAX => n,
            _ => {
                v.add("page_size", "must be at most 1000");
                DEFAULT_PAGE
            }
        };
        let before = if r.page_token.is_empty() {
            None
        } else {
            match Uuid::parse_str(&r.page_token) {
                Ok(id) => Some(id),
                Err(_) => {
                    v.add("page_token", "must be a next_page_token from ListEvents");
                    None
                }
            }
        };
        v.into_result(()).map_err(ApiError::Invalid)?;
        let filter = EventFilter {
            caller: (!self.auth.reads_every_event(&caller)).then(|| caller.name.clone()),
            type_key,
            created_after,
            created_before,
            recipient,
        };
        let mut page =
            events::list_events(&self.pool, &filter, before, i64::from(page_size) + 1).await?;
        let more = page.len() > page_size as usize;
        page.truncate(page_size as usize);
        let next_page_token = if more {
            page.last().map(|e| e.id.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(pb::ListEventsResponse {
            events: page
                .into_iter()
                .map(|e| pb::EventSummary {
                    event_id: e.id.to_string(),
                    event_key: e.event_key,
                    r#type: e.type_key,
                    caller: e.caller,
                    recipients: e.recipients,
                    topic: e.topic.unwrap_or_default(),
                    created_at: Some(ts(e.created_at)),
                    send_at: e.send_at.map(ts),
                    canceled_at: e.canceled_at.map(ts),
                })
                .collect(),
            next_page_token,
        })
    }
}
