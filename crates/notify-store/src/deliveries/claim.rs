//! The claim: a due `pending` delivery becomes `sending` under a fresh lease, in one round
//! trip, or the reason it cannot be claimed (paused channel, wrong channel, not due, its
//! attempt budget spent). The same statement reads what the due-time rules need
//! ([`notify_core::due`]: preferences, LINE follow state, endpoint state, undeliverable
//! address), each by primary or unique key.

use super::{ClaimOutcome, DeliveryJob, DueState, paused_until};
use crate::Result;
use crate::row::{parse, parse_text};
use notify_core::{Channel, DeliveryStatus, FailReason};
use sqlx::{PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

/// The part of the claim's statement after its `WITH c AS (...)`, shared with
/// [`read_due_many`]: `c` names the deliveries (as they are once claimed) and this reads,
/// beside them, what sending needs and what the due-time rules check, each by primary or
/// unique key. A macro, so each statement stays one `&'static str` (`concat!`).
macro_rules! job_select {
    () => {
        "SELECT c.id, c.event_id, c.user_id, c.channel, c.provider, c.attempts, c.max_attempts,
                c.idempotency_key, c.retry_key, c.lease_token, c.endpoint_id, now() AS started_at,
                -- Email goes to the address the recipient has now (it may have changed
                -- since planning; none left means the rules at due time skip it).
                CASE WHEN c.channel = 'email' AND r.user_id IS NOT NULL THEN r.email
                     ELSE c.address END AS address,
                c.created_at, c.first_attempt_at, c.cause, c.state_version,
                e.event_key, e.type, e.payload_json, e.content_json,
                coalesce(r.display_name, '') AS display_name, coalesce(r.locale, 'th-TH') AS locale,
                coalesce(r.timezone, 'Asia/Bangkok') AS timezone,
                ep.platform, ep.token, ep.subscription_json, ep.status AS endpoint_status,
                coalesce(t.priority, 'normal') AS priority,
                coalesce(t.category, 'transactional') AS category, c.digest_key,
                coalesce(t.critical, false) AS critical, r.quiet_hours_json,
                t.updated_at AS type_updated_at,
                ptc.enabled AS pref_tc_on, ptc.updated_at AS pref_tc_at,
                ptw.enabled AS pref_tw_on, ptw.updated_at AS pref_tw_at,
                pcw.enabled AS pref_cw_on, pcw.updated_at AS pref_cw_at,
                CASE WHEN NOT lf.following THEN lf.changed_at END AS line_unfollowed_at,
                ep.revoked_at AS endpoint_revoked_at, ep.revoked_reason AS endpoint_revoked_reason,
                CASE WHEN c.channel = 'email' THEN r.email_undeliverable_at END AS email_undeliverable_at,
                (e.topic IS NOT NULL AND ts.user_id IS NULL) AS topic_unsubscribed,
                -- Email suppressed for the user or the address and the type's category.
                CASE WHEN c.channel = 'email' AND NOT coalesce(t.critical, false) THEN
                    (SELECT min(s.created_at) FROM email_suppressions s
                     WHERE (s.user_id = c.user_id
                            OR (s.user_id IS NULL AND lower(s.address) = lower(coalesce(r.email, c.address))))
                       AND (s.category = 'all'
                            OR (s.category = 'marketing' AND t.category = 'marketing')))
                END AS email_suppressed_at,
                -- An escalation is answered once its parent was read or clicked.
                CASE WHEN c.cause = 'escalation' THEN
                    (SELECT CASE WHEN p.channel = 'inapp'
                                 THEN coalesce(
                                     (SELECT coalesce(n.read_at,
                                                      CASE WHEN n.status <> 'unread' THEN n.created_at END)
                                      FROM notifications n WHERE n.delivery_id = p.id),
                                     (SELECT min(k.at) FROM delivery_clicks k WHERE k.delivery_id = p.id))
                                 ELSE (SELECT min(k.at) FROM delivery_clicks k WHERE k.delivery_id = p.id)
                            END
                     FROM notification_deliveries p WHERE p.id = c.caused_by)
                END AS escalation_answered
         FROM c JOIN notification_events e ON e.id = c.event_id
              LEFT JOIN notification_types t ON t.key = e.type
              LEFT JOIN recipients r ON r.user_id = c.user_id
              -- The endpoint as long as it still belongs to the recipient: a token registered
              -- again by another user since planning is gone for this delivery.
              LEFT JOIN notification_endpoints ep ON ep.id = c.endpoint_id AND ep.user_id = c.user_id
              -- The facts the due-time rules read (notify_core::due), each by its primary
              -- key: the three preference levels, and the LINE user id's follow state.
              LEFT JOIN notification_preferences ptc
                     ON ptc.user_id = c.user_id AND ptc.type = e.type AND ptc.channel = c.channel
              LEFT JOIN notification_preferences ptw
                     ON ptw.user_id = c.user_id AND ptw.type = e.type AND ptw.channel = '*'
              LEFT JOIN notification_preferences pcw
                     ON pcw.user_id = c.user_id AND pcw.type = '*' AND pcw.channel = c.channel
              LEFT JOIN line_followers lf ON c.provider = 'line' AND lf.line_user_id = c.address
              LEFT JOIN topic_subscriptions ts ON ts.topic = e.topic AND ts.user_id = c.user_id"
    };
}

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
        concat!(
            "WITH c AS (
             UPDATE notification_deliveries d
             SET status = 'sending', attempts = attempts + 1, republish_count = 0,
                 first_attempt_at = coalesce(d.first_attempt_at, now()),
                 lease_token = ($3::uuid[])[array_position($1::uuid[], d.id)],
                 lease_expires_at = now() + $4 * interval '1 millisecond', updated_at = now()
             WHERE d.id = ANY($1) AND d.channel || '' = $2 AND d.status || '' = 'pending'
               AND d.next_attempt_at <= now() AND d.attempts < d.max_attempts
             RETURNING d.*)
         ",
            job_select!()
        ),
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
            let job = job_from_row(&r)?;
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
                return ClaimOutcome::NotClaimable(DeliveryStatus::Sending.to_string());
            }
            claimed.remove(id).unwrap_or(ClaimOutcome::Missing)
        })
        .collect())
}

