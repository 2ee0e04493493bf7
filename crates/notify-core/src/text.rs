//! Text that must fit a provider's limits without breaking a character a reader sees.
//!
//! Cuts fall only on extended grapheme cluster boundaries (Unicode UAX #29, through the
//! `unicode-segmentation` crate), so a Thai vowel or tone mark never starts a piece, a
//! surrogate pair (in UTF-16 terms) is never split and an emoji sequence stays whole.

use unicode_segmentation::UnicodeSegmentation;

/// The ellipsis appended to shortened text (U+2026, 3 UTF-8 bytes).
pub const ELLIPSIS: &str = "\u{2026}";

/// Text longer than the allowed number of pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "text needs {needed_units} UTF-16 code units; at most {max_parts} pieces of {max_units} are allowed"
)]
pub struct TooLong {
    /// UTF-16 code units of the whole text.
    pub needed_units: usize,
    /// Units allowed per piece.
    pub max_units: usize,
    /// Pieces allowed.
    pub max_parts: usize,
}

/// Splits `text` into at most `max_parts` pieces of at most `max_units` UTF-16 code units
/// each (LINE counts text length this way: developers.line.biz, "text character count"),
/// cutting only between grapheme clusters. Within a piece's last fifth, a cut after a
/// line break, or else after a space, is preferred, so words of spaced scripts stay whole.
/// Text that fits is returned as one piece; empty text as one empty piece.
///
/// # Errors
/// [`TooLong`] when more than `max_parts` pieces would be needed (or a single grapheme
/// cluster is longer than `max_units`, which no split can fix).
pub fn split_utf16(text: &str, max_units: usize, max_parts: usize) -> Result<Vec<String>, TooLong> {
    let total: usize = text.encode_utf16().count();
    let too_long = TooLong {
        needed_units: total,
        max_units,
        max_parts,
    };
    if total <= max_units {
        return Ok(vec![text.to_string()]);
    }
    let mut parts: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut units = 0usize;
    // Byte offset in `current` just after the last preferred break and its kind.
    let mut newline_cut: Option<usize> = None;
    let mut space_cut: Option<usize> = None;
    for g in text.graphemes(true) {
        let g_units = g.encode_utf16().count();
        if g_units > max_units {
            return Err(too_long);
        }
        if units + g_units > max_units {
            let floor = max_units - max_units / 5;
            let cut = newline_cut
                .filter(|&b| current[..b].encode_utf16().count() >= floor)
                .or(space_cut.filter(|&b| current[..b].encode_utf16().count() >= floor))
                .unwrap_or(current.len());
            let rest = current.split_off(cut);
            parts.push(std::mem::replace(&mut current, rest));
            if parts.len() >= max_parts {
                return Err(too_long);
            }
            units = current.encode_utf16().count();
            newline_cut = None;
            space_cut = None;
        }
        current.push_str(g);
        units += g_units;
        if g == "\n" || g == "\r\n" {
            newline_cut = Some(current.len());
        } else if g.chars().all(char::is_whitespace) {
            space_cut = Some(current.len());
        }
    }
    if !current.is_empty() {
        parts.push(current);
    }
    if parts.len() > max_parts {
        return Err(too_long);
    }
    Ok(parts)
}

