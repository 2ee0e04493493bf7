//! The gRPC services: `IngestService`, `RecipientService`, `TypeService`.

use crate::auth::{Auth, Caller, Need};
use crate::error::ApiError;
use crate::writer::{EventWriter, WriterConfig, Written};
use chrono::{DateTime, Utc};
use notify_core::event::{CreateEventInput, normalize_event_key};
use notify_core::validate::{self, FieldViolation, Violations};
use notify_core::{
    Category, Channel, Content, DeliveryStatus, FanoutStatus, NewEvent, Priority, Provider,
    SensitiveData,
};
use notify_proto::v1 as pb;
use notify_store::PgPool;
use notify_store::catalog::{self, NotificationType, Recipient};
use notify_store::events::{self, DeliveryRecord, EventRecord, EventSelector, NewDelivery};
use notify_store::topics;
use std::sync::Arc;
use tonic::{Request, Response, Status};
use uuid::Uuid;

/// Shared state of the services.
#[derive(Clone)]
pub struct Services {
    pool: PgPool,
    writer: EventWriter,
    auth: Arc<Auth>,
    links: LinkPolicy,
}

/// Which `http://` hosts links may name (all others must be `https://`).
#[derive(Debug, Clone, Default)]
pub struct LinkPolicy {
    /// Hosts (lowercase, without port) allowed over plain http, e.g. `localhost`; an entry
    /// starting with `.` allows that domain's subdomains (`.test`).
    pub http_hosts: Vec<String>,
}

impl Services {
    /// Services over `pool`; `CreateEvent` writes through a group-commit writer started
    /// here with `writer` settings; callers are checked by `auth`.
    pub fn new(pool: PgPool, writer: WriterConfig, auth: Arc<Auth>, links: LinkPolicy) -> Self {
        Self {
            writer: EventWriter::start(pool.clone(), writer),
            pool,
            auth,
            links,
        }
    }
}

