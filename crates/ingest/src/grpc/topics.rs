//! `TopicService`: topics and their subscribers. Needs a key that may manage.

use super::Services;
use crate::auth::Need;
use crate::error::ApiError;
use notify_core::validate::{self, Violations};
use notify_proto::v1 as pb;
use notify_store::topics;

impl Services {
    /// Checks the topic key and the user ids, which are normalised in place by the one
    /// id rule ([`Violations::id`]): `INVALID_ARGUMENT` naming each bad field, then
    /// `NOT_FOUND` when the topic does not exist.
    async fn check_topic_users(
        &self,
        topic: &str,
        user_ids: &mut [String],
    ) -> Result<(), ApiError> {
        let mut v = Violations::default();
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
        for (i, u) in user_ids.iter_mut().enumerate().take(1_000) {
            if let Some(id) = v.id(&format!("user_ids[{i}]"), u, 255) {
                *u = id;
            }
        }
        v.into_result(()).map_err(ApiError::Invalid)?;
        if topics::topic_exists(&self.pool, topic).await? {
            Ok(())
        } else {
            Err(ApiError::NotFound {
                kind: "topic",
                name: topic.to_string(),
            })
        }
    }

    async fn create_topic(
        &self,
        r: pb::CreateTopicRequest,
    ) -> Result<pb::CreateTopicResponse, ApiError> {
        if !validate::is_type_key(&r.key) {
            return Err(ApiError::field(
                "key",
                "must be 1 to 64 characters of [a-z0-9_.-] starting with a letter",
            ));
        }
        let created = topics::create_topic(&self.pool, &r.key).await?;
        Ok(pb::CreateTopicResponse { created })
    }

    async fn subscribe(
        &self,
        mut r: pb::SubscribeRequest,
    ) -> Result<pb::SubscribeResponse, ApiError> {
        self.check_topic_users(&r.topic, &mut r.user_ids).await?;
        let added = topics::subscribe(&self.pool, &r.topic, &r.user_ids).await?;
        Ok(pb::SubscribeResponse {
            added: added as u32,
        })
    }

    async fn unsubscribe(
        &self,
        mut r: pb::UnsubscribeRequest,
    ) -> Result<pb::UnsubscribeResponse, ApiError> {
        self.check_topic_users(&r.topic, &mut r.user_ids).await?;
        let removed = topics::unsubscribe(&self.pool, &r.topic, &r.user_ids).await?;
        Ok(pb::UnsubscribeResponse {
            removed: removed as u32,
        })
    }
}

delegate_service! {
    impl pb::topic_service_server::TopicService, Need::Manage;
    fn create_topic(pb::CreateTopicRequest) -> pb::CreateTopicResponse;
    fn subscribe(pb::SubscribeRequest) -> pb::SubscribeResponse;
    fn unsubscribe(pb::UnsubscribeRequest) -> pb::UnsubscribeResponse;
}
