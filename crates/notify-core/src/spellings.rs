//! A person's data found in text however it is spelt, for `EraseRecipient`
//! (`notify_store::erasure`): the same name or address may be stored composed (NFC) or
//! decomposed (NFD, `e` + U+0301), in another case (`SOMCHAI@EXAMPLE.TEST`), or inside JSON
//! text that escapes it (`\u0e2a\u0e21`, `\"`), and each spelling must go. Postgres cannot
//! match across these (its `lower()` depends on the database's locale and it has no case
//! folding), so the matching is done here, in memory, on rows the store reads in batches.
//!
//! The rule: the text is put in NFC, every JSON escape in it (`\u0e2a`, a surrogate pair,
//! `\"`) read as the character it stands for, and every character case-folded (its
//! uppercase lowercased, so `ß` matches `SS` and `ς` matches `Σ`); each needle is folded
//! the same way from its NFC and from its NFD form (escaped decomposed text reads as NFD).
//! A match covers whole characters of the text (a needle never takes half of a `ß`, nor
//! `e` of an `é`), and each matched stretch, escapes included, becomes [`ERASED`]. A text
//! with no match is left as it is, byte for byte; one with a match is returned in NFC.

use unicode_normalization::UnicodeNormalization;

/// What replaces a person's data that is kept for counts.
pub const ERASED: &str = "[erased]";

/// Needles shorter than this (in characters, folded) are ignored: they would match
/// everywhere.
pub const MIN_NEEDLE_CHARS: usize = 3;

/// The needles (email, LINE id, display name, tokens) in every spelling looked for,
/// folded. Build once per erasure with [`Spellings::new`].
#[derive(Debug, Clone, Default)]
pub struct Spellings {
    /// Folded spellings, longest first, deduplicated, each at least
    /// [`MIN_NEEDLE_CHARS`] long.
    forms: Vec<Vec<char>>,
}

impl Spellings {
    /// Every spelling of every needle (blank and short ones dropped).
    pub fn new<S: AsRef<str>>(needles: impl IntoIterator<Item = S>) -> Spellings {
        let mut forms: Vec<Vec<char>> = Vec::new();
        for needle in needles {
            let needle = needle.as_ref().trim();
            if needle.is_empty() {
                continue;
            }
            let nfc: String = needle.nfc().collect();
            let nfd: String = needle.nfd().collect();
            for spelt in [nfc, nfd] {
                let mut folded = Vec::with_capacity(spelt.len());
                for c in spelt.chars() {
                    fold(c, &mut folded);
                }
                if folded.len() >= MIN_NEEDLE_CHARS {
                    forms.push(folded);
                }
            }
        }
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Spellings { forms }
    }

    /// Whether there is nothing to look for.
    pub fn is_empty(&self) -> bool {
        self.forms.is_empty()
    }

    /// `text` with every spelling of every needle replaced by [`ERASED`], in NFC; `None`
    /// when nothing matched (the text is then to be left as it is).
    pub fn redact_text(&self, text: &str) -> Option<String> {
        if self.forms.is_empty() || text.is_empty() {
            return None;
        }
        let nfc: std::borrow::Cow<'_, str> = if unicode_normalization::is_nfc(text) {
            text.into()
        } else {
            text.nfc().collect::<String>().into()
        };
        // The folded text, each folded character with the byte range of the character of
        // `nfc` it came from (a JSON escape counts as the one character it stands for) and
        // whether it starts / ends that character's folding.
        let mut folded: Vec<char> = Vec::with_capacity(nfc.len());
        let mut origin: Vec<(usize, usize, bool, bool)> = Vec::with_capacity(nfc.len());
        let mut at = 0;
        while at < nfc.len() {
            let (c, len) = json_escape_at(&nfc[at..]).unwrap_or_else(|| {
                let c = nfc[at..].chars().next().expect("at a character boundary");
                (c, c.len_utf8())
            });
            let from = folded.len();
            fold(c, &mut folded);
            let to = folded.len();
            for k in from..to {
                origin.push((at, at + len, k == from, k + 1 == to));
            }
            at += len;
        }
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for form in &self.forms {
            let m = form.len();
            if m > folded.len() {
                continue;
            }
            let mut p = 0;
            while p + m <= folded.len() {
                if folded[p] == form[0]
                    && origin[p].2
                    && origin[p + m - 1].3
                    && folded[p..p + m] == form[..]
                {
                    spans.push((origin[p].0, origin[p + m - 1].1));
                    p += m;
                } else {
                    p += 1;
                }
            }
        }
        if spans.is_empty() {
            return None;
        }
        spans.sort_unstable();
        let mut out = String::with_capacity(nfc.len());
        let mut copied = 0;
        let mut iter = spans.into_iter().peekable();
        while let Some((start, mut end)) = iter.next() {
            // Overlapping matches (a name inside an address) become one.
            while let Some(&(s, e)) = iter.peek() {
                if s >= end {
                    break;
                }
                end = end.max(e);
                iter.next();
            }
            out.push_str(&nfc[copied..start]);
            out.push_str(ERASED);
            copied = end;
        }
        out.push_str(&nfc[copied..]);
        Some(out)
    }

    /// `json` (JSON text, as Postgres prints a `jsonb`) with [`Spellings::redact_text`]
    /// applied to every string in it, keys included, each decoded first (so an escaped
    /// spelling in the JSON itself is found) and written back escaped: the result is
    /// valid JSON whenever the input is, numbers and structure untouched. `None` when
    /// nothing matched. A string that does not decode is left as it is.
    pub fn redact_json(&self, json: &str) -> Option<String> {
        if self.forms.is_empty() {
            return None;
        }
        let bytes = json.as_bytes();
        let mut out = String::new();
        let (mut copied, mut i, mut changed) = (0, 0, false);
        while i < bytes.len() {
            if bytes[i] != b'"' {
                i += 1;
                continue;
            }
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            let end = (i + 1).min(bytes.len());
            i = end;
            let literal = &json[start..end];
            let Ok(decoded) = serde_json::from_str::<String>(literal) else {
                continue;
            };
            if let Some(redacted) = self.redact_text(&decoded) {
                out.push_str(&json[copied..start]);
                out.push_str(&serde_json::Value::String(redacted).to_string());
                copied = end;
                changed = true;
            }
        }
        if !changed {
            return None;
        }
        out.push_str(&json[copied..]);
        Some(out)
    }
}

