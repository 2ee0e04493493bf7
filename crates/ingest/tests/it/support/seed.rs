//! What a test registers before it sends: notification types, recipients and their push
//! endpoints (FCM, APNs, Web Push subscriptions at the simulator).

use super::{Platform, SendExt, line_id, uniq};
use notify_proto::v1 as pb;
use serde_json::Value;

impl Platform {
    /// Registers `key` with `channels`, the fallback list `fallback` and at most one
    /// escalation `(from, to, after_seconds)`.
    pub(crate) async fn add_derived_type(
        &self,
        key: &str,
        channels: &[&str],
        fallback: &[&str],
        escalation: Option<(&str, &str, u32)>,
    ) {
        self.types()
            .upsert_notification_type(pb::UpsertNotificationTypeRequest {
                key: key.into(),
                default_channels: channels.iter().map(|c| c.to_string()).collect(),
                fallback_channels: fallback.iter().map(|c| c.to_string()).collect(),
                escalations: escalation
                    .into_iter()
                    .map(|(from, to, after)| pb::Escalation {
                        from_channel: from.into(),
                        to_channel: to.into(),
                        after_seconds: after,
                    })
                    .collect(),
                ..Default::default()
            })
            .await
            .expect("upsert type");
    }

    /// Registers (or updates) the type `req` describes.
    pub(crate) async fn upsert_type(&self, req: pb::UpsertNotificationTypeRequest) {
        self.types()
            .upsert_notification_type(req)
            .await
            .expect("upsert type");
    }

    /// Registers `promo_weekly`: a low-priority marketing type sent by email (so its mail
    /// carries the one-click unsubscribe link, and a complaint suppresses it).
    pub(crate) async fn add_marketing_type(&self) {
        self.upsert_type(pb::UpsertNotificationTypeRequest {
            key: "promo_weekly".into(),
            priority: "low".into(),
            default_channels: vec!["email".into()],
            category: "marketing".into(),
            ..Default::default()
        })
        .await;
    }

    /// Sets `user_id`'s preference for `r#type` on `channel` (`"*"`: every type or
    /// channel).
    pub(crate) async fn set_preference(
        &self,
        user_id: &str,
        r#type: &str,
        channel: &str,
        enabled: bool,
    ) {
        self.recipients()
            .set_preference(pb::SetPreferenceRequest {
                user_id: user_id.into(),
                r#type: r#type.into(),
                channel: channel.into(),
                enabled,
            })
            .await
            .expect("set preference");
    }

    /// Registers a type with every channel (or `channels`).
    pub(crate) async fn add_type(&self, key: &str, channels: &[&str]) {
        self.types()
            .upsert_notification_type(type_request(key, channels))
            .await
            .expect("upsert type");
    }

    /// Registers (or updates) a recipient with these addresses; an empty string is none.
    pub(crate) async fn add_recipient(&self, user_id: &str, name: &str, email: &str, line: &str) {
        self.recipients()
            .upsert_recipient(pb::UpsertRecipientRequest {
                user_id: user_id.into(),
                display_name: name.into(),
                email: email.into(),
                line_user_id: line.into(),
                ..Default::default()
            })
            .await
            .expect("upsert recipient");
    }

    /// Registers a recipient `uniq(prefix)` whose only address is a new LINE user id;
    /// returns (user id, LINE user id).
    pub(crate) async fn add_line_recipient(&self, prefix: &str) -> (String, String) {
        let (user_id, line) = (uniq(prefix), line_id());
        self.add_recipient(&user_id, "", "", &line).await;
        (user_id, line)
    }

    /// Registers a recipient `uniq(prefix)` whose only address is `{user id}@example.test`;
    /// returns (user id, email address).
    pub(crate) async fn add_email_recipient(&self, prefix: &str) -> (String, String) {
        let user_id = uniq(prefix);
        let email = format!("{user_id}@example.test");
        self.add_recipient(&user_id, "", &email, "").await;
        (user_id, email)
    }

    /// Creates topic `key`; panics on an error.
    pub(crate) async fn create_topic(&self, key: &str) {
        self.topics()
            .create_topic(pb::CreateTopicRequest { key: key.into() })
            .await
            .expect("create topic");
    }

