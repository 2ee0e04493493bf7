//! Recording an attempt, fenced by the lease: the new state of the delivery and its
//! attempt row in one transaction, plus the paths that end a claim without a normal record
//! (deferred at due time, the record's fallback, a success after the lease was lost, a
//! message that cannot be sent at all).

use super::{DeliveryJob, MAX_PROVIDER_RESPONSE_BYTES, pause_channel};
use crate::webhooks::EventType;
use crate::{Result, truncate_utf8};
use chrono::{DateTime, Utc};
use notify_core::{AttemptLabel, DeliveryStatus, FailReason};
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// Gives a claimed delivery back without a provider call because a rule checked at due
/// time holds it ([`notify_core::due`]): `pending` again, the claim's attempt returned,
/// due at `until` with an outbox row due then, and `why` appended to its decision trail.
/// Fenced by the lease token: false (nothing written) when the lease was lost.
pub async fn defer_claimed(
    db: &PgPool,
    job: &DeliveryJob,
    until: DateTime<Utc>,
    why: &str,
) -> Result<bool> {
    let mut tx = db.begin().await?;
    let done = sqlx::query(
        "WITH d AS (
             UPDATE notification_deliveries
             SET status = $5, attempts = attempts - 1, lease_token = NULL,
                 state_version = state_version + 1,
                 lease_expires_at = NULL, next_attempt_at = $3, deferred_until = $3,
                 decision = CASE WHEN decision = '' THEN $4 ELSE decision || E'\n' || $4 END,
                 updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND status = $6
             RETURNING id, channel)
         INSERT INTO outbox (delivery_id, channel, available_at) SELECT id, channel, $3 FROM d",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .bind(until)
    .bind(why)
    .bind(DeliveryStatus::Pending.as_str())
    .bind(DeliveryStatus::Sending.as_str())
    .execute(&mut *tx)
    .await?;
    if !super::announce_change(&mut tx, done, job.id, EventType::DeliveryDeferred).await? {
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

/// New state of a delivery after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum NextState {
    /// Accepted by the provider.
    Sent {
        /// Provider's id for it.
        provider_message_id: Option<String>,
    },
    /// Try again after the delay (an outbox row is written, due then).
    Retry {
        /// Delay from the provider's answer (the claim's database time plus
        /// [`AttemptRecord::call_took`]), not from when the record commits; a due time
        /// already past when the record commits is due at once.
        after: Duration,
        /// Error code and text for `last_error`.
        error: String,
    },
    /// The channel's quota is spent: the delivery waits `after` without spending its
    /// budget (the call is recorded as an attempt and `max_attempts` grows by one), and the
    /// channel is paused that long.
    Paused {
        /// Delay from now (the end of the quota period).
        after: Duration,
        /// Error code and text for `last_error` and the pause's reason.
        error: String,
    },
    /// No provider was called: none could take the call (every email provider's breaker
    /// open). Not an attempt: the claim is given back (`pending`, `attempts` and
    /// `first_attempt_at` as before it, no attempt row, no status webhook, `state_version`
    /// unchanged), due `after` from now with an outbox row due then, and the channel is
    /// paused that long, so the deliveries that wait meanwhile are not claimed at all.
    Unavailable {
        /// Delay from now (until the first provider admits a call again).
        after: Duration,
        /// Error code and text for `last_error` and the pause's reason.
        error: String,
    },
    /// Final failure.
    Failed {
        /// Error code and text for `last_error`.
        error: String,
    },
}

impl NextState {
    /// The delivery's status once this state is recorded: `sent`, `failed`, or `pending`
    /// (a retry, a pause, a claim given back).
    pub fn status(&self) -> DeliveryStatus {
        match self {
            NextState::Sent { .. } => DeliveryStatus::Sent,
            NextState::Failed { .. } => DeliveryStatus::Failed,
            NextState::Retry { .. } | NextState::Paused { .. } | NextState::Unavailable { .. } => {
                DeliveryStatus::Pending
            }
        }
    }

    /// The outcome stored on the attempt that led here: `sent`, `failed`, or `retry` for
    /// every state that waits for another attempt.
    pub fn attempt_label(&self) -> AttemptLabel {
        match self.status() {
            DeliveryStatus::Sent => AttemptLabel::Sent,
            DeliveryStatus::Failed => AttemptLabel::Failed,
            _ => AttemptLabel::Retry,
        }
    }
}

/// One attempt to record.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// Outcome label stored on the attempt ([`NextState::attempt_label`] of the state it
    /// led to).
    pub outcome: AttemptLabel,
    /// HTTP status or SMTP code.
    pub provider_status: Option<i32>,
    /// Normalised error code.
    pub error_code: Option<String>,
    /// Raw answer (truncated here to 20 KB).
    pub provider_response: Option<String>,
    /// What was sent.
    pub content: serde_json::Value,
    /// Endpoint to deactivate with this reason (push token gone).
    pub deactivate_endpoint: Option<(Uuid, String)>,
    /// Email address to mark undeliverable with this reason (mailbox does not exist).
    pub address_undeliverable: Option<(String, String)>,
    /// Since when the provider says the endpoint has been invalid; the deactivation only
    /// applies to an endpoint registered before this moment and before the attempt began.
    pub endpoint_invalid_since: Option<DateTime<Utc>>,
    /// The worker instance that made the call.
    pub worker_id: String,
    /// From the claim to the provider's answer (monotonic clock of the worker): a retry is
    /// due at the claim's database time plus this plus its delay.
    pub call_took: Duration,
}

