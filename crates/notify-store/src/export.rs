//! What `ExportRecipientData` reads (PDPA section 30): every row held about one user, as
//! JSON built by Postgres, in pages. The small parts (the recipient, endpoints,
//! preferences, subscriptions) come whole; inbox items and deliveries come in keyset
//! pages of at most the asked number of rows (tokens masked by the SQL function
//! `mask_token`: the first 4 and last 4 characters kept), so the caller holds one page at a time
//! whatever the user's number of rows. The document's shape is in `docs/data.md`.

use crate::Result;
use serde_json::Value;
use uuid::Uuid;

/// The parts of the document that are small per user: `recipient` (null when there is
/// no recipients row; quiet hours included), `endpoints` (tokens masked, subscription
/// keys left out), `preferences` and `topic_subscriptions`, each a JSON value.
pub async fn head(db: &sqlx::PgPool, user_id: &str) -> Result<Vec<(&'static str, Value)>> {
    let recipient: Option<Value> = sqlx::query_scalar(
        "SELECT jsonb_build_object(
             'user_id', user_id, 'display_name', display_name, 'email', email,
             'line_user_id', line_user_id, 'locale', locale, 'timezone', timezone,
             'quiet_hours', quiet_hours_json, 'email_undeliverable_at', email_undeliverable_at,
             'created_at', created_at, 'updated_at', updated_at)
         FROM recipients WHERE user_id = $1",
    )
    .bind(user_id)
    .fetch_optional(db)
    .await?;
    let endpoints = user_json(
        db,
        "SELECT coalesce(jsonb_agg(jsonb_build_object(
             'endpoint_id', id, 'platform', platform, 'token_masked', mask_token(token),
             'status', status, 'revoked_reason', revoked_reason, 'registered_at', registered_at,
             'last_seen_at', last_seen_at, 'revoked_at', revoked_at) ORDER BY registered_at, id),
             '[]')
         FROM notification_endpoints WHERE user_id = $1",
        user_id,
    )
    .await?;
    let preferences = user_json(
        db,
        "SELECT coalesce(jsonb_agg(jsonb_build_object(
             'type', type, 'channel', channel, 'enabled', enabled,
             'quiet_hours', quiet_hours_json, 'updated_at', updated_at) ORDER BY type, channel),
             '[]')
         FROM notification_preferences WHERE user_id = $1",
        user_id,
    )
    .await?;
    let subscriptions = user_json(
        db,
        "SELECT coalesce(jsonb_agg(jsonb_build_object('topic', topic, 'created_at', created_at)
             ORDER BY topic), '[]')
         FROM topic_subscriptions WHERE user_id = $1",
        user_id,
    )
    .await?;
    Ok(vec![
        ("recipient", recipient.unwrap_or(Value::Null)),
        ("endpoints", endpoints),
        ("preferences", preferences),
        ("topic_subscriptions", subscriptions),
    ])
}

/// The one JSON value `sql` returns with `user_id` bound as `$1`.
async fn user_json(db: &sqlx::PgPool, sql: &'static str, user_id: &str) -> Result<Value> {
    Ok(sqlx::query_scalar(sql).bind(user_id).fetch_one(db).await?)
}

/// Up to `limit` of the user's inbox items after feed position `after_seq` (0 = from the
/// start), in feed order: `(seq, item as JSON text)`.
pub async fn inbox_page(
    db: &sqlx::PgPool,
    user_id: &str,
    after_seq: i64,
    limit: i64,
) -> Result<Vec<(i64, String)>> {
    Ok(sqlx::query_as(
        "SELECT seq, jsonb_build_object(
             'id', id, 'type', type, 'title', title, 'body', body, 'url', url,
             'image_url', image_url, 'actions', actions, 'data', data_json, 'status', status,
             'created_at', created_at, 'read_at', read_at, 'event_id', event_id,
             'delivery_id', delivery_id)::text
         FROM notifications WHERE user_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
    )
    .bind(user_id)
    .bind(after_seq)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// Up to `limit` of the user's deliveries after `after` (None = from the first), in id
/// (creation) order, each with its attempts (content sent and provider answer included):
/// `(delivery id, delivery as JSON text)`.
pub async fn deliveries_page(
    db: &sqlx::PgPool,
    user_id: &str,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<(Uuid, String)>> {
    Ok(sqlx::query_as(
        "SELECT d.id, jsonb_build_object(
             'delivery_id', d.id, 'event_id', d.event_id, 'type', e.type, 'channel', d.channel,
             'provider', d.provider, 'address', d.address, 'endpoint_id', d.endpoint_id,
             'status', d.status, 'last_error', d.last_error, 'decision', d.decision,
             'created_at', d.created_at, 'sent_at', d.sent_at,
             'provider_message_id', d.provider_message_id,
             'attempts', coalesce((
                 SELECT jsonb_agg(jsonb_build_object(
                     'attempt', a.attempt, 'outcome', a.outcome, 'started_at', a.started_at,
                     'finished_at', a.finished_at, 'provider_status', a.provider_status,
                     'error_code', a.error_code, 'provider_response', a.provider_response,
                     'content', a.content_json) ORDER BY a.attempt)
                 FROM delivery_attempts a WHERE a.delivery_id = d.id), '[]'))::text
         FROM notification_deliveries d
         LEFT JOIN notification_events e ON e.id = d.event_id
         WHERE d.user_id = $1 AND ($2::uuid IS NULL OR d.id > $2)
         ORDER BY d.id LIMIT $3",
    )
    .bind(user_id)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?)
}
