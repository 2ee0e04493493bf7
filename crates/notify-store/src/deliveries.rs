//! The worker side of a delivery: claim with a lease, heartbeat, record the attempt
//! fenced by the lease, and the sweeper that recovers expired leases.

use crate::row::{parse, parse_text};
use crate::{Result, truncate_utf8};
use chrono::{DateTime, Utc};
use notify_core::{Category, Channel, Content, Priority, Provider};
use sqlx::{PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

/// Most bytes of a provider's raw answer kept per attempt.
pub const MAX_PROVIDER_RESPONSE_BYTES: usize = 20 * 1024;

/// Everything a channel needs to send one delivery, read in the claim's round trip.
#[derive(Debug, Clone)]
pub struct DeliveryJob {
    /// Delivery id.
    pub id: Uuid,
    /// Event id.
    pub event_id: Uuid,
    /// Caller's event key.
    pub event_key: String,
    /// Notification type key.
    pub type_key: String,
    /// The type's priority (drives APNs priority, FCM Android priority and Web Push
    /// `Urgency`); `normal` when the type is gone.
    pub priority: Priority,
    /// The type's category (marketing email gets List-Unsubscribe); `transactional` when
    /// the type is gone.
    pub category: Category,
    /// Digest group: the delivery lists the events in `digest_items` (in-app: the inbox
    /// group, updated in place).
    pub digest_key: Option<String>,
    /// Recipient.
    pub user_id: String,
    /// Channel.
    pub channel: Channel,
    /// Provider.
    pub provider: Provider,
    /// This attempt's number (1-based).
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Unique per channel.
    pub idempotency_key: String,
    /// LINE retry key.
    pub retry_key: Option<Uuid>,
    /// Fences every write of this attempt.
    pub lease_token: Uuid,
    /// When the claim happened (database clock).
    pub started_at: DateTime<Utc>,
    /// When the delivery was created (database clock).
    pub created_at: DateTime<Utc>,
    /// Email address or LINE user id at planning time.
    pub address: Option<String>,
    /// Recipient's display name (may be empty).
    pub display_name: String,
    /// Recipient's locale.
    pub locale: String,
    /// Recipient's time zone.
    pub timezone: String,
    /// Event payload.
    pub payload: serde_json::Value,
    /// What to say.
    pub content: Content,
    /// Push endpoint id.
    pub endpoint_id: Option<Uuid>,
    /// Push platform.
    pub endpoint_platform: Option<String>,
    /// Push token (or Web Push endpoint URL).
    pub endpoint_token: Option<String>,
    /// Web Push subscription keys.
    pub endpoint_subscription: Option<serde_json::Value>,
    /// `active` or `revoked`.
    pub endpoint_status: Option<String>,
    /// The type is critical (security alert, OTP): quiet hours do not hold it.
    pub critical: bool,
    /// The recipient's quiet hours as they are now (read at the claim, so a window set
    /// after planning still holds the delivery).
    pub quiet_hours: Vec<notify_core::quiet::QuietWindow>,
}

/// Why a message did not lead to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// Claimed: send it.
    Claimed(Box<DeliveryJob>),
    /// No such delivery: the message is poison.
    Missing,
    /// The delivery belongs to another channel than the queue it came from.
    WrongChannel(Channel),
    /// Already being sent under a live lease, already final, or not due yet: a duplicate
    /// or early message, to be acked without a provider call. Carries the status.
    NotClaimable(String),
    /// Its attempt budget was spent (every attempt was claimed, the last ones by workers
    /// that died or froze during the call): the claim made it `failed` instead, without a
    /// call. Carries the attempts made and the error now on the delivery.
    Exhausted {
        /// The delivery's provider.
        provider: Provider,
        /// Attempts made (each a claim that may have reached the provider).
        attempts: i32,
        /// `last_error` as written.
        error: String,
    },
}

impl PartialEq for DeliveryJob {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.lease_token == other.lease_token
    }
}
impl Eq for DeliveryJob {}

