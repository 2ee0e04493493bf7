//! Cancellation (`CancelEvent` and the console's cancel): one path for both.
//!
//! [`cancel`] locks the targeted events `FOR UPDATE` in id order, marks them canceled
//! (`canceled_at`/`canceled_by`, or `event_cancellations` rows for some recipients only),
//! turns their `pending` deliveries `canceled` and deletes their outbox rows, all in one
//! transaction (a row naming several deliveries, of one event or of several written in one
//! group commit, goes when this cancel takes them all; else its message is published and
//! the worker's claim skips the canceled ones). Every writer that adds deliveries to an existing event (a fan-out page,
//! a derived delivery) takes the event row `FOR SHARE` first ([`is_canceled`],
//! `events::lock_for_page`) and honours the cancel, so no delivery of a canceled event or
//! recipient appears after the cancel commits. A trigger
//! (`deliveries_stay_canceled`, migration 22) keeps every later update from putting one of
//! their deliveries back to `pending`. Deliveries already `sending` finish: the cancel
//! waits for them (bounded) before it counts.

use crate::{Result, StoreError};
use notify_core::DeliveryStatus;
use sqlx::{PgConnection, PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

/// How long [`cancel`] waits for deliveries in a provider call to be recorded.
pub const IN_FLIGHT_WAIT: Duration = Duration::from_secs(15);
/// How often it looks while it waits.
pub const IN_FLIGHT_POLL: Duration = Duration::from_millis(75);

/// Which events a cancel targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelSelector {
    /// One event by id.
    Id(Uuid),
    /// One event by its (already NFC-normalised) key, found as `GetEvent` finds it: the
    /// caller's own event first, the newest dedup bucket's.
    EventKey(String),
    /// Every event carrying this cancellation key.
    CancellationKey(String),
}

/// What a cancel found, counted once it committed and every delivery in flight was
/// recorded (or [`IN_FLIGHT_WAIT`] passed). Counts are of deliveries (a recipient has
/// one per channel, per device for push), restricted to the named recipients when some
/// were named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CancelOutcome {
    /// The targeted events, in id order.
    pub event_ids: Vec<Uuid>,
    /// Deliveries `canceled` (by this cancel or an earlier one).
    pub canceled: u64,
    /// Of those, canceled by this call (0 on a repeat).
    pub newly_canceled: u64,
    /// Deliveries `sent`.
    pub sent: u64,
    /// Deliveries `failed`.
    pub failed: u64,
    /// Deliveries `skipped` at their due time.
    pub skipped: u64,
    /// Deliveries still `sending` when the wait ended.
    pub in_flight: u64,
    /// Topic events: subscribers that never got a delivery because of the cancel (whole
    /// event: those after the fan-out's checkpoint when it stopped; some recipients: the
    /// named subscribers with no delivery and no planning skip).
    pub not_created: u64,
}

impl CancelOutcome {
    /// Adds `n` deliveries in `status` to their count; a delivery still in a provider
    /// call, a pending one left (none should be, it would be sent by no one but is not
    /// canceled either) and an unreadable status count as in flight.
    fn count(&mut self, status: Option<DeliveryStatus>, n: u64) {
        match status {
            Some(DeliveryStatus::Canceled) => self.canceled += n,
            Some(DeliveryStatus::Sent) => self.sent += n,
            Some(DeliveryStatus::Failed) => self.failed += n,
            Some(DeliveryStatus::Skipped) => self.skipped += n,
            Some(DeliveryStatus::Pending | DeliveryStatus::Sending) | None => self.in_flight += n,
        }
    }
}

