//! The batch loop: each writer task takes the requests waiting, checks them against the
//! catalogue, plans and writes them in one transaction, and isolates failures (a failed
//! batch is written again one event a transaction; a caller gone before the commit is
//! left out and the batch written again without it).

use super::digests::attach_digests;
use super::{Job, WriterConfig, Written};
use crate::error::ApiError;
use crate::planning::{EventPlan, Grouping, count_derived, due_times, insert_planned};
use futures_util::StreamExt;
use notify_core::plan::effective_channels;
use notify_core::{Channel, NewEvent, SkippedDelivery};
use notify_store::events::{self, EventInsert, NewDelivery};
use notify_store::{PgPool, StoreError, catalog, topics};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc};
use tracing::{debug, warn};
use uuid::Uuid;

/// Events of a failed batch written again at once, each in a transaction of its own.
pub(super) const ALONE_AT_ONCE: usize = 4;

pub(super) async fn writer_loop(
    pool: PgPool,
    cfg: WriterConfig,
    rx: Arc<Mutex<mpsc::Receiver<Job>>>,
) {
    let mut carry: Vec<Job> = Vec::new();
    loop {
        let mut jobs = std::mem::take(&mut carry);
        // An idle writer waits for work holding the receiver; one with carried-over work
        // only tops its batch up when the receiver is free.
        let receiver = if jobs.is_empty() {
            let mut rx = rx.lock().await;
            match rx.recv().await {
                Some(j) => jobs.push(j),
                None => return,
            }
            Some(rx)
        } else {
            rx.try_lock().ok()
        };
        if let Some(mut rx) = receiver {
            while jobs.len() < cfg.max_batch {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
        }
        // (key, caller) pairs must be distinct within a batch; a repeat waits for the next
        // one, where it finds the first as existing.
        let mut seen = HashSet::new();
        let (batch, repeats): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| {
            seen.insert((
                j.event.event_key.clone(),
                events::caller_of(&j.event).to_string(),
            ))
        });
        carry = repeats;
        write_batch(&pool, &cfg, batch).await;
    }
}

/// Sorts by key, then caller: the unique index's order, so concurrent batches lock it in
/// one order.
fn sort_for_the_index<T>(items: &mut [T], event: impl Fn(&T) -> &NewEvent) {
    items.sort_by(|a, b| {
        let (a, b) = (event(a), event(b));
        (a.event_key.as_str(), events::caller_of(a))
            .cmp(&(b.event_key.as_str(), events::caller_of(b)))
    });
}

/// A job that passed the catalogue checks.
pub(super) struct Ready {
    job: Job,
    pub(super) id: Uuid,
    channels: Vec<Channel>,
    critical: bool,
    over_cap: notify_core::fatigue::OverCap,
    digest_window_s: i32,
    dedup_window_s: i64,
    /// A scheduled event's due time, fixed once per batch by [`due_times`].
    pub(super) send_at: Option<chrono::DateTime<chrono::Utc>>,
    derivation: notify_core::plan::Derivation,
}

impl Ready {
    /// What planning this event needs besides its recipients.
    fn plan(&self, max_attempts: i32) -> EventPlan<'_> {
        let event = &self.job.event;
        EventPlan {
            event_id: self.id,
            channels: &self.channels,
            critical: self.critical,
            over_cap: self.over_cap,
            derivation: &self.derivation,
            send_at: self.send_at,
            grouping: match &event.aggregate_key {
                Some(group) if self.digest_window_s > 0 => Grouping::Digest {
                    type_key: &event.type_key,
                    group,
                    window_s: i64::from(self.digest_window_s),
                },
                _ => Grouping::Alone,
            },
            max_attempts,
        }
    }
}

