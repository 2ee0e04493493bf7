//! `RecipientService`: recipients, their endpoints, preferences and quiet hours (the data
//! rights, `GetRecipient`, `EraseRecipient` and `ExportRecipientData`, are in `data.rs`).
//! Every method needs a key that may manage.

use super::Services;
use crate::auth::Need;
use crate::error::ApiError;
use notify_core::Channel;
use notify_core::push_endpoint;
use notify_core::validate::{self, Violations};
use notify_proto::v1 as pb;
use notify_store::catalog::{self, Recipient};
use uuid::Uuid;

impl Services {
    async fn upsert_recipient(
        &self,
        mut r: pb::UpsertRecipientRequest,
    ) -> Result<pb::UpsertRecipientResponse, ApiError> {
        let mut v = Violations::default();
        r.user_id = v.id("user_id", &r.user_id, 255).unwrap_or_default();
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
        mut r: pb::RegisterEndpointRequest,
    ) -> Result<pb::RegisterEndpointResponse, ApiError> {
        let mut v = Violations::default();
        r.user_id = v.id("user_id", &r.user_id, 255).unwrap_or_default();
        let web_push = r
            .web_push
            .as_ref()
            .map(|w| (w.endpoint.as_str(), w.p256dh.as_str(), w.auth.as_str()));
        let (token, subscription) =
            push_endpoint::check_endpoint(&mut v, &self.links, &r.platform, &r.token, web_push);
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
        mut r: pb::SetPreferenceRequest,
    ) -> Result<pb::SetPreferenceResponse, ApiError> {
        let mut v = Violations::default();
        r.user_id = v.id("user_id", &r.user_id, 255).unwrap_or_default();
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

    async fn get_preferences(
        &self,
        mut r: pb::GetPreferencesRequest,
    ) -> Result<pb::GetPreferencesResponse, ApiError> {
        let mut v = Violations::default();
        r.user_id = v.id("user_id", &r.user_id, 255).unwrap_or_default();
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
        mut r: pb::SetQuietHoursRequest,
    ) -> Result<pb::SetQuietHoursResponse, ApiError> {
        let mut v = Violations::default();
        r.user_id = v.id("user_id", &r.user_id, 255).unwrap_or_default();
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
}

delegate_service! {
    impl pb::recipient_service_server::RecipientService, Need::Manage;
    type ExportRecipientDataStream = super::data::ExportStream;
    fn get_recipient(pb::GetRecipientRequest) -> pb::GetRecipientResponse;
    fn export_recipient_data(pb::ExportRecipientDataRequest) -> Self::ExportRecipientDataStream;
    fn upsert_recipient(pb::UpsertRecipientRequest) -> pb::UpsertRecipientResponse;
    fn register_endpoint(pb::RegisterEndpointRequest) -> pb::RegisterEndpointResponse;
    fn revoke_endpoint(pb::RevokeEndpointRequest) -> pb::RevokeEndpointResponse;
    fn set_preference(pb::SetPreferenceRequest) -> pb::SetPreferenceResponse;
    fn get_preferences(pb::GetPreferencesRequest) -> pb::GetPreferencesResponse;
    fn set_quiet_hours(pb::SetQuietHoursRequest) -> pb::SetQuietHoursResponse;
    caller fn erase_recipient(pb::EraseRecipientRequest) -> pb::EraseRecipientResponse;
}
