//! `NewEvent::parse` (request validation) on arbitrary fields: never panics; what it
//! accepts keeps its limits, and its fingerprint is stable.
#![no_main]
use libfuzzer_sys::fuzz_target;
use notify_core::event::{CreateEventInput, MAX_PAYLOAD_DEPTH, json_depth};
use notify_core::{Content, NewEvent};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let f: Vec<&str> = text.split('\u{1f}').collect();
    let get = |i: usize| f.get(i).copied().unwrap_or("").to_string();
    let input = CreateEventInput {
        event_key: get(0),
        type_key: get(1),
        actor_id: get(2),
        recipients: get(3).split(',').map(str::to_string).collect(),
        payload: get(4),
        content: Content {
            title: get(5),
            body: get(6),
            url: get(7),
            ..Default::default()
        },
        channels: get(8).split(',').filter(|c| !c.is_empty()).map(str::to_string).collect(),
        topic: get(9),
        line_multicast: data.first().is_some_and(|b| b & 1 == 1),
        aggregate_key: get(10),
    };
    if let Ok(event) = NewEvent::parse(input.clone()) {
        assert!(!event.event_key.is_empty() && event.event_key.len() <= 255);
        assert!(event.recipients.len() <= 1000);
        assert!(event.payload.is_object());
        assert!(json_depth(&event.payload) <= MAX_PAYLOAD_DEPTH);
        let again = NewEvent::parse(input).expect("the same input parses again");
        assert_eq!(event.fingerprint(), again.fingerprint());
    }
});
