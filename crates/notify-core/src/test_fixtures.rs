//! Values the unit tests of several modules build alike.

use crate::content::Content;
use crate::event::NewEvent;

/// A validated event as the link and sensitive-data checks see it: key `event_key`, type
/// `type_key`, one recipient `u1`, `payload` and `content`; no actor, channels, topic,
/// aggregate key or caller.
pub(crate) fn new_event(
    event_key: &str,
    type_key: &str,
    payload: serde_json::Value,
    content: Content,
) -> NewEvent {
    NewEvent {
        event_key: event_key.into(),
        type_key: type_key.into(),
        actor_id: String::new(),
        recipients: vec!["u1".into()],
        payload,
        content,
        channels: vec![],
        topic: None,
        line_multicast: false,
        caller_key: None,
        aggregate_key: None,
        trace_context: None,
        caller: None,
        schedule: None,
        cancellation_key: None,
    }
}
