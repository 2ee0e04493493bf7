//! The bench's fan-out phase: the time to write every delivery of a topic event with
//! 100,000 and then 1,000,000 subscribers (in-app only, worker-inapp stopped, so only the
//! fan-out and the relay run).

use anyhow::Context;
use notify_proto::v1 as pb;
use sqlx::PgPool;
use std::time::{Duration, Instant};

/// Topic sizes measured, in order.
pub(super) const SIZES: [i64; 2] = [100_000, 1_000_000];

/// Longest wait for one fan-out to finish.
const LIMIT: Duration = Duration::from_secs(900);

/// Seeds a topic of `subscribers` users (`fan<size>-0000000` ...) in one server-side
/// statement, sends one `CreateEvent` to it and waits until its fan-out is `done`. Prints
/// `fan-out: N deliveries written in X s (...)`; returns the seconds.
pub(super) async fn measure(
    pool: &PgPool,
    channel: &crate::keys::Grpc,
    subscribers: i64,
) -> anyhow::Result<f64> {
    let topic = format!("bench.fanout.{subscribers}");
    sqlx::query("INSERT INTO topics (key) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(&topic)
        .execute(pool)
        .await?;
    let seeded = Instant::now();
    sqlx::query(
        "INSERT INTO topic_subscriptions (topic, user_id)
         SELECT $1, 'fan' || $2::text || '-' || lpad(i::text, 7, '0') FROM generate_series(1, $2) i
         ON CONFLICT DO NOTHING",
    )
    .bind(&topic)
    .bind(subscribers)
    .execute(pool)
    .await
    .context("seeding the fan-out topic")?;
    let seed_s = seeded.elapsed().as_secs_f64();
    // Fresh statistics for the page query's plan.
    sqlx::query("ANALYZE topic_subscriptions")
        .execute(pool)
        .await?;
    let started = Instant::now();
    let reply = pb::ingest_service_client::IngestServiceClient::new(channel.clone())
        .create_event(pb::CreateEventRequest {
            event_key: format!("bench:fanout:{subscribers}"),
            r#type: "bench_fanout".into(),
            topic,
            content: Some(pb::Content {
                title: "fan-out".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner();
    let reply_ms = super::ms(started.elapsed());
    loop {
        let status: String =
            sqlx::query_scalar("SELECT fanout_status FROM notification_events WHERE id = $1::uuid")
                .bind(&reply.event_id)
                .fetch_one(pool)
                .await?;
        if status.parse::<notify_core::FanoutStatus>()? == notify_core::FanoutStatus::Done {
            break;
        }
        if started.elapsed() > LIMIT {
            anyhow::bail!("fan-out of {subscribers} did not finish in {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "fan-out: {} deliveries written in {secs:.1} s ({:.0} deliveries/s; CreateEvent replied in {reply_ms:.0} ms; {} subscribers seeded in {seed_s:.1} s)",
        thousands(subscribers),
        subscribers as f64 / secs,
        thousands(subscribers),
    );
    Ok(secs)
}

/// `1000000` as `1,000,000`.
pub(super) fn thousands(n: i64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_are_grouped_by_commas() {
        assert_eq!(super::thousands(1_000_000), "1,000,000");
        assert_eq!(super::thousands(100_000), "100,000");
        assert_eq!(super::thousands(999), "999");
    }
}