/// Cancels what `selector` finds among `caller`'s events (every caller's when
/// `may_manage`), for `recipients` only when not empty, recording `caller` as who
/// canceled. Idempotent. `NotFound` for an unknown event id or key (or one of another
/// caller's that `caller` may not manage); an unknown cancellation key finds no events.
pub async fn cancel(
    db: &PgPool,
    selector: &CancelSelector,
    recipients: &[String],
    caller: &str,
    may_manage: bool,
) -> Result<CancelOutcome> {
    let mut tx = db.begin().await?;
    let ids = lock_targets(&mut tx, selector, caller, may_manage).await?;
    if ids.is_empty() {
        return match selector {
            CancelSelector::CancellationKey(_) => Ok(CancelOutcome::default()),
            CancelSelector::Id(id) => Err(StoreError::NotFound(format!("event {id}"))),
            CancelSelector::EventKey(k) => Err(StoreError::NotFound(format!("event {k:?}"))),
        };
    }
    if recipients.is_empty() {
        sqlx::query(
            "UPDATE notification_events
             SET canceled_at = coalesce(canceled_at, now()), canceled_by = coalesce(canceled_by, $2),
                 fanout_status = CASE WHEN fanout_status = 'pending' THEN 'canceled' ELSE fanout_status END
             WHERE id = ANY($1)",
        )
        .bind(&ids)
        .bind(caller)
        .execute(&mut *tx)
        .await?;
    } else {
        sqlx::query(
            "INSERT INTO event_cancellations (event_id, user_id, canceled_by)
             SELECT e, u, $3 FROM UNNEST($1::uuid[]) e, UNNEST($2::text[]) u
             ON CONFLICT (event_id, user_id) DO NOTHING",
        )
        .bind(&ids)
        .bind(recipients)
        .bind(caller)
        .execute(&mut *tx)
        .await?;
    }
    let mut newly = cancel_pending(&mut tx, &ids, recipients, caller).await?;
    tx.commit().await?;

    // Deliveries in a provider call finish; wait until they are recorded. A retry
    // recorded while the cancel committed may have put one back to pending before the
    // trigger could see the cancel: cancel those again on every look.
    let deadline = tokio::time::Instant::now() + IN_FLIGHT_WAIT;
    loop {
        let mut tx = db.begin().await?;
        newly += cancel_pending(&mut tx, &ids, recipients, caller).await?;
        tx.commit().await?;
        let mut conn = db.acquire().await?;
        let sending: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM notification_deliveries
             WHERE event_id = ANY($1) AND status = 'sending'
               AND (cardinality($2::text[]) = 0 OR user_id = ANY($2))",
        )
        .bind(&ids)
        .bind(recipients)
        .fetch_one(&mut *conn)
        .await?;
        drop(conn);
        if sending == 0 || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(IN_FLIGHT_POLL).await;
    }
    // The counts on one snapshot, so they add up to the deliveries that exist.
    let mut snap = crate::snapshot(db).await?;
    let mut out = counts(&mut snap, &ids, recipients).await?;
    snap.commit().await?;
    out.newly_canceled = newly;
    out.event_ids = ids;
    Ok(out)
}

/// Finds the targets and locks them `FOR UPDATE` in id order (so concurrent cancels of
/// overlapping sets cannot deadlock).
async fn lock_targets(
    tx: &mut sqlx::PgConnection,
    selector: &CancelSelector,
    caller: &str,
    may_manage: bool,
) -> Result<Vec<Uuid>> {
    let q = match selector {
        CancelSelector::Id(id) => sqlx::query_scalar(
            "SELECT id FROM notification_events WHERE id = $1 AND (caller = $2 OR $3) FOR UPDATE",
        )
        .bind(*id),
        // The same lookup as `events::get_event` by key.
        CancelSelector::EventKey(key) => sqlx::query_scalar(
            "SELECT id FROM notification_events
             WHERE (event_key = $1 OR caller_key = $1) AND (caller = $2 OR $3)
             ORDER BY (caller = $2) DESC, created_at DESC LIMIT 1 FOR UPDATE",
        )
        .bind(key),
        CancelSelector::CancellationKey(key) => sqlx::query_scalar(
            "SELECT id FROM notification_events
             WHERE cancellation_key = $1 AND (caller = $2 OR $3) ORDER BY id FOR UPDATE",
        )
        .bind(key),
    };
    Ok(q.bind(caller).bind(may_manage).fetch_all(&mut *tx).await?)
}

/// The CTE that deletes the outbox rows of the deliveries a cancel statement's `c` (ids)
/// turned `canceled`: a row naming one delivery goes with it, a row naming several (of one
/// event, or of several written in one group commit) when `c` takes every one of them;
/// otherwise the row is published and the worker's claim skips the canceled ones. Shared
/// by [`cancel_pending`] and [`cancel_for_erasure`].
const OUTBOX_ROWS_CANCELED: &str = "gone AS (DELETE FROM outbox o USING c
                   WHERE o.delivery_id = c.id
                     AND (o.more_delivery_ids IS NULL
                          OR NOT EXISTS (SELECT 1 FROM unnest(o.more_delivery_ids) AS m(id)
                                         WHERE NOT m.id IN (SELECT id FROM c))))";