/// Claims a due `pending` delivery of `channel` for `lease`: status becomes `sending`,
/// `attempts` grows by one and a fresh lease token and expiry (database clock) are set.
/// One round trip, no transaction left open. See [`claim_many`].
pub async fn claim(
    db: &PgPool,
    id: Uuid,
    channel: Channel,
    lease: Duration,
) -> Result<ClaimOutcome> {
    let mut out = claim_many(db, &[id], channel, lease).await?;
    Ok(out.pop().unwrap_or(ClaimOutcome::Missing))
}

/// [`claim`] for several deliveries of one channel at once: one outcome per id, in order.
/// Each claimed delivery gets its own lease token. One statement claims them all and reads
/// what sending needs; a second one, only when some were not claimed, tells why.
pub async fn claim_many(
    db: &PgPool,
    ids: &[Uuid],
    channel: Channel,
    lease: Duration,
) -> Result<Vec<ClaimOutcome>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(until) = paused_until(db, channel).await? {
        // The channel is paused: each pending delivery waits in Postgres until the pause
        // ends (a new outbox row, due then), without a claim or an attempt.
        let moved: Vec<Uuid> = sqlx::query_scalar(
            "WITH w AS (
                 UPDATE notification_deliveries d
                 SET next_attempt_at = greatest(d.next_attempt_at, $3), updated_at = now()
                 WHERE d.id = ANY($1) AND d.channel || '' = $2 AND d.status || '' = 'pending'
                 RETURNING d.id, d.channel, d.next_attempt_at)
             INSERT INTO outbox (delivery_id, channel, available_at)
             SELECT id, channel, next_attempt_at FROM w
             RETURNING delivery_id",
        )
        .bind(ids)
        .bind(channel.as_str())
        .bind(until)
        .fetch_all(db)
        .await?;
        let moved: std::collections::HashSet<Uuid> = moved.into_iter().collect();
        let mut out = Vec::with_capacity(ids.len());
        let rest: Vec<Uuid> = ids.iter().copied().filter(|i| !moved.contains(i)).collect();
        let mut others = claim_unclaimable(db, &rest, channel).await?;
        for id in ids {
            out.push(if moved.contains(id) {
                ClaimOutcome::NotClaimable(format!("paused until {until}"))
            } else {
                others.remove(id).unwrap_or(ClaimOutcome::Missing)
            });
        }
        return Ok(out);
    }
    let tokens: Vec<Uuid> = ids.iter().map(|_| Uuid::new_v4()).collect();
    let rows = sqlx::query(
        // Rows are found by primary key only. `|| ''` keeps the planner off the partial
        // indexes on status and the (channel, idempotency_key) index, whose statistics
        // lag behind a burst: scanning every due delivery, or every delivery of the
        // channel, for each claim made claims cost O(backlog).
        "WITH c AS (
             UPDATE notification_deliveries d
             SET status = 'sending', attempts = attempts + 1, republish_count = 0,
                 lease_token = ($3::uuid[])[array_position($1::uuid[], d.id)],
                 lease_expires_at = now() + $4 * interval '1 millisecond', updated_at = now()
             WHERE d.id = ANY($1) AND d.channel || '' = $2 AND d.status || '' = 'pending'
               AND d.next_attempt_at <= now() AND d.attempts < d.max_attempts
             RETURNING d.*)
         SELECT c.id, c.event_id, c.user_id, c.channel, c.provider, c.attempts, c.max_attempts,
                c.idempotency_key, c.retry_key, c.lease_token, c.address, c.endpoint_id, now() AS started_at,
                c.created_at,
                e.event_key, e.type, e.payload_json, e.content_json,
                coalesce(r.display_name, '') AS display_name, coalesce(r.locale, 'th-TH') AS locale,
                coalesce(r.timezone, 'Asia/Bangkok') AS timezone,
                ep.platform, ep.token, ep.subscription_json, ep.status AS endpoint_status,
                coalesce(t.priority, 'normal') AS priority,
                coalesce(t.category, 'transactional') AS category, c.digest_key,
                coalesce(t.critical, false) AS critical, r.quiet_hours_json
         FROM c JOIN notification_events e ON e.id = c.event_id
              LEFT JOIN notification_types t ON t.key = e.type
              LEFT JOIN recipients r ON r.user_id = c.user_id
              LEFT JOIN notification_endpoints ep ON ep.id = c.endpoint_id",
    )
    .bind(ids)
    .bind(channel.as_str())
    .bind(&tokens)
    .bind(notify_core::retry::millis(lease))
    .fetch_all(db)
    .await?;
    let mut claimed: std::collections::HashMap<Uuid, ClaimOutcome> = rows
        .into_iter()
        .map(|r| {
            let job = DeliveryJob {
                id: r.get("id"),
                event_id: r.get("event_id"),
                event_key: r.get("event_key"),
                type_key: r.get("type"),
                priority: parse(&r, "priority")?,
                category: parse(&r, "category")?,
                digest_key: r.get("digest_key"),
                user_id: r.get("user_id"),
                channel: parse(&r, "channel")?,
                provider: parse(&r, "provider")?,
                attempt: r.get("attempts"),
                max_attempts: r.get("max_attempts"),
                idempotency_key: r.get("idempotency_key"),
                retry_key: r.get("retry_key"),
                lease_token: r.get("lease_token"),
                started_at: r.get("started_at"),
                created_at: r.get("created_at"),
                address: r.get("address"),
                display_name: r.get("display_name"),
                locale: r.get("locale"),
                timezone: r.get("timezone"),
                payload: r.get("payload_json"),
                content: serde_json::from_value(r.get("content_json")).unwrap_or_default(),
                endpoint_id: r.get("endpoint_id"),
                endpoint_platform: r.get("platform"),
                endpoint_token: r.get("token"),
                endpoint_subscription: r.get("subscription_json"),
                endpoint_status: r.get("endpoint_status"),
                critical: r.get("critical"),
                quiet_hours: r
                    .get::<Option<serde_json::Value>, _>("quiet_hours_json")
                    .and_then(|v| serde_json::from_value(v).ok())
                    .unwrap_or_default(),
            };
            Ok((job.id, ClaimOutcome::Claimed(Box::new(job))))
        })
        .collect::<Result<_>>()?;
    let rest: Vec<Uuid> = ids
        .iter()
        .copied()
        .filter(|id| !claimed.contains_key(id))
        .collect();
    let exhausted = fail_exhausted(db, &rest, channel).await?;
    let rest: Vec<Uuid> = rest
        .into_iter()
        .filter(|id| !exhausted.contains_key(id))
        .collect();
    claimed.extend(exhausted);
    claimed.extend(claim_unclaimable(db, &rest, channel).await?);
    // The same id twice in one batch: the first got the claim, the second sees it taken.
    let mut seen = std::collections::HashSet::new();
    Ok(ids
        .iter()
        .map(|id| {
            if !seen.insert(*id) {
                return ClaimOutcome::NotClaimable("sending".into());
            }
            claimed.remove(id).unwrap_or(ClaimOutcome::Missing)
        })
        .collect())
}

