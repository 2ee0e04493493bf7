//! Events and their deliveries: the ingest transaction's writes (`write.rs`), the read
//! side of `GetEvent` (`read.rs`), `ListEvents` (`list.rs`), topic fan-out (`fanout.rs`) and what planning reads and
//! locks in its transaction (`planning.rs`). Everything is re-exported here: callers use
//! `notify_store::events::*`.

use crate::Result;
use chrono::{DateTime, Utc};
use notify_core::NewEvent;

mod fanout;
mod list;
mod planning;
mod read;
mod write;

pub use fanout::{
    FanoutJob, advance_fanout, canceled_recipients, claim_fanout, lock_for_page, subscribers_page,
};
pub use list::{EventFilter, EventSummary, list_events};
pub use planning::{attach_digest_items, counted_toward_caps, digest_items_of};
pub use read::{
    AttemptRow, DeliveryRecord, EventRecord, EventSelector, SkipRecord, attempts_of, deliveries_of,
    delivery_counts, endpoint_state, get_event, list_deliveries, list_skips, skip_of,
};
pub use write::{
    EventInsert, ExistingEvent, NewDelivery, insert_deliveries, insert_deliveries_held,
    insert_deliveries_many, insert_event_or_get_existing, insert_events, insert_skips,
    insert_skips_many,
};

/// The caller every event belongs to when callers are not authenticated
/// (`NOTIFY_GRPC_AUTH=off`), and the owner of events from before callers were recorded.
pub const SHARED_CALLER: &str = "anonymous";

/// The caller an event is recorded for: its authenticated caller, or [`SHARED_CALLER`].
pub fn caller_of(event: &NewEvent) -> &str {
    event.caller.as_deref().unwrap_or(SHARED_CALLER)
}

/// The database clock: `now()`, the start of the current transaction. Planning reads its
/// instant here (quiet hours, dedup buckets, fatigue windows, digest windows) so that it
/// decides on the same clock as due times, claims and leases, whatever the host's clock
/// says. Run it in the transaction that writes the plan.
pub async fn database_now(db: &mut sqlx::PgConnection) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar("SELECT now()").fetch_one(db).await?)
}
