//! Leases after the claim: the worker's heartbeat, the sweeper that recovers leases whose
//! worker died or froze, and the republisher of deliveries whose message was lost.

use crate::Result;
use crate::outbox::RELAY_BEHIND;
use crate::row::parse;
use notify_core::{AttemptLabel, Channel, DeliveryStatus, FailReason, Provider};
use sqlx::{PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

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
    /// The fallback delivery created with the failure, if any
    /// ([`crate::derived::fallback_after_made`]).
    pub fallback: Vec<crate::derived::FallbackMade>,
}

/// Why an expired lease is recorded as an attempt: the worker died or froze between its
/// claim and its record. Nothing in the database says whether it had reached its call's
/// point of no return (the adapter confirms the lease without a round trip while it is
/// fresh), so the provider may never have been called, or may have accepted the call.
pub const WORKER_LOST: &str = FailReason::WorkerLost.as_str();

/// Takes up to `limit` deliveries whose lease expired (their worker died or froze during
/// the call): each gets an attempt row (`worker_lost`, since the call may have reached the
/// provider), and then either goes back to `pending`, due now, with a fresh outbox row, or,
/// when that was its last attempt, becomes `failed` with a reason that says the worker
/// died during that attempt before recording it, and that the provider may or may not
/// have been called. The attempt cap therefore holds on the recovery path too. Safe to
/// run from several replicas (`SKIP LOCKED`).
pub async fn requeue_expired_leases(db: &PgPool, limit: i64) -> Result<Vec<ExpiredLease>> {
    let mut tx = db.begin().await?;
    let rows = sqlx::query(
        "WITH expired AS (
             -- updated_at is the claim's time: nothing else writes it while sending
             SELECT id, updated_at AS claimed_at FROM notification_deliveries
             WHERE status = 'sending' AND lease_expires_at < now()
             ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED),
         upd AS (
             UPDATE notification_deliveries d
             SET status = CASE WHEN d.attempts >= d.max_attempts THEN $2 ELSE $3 END,
                 lease_token = NULL, lease_expires_at = NULL, next_attempt_at = now(),
                 last_error = CASE WHEN d.attempts >= d.max_attempts
                     THEN format('%s: the worker died or froze during attempt %s before recording it (its lease expired), so the provider may never have been called or may have accepted the call; gave up after %s attempts (attempt budget spent)', $6::text, d.attempts, d.attempts)
                     ELSE $6 || ': the lease expired before the attempt was recorded (the worker died or froze; the provider may or may not have been called)' END,
                 updated_at = now(), state_version = d.state_version + 1
             FROM expired WHERE d.id = expired.id
             RETURNING d.id, d.channel, d.provider, d.attempts, d.status, expired.claimed_at),
         attempts AS (
             INSERT INTO delivery_attempts (delivery_id, attempt, started_at, outcome, error_code,
                                            provider_response, content_json, worker_id)
             SELECT id, attempts, claimed_at, CASE WHEN status = $2 THEN $4 ELSE $5 END,
                    $6, 'no answer recorded: the lease expired before the worker recorded the attempt (the provider may or may not have been called)', 'null'::jsonb, ''
             FROM upd
             ON CONFLICT (delivery_id, attempt) DO NOTHING),
         queued AS (
             INSERT INTO outbox (delivery_id, channel)
             SELECT id, channel FROM upd WHERE status = $3)
         SELECT id, channel, provider, attempts, status FROM upd",
    )
    .bind(limit)
    .bind(DeliveryStatus::Failed.as_str())
    .bind(DeliveryStatus::Pending.as_str())
    .bind(AttemptLabel::Failed.as_str())
    .bind(AttemptLabel::Retry.as_str())
    .bind(FailReason::WorkerLost.as_str())
    .fetch_all(&mut *tx)
    .await?;
    let changed: Vec<(Uuid, DeliveryStatus)> = rows
        .iter()
        .map(|r| Ok((r.get("id"), parse(r, "status")?)))
        .collect::<Result<_>>()?;
    crate::webhooks::enqueue_for_statuses(&mut tx, &changed).await?;
    let mut out = Vec::with_capacity(rows.len());
    for (r, (id, status)) in rows.iter().zip(changed) {
        let failed = status == DeliveryStatus::Failed;
        // The last attempt's worker was lost: the fallback is created with the failure.
        let fallback = if failed {
            crate::derived::fallback_after_made(&mut tx, id, WORKER_LOST).await?
        } else {
            Vec::new()
        };
        out.push(ExpiredLease {
            id,
            channel: parse(r, "channel")?,
            provider: parse(r, "provider")?,
            attempt: r.get("attempts"),
            failed,
            fallback,
        });
    }
    tx.commit().await?;
    Ok(out)
}