/// The attempt cap on the claim, the one door to a provider call: a due `pending`
/// delivery of `channel` whose attempts are all spent (the sweeper returned it after its
/// worker died during the last one) becomes `failed` here, with a reason that says so,
/// instead of being claimed again.
async fn fail_exhausted(
    db: &PgPool,
    ids: &[Uuid],
    channel: Channel,
) -> Result<std::collections::HashMap<Uuid, ClaimOutcome>> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    let rows: Vec<(Uuid, String, i32, String)> = sqlx::query_as(
        "UPDATE notification_deliveries d
         SET status = 'failed', lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
             last_error = format('%s; gave up after %s attempts (attempt budget spent)',
                                 coalesce(d.last_error, 'attempt_budget_spent'), d.attempts)
         WHERE d.id = ANY($1) AND d.channel || '' = $2 AND d.status || '' = 'pending'
           AND d.next_attempt_at <= now() AND d.attempts >= d.max_attempts
         RETURNING d.id, d.provider, d.attempts, d.last_error",
    )
    .bind(ids)
    .bind(channel.as_str())
    .fetch_all(db)
    .await?;
    rows.into_iter()
        .map(|(id, provider, attempts, error)| {
            Ok((
                id,
                ClaimOutcome::Exhausted {
                    provider: parse_text("provider", &provider)?,
                    attempts,
                    error,
                },
            ))
        })
        .collect()
}

