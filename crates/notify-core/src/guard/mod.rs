//! The sensitive-data guard: finds values that must not be stored in an event's payload or
//! text (payloads are kept for months and rendered into email), and masks them when the
//! type's policy allows storing a masked copy.
//!
//! What it finds:
//! - **Thai national id numbers**: 13 digits whose last digit is the check digit
//!   (weights 13 down to 2 over the first 12 digits, check = (11 − sum mod 11) mod 10),
//!   written with or without `-` or space separators (`1-1037-00123-45-6`), in ASCII or
//!   Thai digits (๐–๙);
//! - **payment card numbers**: 13 to 19 digits passing the Luhn check (ISO/IEC 7812-1),
//!   with or without separators;
//! - **obvious secrets**: PEM private key blocks (`-----BEGIN … PRIVATE KEY-----`,
//!   RFC 7468), HTTP bearer credentials (`Bearer <token>`, RFC 6750), JSON Web Tokens,
//!   and any non-empty value under a field named like a password or secret
//!   ([`SECRET_FIELDS`]).
//!
//! A finding carries the field path and the kind, never the value, so it can be returned
//! to the caller and logged without leaking what it found.

mod mask;
mod reader;
#[cfg(test)]
mod tests;

pub use mask::{mask_json, mask_text};
pub use reader::{html_text, percent_decoded};
use serde_json::Value;

/// What kind of sensitive value was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A Thai national id number with a valid check digit.
    ThaiNationalId,
    /// A Luhn-valid payment card number of 13 to 19 digits.
    PaymentCard,
    /// A PEM private key block.
    PrivateKey,
    /// An HTTP bearer credential or a JSON Web Token.
    BearerToken,
    /// A value under a password- or secret-like field name.
    SecretField,
}

impl Kind {
    /// The rule, as told to the caller (no value included).
    pub fn describe(self) -> &'static str {
        match self {
            Kind::ThaiNationalId => {
                "contains a Thai national id number (13 digits with a valid check digit)"
            }
            Kind::PaymentCard => "contains a payment card number (13 to 19 digits, Luhn-valid)",
            Kind::PrivateKey => "contains a private key block",
            Kind::BearerToken => "contains a bearer token or JSON Web Token",
            Kind::SecretField => "is a password or secret field",
        }
    }
}

/// One finding: where (a field path such as `payload.customer.id_card` or
/// `content.body`) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Field path.
    pub path: String,
    /// What was found there.
    pub kind: Kind,
}

/// Field names (compared after NFKC, lowercase, without `_`, `-`, `.`, spaces and
/// invisible characters) whose values are secrets whatever they look like: a name
/// equal to one of these, containing one of [`SECRET_FIELD_PARTS`], or ending in `pass`,
/// `pwd` or `token`.
pub const SECRET_FIELDS: &[&str] = &["pin", "cvv", "cvv2", "cvc", "cvc2", "auth"];

/// Parts that make any field name a secret's (`user_password`, `clientSecret`,
/// `db_credentials`, `refresh_token`, …).
pub const SECRET_FIELD_PARTS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "apikey",
    "accesstoken",
    "refreshtoken",
    "idtoken",
    "authtoken",
    "bearertoken",
    "privatekey",
    "credential",
    "cardpin",
];

/// Whether `name` names a secret (see [`SECRET_FIELDS`] and [`SECRET_FIELD_PARTS`]).
pub fn is_secret_field(name: &str) -> bool {
    use unicode_normalization::UnicodeNormalization;
    let norm: String = name
        .nfkc()
        .filter(|c| !matches!(c, '_' | '-' | '.' | ' ' | ':') && !is_ignorable(*c))
        .flat_map(char::to_lowercase)
        .collect();
    SECRET_FIELDS.contains(&norm.as_str())
        || SECRET_FIELD_PARTS.iter().any(|p| norm.contains(p))
        || ["pass", "pwd", "token"].iter().any(|t| norm.ends_with(t))
}

/// Characters that render as nothing (zero-width, joiners, soft hyphen, BOM).
fn is_ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}' | '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}'
    )
}

/// The Thai national id check: 13 digits, check digit = (11 − Σ dᵢ·(13 − i) mod 11) mod 10
/// over the first 12 digits (i from 0).
pub fn thai_id_valid(digits: &[u8]) -> bool {
    if digits.len() != 13 || digits.iter().any(|d| *d > 9) {
        return false;
    }
    let sum: u32 = digits[..12]
        .iter()
        .enumerate()
        .map(|(i, d)| u32::from(*d) * (13 - i as u32))
        .sum();
    (11 - sum % 11) % 10 == u32::from(digits[12])
}