/// Records attempts and their deliveries' new states in one transaction, each fenced by
/// its own lease token: one result per input, in order, false (nothing written for it)
/// when that lease was lost. Four statements at most, whatever the number, plus one per
/// endpoint to deactivate or channel to pause. A [`NextState::Unavailable`] gives its
/// claim back instead of recording an attempt.
pub async fn record_attempts(
    db: &PgPool,
    batch: &[(&DeliveryJob, &NextState, &AttemptRecord)],
) -> Result<Vec<bool>> {
    Ok(record_attempts_with_fallbacks(db, batch).await?.0)
}

/// [`record_attempts`], also answering the fallback deliveries created, in the same
/// transaction, for the deliveries that ended `failed`
/// ([`crate::derived::fallback_after_made`]), for the caller to count after the commit.
pub async fn record_attempts_with_fallbacks(
    db: &PgPool,
    batch: &[(&DeliveryJob, &NextState, &AttemptRecord)],
) -> Result<(Vec<bool>, Vec<crate::derived::FallbackMade>)> {
    if batch.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut ids = Vec::with_capacity(batch.len());
    let mut tokens = Vec::with_capacity(batch.len());
    let mut statuses = Vec::with_capacity(batch.len());
    let mut pmids: Vec<Option<String>> = Vec::with_capacity(batch.len());
    let mut retry_ms: Vec<Option<i64>> = Vec::with_capacity(batch.len());
    // A retry counts from the provider's answer; a pause from now.
    let mut retry_base: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(batch.len());
    let mut errors: Vec<Option<String>> = Vec::with_capacity(batch.len());
    let mut refunds: Vec<bool> = Vec::with_capacity(batch.len());
    // No provider was called: the claim is given back, not recorded as an attempt.
    let mut given_back: Vec<bool> = Vec::with_capacity(batch.len());
    for (job, next, record) in batch {
        ids.push(job.id);
        tokens.push(job.lease_token);
        retry_base.push(match next {
            NextState::Retry { .. } => chrono::Duration::from_std(record.call_took)
                .ok()
                .and_then(|took| job.started_at.checked_add_signed(took)),
            _ => None,
        });
        let (pmid, retry, error) = match next {
            NextState::Sent {
                provider_message_id,
            } => (provider_message_id.clone(), None, None),
            NextState::Retry { after, error }
            | NextState::Paused { after, error }
            | NextState::Unavailable { after, error } => (
                None,
                Some(notify_core::retry::millis(*after)),
                Some(error.clone()),
            ),
            NextState::Failed { error } => (None, None, Some(error.clone())),
        };
        refunds.push(matches!(next, NextState::Paused { .. }));
        given_back.push(matches!(next, NextState::Unavailable { .. }));
        statuses.push(next.status());
        pmids.push(pmid);
        retry_ms.push(retry);
        errors.push(error);
    }
    let mut tx = db.begin().await?;
    // By primary key, not the partial lease index (see `claim_many`).
    let updated: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "UPDATE notification_deliveries d
         SET status = t.status, provider_message_id = coalesce(t.pmid, d.provider_message_id),
             next_attempt_at = CASE WHEN t.retry_ms IS NULL THEN d.next_attempt_at
                                    ELSE greatest(now(), coalesce(t.base, now())
                                                         + t.retry_ms * interval '1 millisecond') END,
             last_error = t.error, sent_at = CASE WHEN t.status = $10 THEN now() ELSE d.sent_at END,
             max_attempts = CASE WHEN t.refund THEN d.max_attempts + 1 ELSE d.max_attempts END,
             attempts = CASE WHEN t.given_back THEN d.attempts - 1 ELSE d.attempts END,
             first_attempt_at = CASE WHEN t.given_back AND d.attempts <= 1 THEN NULL
                                     ELSE d.first_attempt_at END,
             lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
             state_version = CASE WHEN t.given_back THEN d.state_version
                                  ELSE d.state_version + 1 END
         FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::text[],
                     $7::bool[], $8::timestamptz[], $9::bool[])
              AS t(id, token, status, pmid, retry_ms, error, refund, base, given_back)
         WHERE d.id = ANY($1) AND d.id = t.id AND d.lease_token = t.token
           AND d.status || '' = $11
         RETURNING d.id, t.token",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    .bind(&pmids)
    .bind(&retry_ms)
    .bind(&errors)
    .bind(&refunds)
    .bind(&retry_base)
    .bind(&given_back)
    .bind(DeliveryStatus::Sent.as_str())
    .bind(DeliveryStatus::Sending.as_str())
    .fetch_all(&mut *tx)
    .await?;
    let updated: std::collections::HashSet<(Uuid, Uuid)> = updated.into_iter().collect();
    let kept: Vec<usize> = (0..batch.len())
        .filter(|&i| updated.contains(&(ids[i], tokens[i])))
        .collect();
    if kept.is_empty() {
        tx.rollback().await?;
        return Ok((vec![false; batch.len()], Vec::new()));
    }
    let rows: Vec<(&DeliveryJob, &AttemptRecord)> = kept
        .iter()
        .filter(|&&i| !given_back[i])
        .map(|&i| (batch[i].0, batch[i].2))
        .collect();
    insert_attempts(&mut tx, &rows).await?;
    let retries: Vec<usize> = kept
        .iter()
        .copied()
        .filter(|&i| retry_ms[i].is_some())
        .collect();
    if !retries.is_empty() {
        // Due when the delivery is, as just written (and announced, so a relay waiting
        // for the next due row wakes up: the outbox trigger notifies `notify_outbox`).
        sqlx::query(
            "INSERT INTO outbox (delivery_id, channel, available_at)
             SELECT id, channel, next_attempt_at FROM notification_deliveries
             WHERE id = ANY($1)",
        )
        .bind(retries.iter().map(|&i| ids[i]).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await?;
    }
    // A claim given back changed nothing a caller sees: no webhook.
    let changed: Vec<(Uuid, DeliveryStatus)> = kept
        .iter()
        .filter(|&&i| !given_back[i])
        .map(|&i| (ids[i], statuses[i]))
        .collect();
    crate::webhooks::enqueue_for_statuses(&mut tx, &changed).await?;
    let mut fallbacks = Vec::new();
    for &i in &kept {
        if matches!(batch[i].1, NextState::Failed { .. }) {
            fallbacks.extend(
                crate::derived::fallback_after_made(
                    &mut tx,
                    batch[i].0.id,
                    FailReason::AttemptFailed.as_str(),
                )
                .await?,
            );
        }
        if let NextState::Paused { after, error } | NextState::Unavailable { after, error } =
            batch[i].1
        {
            pause_channel(&mut *tx, batch[i].0.channel, *after, error).await?;
        }
        if let Some((endpoint, reason)) = &batch[i].2.deactivate_endpoint {
            let started = batch[i].0.started_at;
            let fence = batch[i]
                .2
                .endpoint_invalid_since
                .map_or(started, |t| t.min(started));
            crate::catalog::deactivate_endpoint(&mut *tx, *endpoint, reason, fence).await?;
        }
        if let Some((address, reason)) = &batch[i].2.address_undeliverable {
            let job = batch[i].0;
            crate::catalog::mark_email_undeliverable(
                &mut *tx,
                &job.user_id,
                address,
                reason,
                job.started_at,
            )
            .await?;
        }
    }
    tx.commit().await?;
    let mut recorded = vec![false; batch.len()];
    for &i in &kept {
        recorded[i] = true;
    }
    Ok((recorded, fallbacks))
}

