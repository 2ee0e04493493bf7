//! Input validation shared by every edge. Violations name the field (as a path such as
//! `recipients[3]` or `content.title`) and the rule, following google.rpc.BadRequest.

/// One bad field: `field` is a path into the request, `description` states the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// Path of the field, e.g. `event_key`, `recipients[2]`, `content.url`.
    pub field: String,
    /// The rule the value breaks, for a person to read.
    pub description: String,
}

impl FieldViolation {
    /// Builds a violation for `field` with `description`.
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// Collects violations so that a request reports every bad field at once.
#[derive(Debug, Default)]
pub struct Violations(pub Vec<FieldViolation>);

impl Violations {
    /// Records one violation.
    pub fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation::new(field, description));
    }

    /// `Ok(value)` when nothing was recorded, else every violation.
    pub fn into_result<T>(self, value: T) -> Result<T, Vec<FieldViolation>> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(self.0)
        }
    }

    /// Parses an identifier (a user id, an event or cancellation key, a device token):
    /// the one rule every RPC and HTTP route applies ([`id_problem`]) to the text
    /// normalised to NFC (Unicode UAX #15), which is what is stored and compared, so
    /// `jose\u{301}` and `jos\u{e9}` are one user wherever they arrive. `None` (and a
    /// violation recorded for `field`) when the text breaks the rule.
    pub fn id(&mut self, field: &str, value: &str, max_bytes: usize) -> Option<String> {
        use unicode_normalization::UnicodeNormalization;
        let nfc: String = value.nfc().collect();
        match id_problem(&nfc, max_bytes) {
            Ok(()) => Some(nfc),
            Err(why) => {
                self.add(field, why);
                None
            }
        }
    }

    /// [`Self::id`] for a value that is only checked (a filter, a reason): whether it
    /// passed.
    pub fn check_id(&mut self, field: &str, value: &str, max_bytes: usize) -> bool {
        self.id(field, value, max_bytes).is_some()
    }

    /// Checks that `value` has at most `max_chars` Unicode scalar values and no NUL
    /// character (PostgreSQL text cannot hold one).
    pub fn check_len(&mut self, field: &str, value: &str, max_chars: usize) {
        let n = value.chars().count();
        if n > max_chars {
            self.add(
                field,
                format!("must be at most {max_chars} characters, got {n}"),
            );
        } else if value.contains('\0') {
            self.add(field, "must not contain NUL characters");
        }
    }

    /// Checks a single-line text: no line or paragraph separators of any kind.
    pub fn check_single_line(&mut self, field: &str, value: &str) {
        if value.contains(['\r', '\n', '\u{85}', '\u{2028}', '\u{2029}']) {
            self.add(field, "must be a single line");
        }
    }

    /// Checks that a JSON value has no NUL character in any key or string.
    pub fn check_json_text(&mut self, field: &str, value: &serde_json::Value) {
        fn has_nul(v: &serde_json::Value) -> bool {
            match v {
                serde_json::Value::String(s) => s.contains('\0'),
                serde_json::Value::Array(a) => a.iter().any(has_nul),
                serde_json::Value::Object(o) => {
                    o.iter().any(|(k, v)| k.contains('\0') || has_nul(v))
                }
                _ => false,
            }
        }
        if has_nul(value) {
            self.add(field, "must not contain NUL characters (\\u0000)");
        }
    }

    /// Checks an optional link: empty, or an absolute `https://` / `http://` URL of at most
    /// 2,048 bytes with no whitespace or control characters.
    pub fn check_url(&mut self, field: &str, value: &str) {
        if value.is_empty() {
            return;
        }
        let lower = value.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"));
        match rest {
            // An app's own scheme (`myshop://orders/1`) is told where it can go.
            None if value
                .split_once("://")
                .is_some_and(|(scheme, _)| {
                    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                        && scheme
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
                }) =>
            {
                self.add(
                    field,
                    "must be an absolute https:// or http:// URL; an app deep link (a scheme of NOTIFY_DEEP_LINK_SCHEMES) belongs on an action button (content.actions[].url)",
                )
            }
            None => self.add(field, "must be an absolute https:// or http:// URL"),
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                self.add(field, "must name a host")
            }
            Some(_) if value.len() > 2048 => self.add(field, "must be at most 2048 bytes"),
            Some(_) if value.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                self.add(field, "must not contain whitespace or control characters")
            }
            Some(_) => {}
        }
    }
}

