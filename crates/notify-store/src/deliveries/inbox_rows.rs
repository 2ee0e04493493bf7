//! Writing in-app notifications (the `notifications` rows of the inbox) for claimed
//! deliveries, each idempotent on its delivery id.

use super::{AttemptRecord, DeliveryJob};
use crate::Result;
use crate::row::column;
use notify_core::DeliveryStatus;
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

/// Writes the in-app notifications of several deliveries in one statement, each
/// idempotent on its delivery id: per input, in order, true when its row was written now
/// and false when it already existed.
///
/// Each row takes its user's next feed position (`seq`) from the user's counter row,
/// which stays locked until the statement commits, so concurrent batches for one user
/// commit in seq order (see `migrations/20261201000019_inbox_stream_order.sql`). The
/// statement bumps each user's counter once, by the number of its rows, in `user_id`
/// order (so two batches lock their users' counters in one order and cannot deadlock),
/// and numbers the user's rows in delivery-id order below the new value
/// (`migrations/20261203000035_inbox_seq_per_statement.sql`); a row skipped as already
/// written leaves a gap. PostgreSQL does not order a data-modifying CTE against the rest
/// of its statement, and this needs no such order: a user's rows take their seq from the
/// CTE's answer for that user, so they are inserted only after that user's counter is
/// locked, and two batches holding one delivery id hold the same user's counter, so
/// neither waits on the other's row while holding a counter the other needs.
pub async fn insert_inbox_notifications(db: &PgPool, jobs: &[&DeliveryJob]) -> Result<Vec<bool>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    // Digest groups update one row each, in place, so they go one by one.
    if jobs.iter().any(|j| j.digest_key.is_some()) {
        let mut out = Vec::with_capacity(jobs.len());
        let plain: Vec<&DeliveryJob> = jobs
            .iter()
            .copied()
            .filter(|j| j.digest_key.is_none())
            .collect();
        let mut plain_written = Box::pin(insert_inbox_notifications(db, &plain))
            .await?
            .into_iter();
        for j in jobs {
            out.push(match &j.digest_key {
                Some(group) => upsert_grouped_inbox_row(db, j, group).await?,
                None => plain_written.next().unwrap_or(false),
            });
        }
        return Ok(out);
    }
    let written = insert_plain_rows(db, jobs).await?;
    let written: std::collections::HashSet<Uuid> = written.into_iter().collect();
    Ok(jobs.iter().map(|j| written.contains(&j.id)).collect())
}

/// The statement of [`insert_inbox_notifications`] for rows of no digest group: the
/// delivery ids written now (a row already there is skipped).
async fn insert_plain_rows<'c, E>(db: E, jobs: &[&DeliveryJob]) -> Result<Vec<Uuid>>
where
    E: sqlx::PgExecutor<'c>,
{
    Ok(sqlx::query_scalar(
        "WITH t AS (
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[],
                                  $6::text[], $7::text[], $8::text[], $9::jsonb[], $10::text[],
                                  $11::jsonb[])
                 AS t(id, delivery_id, event_id, user_id, type, title, body, url, data,
                      image_url, actions)),
         counters AS (
             INSERT INTO inbox_user_seq AS s (user_id, seq)
             SELECT user_id, count(*) FROM t GROUP BY user_id ORDER BY user_id
             ON CONFLICT (user_id) DO UPDATE SET seq = s.seq + EXCLUDED.seq
             RETURNING s.user_id, s.seq)
         INSERT INTO notifications (id, delivery_id, event_id, user_id, type, title, body, url,
                                    data_json, image_url, actions, seq)
         SELECT t.id, t.delivery_id, t.event_id, t.user_id, t.type, t.title, t.body,
                NULLIF(t.url, ''), t.data, NULLIF(t.image_url, ''), t.actions,
                c.seq + 1 - row_number() OVER (PARTITION BY t.user_id ORDER BY t.delivery_id DESC)
         FROM t JOIN counters c ON c.user_id = t.user_id
         ORDER BY t.user_id
         ON CONFLICT (delivery_id) DO NOTHING
         RETURNING delivery_id",
    )
    .bind(column(jobs, |_| Uuid::now_v7()))
    .bind(column(jobs, |j| j.id))
    .bind(column(jobs, |j| j.event_id))
    .bind(column(jobs, |j| j.user_id.as_str()))
    .bind(column(jobs, |j| j.type_key.as_str()))
    .bind(column(jobs, |j| j.content.title.as_str()))
    .bind(column(jobs, |j| j.content.body.as_str()))
    .bind(column(jobs, |j| j.content.url.as_str()))
    .bind(column(jobs, |j| &j.payload))
    .bind(column(jobs, |j| j.content.image_url.as_str()))
    .bind(column(jobs, |j| Json(&j.content.actions)))
    .fetch_all(db)
    .await?)
}