fn ts(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

fn content_from_pb(c: Option<pb::Content>) -> Content {
    let c = c.unwrap_or_default();
    Content {
        title: c.title,
        body: c.body,
        url: c.url,
        email_subject: c.email_subject,
        email_html: c.email_html,
        email_text: c.email_text,
    }
}

fn content_to_pb(c: Content) -> pb::Content {
    pb::Content {
        title: c.title,
        body: c.body,
        url: c.url,
        email_subject: c.email_subject,
        email_html: c.email_html,
        email_text: c.email_text,
    }
}

fn delivery_to_pb(d: DeliveryRecord) -> pb::Delivery {
    pb::Delivery {
        delivery_id: d.id.to_string(),
        user_id: d.user_id,
        channel: d.channel.as_str().into(),
        provider: d.provider.as_str().into(),
        endpoint_id: d.endpoint_id.map(|e| e.to_string()).unwrap_or_default(),
        next_attempt_at: (d.status == DeliveryStatus::Pending).then(|| ts(d.next_attempt_at)),
        status: d.status.as_str().into(),
        attempts: d.attempts.max(0) as u32,
        last_error: d.last_error.unwrap_or_default(),
        provider_message_id: d.provider_message_id.unwrap_or_default(),
        sent_at: d.sent_at.map(ts),
        deferred_until: d.deferred_until.map(ts),
        decision: d.decision,
    }
}

fn skip_to_pb(s: events::SkipRecord) -> pb::SkippedDelivery {
    pb::SkippedDelivery {
        user_id: s.user_id,
        channel: s.channel.as_str().into(),
        reason: s.reason,
        decision: s.decision,
    }
}

fn skipped_to_pb(rows: Vec<events::SkipRecord>) -> Vec<pb::SkippedDelivery> {
    rows.into_iter().map(skip_to_pb).collect()
}

/// Most deliveries (and skipped pairs) in one reply.
const PAGE_MAX: u32 = 1_000;

/// Deliveries per channel (any status), in channel order.
fn channel_counts(counts: &[(Channel, DeliveryStatus, i64)]) -> Vec<pb::ChannelCount> {
    Channel::ALL
        .iter()
        .filter_map(|c| {
            let n: i64 = counts
                .iter()
                .filter(|(ch, _, _)| ch == c)
                .map(|(_, _, n)| n)
                .sum();
            (n > 0).then(|| pb::ChannelCount {
                channel: c.as_str().into(),
                count: n as u32,
            })
        })
        .collect()
}

/// Gives planned deliveries their ids (and LINE its retry key, fixed before any call).
pub fn new_deliveries(
    planned: Vec<notify_core::PlannedDelivery>,
    max_attempts: i32,
) -> Vec<NewDelivery> {
    planned
        .into_iter()
        .map(|p| NewDelivery {
            // Time-ordered (RFC 9562 version 7): new rows land at the right edge of the
            // primary-key index instead of on random pages.
            id: Uuid::now_v7(),
            retry_key: matches!(p.provider, Provider::Line | Provider::LineMulticast)
                .then(Uuid::new_v4),
            plan: p,
            max_attempts,
        })
        .collect()
}

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
        let Some(event) = events::get_event(&self.pool, sel).await? else {
            return Ok(None);
        };
        let page =
            events::list_deliveries(&self.pool, event.id, after, i64::from(page_size) + 1).await?;
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
            skipped_to_pb(events::list_skips(&self.pool, event.id, i64::from(PAGE_MAX)).await?);
        Ok(Some(LoadedEvent {
            event,
            deliveries,
            skipped,
            next_page_token,
        }))
    }

    async fn create_event(
        &self,
        caller: &Caller,
        r: pb::CreateEventRequest,
    ) -> Result<pb::CreateEventResponse, ApiError> {
        self.auth
            .check_send(caller, r.r#type.trim(), r.recipients.len())?;
        let requested_names = r.channels.clone();
        let mut event = NewEvent::parse(CreateEventInput {
            event_key: r.event_key,
            type_key: r.r#type,
            actor_id: r.actor_id,
            recipients: r.recipients,
            payload: r.payload,
            content: content_from_pb(r.content),
            channels: r.channels,
            topic: r.topic,
            line_multicast: r.line_multicast,
            aggregate_key: r.aggregate_key,
        })
        .map_err(ApiError::Invalid)?;
        // The server span's context: the relay continues this trace for every publish.
        event.trace_context =
            notify_telemetry::propagation::traceparent_of(&tracing::Span::current());
        event.caller = Some(caller.name.clone());
        self.check_links(&event)?;
        self.guard_sensitive_data(&mut event).await?;
        let event_key = event.event_key.clone();
        let fingerprint = event.fingerprint();
        let topic = event.topic.clone();
        let (event_id, new, skipped) = match self.writer.write(event, requested_names).await? {
            Written::New {
                event_id,
                deliveries,
                skipped,
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
                });
            }
        };

        let counts: Vec<(Channel, DeliveryStatus, i64)> = new
            .iter()
            .map(|d| (d.plan.channel, DeliveryStatus::Pending, 1))
            .collect();
        let deliveries: Vec<pb::Delivery> = new
            .into_iter()
            .map(|d| pb::Delivery {
                delivery_id: d.id.to_string(),
                user_id: d.plan.user_id,
                channel: d.plan.channel.as_str().into(),
                provider: d.plan.provider.as_str().into(),
                endpoint_id: d
                    .plan
                    .endpoint_id
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
                status: DeliveryStatus::Pending.as_str().into(),
                next_attempt_at: d.plan.deferred_until.map(ts),
                deferred_until: d.plan.deferred_until.map(ts),
                decision: d.plan.decision,
                ..Default::default()
            })
            .collect();
        // Not the event key: callers choose it and it may carry anything.
        tracing::info!(%event_id, topic = topic.as_deref().unwrap_or(""),
            deliveries = deliveries.len(), skipped = skipped.len(), "event recorded");
        Ok(pb::CreateEventResponse {
            event_id: event_id.to_string(),
            duplicate: false,
            planned: channel_counts(&counts),
            deliveries,
            skipped: skipped
                .iter()
                .map(|s| pb::SkippedDelivery {
                    user_id: s.user_id.clone(),
                    channel: s.channel.as_str().into(),
                    reason: s.reason.as_str().into(),
                    decision: s.decision.clone(),
                })
                .collect(),
        })
    }

    async fn explain_delivery(
        &self,
        caller: &Caller,
        r: pb::ExplainDeliveryRequest,
    ) -> Result<pb::ExplainDeliveryResponse, ApiError> {
        let mut v = Violations::default();
        let event_id = Uuid::parse_str(&r.event_id);
        if event_id.is_err() {
            v.add("event_id", "must be a UUID");
        }
        v.check_id("user_id", &r.user_id, 255);
        let channel = r.channel.parse::<Channel>();
        if let Err(e) = &channel {
            v.add("channel", e.to_string());
        }
        v.into_result(()).map_err(ApiError::Invalid)?;
        let (event_id, channel) = (event_id.expect("checked"), channel.expect("checked"));
        let found = events::get_event(&self.pool, &EventSelector::Id(event_id))
            .await?
            .filter(|e| self.auth.may_read(caller, &e.caller));
        let Some(event) = found else {
            return Err(ApiError::NotFound {
                kind: "event",
                name: event_id.to_string(),
            });
        };
        let mut trail = Vec::new();
        let type_defaults = match catalog::get_type(&self.pool, &event.type_key).await? {
            Some(t) => format!(
                "type {}: priority {}, {}, {}, default channels {}",
                t.key,
                t.priority,
                if t.critical {
                    "critical (ignores opt-outs and quiet hours)"
                } else {
                    "not critical"
                },
                t.category,
                t.default_channels
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => format!("type {}: no longer defined", event.type_key),
        };
        trail.push(type_defaults.clone());
        let skipped = events::skip_of(&self.pool, event_id, &r.user_id, channel).await?;
        if let Some(s) = &skipped {
            trail.extend(s.decision.lines().map(str::to_string));
            trail.push(format!("skipped: {}", s.reason));
        }
        let mut deliveries = Vec::new();
        for d in events::deliveries_of(&self.pool, event_id, &r.user_id, channel).await? {
            trail.extend(d.decision.lines().map(str::to_string));
            let endpoint = match d.endpoint_id {
                Some(ep) => events::endpoint_state(&self.pool, ep).await?,
                None => String::new(),
            };
            if !endpoint.is_empty() {
                trail.push(format!("endpoint now: {endpoint}"));
            }
            let attempts = events::attempts_of(&self.pool, d.id).await?;
            for a in &attempts {
                trail.push(format!(
                    "attempt {}: {}{}{}",
                    a.attempt,
                    a.outcome,
                    a.provider_status
                        .map(|s| format!(", provider status {s}"))
                        .unwrap_or_default(),
                    a.error_code
                        .as_deref()
                        .map(|c| format!(", {c}"))
                        .unwrap_or_default(),
                ));
            }
            trail.push(format!("status: {}", d.status));
            deliveries.push(pb::ExplainedDelivery {
                endpoint,
                attempts: attempts
                    .into_iter()
                    .map(|a| pb::Attempt {
                        attempt: a.attempt.max(0) as u32,
                        outcome: a.outcome,
                        provider_status: a.provider_status.unwrap_or(0),
                        error_code: a.error_code.unwrap_or_default(),
                        provider_response: a.provider_response.unwrap_or_default(),
                        content: a.content_json.map(|c| c.to_string()).unwrap_or_default(),
                        started_at: Some(ts(a.started_at)),
                        finished_at: Some(ts(a.finished_at)),
                        worker_id: a.worker_id,
                    })
                    .collect(),
                delivery: Some(delivery_to_pb(d)),
            });
        }
        if skipped.is_none() && deliveries.is_empty() {
            trail.push(if event.fanout_status == FanoutStatus::Pending {
                "not planned yet: the topic fan-out has not reached this user".into()
            } else {
                "no delivery and no skip: the user was not a recipient, or the channel was not used"
                    .into()
            });
        }
        Ok(pb::ExplainDeliveryResponse {
            event_id: event_id.to_string(),
            user_id: r.user_id,
            channel: channel.as_str().into(),
            type_defaults,
            deliveries,
            skipped: skipped.map(skip_to_pb),
            trail,
        })
    }

    async fn get_preferences(
        &self,
        r: pb::GetPreferencesRequest,
    ) -> Result<pb::GetPreferencesResponse, ApiError> {
        let mut v = Violations::default();
        v.check_id("user_id", &r.user_id, 255);
        v.into_result(()).map_err(ApiError::Invalid)?;
        let Some(catalog::UserPreferences {
            preferences: prefs,
            quiet_hours: quiet,
            timezone,
        }) = catalog::get_preferences(&self.pool, &r.user_id).await?
        else {
            return Err(ApiError::NotFound {
                kind: "recipient",
                name: r.user_id,
            });
        };
        Ok(pb::GetPreferencesResponse {
            user_id: r.user_id,
            preferences: prefs
                .into_iter()
                .map(|(t, channel, enabled)| pb::Preference {
                    r#type: t,
                    channel,
                    enabled,
                })
                .collect(),
            quiet_hours: quiet
                .into_iter()
                .map(|w| pb::QuietWindow {
                    start: w.start,
                    end: w.end,
                    channels: w.channels.iter().map(|c| c.as_str().to_string()).collect(),
                })
                .collect(),
            timezone,
        })
    }

    async fn set_quiet_hours(
        &self,
        r: pb::SetQuietHoursRequest,
    ) -> Result<pb::SetQuietHoursResponse, ApiError> {
        let mut v = Violations::default();
        v.check_id("user_id", &r.user_id, 255);
        let mut windows = Vec::new();
        for (i, w) in r.windows.iter().enumerate() {
            let mut channels = Vec::new();
            for (j, c) in w.channels.iter().enumerate() {
                match c.parse::<Channel>() {
                    Ok(ch) => channels.push(ch),
                    Err(e) => v.add(format!("windows[{i}].channels[{j}]"), e.to_string()),
                }
            }
            windows.push(notify_core::quiet::QuietWindow {
                start: w.start.clone(),
                end: w.end.clone(),
                channels,
            });
        }
        notify_core::quiet::check_windows(&mut v, &windows);
        v.into_result(()).map_err(ApiError::Invalid)?;
        catalog::set_quiet_hours(&self.pool, &r.user_id, &windows)
            .await
            .map_err(|e| match e {
                notify_store::StoreError::NotFound(_) => ApiError::NotFound {
                    kind: "recipient",
                    name: r.user_id.clone(),
                },
                e => e.into(),
            })?;
        Ok(pb::SetQuietHoursResponse {})
    }

    async fn get_event(
        &self,
        caller: &Caller,
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
                    any_caller: self.auth.reads_every_event(caller),
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
            .filter(|l| self.auth.may_read(caller, &l.event.caller))
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
        })
    }

    async fn upsert_recipient(
        &self,
        r: pb::UpsertRecipientRequest,
    ) -> Result<pb::UpsertRecipientResponse, ApiError> {
        let mut v = Violations::default();
        v.check_id("user_id", &r.user_id, 255);
        v.check_len("display_name", &r.display_name, 255);
        if r.display_name.chars().any(char::is_control) {
            v.add("display_name", "must not contain control characters");
        }
        let email = Some(r.email.trim().to_string()).filter(|e| !e.is_empty());
        if let Some(e) = &email
            && e.parse::<lettre::Address>().is_err()
        {
            v.add("email", "must be an email address (local@domain)");
        }
        let line = Some(r.line_user_id.trim().to_string()).filter(|e| !e.is_empty());
        if let Some(l) = &line
            && !validate::is_line_user_id(l)
        {
            v.add(
                "line_user_id",
                "must be \"U\" followed by 32 lowercase hex digits",
            );
        }
        let locale = if r.locale.is_empty() {
            "th-TH".to_string()
        } else {
            r.locale
        };
        if !validate::is_language_tag(&locale) {
            v.add("locale", "must be a BCP 47 language tag such as th-TH");
        }
        let timezone = if r.timezone.is_empty() {
            "Asia/Bangkok".to_string()
        } else {
            r.timezone
        };
        if validate::parse_timezone(&timezone).is_none() {
            v.add("timezone", "must be an IANA time zone such as Asia/Bangkok");
        }
        let rec = v
            .into_result(Recipient {
                user_id: r.user_id,
                display_name: r.display_name,
                email,
                line_user_id: line,
                locale,
                timezone,
            })
            .map_err(ApiError::Invalid)?;
        let created = catalog::upsert_recipient(&self.pool, &rec).await?;
        Ok(pb::UpsertRecipientResponse {
            user_id: rec.user_id,
            created,
        })
    }

    async fn register_endpoint(
        &self,
        r: pb::RegisterEndpointRequest,
    ) -> Result<pb::RegisterEndpointResponse, ApiError> {
        let mut v = Violations::default();
        v.check_id("user_id", &r.user_id, 255);
        let web_push = r
            .web_push
            .as_ref()
            .map(|w| (w.endpoint.as_str(), w.p256dh.as_str(), w.auth.as_str()));
        let (token, subscription) =
            validate::check_endpoint(&mut v, &r.platform, &r.token, web_push);
        v.into_result(()).map_err(ApiError::Invalid)?;
        let id = catalog::register_endpoint(
            &self.pool,
            &r.user_id,
            &r.platform,
            &token,
            subscription.as_ref(),
        )
        .await
        .map_err(|e| match e {
            notify_store::StoreError::NotFound(_) => ApiError::NotFound {
                kind: "recipient",
                name: r.user_id.clone(),
            },
            e => e.into(),
        })?;
        Ok(pb::RegisterEndpointResponse {
            endpoint_id: id.to_string(),
        })
    }

    async fn revoke_endpoint(
        &self,
        r: pb::RevokeEndpointRequest,
    ) -> Result<pb::RevokeEndpointResponse, ApiError> {
        let id = Uuid::parse_str(&r.endpoint_id)
            .map_err(|_| ApiError::field("endpoint_id", "must be a UUID"))?;
        let reason = if r.reason.trim().is_empty() {
            "revoked_by_caller".to_string()
        } else {
            let mut v = Violations::default();
            v.check_id("reason", &r.reason, 255);
            v.into_result(()).map_err(ApiError::Invalid)?;
            r.reason
        };
        let revoked = catalog::revoke_endpoint(&self.pool, id, &reason)
            .await
            .map_err(|e| match e {
                notify_store::StoreError::NotFound(_) => ApiError::NotFound {
                    kind: "endpoint",
                    name: id.to_string(),
                },
                e => e.into(),
            })?;
        Ok(pb::RevokeEndpointResponse { revoked })
    }

    async fn set_preference(
        &self,
        r: pb::SetPreferenceRequest,
    ) -> Result<pb::SetPreferenceResponse, ApiError> {
        let mut v = Violations::default();
        v.check_id("user_id", &r.user_id, 255);
        let channel = validate::check_preference(&mut v, &r.r#type, &r.channel);
        v.into_result(()).map_err(ApiError::Invalid)?;
        if r.r#type != "*" && catalog::get_type(&self.pool, &r.r#type).await?.is_none() {
            return Err(ApiError::NotFound {
                kind: "notification type",
                name: r.r#type,
            });
        }
        catalog::set_preference(&self.pool, &r.user_id, &r.r#type, channel, r.enabled).await?;
        Ok(pb::SetPreferenceResponse {})
    }

    async fn upsert_type(
        &self,
        r: pb::UpsertNotificationTypeRequest,
    ) -> Result<pb::UpsertNotificationTypeResponse, ApiError> {
        let (t, templates) = validate_type(r).map_err(ApiError::Invalid)?;
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(notify_store::StoreError::from)?;
        let created = catalog::upsert_type_with_templates(&mut tx, &t, &templates).await?;
        tx.commit().await.map_err(notify_store::StoreError::from)?;
        Ok(pb::UpsertNotificationTypeResponse {
            key: t.key,
            created,
        })
    }
}