/// Why each of `ids` could not be claimed: wrong channel, or its status. Ids with no
/// delivery are absent.
async fn claim_unclaimable(
    db: &PgPool,
    ids: &[Uuid],
    channel: Channel,
) -> Result<std::collections::HashMap<Uuid, ClaimOutcome>> {
    let mut out = std::collections::HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let rows =
        sqlx::query("SELECT id, status, channel FROM notification_deliveries WHERE id = ANY($1)")
            .bind(ids)
            .fetch_all(db)
            .await?;
    for r in rows {
        let actual: Channel = parse(&r, "channel")?;
        let outcome = if actual != channel {
            ClaimOutcome::WrongChannel(actual)
        } else {
            ClaimOutcome::NotClaimable(r.get("status"))
        };
        out.insert(r.get("id"), outcome);
    }
    Ok(out)
}

/// When `channel` is paused, until when (database clock).
pub async fn paused_until(db: &PgPool, channel: Channel) -> Result<Option<DateTime<Utc>>> {
    Ok(sqlx::query_scalar(
        "SELECT paused_until FROM channel_pauses WHERE channel = $1 AND paused_until > now()",
    )
    .bind(channel.as_str())
    .fetch_optional(db)
    .await?)
}

/// Pauses `channel` for `after` from now (a longer pause already in place stays).
pub async fn pause_channel(
    db: impl sqlx::PgExecutor<'_>,
    channel: Channel,
    after: Duration,
    reason: &str,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO channel_pauses (channel, paused_until, reason)
         VALUES ($1, now() + $2 * interval '1 millisecond', $3)
         ON CONFLICT (channel) DO UPDATE
         SET paused_until = greatest(channel_pauses.paused_until, EXCLUDED.paused_until),
             reason = EXCLUDED.reason, paused_at = now()",
    )
    .bind(channel.as_str())
    .bind(notify_core::retry::millis(after))
    .bind(reason)
    .execute(db)
    .await?;
    Ok(())
}

/// Extends a live lease by `lease` from now (database clock). Returns false when the
/// lease was lost (expired and taken over, or the delivery finished elsewhere).
pub async fn extend_lease(
    db: &PgPool,
    id: Uuid,
    lease_token: Uuid,
    lease: Duration,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE notification_deliveries SET lease_expires_at = now() + $3 * interval '1 millisecond'
         WHERE id = $1 AND lease_token = $2 AND status = 'sending'",
    )
    .bind(id)
    .bind(lease_token)
    .bind(notify_core::retry::millis(lease))
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

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
    let done = sqlx::query(
        "WITH d AS (
             UPDATE notification_deliveries
             SET status = 'pending', attempts = attempts - 1, lease_token = NULL,
                 lease_expires_at = NULL, next_attempt_at = $3, deferred_until = $3,
                 decision = CASE WHEN decision = '' THEN $4 ELSE decision || E'\n' || $4 END,
                 updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND status = 'sending'
             RETURNING id, channel)
         INSERT INTO outbox (delivery_id, channel, available_at) SELECT id, channel, $3 FROM d",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .bind(until)
    .bind(why)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
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
    /// Final failure.
    Failed {
        /// Error code and text for `last_error`.
        error: String,
    },
}