/// Writes a digest group's one inbox row: created by its first delivery, then updated in
/// place by each later one (latest title, body, image and actions, one more item, unread
/// again, the earlier click forgotten since the content it was on is gone). A
/// delivery already counted changes nothing, so a redelivered message is harmless.
/// Returns whether this delivery changed the row. Like every inbox write it takes the
/// user's next `seq` under the user's counter lock (taken before the row's lock).
pub async fn upsert_grouped_inbox_row(db: &PgPool, job: &DeliveryJob, group: &str) -> Result<bool> {
    let changed: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO notifications (id, delivery_id, event_id, user_id, type, title, body, url,
                                    data_json, group_key, item_count, delivery_ids, image_url,
                                    actions)
         VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, ''), $9, $10, 1, ARRAY[$2],
                 NULLIF($11, ''), $12)
         ON CONFLICT (user_id, group_key) WHERE group_key IS NOT NULL DO UPDATE
             SET title = EXCLUDED.title, body = EXCLUDED.body, url = EXCLUDED.url,
                 image_url = EXCLUDED.image_url, actions = EXCLUDED.actions,
                 clicked_action = NULL, clicked_at = NULL,
                 data_json = EXCLUDED.data_json, event_id = EXCLUDED.event_id,
                 item_count = notifications.item_count + 1,
                 delivery_ids = notifications.delivery_ids || EXCLUDED.delivery_id,
                 status = 'unread', read_at = NULL, updated_at = now()
             WHERE NOT (EXCLUDED.delivery_id = ANY(notifications.delivery_ids))
         RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(job.id)
    .bind(job.event_id)
    .bind(&job.user_id)
    .bind(&job.type_key)
    .bind(&job.content.title)
    .bind(&job.content.body)
    .bind(&job.content.url)
    .bind(&job.payload)
    .bind(group)
    .bind(&job.content.image_url)
    .bind(Json(&job.content.actions))
    .fetch_optional(db)
    .await?;
    Ok(changed.is_some())
}