/// The statement of [`cancel_pending`]: `$1` the events, `$2` the named recipients (empty:
/// all), `$3` who cancels; returns the ids it canceled. Its outbox delete reaches the rows
/// through `outbox_delivery` (migration 39), one probe per canceled delivery.
fn cancel_pending_sql() -> String {
    format!(
        "WITH c AS (
             UPDATE notification_deliveries
             SET status = 'canceled', last_error = 'canceled by ' || $3, lease_token = NULL,
                 lease_expires_at = NULL, updated_at = now(), state_version = state_version + 1
             WHERE event_id = ANY($1) AND status = 'pending'
               AND (cardinality($2::text[]) = 0 OR user_id = ANY($2)
                    OR (provider = 'line_multicast' AND coalesce(address, '') = ''))
             RETURNING id),
         {OUTBOX_ROWS_CANCELED}
         SELECT id FROM c"
    )
}

/// The plan Postgres chooses now for the statement a cancel of `ids` (for `recipients`
/// only, when not empty) runs to cancel their pending deliveries and delete their outbox
/// rows, as `EXPLAIN (FORMAT JSON)` returns it (the statement is planned with these
/// values, not executed). For tests and for an operator checking that the cancel reaches
/// the outbox by its index and never scans it once per delivery.
pub async fn explain_cancel(
    db: &PgPool,
    ids: &[Uuid],
    recipients: &[String],
) -> Result<serde_json::Value> {
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) {}",
        cancel_pending_sql()
    )))
    .bind(ids)
    .bind(recipients)
    .bind("explain")
    .fetch_one(db)
    .await?;
    Ok(plan)
}

/// `pending -> canceled` for the events' deliveries (the named recipients' only, when
/// some are named); their outbox rows go too (a row naming several deliveries goes when
/// this cancel takes them all; else it is published and the worker's claim skips the
/// canceled ones). A named recipient inside a pending LINE
/// multicast batch is taken out of the batch's `address` and gets a LINE delivery of
/// their own, `canceled` (key `<event>/<user>/line`), so the batch is not sent to them
/// and the counts name them; a batch left with nobody is canceled. Their
/// `delivery.cancelled` webhook messages are written. Call it in a transaction. Returns
/// how many.
async fn cancel_pending(
    db: &mut sqlx::PgConnection,
    ids: &[Uuid],
    recipients: &[String],
    caller: &str,
) -> Result<u64> {
    let mut taken_out: Vec<Uuid> = Vec::new();
    if !recipients.is_empty() {
        taken_out = sqlx::query_scalar::<_, Uuid>(
            "WITH named AS (
                 SELECT user_id, line_user_id FROM recipients
                 WHERE user_id = ANY($2) AND line_user_id IS NOT NULL),
             old AS (
                 SELECT d.id, d.event_id, n.user_id, n.line_user_id
                 FROM notification_deliveries d
                 JOIN named n ON n.line_user_id = ANY(string_to_array(d.address, ','))
                 WHERE d.event_id = ANY($1) AND d.provider = 'line_multicast' AND d.status = 'pending'),
             b AS (
                 UPDATE notification_deliveries d
                 SET address = array_to_string(ARRAY(
                         SELECT x FROM unnest(string_to_array(d.address, ',')) x
                         WHERE x NOT IN (SELECT o.line_user_id FROM old o WHERE o.id = d.id)), ','),
                     decision = d.decision || E'\n' || 'cancel: recipients taken out of the batch by ' || $3,
                     updated_at = now()
                 WHERE d.id IN (SELECT id FROM old)),
             own AS (
                 INSERT INTO notification_deliveries
                     (id, event_id, user_id, channel, provider, address, status, idempotency_key,
                      last_error, decision)
                 SELECT gen_random_uuid(), o.event_id, o.user_id, 'line', 'line', o.line_user_id,
                        'canceled', o.event_id || '/' || o.user_id || '/line', 'canceled by ' || $3,
                        'line multicast: taken out of batch ' || o.id || ' by a cancel'
                 FROM old o
                 ON CONFLICT (channel, idempotency_key) DO NOTHING
                 RETURNING id)
             SELECT id FROM own",
        )
        .bind(ids)
        .bind(recipients)
        .bind(caller)
        .fetch_all(&mut *db)
        .await?;
    }
    let canceled: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(cancel_pending_sql()))
        .bind(ids)
        .bind(recipients)
        .bind(caller)
        .fetch_all(&mut *db)
        .await?;
    let typed: Vec<(Uuid, crate::webhooks::EventType)> = canceled
        .iter()
        .chain(&taken_out)
        .map(|id| (*id, crate::webhooks::EventType::DeliveryCancelled))
        .collect();
    crate::webhooks::enqueue_for_deliveries(db, &typed).await?;
    Ok((canceled.len() + taken_out.len()) as u64)
}