/// A type ready to store, with its templates.
pub type ValidType = (NotificationType, Vec<notify_core::template::Template>);

/// Validates an `UpsertNotificationType` request (also used by `ingest load-types`): the
/// type to store and its templates, or every violation at once (templates are rendered
/// against the sample payload).
pub fn validate_type(
    r: pb::UpsertNotificationTypeRequest,
) -> Result<ValidType, Vec<FieldViolation>> {
    let mut v = Violations::default();
    if !validate::is_type_key(&r.key) {
        v.add(
            "key",
            "must be 1 to 64 characters of [a-z0-9_.-] starting with a letter",
        );
    }
    let priority = if r.priority.is_empty() {
        Ok(Priority::default())
    } else {
        r.priority.to_ascii_lowercase().parse::<Priority>()
    }
    .unwrap_or_else(|_| {
        v.add("priority", "must be low, normal or high");
        Priority::default()
    });
    let category = if r.category.is_empty() {
        Ok(Category::default())
    } else {
        r.category.to_ascii_lowercase().parse::<Category>()
    }
    .unwrap_or_else(|_| {
        v.add("category", "must be transactional or marketing");
        Category::default()
    });
    if r.default_channels.is_empty() {
        v.add("default_channels", "must name at least one channel");
    }
    let mut channels = Vec::new();
    for (i, c) in r.default_channels.iter().enumerate() {
        match c.parse::<Channel>() {
            Ok(ch) if !channels.contains(&ch) => channels.push(ch),
            Ok(_) => {}
            Err(e) => v.add(format!("default_channels[{i}]"), e.to_string()),
        }
    }
    let default_locale = if r.default_locale.trim().is_empty() {
        "th".to_string()
    } else {
        r.default_locale.trim().to_string()
    };
    if default_locale.len() > 35
        || !default_locale
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        v.add("default_locale", "must be a BCP 47 tag such as th or en-US");
    }
    let sample_payload = if r.sample_payload.trim().is_empty() {
        serde_json::json!({})
    } else {
        match serde_json::from_str::<serde_json::Value>(&r.sample_payload) {
            Ok(p) if p.is_object() => p,
            _ => {
                v.add("sample_payload", "must be a JSON object");
                serde_json::json!({})
            }
        }
    };
    let over_cap = if r.over_cap.is_empty() {
        Ok(notify_core::fatigue::OverCap::default())
    } else {
        r.over_cap.to_ascii_lowercase().parse()
    }
    .unwrap_or_else(|_| {
        v.add("over_cap", "must be defer or drop");
        notify_core::fatigue::OverCap::default()
    });
    if r.digest_window_seconds > 86_400 {
        v.add("digest_window_seconds", "must be at most 1 day (86400)");
    }
    let sensitive_data = if r.sensitive_data.is_empty() {
        Ok(SensitiveData::default())
    } else {
        r.sensitive_data
            .to_ascii_lowercase()
            .parse::<SensitiveData>()
    }
    .unwrap_or_else(|_| {
        v.add("sensitive_data", "must be reject or mask");
        SensitiveData::default()
    });
    let dedup_window_s = r.dedup_window_seconds;
    if dedup_window_s > 31 * 86_400 {
        v.add("dedup_window_seconds", "must be at most 31 days (2678400)");
    }
    if r.templates.len() > 100 {
        v.add("templates", "at most 100 templates per type");
    }
    let templates: Vec<notify_core::template::Template> = r
        .templates
        .into_iter()
        .map(|t| notify_core::template::Template {
            channel: t.channel,
            locale: t.locale,
            title: t.title,
            body: t.body,
            email_subject: t.email_subject,
            email_html: t.email_html,
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    for (i, t) in templates.iter().enumerate() {
        if !seen.insert((t.channel.clone(), t.locale.to_ascii_lowercase())) {
            v.add(
                format!("templates[{i}]"),
                format!(
                    "a template for channel {:?} and locale {:?} is already given",
                    t.channel, t.locale
                ),
            );
        }
        for (field, text) in [
            ("title", &t.title),
            ("body", &t.body),
            ("email_subject", &t.email_subject),
            ("email_html", &t.email_html),
        ] {
            if text.len() > notify_core::template::MAX_TEMPLATE_BYTES {
                v.add(
                    format!("templates[{i}].{field}"),
                    format!(
                        "must be at most {} bytes",
                        notify_core::template::MAX_TEMPLATE_BYTES
                    ),
                );
            }
        }
    }
    // A type's sample payload and templates are stored and shown: no sensitive data.
    for f in notify_core::guard::scan_json("sample_payload", &sample_payload) {
        v.add(
            f.path,
            format!("{}; types may not carry it", f.kind.describe()),
        );
    }
    for (i, t) in templates.iter().enumerate() {
        for (field, text) in [
            ("title", &t.title),
            ("body", &t.body),
            ("email_subject", &t.email_subject),
            ("email_html", &t.email_html),
        ] {
            for kind in notify_core::guard::scan_text(text) {
                v.add(
                    format!("templates[{i}].{field}"),
                    format!("{}; types may not carry it", kind.describe()),
                );
            }
        }
    }
    if !v.0.is_empty() {
        return Err(v.0);
    }
    for f in notify_core::template::validate(&r.key, &templates, &sample_payload) {
        v.add(f.field, f.description);
    }
    let t = v.into_result(NotificationType {
        key: r.key,
        priority,
        default_channels: channels,
        critical: r.critical,
        category,
        default_locale,
        sample_payload,
        dedup_window_s: dedup_window_s as i32,
        over_cap,
        digest_window_s: r.digest_window_seconds as i32,
        sensitive_data,
    })?;
    Ok((t, templates))
}

#[tonic::async_trait]
impl pb::ingest_service_server::IngestService for Services {
    async fn create_event(
        &self,
        req: Request<pb::CreateEventRequest>,
    ) -> Result<Response<pb::CreateEventResponse>, Status> {
        let caller = self.auth.caller(&req, Need::Read)?;
        Ok(Response::new(
            Services::create_event(self, &caller, req.into_inner()).await?,
        ))
    }

    async fn get_event(
        &self,
        req: Request<pb::GetEventRequest>,
    ) -> Result<Response<pb::GetEventResponse>, Status> {
        let caller = self.auth.caller(&req, Need::Read)?;
        Ok(Response::new(
            Services::get_event(self, &caller, req.into_inner()).await?,
        ))
    }

    async fn explain_delivery(
        &self,
        req: Request<pb::ExplainDeliveryRequest>,
    ) -> Result<Response<pb::ExplainDeliveryResponse>, Status> {
        let caller = self.auth.caller(&req, Need::Read)?;
        Ok(Response::new(
            Services::explain_delivery(self, &caller, req.into_inner()).await?,
        ))
    }
}

#[tonic::async_trait]
impl pb::recipient_service_server::RecipientService for Services {
    async fn upsert_recipient(
        &self,
        req: Request<pb::UpsertRecipientRequest>,
    ) -> Result<Response<pb::UpsertRecipientResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        Ok(Response::new(
            Services::upsert_recipient(self, req.into_inner()).await?,
        ))
    }

    async fn register_endpoint(
        &self,
        req: Request<pb::RegisterEndpointRequest>,
    ) -> Result<Response<pb::RegisterEndpointResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        Ok(Response::new(
            Services::register_endpoint(self, req.into_inner()).await?,
        ))
    }

    async fn revoke_endpoint(
        &self,
        req: Request<pb::RevokeEndpointRequest>,
    ) -> Result<Response<pb::RevokeEndpointResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        Ok(Response::new(
            Services::revoke_endpoint(self, req.into_inner()).await?,
        ))
    }

    async fn set_preference(
        &self,
        req: Request<pb::SetPreferenceRequest>,
    ) -> Result<Response<pb::SetPreferenceResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        Ok(Response::new(
            Services::set_preference(self, req.into_inner()).await?,
        ))
    }

    async fn get_preferences(
        &self,
        req: Request<pb::GetPreferencesRequest>,
    ) -> Result<Response<pb::GetPreferencesResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        Ok(Response::new(
            Services::get_preferences(self, req.into_inner()).await?,
        ))
    }

    async fn set_quiet_hours(
        &self,
        req: Request<pb::SetQuietHoursRequest>,
    ) -> Result<Response<pb::SetQuietHoursResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        Ok(Response::new(
            Services::set_quiet_hours(self, req.into_inner()).await?,
        ))
    }
}

