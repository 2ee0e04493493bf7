//! Masking what the guard finds: digits but the last four become `X`, key blocks and
//! tokens `[REDACTED]`, secret fields' values `"[REDACTED]"`.

use super::{
    bearer_tokens, digit, is_empty_value, is_secret_field, number_spans, private_keys, scan_text,
};
use serde_json::Value;

/// `text` with every finding masked: id and card digits but the last four become `X`
/// (separators kept), private key blocks and tokens become `[REDACTED]`. Masking is
/// repeated until nothing is found, because the four digits kept can form a new number
/// with digits next to them (found by `make fuzz`).
pub fn mask_text(text: &str) -> String {
    let mut out = mask_once(text);
    // Each pass replaces at least 9 digits, so this ends quickly.
    for _ in 0..32 {
        if number_spans(&out).is_empty() {
            break;
        }
        out = mask_once(&out);
    }
    out
}

fn mask_once(text: &str) -> String {
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for r in number_spans(text) {
        {
            let keep_from = r.digits.saturating_sub(4);
            let mut seen = 0;
            let masked: String = text[r.start..r.end]
                .chars()
                .map(|c| {
                    if digit(c).is_some() {
                        seen += 1;
                        if seen > keep_from { c } else { 'X' }
                    } else {
                        c
                    }
                })
                .collect();
            edits.push((r.start, r.end, masked));
        }
    }
    for (s, e) in private_keys(text).into_iter().chain(bearer_tokens(text)) {
        edits.push((s, e, "[REDACTED]".into()));
    }
    edits.sort_by_key(|(s, _, _)| *s);
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (s, e, rep) in edits {
        if s < at {
            continue; // overlaps an earlier edit
        }
        out.push_str(&text[at..s]);
        out.push_str(&rep);
        at = e;
    }
    out.push_str(&text[at..]);
    out
}

/// `value` with every finding of [`scan_json`](super::scan_json) masked: a secret field's whole value
/// becomes `"[REDACTED]"`, strings and keys are masked with [`mask_text`], and a number
/// that is an id or a card becomes its masked string.
pub fn mask_json(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let masked = if is_secret_field(k) && !is_empty_value(v) {
                        Value::String("[REDACTED]".into())
                    } else {
                        mask_json(v)
                    };
                    (mask_text(k), masked)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(mask_json).collect()),
        Value::String(s) => Value::String(mask_text(s)),
        Value::Number(n) => {
            let text = n.to_string();
            if scan_text(&text).is_empty() {
                value.clone()
            } else {
                Value::String(mask_text(&text))
            }
        }
        other => other.clone(),
    }
}
