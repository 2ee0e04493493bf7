//! `CancelEvent`: validated by field, authorised like `GetEvent` (a caller cancels its
//! own events; one that may read every caller's events cancels any), then the one store
//! path `notify_store::cancel::cancel` (the console's cancel takes it too).

use super::Services;
use crate::auth::Caller;
use crate::convert::count32;
use crate::error::ApiError;
use notify_core::event::{MAX_CANCELLATION_KEY_BYTES, MAX_EVENT_KEY_BYTES, normalize_event_key};
use notify_core::validate::Violations;
use notify_proto::v1 as pb;
use notify_proto::v1::cancel_event_request::Target;
use notify_store::cancel::{self, CancelSelector};
use uuid::Uuid;

/// Most recipients one cancel may name (as many as one event may list).
const MAX_RECIPIENTS: usize = 1_000;

/// The target and recipients of a request, or one violation per bad field.
fn parse(r: pb::CancelEventRequest) -> Result<(CancelSelector, Vec<String>), ApiError> {
    let mut v = Violations::default();
    let selector = match r.target {
        Some(Target::EventId(id)) => match Uuid::parse_str(&id) {
            Ok(id) => Some(CancelSelector::Id(id)),
            Err(_) => {
                v.add("event_id", "must be a UUID");
                None
            }
        },
        Some(Target::EventKey(k)) => {
            let key = normalize_event_key(&k);
            v.check_id("event_key", &key, MAX_EVENT_KEY_BYTES)
                .then_some(CancelSelector::EventKey(key))
        }
        Some(Target::CancellationKey(k)) => {
            if k.is_empty() {
                v.add("cancellation_key", "is required and must not be blank");
                None
            } else {
                // NFC, as at CreateEvent: one key however the caller's text spells it.
                let key = normalize_event_key(&k);
                v.check_id("cancellation_key", &key, MAX_CANCELLATION_KEY_BYTES)
                    .then_some(CancelSelector::CancellationKey(key))
            }
        }
        None => {
            v.add(
                "target",
                "set exactly one of event_id, event_key, cancellation_key",
            );
            None
        }
    };
    if r.recipients.len() > MAX_RECIPIENTS {
        v.add(
            "recipients",
            format!(
                "must list at most {MAX_RECIPIENTS} users, got {}",
                r.recipients.len()
            ),
        );
    }
    let mut recipients = Vec::with_capacity(r.recipients.len());
    for (i, u) in r.recipients.iter().enumerate() {
        if let Some(u) = v.id(&format!("recipients[{i}]"), u, 255)
            && !recipients.contains(&u)
        {
            recipients.push(u);
        }
    }
    v.into_result(()).map_err(ApiError::Invalid)?;
    Ok((selector.expect("checked"), recipients))
}

impl Services {
    pub(super) async fn cancel_event(
        &self,
        caller: Caller,
        r: pb::CancelEventRequest,
    ) -> Result<pb::CancelEventResponse, ApiError> {
        let (selector, recipients) = parse(r)?;
        let may_manage = self.auth.reads_every_event(&caller);
        let out = cancel::cancel(&self.pool, &selector, &recipients, &caller.name, may_manage)
            .await
            .map_err(|e| match e {
                // The same answer as GetEvent's for an unknown or another caller's event.
                notify_store::StoreError::NotFound(_) => ApiError::NotFound {
                    kind: "notification event",
                    name: match &selector {
                        CancelSelector::Id(id) => id.to_string(),
                        CancelSelector::EventKey(k) | CancelSelector::CancellationKey(k) => {
                            k.clone()
                        }
                    },
                },
                e => ApiError::Store(e),
            })?;
        notify_telemetry::metrics::count_cancel(
            match &selector {
                CancelSelector::Id(_) => "event_id",
                CancelSelector::EventKey(_) => "event_key",
                CancelSelector::CancellationKey(_) => "cancellation_key",
            },
            out.newly_canceled,
        );
        tracing::info!(
            caller = %caller.name,
            events = out.event_ids.len(),
            canceled = out.newly_canceled,
            in_flight = out.in_flight,
            not_created = out.not_created,
            "events canceled"
        );
        Ok(pb::CancelEventResponse {
            events: count32(out.event_ids.len() as u64),
            canceled: count32(out.canceled),
            sent: count32(out.sent),
            in_flight: count32(out.in_flight),
            failed: count32(out.failed),
            skipped: count32(out.skipped),
            not_created: count32(out.not_created),
            event_ids: out.event_ids.iter().map(Uuid::to_string).collect(),
        })
    }
}
