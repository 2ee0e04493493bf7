//! Text that must fit a provider's limits, cut where a reader would cut it.
//!
//! Cuts fall on word boundaries: Unicode UAX #29 word boundaries from ICU4X's
//! `icu_segmenter` ([`WordSegmenter::new_dictionary`] with its compiled data), which for
//! Thai, Lao, Khmer, Burmese, Chinese and Japanese (scripts written without spaces) finds
//! the words with ICU's dictionaries, not a word list of ours. So a Thai cut never leaves a
//! leading vowel (เ แ โ ใ ไ) without its consonant (`…แจ้งเ…` becomes `…แจ้ง…`), and an
//! English word is not cut while a space is in reach.
//!
//! Only a word longer than a whole piece (the `max_units` of [`split_utf16`], the whole
//! budget of [`shorten_to_fit`]) is cut inside, and then between extended grapheme
//! clusters (UAX #29, through the `unicode-segmentation` crate): a Thai vowel or tone mark
//! never starts a piece, a surrogate pair (in UTF-16 terms) is never split and an emoji
//! sequence stays whole. Every word boundary used is also a grapheme boundary.
//!
//! The segmenter is built once per process ([`LazyLock`]); its data is compiled in.

use std::sync::LazyLock;

use icu_segmenter::options::WordBreakInvariantOptions;
use icu_segmenter::{WordSegmenter, WordSegmenterBorrowed};
use unicode_segmentation::UnicodeSegmentation;

#[cfg(test)]
mod tests;

/// The ellipsis appended to shortened text (U+2026, 3 UTF-8 bytes).
pub const ELLIPSIS: &str = "\u{2026}";

/// UAX #29 word segmentation with ICU's compiled dictionaries for complex scripts.
static WORDS: LazyLock<WordSegmenterBorrowed<'static>> =
    LazyLock::new(|| WordSegmenter::new_dictionary(WordBreakInvariantOptions::default()));

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

/// The words of `text` in order, concatenating to `text`: the pieces between consecutive
/// word boundaries (see the module doc), spaces and punctuation being pieces of their own.
/// `"ขอบคุณที่ใช้บริการ"` gives `["ขอบคุณ", "ที่", "ใช้", "บริการ"]`. Empty text gives none.
pub fn words(text: &str) -> Vec<&str> {
    let bounds: Vec<usize> = cuts(text)
        .into_iter()
        .filter(|c| c.is_word)
        .map(|c| c.byte)
        .collect();
    bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

/// A grapheme cluster boundary of the text being cut.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// Byte offset in the text.
    byte: usize,
    /// UTF-16 code units before `byte`.
    units: usize,
    /// Whether this is also a word boundary (the start and the end of the text are).
    is_word: bool,
}

/// Every grapheme boundary of `text` (with 0 and `text.len()`), marked where it is also a
/// word boundary.
fn cuts(text: &str) -> Vec<Cut> {
    let mut word_bounds = WORDS.segment_str(text).peekable();
    let mut out = Vec::with_capacity(text.len() / 3 + 2);
    let mut units = 0usize;
    let ends = text
        .grapheme_indices(true)
        .chain(std::iter::once((text.len(), "")));
    for (byte, g) in ends {
        while word_bounds.next_if(|&w| w < byte).is_some() {}
        let is_word = word_bounds.next_if_eq(&byte).is_some() || byte == 0 || byte == text.len();
        out.push(Cut {
            byte,
            units,
            is_word,
        });
        units += g.encode_utf16().count();
    }
    out
}