#[tonic::async_trait]
impl pb::type_service_server::TypeService for Services {
    async fn upsert_notification_type(
        &self,
        req: Request<pb::UpsertNotificationTypeRequest>,
    ) -> Result<Response<pb::UpsertNotificationTypeResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        Ok(Response::new(self.upsert_type(req.into_inner()).await?))
    }
}

impl Services {
    /// Links must be `https://` with a host, no user:password, no backslash, whitespace
    /// or control characters; `http://` only for the configured development hosts.
    /// Checked: `content.url`, and every payload string under a key that names a link
    /// (`url`, `uri`, `link`, `href` anywhere in it, or `callback`, `redirect`), in lists
    /// and objects under such a key too.
    fn check_links(&self, event: &NewEvent) -> Result<(), ApiError> {
        let mut v = Violations::default();
        let mut check = |field: String, url: &str| {
            if let Err(why) = self.link_problem(url) {
                v.add(field, why);
            }
        };
        if !event.content.url.is_empty() {
            check("content.url".into(), &event.content.url);
        }
        /// A key one of whose words (split at `_`, `-`, `.`, spaces and camelCase
        /// humps: `imageUrl`, `deep_link`, `redirect_uri`) names a link.
        fn is_link_key(k: &str) -> bool {
            let mut words: Vec<String> = Vec::new();
            let mut cur = String::new();
            let mut prev_lower = false;
            for c in k.chars() {
                if !c.is_alphanumeric() {
                    words.push(std::mem::take(&mut cur));
                    prev_lower = false;
                    continue;
                }
                if c.is_uppercase() && prev_lower {
                    words.push(std::mem::take(&mut cur));
                }
                prev_lower = c.is_lowercase() || c.is_ascii_digit();
                cur.extend(c.to_lowercase());
            }
            words.push(cur);
            words.iter().any(|w| {
                matches!(
                    w.as_str(),
                    "url"
                        | "urls"
                        | "uri"
                        | "uris"
                        | "link"
                        | "links"
                        | "href"
                        | "callback"
                        | "redirect"
                        | "website"
                        | "homepage"
                )
            })
        }
        fn walk(path: &str, v: &serde_json::Value, link: bool, out: &mut Vec<(String, String)>) {
            match v {
                serde_json::Value::Object(map) => {
                    for (k, x) in map {
                        walk(&format!("{path}.{k}"), x, link || is_link_key(k), out);
                    }
                }
                serde_json::Value::Array(items) => {
                    for (i, x) in items.iter().enumerate() {
                        walk(&format!("{path}[{i}]"), x, link, out);
                    }
                }
                serde_json::Value::String(s) if link => out.push((path.to_string(), s.clone())),
                _ => {}
            }
        }
        let mut urls = Vec::new();
        walk("payload", &event.payload, false, &mut urls);
        for (field, url) in urls {
            // An empty link is no link.
            if !url.is_empty() {
                check(field, &url);
            }
        }
        v.into_result(()).map_err(ApiError::Invalid)
    }

