//! Digests in the group commit: a batch's digest deliveries joined to the open digest of
//! their group, or sent on their own when it has just closed.

use super::batch::Ready;
use crate::planning::new_deliveries;
use notify_core::{Channel, SkippedDelivery};
use notify_store::StoreError;
use notify_store::events::{self, NewDelivery};
use std::collections::HashMap;
use uuid::Uuid;

/// Joins the batch's digest deliveries to their digests. An event whose digest an earlier
/// event created is listed there and shows a `digested` skip instead of a delivery; one
/// whose digest closed a moment ago (being sent) gets a delivery of its own, sent now.
pub(super) async fn attach_digests(
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