/// One attempt to record.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// Outcome label stored on the attempt: `sent`, `retry` or `failed`.
    pub outcome: &'static str,
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
/// endpoint to deactivate or channel to pause.
pub async fn record_attempts(
    db: &PgPool,
    batch: &[(&DeliveryJob, &NextState, &AttemptRecord)],
) -> Result<Vec<bool>> {
    if batch.is_empty() {
        return Ok(Vec::new());
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
    for (job, next, record) in batch {
        ids.push(job.id);
        tokens.push(job.lease_token);
        retry_base.push(match next {
            NextState::Retry { .. } => chrono::Duration::from_std(record.call_took)
                .ok()
                .and_then(|took| job.started_at.checked_add_signed(took)),
            _ => None,
        });
        let (status, pmid, retry, error) = match next {
            NextState::Sent {
                provider_message_id,
            } => ("sent", provider_message_id.clone(), None, None),
            NextState::Retry { after, error } => (
                "pending",
                None,
                Some(notify_core::retry::millis(*after)),
                Some(error.clone()),
            ),
            NextState::Paused { after, error } => (
                "pending",
                None,
                Some(notify_core::retry::millis(*after)),
                Some(error.clone()),
            ),
            NextState::Failed { error } => ("failed", None, None, Some(error.clone())),
        };
        refunds.push(matches!(next, NextState::Paused { .. }));
        statuses.push(status);
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
             last_error = t.error, sent_at = CASE WHEN t.status = 'sent' THEN now() ELSE d.sent_at END,
             max_attempts = CASE WHEN t.refund THEN d.max_attempts + 1 ELSE d.max_attempts END,
             lease_token = NULL, lease_expires_at = NULL, updated_at = now()
         FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::text[],
                     $7::bool[], $8::timestamptz[])
              AS t(id, token, status, pmid, retry_ms, error, refund, base)
         WHERE d.id = ANY($1) AND d.id = t.id AND d.lease_token = t.token
           AND d.status || '' = 'sending'
         RETURNING d.id, t.token",
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(&statuses)
    .bind(&pmids)
    .bind(&retry_ms)
    .bind(&errors)
    .bind(&refunds)
    .bind(&retry_base)
    .fetch_all(&mut *tx)
    .await?;
    let updated: std::collections::HashSet<(Uuid, Uuid)> = updated.into_iter().collect();
    let kept: Vec<usize> = (0..batch.len())
        .filter(|&i| updated.contains(&(ids[i], tokens[i])))
        .collect();
    if kept.is_empty() {
        tx.rollback().await?;
        return Ok(vec![false; batch.len()]);
    }
    let col = |f: &dyn Fn(usize) -> Option<String>| -> Vec<Option<String>> {
        kept.iter().map(|&i| f(i)).collect()
    };
    sqlx::query(
        "INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, provider_status,
             error_code, provider_response, content_json, worker_id)
         SELECT * FROM UNNEST($1::uuid[], $2::int[], $3::timestamptz[], $4::text[], $5::int[],
                              $6::text[], $7::text[], $8::jsonb[], $9::text[])",
    )
    .bind(kept.iter().map(|&i| batch[i].0.id).collect::<Vec<_>>())
    .bind(kept.iter().map(|&i| batch[i].0.attempt).collect::<Vec<_>>())
    .bind(
        kept.iter()
            .map(|&i| batch[i].0.started_at)
            .collect::<Vec<_>>(),
    )
    .bind(kept.iter().map(|&i| batch[i].2.outcome).collect::<Vec<_>>())
    .bind(
        kept.iter()
            .map(|&i| batch[i].2.provider_status)
            .collect::<Vec<_>>(),
    )
    .bind(col(&|i| batch[i].2.error_code.clone()))
    .bind(col(&|i| {
        batch[i]
            .2
            .provider_response
            .as_deref()
            .map(|s| truncate_utf8(s, MAX_PROVIDER_RESPONSE_BYTES).to_string())
    }))
    .bind(
        kept.iter()
            .map(|&i| &batch[i].2.content)
            .collect::<Vec<_>>(),
    )
    .bind(
        kept.iter()
            .map(|&i| batch[i].2.worker_id.as_str())
            .collect::<Vec<_>>(),
    )
    .execute(&mut *tx)
    .await?;
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
    for &i in &kept {
        if let NextState::Paused { after, error } = batch[i].1 {
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
    Ok(recorded)
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
    let (status, pmid) = match &sent {
        Some(pmid) => ("sent", pmid.clone()),
        None => ("failed", None),
    };
    let updated: i64 = sqlx::query_scalar(
        "WITH d AS (
             UPDATE notification_deliveries
             SET status = $3, provider_message_id = coalesce($4, provider_message_id),
                 sent_at = CASE WHEN $3 = 'sent' THEN now() ELSE sent_at END, last_error = $5,
                 lease_token = NULL, lease_expires_at = NULL, updated_at = now()
             WHERE id = $1 AND lease_token = $2 AND status = 'sending'
             RETURNING id, attempts),
         a AS (
             INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, error_code,
                                            provider_response, content_json, worker_id)
             SELECT id, attempts, $6, CASE WHEN $3 = 'sent' THEN 'sent' ELSE 'failed' END,
                    'record_failed', $5, 'null'::jsonb, '' FROM d
             ON CONFLICT (delivery_id, attempt) DO NOTHING)
         SELECT count(*) FROM d",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .bind(status)
    .bind(pmid)
    .bind(why)
    .bind(job.started_at)
    .fetch_one(db)
    .await?;
    Ok(updated == 1)
}

/// Records a success that came back after the attempt's lease was lost (its heartbeats
/// stopped, the sweeper put the delivery back to `pending`), so the delivery is not sent a
/// second time. Fenced so that a newer claim still wins: only a delivery still `pending`
/// (or `failed` by the sweeper because this was its last attempt), with no lease and no
/// claim since this attempt's (`attempts` unchanged), becomes `sent`, replacing the
/// sweeper's `worker_lost` attempt row with the real answer, in one transaction. False (nothing written) otherwise; an outbox
/// row the sweeper wrote stays, and its message is acked by the claim without a call.
/// `next` must be [`NextState::Sent`] (anything else writes nothing).
pub async fn record_late_success(
    db: &PgPool,
    job: &DeliveryJob,
    next: &NextState,
    record: &AttemptRecord,
) -> Result<bool> {
    let NextState::Sent {
        provider_message_id,
    } = next
    else {
        return Ok(false);
    };
    let mut tx = db.begin().await?;
    let done = sqlx::query(
        "UPDATE notification_deliveries
         SET status = 'sent', provider_message_id = coalesce($3, provider_message_id),
             last_error = NULL, sent_at = now(), updated_at = now()
         WHERE id = $1 AND lease_token IS NULL AND attempts = $2
           AND (status = 'pending'
                -- the sweeper failed it because this very attempt was the last one allowed
                OR (status = 'failed' AND last_error LIKE 'worker_lost:%'))",
    )
    .bind(job.id)
    .bind(job.attempt)
    .bind(provider_message_id)
    .execute(&mut *tx)
    .await?;
    if done.rows_affected() != 1 {
        tx.rollback().await?;
        return Ok(false);
    }
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
    .bind(record.outcome)
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
    tx.commit().await?;
    Ok(true)
}

/// Marks a delivery `failed` with `error` outside the claim protocol: for a message that
/// reached the wrong queue or cannot be sent at all. Only a `pending` delivery changes.
pub async fn fail_unclaimed(db: &PgPool, id: Uuid, error: &str) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE notification_deliveries SET status = 'failed', last_error = $2, updated_at = now()
         WHERE id = $1 AND status = 'pending'",
    )
    .bind(id)
    .bind(error)
    .execute(db)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A delivery whose worker lost its lease during a call, as the sweeper left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredLease {
    /// Delivery id.
    pub id: Uuid,
    /// Channel.
    pub channel: Channel,
    /// Provider.
    pub provider: Provider,
    /// The attempt whose worker went away.
    pub attempt: i32,
    /// `true`: that was the last attempt allowed, and the delivery is now `failed`;
    /// `false`: it is `pending` again, due now, with a new outbox row.
    pub failed: bool,
}

