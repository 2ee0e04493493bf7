//! Push payload shortening: the result fits, is the text itself or a prefix of whole
//! grapheme clusters plus the ellipsis.
#![no_main]
use libfuzzer_sys::fuzz_target;
use notify_core::text::{ELLIPSIS, shorten_to_fit};
use unicode_segmentation::UnicodeSegmentation;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let limit = data.len() / 2 + 3;
    if let Some(out) = shorten_to_fit(s, |t| t.len() <= limit) {
        assert!(out.len() <= limit);
        if out != s {
            let head = out.strip_suffix(ELLIPSIS).expect("ends with the ellipsis");
            assert!(s.starts_with(head));
            let bounds: Vec<usize> = s.grapheme_indices(true).map(|(i, _)| i).collect();
            let end = head.len();
            assert!(end == s.len() || bounds.contains(&end) || s[..end].trim_end().len() == end);
        }
    }
});
