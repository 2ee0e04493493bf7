//! Ending a claim the due-time rules skip ([`notify_core::due::Due::Skip`]): the delivery
//! existed, but at its due time it may not go out.

use super::DeliveryJob;
use crate::Result;
use crate::webhooks::EventType;
use notify_core::SkipReason;
use sqlx::PgPool;

/// The skip reasons that say the channel cannot reach the user (as opposed to "the user
/// does not want it"): a skip for one of them asks for the type's fallback channel.
pub const UNREACHABLE: [SkipReason; 5] = [
    SkipReason::LineUnfollowed,
    SkipReason::NoEmailAddress,
    SkipReason::EndpointRevoked,
    SkipReason::EmailUndeliverable,
    SkipReason::NoPushEndpoint,
];

/// Ends a claimed delivery `skipped` without a provider call, in one transaction fenced by
/// the lease token: status `skipped` (final), `last_error` = `reason`'s code, the lease
/// cleared, the claim's attempt given back (`attempts - 1`: no call was made), `why`
/// appended to its decision trail. No attempt row and no outbox row are written. For an
/// unreachable reason ([`UNREACHABLE`]) the type's fallback delivery is created in the same
/// transaction ([`crate::derived::fallback_after`]).
///
/// Returns false (nothing written) when the lease was lost: whoever holds the delivery now
/// decides again. Errors: the database's.
pub async fn skip_claimed(
    db: &PgPool,
    job: &DeliveryJob,
    reason: SkipReason,
    why: &str,
) -> Result<bool> {
    let mut tx = db.begin().await?;
    let done = sqlx::query(
        "UPDATE notification_deliveries
         SET status = 'skipped', attempts = attempts - 1, lease_token = NULL,
             lease_expires_at = NULL, last_error = $3, state_version = state_version + 1,
             decision = CASE WHEN decision = '' THEN $4 ELSE decision || E'\\n' || $4 END,
             updated_at = now()
         WHERE id = $1 AND lease_token = $2 AND status = 'sending'",
    )
    .bind(job.id)
    .bind(job.lease_token)
    .bind(reason.as_str())
    .bind(why)
    .execute(&mut *tx)
    .await?;
    if !super::announce_change(&mut tx, done, job.id, EventType::DeliverySkipped).await? {
        return Ok(false);
    }
    if UNREACHABLE.contains(&reason) {
        crate::derived::fallback_after(&mut tx, job.id, reason.as_str()).await?;
    }
    tx.commit().await?;
    Ok(true)
}