/// Writes one `delivery_attempts` row per `(job, record)`: attempt `job.attempt`, started
/// at `job.started_at`, the provider's answer cut to [`MAX_PROVIDER_RESPONSE_BYTES`]. One
/// statement; call it in the transaction that records the attempts' new states.
pub(super) async fn insert_attempts(
    conn: &mut sqlx::PgConnection,
    rows: &[(&DeliveryJob, &AttemptRecord)],
) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, provider_status,
             error_code, provider_response, content_json, worker_id)
         SELECT * FROM UNNEST($1::uuid[], $2::int[], $3::timestamptz[], $4::text[], $5::int[],
                              $6::text[], $7::text[], $8::jsonb[], $9::text[])",
    )
    .bind(rows.iter().map(|(j, _)| j.id).collect::<Vec<_>>())
    .bind(rows.iter().map(|(j, _)| j.attempt).collect::<Vec<_>>())
    .bind(rows.iter().map(|(j, _)| j.started_at).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|(_, r)| r.outcome.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|(_, r)| r.provider_status)
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|(_, r)| r.error_code.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        rows.iter()
            .map(|(_, r)| {
                r.provider_response
                    .as_deref()
                    .map(|s| truncate_utf8(s, MAX_PROVIDER_RESPONSE_BYTES).to_string())
            })
            .collect::<Vec<_>>(),
    )
    .bind(rows.iter().map(|(_, r)| &r.content).collect::<Vec<_>>())
    .bind(
        rows.iter()
            .map(|(_, r)| r.worker_id.as_str())
            .collect::<Vec<_>>(),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The last resort when an attempt's full record fails for a reason other than the
/// database being unreachable (a value it refuses, a constraint): the delivery still ends,
/// visibly, instead of looping through lease expiry and calling the provider again. Fenced
/// by the lease token: `sent` when the provider accepted (with its message id), else
/// `failed`; `why` goes to `last_error`, and a bare attempt row (`record_failed`) keeps the
/// call counted. Returns false when the lease was lost.
pub async fn record_fallback(
    db: &PgPool,
    job: &DeliveryJob,
    sent: Option<Option<String>>,
    why: &str,
) -> Result<bool> {
    let (status, outcome, pmid) = match &sent {
        Some(pmid) => (DeliveryStatus::Sent, AttemptLabel::Sent, pmid.clone()),
        None => (DeliveryStatus::Failed, AttemptLabel::Failed, None),
    };
    let mut tx = db.begin().await?;
    let updated: i64 = sqlx::query_scalar(
        "WITH d AS (
             UPDATE notification_deliveries
             SET status = $3, provider_message_id = coalesce($4, provider_message_id),
                 state_version = state_version + 1,
                 sent_at = CASE WHEN $3 = $9 THEN now() ELSE sent_at END, last_error = $5,
                 lease_token = NULL, lease_expires_at = NULL, updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND status = $10
             RETURNING id, attempts),
         a AS (
             INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, error_code,
                                            provider_response, content_json, worker_id)
             SELECT id, attempts, $6, $7, $8, $5, 'null'::jsonb, '' FROM d
             ON CONFLICT (delivery_id, attempt) DO NOTHING)
         SELECT count(*) FROM d",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .bind(status.as_str())
    .bind(pmid)
    .bind(why)
    .bind(job.started_at)
    .bind(outcome.as_str())
    .bind(FailReason::RecordFailed.as_str())
    .bind(DeliveryStatus::Sent.as_str())
    .bind(DeliveryStatus::Sending.as_str())
    .fetch_one(&mut *tx)
    .await?;
    if updated != 1 {
        return Ok(false);
    }
    crate::webhooks::enqueue_for_statuses(&mut tx, &[(job.id, status)]).await?;
    tx.commit().await?;
    Ok(true)
}