/// Why `value` (already NFC) is not an identifier: blank (whitespace and ignorable
/// characters do not count), leading or trailing whitespace, more than `max_bytes` UTF-8
/// bytes, or a character that is a control (Cc), a line or paragraph separator (Zl, Zp),
/// Default_Ignorable_Code_Point (U+00AD soft hyphen, U+034F, U+115F, U+180E, U+200B,
/// U+3164 Hangul filler, variation selectors, tags, ...) or Bidi_Control (U+061C, U+200E,
/// U+202A..U+202E, U+2066..U+2069): each renders as nothing or reorders what is shown,
/// so `u\u{ad}1` would look like `u1` and be another user. The properties come from
/// the Unicode Character Database through ICU4X (`icu_properties`), not a list of ours.
///
/// # Errors
/// The rule broken, for a person to read (never echoing the value).
pub fn id_problem(value: &str, max_bytes: usize) -> Result<(), String> {
    if value.chars().all(|c| c.is_whitespace() || is_invisible(c)) {
        Err("is required and must not be blank".into())
    } else if value.trim() != value {
        Err("must not start or end with whitespace".into())
    } else if value.len() > max_bytes {
        Err(format!(
            "must be at most {max_bytes} bytes (UTF-8), got {}",
            value.len()
        ))
    } else if value.chars().any(char::is_control) {
        Err("must not contain control characters".into())
    } else if value.chars().any(|c| is_invisible(c) || is_bidi_control(c)) {
        Err("must not contain invisible (Unicode Default_Ignorable_Code_Point), bidirectional control or line separator characters".into())
    } else {
        Ok(())
    }
}

/// Unicode Bidi_Control characters (U+061C, U+200E, U+200F, U+202A..U+202E,
/// U+2066..U+2069), which reorder how text is shown (UCD PropList.txt).
pub(crate) fn is_bidi_control(c: char) -> bool {
    icu_properties::CodePointSetData::new::<icu_properties::props::BidiControl>().contains(c)
}

/// Characters that render as nothing or break a line where an identifier is shown:
/// Default_Ignorable_Code_Point (UCD DerivedCoreProperties.txt: zero-width characters,
/// the soft hyphen, fillers, variation selectors, tags, the byte-order mark) and the
/// line and paragraph separators (General_Category Zl, Zp: U+2028, U+2029).
pub(crate) fn is_invisible(c: char) -> bool {
    use icu_properties::props::{DefaultIgnorableCodePoint, GeneralCategory};
    icu_properties::CodePointSetData::new::<DefaultIgnorableCodePoint>().contains(c)
        || matches!(
            icu_properties::CodePointMapData::<GeneralCategory>::new().get(c),
            GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator
        )
}

/// Zero-width characters and the byte-order mark (U+200B..U+200F, U+2060..U+2064,
/// U+FEFF): what a display text such as a button label may not consist of or contain.
/// Narrower than [`is_invisible`], so a label keeps an emoji's variation selector.
pub(crate) fn is_zero_width(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}')
}

/// Parses an IANA time zone name such as `Asia/Bangkok` (tz database via chrono-tz).
pub fn parse_timezone(name: &str) -> Option<chrono_tz::Tz> {
    name.parse::<chrono_tz::Tz>().ok()
}