async fn write_batch(pool: &PgPool, cfg: &WriterConfig, jobs: Vec<Job>) {
    let jobs: Vec<Job> = jobs.into_iter().filter(|j| !j.reply.is_closed()).collect();
    if jobs.is_empty() {
        return;
    }
    let size = jobs.len();
    // One connection for the batch: the catalogue, the clock and the transaction.
    let mut conn = match pool.acquire().await {
        Ok(conn) => conn,
        Err(e) => {
            let e = StoreError::from(e);
            warn!(error = %e, "no connection for a batch");
            for j in jobs {
                let _ = j.reply.send(Err(same_error(&e)));
            }
            return;
        }
    };
    let ready = match check_catalogue(&mut conn, jobs).await {
        Ok(ready) => ready,
        Err((jobs, e)) => {
            warn!(error = %e, "catalogue lookup failed");
            for j in jobs {
                let _ = j.reply.send(Err(same_error(&e)));
            }
            return;
        }
    };
    let schedules: Vec<_> = ready.iter().map(|r| r.job.event.schedule).collect();
    let mut ready: Vec<Ready> =
        match due_times(&mut conn, &cfg.clock, cfg.horizon, &schedules).await {
            Ok(dues) => (ready.into_iter().zip(dues))
                .filter_map(|(r, due)| match due {
                    Ok(t) => Some(Ready { send_at: t, ..r }),
                    Err(v) => {
                        let _ = r.job.reply.send(Err(ApiError::Invalid(vec![v])));
                        None
                    }
                })
                .collect(),
            Err(e) => {
                warn!(error = %e, "planning clock unreadable");
                for r in ready {
                    let _ = r.job.reply.send(Err(same_error(&e)));
                }
                return;
            }
        };
    if ready.is_empty() {
        return;
    }
    loop {
        let started = std::time::Instant::now();
        match try_write(&mut conn, cfg, &mut ready).await {
            Ok((results, committed)) if committed => {
                debug!(
                    events = ready.len(),
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "batch committed"
                );
                for (r, res) in ready.into_iter().zip(results) {
                    let _ = r.job.reply.send(Ok(res));
                }
                return;
            }
            Ok(_) => {
                // Some callers left before the commit: write the batch again without them.
                ready.retain(|r| !r.job.reply.is_closed());
                if ready.is_empty() {
                    return;
                }
            }
            Err(e) => {
                if ready.len() > 1 && matches!(&e, StoreError::Db(sqlx::Error::Database(_))) {
                    warn!(error = %e, events = ready.len(), "batch failed; writing its events one by one");
                    // A few at once: with one writer nothing else is written meanwhile.
                    drop(conn);
                    futures_util::stream::iter(ready)
                        .for_each_concurrent(ALONE_AT_ONCE, |r| write_alone(pool, cfg, r))
                        .await;
                } else {
                    if size > 1 {
                        warn!(error = %e, events = ready.len(), "batch failed");
                    }
                    for r in ready {
                        let _ = r.job.reply.send(Err(same_error(&e)));
                    }
                }
                return;
            }
        }
    }
}

async fn write_alone(pool: &PgPool, cfg: &WriterConfig, mut r: Ready) {
    loop {
        if r.job.reply.is_closed() {
            return;
        }
        let one = std::slice::from_mut(&mut r);
        let written = match pool.acquire().await {
            Ok(mut conn) => try_write(&mut conn, cfg, one).await,
            Err(e) => Err(e.into()),
        };
        match written {
            Ok((mut results, true)) => {
                let _ = r.job.reply.send(Ok(results.remove(0)));
                return;
            }
            Ok(_) => continue,
            Err(e) => {
                let _ = r.job.reply.send(Err(ApiError::Store(e)));
                return;
            }
        }
    }
}

/// A copy of a store error for each caller of a failed batch (the SQL text stays here).
fn same_error(e: &StoreError) -> ApiError {
    ApiError::Store(match e {
        StoreError::Db(sqlx::Error::PoolTimedOut) => StoreError::Db(sqlx::Error::PoolTimedOut),
        StoreError::Db(sqlx::Error::PoolClosed) => StoreError::Db(sqlx::Error::PoolClosed),
        other => StoreError::Db(sqlx::Error::Protocol(other.to_string())),
    })
}