/// What [`cancel_for_erasure`] does with the user's deliveries in a provider call
/// (`sending`): their lease holder may have reached the provider already, so the user may
/// have the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InFlight {
    /// Left to the lease holder, whose record is then the truth (`sent`, `failed`, or a
    /// retry that ends `canceled`): an `event_cancellations` row (`canceled_by`
    /// "erasure") is written for each of their events, so the `deliveries_stay_canceled`
    /// trigger ends a retry, or the sweeper's requeue of a lost lease, `canceled`, and no
    /// fallback is derived from a failure (`derived` honours the cancel).
    Finish,
    /// Canceled too, their lease taken (the holder's record then writes nothing), with
    /// [`CANCELED_IN_FLIGHT`] as the error: for those still in a call when the erasure's
    /// wait for them ended.
    Cancel,
}

/// `last_error` of a delivery the erasure canceled while its provider call was in
/// progress: whether the provider accepted it is not known.
pub const CANCELED_IN_FLIGHT: &str =
    "canceled by erasure during a provider call: it may have reached the provider";

/// The cancel of an erasure (`erasure::erase_recipient`): every delivery of `user_id`
/// still `pending` becomes `canceled` ("canceled by erasure"), its own outbox rows go, and
/// its `delivery.cancelled` webhook messages are written, as [`cancel`] does; those in a
/// provider call (`sending`) are treated as `in_flight` says. A pending LINE multicast
/// batch naming `line_user_id` loses that id (and is canceled when nobody is left). Call
/// it in the erasure's transaction. Returns how many deliveries it canceled and, of
/// those, how many were in a provider call.
pub(crate) async fn cancel_for_erasure(
    db: &mut sqlx::PgConnection,
    user_id: &str,
    line_user_id: Option<&str>,
    in_flight: InFlight,
) -> Result<(u64, u64)> {
    let emptied: Vec<Uuid> = match line_user_id {
        Some(line) => {
            sqlx::query_scalar::<_, Option<Uuid>>(
                "UPDATE notification_deliveries d
                 SET address = array_to_string(array_remove(string_to_array(d.address, ','), $1), ','),
                     decision = d.decision || E'\n' || 'erasure: a recipient taken out of the batch',
                     updated_at = now()
                 WHERE d.status = 'pending' AND d.provider = 'line_multicast'
                   AND $1 = ANY(string_to_array(d.address, ','))
                 RETURNING CASE WHEN coalesce(d.address, '') = '' THEN d.id END",
            )
            .bind(line)
            .fetch_all(&mut *db)
            .await?
            .into_iter()
            .flatten()
            .collect()
        }
        None => Vec::new(),
    };
    let canceled: Vec<(Uuid, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "WITH c AS (
             UPDATE notification_deliveries
             SET status = 'canceled',
                 last_error = CASE WHEN status = 'sending' THEN $4 ELSE 'canceled by erasure' END,
                 lease_token = NULL, lease_expires_at = NULL, updated_at = now(),
                 state_version = state_version + 1
             WHERE (user_id = $1 AND (status = 'pending' OR ($3 AND status = 'sending')))
                OR (id = ANY($2) AND status = 'pending')
             -- the new error names a provider call exactly when the old status was sending
             RETURNING id, last_error = $4 AS in_flight),
         {OUTBOX_ROWS_CANCELED}
         SELECT id, in_flight FROM c",
    )))
    .bind(user_id)
    .bind(&emptied)
    .bind(in_flight == InFlight::Cancel)
    .bind(CANCELED_IN_FLIGHT)
    .fetch_all(&mut *db)
    .await?;
    if in_flight == InFlight::Finish {
        sqlx::query(
            "INSERT INTO event_cancellations (event_id, user_id, canceled_by)
             SELECT DISTINCT event_id, $1, 'erasure' FROM notification_deliveries
             WHERE user_id = $1 AND status = 'sending'
             ON CONFLICT (event_id, user_id) DO NOTHING",
        )
        .bind(user_id)
        .execute(&mut *db)
        .await?;
    }
    let typed: Vec<(Uuid, crate::webhooks::EventType)> = canceled
        .iter()
        .map(|(id, _)| (*id, crate::webhooks::EventType::DeliveryCancelled))
        .collect();
    crate::webhooks::enqueue_for_deliveries(db, &typed).await?;
    let during_call = canceled.iter().filter(|(_, f)| *f).count() as u64;
    Ok((canceled.len() as u64, during_call))
}

