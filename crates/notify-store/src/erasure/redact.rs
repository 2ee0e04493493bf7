//! The redaction of each table that can hold the person's data, as the steps of
//! [`super::erase_recipient`] call it: the user's final deliveries and what hangs off them,
//! their events, the other recipients' rows, LINE multicast batches, the console audit.

use super::rewrite::{Kind, rewrite, rewrite_attempts};
use super::{BATCH, ERASED, EVENTS_PER_PASS, ErasureOutcome};
use crate::Result;
use notify_core::spellings::Spellings;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Redacts up to [`BATCH`] of the user's final deliveries (sent, failed, canceled,
/// skipped), with their attempts, webhook messages, clicks, inbox rows and events.
/// Returns how many deliveries it took and their events (for [`redact_others`]).
pub(super) async fn redact_batch(
    tx: &mut PgConnection,
    user_id: &str,
    spelt: &Spellings,
    out: &mut ErasureOutcome,
) -> Result<(u64, Vec<Uuid>)> {
    let ids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT id FROM notification_deliveries
         WHERE user_id = $1 AND status IN ('sent', 'failed', 'canceled', 'skipped')
         ORDER BY id LIMIT $2 FOR UPDATE",
    )
    .bind(user_id)
    .bind(BATCH)
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        return Ok((0, Vec::new()));
    }
    out.attempts_redacted += sqlx::query(
        "UPDATE delivery_attempts
         SET content_json = CASE WHEN content_json IS NULL THEN NULL
                 ELSE jsonb_build_object('erased', true)
                      || jsonb_strip_nulls(jsonb_build_object('provider', content_json->'provider')) END,
             provider_response = CASE WHEN provider_response IS NULL THEN NULL ELSE $2 END
         WHERE delivery_id = ANY($1)",
    )
    .bind(&ids)
    .bind(ERASED)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    rewrite(
        tx,
        spelt,
        ("webhook_attempts", "id", "bigint"),
        &[("response_excerpt", Kind::Text), ("error", Kind::Text)],
        "message_id IN (SELECT id FROM webhook_messages WHERE delivery_id = ANY($1))",
        &ids,
    )
    .await?;
    rewrite(
        tx,
        spelt,
        ("webhook_messages", "id", "uuid"),
        &[("payload", Kind::Json)],
        "delivery_id = ANY($1)",
        &ids,
    )
    .await?;
    sqlx::query(
        "UPDATE webhook_messages SET payload = jsonb_set(payload, '{data,user_id}', to_jsonb($2::text))
         WHERE delivery_id = ANY($1)",
    )
    .bind(&ids)
    .bind(ERASED)
    .execute(&mut *tx)
    .await?;
    sqlx::query("DELETE FROM delivery_clicks WHERE delivery_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    out.inbox_deleted += sqlx::query("DELETE FROM notifications WHERE delivery_id = ANY($1)")
        .bind(&ids)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let events: Vec<Uuid> = sqlx::query_scalar(
        "SELECT DISTINCT event_id FROM notification_deliveries WHERE id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    redact_events(tx, user_id, spelt, &events).await?;
    rewrite(
        tx,
        spelt,
        ("notification_deliveries", "id", "uuid"),
        &[("last_error", Kind::Text), ("decision", Kind::Text)],
        "id = ANY($1)",
        &ids,
    )
    .await?;
    let n = sqlx::query(
        "UPDATE notification_deliveries
         SET user_id = $2, address = NULL, endpoint_id = NULL, idempotency_key = 'erased/' || id,
             digest_key = NULL, updated_at = now()
         WHERE id = ANY($1)",
    )
    .bind(&ids)
    .bind(ERASED)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    out.deliveries_redacted += n;
    Ok((ids.len() as u64, events))
}

/// Deletes the user's skip rows and rewrites their events ([`redact_events`]): the
/// events that planned nothing but skips for the user, those planned after step 2
/// included. Returns the events.
pub(super) async fn redact_skipped_events(
    tx: &mut PgConnection,
    user_id: &str,
    spelt: &Spellings,
) -> Result<Vec<Uuid>> {
    let events: Vec<Uuid> = sqlx::query_scalar(
        "WITH s AS (DELETE FROM delivery_skips WHERE user_id = $1 RETURNING event_id)
         SELECT DISTINCT event_id FROM s",
    )
    .bind(user_id)
    .fetch_all(&mut *tx)
    .await?;
    redact_events(tx, user_id, spelt, &events).await?;
    Ok(events)
}

/// Rewrites the events `ids`: the user id in `recipients` and `actor_id` becomes
/// [`ERASED`]; the payload of an event sent to this user alone is replaced by
/// `{"erased": true}`; other payloads and every content keep their shape with the needles
/// replaced. Event keys and cancellation keys are the caller's and stay (dedup holds).
async fn redact_events(
    tx: &mut PgConnection,
    user_id: &str,
    spelt: &Spellings,
    ids: &[Uuid],
) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE notification_events
         SET recipients = array_replace(recipients, $2, $3),
             actor_id = CASE WHEN actor_id = $2 THEN $3 ELSE actor_id END,
             payload_json = CASE WHEN recipients = ARRAY[$2]::text[] THEN '{\"erased\": true}'::jsonb
                                 ELSE payload_json END
         WHERE id = ANY($1)",
    )
    .bind(ids)
    .bind(user_id)
    .bind(ERASED)
    .execute(&mut *tx)
    .await?;
    rewrite(
        tx,
        spelt,
        ("notification_events", "id", "uuid"),
        &[("payload_json", Kind::Json), ("content_json", Kind::Json)],
        "id = ANY($1)",
        ids,
    )
    .await?;
    Ok(())
}

