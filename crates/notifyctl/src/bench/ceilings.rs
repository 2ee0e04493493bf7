//! The two ceilings of this machine, measured in the same run as the platform: the
//! broker's and Postgres's.

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Persistent 256-byte messages, publisher confirms in windows of 500, consumer with
/// prefetch 200 and manual acks, on one quorum queue: messages per second end to end.
pub(super) async fn broker_ceiling(amqp_url: &str, n: u64) -> anyhow::Result<f64> {
    let conn = notify_broker::connect(amqp_url, "bench-ceiling").await?;
    let ch = conn.create_channel().await?;
    let queue = format!("bench.ceiling.{}", Uuid::new_v4().simple());
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    ch.queue_declare(
        queue.clone().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await?;
    let pub_ch = conn.create_channel().await?;
    pub_ch.confirm_select(Default::default()).await?;
    let cons_ch = notify_broker::consumer_channel(&conn, 200).await?;
    let mut consumer = cons_ch
        .basic_consume(
            queue.clone().into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let started = Instant::now();
    let consume = tokio::spawn(async move {
        let mut got = 0u64;
        while got < n {
            let Some(Ok(d)) = consumer.next().await else {
                break;
            };
            d.ack(BasicAckOptions::default()).await.ok();
            got += 1;
        }
        got
    });
    let body = vec![b'x'; 256];
    let mut sent = 0u64;
    while sent < n {
        let window = 500.min(n - sent);
        let mut confirms = Vec::with_capacity(window as usize);
        for _ in 0..window {
            confirms.push(
                pub_ch
                    .basic_publish(
                        "".into(),
                        queue.clone().into(),
                        BasicPublishOptions::default(),
                        &body,
                        lapin::BasicProperties::default().with_delivery_mode(2),
                    )
                    .await?,
            );
        }
        for c in confirms {
            c.await?;
        }
        sent += window;
    }
    let got = consume.await?;
    let rate = got as f64 / started.elapsed().as_secs_f64();
    // Close the consuming channel before deleting its queue, so the broker has no
    // consumer to cancel under it.
    let _ = cons_ch.close(200, "done".into()).await;
    let _ = pub_ch.close(200, "done".into()).await;
    ch.queue_delete(queue.into(), QueueDeleteOptions::default())
        .await?;
    Ok(rate)
}

/// The ingest transaction (one event, three deliveries, three outbox rows) from one
/// client, for `secs`: transactions per second.
pub(super) async fn postgres_ceiling(pool: &PgPool, for_: Duration) -> anyhow::Result<f64> {
    sqlx::query("INSERT INTO notification_types (key, default_channels) VALUES ('bench_pg', '{inapp}') ON CONFLICT DO NOTHING")
        .execute(pool)
        .await?;
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < for_ {
        let mut tx = pool.begin().await?;
        let event = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO notification_events (id, event_key, type, recipients, payload_json, content_json, channels, fingerprint)
             VALUES ($1, $2, 'bench_pg', '{u1}', '{}', '{}', '{inapp,email,line}', '\\x00')",
        )
        .bind(event)
        .bind(event.to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "WITH d AS (INSERT INTO notification_deliveries (id, event_id, user_id, channel, provider, idempotency_key)
                        SELECT gen_random_uuid(), $1, 'u1', c, 'x', $1 || '/' || c FROM UNNEST('{inapp,email,line}'::text[]) AS c
                        RETURNING id, channel)
             INSERT INTO outbox (delivery_id, channel, available_at) SELECT id, channel, now() + interval '1 day' FROM d",
        )
        .bind(event)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}
