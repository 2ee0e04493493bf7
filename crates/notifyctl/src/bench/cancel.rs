//! The bench's cancel phase: the time `CancelEvent` takes to cancel 100,000 pending
//! deliveries (issue 44: 6,000 took 22 s when the outbox delete scanned the outbox once per
//! delivery). The deliveries belong to events scheduled a day ahead, so they stay pending,
//! each with its outbox row, beside whatever the earlier phases left; the workers and the
//! relay run meanwhile, as in production.

use anyhow::Context;
use notify_proto::v1 as pb;
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// Deliveries canceled: events of 1,000 recipients x 2 channels (in-app and email).
pub(super) const DELIVERIES: usize = 100_000;

/// Recipients per event (the `CreateEvent` maximum); the bench's `bench-user-*`.
const RECIPIENTS: usize = 1_000;

/// Channels of the phase's type, `bench_cancel`.
pub(super) const CHANNELS: [&str; 2] = ["inapp", "email"];

/// Longest answer accepted before the phase reports a failure.
const LIMIT: Duration = Duration::from_secs(120);

/// Writes `DELIVERIES` pending deliveries (events of type `bench_cancel`, due tomorrow,
/// all with the cancellation key `bench:cancel`), then times one `CancelEvent` by that
/// key. Prints `cancel: 100,000 pending deliveries canceled in X ms (...)`; returns the
/// milliseconds.
pub(super) async fn measure(pool: &PgPool, channel: &crate::keys::Grpc) -> anyhow::Result<f64> {
    let mut client = pb::ingest_service_client::IngestServiceClient::new(channel.clone());
    let users: Vec<String> = (0..RECIPIENTS).map(|i| format!("bench-user-{i}")).collect();
    let events = DELIVERIES / (RECIPIENTS * CHANNELS.len());
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let seeded = Instant::now();
    for i in 0..events {
        client
            .create_event(pb::CreateEventRequest {
                event_key: format!("bench:cancel:{i}"),
                r#type: "bench_cancel".into(),
                recipients: users.clone(),
                send_at: tomorrow.clone(),
                cancellation_key: "bench:cancel".into(),
                content: Some(pb::Content {
                    title: "cancel".into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .context("writing the deliveries to cancel")?;
    }
    let seed_s = seeded.elapsed().as_secs_f64();
    let (pending, outbox): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM notification_deliveries d
                 JOIN notification_events e ON e.id = d.event_id
                 WHERE e.cancellation_key = 'bench:cancel' AND d.status = 'pending'),
                (SELECT count(*) FROM outbox)",
    )
    .fetch_one(pool)
    .await?;
    anyhow::ensure!(
        pending == DELIVERIES as i64,
        "{pending} pending deliveries written, not {DELIVERIES}"
    );
    let started = Instant::now();
    let reply = tokio::time::timeout(
        LIMIT,
        client.cancel_event(pb::CancelEventRequest {
            target: Some(pb::cancel_event_request::Target::CancellationKey(
                "bench:cancel".into(),
            )),
            recipients: Vec::new(),
        }),
    )
    .await
    .with_context(|| format!("CancelEvent did not answer in {LIMIT:?}"))??
    .into_inner();
    let took = super::ms(started.elapsed());
    anyhow::ensure!(
        reply.canceled as usize == DELIVERIES,
        "CancelEvent canceled {} of {DELIVERIES}",
        reply.canceled
    );
    println!(
        "cancel: {} pending deliveries canceled in {took:.0} ms (one CancelEvent by cancellation key, {events} events x {RECIPIENTS} recipients x {} channels; {outbox} outbox rows present; written in {seed_s:.1} s)",
        super::fanout::thousands(DELIVERIES as i64),
        CHANNELS.len(),
    );
    Ok(took)
}
