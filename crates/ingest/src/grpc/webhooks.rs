//! `WebhookService`: a caller's status-webhook endpoints. A caller manages its own; a key
//! that may manage manages every caller's. Another caller's endpoint is "not found".

use super::Services;
use crate::auth::{Caller, Need};
use crate::convert::ts;
use crate::error::ApiError;
use notify_core::validate::Violations;
use notify_core::webhook::{self, EventType};
use notify_proto::v1 as pb;
use notify_store::StoreError;
use notify_store::webhooks::{self as store, Endpoint, EndpointChange};
use std::time::Duration;
use uuid::Uuid;

/// Longest rotation overlap (7 days).
pub(crate) const MAX_OVERLAP_SECONDS: u32 = 7 * 86_400;

fn endpoint(e: Endpoint) -> pb::WebhookEndpoint {
    pb::WebhookEndpoint {
        id: e.id.to_string(),
        caller: e.caller,
        url: e.url,
        event_types: e.event_types,
        enabled: e.enabled,
        disabled_reason: e.disabled_reason.unwrap_or_default(),
        failing_since: e.failing_since.map(ts),
        previous_secret_expires_at: e.previous_expires_at.map(ts),
        created_at: Some(ts(e.created_at)),
    }
}

fn new_secret() -> String {
    webhook::new_secret(&rand::random::<[u8; webhook::SECRET_BYTES]>())
}

