//! `TypeService`: notification types and their templates. Needs a key that may manage.

use super::Services;
use crate::auth::Need;
use crate::error::ApiError;
use crate::type_validation::validate_type;
use notify_proto::v1 as pb;
use notify_store::catalog;
use tonic::{Request, Response, Status};

impl Services {
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

#[tonic::async_trait]
impl pb::type_service_server::TypeService for Services {
    async fn upsert_notification_type(
        &self,
        req: Request<pb::UpsertNotificationTypeRequest>,
    ) -> Result<Response<pb::UpsertNotificationTypeResponse>, Status> {
        self.call(req, Need::Manage, |_, r| self.upsert_type(r))
            .await
    }
}
