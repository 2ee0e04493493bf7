//! Template validation and rendering (minijinja, fuel-limited) on arbitrary template
//! sources and sample payloads: never panics and never hangs.
#![no_main]
use libfuzzer_sys::fuzz_target;
use notify_core::template::{Template, validate};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (source, payload) = text.split_once('\u{1f}').unwrap_or((&text, "{}"));
    let payload: serde_json::Value =
        serde_json::from_str(payload).unwrap_or_else(|_| serde_json::json!({"order_id": 1001, "amount": 1250}));
    let template = Template {
        channel: "*".into(),
        locale: "th-TH".into(),
        title: source.chars().take(200).collect(),
        body: source.to_string(),
        email_subject: String::new(),
        email_html: source.to_string(),
    };
    let _ = validate("fuzz_type", &[template], &payload);
});