/// Republishes up to `limit` deliveries of each channel that have been due for longer than `stale` with
/// no outbox row: their message was lost after the broker confirmed it (a purged or
/// deleted queue, a lost node) or sits unconsumed in a long queue. Each gets a new outbox
/// row. The wait grows with every republish of the same delivery (`stale`, `2 x stale`,
/// `4 x stale` ... at most a day; a claim starts it again), so a backlog that merely sits
/// in the queue gains a few duplicate messages, not one per sweep. A duplicate message is
/// harmless: the claim lets only one through. Nothing is republished while the relay is
/// behind ([`relay_behind`] with `stale` and `limit`): the outbox holds the deliveries it
/// has not published yet, new rows would only add to that backlog, and the set of
/// deliveries named by shared rows (`more_delivery_ids`), which the sweep hashes, stays
/// about as small as `stale`'s worth of traffic. Returns how many.
pub async fn republish_stale(db: &PgPool, stale: Duration, limit: i64) -> Result<u64> {
    // Only constants are spliced in.
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        // One ordered range scan of `notification_deliveries_channel_due` per channel, from
        // the oldest due delivery, up to `limit` each; none while the relay is behind.
        "WITH stale AS (
             SELECT s.id FROM unnest($3::text[]) AS ch(channel),
             LATERAL (SELECT d.id FROM notification_deliveries d
                      WHERE d.channel = ch.channel AND d.status = 'pending'
                        -- implied by the next line (the wait is at least $1), but an
                        -- index bound: the scan stops at the first delivery due since
                        AND d.next_attempt_at < now() - $1 * interval '1 millisecond'
                        AND d.next_attempt_at < now() - least($1 * interval '1 millisecond' * power(2, least(d.republish_count, 16)),
                                                              greatest($1 * interval '1 millisecond', interval '1 day'))
                        AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = d.id)
                        -- NOT IN, not <> ALL: Postgres hashes the list once for NOT IN
                        AND NOT d.id IN (SELECT unnest(o.more_delivery_ids) FROM outbox o
                                         WHERE o.more_delivery_ids IS NOT NULL)
                      ORDER BY d.next_attempt_at LIMIT $2 FOR UPDATE OF d SKIP LOCKED) s
             WHERE NOT {RELAY_BEHIND}),
         upd AS (
             UPDATE notification_deliveries d
             SET next_attempt_at = now(), republish_count = d.republish_count + 1, updated_at = now()
             FROM stale WHERE d.id = stale.id
             RETURNING d.id, d.channel)
         INSERT INTO outbox (delivery_id, channel) SELECT id, channel FROM upd",
    )))
    .bind(sweep_wait(stale))
    .bind(limit)
    .bind(Channel::ALL.map(Channel::as_str).as_slice())
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Whether the relay is behind: more than `backlog` outbox rows have been due for longer
/// than `stale` (at least a second) without being claimed. [`republish_stale`] waits
/// meanwhile; its caller logs the pause. A row claimed, or kept after a failed publish,
/// is due again in the future, so rows the relay keeps trying do not count; a few stuck
/// rows (locked by another transaction, say) do not pause the sweep either.
pub async fn relay_behind(db: &PgPool, stale: Duration, backlog: i64) -> Result<bool> {
    Ok(
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT {RELAY_BEHIND}")))
            .bind(sweep_wait(stale))
            .bind(backlog)
            .fetch_one(db)
            .await?,
    )
}

/// The sweep's wait in milliseconds: at least a second, whatever the caller passes (0
/// would republish on every sweep).
fn sweep_wait(stale: Duration) -> i64 {
    notify_core::retry::millis(stale.max(Duration::from_secs(1)))
}