/// Why an expired lease is recorded as an attempt: the worker died or froze during the
/// provider call, so whether the provider got it is unknown.
pub const WORKER_LOST: &str = "worker_lost";

/// Takes up to `limit` deliveries whose lease expired (their worker died or froze during
/// the call): each gets an attempt row (`worker_lost`, since the call may have reached the
/// provider), and then either goes back to `pending`, due now, with a fresh outbox row, or,
/// when that was its last attempt, becomes `failed` with a reason that says the worker
/// died during the call. The attempt cap therefore holds on the recovery path too. Safe to
/// run from several replicas (`SKIP LOCKED`).
pub async fn requeue_expired_leases(db: &PgPool, limit: i64) -> Result<Vec<ExpiredLease>> {
    let rows = sqlx::query(
        "WITH expired AS (
             -- updated_at is the claim's time: nothing else writes it while sending
             SELECT id, updated_at AS claimed_at FROM notification_deliveries
             WHERE status = 'sending' AND lease_expires_at < now()
             ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED),
         upd AS (
             UPDATE notification_deliveries d
             SET status = CASE WHEN d.attempts >= d.max_attempts THEN 'failed' ELSE 'pending' END,
                 lease_token = NULL, lease_expires_at = NULL, next_attempt_at = now(),
                 last_error = CASE WHEN d.attempts >= d.max_attempts
                     THEN format('worker_lost: the worker died or froze during attempt %s, the provider call''s outcome is unknown; gave up after %s attempts (attempt budget spent)', d.attempts, d.attempts)
                     ELSE 'worker_lost: lease expired during the provider call (worker died or froze)' END,
                 updated_at = now()
             FROM expired WHERE d.id = expired.id
             RETURNING d.id, d.channel, d.provider, d.attempts, d.status, expired.claimed_at),
         attempts AS (
             INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, error_code,
                                            provider_response, content_json, worker_id)
             SELECT id, attempts, claimed_at, CASE WHEN status = 'failed' THEN 'failed' ELSE 'retry' END,
                    'worker_lost', 'no answer recorded: the lease expired during the call', 'null'::jsonb, ''
             FROM upd
             ON CONFLICT (delivery_id, attempt) DO NOTHING),
         queued AS (
             INSERT INTO outbox (delivery_id, channel)
             SELECT id, channel FROM upd WHERE status = 'pending')
         SELECT id, channel, provider, attempts, status = 'failed' AS failed FROM upd",
    )
    .bind(limit)
    .fetch_all(db)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ExpiredLease {
                id: r.get("id"),
                channel: parse(r, "channel")?,
                provider: parse(r, "provider")?,
                attempt: r.get("attempts"),
                failed: r.get("failed"),
            })
        })
        .collect()
}

