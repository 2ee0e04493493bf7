//! `IngestService`: `CreateEvent` (authorised, counted, validated, links and sensitive
//! data checked, then handed to the group-commit writer), `GetEvent`, `ExplainDelivery`
//! and `CancelEvent` (its handler is in `cancel.rs`).

use super::Services;
use crate::auth::{Caller, Need};
use crate::convert::{
    attempt_to_pb, channel_counts, content_from_pb, content_to_pb, delivery_to_pb,
    new_delivery_to_pb, planned_skip_to_pb, skip_to_pb, skipped_to_pb, ts,
};
use crate::error::ApiError;
use crate::writer::Written;
use notify_core::event::{CreateEventInput, normalize_event_key};
use notify_core::explain;
use notify_core::sensitive;
use notify_core::validate::Violations;
use notify_core::{Channel, DeliveryStatus, FanoutStatus, NewEvent};
use notify_proto::v1 as pb;
use notify_store::catalog;
use notify_store::events::{self, EventRecord, EventSelector};
use uuid::Uuid;

/// Most deliveries (and skipped pairs) in one reply.
const PAGE_MAX: u32 = 1_000;

struct LoadedEvent {
    event: EventRecord,
    deliveries: Vec<pb::Delivery>,
    skipped: Vec<pb::SkippedDelivery>,
    next_page_token: String,
}

impl Services {
    /// Loads an event with one page of deliveries (after `after`), plus its skipped pairs.
    async fn load_event(
        &self,
        sel: &EventSelector,
        after: Option<Uuid>,
        page_size: u32,
    ) -> Result<Option<LoadedEvent>, ApiError> {
        // One snapshot for the event, its deliveries and its skips: a fallback's skip is
        // never shown beside the delivery that caused it still `sending`.
        let mut snap = notify_store::snapshot(&self.pool).await?;
        let Some(event) = events::get_event(&mut *snap, sel).await? else {
            return Ok(None);
        };
        let page =
            events::list_deliveries(&mut *snap, event.id, after, i64::from(page_size) + 1).await?;
        let more = page.len() > page_size as usize;
        let deliveries: Vec<pb::Delivery> = page
            .into_iter()
            .take(page_size as usize)
            .map(delivery_to_pb)
            .collect();
        let next_page_token = if more {
            deliveries
                .last()
                .map(|d| d.delivery_id.clone())
                .unwrap_or_default()
        } else {
            String::new()
        };
        let skipped =
            skipped_to_pb(events::list_skips(&mut *snap, event.id, i64::from(PAGE_MAX)).await?);
        Ok(Some(LoadedEvent {
            event,
            deliveries,
            skipped,
            next_page_token,
        }))
    }

