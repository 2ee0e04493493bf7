//! The link policy: which URLs an event may carry in its content (`content.url`, the image,
//! the actions, the per-channel overrides: [`crate::Content::links`]) and in its payload.
//!
//! A link must be `https://` with a host, without `user:password@`, backslashes,
//! whitespace or control characters; plain `http://` only for the development hosts of
//! [`LinkPolicy::http_hosts`]. A deep link into an app (`myshop://orders/1001`) only with a
//! scheme the operator listed in [`LinkPolicy::deep_link_schemes`], and only on a button
//! (actions, LINE action `uri`s); never for `content.url` (also the link printed in email
//! and LINE text), images or in the payload.
//! `javascript:`, `data:` and every other scheme are refused.
//! The host itself is not judged (a private, loopback or link-local address over https is
//! accepted): links are for recipients to open, the platform never fetches them.
//!
//! Pure: no DNS, no I/O.

use crate::event::NewEvent;
pub use crate::link_keys::is_link_key;
use crate::link_keys::walk;
use crate::validate::{FieldViolation, Violations};

/// Which `http://` hosts links may name (all others must be `https://`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkPolicy {
    /// Hosts (lowercase, without port) allowed over plain http, e.g. `localhost`; an entry
    /// starting with `.` allows that domain's subdomains (`.test`).
    pub http_hosts: Vec<String>,
    /// URL schemes of the operator's apps allowed as deep links (lowercase, without
    /// `:`), e.g. `myshop`; [`LinkPolicy::from_env`] refuses the schemes that run code or
    /// read files (`javascript`, `data`, `file`, `vbscript`, `blob`, `about`).
    pub deep_link_schemes: Vec<String>,
    /// The push services a Web Push subscription's endpoint may name (lowercase hosts; an
    /// entry starting with `.` allows that domain's subdomains): the platform POSTs to
    /// that URL, so an end user must not be able to point it anywhere else
    /// ([`LinkPolicy::web_push_endpoint`]). Default [`KNOWN_PUSH_SERVICES`].
    pub web_push_hosts: Vec<String>,
}

/// The push services of the browsers in use (`NOTIFY_WEB_PUSH_HOSTS`'s default): Chrome,
/// Edge, Opera and Samsung Internet subscribe through Firebase Cloud Messaging
/// (`fcm.googleapis.com`), Firefox through Mozilla's autopush
/// (`updates.push.services.mozilla.com`), Safari through Apple
/// (`web.push.apple.com`), and Windows' own push service through WNS
/// (`*.notify.windows.com`).
pub const KNOWN_PUSH_SERVICES: [&str; 4] = [
    "fcm.googleapis.com",
    "updates.push.services.mozilla.com",
    "web.push.apple.com",
    ".notify.windows.com",
];

impl Default for LinkPolicy {
    /// No development hosts, no deep-link schemes, the [`KNOWN_PUSH_SERVICES`].
    fn default() -> Self {
        Self {
            http_hosts: Vec::new(),
            deep_link_schemes: Vec::new(),
            web_push_hosts: KNOWN_PUSH_SERVICES.iter().map(|h| h.to_string()).collect(),
        }
    }
}

/// Whether `host` is one of `hosts` (an entry `.domain` matches the domain and every
/// subdomain of it).
pub(crate) fn host_listed(hosts: &[String], host: &str) -> bool {
    hosts.iter().any(|h| match h.strip_prefix('.') {
        Some(domain) => host == domain || host.ends_with(&format!(".{domain}")),
        None => host == h,
    })
}

/// Schemes never allowed as deep links, whatever the configuration says.
pub const FORBIDDEN_SCHEMES: [&str; 8] = [
    "javascript",
    "data",
    "file",
    "vbscript",
    "blob",
    "about",
    "http",
    "https",
];

/// Whether `field` names a button whose tap an app can take, so an app deep link may
/// stand there: an action's URL, a LINE message's `uri`. Not `content.url`: it is also the
/// link printed in email and LINE text, which no app opens.
fn opens_on_tap(field: &str) -> bool {
    (field.contains("actions[") && field.ends_with(".url"))
        || (field.starts_with("content.overrides.line_messages_json") && field.ends_with("uri"))
}

/// The rule as told to the caller.
const RULE: &str = "must be an https:// URL with a host (http:// only for the development hosts in NOTIFY_DEV_HTTP_HOSTS; no javascript:, data: or other schemes)";