    /// Why `url` is not an acceptable link, if it is not.
    fn link_problem(&self, url: &str) -> Result<(), String> {
        const RULE: &str = "must be an https:// URL with a host (http:// only for the development hosts in NOTIFY_DEV_HTTP_HOSTS; no javascript:, data: or other schemes)";
        if url
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '\\')
        {
            return Err(format!(
                "{RULE}; no whitespace, control characters or backslashes"
            ));
        }
        let lower = url.to_ascii_lowercase();
        let (rest, secure) = match (
            lower.strip_prefix("https://"),
            lower.strip_prefix("http://"),
        ) {
            (Some(r), _) => (r, true),
            (None, Some(r)) => (r, false),
            _ => return Err(RULE.to_string()),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if authority.contains('@') {
            return Err(format!("{RULE}; no user:password@ in links"));
        }
        let host = match authority.rsplit_once(':') {
            Some((h, port)) if !port.contains(']') => h,
            _ => authority,
        };
        if host.is_empty() {
            return Err(format!("{RULE}; it names no host"));
        }
        if secure {
            return Ok(());
        }
        let allowed = self
            .links
            .http_hosts
            .iter()
            .any(|h| match h.strip_prefix('.') {
                Some(domain) => host == domain || host.ends_with(&format!(".{domain}")),
                None => host == h,
            });
        if allowed {
            Ok(())
        } else {
            Err(RULE.to_string())
        }
    }

