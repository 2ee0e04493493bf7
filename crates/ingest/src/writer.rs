//! Group commit for `CreateEvent`.
//!
//! Each request is validated in its own handler, then handed to the event writer. Its
//! writer tasks (`NOTIFY_INGEST_WRITERS`, one by default) each take whatever requests are
//! waiting (up to a batch limit) and write them in one transaction with multi-row
//! statements: types and topics looked up once, the events
//! inserted in one statement (keys sorted, so concurrent batches lock the unique index in
//! one order), recipient facts read with one statement, all deliveries with their outbox
//! rows in one statement and all skipped pairs in another. One commit (one WAL flush)
//! then answers the whole batch. Under light load a batch is a single request and adds no
//! wait; under heavy load the batch grows with the queue.
//!
//! Failure isolation: a request that fails validation against the catalogue (unknown
//! type or topic, a channel the type does not allow) is answered on its own and left out
//! of the batch. If the batch transaction fails on a statement, each request is retried in
//! a transaction of its own, so one bad request cannot fail its neighbours. A request
//! whose caller has gone (deadline passed, cancelled) before the commit is left out: the
//! batch is rolled back and written again without it, so a passed deadline writes nothing.
//!
//! The writer tasks run on a thread of their own ("event-writer", a single-threaded tokio
//! runtime) over connections of their own: a batch is a dozen round trips one after
//! another, and on the server's runtime each reply waited its turn behind the gRPC tasks
//! of every caller. Alternating runs of one build at 128 clients on 2 cores: 3,619 to
//! 4,842 events/s on the writer's thread, 2,278 to 3,774 on the server's runtime
//! (docs/scaling.md, 2026-12-05).

use crate::clock::Clock;
use crate::error::ApiError;
use crate::planning::{add_derived, count_derived, due_times, new_deliveries};
use futures_util::StreamExt;
use notify_core::plan::{effective_channels, plan};
use notify_core::{Channel, NewEvent, SkippedDelivery};
use notify_store::events::{self, EventInsert, ExistingEvent, NewDelivery};
use notify_store::{PgPool, StoreError, catalog, topics};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tokio::sync::{Mutex, mpsc, oneshot};
use tracing::{debug, error, warn};
use uuid::Uuid;

/// What writing one event produced.
#[derive(Debug)]
pub enum Written {
    /// The event is new and committed, with its deliveries and skipped pairs.
    New {
        /// The new event's id.
        event_id: Uuid,
        /// Deliveries written (empty for a topic event, which the fan-out plans).
        deliveries: Vec<NewDelivery>,
        /// Recipient x channel pairs that got no delivery.
        skipped: Vec<SkippedDelivery>,
        /// A scheduled event's due time (`None`: sent at once).
        send_at: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// The key exists: the stored event's id and fingerprint.
    Existing(ExistingEvent),
}

struct Job {
    event: NewEvent,
    requested_channels: Vec<String>,
    reply: oneshot::Sender<Result<Written, ApiError>>,
}

/// Settings of the event writer.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Writer tasks (transactions in flight at once).
    pub writers: usize,
    /// Most events per transaction.
    pub max_batch: usize,
    /// Attempts each new delivery gets.
    pub max_attempts: i32,
    /// Fatigue caps: most non-critical notifications per user per rolling hour, per
    /// channel (empty = no caps).
    pub fatigue_caps: std::collections::BTreeMap<Channel, u32>,
    /// The planning instant's source: the database's `now()` in production.
    pub clock: Clock,
    /// Furthest a scheduled event may be due after the planning instant
    /// (`NOTIFY_SCHEDULE_HORIZON`).
    pub horizon: std::time::Duration,
    /// The relay to hand new deliveries due now to after each commit, and how long their
    /// outbox rows are held for it ([`crate::relay::RelayConfig::hold`]); `None`: every
    /// row is left to the relay's claim.
    pub direct: Option<(crate::relay::Direct, std::time::Duration)>,
}

/// Handle to the writer tasks; cheap to clone. The tasks, their thread and their
/// connections stop when every handle is gone.
#[derive(Clone)]
pub struct EventWriter {
    tx: mpsc::Sender<Job>,
}

/// Connections of the writer's own pool for each writer task: one for its batch
/// transaction, and up to [`ALONE_AT_ONCE`] while a failed batch's events are written one
/// by one. Ingest opens these besides its `NOTIFY_DB_POOL_SIZE`.
pub const CONNECTIONS_PER_WRITER: usize = ALONE_AT_ONCE;