/// Appends the case folding of `c`: its uppercase, lowercased (close to Unicode's full
/// case folding without a table: `ß` -> `ss`, `ſ` -> `s`, `ς` -> `σ`, `ﬁ` -> `fi`).
fn fold(c: char, out: &mut Vec<char>) {
    if c.is_ascii() {
        out.push(c.to_ascii_lowercase());
        return;
    }
    for u in c.to_uppercase() {
        out.extend(u.to_lowercase());
    }
}

/// The character a JSON escape at the start of `s` stands for, and the escape's length
/// in bytes: `\uXXXX` (a UTF-16 surrogate pair as one character), `\"`, `\\`, `\/`,
/// `\b`, `\f`, `\n`, `\r`, `\t` (RFC 8259 section 7). `None` when `s` does not start with
/// one (a lone surrogate included): the backslash is then a character of its own.
fn json_escape_at(s: &str) -> Option<(char, usize)> {
    let b = s.as_bytes();
    if b.first() != Some(&b'\\') {
        return None;
    }
    let hex4 = |from: usize| -> Option<u32> {
        let digits = s.get(from..from + 4)?;
        if !digits.bytes().all(|d| d.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(digits, 16).ok()
    };
    let simple = match b.get(1)? {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let unit = hex4(2)?;
            return match unit {
                0xD800..=0xDBFF => {
                    if s.get(6..8)? != "\\u" {
                        return None;
                    }
                    let low = hex4(8)?;
                    if !(0xDC00..=0xDFFF).contains(&low) {
                        return None;
                    }
                    let c = char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))?;
                    Some((c, 12))
                }
                0xDC00..=0xDFFF => None,
                _ => Some((char::from_u32(unit)?, 6)),
            };
        }
        _ => return None,
    };
    Some((simple, 2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `s` as it appears inside a JSON string, with `ascii` every non-ASCII character as
    /// `\uXXXX` (UTF-16), as `ensure_ascii` serialisers write it.
    fn json_escaped(s: &str, ascii: bool) -> String {
        let quoted = serde_json::Value::String(s.to_string()).to_string();
        let inner = &quoted[1..quoted.len() - 1];
        let mut out = String::new();
        for c in inner.chars() {
            if c.is_ascii() || !ascii {
                out.push(c);
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
        out
    }

    const NAME: &str = "สมหญิง José Erasewoman";
    const EMAIL: &str = "Jose.E@Erase.Example.test";

    fn spellings() -> Spellings {
        Spellings::new([NAME, EMAIL, "U1234567890abcdef"])
    }

    /// Every spelling the erasure promises to find, of `s`.
    fn every_spelling(s: &str) -> Vec<String> {
        let nfc: String = s.nfc().collect();
        let nfd: String = s.nfd().collect();
        let mut v = vec![
            nfc.clone(),
            nfd.clone(),
            nfc.to_uppercase(),
            nfd.to_uppercase(),
            nfc.to_lowercase(),
            json_escaped(&nfc, true),
            json_escaped(&nfd, true),
            // Upper-case hexadecimal digits (`\u0E2A`).
            json_escaped(&nfc, true)
                .replace("\\u", "\u{1}")
                .to_uppercase()
                .replace('\u{1}', "\\u"),
            json_escaped(&nfc.to_uppercase(), true),
        ];
        v.dedup();
        v
    }

    #[test]
    fn every_spelling_of_a_name_and_an_address_is_replaced() {
        let s = spellings();
        for needle in [NAME, EMAIL] {
            for spelt in every_spelling(needle) {
                let text = format!("ก่อน {spelt} หลัง");
                let out = s
                    .redact_text(&text)
                    .unwrap_or_else(|| panic!("{spelt:?} found"));
                assert_eq!(out, "ก่อน [erased] หลัง", "{spelt:?}");
            }
        }
    }

    #[test]
    fn text_without_a_needle_is_left_byte_for_byte_even_when_not_nfc() {
        let s = spellings();
        assert_eq!(s.redact_text("Jose\u{301} Other"), None);
        assert_eq!(s.redact_text(""), None);
        // A needle's prefix is not the needle: "José" alone is not the whole name.
        assert_eq!(s.redact_text("José"), None);
    }

    #[test]
    fn a_match_covers_whole_characters_only() {
        let s = Spellings::new(["strasse"]);
        assert_eq!(s.redact_text("Straße 5").as_deref(), Some("[erased] 5"));
        assert_eq!(s.redact_text("STRASSE").as_deref(), Some("[erased]"));
        // An `e` with its accent is not an `e`: the needle "cafe" is not in "café".
        assert_eq!(Spellings::new(["cafe"]).redact_text("café"), None);
    }

    #[test]
    fn overlapping_needles_leave_nothing_of_either() {
        let s = Spellings::new(["somchai", "somchai@x.example"]);
        assert_eq!(
            s.redact_text("to SOMCHAI@X.EXAMPLE, hi Somchai").as_deref(),
            Some("to [erased], hi [erased]")
        );
    }

    #[test]
    fn escapes_beyond_the_basic_plane_and_in_upper_case_hex_are_read() {
        let s = Spellings::new(["Nok 🐦 Bird"]);
        assert_eq!(
            s.redact_text(r#"{"n":"NOK \uD83D\uDC26 BIRD"}"#).as_deref(),
            Some(r#"{"n":"[erased]"}"#)
        );
        // A lone surrogate is no character: the text is left.
        assert_eq!(s.redact_text(r"Nok \ud83d Bird"), None);
    }

    #[test]
    fn short_and_blank_needles_are_ignored() {
        let s = Spellings::new(["", "  ", "ab"]);
        assert!(s.is_empty());
        assert_eq!(s.redact_text("ab ab"), None);
    }

    #[test]
    fn json_strings_are_decoded_redacted_and_written_back_as_valid_json() {
        let s = spellings();
        let nfd: String = NAME.nfd().collect();
        let doc = serde_json::json!({
            "greeting": format!("Hello {nfd}!"),
            EMAIL.to_uppercase(): 1.50,
            "nested": [{"raw": format!("{{\"name\": \"{}\"}}", json_escaped(NAME, true))}],
            "n": 12345678901234567890u64,
            "keep": "nothing here \"quoted\" \\ ok",
        });
        let text = doc.to_string();
        let out = s.redact_json(&text).expect("changed");
        let back: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        assert_eq!(back["greeting"], "Hello [erased]!");
        assert_eq!(back["[erased]"], 1.50);
        assert_eq!(back["nested"][0]["raw"], "{\"name\": \"[erased]\"}");
        assert_eq!(back["n"], 12345678901234567890u64);
        assert_eq!(back["keep"], doc["keep"]);
        assert_eq!(s.redact_json(r#"{"a": "b", "c": [1, 2]}"#), None);
    }

    #[test]
    fn a_needle_with_quotes_is_found_in_json_text_that_escapes_them() {
        let s = Spellings::new([r#"Bob "the" Builder"#]);
        let body = serde_json::json!({"name": r#"Bob "the" Builder"#}).to_string();
        // As a provider's raw answer, stored as text.
        assert_eq!(
            s.redact_text(&body).as_deref(),
            Some(r#"{"name":"[erased]"}"#)
        );
    }

    proptest! {
        #[test]
        fn no_spelling_survives_inside_any_text(
            before in "\\PC{0,20}",
            after in "\\PC{0,20}",
            which in 0usize..9,
            needle in 0usize..2,
        ) {
            let s = spellings();
            let n = [NAME, EMAIL][needle];
            let forms = every_spelling(n);
            let spelt = &forms[which % forms.len()];
            // Spaces around it: a combining mark right after it would make another
            // character of its last one (`n` + U+0301 is `ń`), which is not the needle.
            let text = format!("{before} {spelt} {after}");
            let out = s.redact_text(&text).expect("found");
            for form in every_spelling(n) {
                prop_assert!(!out.contains(&form), "{form:?} in {out:?}");
            }
            prop_assert_eq!(s.redact_text(&out), None, "nothing left to find in {}", out);
        }

        #[test]
        fn json_stays_valid(key in "\\PC{0,12}", value in "\\PC{0,12}", needle in 0usize..2) {
            let s = spellings();
            let n = [NAME, EMAIL][needle];
            let doc = serde_json::json!({ key.clone(): format!("{value} {n} {value}"), "k": [key, value] });
            let out = s.redact_json(&doc.to_string()).expect("found");
            let back: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
            prop_assert!(!back.to_string().contains(n));
        }
    }
}