    async fn create_event(
        &self,
        caller: Caller,
        r: pb::CreateEventRequest,
    ) -> Result<pb::CreateEventResponse, ApiError> {
        self.auth
            .check_send(&caller, r.r#type.trim(), r.recipients.len())?;
        let requested_names = r.channels.clone();
        let (content, mut bad_content) = content_from_pb(r.content);
        let cancellation_key = match r.cancellation_key.as_str() {
            "" => None,
            key => {
                // NFC-normalised like event keys, so CancelEvent finds it however spelled.
                let key = notify_core::event::normalize_event_key(key);
                let mut v = Violations::default();
                v.check_id(
                    "cancellation_key",
                    &key,
                    notify_core::event::MAX_CANCELLATION_KEY_BYTES,
                );
                if let Err(mut bad) = v.into_result(()) {
                    bad_content.append(&mut bad);
                }
                Some(key)
            }
        };
        let parsed = NewEvent::parse(CreateEventInput {
            event_key: r.event_key,
            type_key: r.r#type,
            actor_id: r.actor_id,
            recipients: r.recipients,
            payload: r.payload,
            content,
            channels: r.channels,
            topic: r.topic,
            line_multicast: r.line_multicast,
            aggregate_key: r.aggregate_key,
            send_at: r.send_at,
            delay: r.delay,
        });
        let mut event = match parsed {
            Ok(event) if bad_content.is_empty() => event,
            Ok(_) => return Err(ApiError::Invalid(bad_content)),
            Err(mut violations) => {
                violations.append(&mut bad_content);
                return Err(ApiError::Invalid(violations));
            }
        };
        // The server span's context: the relay continues this trace for every publish.
        event.trace_context =
            notify_telemetry::propagation::traceparent_of(&tracing::Span::current());
        event.caller = Some(caller.name.clone());
        event.cancellation_key = cancellation_key;
        self.check_links(&event)?;
        self.guard_sensitive_data(&mut event).await?;
        let event_key = event.event_key.clone();
        let fingerprint = event.fingerprint();
        let topic = event.topic.clone();
        let written = self.writer.write(event, requested_names).await?;
        let send_at = match &written {
            Written::New { send_at, .. } => *send_at,
            Written::Existing(_) => None,
        };
        let (event_id, new, skipped) = match written {
            Written::New {
                event_id,
                deliveries,
                skipped,
                ..
            } => (event_id, deliveries, skipped),
            Written::Existing(existing) => {
                if existing.fingerprint != fingerprint {
                    return Err(ApiError::EventKeyConflict {
                        event_key,
                        event_id: existing.id,
                    });
                }
                let loaded = self
                    .load_event(&EventSelector::Id(existing.id), None, PAGE_MAX)
                    .await?
                    .ok_or_else(|| ApiError::NotFound {
                        kind: "notification event",
                        name: existing.id.to_string(),
                    })?;
                let counts = events::delivery_counts(&self.pool, existing.id).await?;
                return Ok(pb::CreateEventResponse {
                    event_id: existing.id.to_string(),
                    duplicate: true,
                    planned: channel_counts(&counts),
                    skipped: loaded.skipped,
                    deliveries: loaded.deliveries,
                    send_at: loaded.event.send_at.map(ts),
                });
            }
        };

        let counts: Vec<(Channel, DeliveryStatus, i64)> = new
            .iter()
            .map(|d| (d.plan.channel, DeliveryStatus::Pending, 1))
            .collect();
        let deliveries: Vec<pb::Delivery> = new.into_iter().map(new_delivery_to_pb).collect();
        // Not the event key: callers choose it and it may carry anything.
        tracing::info!(%event_id, topic = topic.as_deref().unwrap_or(""),
            deliveries = deliveries.len(), skipped = skipped.len(), "event recorded");
        Ok(pb::CreateEventResponse {
            event_id: event_id.to_string(),
            duplicate: false,
            planned: channel_counts(&counts),
            deliveries,
            skipped: skipped.iter().map(planned_skip_to_pb).collect(),
            send_at: send_at.map(ts),
        })
    }

    async fn explain_delivery(
        &self,
        caller: Caller,
        r: pb::ExplainDeliveryRequest,
    ) -> Result<pb::ExplainDeliveryResponse, ApiError> {
        let mut v = Violations::default();
        let event_id = Uuid::parse_str(&r.event_id);
        if event_id.is_err() {
            v.add("event_id", "must be a UUID");
        }
        let user_id = v.id("user_id", &r.user_id, 255).unwrap_or_default();
        let channel = r.channel.parse::<Channel>();
        if let Err(e) = &channel {
            v.add("channel", e.to_string());
        }
        v.into_result(()).map_err(ApiError::Invalid)?;
        let (event_id, channel) = (event_id.expect("checked"), channel.expect("checked"));
        // One snapshot for every fact the trail is built from.
        let mut snap = notify_store::snapshot(&self.pool).await?;
        let found = events::get_event(&mut *snap, &EventSelector::Id(event_id))
            .await?
            .filter(|e| self.auth.may_read(&caller, &e.caller));
        let Some(event) = found else {
            return Err(ApiError::NotFound {
                kind: "event",
                name: event_id.to_string(),
            });
        };
        let ty = catalog::get_type(&mut *snap, &event.type_key).await?;
        let type_defaults = explain::type_defaults(
            &event.type_key,
            ty.as_ref().map(|t| explain::TypeFacts {
                key: &t.key,
                priority: t.priority,
                critical: t.critical,
                category: t.category,
                default_channels: &t.default_channels,
            }),
        );
        let skipped = events::skip_of(&mut *snap, event_id, &user_id, channel).await?;
        let mut found = Vec::new();
        for d in events::deliveries_of(&mut *snap, event_id, &user_id, channel).await? {
            let endpoint = match d.endpoint_id {
                Some(ep) => events::endpoint_state(&mut *snap, ep).await?,
                None => String::new(),
            };
            let attempts = events::attempts_of(&mut *snap, d.id).await?;
            let clicks = notify_store::clicks::clicks_of(&mut *snap, d.id).await?;
            found.push((d, endpoint, attempts, clicks));
        }
        let trail = explain::trail(
            &type_defaults,
            skipped.as_ref().map(|s| explain::SkipFacts {
                reason: &s.reason,
                decision: &s.decision,
            }),
            &found
                .iter()
                .map(|(d, endpoint, attempts, _)| explain::DeliveryFacts {
                    decision: &d.decision,
                    endpoint,
                    attempts: attempts
                        .iter()
                        .map(|a| explain::AttemptFacts {
                            attempt: a.attempt,
                            outcome: &a.outcome,
                            provider_status: a.provider_status,
                            error_code: a.error_code.as_deref(),
                        })
                        .collect(),
                    status: d.status,
                })
                .collect::<Vec<_>>(),
            event.fanout_status == FanoutStatus::Pending,
        );
        let deliveries = found
            .into_iter()
            .map(|(d, endpoint, attempts, clicks)| pb::ExplainedDelivery {
                endpoint,
                attempts: attempts.into_iter().map(attempt_to_pb).collect(),
                clicks: clicks
                    .into_iter()
                    .map(|c| pb::Click {
                        user_id: c.user_id,
                        action_id: c.action_id,
                        source: c.source,
                        at: Some(ts(c.at)),
                    })
                    .collect(),
                delivery: Some(delivery_to_pb(d)),
            })
            .collect();
        Ok(pb::ExplainDeliveryResponse {
            event_id: event_id.to_string(),
            user_id,
            channel: channel.as_str().into(),
            type_defaults,
            deliveries,
            skipped: skipped.map(skip_to_pb),
            trail,
        })
    }

    async fn get_event(
        &self,
        caller: Caller,
        r: pb::GetEventRequest,
    ) -> Result<pb::GetEventResponse, ApiError> {
        let sel = match r.selector {
            Some(pb::get_event_request::Selector::EventId(id)) => EventSelector::Id(
                Uuid::parse_str(&id).map_err(|_| ApiError::field("event_id", "must be a UUID"))?,
            ),
            Some(pb::get_event_request::Selector::EventKey(k)) if !k.trim().is_empty() => {
                let key = normalize_event_key(&k);
                let mut v = Violations::default();
                v.check_id("event_key", &key, notify_core::event::MAX_EVENT_KEY_BYTES);
                v.into_result(()).map_err(ApiError::Invalid)?;
                // Keys are the caller's own namespace: another caller's event with the
                // same key is not found (unless this caller may read every event).
                EventSelector::Key {
                    key,
                    caller: caller.name.clone(),
                    any_caller: self.auth.reads_every_event(&caller),
                }
            }
            _ => return Err(ApiError::field("selector", "set event_id or event_key")),
        };
        let page_size = match r.page_size {
            0 => PAGE_MAX,
            n if n <= PAGE_MAX => n,
            _ => return Err(ApiError::field("page_size", "must be at most 1000")),
        };
        let after = if r.page_token.is_empty() {
            None
        } else {
            Some(Uuid::parse_str(&r.page_token).map_err(|_| {
                ApiError::field("page_token", "must be a next_page_token from GetEvent")
            })?)
        };
        let name = match &sel {
            EventSelector::Id(id) => id.to_string(),
            EventSelector::Key { key, .. } => key.clone(),
        };
        let loaded = self
            .load_event(&sel, after, page_size)
            .await?
            .filter(|l| self.auth.may_read(&caller, &l.event.caller))
            .ok_or(ApiError::NotFound {
                kind: "notification event",
                name,
            })?;
        let ev = loaded.event;
        let counts = events::delivery_counts(&self.pool, ev.id).await?;
        Ok(pb::GetEventResponse {
            event_id: ev.id.to_string(),
            event_key: ev.event_key,
            r#type: ev.type_key,
            actor_id: ev.actor_id,
            recipients: ev.recipients,
            payload: ev.payload.to_string(),
            content: Some(content_to_pb(ev.content)),
            created_at: Some(ts(ev.created_at)),
            deliveries: loaded.deliveries,
            skipped: loaded.skipped,
            next_page_token: loaded.next_page_token,
            counts: counts
                .into_iter()
                .map(|(channel, status, count)| pb::StatusCount {
                    channel: channel.as_str().into(),
                    status: status.as_str().into(),
                    count: count as u32,
                })
                .collect(),
            topic: ev.topic.unwrap_or_default(),
            fanout_status: ev.fanout_status.as_str().into(),
            fanout_recipients: ev.fanout_recipients.max(0) as u32,
            send_at: ev.send_at.map(ts),
            cancellation_key: ev.cancellation_key.unwrap_or_default(),
            canceled_at: ev.canceled_at.map(ts),
        })
    }
}

impl Services {
    /// The link policy (`notify_core::links`) over `content.url` and the payload's links.
    fn check_links(&self, event: &NewEvent) -> Result<(), ApiError> {
        self.links.check(event).map_err(ApiError::Invalid)
    }

