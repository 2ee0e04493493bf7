//! The scheduled-and-canceled wave of a chaos run: events scheduled a few seconds to half
//! a minute ahead, half of them canceled (by cancellation key) before they are due, all
//! while the run's kills and restarts go on. Afterwards nothing canceled may have reached
//! a provider and nothing scheduled may be lost, early or sent twice.

use super::ChaosConfig;
use super::check::{RunReport, check};
use crate::keys::Grpc;
use chrono::{DateTime, Utc};
use notify_proto::v1 as pb;
use rand::Rng;
use sqlx::PgPool;
use std::time::Duration;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// Events in a wave; two events share a cancellation key, every other key is canceled.
const EVENTS: usize = 40;
/// Recipients per event.
const RECIPIENTS: usize = 10;

struct WaveEvent {
    id: Uuid,
    send_at: DateTime<Utc>,
    cancel: bool,
}

/// One cancel call of the wave, once it was answered.
struct Canceled {
    key: String,
    /// When the answer came (host clock; the database runs on the same machine).
    answered_at: DateTime<Utc>,
    /// Calls it took (ingest or Postgres may be down when it is first asked).
    calls: u32,
}

/// A wave under way.
pub(super) struct Wave {
    events: Vec<WaveEvent>,
    cancels: JoinHandle<Vec<Result<Canceled, String>>>,
}

/// What the wave's check found.
#[derive(Debug, Default)]
pub(super) struct WaveReport {
    /// Deliveries of the events that were not canceled.
    pub scheduled: RunReport,
    /// Deliveries of the canceled events.
    pub canceled: RunReport,
    /// Deliveries sent before their event's `send_at`.
    pub early: i64,
    /// Deliveries of a canceled event sent after its cancel was answered.
    pub sent_after_cancel: i64,
    /// Cancel calls that never got an answer.
    pub cancels_unanswered: usize,
    /// Cancel calls made, retries included.
    pub cancel_calls: u32,
}

impl WaveReport {
    /// The summary line.
    pub(super) fn line(&self) -> String {
        format!(
            "chaos: wave scheduled={} scheduled_sent={} scheduled_lost={} early={} canceled={} canceled_sent={} sent_before_cancel={} cancel_calls={} cancels_unanswered={}",
            self.scheduled.deliveries,
            self.scheduled.sent,
            self.scheduled.lost,
            self.early,
            self.canceled.canceled,
            self.canceled.canceled_sent + self.sent_after_cancel,
            self.canceled.sent,
            self.cancel_calls,
            self.cancels_unanswered,
        )
    }

    /// Nothing canceled reached a provider; nothing scheduled was lost, early or sent
    /// twice without an ambiguous attempt.
    pub(super) fn ok(&self) -> bool {
        self.scheduled.lost == 0
            && self.scheduled.stuck == 0
            && self.scheduled.duplicates_line == 0
            && self.scheduled.unexplained_duplicates == 0
            && self.early == 0
            && self.canceled.lost == 0
            && self.canceled.canceled_sent == 0
            && self.sent_after_cancel == 0
            && self.cancels_unanswered == 0
    }
}