/// What [`record_late_success`] recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LateSuccess {
    /// The delivery had been given up (`failed` by the sweeper's last `worker_lost`, or by
    /// the claim's spent budget): its failure, counted and alerted then, is withdrawn, and
    /// a `delivery.sent` webhook follows the `delivery.failed` one.
    pub was_failed: bool,
    /// What became of the fallbacks that failure had created
    /// ([`crate::derived::withdraw_fallbacks`]).
    pub fallbacks: crate::derived::Withdrawn,
}

/// Records a success that came back after the attempt's lease was lost (its heartbeats
/// stopped, the sweeper put the delivery back to `pending`), so the delivery is not sent a
/// second time. Fenced so that a newer claim still wins: only a delivery still `pending`
/// (or `failed` by the sweeper, or by the claim's spent budget, because this was its last
/// attempt), with no lease and no claim since this attempt's (`attempts` unchanged),
/// becomes `sent`, replacing the sweeper's `worker_lost` attempt row with the real answer,
/// in one transaction. When it had been failed, every consequence of that failure follows
/// the final state in the same transaction: the fallbacks it created that are still
/// `pending` are canceled ([`crate::derived::withdraw_fallbacks`]), and the answer says so
/// for the caller to withdraw the alert and count it. `None` (nothing written) otherwise;
/// an outbox row the sweeper wrote stays, and its message is acked by the claim without a
/// call. `next` must be [`NextState::Sent`] (anything else writes nothing).
pub async fn record_late_success(
    db: &PgPool,
    job: &DeliveryJob,
    next: &NextState,
    record: &AttemptRecord,
) -> Result<Option<LateSuccess>> {
    let NextState::Sent {
        provider_message_id,
    } = next
    else {
        return Ok(None);
    };
    let mut tx = db.begin().await?;
    // The status before the update, read under the row lock the update takes.
    let was: Option<(String, Uuid)> = sqlx::query_as(
        "UPDATE notification_deliveries d
         SET status = $4, provider_message_id = coalesce($3, d.provider_message_id),
             last_error = NULL, sent_at = now(), updated_at = now(),
             state_version = d.state_version + 1
         FROM (SELECT id, status FROM notification_deliveries WHERE id = $1 FOR UPDATE) o
         WHERE d.id = o.id AND d.lease_token IS NULL AND d.attempts = $2
           AND (d.status = $5
                -- given up because this very attempt was the last one allowed: by the
                -- sweeper (`worker_lost: ...`), or by the claim's spent budget, which keeps
                -- the sweeper's error in front
                OR (d.status = $6 AND d.last_error LIKE $7 || ':%'))
         RETURNING o.status, d.event_id",
    )
    .bind(job.id)
    .bind(job.attempt)
    .bind(provider_message_id)
    .bind(DeliveryStatus::Sent.as_str())
    .bind(DeliveryStatus::Pending.as_str())
    .bind(DeliveryStatus::Failed.as_str())
    .bind(FailReason::WorkerLost.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    let Some((was, event_id)) = was else {
        tx.rollback().await?;
        return Ok(None);
    };
    sqlx::query(
        "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, provider_status,
             error_code, provider_response, content_json, worker_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         -- the sweeper's `worker_lost` row for this attempt gives way to the real answer
         ON CONFLICT (delivery_id, attempt) DO UPDATE
         SET outcome = EXCLUDED.outcome, provider_status = EXCLUDED.provider_status,
             error_code = EXCLUDED.error_code, provider_response = EXCLUDED.provider_response,
             content_json = EXCLUDED.content_json, worker_id = EXCLUDED.worker_id,
             finished_at = now()",
    )
    .bind(job.id)
    .bind(job.attempt)
    .bind(job.started_at)
    .bind(record.outcome.as_str())
    .bind(record.provider_status)
    .bind(&record.error_code)
    .bind(
        record
            .provider_response
            .as_deref()
            .map(|s| truncate_utf8(s, MAX_PROVIDER_RESPONSE_BYTES).to_string()),
    )
    .bind(&record.content)
    .bind(&record.worker_id)
    .execute(&mut *tx)
    .await?;
    crate::webhooks::enqueue_for_deliveries(
        &mut tx,
        &[(job.id, crate::webhooks::EventType::DeliverySent)],
    )
    .await?;
    let was_failed =
        crate::row::parse_text::<DeliveryStatus>("status", &was)? == DeliveryStatus::Failed;
    let fallbacks = if was_failed {
        crate::derived::withdraw_fallbacks(&mut tx, event_id, job.id).await?
    } else {
        Default::default()
    };
    tx.commit().await?;
    Ok(Some(LateSuccess {
        was_failed,
        fallbacks,
    }))
}

/// Marks a delivery `failed` with `reason` as its error outside the claim protocol: for a
/// message that reached the wrong queue or cannot be sent at all. Only a `pending`
/// delivery changes; false when it was not (nothing written).
pub async fn fail_unclaimed(db: &PgPool, id: Uuid, reason: FailReason) -> Result<bool> {
    let mut tx = db.begin().await?;
    let done = sqlx::query(
        "UPDATE notification_deliveries SET status = $3, last_error = $2, updated_at = now(),
             state_version = state_version + 1
         WHERE id = $1 AND status = $4",
    )
    .bind(id)
    .bind(reason.as_str())
    .bind(DeliveryStatus::Failed.as_str())
    .bind(DeliveryStatus::Pending.as_str())
    .execute(&mut *tx)
    .await?;
    if !super::announce_change(&mut tx, done, id, EventType::DeliveryFailed).await? {
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}