    /// Subscribes `user_ids` to `topic`; panics on an error.
    pub(crate) async fn subscribe(&self, topic: &str, user_ids: &[&str]) {
        self.try_subscribe(topic, user_ids)
            .await
            .expect("subscribe");
    }

    /// `Subscribe` of `user_ids` to `topic`: ingest's answer.
    pub(crate) async fn try_subscribe(
        &self,
        topic: &str,
        user_ids: &[&str],
    ) -> Result<tonic::Response<pb::SubscribeResponse>, tonic::Status> {
        self.topics()
            .subscribe(pb::SubscribeRequest {
                topic: topic.into(),
                user_ids: user_ids.iter().map(|u| u.to_string()).collect(),
            })
            .await
    }

    /// Registers a recipient `uniq(prefix)` with no email and no LINE id (reached in-app,
    /// or by push once an endpoint is added); returns the user id.
    pub(crate) async fn add_bare_recipient(&self, prefix: &str) -> String {
        let user_id = uniq(prefix);
        self.add_recipient(&user_id, "", "", "").await;
        user_id
    }

    /// Registers an FCM device token for `user_id`; returns the endpoint id.
    pub(crate) async fn add_device(&self, user_id: &str, token: &str) -> String {
        self.add_endpoint(user_id, "fcm", token).await
    }

    /// Registers a push endpoint of `platform` (`fcm` or `apns`) for `user_id`.
    pub(crate) async fn add_endpoint(&self, user_id: &str, platform: &str, token: &str) -> String {
        self.recipients()
            .register_endpoint(pb::RegisterEndpointRequest {
                user_id: user_id.into(),
                platform: platform.into(),
                token: token.into(),
                web_push: None,
            })
            .await
            .expect("register endpoint")
            .into_inner()
            .endpoint_id
    }

    /// Subscribes `endpoint` at the simulator's push service (as a browser would) and
    /// registers the subscription for `user_id`; returns the endpoint id.
    pub(crate) async fn add_webpush(&self, user_id: &str, endpoint: &str) -> String {
        let sub: Value = self
            .http
            .post(format!("{}/_sim/webpush/subscriptions", self.sim_url))
            .json(&serde_json::json!({"endpoint": endpoint}))
            .json_body()
            .await;
        self.recipients()
            .register_endpoint(pb::RegisterEndpointRequest {
                user_id: user_id.into(),
                platform: "webpush".into(),
                token: String::new(),
                web_push: Some(pb::WebPushSubscription {
                    endpoint: endpoint.into(),
                    p256dh: sub["keys"]["p256dh"].as_str().unwrap().into(),
                    auth: sub["keys"]["auth"].as_str().unwrap().into(),
                }),
            })
            .await
            .expect("register endpoint")
            .into_inner()
            .endpoint_id
    }