/// Schedules the wave's events for `users` (at least `EVENTS * RECIPIENTS` of them) and
/// starts the task that cancels every other cancellation key a while before it is due.
pub(super) async fn start(
    grpc: &Grpc,
    type_key: &str,
    users: &[String],
    run: usize,
) -> anyhow::Result<Wave> {
    // Letters only: a run of 13 digits in a key can pass as a Thai national id number,
    // which the sensitive-data guard refuses.
    let nonce: String = Uuid::new_v4()
        .simple()
        .to_string()
        .chars()
        .map(|c| match c.to_digit(10) {
            Some(d) => char::from(b'g' + d as u8),
            None => c,
        })
        .collect();
    let now = Utc::now();
    let mut client = pb::ingest_service_client::IngestServiceClient::new(grpc.clone());
    let mut events = Vec::with_capacity(EVENTS);
    let mut cancels: Vec<(DateTime<Utc>, String)> = Vec::new();
    for i in 0..EVENTS {
        let group = i / 2;
        let key = format!("chaos:{nonce}:reminders:{group}");
        let ahead = Duration::from_millis(rand::rng().random_range(6_000..25_000));
        let send_at = now + chrono::Duration::from_std(ahead)?;
        let recipients = users[i * RECIPIENTS..(i + 1) * RECIPIENTS].to_vec();
        let reply = client
            .create_event(pb::CreateEventRequest {
                event_key: format!("chaos:{nonce}:scheduled:{i}"),
                r#type: type_key.into(),
                actor_id: "chaos".into(),
                recipients,
                send_at: send_at.to_rfc3339(),
                cancellation_key: key.clone(),
                content: Some(pb::Content {
                    title: format!("เตือนความจำ รอบที่ {} #{i}", run + 1),
                    body: "ชำระเงินก่อนเวลา 09:00 น.".into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await?
            .into_inner();
        let cancel = group % 2 == 0;
        events.push(WaveEvent {
            id: reply.event_id.parse()?,
            send_at,
            cancel,
        });
        if cancel && i % 2 == 1 {
            // Both events of the group are written; cancel at least 3 s before the
            // earlier one is due, so "sent after the cancel" has one meaning.
            let due = events[i - 1].send_at.min(send_at);
            let room = (due - Utc::now() - chrono::Duration::seconds(3)).num_milliseconds();
            let at = Utc::now()
                + chrono::Duration::milliseconds(rand::rng().random_range(0..room.max(1)));
            cancels.push((at, key));
        }
    }
    cancels.sort();
    let grpc = grpc.clone();
    let cancels = tokio::spawn(async move {
        let mut done = Vec::new();
        for (at, key) in cancels {
            if let Ok(wait) = (at - Utc::now()).to_std() {
                tokio::time::sleep(wait).await;
            }
            done.push(cancel_with_retries(&grpc, key).await);
        }
        done
    });
    Ok(Wave { events, cancels })
}

/// Cancels `key`, asking again every 300 ms for up to 20 s while ingest or Postgres is
/// down (a cancel is idempotent).
async fn cancel_with_retries(grpc: &Grpc, key: String) -> Result<Canceled, String> {
    let mut calls = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        calls += 1;
        let mut client = pb::ingest_service_client::IngestServiceClient::new(grpc.clone());
        let asked = client
            .cancel_event(pb::CancelEventRequest {
                target: Some(pb::cancel_event_request::Target::CancellationKey(
                    key.clone(),
                )),
                recipients: vec![],
            })
            .await;
        match asked {
            Ok(_) => {
                return Ok(Canceled {
                    key,
                    answered_at: Utc::now(),
                    calls,
                });
            }
            Err(_) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => return Err(format!("cancel of {key}: {e}")),
        }
    }
}

impl Wave {
    /// Every event of the wave.
    pub(super) fn ids(&self) -> Vec<Uuid> {
        self.events.iter().map(|e| e.id).collect()
    }

    /// Waits for the cancels, then checks every delivery of the wave.
    pub(super) async fn finish(
        self,
        cfg: &ChaosConfig,
        pool: &PgPool,
    ) -> anyhow::Result<WaveReport> {
        let ids = self.ids();
        let answers = self.cancels.await?;
        let mut r = WaveReport::default();
        let mut answered: Vec<(String, DateTime<Utc>)> = Vec::new();
        for a in answers {
            match a {
                Ok(c) => {
                    r.cancel_calls += c.calls;
                    answered.push((c.key, c.answered_at));
                }
                Err(e) => {
                    println!("  {e}");
                    r.cancels_unanswered += 1;
                }
            }
        }
        let (canceled, kept): (Vec<&WaveEvent>, Vec<&WaveEvent>) =
            self.events.iter().partition(|e| e.cancel);
        let kept: Vec<Uuid> = kept.iter().map(|e| e.id).collect();
        let canceled: Vec<Uuid> = canceled.iter().map(|e| e.id).collect();
        r.scheduled = check(cfg, pool, &kept).await?;
        r.canceled = check(cfg, pool, &canceled).await?;
        r.early = sqlx::query_scalar(
            "SELECT count(*) FROM notification_deliveries d JOIN notification_events e ON e.id = d.event_id
             WHERE d.event_id = ANY($1) AND d.sent_at < e.send_at",
        )
        .bind(&ids)
        .fetch_one(pool)
        .await?;
        let (keys, times): (Vec<String>, Vec<DateTime<Utc>>) = answered.into_iter().unzip();
        r.sent_after_cancel = sqlx::query_scalar(
            "SELECT count(*) FROM notification_deliveries d JOIN notification_events e ON e.id = d.event_id
             JOIN UNNEST($2::text[], $3::timestamptz[]) AS c(key, answered_at) ON c.key = e.cancellation_key
             WHERE d.event_id = ANY($1) AND d.status = 'sent' AND d.sent_at > c.answered_at",
        )
        .bind(&ids)
        .bind(&keys)
        .bind(&times)
        .fetch_one(pool)
        .await?;
        Ok(r)
    }
}
