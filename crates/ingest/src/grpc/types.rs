//! `TypeService`: notification types and their templates. Needs a key that may manage.

use super::Services;
use crate::auth::Need;
use crate::error::ApiError;
use crate::type_validation::validate_type;
use notify_proto::v1 as pb;
use notify_store::catalog;

impl Services {
    async fn upsert_notification_type(
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

delegate_service! {
    impl pb::type_service_server::TypeService, Need::Manage;
    fn upsert_notification_type(pb::UpsertNotificationTypeRequest) -> pb::UpsertNotificationTypeResponse;
}