/// The deliveries of `ids` (of `recipients` only, when not empty) counted by state, and
/// the topic subscribers never planned because of a cancel, as [`cancel`] answers them
/// (`event_ids` and `newly_canceled` left empty). For pages that show a canceled event.
pub async fn counts(
    db: &mut PgConnection,
    ids: &[Uuid],
    recipients: &[String],
) -> Result<CancelOutcome> {
    let rows = sqlx::query(
        "SELECT status, count(*) AS n FROM notification_deliveries
         WHERE event_id = ANY($1) AND (cardinality($2::text[]) = 0 OR user_id = ANY($2))
         GROUP BY status",
    )
    .bind(ids)
    .bind(recipients)
    .fetch_all(&mut *db)
    .await?;
    let mut out = CancelOutcome::default();
    for r in &rows {
        let n = r.get::<i64, _>("n") as u64;
        out.count(r.get::<&str, _>("status").parse().ok(), n);
    }
    if !recipients.is_empty() {
        // Named recipients inside a LINE multicast batch that went (or is going) out
        // before the cancel: counted by the batch's state.
        let in_batches = sqlx::query(
            "SELECT d.status, count(*) AS n FROM notification_deliveries d
             JOIN recipients r ON r.user_id = ANY($2)
                              AND r.line_user_id = ANY(string_to_array(d.address, ','))
             WHERE d.event_id = ANY($1) AND d.provider = 'line_multicast'
             GROUP BY d.status",
        )
        .bind(ids)
        .bind(recipients)
        .fetch_all(&mut *db)
        .await?;
        for r in &in_batches {
            let n = r.get::<i64, _>("n") as u64;
            out.count(r.get::<&str, _>("status").parse().ok(), n);
        }
    }
    let not_created: i64 = if recipients.is_empty() {
        sqlx::query_scalar(
            "SELECT count(*) FROM notification_events e
             JOIN topic_subscriptions s ON s.topic = e.topic AND s.user_id > e.fanout_cursor
             WHERE e.id = ANY($1) AND e.fanout_status = 'canceled'",
        )
        .bind(ids)
        .fetch_one(&mut *db)
        .await?
    } else {
        sqlx::query_scalar(
            "SELECT count(*) FROM notification_events e
             JOIN topic_subscriptions s ON s.topic = e.topic AND s.user_id = ANY($2)
             WHERE e.id = ANY($1)
               AND NOT EXISTS (SELECT 1 FROM notification_deliveries d
                               WHERE d.event_id = e.id AND d.user_id = s.user_id)
               AND NOT EXISTS (SELECT 1 FROM delivery_skips k
                               WHERE k.event_id = e.id AND k.user_id = s.user_id)
               AND NOT EXISTS (SELECT 1 FROM notification_deliveries d
                               JOIN recipients r ON r.user_id = s.user_id
                               WHERE d.event_id = e.id AND d.provider = 'line_multicast'
                                 AND r.line_user_id = ANY(string_to_array(d.address, ',')))",
        )
        .bind(ids)
        .bind(recipients)
        .fetch_one(&mut *db)
        .await?
    };
    out.not_created = not_created as u64;
    Ok(out)
}

/// Whether `event_id` is canceled for `user_id` (the whole event, or that recipient).
/// Takes the event row `FOR SHARE` until the caller's transaction ends, so a cancel
/// cannot commit between this answer and the caller's insert: call it first in the
/// transaction that adds a delivery to an existing event. `NotFound` for an unknown event.
pub async fn is_canceled(
    conn: &mut sqlx::PgConnection,
    event_id: Uuid,
    user_id: &str,
) -> Result<bool> {
    let canceled: Option<bool> = sqlx::query_scalar(
        "SELECT e.canceled_at IS NOT NULL
                OR EXISTS (SELECT 1 FROM event_cancellations c
                           WHERE c.event_id = e.id AND c.user_id = $2)
         FROM notification_events e WHERE e.id = $1 FOR SHARE OF e",
    )
    .bind(event_id)
    .bind(user_id)
    .fetch_optional(&mut *conn)
    .await?;
    canceled.ok_or_else(|| StoreError::NotFound(format!("event {event_id}")))
}