impl LinkPolicy {
    /// Reads `NOTIFY_DEV_HTTP_HOSTS` (comma-separated hosts allowed over plain http;
    /// empty), `NOTIFY_DEEP_LINK_SCHEMES` (comma-separated app schemes; empty) and
    /// `NOTIFY_WEB_PUSH_HOSTS` (comma-separated push service hosts, `.domain` for its
    /// subdomains; [`KNOWN_PUSH_SERVICES`]). A
    /// scheme in [`FORBIDDEN_SCHEMES`] or not of RFC 3986 scheme characters is an error
    /// recorded in `env`.
    pub fn from_env(env: &mut crate::config::Env) -> Self {
        let list = |s: String| -> Vec<String> {
            s.split(',')
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect()
        };
        let http_hosts = list(env.string("NOTIFY_DEV_HTTP_HOSTS", ""));
        let deep_link_schemes = list(env.string("NOTIFY_DEEP_LINK_SCHEMES", ""));
        let web_push_hosts =
            list(env.string("NOTIFY_WEB_PUSH_HOSTS", &KNOWN_PUSH_SERVICES.join(",")));
        for s in &deep_link_schemes {
            let scheme_chars = s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
            if !scheme_chars || FORBIDDEN_SCHEMES.contains(&s.as_str()) {
                env.error(format!(
                    "NOTIFY_DEEP_LINK_SCHEMES: {s:?} is not an app scheme (RFC 3986 scheme characters; not one of {})",
                    FORBIDDEN_SCHEMES.join(", ")
                ));
            }
        }
        LinkPolicy {
            http_hosts,
            deep_link_schemes,
            web_push_hosts,
        }
    }

    /// Why `url`, standing at `field`, is not an acceptable link: [`Self::problem`], except
    /// that on a button ([`opens_on_tap`]) a deep link with an allowed scheme
    /// passes.
    pub fn problem_at(&self, field: &str, url: &str) -> Result<(), String> {
        if opens_on_tap(field)
            && let Some((scheme, rest)) = url.split_once(':')
            && self
                .deep_link_schemes
                .iter()
                .any(|s| s.eq_ignore_ascii_case(scheme))
        {
            if rest.is_empty()
                || rest
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == '\\')
            {
                return Err(format!(
                    "{RULE}; a deep link needs a path and no whitespace, control characters or backslashes"
                ));
            }
            return Ok(());
        }
        self.problem(url)
    }

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
        let allowed = host_listed(&self.http_hosts, host);
        if allowed {
            Ok(())
        } else {
            Err(RULE.to_string())
        }
    }

    /// Every link of `event` that breaks the policy, one violation per field path.
    /// Checked: every link of the content ([`crate::Content::links`]), and every payload string under a key that names a link
    /// ([`is_link_key`]), in lists and objects under such a key too. An empty link is no
    /// link.
    pub fn check(&self, event: &NewEvent) -> Result<(), Vec<FieldViolation>> {
        let mut v = Violations::default();
        let mut links = event.content.links();
        walk("payload", &event.payload, false, &mut links);
        for (field, url) in links {
            if !url.is_empty()
                && let Err(why) = self.problem_at(&field, &url)
            {
                v.add(field, why);
            }
        }
        v.into_result(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dev() -> LinkPolicy {
        LinkPolicy {
            http_hosts: vec!["localhost".into(), ".test".into()],
            deep_link_schemes: vec!["myshop".into()],
            ..Default::default()
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

    #[test]
    fn deep_links_only_with_a_listed_scheme_and_only_where_a_tap_opens_them() {
        let mut e = event("myshop://orders/1001", json!({"link": "myshop://x"}));
        e.content.actions = vec![
            crate::Action {
                id: "a".into(),
                label: "ดู".into(),
                url: "myshop://orders/1001".into(),
            },
            crate::Action {
                id: "b".into(),
                label: "โทร".into(),
                url: "otherapp://x".into(),
            },
        ];
        e.content.image_url = "myshop://logo.png".into();
        let errs = dev().check(&e).unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "content.url",
                "content.image_url",
                "content.actions[1].url",
                "payload.link"
            ],
            "the listed scheme passes on actions[0] only"
        );
        let mut env =
            crate::config::Env::from_vars([("NOTIFY_DEEP_LINK_SCHEMES", "myshop, javascript")]);
        let p = LinkPolicy::from_env(&mut env);
        assert_eq!(p.deep_link_schemes, ["myshop", "javascript"]);
        let problems = env.finish().unwrap_err();
        assert!(
            problems.contains("\"javascript\" is not an app scheme"),
            "{problems}"
        );
    }
}