/// The longest version of `text` that `fits` accepts: `text` itself, or else the longest
/// prefix of whole grapheme clusters followed by [`ELLIPSIS`]. `fits` is called O(log n)
/// times (binary search over the grapheme count) and must be monotonic: a shorter text
/// fits whenever a longer one does. `None` when even the ellipsis alone does not fit.
pub fn shorten_to_fit(text: &str, fits: impl Fn(&str) -> bool) -> Option<String> {
    if fits(text) {
        return Some(text.to_string());
    }
    let bounds: Vec<usize> = text.grapheme_indices(true).map(|(i, _)| i).collect();
    let candidate = |n: usize| -> String {
        let end = bounds.get(n).copied().unwrap_or(text.len());
        format!("{}{ELLIPSIS}", text[..end].trim_end())
    };
    // Largest n in 0..len with candidate(n) fitting.
    let (mut lo, mut hi) = (0usize, bounds.len());
    if !fits(&candidate(0)) {
        return None;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(&candidate(mid)) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(candidate(lo))
}

#[cfg(test)]
mod tests {
    use super::*;

    const THAI: &str = "ขอบคุณที่ใช้บริการ"; // has combining vowels and tone marks

    fn starts_with_combining_mark(s: &str) -> bool {
        s.chars().next().is_some_and(
            |c| matches!(c, '\u{0E31}' | '\u{0E34}'..='\u{0E3A}' | '\u{0E47}'..='\u{0E4E}'),
        )
    }

    #[test]
    fn short_text_is_one_piece() {
        assert_eq!(split_utf16("สวัสดี", 5000, 5).unwrap(), vec!["สวัสดี"]);
        assert_eq!(split_utf16("", 5000, 5).unwrap(), vec![""]);
    }

    #[test]
    fn long_thai_splits_on_grapheme_boundaries_and_round_trips() {
        let text = THAI.repeat(700); // 12,600 UTF-16 units
        let parts = split_utf16(&text, 5000, 5).unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.concat(), text, "nothing lost or added");
        for p in &parts {
            assert!(p.encode_utf16().count() <= 5000);
            assert!(
                !starts_with_combining_mark(p),
                "a piece starts with a mark: {:?}",
                &p[..12]
            );
        }
    }

    #[test]
    fn surrogate_pairs_and_emoji_sequences_are_never_split() {
        // 4 units per family emoji part pair; make the limit land inside one.
        let text = "👨‍👩‍👧".repeat(10); // each cluster: 8 UTF-16 units
        let parts = split_utf16(&text, 12, 10).unwrap();
        assert_eq!(parts.concat(), text);
        assert!(parts.iter().all(|p| p == "👨‍👩‍👧"), "{parts:?}");
        let parts = split_utf16(&"😀".repeat(5), 3, 5).unwrap();
        assert_eq!(parts, vec!["😀"; 5]);
    }

    #[test]
    fn a_line_break_near_the_end_is_preferred() {
        let text = format!("{}\n{}", "a".repeat(90), "b".repeat(50));
        let parts = split_utf16(&text, 100, 5).unwrap();
        assert_eq!(parts[0], format!("{}\n", "a".repeat(90)));
        assert_eq!(parts[1], "b".repeat(50));
    }

    #[test]
    fn more_than_the_allowed_pieces_is_an_error() {
        let text = THAI.repeat(1500); // 27,000 units > 5 x 5,000
        let e = split_utf16(&text, 5000, 5).unwrap_err();
        assert_eq!(e.needed_units, 27_000);
        assert!(
            split_utf16(&"😀".repeat(3), 1, 5).is_err(),
            "a pair cannot fit in 1 unit"
        );
    }

    #[test]
    fn shortening_keeps_whole_graphemes_and_adds_an_ellipsis() {
        let text = THAI.repeat(10);
        let out = shorten_to_fit(&text, |s| s.len() <= 100).unwrap();
        assert!(out.len() <= 100);
        assert!(out.ends_with(ELLIPSIS));
        let kept = out.trim_end_matches(ELLIPSIS);
        assert!(text.starts_with(kept));
        // Whole clusters: the kept prefix ends on a grapheme boundary of the input.
        assert!(text.grapheme_indices(true).any(|(i, _)| i == kept.len()));
        // The longest such prefix: one more cluster would not fit.
        let next = text[kept.len()..].graphemes(true).next().unwrap();
        assert!(format!("{kept}{next}{ELLIPSIS}").len() > 100);
    }

    #[test]
    fn shortening_returns_fitting_text_unchanged_and_none_when_nothing_fits() {
        assert_eq!(shorten_to_fit("short", |s| s.len() <= 10).unwrap(), "short");
        assert_eq!(shorten_to_fit("long text", |s| s.len() <= 2), None);
    }
}
