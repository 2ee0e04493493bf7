//! Which strings of a JSON value are links: those at or under a key that names a link
//! ([`is_link_key`]). The link policy ([`crate::links`]) checks them in an event's payload
//! and LINE messages; [`crate::Content::links`] lists them. Pure.

/// Whether one of the words of `k` (split at `_`, `-`, `.`, spaces and camelCase humps:
/// `imageUrl`, `deep_link`, `redirect_uri`) names a link: `url`, `uri`, `link`, `href`
/// (and their plurals), `callback`, `redirect`, `website`, `homepage`.
pub fn is_link_key(k: &str) -> bool {
    let mut words: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in k.chars() {
        if !c.is_alphanumeric() {
            words.push(std::mem::take(&mut cur));
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower {
            words.push(std::mem::take(&mut cur));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        cur.extend(c.to_lowercase());
    }
    words.push(cur);
    words.iter().any(|w| {
        matches!(
            w.as_str(),
            "url"
                | "urls"
                | "uri"
                | "uris"
                | "link"
                | "links"
                | "href"
                | "callback"
                | "redirect"
                | "website"
                | "homepage"
        )
    })
}

/// Collects `(path, string)` for every string at or under a link key.
pub(crate) fn walk(path: &str, v: &serde_json::Value, link: bool, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                walk(&format!("{path}.{k}"), x, link || is_link_key(k), out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                walk(&format!("{path}[{i}]"), x, link, out);
            }
        }
        serde_json::Value::String(s) if link => out.push((path.to_string(), s.clone())),
        _ => {}
    }
}