/// Looks up the batch's types and topics (two queries) and answers, on their own, the
/// requests that name an unknown one or a channel their type does not allow.
async fn check_catalogue(
    conn: &mut notify_store::sqlx::PgConnection,
    jobs: Vec<Job>,
) -> Result<Vec<Ready>, (Vec<Job>, StoreError)> {
    let type_keys: Vec<&str> = {
        let mut k: Vec<&str> = jobs.iter().map(|j| j.event.type_key.as_str()).collect();
        k.sort_unstable();
        k.dedup();
        k
    };
    let topic_keys: Vec<&str> = jobs
        .iter()
        .filter_map(|j| j.event.topic.as_deref())
        .collect();
    let types = match catalog::get_types(&mut *conn, &type_keys).await {
        Ok(t) => t,
        Err(e) => return Err((jobs, e)),
    };
    let types: HashMap<String, catalog::NotificationType> =
        types.into_iter().map(|t| (t.key.clone(), t)).collect();
    let known_topics: HashSet<String> = if topic_keys.is_empty() {
        HashSet::new()
    } else {
        match topics::existing_topics(&mut *conn, &topic_keys).await {
            Ok(t) => t.into_iter().collect(),
            Err(e) => return Err((jobs, e)),
        }
    };
    let mut ready = Vec::with_capacity(jobs.len());
    for job in jobs {
        let Some(ty) = types.get(&job.event.type_key) else {
            let name = job.event.type_key.clone();
            let _ = job.reply.send(Err(ApiError::NotFound {
                kind: "notification type",
                name,
            }));
            continue;
        };
        let channels = match effective_channels(
            &ty.default_channels,
            &job.event.channels,
            &job.requested_channels,
            &ty.key,
        ) {
            Ok(c) => c,
            Err(v) => {
                let _ = job.reply.send(Err(ApiError::Invalid(v)));
                continue;
            }
        };
        if let Some(topic) = &job.event.topic
            && !known_topics.contains(topic)
        {
            let name = topic.clone();
            let _ = job.reply.send(Err(ApiError::NotFound {
                kind: "topic",
                name,
            }));
            continue;
        }
        ready.push(Ready {
            // Time-ordered (RFC 9562 version 7), like delivery ids.
            id: Uuid::now_v7(),
            critical: ty.critical,
            over_cap: ty.over_cap,
            digest_window_s: ty.digest_window_s,
            dedup_window_s: i64::from(ty.dedup_window_s),
            send_at: None,
            derivation: ty.derivation.clone(),
            channels,
            job,
        });
    }
    Ok(ready)
}

