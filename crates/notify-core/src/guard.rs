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

/// `value` with every finding of [`scan_json`] masked: a secret field's whole value
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

/// The text a reader sees in an HTML fragment: tags removed, character references
/// (`&#49;`, `&#x31;`, `&amp;` and the like) decoded. For scanning email HTML.
pub fn html_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    let mut decoded = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(pos) = rest.find('&') {
        decoded.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        let end = tail.find(';').filter(|e| *e <= 12);
        let reference = end.map(|e| &tail[1..e]);
        let ch = reference.and_then(|r| match r {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "nbsp" => Some('\u{00A0}'),
            _ => r
                .strip_prefix("#x")
                .or_else(|| r.strip_prefix("#X"))
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| r.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        });
        match (ch, end) {
            (Some(c), Some(e)) => {
                decoded.push(c);
                rest = &tail[e + 1..];
            }
            _ => {
                decoded.push('&');
                rest = &tail[1..];
            }
        }
    }
    decoded.push_str(rest);
    decoded
}

/// `text` with `%XX` escapes decoded (invalid UTF-8 replaced). For scanning URLs.
pub fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn digits(s: &str) -> Vec<u8> {
        s.chars().filter_map(digit).collect()
    }

    #[test]
    fn thai_ids_are_recognised_by_their_check_digit() {
        // 1-1037-00123-45-?: Σ = 1·13+1·12+0·11+3·10+7·9+0·8+0·7+1·6+2·5+3·4+4·3+5·2 = 168,
        // 168 mod 11 = 3, check = (11 − 3) mod 10 = 8.
        assert!(thai_id_valid(&digits("1103700123458")));
        assert!(!thai_id_valid(&digits("1103700123459")));
        assert!(!thai_id_valid(&digits("110370012345")));
        for text in [
            "1103700123458",
            "1-1037-00123-45-8",
            "1 1037 00123 45 8",
            "เลขประจำตัวประชาชน ๑๑๐๓๗๐๐๑๒๓๔๕๘ ค่ะ",
            "บัตร:1-1037-00123-45-8.",
            // Found by testing: dots, slashes, underscores, doubled or unusual spaces,
            // dashes, invisible characters, fullwidth and Arabic-Indic digits.
            "1.1037.00123.45.8",
            "1/1037/00123/45/8",
            "1_1037_00123_45_8",
            "1  1037  00123  45  8",
            "1\u{a0}1037\u{a0}00123\u{a0}45\u{a0}8",
            "1\u{2013}1037\u{2013}00123\u{2013}45\u{2013}8",
            "11037\u{ad}00123458",
            "110370\u{200b}0123458",
            "１１０３７００１２３４５８",
            "\u{661}\u{661}\u{660}\u{663}\u{667}\u{660}\u{660}\u{661}\u{662}\u{663}\u{664}\u{665}\u{668}",
        ] {
            assert_eq!(scan_text(text), vec![Kind::ThaiNationalId], "{text}");
        }
        for text in [
            "1103700123459",         // wrong check digit
            "order 1-1037-00123-45", // 12 digits
            "11037001234581",        // 14 digits (and not Luhn-valid)
            "1---1037-00123-45-8",   // three separators split it
            "tel 081-234-5678",
        ] {
            assert!(!scan_text(text).contains(&Kind::ThaiNationalId), "{text}");
        }
    }

    #[test]
    fn card_numbers_are_recognised_by_luhn() {
        for text in [
            "4111111111111111",
            "card 4111 1111 1111 1111 exp 12/29",
            "5500-0000-0000-0004",
            "บัตรเครดิต 378282246310005",
            "4111.1111.1111.1111",
        ] {
            assert_eq!(scan_text(text), vec![Kind::PaymentCard], "{text}");
        }
        assert!(scan_text("4111111111111112").is_empty());
        assert!(scan_text("411111111111").is_empty()); // 12 digits
        assert!(scan_text("order 1001 paid 1,250.00").is_empty());
        // Two numbers one space apart are each found.
        assert_eq!(
            scan_text("1103700123458 4111111111111111"),
            vec![Kind::ThaiNationalId, Kind::PaymentCard]
        );
        assert_eq!(
            mask_text("ref 12 4111 1111 1111 1111"),
            "ref 12 XXXX XXXX XXXX 1111"
        );
    }

    #[test]
    fn secrets_are_found() {
        let pem = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49\n-----END PRIVATE KEY-----";
        assert_eq!(scan_text(pem), vec![Kind::PrivateKey]);
        assert_eq!(
            scan_text("-----BEGIN EC PRIVATE KEY-----\nabc"),
            vec![Kind::PrivateKey]
        );
        assert!(scan_text("-----BEGIN CERTIFICATE-----\nabc").is_empty());
        assert_eq!(
            scan_text("Authorization: Bearer abcdefghijklmnop1234"),
            vec![Kind::BearerToken]
        );
        assert!(scan_text("a bearer of good news").is_empty());
        for t in [
            "Authorization: Bearer  abcdefghijklmnop1234",
            "Bearer\tabcdefghijklmnop1234",
            "bearer:abcdefghijklmnop1234",
            "key nk_0a1b2c3d_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_abcdefg",
        ] {
            assert_eq!(scan_text(t), vec![Kind::BearerToken], "{t}");
        }
        assert_eq!(
            scan_text("-----begin private key-----\nabc"),
            vec![Kind::PrivateKey]
        );
        // Found by `make fuzz`: "bearer " followed by a multi-byte letter.
        let odd = "Bearer .......eareyJga....,..,.HxBearer к";
        assert_eq!(scan_text(odd), vec![Kind::BearerToken]);
        assert!(
            mask_text(odd).ends_with(",..,.HxBearer к"),
            "{}",
            mask_text(odd)
        );
        assert_eq!(
            scan_text("token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"),
            vec![Kind::BearerToken]
        );
        assert!(is_secret_field("Password") && is_secret_field("client_secret"));
        assert!(is_secret_field("API-Key") && !is_secret_field("order_id"));
        for name in [
            "user_password",
            "userPassword",
            "new_password",
            "password_confirmation",
            "db_pass",
            "token",
            "auth",
            "credentials",
            "cvv2",
            "pass\u{200b}word",
            "ｐａｓｓｗｏｒｄ",
            "password:",
        ] {
            assert!(is_secret_field(name), "{name}");
        }
        // Login codes are what the platform sends; the others are ordinary words.
        for name in ["otp", "author", "passenger", "url", "tracking_number"] {
            assert!(!is_secret_field(name), "{name}");
        }
        // HTML and URL encodings are looked through.
        assert_eq!(
            html_text("<b>1103700</b>&#49;23458 &amp; x"),
            "1103700123458 & x"
        );
        assert_eq!(
            percent_decoded("a=%31103700123458&b=%E0%B8%81"),
            "a=1103700123458&b=ก"
        );
        assert_eq!(percent_decoded("100%"), "100%");
    }

    #[test]
    fn nested_payload_fields_are_named_by_path() {
        let payload = json!({
            "order_id": 1001,
            "customer": {"name": "สมชาย", "id_card": "1-1037-00123-45-8", "password": "hunter2"},
            "cards": [{"last": "1111"}, {"number": 4111111111111111u64}],
            "note": "โอนแล้ว ขอบคุณ",
            "extras": {"token": null},
            "login2": {"password": ["hunter2"]},
            "1103700123458": "x",
        });
        let found = scan_json("payload", &payload);
        assert_eq!(
            found,
            vec![
                Finding {
                    path: "payload.XXXXXXXXX3458".into(),
                    kind: Kind::ThaiNationalId
                },
                Finding {
                    path: "payload.cards[1].number".into(),
                    kind: Kind::PaymentCard
                },
                Finding {
                    path: "payload.customer.id_card".into(),
                    kind: Kind::ThaiNationalId
                },
                Finding {
                    path: "payload.customer.password".into(),
                    kind: Kind::SecretField
                },
                Finding {
                    path: "payload.login2.password".into(),
                    kind: Kind::SecretField
                },
            ]
        );
    }

    #[test]
    fn masking_keeps_the_last_four_digits_and_the_layout() {
        assert_eq!(
            mask_text("บัตร 1-1037-00123-45-8 ค่ะ"),
            "บัตร X-XXXX-XXXX3-45-8 ค่ะ"
        );
        assert_eq!(mask_text("4111 1111 1111 1111"), "XXXX XXXX XXXX 1111");
        assert_eq!(
            mask_text("Bearer abcdefghijklmnop1234 ok"),
            "Bearer [REDACTED] ok"
        );
        // Found by `make fuzz`: the four digits kept, with the digits after them, made a
        // new card-like number; it is masked too.
        let tricky = "บัตร 1-1037-00123-45-8 11 1111 1111 1111";
        let masked = mask_text(tricky);
        assert!(scan_text(&masked).is_empty(), "{masked}");
        let masked = mask_json(&json!({"a": {"pin": "1234", "card": 4111111111111111u64, "n": 7}}));
        assert_eq!(
            masked,
            json!({"a": {"pin": "[REDACTED]", "card": "XXXXXXXXXXXX1111", "n": 7}})
        );
        assert!(
            scan_json("payload", &masked)
                .iter()
                .all(|f| f.kind == Kind::SecretField)
        );
    }
}