impl EventWriter {
    /// Starts `cfg.writers` writer tasks on a new thread, "event-writer", with a
    /// single-threaded runtime and a pool of `cfg.writers` x [`CONNECTIONS_PER_WRITER`]
    /// connections opened there, with `pool`'s settings (URL, timeouts, pooler, the idle
    /// ping and the refusal of a standby).
    ///
    /// # Errors
    /// The operating system's, when it cannot start the thread or its runtime.
    pub fn start(pool: &PgPool, cfg: WriterConfig) -> std::io::Result<Self> {
        let writers = cfg.writers.max(1);
        let (tx, rx) = mpsc::channel::<Job>(cfg.max_batch * writers * 4);
        let rx = Arc::new(Mutex::new(rx));
        let options = pool
            .options()
            .clone()
            .max_connections(u32::try_from(writers * CONNECTIONS_PER_WRITER).unwrap_or(u32::MAX));
        let connect = (*pool.connect_options()).clone();
        let (started, start_result) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("event-writer".into())
            .spawn(move || {
                // Built here: a runtime may not be dropped on the caller's, should this
                // thread fail to start.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => {
                        let _ = started.send(Ok(()));
                        rt
                    }
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    // Opened lazily, on this runtime: each connection's socket is then
                    // driven by this thread, not the server's.
                    let pool = options.connect_lazy_with(connect);
                    let tasks: Vec<_> = (0..writers)
                        .map(|_| {
                            let (pool, cfg, rx) = (pool.clone(), cfg.clone(), rx.clone());
                            tokio::spawn(restart_on_panic("event writer", move || {
                                writer_loop(pool.clone(), cfg.clone(), rx.clone())
                            }))
                        })
                        .collect();
                    for task in tasks {
                        let _ = task.await;
                    }
                    pool.close().await;
                });
            })?;
        start_result
            .recv()
            .map_err(|_| std::io::Error::other("the event writer's thread ended at start"))??;
        Ok(Self { tx })
    }

    /// Writes one validated event (with the channel names the caller asked for, to name
    /// them in errors) and waits for its commit.
    ///
    /// # Errors
    /// `NotFound` for an unknown type or topic, `Invalid` for a channel the type does not
    /// allow, `Store` when the database failed.
    pub async fn write(
        &self,
        event: NewEvent,
        requested_channels: Vec<String>,
    ) -> Result<Written, ApiError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Job {
                event,
                requested_channels,
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Runs the task `start` makes, and a new one in its place each time one panics, until
/// one returns or is cancelled.
///
/// A writer task that panicked (no such path is known) would otherwise leave its replica
/// with one writer fewer; with one writer, the default, every later `CreateEvent` would
/// fail until a restart. The requests of the panicked batch are answered as if the writer
/// had stopped (`UNAVAILABLE`); callers retry them under the same `event_key`, which finds
/// any that did commit.
async fn restart_on_panic<F, Fut>(what: &'static str, mut start: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        match tokio::spawn(start()).await {
            Err(e) if e.is_panic() => {
                error!(task = what, error = %e, "task panicked; starting it again")
            }
            _ => return,
        }
    }
}

/// Events of a failed batch written again at once, each in a transaction of its own.
const ALONE_AT_ONCE: usize = 4;

fn stopped() -> ApiError {
    ApiError::Store(StoreError::Db(sqlx::Error::PoolClosed))
}