/// Reads due `pending` deliveries of `channel` as [`claim_many`] would claim them, without
/// claiming them: nothing is written, and no lease is taken. For a channel whose delivery
/// is a write to this database and no outside call (in-app: [`super::record_inbox_sent`]
/// writes the delivery's end, its attempt and its inbox row in one transaction, fenced by
/// the `state_version` read here, so nothing needs holding in between). Each job is as the
/// claim would give it: `attempt` is the attempt it would be, `first_attempt_at` and
/// `started_at` the database's now; `lease_token` is nil.
///
/// One answer per id, in order: `None` for an id that is not a due `pending` delivery of
/// the channel with attempts left, and for every id while the channel is paused. The
/// caller takes those through [`claim_many`], which says why or claims them.
pub async fn read_due_many(
    db: &PgPool,
    ids: &[Uuid],
    channel: Channel,
) -> Result<Vec<Option<DeliveryJob>>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    if paused_until(db, channel).await?.is_some() {
        return Ok(vec![None; ids.len()]);
    }
    let rows = sqlx::query(concat!(
        // The claim's row predicate, by primary key only (see `claim_many`).
        "WITH c AS (
             SELECT d.id, d.event_id, d.user_id, d.channel, d.provider, d.attempts + 1 AS attempts,
                    d.max_attempts, d.idempotency_key, d.retry_key,
                    '00000000-0000-0000-0000-000000000000'::uuid AS lease_token, d.endpoint_id,
                    d.address, d.created_at, coalesce(d.first_attempt_at, now()) AS first_attempt_at,
                    d.cause, d.state_version, d.digest_key, d.caused_by
             FROM notification_deliveries d
             WHERE d.id = ANY($1) AND d.channel || '' = $2 AND d.status || '' = 'pending'
               AND d.next_attempt_at <= now() AND d.attempts < d.max_attempts)
         ",
        job_select!()
    ))
    .bind(ids)
    .bind(channel.as_str())
    .fetch_all(db)
    .await?;
    let mut read: std::collections::HashMap<Uuid, DeliveryJob> = rows
        .iter()
        .map(|r| job_from_row(r).map(|j| (j.id, j)))
        .collect::<Result<_>>()?;
    // The same id twice: the first takes it, the second goes through the claim.
    Ok(ids.iter().map(|id| read.remove(id)).collect())
}

