//! Property tests over the functions the fuzz targets cover (`make fuzz` runs those for
//! longer, coverage-guided): request validation, event-key normalisation, template
//! rendering, LINE text splitting, push payload shortening and the sensitive-data guard.

use notify_core::event::{CreateEventInput, MAX_PAYLOAD_DEPTH, json_depth, normalize_event_key};
use notify_core::guard::{Kind, luhn_valid, mask_text, scan_text, thai_id_valid};
use notify_core::template::{Template, validate};
use notify_core::text::{ELLIPSIS, shorten_to_fit, split_utf16};
use notify_core::{Content, NewEvent};
use proptest::prelude::*;

/// Text mixing ASCII, Thai (with combining vowels and tone marks), digits, separators and
/// emoji with modifiers.
fn mixed_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            "[a-z ]{1,8}",
            "[0-9]{1,6}",
            Just("ก่".to_string()),
            Just("น้ำ".to_string()),
            Just("ที่".to_string()),
            Just("๑๒๓".to_string()),
            Just("-".to_string()),
            Just(" ".to_string()),
            Just("\n".to_string()),
            Just("👍🏽".to_string()),
            Just("🇹🇭".to_string()),
        ],
        0..60,
    )
    .prop_map(|parts| parts.concat())
}

fn digits_of(n: u64, len: usize) -> Vec<u8> {
    format!("{n:0len$}").bytes().map(|b| b - b'0').collect()
}

/// The one check digit completing `d` under `valid`.
fn complete(d: &mut Vec<u8>, valid: fn(&[u8]) -> bool) -> Vec<u8> {
    (0..10u8)
        .filter(|c| {
            d.push(*c);
            let ok = valid(d);
            d.pop();
            ok
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn validation_never_panics_and_accepted_events_keep_the_limits(
        key in ".{0,300}",
        type_key in "[a-z_]{0,20}",
        recipients in prop::collection::vec(".{0,20}", 0..5),
        payload in prop_oneof![Just("{}".to_string()), "\\{\"[a-z]{1,5}\":[0-9]{1,4}\\}", ".{0,50}"],
        title in mixed_text(),
        url in prop_oneof![Just(String::new()), "https://[a-z]{1,10}\\.test/[a-z]{0,5}", ".{0,20}"],
    ) {
        let input = CreateEventInput {
            event_key: key,
            type_key,
            actor_id: String::new(),
            recipients,
            payload,
            content: Content { title, body: "x".into(), url, ..Default::default() },
            ..Default::default()
        };
        if let Ok(e) = NewEvent::parse(input.clone()) {
            prop_assert!(!e.event_key.is_empty() && e.event_key.len() <= 255);
            prop_assert!(e.payload.is_object() && json_depth(&e.payload) <= MAX_PAYLOAD_DEPTH);
            prop_assert_eq!(e.fingerprint(), NewEvent::parse(input).unwrap().fingerprint());
        }
    }

    #[test]
    fn normalising_an_event_key_twice_changes_nothing(key in "\\PC{0,40}") {
        let once = normalize_event_key(&key);
        prop_assert_eq!(normalize_event_key(&once), once);
    }

    #[test]
    fn template_validation_never_panics(source in "[{}%a-z. |()]{0,60}", amount in 0u32..10_000_000) {
        let t = Template {
            channel: "*".into(),
            locale: "th-TH".into(),
            body: source,
            ..Default::default()
        };
        let _ = validate("prop_type", &[t], &serde_json::json!({"amount": amount}));
    }

    #[test]
    fn line_pieces_fit_and_lose_no_text(text in mixed_text(), max in 8usize..64) {
        if let Ok(parts) = split_utf16(&text, max, 5) {
            prop_assert!(parts.len() <= 5);
            for p in &parts {
                prop_assert!(p.encode_utf16().count() <= max);
            }
            let strip = |t: &str| t.chars().filter(|c| !c.is_whitespace()).collect::<String>();
            prop_assert_eq!(strip(&parts.concat()), strip(&text));
        }
    }

    #[test]
    fn a_shortened_push_body_fits_and_is_a_prefix(text in mixed_text(), limit in 4usize..80) {
        if let Some(out) = shorten_to_fit(&text, |t| t.len() <= limit) {
            prop_assert!(out.len() <= limit);
            if out != text {
                let head = out.strip_suffix(ELLIPSIS).unwrap();
                prop_assert!(text.starts_with(head));
            }
        }
    }

    #[test]
    fn exactly_one_check_digit_makes_a_thai_id(first12 in 0u64..1_000_000_000_000) {
        let mut d = digits_of(first12, 12);
        prop_assert_eq!(complete(&mut d, thai_id_valid).len(), 1);
    }

    #[test]
    fn a_valid_thai_id_is_found_and_masked_in_any_text(
        first12 in 100_000_000_000u64..1_000_000_000_000,
        before in mixed_text(),
        after in mixed_text(),
        dashed in any::<bool>(),
    ) {
        let mut d = digits_of(first12, 12);
        let check = complete(&mut d, thai_id_valid)[0];
        d.push(check);
        let s: String = d.iter().map(|x| (b'0' + x) as char).collect();
        let id = if dashed {
            format!("{}-{}-{}-{}-{}", &s[..1], &s[1..5], &s[5..10], &s[10..12], &s[12..])
        } else {
            s.clone()
        };
        // Set apart from neighbouring digits by words, as a person writing it would.
        let text = format!("{before} เลขบัตร {id} ค่ะ {after}");
        prop_assert!(scan_text(&text).contains(&Kind::ThaiNationalId), "{}", text);
        let masked = mask_text(&text);
        prop_assert!(!masked.contains(&id));
        prop_assert!(!scan_text(&masked).contains(&Kind::ThaiNationalId));
    }

    #[test]
    fn luhn_accepts_exactly_one_check_digit(body in 100_000_000_000_000u64..1_000_000_000_000_000) {
        let mut d = digits_of(body, 15);
        prop_assert_eq!(complete(&mut d, luhn_valid).len(), 1);
    }

    #[test]
    fn masking_leaves_no_id_or_card_number(text in mixed_text()) {
        let left = scan_text(&mask_text(&text));
        prop_assert!(!left.contains(&Kind::ThaiNationalId) && !left.contains(&Kind::PaymentCard));
    }
}