async fn writer_loop(pool: PgPool, cfg: WriterConfig, rx: Arc<Mutex<mpsc::Receiver<Job>>>) {
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
struct Ready {
    job: Job,
    id: Uuid,
    channels: Vec<Channel>,
    critical: bool,
    over_cap: notify_core::fatigue::OverCap,
    digest_window_s: i32,
    dedup_window_s: i64,
    /// A scheduled event's due time, fixed once per batch by [`due_times`].
    send_at: Option<chrono::DateTime<chrono::Utc>>,
    derivation: notify_core::plan::Derivation,
}

/// Joins the batch's digest deliveries to their digests. An event whose digest an earlier
/// event created is listed there and shows a `digested` skip instead of a delivery; one
/// whose digest closed a moment ago (being sent) gets a delivery of its own, sent now.
async fn attach_digests(
    tx: &mut notify_store::sqlx::PgConnection,
    ready: &[Ready],
    planned: &mut HashMap<usize, (Vec<NewDelivery>, Vec<SkippedDelivery>)>,
    max_attempts: i32,
) -> Result<(), StoreError> {
    let mut wanted = Vec::new();
    for (&i, (deliveries, _)) in planned.iter() {
        for (j, d) in deliveries.iter().enumerate() {
            if d.plan.digest_key.is_some() && d.plan.channel != Channel::InApp {
                wanted.push((i, j));
            }
        }
    }
    if wanted.is_empty() {
        return Ok(());
    }
    let items: Vec<(Uuid, &str, &str)> = wanted
        .iter()
        .map(|&(i, j)| {
            let d = &planned[&i].0[j];
            (
                ready[i].id,
                d.plan.channel.as_str(),
                d.plan.idempotency_key.as_str(),
            )
        })
        .collect();
    let joined = events::attach_digest_items(&mut *tx, &items).await?;
    let mut alone = Vec::new();
    let mut merged: Vec<(usize, usize, Uuid)> = Vec::new();
    for (&(i, j), into) in wanted.iter().zip(joined) {
        let d = &planned[&i].0[j];
        match into {
            Some(id) if id == d.id => {}
            Some(id) => merged.push((i, j, id)),
            None => alone.push((i, j)),
        }
    }
    // Remove from the back so indexes stay valid.
    let mut gone: Vec<(usize, usize)> = merged
        .iter()
        .map(|&(i, j, _)| (i, j))
        .chain(alone.iter().copied())
        .collect();
    gone.sort_unstable_by(|a, b| b.cmp(a));
    let mut removed: HashMap<(usize, usize), NewDelivery> = HashMap::new();
    for (i, j) in gone {
        let d = planned.get_mut(&i).expect("planned").0.remove(j);
        removed.insert((i, j), d);
    }
    for (i, j, into) in merged {
        let d = removed.remove(&(i, j)).expect("removed");
        let entry = planned.get_mut(&i).expect("planned");
        if !entry
            .1
            .iter()
            .any(|s| s.user_id == d.plan.user_id && s.channel == d.plan.channel)
        {
            entry.1.push(SkippedDelivery {
                user_id: d.plan.user_id.clone(),
                channel: d.plan.channel,
                reason: notify_core::plan::SkipReason::Digested,
                decision: format!(
                    "{}\ndigest: listed in delivery {into}, sent when the window closes",
                    d.plan.decision
                ),
            });
        }
    }
    let mut own = Vec::new();
    for (i, j) in alone {
        let mut d = removed.remove(&(i, j)).expect("removed").plan;
        d.idempotency_key = format!(
            "{}/{}/{}{}",
            ready[i].id,
            d.user_id,
            d.channel,
            d.endpoint_id.map(|e| format!("/{e}")).unwrap_or_default()
        );
        d.digest_key = None;
        // Sent now, or at a scheduled event's due time.
        d.deferred_until = None;
        d.scheduled_for = ready[i].send_at;
        d.decision
            .push_str("\ndigest: its window had just closed; sent on its own");
        own.push((i, d));
    }
    if !own.is_empty() {
        let mut fresh = Vec::new();
        for (i, d) in own {
            let nd = new_deliveries(vec![d], max_attempts).remove(0);
            fresh.push((i, nd));
        }
        let rows: Vec<(Uuid, &NewDelivery)> =
            fresh.iter().map(|(i, d)| (ready[*i].id, d)).collect();
        events::insert_deliveries_many(&mut *tx, &rows).await?;
        for (i, d) in fresh {
            planned.get_mut(&i).expect("planned").0.push(d);
        }
    }
    Ok(())
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
        // A scheduled event is planned at its due time: quiet hours, fatigue and digest
        // windows of the sending time.
        let at = r.send_at.map_or(now, |t| t.max(now));
        let scheduled = r.send_at.is_some();
        let (mut deliveries, mut skipped) =
            plan(r.id, r.critical, &r.channels, &facts, at, scheduled);
        add_derived(
            r.id,
            r.critical,
            &r.derivation,
            &facts,
            (at, scheduled),
            &mut deliveries,
            &mut skipped,
        );
        let deliveries = notify_core::fatigue::apply_caps(
            deliveries,
            &mut skipped,
            &cfg.fatigue_caps,
            r.critical,
            r.over_cap,
            at,
            &mut counted,
        );
        let deliveries = match &r.job.event.aggregate_key {
            Some(group) if r.digest_window_s > 0 => notify_core::plan::into_digests(
                deliveries,
                &r.job.event.type_key,
                group,
                notify_core::plan::digest_window(at, i64::from(r.digest_window_s)),
            ),
            _ => deliveries,
        };
        planned.insert(i, (new_deliveries(deliveries, cfg.max_attempts), skipped));
    }
    let rows: Vec<(Uuid, &NewDelivery)> = planned
        .iter()
        .flat_map(|(&i, (d, _))| d.iter().map(move |d| (ready[i].id, d)))
        .collect();
    let held = match &cfg.direct {
        Some((direct, hold)) => {
            events::insert_deliveries_held(&mut tx, &rows, *hold, direct.deliveries_per_row())
                .await?
        }
        None => {
            events::insert_deliveries_many(&mut tx, &rows).await?;
            Vec::new()
        }
    };
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

#[cfg(test)]
mod supervision_tests {
    use super::restart_on_panic;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn a_task_that_panics_is_started_again_and_one_that_returns_is_not() {
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        restart_on_panic("test task", move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    panic!("writer bug number {n}");
                }
            }
        })
        .await;
        // Two panics, each followed by a new start; the third returned and ended it.
        assert_eq!(starts.load(Ordering::SeqCst), 3);
    }
}