/// Republishes up to `limit` deliveries that have been due for longer than `stale` with
/// no outbox row: their message was lost after the broker confirmed it (a purged or
/// deleted queue, a lost node) or sits unconsumed in a long queue. Each gets a new outbox
/// row. The wait grows with every republish of the same delivery (`stale`, `2 x stale`,
/// `4 x stale` ... at most a day; a claim starts it again), so a backlog that merely sits
/// in the queue gains a few duplicate messages, not one per sweep. A duplicate message is
/// harmless: the claim lets only one through. Returns how many.
pub async fn republish_stale(db: &PgPool, stale: Duration, limit: i64) -> Result<u64> {
    let done = sqlx::query(
        "WITH stale AS (
             SELECT id FROM notification_deliveries d
             WHERE status = 'pending'
               AND next_attempt_at < now() - least($1 * interval '1 millisecond' * power(2, least(d.republish_count, 16)),
                                                   greatest($1 * interval '1 millisecond', interval '1 day'))
               AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
             ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED),
         upd AS (
             UPDATE notification_deliveries d
             SET next_attempt_at = now(), republish_count = d.republish_count + 1, updated_at = now()
             FROM stale WHERE d.id = stale.id
             RETURNING d.id, d.channel)
         INSERT INTO outbox (delivery_id, channel) SELECT id, channel FROM upd",
    )
    // At least a second, whatever the caller passes: 0 would republish on every sweep.
    .bind(notify_core::retry::millis(stale.max(Duration::from_secs(1))))
    .bind(limit)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Writes the in-app notifications of several deliveries in one statement, each
/// idempotent on its delivery id: per input, in order, true when its row was written now
/// and false when it already existed.
///
/// Each row takes its user's next feed position (`seq`) from the user's counter row,
/// which stays locked until the statement commits, so concurrent batches for one user
/// commit in seq order (see `migrations/20261201000019_inbox_stream_order.sql`). Rows are
/// inserted in `user_id` order, so two batches lock their users' counters in one order
/// and cannot deadlock.
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
    let written: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO notifications (id, delivery_id, event_id, user_id, type, title, body, url, data_json)
         SELECT t.id, t.delivery_id, t.event_id, t.user_id, t.type, t.title, t.body,
                NULLIF(t.url, ''), t.data
         FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::text[],
                     $7::text[], $8::text[], $9::jsonb[])
              AS t(id, delivery_id, event_id, user_id, type, title, body, url, data)
         ORDER BY t.user_id
         ON CONFLICT (delivery_id) DO NOTHING
         RETURNING delivery_id",
    )
    .bind(jobs.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.id).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.event_id).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.user_id.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.type_key.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.content.title.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.content.body.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.content.url.as_str()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| &j.payload).collect::<Vec<_>>())
    .fetch_all(db)
    .await?;
    let written: std::collections::HashSet<Uuid> = written.into_iter().collect();
    Ok(jobs.iter().map(|j| written.contains(&j.id)).collect())
}