/// Splits `text` into at most `max_parts` pieces of at most `max_units` UTF-16 code units
/// each (LINE counts text length this way: developers.line.biz, "text character count"),
/// cutting only at word boundaries (see the module doc). Within a piece's last fifth, a cut
/// after a line break, or else after a space, is preferred; otherwise the piece ends at its
/// last word boundary, and a word longer than `max_units` is cut between grapheme clusters
/// at the limit. The pieces concatenate to `text`. Text that fits is returned as one piece;
/// empty text as one empty piece.
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
    let cuts = cuts(text);
    let ends_with =
        |c: &Cut, p: fn(char) -> bool| text[..c.byte].chars().next_back().is_some_and(p);
    let mut parts: Vec<String> = Vec::new();
    let mut start = 0usize; // index into `cuts`
    while start + 1 < cuts.len() {
        if parts.len() >= max_parts {
            return Err(too_long);
        }
        let base = cuts[start].units;
        // The furthest grapheme boundary within the limit.
        let limit = start + cuts[start..].partition_point(|c| c.units - base <= max_units) - 1;
        if limit == cuts.len() - 1 {
            parts.push(text[cuts[start].byte..].to_string());
            break;
        }
        if limit == start {
            return Err(too_long); // one grapheme cluster is longer than a piece
        }
        let floor = base + max_units - max_units / 5;
        let last_word = |p: &dyn Fn(&Cut) -> bool| {
            (start + 1..=limit)
                .rev()
                .find(|&i| cuts[i].is_word && p(&cuts[i]))
        };
        let preferred = |ch: fn(char) -> bool| {
            last_word(&|c| c.units >= floor && ends_with(c, ch)).filter(|&i| i > start)
        };
        let end = preferred(|c| c == '\n')
            .or_else(|| preferred(char::is_whitespace))
            .or_else(|| {
                // The word that crosses the limit goes whole to the next piece when it fits
                // in one; else it is cut here, between grapheme clusters.
                let word_start = last_word(&|_| true).unwrap_or(start);
                let word_end = (limit + 1..cuts.len())
                    .find(|&i| cuts[i].is_word)
                    .unwrap_or(cuts.len() - 1);
                let fits_a_piece = cuts[word_end].units - cuts[word_start].units <= max_units;
                (word_start > start && fits_a_piece).then_some(word_start)
            })
            .unwrap_or(limit);
        parts.push(text[cuts[start].byte..cuts[end].byte].to_string());
        start = end;
    }
    Ok(parts)
}

/// The longest version of `text` that `fits` accepts: `text` itself, or else the longest
/// prefix of whole words followed by [`ELLIPSIS`] (trailing whitespace dropped before it).
/// Only when the first word that does not fit would not fit even alone (a word longer than
/// the whole budget, such as a long URL) is it cut, between grapheme clusters. `fits` is
/// called O(log n) times (binary searches over the word and grapheme boundaries) and must
/// be monotonic: a shorter text fits whenever a longer one does. `None` when even the
/// ellipsis alone does not fit.
pub fn shorten_to_fit(text: &str, fits: impl Fn(&str) -> bool) -> Option<String> {
    if fits(text) {
        return Some(text.to_string());
    }
    let cuts = cuts(text);
    let with_ellipsis = |s: &str| format!("{}{ELLIPSIS}", s.trim_end());
    let candidate = |i: usize| with_ellipsis(&text[..cuts[i].byte]);
    if !fits(&candidate(0)) {
        return None;
    }
    // Largest index in `among` (ascending indices into `cuts`, the first known to fit)
    // whose candidate fits.
    let largest_fitting = |among: &[usize]| -> usize {
        let (mut lo, mut hi) = (0usize, among.len());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(&candidate(among[mid])) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        among[lo]
    };
    // The whole text does not fit, so the last boundary is left out of both searches.
    let word_cuts: Vec<usize> = (0..cuts.len() - 1).filter(|&i| cuts[i].is_word).collect();
    let kept = largest_fitting(&word_cuts);
    let next_word = (kept + 1..cuts.len())
        .find(|&i| cuts[i].is_word)
        .unwrap_or(cuts.len() - 1);
    let word = &text[cuts[kept].byte..cuts[next_word].byte];
    if kept > 0 && fits(&with_ellipsis(word)) {
        return Some(candidate(kept));
    }
    // A word longer than the budget: whole grapheme clusters of it.
    let inside: Vec<usize> = (kept..next_word).collect();
    Some(candidate(largest_fitting(&inside)))
}
