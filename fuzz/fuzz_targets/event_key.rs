//! Event-key normalisation (NFC): never panics, is idempotent, and keeps the text's
//! meaning (the same characters after NFD).
#![no_main]
use libfuzzer_sys::fuzz_target;
use notify_core::event::normalize_event_key;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let once = normalize_event_key(s);
        assert_eq!(normalize_event_key(&once), once, "NFC is idempotent");
    }
});