    /// The user unsubscribed `endpoint` in the browser: the push service answers 410.
    pub(crate) async fn webpush_unsubscribe(&self, endpoint: &str) {
        let r = self
            .http
            .post(format!("{}/_sim/webpush/unsubscribe", self.sim_url))
            .json(&serde_json::json!({"endpoint": endpoint}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }

    /// Sets one quiet-hours window for `user_id` on every channel, from `start` to `end`
    /// (their wall-clock `HH:MM` in the time zone they carry); panics on an error.
    pub(crate) async fn set_quiet_hours(
        &self,
        user_id: &str,
        start: chrono::DateTime<chrono_tz::Tz>,
        end: chrono::DateTime<chrono_tz::Tz>,
    ) {
        let hhmm = |t: chrono::DateTime<chrono_tz::Tz>| t.format("%H:%M").to_string();
        self.set_quiet_window(user_id, &hhmm(start), &hhmm(end))
            .await
            .expect("set quiet hours");
    }

    /// `SetQuietHours` with one window on every channel from `start` to `end` (`HH:MM`):
    /// ingest's answer.
    pub(crate) async fn set_quiet_window(
        &self,
        user_id: &str,
        start: &str,
        end: &str,
    ) -> Result<(), tonic::Status> {
        self.recipients()
            .set_quiet_hours(pb::SetQuietHoursRequest {
                user_id: user_id.into(),
                windows: vec![pb::QuietWindow {
                    start: start.into(),
                    end: end.into(),
                    channels: vec![],
                }],
            })
            .await
            .map(drop)
    }

    /// Subscribes `n` users `<prefix>-000000`, `<prefix>-000001`, ... to a new topic
    /// `topic`, by SQL (as a large audience is seeded).
    pub(crate) async fn add_topic_audience(&self, topic: &str, prefix: &str, n: i32) {
        self.create_topic(topic).await;
        sqlx::query(
            "INSERT INTO topic_subscriptions (topic, user_id)
             SELECT $1, $2 || '-' || lpad(i::text, 6, '0') FROM generate_series(0, $3 - 1) i",
        )
        .bind(topic)
        .bind(prefix)
        .bind(n)
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// An `invoice_due` type whose in-app notification escalates to email when still
    /// unread after `after_seconds`, a recipient `uniq(prefix)` with an email address, and
    /// one invoice (key `invoice:<user>`) sent to them: (user id, address, the event).
    pub(crate) async fn escalating_invoice(
        &self,
        after_seconds: u32,
        prefix: &str,
    ) -> (String, String, pb::CreateEventResponse) {
        self.add_derived_type(
            "invoice_due",
            &["inapp"],
            &[],
            Some(("inapp", "email", after_seconds)),
        )
        .await;
        let (u, address) = self.add_email_recipient(prefix).await;
        let created = self
            .send(&format!("invoice:{u}"), "invoice_due", &[&u])
            .await;
        (u, address, created)
    }

    /// When the escalation of `event_id` is due (its `next_attempt_at`).
    pub(crate) async fn escalation_due(&self, event_id: &str) -> chrono::DateTime<chrono::Utc> {
        self.scalar(
            "SELECT next_attempt_at FROM notification_deliveries
             WHERE event_id = $1::uuid AND cause = 'escalation'",
            event_id,
        )
        .await
    }

    /// `GetRecipient` of `user_id`: ingest's answer.
    pub(crate) async fn try_get_recipient(
        &self,
        user_id: &str,
    ) -> Result<pb::GetRecipientResponse, tonic::Status> {
        self.recipients()
            .get_recipient(pb::GetRecipientRequest {
                user_id: user_id.into(),
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// `user_id`'s preferences as `GetPreferences` answers them; panics on an error.
    pub(crate) async fn preferences(&self, user_id: &str) -> pb::GetPreferencesResponse {
        self.recipients()
            .get_preferences(pb::GetPreferencesRequest {
                user_id: user_id.into(),
            })
            .await
            .expect("GetPreferences")
            .into_inner()
    }

    /// Makes every delivery of `event_id` due now, and its outbox rows available now (as
    /// if the time they wait for had come).
    pub(crate) async fn make_due_now(&self, event_id: &str) {
        self.exec(
            "UPDATE notification_deliveries SET next_attempt_at = now() WHERE event_id = $1::uuid",
            event_id,
        )
        .await;
        self.exec(
            "UPDATE outbox SET available_at = now() WHERE delivery_id IN
               (SELECT id FROM notification_deliveries WHERE event_id = $1::uuid)",
            event_id,
        )
        .await;
    }

    /// Inserts `n` in-app outbox rows for deliveries that do not exist, due an hour ago and
    /// not claimed (a relay that is behind); returns their ids.
    pub(crate) async fn add_stale_outbox_rows(&self, n: i32) -> Vec<i64> {
        self.scalars(
            "INSERT INTO outbox (delivery_id, channel, available_at)
             SELECT gen_random_uuid(), 'inapp', now() - interval '1 hour'
             FROM generate_series(1, $1) RETURNING id",
            n,
        )
        .await
    }
}

/// The `UpsertNotificationType` request of a normal-priority, non-critical type `key`
/// whose default channels are `channels`, the rest default.
pub(crate) fn type_request(key: &str, channels: &[&str]) -> pb::UpsertNotificationTypeRequest {
    pb::UpsertNotificationTypeRequest {
        key: key.into(),
        priority: "normal".into(),
        default_channels: channels.iter().map(|c| c.to_string()).collect(),
        ..Default::default()
    }
}

/// A Thai (`th`) LINE template whose messages are `messages` (a JSON array of LINE message
/// objects, e.g. one Flex card), the rest default.
pub(crate) fn line_template(messages: &serde_json::Value) -> pb::Template {
    pb::Template {
        channel: "line".into(),
        locale: "th".into(),
        overrides: Some(pb::ChannelOverrides {
            line_messages_json: messages.to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}