/// The job a row of [`job_select`] describes.
fn job_from_row(r: &sqlx::postgres::PgRow) -> Result<DeliveryJob> {
    Ok(DeliveryJob {
        id: r.get("id"),
        event_id: r.get("event_id"),
        event_key: r.get("event_key"),
        type_key: r.get("type"),
        type_updated_at: r.get("type_updated_at"),
        priority: parse(r, "priority")?,
        category: parse(r, "category")?,
        digest_key: r.get("digest_key"),
        user_id: r.get("user_id"),
        channel: parse(r, "channel")?,
        provider: parse(r, "provider")?,
        attempt: r.get("attempts"),
        max_attempts: r.get("max_attempts"),
        idempotency_key: r.get("idempotency_key"),
        retry_key: r.get("retry_key"),
        lease_token: r.get("lease_token"),
        started_at: r.get("started_at"),
        created_at: r.get("created_at"),
        first_attempt_at: r.get("first_attempt_at"),
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
        endpoint_status: r
            .get::<Option<&str>, _>("endpoint_status")
            .map(|s| parse_text("endpoint_status", s))
            .transpose()?,
        critical: r.get("critical"),
        quiet_hours: r
            .get::<Option<serde_json::Value>, _>("quiet_hours_json")
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default(),
        due: due_state(r),
        escalation_answered: r.get("escalation_answered"),
        cause: parse(r, "cause")?,
        state_version: r.get("state_version"),
    })
}

/// The due-time facts of one claimed row.
fn due_state(r: &sqlx::postgres::PgRow) -> DueState {
    use chrono::{DateTime, Utc};
    use notify_core::due::{Preferences, Setting};
    let setting = |on: &str, at: &str| {
        let on: Option<bool> = r.get(on);
        let at: Option<DateTime<Utc>> = r.get(at);
        on.zip(at).map(|(on, at)| Setting { on, at })
    };
    DueState {
        preferences: Preferences {
            type_channel: setting("pref_tc_on", "pref_tc_at"),
            type_wide: setting("pref_tw_on", "pref_tw_at"),
            channel_wide: setting("pref_cw_on", "pref_cw_at"),
        },
        line_unfollowed_at: r.get("line_unfollowed_at"),
        endpoint_revoked_at: r.get("endpoint_revoked_at"),
        endpoint_revoked_reason: r.get("endpoint_revoked_reason"),
        email_undeliverable_at: r.get("email_undeliverable_at"),
        topic_unsubscribed: r.get("topic_unsubscribed"),
        email_suppressed_at: r.get("email_suppressed_at"),
    }
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
    let mut tx = db.begin().await?;
    let rows: Vec<(Uuid, String, i32, String)> = sqlx::query_as(
        "UPDATE notification_deliveries d
         SET status = $3, lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
             state_version = d.state_version + 1,
             last_error = format('%s; gave up after %s attempts (attempt budget spent)',
                                 coalesce(d.last_error, 'attempt_budget_spent'), d.attempts)
         WHERE d.id = ANY($1) AND d.channel || '' = $2 AND d.status || '' = 'pending'
           AND d.next_attempt_at <= now() AND d.attempts >= d.max_attempts
         RETURNING d.id, d.provider, d.attempts, d.last_error",
    )
    .bind(ids)
    .bind(channel.as_str())
    .bind(DeliveryStatus::Failed.as_str())
    .fetch_all(&mut *tx)
    .await?;
    let failed: Vec<(Uuid, crate::webhooks::EventType)> = rows
        .iter()
        .map(|r| (r.0, crate::webhooks::EventType::DeliveryFailed))
        .collect();
    crate::webhooks::enqueue_for_deliveries(&mut tx, &failed).await?;
    let mut out = std::collections::HashMap::with_capacity(rows.len());
    for (id, provider, attempts, error) in rows {
        let fallback =
            crate::derived::fallback_after_made(&mut tx, id, FailReason::AttemptsSpent.as_str())
                .await?;
        out.insert(
            id,
            ClaimOutcome::Exhausted {
                provider: parse_text("provider", &provider)?,
                attempts,
                error,
                fallback,
            },
        );
    }
    tx.commit().await?;
    Ok(out)
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