/// The Luhn check (ISO/IEC 7812-1) over 13 to 19 digits.
pub fn luhn_valid(digits: &[u8]) -> bool {
    if !(13..=19).contains(&digits.len()) || digits.iter().any(|d| *d > 9) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(*d);
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 { x - 9 } else { x }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// The value of a decimal digit in ASCII, Thai, fullwidth, Arabic-Indic, extended
/// Arabic-Indic, Devanagari, Lao, Myanmar or Khmer script.
fn digit(c: char) -> Option<u8> {
    let zero = match c {
        '0'..='9' => '0',
        '\u{0E50}'..='\u{0E59}' => '\u{0E50}',
        '\u{FF10}'..='\u{FF19}' => '\u{FF10}',
        '\u{0660}'..='\u{0669}' => '\u{0660}',
        '\u{06F0}'..='\u{06F9}' => '\u{06F0}',
        '\u{0966}'..='\u{096F}' => '\u{0966}',
        '\u{0ED0}'..='\u{0ED9}' => '\u{0ED0}',
        '\u{1040}'..='\u{1049}' => '\u{1040}',
        '\u{17E0}'..='\u{17E9}' => '\u{17E0}',
        _ => return None,
    };
    Some((c as u32 - zero as u32) as u8)
}

/// Characters people put between the digit groups of an id or a card number.
fn is_separator(c: char) -> bool {
    matches!(
        c,
        '-' | ' ' | '.' | '/' | '_' | '\u{00A0}' | '\u{2010}'
            ..='\u{2015}'
                | '\u{2212}'
                | '\u{202F}'
                | '\u{3000}'
                | '\u{FF0D}'
                | '\u{FF0E}'
                | '\u{FF0F}'
    ) || is_ignorable(c)
}

/// A group of digits without separators: byte range and digits.
struct Group {
    start: usize,
    end: usize,
    digits: Vec<u8>,
}

/// Runs of digit groups joined by single `-` or space separators.
fn digit_runs(text: &str) -> Vec<Vec<Group>> {
    let mut runs = Vec::new();
    let mut cur: Vec<Group> = Vec::new();
    let mut after_sep = 0u8;
    let mut in_group = false;
    for (i, c) in text.char_indices() {
        if let Some(d) = digit(c) {
            if in_group && let Some(g) = cur.last_mut() {
                g.digits.push(d);
                g.end = i + c.len_utf8();
            } else {
                cur.push(Group {
                    start: i,
                    end: i + c.len_utf8(),
                    digits: vec![d],
                });
            }
            in_group = true;
            after_sep = 0;
        } else if is_ignorable(c) && in_group {
            // Invisible: the group goes on.
        } else if is_separator(c) && !cur.is_empty() && after_sep < 2 {
            after_sep += 1;
            in_group = false;
        } else {
            // Anything else, or a third separator in a row, ends the run.
            if !cur.is_empty() {
                runs.push(std::mem::take(&mut cur));
            }
            after_sep = 0;
            in_group = false;
        }
    }
    if !cur.is_empty() {
        runs.push(cur);
    }
    runs
}

/// The kind of a digit sequence, if sensitive. Thai id first: a 13-digit number that
/// passes both checks is reported as an id.
fn digits_kind(digits: &[u8]) -> Option<Kind> {
    if thai_id_valid(digits) {
        Some(Kind::ThaiNationalId)
    } else if luhn_valid(digits) {
        Some(Kind::PaymentCard)
    } else {
        None
    }
}

/// A sensitive number in a text: byte range, kind and how many digits it has.
struct Span {
    start: usize,
    end: usize,
    kind: Kind,
    digits: usize,
}

/// Sensitive numbers: a whole run of groups, or else the leftmost windows of whole
/// groups with 13 to 19 digits that are sensitive (so two numbers separated by one space
/// are still found).
fn number_spans(text: &str) -> Vec<Span> {
    let mut out = Vec::new();
    for groups in digit_runs(text) {
        let all: Vec<u8> = groups.iter().flat_map(|g| g.digits.clone()).collect();
        if let Some(kind) = digits_kind(&all) {
            out.push(Span {
                start: groups[0].start,
                end: groups[groups.len() - 1].end,
                kind,
                digits: all.len(),
            });
            continue;
        }
        let mut a = 0;
        while a < groups.len() {
            let mut found = None;
            let mut digits: Vec<u8> = Vec::new();
            for (b, g) in groups.iter().enumerate().skip(a) {
                digits.extend(&g.digits);
                if digits.len() > 19 {
                    break;
                }
                if let Some(kind) = digits_kind(&digits) {
                    found = Some((b, kind, digits.len()));
                    break;
                }
            }
            match found {
                Some((b, kind, n)) => {
                    out.push(Span {
                        start: groups[a].start,
                        end: groups[b].end,
                        kind,
                        digits: n,
                    });
                    a = b + 1;
                }
                None => a += 1,
            }
        }
    }
    out
}

const PEM_BEGIN: &str = "-----begin ";
const PEM_KEY: &str = "private key-----";

/// Byte ranges of PEM private key blocks (to the matching END line, or the text's end),
/// in any letter case.
fn private_keys(text: &str) -> Vec<(usize, usize)> {
    // ASCII lowercasing keeps byte offsets.
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = lower[from..].find(PEM_BEGIN) {
        let start = from + pos;
        let line_end = lower[start..].find('\n').map_or(lower.len(), |n| start + n);
        if lower[start..line_end].contains(PEM_KEY) {
            let end = lower[line_end..]
                .find("-----end ")
                .and_then(|n| {
                    let e = line_end + n;
                    lower[e..].find(PEM_KEY).map(|k| e + k + PEM_KEY.len())
                })
                .unwrap_or(lower.len());
            out.push((start, end));
            from = end;
        } else {
            from = line_end.max(start + PEM_BEGIN.len());
        }
        if from >= lower.len() {
            break;
        }
    }
    out
}

fn token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '+' | '/' | '=')
}