/// Writes the batch in one transaction. Returns the results in order and whether it
/// committed: it rolls back instead when a caller left before the commit.
///
/// Every planning decision (dedup bucket, quiet hours, fatigue window, digest window) is
/// taken at `cfg.clock`'s instant: in production the database's `now()` for this
/// transaction, the clock that due times and leases use, never the host's. The dedup bucket is fixed the first time: a batch written
/// again keeps its keys. `ready` is sorted by (stored key, caller) on the way.
async fn try_write(
    conn: &mut notify_store::sqlx::PgConnection,
    cfg: &WriterConfig,
    ready: &mut [Ready],
) -> Result<(Vec<Written>, bool), StoreError> {
    let mut tx = notify_store::sqlx::Connection::begin(conn).await?;
    // A batch that plans takes the erasure lock before it writes anything, and learns the
    // planning instant in the same round trip; held until the commit, so an erasure
    // happens wholly before or after this plan.
    let now = if ready.iter().any(|r| r.job.event.topic.is_none()) {
        let database_now = notify_store::erasure::begin_planning(&mut tx).await?;
        cfg.clock.at(database_now)
    } else {
        cfg.clock.now(&mut tx).await?
    };
    for r in ready.iter_mut() {
        r.job.event.bucket_key(now, r.dedup_window_s);
    }
    sort_for_the_index(ready, |r| &r.job.event);
    let ready: &[Ready] = ready;
    let inserts: Vec<EventInsert<'_>> = ready
        .iter()
        .map(|r| EventInsert {
            id: r.id,
            event: &r.job.event,
            channels: &r.channels,
            send_at: r.send_at,
        })
        .collect();
    let existing = events::insert_events(&mut tx, &inserts).await?;

    // Plan the new, direct (non-topic) events from one read of their recipients' facts.
    let direct: Vec<usize> = (0..ready.len())
        .filter(|&i| existing[i].is_none() && ready[i].job.event.topic.is_none())
        .collect();
    let requests: Vec<(&str, &[String])> = direct
        .iter()
        .map(|&i| {
            let e = &ready[i].job.event;
            (e.type_key.as_str(), e.recipients.as_slice())
        })
        .collect();
    let facts = catalog::load_recipient_facts_many(&mut tx, &requests).await?;
    let mut planned: HashMap<usize, (Vec<NewDelivery>, Vec<SkippedDelivery>)> = HashMap::new();
    // Fatigue caps count what each user already has scheduled, across this batch too.
    let mut counted = if cfg.fatigue_caps.is_empty() {
        notify_core::fatigue::Counted::new()
    } else {
        let users = catalog::distinct_users(&requests);
        events::counted_toward_caps(&mut tx, &users).await?
    };
    for (&i, facts) in direct.iter().zip(facts) {
        let r = &ready[i];
        let plan = r
            .plan(cfg.max_attempts)
            .plan(&facts, now, &cfg.fatigue_caps, &mut counted);
        planned.insert(i, plan);
    }
    let rows: Vec<(Uuid, &NewDelivery)> = planned
        .iter()
        .flat_map(|(&i, (d, _))| d.iter().map(move |d| (ready[i].id, d)))
        .collect();
    let held = insert_planned(&mut tx, &rows, &cfg.direct).await?;
    attach_digests(&mut tx, ready, &mut planned, cfg.max_attempts).await?;
    let skips: Vec<(Uuid, &SkippedDelivery)> = planned
        .iter()
        .flat_map(|(&i, (_, s))| s.iter().map(move |s| (ready[i].id, s)))
        .collect();
    events::insert_skips_many(&mut tx, &skips).await?;

    if ready.iter().any(|r| r.job.reply.is_closed()) {
        tx.rollback().await?;
        return Ok((Vec::new(), false));
    }
    tx.commit().await?;
    if let Some((direct, _)) = &cfg.direct {
        direct.publish(with_trace_contexts(held, ready));
    }
    for (&i, (d, sk)) in &planned {
        count_derived(&ready[i].derivation, d, sk);
    }
    let results = existing
        .into_iter()
        .enumerate()
        .map(|(i, ex)| match ex {
            Some(ex) => Written::Existing(ex),
            None => {
                let (deliveries, skipped) = planned.remove(&i).unwrap_or_default();
                Written::New {
                    event_id: ready[i].id,
                    deliveries,
                    skipped,
                    send_at: ready[i].send_at,
                }
            }
        })
        .collect();
    Ok((results, true))
}

/// Held outbox rows with each delivery's event's trace context, for the relay's producer
/// spans (a row may name deliveries of several of the group commit's events).
fn with_trace_contexts(
    mut held: Vec<notify_store::outbox::OutboxRow>,
    ready: &[Ready],
) -> Vec<notify_store::outbox::OutboxRow> {
    let traces: HashMap<Uuid, std::sync::Arc<str>> = ready
        .iter()
        .filter_map(|r| Some((r.id, r.job.event.trace_context.as_deref()?.into())))
        .collect();
    for origin in held.iter_mut().flat_map(|row| row.origins.iter_mut()) {
        origin.trace_context = origin.event_id.and_then(|e| traces.get(&e).cloned());
    }
    held
}
