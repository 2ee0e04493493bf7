//! Topics: named broadcast audiences and their subscribers.

use crate::Result;
use sqlx::PgExecutor;

/// Creates a topic. Returns false when it existed.
pub async fn create_topic(db: impl PgExecutor<'_>, key: &str) -> Result<bool> {
    let r = sqlx::query("INSERT INTO topics (key) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(key)
        .execute(db)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// Whether a topic exists.
pub async fn topic_exists(db: impl PgExecutor<'_>, key: &str) -> Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM topics WHERE key = $1)")
            .bind(key)
            .fetch_one(db)
            .await?,
    )
}

/// Which of `keys` name existing topics.
pub async fn existing_topics(db: impl PgExecutor<'_>, keys: &[&str]) -> Result<Vec<String>> {
    Ok(
        sqlx::query_scalar("SELECT key FROM topics WHERE key = ANY($1)")
            .bind(keys)
            .fetch_all(db)
            .await?,
    )
}

/// Subscribes users (idempotent). Returns how many were new.
pub async fn subscribe(db: impl PgExecutor<'_>, topic: &str, user_ids: &[String]) -> Result<u64> {
    let r = sqlx::query(
        "INSERT INTO topic_subscriptions (topic, user_id) SELECT $1, u FROM UNNEST($2::text[]) AS u
         ON CONFLICT DO NOTHING",
    )
    .bind(topic)
    .bind(user_ids)
    .execute(db)
    .await?;
    Ok(r.rows_affected())
}

/// Unsubscribes users (idempotent). Returns how many were removed.
pub async fn unsubscribe(db: impl PgExecutor<'_>, topic: &str, user_ids: &[String]) -> Result<u64> {
    let r = sqlx::query("DELETE FROM topic_subscriptions WHERE topic = $1 AND user_id = ANY($2)")
        .bind(topic)
        .bind(user_ids)
        .execute(db)
        .await?;
    Ok(r.rows_affected())
}