    /// The sensitive-data guard (`notify_core::guard`) over the identifiers, the payload
    /// and the text fields; with findings in the content, the type's policy (read only
    /// then) decides (`notify_core::sensitive`): `reject` refuses the event with one
    /// violation per field path (the value is never echoed or logged), `mask` stores a
    /// masked copy.
    async fn guard_sensitive_data(&self, event: &mut NewEvent) -> Result<(), ApiError> {
        let findings = sensitive::screen(event).map_err(ApiError::Invalid)?;
        if findings.is_empty() {
            return Ok(());
        }
        let fields = findings.len();
        let stored = catalog::sensitive_data_policy(&self.pool, &event.type_key).await?;
        let policy = stored.unwrap_or_default();
        sensitive::apply(event, findings, policy).map_err(ApiError::Invalid)?;
        tracing::info!(fields, "sensitive data masked before storing");
        Ok(())
    }
}

delegate_service! {
    impl pb::ingest_service_server::IngestService, Need::Read;
    caller fn create_event(pb::CreateEventRequest) -> pb::CreateEventResponse;
    caller fn get_event(pb::GetEventRequest) -> pb::GetEventResponse;
    caller fn cancel_event(pb::CancelEventRequest) -> pb::CancelEventResponse;
    caller fn list_events(pb::ListEventsRequest) -> pb::ListEventsResponse;
    caller fn explain_delivery(pb::ExplainDeliveryRequest) -> pb::ExplainDeliveryResponse;
}