/// The other recipients of `events` that have listed recipients (at most a key's
/// recipient limit each) got what the payload said: their inbox rows and attempts lose
/// the needles too, [`BATCH`] deliveries per transaction. Topic broadcasts are left out
/// (one text for every subscriber, not the user's).
pub(super) async fn redact_others(db: &PgPool, spelt: &Spellings, events: &[Uuid]) -> Result<()> {
    if spelt.is_empty() || events.is_empty() {
        return Ok(());
    }
    let mut events = events.to_vec();
    events.sort_unstable();
    events.dedup();
    for pass in events.chunks(EVENTS_PER_PASS) {
        let deliveries: Vec<Uuid> = sqlx::query_scalar(
            "SELECT d.id FROM notification_deliveries d
             JOIN notification_events e ON e.id = d.event_id AND e.topic IS NULL
             WHERE d.event_id = ANY($1) AND d.user_id <> $2",
        )
        .bind(pass)
        .bind(ERASED)
        .fetch_all(db)
        .await?;
        for batch in deliveries.chunks(BATCH as usize) {
            let mut tx = db.begin().await?;
            rewrite(
                &mut tx,
                spelt,
                ("notifications", "id", "uuid"),
                &[
                    ("title", Kind::Text),
                    ("body", Kind::Text),
                    ("url", Kind::Text),
                    ("image_url", Kind::Text),
                    ("data_json", Kind::Json),
                    ("actions", Kind::Json),
                ],
                "delivery_id = ANY($1)",
                batch,
            )
            .await?;
            rewrite_attempts(&mut tx, spelt, batch).await?;
            tx.commit().await?;
        }
    }
    Ok(())
}

/// Staff actions' texts (`console_audit` target and detail) with the needles and the
/// user id replaced, read [`BATCH`] rows at a time in id order, each page its own
/// transaction.
pub(super) async fn redact_console_audit(db: &PgPool, spelt: &Spellings) -> Result<()> {
    let mut after = 0_i64;
    loop {
        let page: Vec<(i64, String, String)> = sqlx::query_as(
            "SELECT id, target, detail FROM console_audit WHERE id > $1 ORDER BY id LIMIT $2",
        )
        .bind(after)
        .bind(BATCH)
        .fetch_all(db)
        .await?;
        let Some(last) = page.last() else {
            return Ok(());
        };
        after = last.0;
        let changed: Vec<(i64, String, String)> = page
            .iter()
            .filter_map(|(id, target, detail)| {
                let (t, d) = (spelt.redact_text(target), spelt.redact_text(detail));
                (t.is_some() || d.is_some()).then(|| {
                    (
                        *id,
                        t.unwrap_or_else(|| target.clone()),
                        d.unwrap_or_else(|| detail.clone()),
                    )
                })
            })
            .collect();
        if !changed.is_empty() {
            let (ids, (targets, details)): (Vec<i64>, (Vec<String>, Vec<String>)) =
                changed.into_iter().map(|(i, t, d)| (i, (t, d))).unzip();
            sqlx::query(
                "UPDATE console_audit a SET target = t.target, detail = t.detail
                 FROM UNNEST($1::bigint[], $2::text[], $3::text[]) AS t(id, target, detail)
                 WHERE a.id = t.id",
            )
            .bind(&ids)
            .bind(&targets)
            .bind(&details)
            .execute(db)
            .await?;
        }
        if page.len() < BATCH as usize {
            return Ok(());
        }
    }
}

/// LINE multicast batches naming the user's LINE id (any state): the id taken out of the
/// batch's address, the user out of its `line-multicast:<first user>+n` name, the needles
/// out of its attempts. Found by a scan of the multicast deliveries (erasure is rare; no
/// index is kept for it on the write path).
pub(super) async fn redact_multicast(
    db: &PgPool,
    user_id: &str,
    line: &str,
    spelt: &Spellings,
) -> Result<()> {
    let mut tx = db.begin().await?;
    let batches: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE notification_deliveries
         SET address = array_to_string(array_remove(string_to_array(address, ','), $2), ','),
             user_id = replace(user_id, 'line-multicast:' || $1 || '+', 'line-multicast:' || $3 || '+'),
             updated_at = now()
         WHERE provider = 'line_multicast' AND $2 = ANY(string_to_array(address, ','))
         RETURNING id",
    )
    .bind(user_id)
    .bind(line)
    .bind(ERASED)
    .fetch_all(&mut *tx)
    .await?;
    for batch in batches.chunks(BATCH as usize) {
        rewrite_attempts(&mut tx, spelt, batch).await?;
    }
    tx.commit().await?;
    Ok(())
}