/// Records in-app deliveries read without a claim ([`super::read_due_many`]) as delivered,
/// in one transaction: each one becomes `sent` (one attempt more, `first_attempt_at` if it
/// had none and `sent_at` now), with its attempt row (`record`), its inbox row (as
/// [`insert_inbox_notifications`] writes it) and its status webhook messages. Only while
/// it is still the due `pending` in-app delivery of the `state_version` and attempt it
/// was read at, and less than `within` after the read (`started_at`, database clock).
///
/// No lease is needed: nothing leaves the database between the read and this write, and
/// the write is whole or nothing. A cancel or erasure (or a claim, a deferral, another
/// worker's record) that commits in between makes it write nothing for that delivery, so
/// no inbox row appears for a canceled delivery. `within` (the workers' lease length)
/// bounds how old the facts the due-time rules were checked on may be, as a lease bounds
/// a claimed delivery's: preferences and the escalation's parent are not in the fence.
///
/// One result per input, in order: true when it was recorded now, false when nothing was
/// written for it (it changed since it was read; a digest group's delivery, whose inbox
/// row is updated in place; the same delivery a second time in the batch). The caller
/// takes those through the claim. Four statements whatever the number, in one
/// transaction.
pub async fn record_inbox_sent(
    db: &PgPool,
    batch: &[(&DeliveryJob, &AttemptRecord)],
    within: std::time::Duration,
) -> Result<Vec<bool>> {
    let mut seen = std::collections::HashSet::new();
    let eligible: Vec<usize> = (0..batch.len())
        .filter(|&i| batch[i].0.digest_key.is_none() && seen.insert(batch[i].0.id))
        .collect();
    if eligible.is_empty() {
        return Ok(vec![false; batch.len()]);
    }
    let read: Vec<&DeliveryJob> = eligible.iter().map(|&i| batch[i].0).collect();
    let mut tx = db.begin().await?;
    // By primary key, not the partial due index (see `claim_many`).
    let updated: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE notification_deliveries d
         SET status = $6, attempts = d.attempts + 1, republish_count = 0,
             first_attempt_at = coalesce(d.first_attempt_at, now()), sent_at = now(),
             last_error = NULL, updated_at = now(), state_version = d.state_version + 1
         FROM UNNEST($1::uuid[], $2::int[], $3::int[], $4::timestamptz[])
              AS t(id, version, attempt, read_at)
         WHERE d.id = ANY($1) AND d.id = t.id AND d.state_version = t.version
           AND d.attempts + 1 = t.attempt AND d.channel || '' = 'inapp'
           AND d.status || '' = $7 AND d.next_attempt_at <= now()
           AND d.attempts < d.max_attempts
           AND now() < t.read_at + $5 * interval '1 millisecond'
         RETURNING d.id",
    )
    .bind(column(&read, |j| j.id))
    .bind(column(&read, |j| j.state_version))
    .bind(column(&read, |j| j.attempt))
    .bind(column(&read, |j| j.started_at))
    .bind(notify_core::retry::millis(within))
    .bind(DeliveryStatus::Sent.as_str())
    .bind(DeliveryStatus::Pending.as_str())
    .fetch_all(&mut *tx)
    .await?;
    let updated: std::collections::HashSet<Uuid> = updated.into_iter().collect();
    let kept: Vec<usize> = eligible
        .into_iter()
        .filter(|&i| updated.contains(&batch[i].0.id))
        .collect();
    if kept.is_empty() {
        tx.rollback().await?;
        return Ok(vec![false; batch.len()]);
    }
    let jobs: Vec<&DeliveryJob> = kept.iter().map(|&i| batch[i].0).collect();
    let new_rows: std::collections::HashSet<Uuid> = insert_plain_rows(&mut *tx, &jobs)
        .await?
        .into_iter()
        .collect();
    // A row already there (written by an earlier attempt whose record was lost) is said
    // so on this attempt, as `worker-inapp`'s own send says it.
    let rows: Vec<(&DeliveryJob, AttemptRecord)> = kept
        .iter()
        .map(|&i| {
            let (job, record) = batch[i];
            let mut record = record.clone();
            if !new_rows.contains(&job.id) {
                record.provider_response = Some("inbox row already present".into());
            }
            (job, record)
        })
        .collect();
    let rows: Vec<(&DeliveryJob, &AttemptRecord)> = rows.iter().map(|(j, r)| (*j, r)).collect();
    super::record::insert_attempts(&mut tx, &rows).await?;
    let sent: Vec<(Uuid, DeliveryStatus)> =
        jobs.iter().map(|j| (j.id, DeliveryStatus::Sent)).collect();
    crate::webhooks::enqueue_for_statuses(&mut tx, &sent).await?;
    tx.commit().await?;
    let mut out = vec![false; batch.len()];
    for i in kept {
        out[i] = true;
    }
    Ok(out)
}
