//! The link policy: which URLs an event may carry in `content.url` and in its payload.
//!
//! A link must be `https://` with a host, without `user:password@`, backslashes,
//! whitespace or control characters; plain `http://` only for the development hosts of
//! [`LinkPolicy::http_hosts`]. `javascript:`, `data:` and every other scheme are refused.
//! The host itself is not judged (a private, loopback or link-local address over https is
//! accepted): links are for recipients to open, the platform never fetches them.
//!
//! Pure: no DNS, no I/O.

use crate::event::NewEvent;
use crate::validate::{FieldViolation, Violations};

/// Which `http://` hosts links may name (all others must be `https://`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkPolicy {
    /// Hosts (lowercase, without port) allowed over plain http, e.g. `localhost`; an entry
    /// starting with `.` allows that domain's subdomains (`.test`).
    pub http_hosts: Vec<String>,
}

/// The rule as told to the caller.
const RULE: &str = "must be an https:// URL with a host (http:// only for the development hosts in NOTIFY_DEV_HTTP_HOSTS; no javascript:, data: or other schemes)";

impl LinkPolicy {
    /// Why `url` is not an acceptable link, if it is not (the description of the
    /// violation, never echoing the URL).
    pub fn problem(&self, url: &str) -> Result<(), String> {
        if url
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '\\')
        {
            return Err(format!(
                "{RULE}; no whitespace, control characters or backslashes"
            ));
        }
        let lower = url.to_ascii_lowercase();
        let (rest, secure) = match (
            lower.strip_prefix("https://"),
            lower.strip_prefix("http://"),
        ) {
            (Some(r), _) => (r, true),
            (None, Some(r)) => (r, false),
            _ => return Err(RULE.to_string()),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if authority.contains('@') {
            return Err(format!("{RULE}; no user:password@ in links"));
        }
        let host = match authority.rsplit_once(':') {
            Some((h, port)) if !port.contains(']') => h,
            _ => authority,
        };
        if host.is_empty() {
            return Err(format!("{RULE}; it names no host"));
        }
        if secure {
            return Ok(());
        }
        let allowed = self.http_hosts.iter().any(|h| match h.strip_prefix('.') {
            Some(domain) => host == domain || host.ends_with(&format!(".{domain}")),
            None => host == h,
        });
        if allowed {
            Ok(())
        } else {
            Err(RULE.to_string())
        }
    }

    /// Every link of `event` that breaks the policy, one violation per field path.
    /// Checked: `content.url`, and every payload string under a key that names a link
    /// ([`is_link_key`]), in lists and objects under such a key too. An empty link is no
    /// link.
    pub fn check(&self, event: &NewEvent) -> Result<(), Vec<FieldViolation>> {
        let mut v = Violations::default();
        let mut check = |field: String, url: &str| {
            if let Err(why) = self.problem(url) {
                v.add(field, why);
            }
        };
        if !event.content.url.is_empty() {
            check("content.url".into(), &event.content.url);
        }
        let mut urls = Vec::new();
        walk("payload", &event.payload, false, &mut urls);
        for (field, url) in urls {
            if !url.is_empty() {
                check(field, &url);
            }
        }
        v.into_result(())
    }
}

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
fn walk(path: &str, v: &serde_json::Value, link: bool, out: &mut Vec<(String, String)>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dev() -> LinkPolicy {
        LinkPolicy {
            http_hosts: vec!["localhost".into(), ".test".into()],
        }
    }

    fn event(url: &str, payload: serde_json::Value) -> NewEvent {
        let content = crate::Content {
            url: url.into(),
            ..Default::default()
        };
        crate::test_fixtures::new_event("k", "t", payload, content)
    }

    #[test]
    fn https_with_a_host_is_a_link_whatever_the_host() {
        let p = LinkPolicy::default();
        for url in [
            "https://shop.example/orders/1",
            "HTTPS://Shop.Example/",
            "https://shop.example:8443/a?b=c#d",
            "https://[2001:db8::1]/x",
            // The host is not judged: the platform never fetches links.
            "https://127.0.0.1/",
            "https://10.0.0.1/",
            "https://169.254.169.254/latest",
            "https://localhost/",
        ] {
            assert_eq!(p.problem(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn other_schemes_are_refused() {
        let p = dev();
        for url in [
            "javascript:alert(1)",
            "data:text/html,<b>x</b>",
            "ftp://shop.example/",
            "//shop.example/",
            "shop.example/orders",
            "mailto:a@shop.example",
        ] {
            assert_eq!(p.problem(url), Err(RULE.to_string()), "{url}");
        }
    }

    #[test]
    fn plain_http_only_for_the_allow_list_and_its_subdomains() {
        let p = dev();
        assert_eq!(p.problem("http://localhost:8080/x"), Ok(()));
        assert_eq!(p.problem("http://LOCALHOST/"), Ok(()));
        assert_eq!(p.problem("http://test/"), Ok(()));
        assert_eq!(p.problem("http://shop.test/"), Ok(()));
        assert_eq!(p.problem("http://a.b.test/"), Ok(()));
        for url in [
            "http://evil.example/",
            "http://nottest/",
            "http://localhost.evil.example/",
            "http://127.0.0.1/",
        ] {
            assert_eq!(p.problem(url), Err(RULE.to_string()), "{url}");
        }
        assert!(LinkPolicy::default().problem("http://localhost/").is_err());
    }

    #[test]
    fn credentials_no_host_and_odd_characters_are_refused() {
        let p = dev();
        let why = |url: &str| p.problem(url).unwrap_err();
        assert!(why("https://user:pw@shop.example/").ends_with("no user:password@ in links"));
        assert!(why("https://@shop.example/").ends_with("no user:password@ in links"));
        assert!(why("https:///path").ends_with("it names no host"));
        assert!(why("https://:443/").ends_with("it names no host"));
        for url in [
            "https://shop.example/a b",
            "https://shop.example/\ta",
            "https://shop.example\\@evil.example/",
            "https://shop.example/\u{0}",
        ] {
            assert!(
                why(url).ends_with("no whitespace, control characters or backslashes"),
                "{url:?}"
            );
        }
    }

    #[test]
    fn link_keys_are_whole_words() {
        for k in [
            "url",
            "image_url",
            "imageUrl",
            "deep-link",
            "redirect_uri",
            "links",
            "href",
            "callback",
            "Website",
            "home.page.homepage",
        ] {
            assert!(is_link_key(k), "{k}");
        }
        for k in [
            "security_level",
            "unlinked_items",
            "curly",
            "hrefs2",
            "title",
        ] {
            assert!(!is_link_key(k), "{k}");
        }
    }

    #[test]
    fn check_names_every_bad_link_by_its_path() {
        let p = dev();
        let e = event(
            "http://evil.example/",
            json!({
                "links": [{"url": "javascript:x"}, "https://ok.example/"],
                "deep_link": ["data:x"],
                "image_url": "",
                "title": "http://not-a-link-key.example/",
                "n": {"callback": 5},
            }),
        );
        let mut fields: Vec<String> = p
            .check(&e)
            .unwrap_err()
            .into_iter()
            .map(|v| v.field)
            .collect();
        fields.sort();
        assert_eq!(
            fields,
            [
                "content.url",
                "payload.deep_link[0]",
                "payload.links[0].url"
            ]
        );
        assert_eq!(
            p.check(&event("", json!({"url": "https://ok.example/"}))),
            Ok(())
        );
    }
}