/// Writes a digest group's one inbox row: created by its first delivery, then updated in
/// place by each later one (latest title and body, one more item, unread again). A
/// delivery already counted changes nothing, so a redelivered message is harmless.
/// Returns whether this delivery changed the row. Like every inbox write it takes the
/// user's next `seq` under the user's counter lock (taken before the row's lock).
pub async fn upsert_grouped_inbox_row(db: &PgPool, job: &DeliveryJob, group: &str) -> Result<bool> {
    let changed: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO notifications (id, delivery_id, event_id, user_id, type, title, body, url,
                                    data_json, group_key, item_count, delivery_ids)
         VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, ''), $9, $10, 1, ARRAY[$2])
         ON CONFLICT (user_id, group_key) WHERE group_key IS NOT NULL DO UPDATE
             SET title = EXCLUDED.title, body = EXCLUDED.body, url = EXCLUDED.url,
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
    .fetch_optional(db)
    .await?;
    Ok(changed.is_some())
}

/// Queue gauges of one channel (see [`gauges`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelGauges {
    /// The channel.
    pub channel: Channel,
    /// Deliveries in `pending`, due or not.
    pub pending: i64,
    /// Seconds since the oldest due pending delivery became due (0 if none).
    pub oldest_due_s: f64,
    /// Whether the channel is paused now.
    pub paused: bool,
}

/// Gauges sampled for the metrics: see [`gauges`].
#[derive(Debug, Clone, PartialEq)]
pub struct Gauges {
    /// Outbox rows waiting to be published.
    pub outbox_rows: i64,
    /// Seconds since the oldest due outbox row became due (0 if none).
    pub outbox_oldest_s: f64,
    /// Per channel with pending deliveries or a pause; channels absent have none.
    pub channels: Vec<ChannelGauges>,
}

/// Samples outbox size and age, pending deliveries and the oldest due one per channel,
/// and paused channels, in one statement (database clock). Uses the partial index on
/// pending deliveries, so its cost follows the backlog, not the table.
pub async fn gauges(db: &PgPool) -> Result<Gauges> {
    let row = sqlx::query(
        "SELECT (SELECT count(*) FROM outbox) AS outbox_rows,
                (SELECT coalesce(extract(epoch FROM now() - min(available_at)), 0)::float8
                   FROM outbox WHERE available_at <= now()) AS outbox_oldest_s,
                (SELECT coalesce(jsonb_agg(jsonb_build_object(
                            'channel', c.channel, 'pending', c.pending, 'oldest', c.oldest,
                            'paused', c.paused)), '[]'::jsonb)
                   FROM (SELECT ch.channel,
                                (SELECT count(*) FROM notification_deliveries d
                                  WHERE d.status = 'pending' AND d.channel = ch.channel) AS pending,
                                (SELECT coalesce(extract(epoch FROM now() - min(d.next_attempt_at)), 0)::float8
                                   FROM notification_deliveries d
                                  WHERE d.status = 'pending' AND d.channel = ch.channel
                                    AND d.next_attempt_at <= now()) AS oldest,
                                EXISTS (SELECT 1 FROM channel_pauses p
                                         WHERE p.channel = ch.channel AND p.paused_until > now()) AS paused
                           FROM unnest(ARRAY['inapp', 'email', 'push', 'line']) AS ch(channel)) c)
                   AS channels",
    )
    .fetch_one(db)
    .await?;
    let channels: serde_json::Value = row.get("channels");
    let channels = channels
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            Ok(ChannelGauges {
                channel: parse_text("channel", c["channel"].as_str().unwrap_or_default())?,
                pending: c["pending"].as_i64().unwrap_or(0),
                oldest_due_s: c["oldest"].as_f64().unwrap_or(0.0).max(0.0),
                paused: c["paused"].as_bool().unwrap_or(false),
            })
        })
        .collect::<Result<_>>()?;
    Ok(Gauges {
        outbox_rows: row.get("outbox_rows"),
        outbox_oldest_s: row.get::<f64, _>("outbox_oldest_s").max(0.0),
        channels,
    })
}