    /// The sensitive-data guard (`notify_core::guard`) over the payload and the text
    /// fields. With findings, the type's policy decides: `reject` refuses the event with
    /// one violation per field path (the value is never echoed or logged), `mask` stores
    /// a masked copy.
    async fn guard_sensitive_data(&self, event: &mut NewEvent) -> Result<(), ApiError> {
        use notify_core::guard;
        let text_findings = |field: &str, text: &str| -> Vec<guard::Finding> {
            guard::scan_text(text)
                .into_iter()
                .map(|kind| guard::Finding {
                    path: field.to_string(),
                    kind,
                })
                .collect()
        };
        // Identifiers are stored, logged by operators' tools and used for dedup: they are
        // never masked, so a finding there refuses the event whatever the type says.
        let mut id_findings = text_findings("event_key", &event.event_key);
        id_findings.extend(text_findings("actor_id", &event.actor_id));
        if let Some(a) = &event.aggregate_key {
            id_findings.extend(text_findings("aggregate_key", a));
        }
        for (i, r) in event.recipients.iter().enumerate() {
            id_findings.extend(text_findings(&format!("recipients[{i}]"), r));
        }
        if !id_findings.is_empty() {
            return Err(Self::refusal(id_findings, "identifiers may not carry it"));
        }
        // Content, looked at as a reader would see it: HTML without tags and entities,
        // URLs percent-decoded.
        let scan_content = |event: &NewEvent| -> Vec<guard::Finding> {
            let mut findings = guard::scan_json("payload", &event.payload);
            let c = &event.content;
            for (field, text) in [
                ("content.title", c.title.clone()),
                ("content.body", c.body.clone()),
                ("content.email_subject", c.email_subject.clone()),
                ("content.email_html", c.email_html.clone()),
                ("content.email_html", guard::html_text(&c.email_html)),
                ("content.email_text", c.email_text.clone()),
                ("content.url", c.url.clone()),
                ("content.url", guard::percent_decoded(&c.url)),
            ] {
                for f in text_findings(field, &text) {
                    if !findings.contains(&f) {
                        findings.push(f);
                    }
                }
            }
            findings
        };
        let findings = scan_content(event);
        if findings.is_empty() {
            return Ok(());
        }
        let policy = catalog::sensitive_data_policy(&self.pool, &event.type_key).await?;
        if policy == Some(SensitiveData::Mask) {
            event.payload = guard::mask_json(&event.payload);
            let c = &mut event.content;
            for text in [
                &mut c.title,
                &mut c.body,
                &mut c.email_subject,
                &mut c.email_html,
                &mut c.email_text,
                &mut c.url,
            ] {
                *text = guard::mask_text(text);
            }
            // What masking cannot reach (inside HTML markup or percent-encoding) refuses
            // the event instead.
            let left: Vec<guard::Finding> = scan_content(event)
                .into_iter()
                .filter(|f| f.kind != guard::Kind::SecretField)
                .collect();
            if !left.is_empty() {
                return Err(Self::refusal(
                    left,
                    "it is encoded where it cannot be masked",
                ));
            }
            tracing::info!(
                fields = findings.len(),
                "sensitive data masked before storing"
            );
            return Ok(());
        }
        // Reject (the default, and for an unknown type, which fails later anyway).
        Err(Self::refusal(
            findings,
            "this notification type does not accept sensitive data (sensitive_data = reject)",
        ))
    }

