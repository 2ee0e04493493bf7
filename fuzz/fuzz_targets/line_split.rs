//! LINE text splitting: pieces are within the UTF-16 limit, there are at most the
//! allowed number, and nothing but trailing space at the cuts is lost.
#![no_main]
use libfuzzer_sys::fuzz_target;
use notify_core::text::split_utf16;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let max_units = 1 + (data.len() % 64);
    if let Ok(parts) = split_utf16(s, max_units, 5) {
        assert!(parts.len() <= 5);
        for p in &parts {
            assert!(p.encode_utf16().count() <= max_units, "{p:?} over {max_units}");
        }
        let joined: String = parts.concat();
        let strip = |t: &str| t.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        assert_eq!(strip(&joined), strip(s), "text lost or changed");
    }
});