/// Byte ranges of bearer credentials (`Bearer`, then spaces, tabs or a colon, then 16 or
/// more token68 characters; the token only), of this platform's own API keys (`nk_…`)
/// and of JSON Web Tokens (`eyJ….eyJ….sig`).
fn bearer_tokens(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let lower = text.to_ascii_lowercase();
    let mut from = 0;
    while let Some(pos) = lower[from..].find("bearer") {
        let mut start = from + pos + "bearer".len();
        let gap: usize = text[start..]
            .chars()
            .take_while(|c| matches!(c, ' ' | '\t' | ':' | '\u{00A0}'))
            .map(char::len_utf8)
            .sum();
        start += gap;
        let len: usize = text[start..]
            .chars()
            .take_while(|c| token_char(*c))
            .map(char::len_utf8)
            .sum();
        if gap > 0 && len >= 16 {
            out.push((start, start + len));
        }
        // Step past at least one whole character (found by `make fuzz`: a byte step
        // landed inside a Cyrillic letter).
        let step = if len > 0 {
            len
        } else {
            text[start..].chars().next().map_or(1, char::len_utf8)
        };
        from = start + step;
        if from >= text.len() {
            break;
        }
    }
    let mut from = 0;
    while let Some(pos) = text[from..].find("nk_") {
        let start = from + pos;
        let len: usize = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
            .map(char::len_utf8)
            .sum();
        if len >= 40 && !out.iter().any(|(s, e)| *s <= start && start < *e) {
            out.push((start, start + len));
        }
        from = start + len.max(3);
    }
    let mut from = 0;
    while let Some(pos) = text[from..].find("eyJ") {
        let start = from + pos;
        let len: usize = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .map(char::len_utf8)
            .sum();
        let candidate = &text[start..start + len];
        let parts: Vec<&str> = candidate.split('.').collect();
        if parts.len() == 3
            && parts[1].starts_with("eyJ")
            && parts.iter().all(|p| p.len() >= 4)
            && !out.iter().any(|(s, e)| *s <= start && start < *e)
        {
            out.push((start, start + len));
        }
        from = start + len.max(3);
    }
    out
}

/// Kinds found in `text`, in order of first appearance, each once.
pub fn scan_text(text: &str) -> Vec<Kind> {
    let mut found: Vec<(usize, Kind)> = Vec::new();
    found.extend(number_spans(text).into_iter().map(|n| (n.start, n.kind)));
    found.extend(
        private_keys(text)
            .into_iter()
            .map(|(s, _)| (s, Kind::PrivateKey)),
    );
    found.extend(
        bearer_tokens(text)
            .into_iter()
            .map(|(s, _)| (s, Kind::BearerToken)),
    );
    found.sort_by_key(|(s, _)| *s);
    let mut kinds = Vec::new();
    for (_, k) in found {
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    kinds
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Findings in a JSON value under `path` (e.g. `payload`): strings and numbers are
/// scanned, object keys named like secrets flag their value (if not empty or null).
pub fn scan_json(path: &str, value: &Value) -> Vec<Finding> {
    let mut out = Vec::new();
    walk(path, value, &mut out);
    out
}

fn walk(path: &str, value: &Value, out: &mut Vec<Finding>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                // A key that is itself an id or a card is named masked.
                let key_kinds = scan_text(k);
                let shown = if key_kinds.is_empty() {
                    k.clone()
                } else {
                    mask_text(k)
                };
                let p = format!("{path}.{shown}");
                out.extend(key_kinds.into_iter().map(|kind| Finding {
                    path: p.clone(),
                    kind,
                }));
                if is_secret_field(k) && !is_empty_value(v) {
                    out.push(Finding {
                        path: p,
                        kind: Kind::SecretField,
                    });
                } else {
                    walk(&p, v, out);
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(&format!("{path}[{i}]"), v, out);
            }
        }
        other => {
            if let Some(text) = scalar_text(other) {
                out.extend(scan_text(&text).into_iter().map(|kind| Finding {
                    path: path.to_string(),
                    kind,
                }));
            }
        }
    }
}

/// Null, `""`, `[]` or `{}`: nothing secret to hide.
fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}