    /// INVALID_ARGUMENT with one violation per finding; never the value found.
    fn refusal(findings: Vec<notify_core::guard::Finding>, why: &str) -> ApiError {
        ApiError::Invalid(
            findings
                .into_iter()
                .map(|f| FieldViolation::new(f.path, format!("{}; {why}", f.kind.describe())))
                .collect(),
        )
    }

    fn check_topic_users(v: &mut Violations, topic: &str, user_ids: &[String]) {
        if !validate::is_type_key(topic) {
            v.add(
                "topic",
                "must be 1 to 64 characters of [a-z0-9_.-] starting with a letter",
            );
        }
        if user_ids.is_empty() || user_ids.len() > 1_000 {
            v.add(
                "user_ids",
                format!("must name 1 to 1000 users, got {}", user_ids.len()),
            );
        }
        for (i, u) in user_ids.iter().enumerate().take(1_000) {
            v.check_id(&format!("user_ids[{i}]"), u, 255);
        }
    }

    async fn require_topic(&self, topic: &str) -> Result<(), ApiError> {
        if topics::topic_exists(&self.pool, topic).await? {
            Ok(())
        } else {
            Err(ApiError::NotFound {
                kind: "topic",
                name: topic.to_string(),
            })
        }
    }
}

#[tonic::async_trait]
impl pb::topic_service_server::TopicService for Services {
    async fn create_topic(
        &self,
        req: Request<pb::CreateTopicRequest>,
    ) -> Result<Response<pb::CreateTopicResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        let r = req.into_inner();
        if !validate::is_type_key(&r.key) {
            return Err(ApiError::field(
                "key",
                "must be 1 to 64 characters of [a-z0-9_.-] starting with a letter",
            )
            .into());
        }
        let created = topics::create_topic(&self.pool, &r.key)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::CreateTopicResponse { created }))
    }

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<pb::SubscribeResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        let r = req.into_inner();
        let mut v = Violations::default();
        Self::check_topic_users(&mut v, &r.topic, &r.user_ids);
        v.into_result(()).map_err(ApiError::Invalid)?;
        self.require_topic(&r.topic).await?;
        let added = topics::subscribe(&self.pool, &r.topic, &r.user_ids)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::SubscribeResponse {
            added: added as u32,
        }))
    }

    async fn unsubscribe(
        &self,
        req: Request<pb::UnsubscribeRequest>,
    ) -> Result<Response<pb::UnsubscribeResponse>, Status> {
        self.auth.caller(&req, Need::Manage)?;
        let r = req.into_inner();
        let mut v = Violations::default();
        Self::check_topic_users(&mut v, &r.topic, &r.user_ids);
        v.into_result(()).map_err(ApiError::Invalid)?;
        self.require_topic(&r.topic).await?;
        let removed = topics::unsubscribe(&self.pool, &r.topic, &r.user_ids)
            .await
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::UnsubscribeResponse {
            removed: removed as u32,
        }))
    }
}