/// Loose BCP 47 check: 2 to 35 characters of ASCII letters, digits and `-`, starting with
/// a 2- or 3-letter language subtag (`th`, `th-TH`, `en-US`).
pub fn is_language_tag(tag: &str) -> bool {
    let mut parts = tag.split('-');
    let lang = parts.next().unwrap_or("");
    (2..=3).contains(&lang.len())
        && lang.chars().all(|c| c.is_ascii_alphabetic())
        && tag.len() <= 35
        && parts
            .all(|p| !p.is_empty() && p.len() <= 8 && p.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// LINE user ids are `U` followed by 32 lowercase hex digits (LINE Messaging API
/// reference, "Get user IDs").
pub fn is_line_user_id(id: &str) -> bool {
    id.len() == 33
        && id.starts_with('U')
        && id[1..]
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// Most bytes of an action id (`[A-Za-z0-9_.:-]`).
pub const MAX_ACTION_ID_BYTES: usize = 64;

/// Whether `id` is a valid action id: 1 to [`MAX_ACTION_ID_BYTES`] characters of
/// `[A-Za-z0-9_.:-]`.
pub fn is_action_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ACTION_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// Notification type keys: 1 to 64 characters of `[a-z0-9_.-]`, starting with a letter.
pub fn is_type_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 64
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-'))
}

/// Checks a preference's target: a type key or `*`, a channel or `*`, not both `*`.
/// Returns the channel (`None` = every channel).
pub fn check_preference(
    v: &mut Violations,
    type_key: &str,
    channel: &str,
) -> Option<crate::Channel> {
    if type_key != "*" && !is_type_key(type_key) {
        v.add("type", "must be a notification type key or \"*\"");
    }
    if type_key == "*" && channel == "*" {
        v.add("channel", "type and channel cannot both be \"*\"");
    }
    match channel {
        "*" => None,
        c => match c.parse::<crate::Channel>() {
            Ok(c) => Some(c),
            Err(e) => {
                v.add("channel", format!("{e} (or \"*\" for every channel)"));
                None
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_for_blank_length_and_control_characters() {
        let mut v = Violations::default();
        assert!(v.check_id("a", "user-1", 255));
        assert!(!v.check_id("b", "   ", 255));
        assert!(!v.check_id("c", &"x".repeat(256), 255));
        assert!(!v.check_id("d", "a\u{0}b", 255));
        assert!(!v.check_id("e", "\u{200b}\u{feff}", 255));
        assert!(!v.check_id("f", " qa0", 255));
        let fields: Vec<_> = v.0.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["b", "c", "d", "e", "f"]);
        assert!(v.0[1].description.contains("256"));
        // `u\u{200b}1` would look like `u1`; bidi overrides reorder what is shown.
        let mut v = Violations::default();
        assert!(!v.check_id("g", "u\u{200b}1", 255));
        assert!(!v.check_id("h", "order\u{202e}1", 255));
        assert!(v.check_id("i", "คำสั่งซื้อ:๑๒๓", 255));
        assert!(v.0[0].description.contains("invisible"));
    }

    #[test]
    fn look_alike_ids_are_refused_from_the_unicode_properties() {
        // Each makes an id that looks like `alice` (or another user's) and is not.
        for c in [
            '\u{ad}',
            '\u{61c}',
            '\u{34f}',
            '\u{3164}',
            '\u{fe0f}',
            '\u{e0041}',
            '\u{2028}',
            '\u{2029}',
            '\u{180e}',
            '\u{115f}',
            '\u{206a}',
            '\u{200d}',
            '\u{2066}',
            '\u{1d173}',
        ] {
            let mut v = Violations::default();
            for id in [
                format!("{c}alice"),
                format!("al{c}ice"),
                format!("alice{c}"),
            ] {
                assert_eq!(v.id("user_id", &id, 255), None, "U+{:04X}", u32::from(c));
            }
            assert_eq!(v.0.len(), 3);
            assert_eq!(v.0[0].field, "user_id");
        }
        // Thai text, combining marks included, is an id as it is.
        let mut v = Violations::default();
        assert_eq!(
            v.id("user_id", "สมชาย.ใจดี", 255).as_deref(),
            Some("สมชาย.ใจดี")
        );
    }

    #[test]
    fn one_user_id_whatever_normalisation_form_it_arrives_in() {
        let mut v = Violations::default();
        let nfd = v.id("user_id", "jose\u{301}", 255);
        let nfc = v.id("user_id", "jos\u{e9}", 255);
        assert_eq!(nfd.as_deref(), Some("jos\u{e9}"));
        assert_eq!(nfd, nfc);
        assert!(v.0.is_empty());
    }

    #[test]
    fn urls_must_be_absolute_http_or_https() {
        let mut v = Violations::default();
        v.check_url("ok1", "https://shop.example.test/orders/123");
        v.check_url("ok2", "");
        v.check_url("js", "javascript:alert(1)");
        v.check_url("deep", "myshop://orders/1");
        v.check_url("rel", "/orders/1");
        v.check_url("nohost", "https:///x");
        v.check_url("space", "https://a.test/x y");
        let fields: Vec<_> = v.0.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["js", "deep", "rel", "nohost", "space"]);
        assert!(v.0[1].description.contains("action button"), "{:?}", v.0[1]);
        assert!(!v.0[0].description.contains("action button"));
    }

    #[test]
    fn contact_formats() {
        assert!(is_line_user_id("U4af4980629a0b1c2d3e4f5a6b7c8d9e0"));
        assert!(!is_line_user_id("U4AF4980629A0B1C2D3E4F5A6B7C8D9E0"));
        assert!(!is_line_user_id("user-1"));
        assert!(is_language_tag("th-TH") && is_language_tag("th") && is_language_tag("en-US"));
        assert!(!is_language_tag("t") && !is_language_tag("th_TH") && !is_language_tag(""));
        assert!(parse_timezone("Asia/Bangkok").is_some());
        assert!(parse_timezone("Mars/Olympus").is_none());
        assert!(is_type_key("order_paid") && !is_type_key("Order") && !is_type_key("1x"));
    }
}