impl Services {
    /// Whose endpoints `caller` acts on: `None` (any caller's) for a managing key.
    fn webhook_scope<'a>(&self, caller: &'a Caller) -> Option<&'a str> {
        (!self.auth.reads_every_event(caller)).then_some(caller.name.as_str())
    }

    fn check_url(&self, v: &mut Violations, url: &str) {
        if let Err(why) = webhook::endpoint_problem(&self.links, url) {
            v.add("url", why);
        }
    }

    fn check_event_types(v: &mut Violations, types: &[String]) {
        for (i, t) in types.iter().enumerate() {
            if EventType::parse(t).is_none() {
                let known: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
                v.add(
                    format!("event_types[{i}]"),
                    format!("unknown event type; one of {}", known.join(", ")),
                );
            }
        }
    }

    fn endpoint_id(id: &str) -> Result<Uuid, ApiError> {
        Uuid::parse_str(id).map_err(|_| ApiError::field("id", "must be an endpoint id (a UUID)"))
    }

    async fn create_webhook_endpoint(
        &self,
        caller: Caller,
        r: pb::CreateWebhookEndpointRequest,
    ) -> Result<pb::CreateWebhookEndpointResponse, ApiError> {
        let mut v = Violations::default();
        self.check_url(&mut v, &r.url);
        Self::check_event_types(&mut v, &r.event_types);
        let owner = if r.caller.is_empty() || r.caller == caller.name {
            caller.name.clone()
        } else if self.auth.reads_every_event(&caller) {
            if !notify_store::api_keys::valid_name(&r.caller) {
                v.add("caller", notify_store::api_keys::NAME_RULE);
            }
            r.caller.clone()
        } else {
            return Err(ApiError::PermissionDenied(
                "only a key that may manage registers endpoints for another caller".into(),
            ));
        };
        v.into_result(()).map_err(ApiError::Invalid)?;
        let secret = new_secret();
        let e = store::create_endpoint(&self.pool, &owner, &r.url, &r.event_types, &secret).await?;
        Ok(pb::CreateWebhookEndpointResponse {
            endpoint: Some(endpoint(e)),
            secret,
        })
    }

    async fn list_webhook_endpoints(
        &self,
        caller: Caller,
        r: pb::ListWebhookEndpointsRequest,
    ) -> Result<pb::ListWebhookEndpointsResponse, ApiError> {
        let scope = match self.webhook_scope(&caller) {
            Some(own) => Some(own),
            None if !r.caller.is_empty() => Some(r.caller.as_str()),
            None => None,
        };
        let list = store::list_endpoints(&self.pool, scope).await?;
        Ok(pb::ListWebhookEndpointsResponse {
            endpoints: list.into_iter().map(endpoint).collect(),
        })
    }

    async fn update_webhook_endpoint(
        &self,
        caller: Caller,
        r: pb::UpdateWebhookEndpointRequest,
    ) -> Result<pb::UpdateWebhookEndpointResponse, ApiError> {
        let id = Self::endpoint_id(&r.id)?;
        let mut v = Violations::default();
        if let Some(url) = &r.url {
            self.check_url(&mut v, url);
        }
        if r.replace_event_types {
            Self::check_event_types(&mut v, &r.event_types);
        }
        v.into_result(()).map_err(ApiError::Invalid)?;
        let change = EndpointChange {
            url: r.url,
            event_types: r.replace_event_types.then_some(r.event_types),
            enabled: r.enabled,
        };
        let e = store::update_endpoint(
            &self.pool,
            id,
            self.webhook_scope(&caller),
            &change,
            &caller.name,
        )
        .await
        .map_err(not_found(&r.id))?;
        Ok(pb::UpdateWebhookEndpointResponse {
            endpoint: Some(endpoint(e)),
        })
    }

    async fn rotate_webhook_secret(
        &self,
        caller: Caller,
        r: pb::RotateWebhookSecretRequest,
    ) -> Result<pb::RotateWebhookSecretResponse, ApiError> {
        let id = Self::endpoint_id(&r.id)?;
        if r.overlap_seconds > MAX_OVERLAP_SECONDS {
            return Err(ApiError::field(
                "overlap_seconds",
                format!("must be 0 to {MAX_OVERLAP_SECONDS} (7 days)"),
            ));
        }
        let secret = new_secret();
        let overlap = Duration::from_secs(u64::from(r.overlap_seconds));
        let rotated = store::rotate_secret(
            &self.pool,
            id,
            self.webhook_scope(&caller),
            &secret,
            overlap,
        )
        .await
        .map_err(not_found(&r.id))?;
        let e = match rotated {
            store::Rotation::Rotated(e) => e,
            store::Rotation::InOverlap { until } => {
                return Err(ApiError::field(
                    "overlap_seconds",
                    format!(
                        "must be 0 while the last rotation's old secret still signs (until {}): one old secret is kept, so a second overlap would stop it before then; rotate again after that time, or with 0 to stop every old secret now",
                        until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                ));
            }
        };
        Ok(pb::RotateWebhookSecretResponse {
            endpoint: Some(endpoint(e)),
            secret,
        })
    }

    async fn delete_webhook_endpoint(
        &self,
        caller: Caller,
        r: pb::DeleteWebhookEndpointRequest,
    ) -> Result<pb::DeleteWebhookEndpointResponse, ApiError> {
        let id = Self::endpoint_id(&r.id)?;
        store::delete_endpoint(&self.pool, id, self.webhook_scope(&caller))
            .await
            .map_err(not_found(&r.id))?;
        Ok(pb::DeleteWebhookEndpointResponse {})
    }
}

/// A store `NotFound` as the API's, naming the endpoint as the caller gave it.
fn not_found(id: &str) -> impl FnOnce(StoreError) -> ApiError + '_ {
    move |e| match e {
        StoreError::NotFound(_) => ApiError::NotFound {
            kind: "webhook endpoint",
            name: id.to_string(),
        },
        other => ApiError::Store(other),
    }
}

delegate_service! {
    impl pb::webhook_service_server::WebhookService, Need::Read;
    caller fn create_webhook_endpoint(pb::CreateWebhookEndpointRequest) -> pb::CreateWebhookEndpointResponse;
    caller fn list_webhook_endpoints(pb::ListWebhookEndpointsRequest) -> pb::ListWebhookEndpointsResponse;
    caller fn update_webhook_endpoint(pb::UpdateWebhookEndpointRequest) -> pb::UpdateWebhookEndpointResponse;
    caller fn rotate_webhook_secret(pb::RotateWebhookSecretRequest) -> pb::RotateWebhookSecretResponse;
    caller fn delete_webhook_endpoint(pb::DeleteWebhookEndpointRequest) -> pb::DeleteWebhookEndpointResponse;
}
