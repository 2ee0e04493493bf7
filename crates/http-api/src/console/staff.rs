//! Staff authentication for the operations console: argon2id password hashes, sign-in
//! throttling, server-side sessions, CSRF tokens bound to a session, the `Origin` check on
//! state-changing requests and the security headers of the console's pages.
//!
//! - Passwords: `NOTIFY_CONSOLE_USERS` holds argon2id hashes as PHC strings
//!   (`$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>`, RFC 9106 with the OWASP parameters;
//!   `http-api hash-password` makes one). A 64-hex-digit SHA-256 hash from older releases
//!   is refused at start-up with a message saying how to replace it.
//! - Throttling (`console/throttle.rs`): every sign-in takes an attempt, before its
//!   password is checked, from the counts of its typed name at its client address (the
//!   TCP peer), of that address, and (unless the name signed in from there within 30
//!   days) of that name from every address, atomically in Postgres
//!   (`console_sign_in_counts`, database clock), so no burst on any replica gets more
//!   checks than a count allows; when one is used up the sign-in answers 429 with
//!   `Retry-After`. The typed name is stored only as its SHA-256 and never logged.
//! - Sessions: the cookie holds 32 random bytes; `console_sessions` holds their SHA-256, the
//!   staff member and the expiry (`session_ttl`). Signing out deletes the row, so the old
//!   cookie is refused on every replica and after restarts.
//! - CSRF: HMAC-SHA256 (`NOTIFY_CONSOLE_SECRET`) of the session's id hash, so a token is
//!   good only with the session it was issued to (behind an authenticating proxy: of the
//!   proxy's staff name).
//! - Origin: a POST whose `Origin` (or, when a browser sent none, `Referer`) is not the
//!   console's own origin gets 403. A request with neither is not from a browser form and
//!   relies on the cookie (SameSite=Strict) and the CSRF token.

use super::ConsoleConfig;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Name of the session cookie.
pub(crate) const COOKIE: &str = "console_session";

/// An argon2id hash of `password` as a PHC string with a random 16-byte salt and the
/// `argon2` crate's default parameters (19 MiB, 2 passes, 1 lane: the OWASP minimum),
/// the form `NOTIFY_CONSOLE_USERS` takes.
pub fn password_hash(password: &str) -> String {
    let mut salt = [0u8; 16];
    rand::rng().fill_bytes(&mut salt);
    let salt = SaltString::encode_b64(&salt).expect("16 bytes is a valid salt");
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("default argon2 parameters hash any password")
        .to_string()
}

/// Why a configured password hash cannot be used.
pub(crate) fn check_hash(hash: &str) -> Result<(), String> {
    if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("is an unsalted SHA-256 hash, which is no longer accepted: make an argon2id hash with `http-api hash-password` (it reads the password on standard input) and put it in its place".into());
    }
    match PasswordHash::new(hash) {
        Ok(h) if h.algorithm.as_str() == "argon2id" => Ok(()),
        Ok(h) => Err(format!(
            "uses {}, not argon2id: make one with `http-api hash-password`",
            h.algorithm
        )),
        Err(e) => Err(format!(
            "is not a PHC string ({e}): make one with `http-api hash-password`"
        )),
    }
}

/// Whether `password` matches the PHC string `hash` (constant time in the hash
/// comparison). Runs argon2, tens of milliseconds: call it off the async threads.
pub(crate) fn password_matches(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &h)
            .is_ok()
    })
}

/// A hash no password is checked against successfully in practice, verified for unknown
/// names so that they take as long as known ones.
pub(crate) fn dummy_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| password_hash(&hex::encode(rand::random::<[u8; 32]>())))
}

/// A new random session id (the cookie value, base64url of 32 random bytes) and the
/// SHA-256 that is stored.
pub(crate) fn new_session_id() -> (String, Vec<u8>) {
    let id = rand::random::<[u8; 32]>();
    (URL_SAFE_NO_PAD.encode(id), Sha256::digest(id).to_vec())
}

/// The stored hash of the session id in the request's cookie, if there is a well-formed
/// one.
pub(crate) fn session_id_hash(headers: &HeaderMap) -> Option<Vec<u8>> {
    let value = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|c| c.split(';'))
        .find_map(|c| {
            c.trim()
                .strip_prefix(COOKIE)
                .and_then(|r| r.strip_prefix('='))
        })?;
    let id = URL_SAFE_NO_PAD.decode(value).ok()?;
    (id.len() == 32).then(|| Sha256::digest(&id).to_vec())
}

fn cookie_attributes(cfg: &ConsoleConfig) -> &'static str {
    if cfg.insecure_cookies {
        "Path=/console; HttpOnly; SameSite=Strict"
    } else {
        "Path=/console; HttpOnly; SameSite=Strict; Secure"
    }
}

/// The `Set-Cookie` value that starts a session: HttpOnly, SameSite=Strict, `Secure`
/// unless `NOTIFY_CONSOLE_INSECURE_COOKIES` is set, expiring with the session.
pub(crate) fn session_cookie(cfg: &ConsoleConfig, id: &str) -> String {
    format!(
        "{COOKIE}={id}; {}; Max-Age={}",
        cookie_attributes(cfg),
        cfg.session_ttl.as_secs()
    )
}

/// The `Set-Cookie` value that removes the session cookie.
pub(crate) fn clear_cookie(cfg: &ConsoleConfig) -> String {
    format!("{COOKIE}=; {}; Max-Age=0", cookie_attributes(cfg))
}

/// The CSRF token of the session identified by `binding` (its id hash in hex, or the
/// proxy's staff name).
pub(crate) fn csrf(cfg: &ConsoleConfig, binding: &str) -> String {
    notify_core::signed::sign(&cfg.secret, &format!("csrf|{binding}"))
}

/// Whether `token` is the CSRF token of the session `binding` (constant time).
pub(crate) fn csrf_valid(cfg: &ConsoleConfig, binding: &str, token: &str) -> bool {
    notify_core::signed::verify(&cfg.secret, &format!("csrf|{binding}"), token)
}

/// `scheme://host[:port]` of a URL (an `Origin` or `Referer` value), lower-cased.
/// The origin (scheme, host, port; RFC 6454 §4) of `url` as the WHATWG URL parser reads
/// it, so `https://h` and `https://h:443` are one origin and `http://h` another; `None`
/// for `null`, an opaque origin or what is not a URL.
fn origin_of(url: &str) -> Option<url::Origin> {
    let origin = url::Url::parse(url).ok()?.origin();
    origin.is_tuple().then_some(origin)
}

/// Whether a state-changing request comes from the console's own pages: its `Origin` (or
/// `Referer` when there is no `Origin`) has the scheme, host and port of
/// `NOTIFY_CONSOLE_ORIGIN` when that is set, else of `<scheme>://<Host>`, where the
/// scheme is `X-Forwarded-Proto` when a TLS-terminating proxy set it and `http`
/// otherwise (http-api itself serves plain HTTP). `Origin: null` is refused. A request
/// with neither header (not sent by a browser form) passes.
pub(crate) fn same_origin(cfg: &ConsoleConfig, headers: &HeaderMap) -> bool {
    let Some(source) = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
    else {
        return true;
    };
    let Some(origin) = source.to_str().ok().and_then(origin_of) else {
        return false;
    };
    let own = match &cfg.origin {
        Some(own) => origin_of(own),
        None => {
            let text = |name: header::HeaderName| {
                headers
                    .get(name)
                    .and_then(|h| h.to_str().ok())
                    .map(str::trim)
            };
            let scheme = text(header::HeaderName::from_static("x-forwarded-proto"))
                .and_then(|p| p.split(',').next())
                .map(str::trim)
                .filter(|p| p.eq_ignore_ascii_case("https"))
                .map_or("http", |_| "https");
            text(header::HOST).and_then(|host| origin_of(&format!("{scheme}://{host}")))
        }
    };
    own.is_some_and(|own| own == origin)
}

/// The Content-Security-Policy of the console and the unsubscribe page: nothing but
/// inline styles, forms only to this origin, never framed.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                       frame-ancestors 'none'; base-uri 'none'";

/// Adds the security headers of server-rendered pages: [`CSP`], `X-Frame-Options: DENY`,
/// `X-Content-Type-Options: nosniff`, `Referrer-Policy: same-origin` and
/// `Cache-Control: no-store` (the pages show personal data).
pub async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ConsoleConfig {
        ConsoleConfig {
            secret: "s".repeat(32),
            ..Default::default()
        }
    }

    #[test]
    fn argon2id_hashes_verify_and_are_salted() {
        let (a, b) = (password_hash("pw"), password_hash("pw"));
        assert!(a.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{a}");
        assert_ne!(a, b, "a random salt each time");
        assert!(password_matches(&a, "pw"));
        assert!(!password_matches(&a, "pW"));
        assert!(check_hash(&a).is_ok());
        let sha = hex::encode(Sha256::digest(b"pw"));
        assert!(check_hash(&sha).unwrap_err().contains("SHA-256"));
        assert!(!password_matches(&sha, "pw"));
        assert!(!password_matches(dummy_hash(), ""));
    }

    #[test]
    fn the_local_stack_and_dev_overlay_hashes_are_ops_notify_local() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for file in [
            "deploy/local-stack.sh",
            "deploy/kubernetes/overlays/dev/kustomization.yaml",
        ] {
            let text = std::fs::read_to_string(root.join(file)).unwrap();
            let line = text
                .lines()
                .find(|l| l.contains("NOTIFY_CONSOLE_USERS=") && !l.trim_start().starts_with('#'))
                .unwrap();
            let hash = line
                .split_once("ops:")
                .unwrap()
                .1
                .trim_end_matches('\'')
                .replace("\\$", "$");
            assert!(check_hash(&hash).is_ok(), "{file}: {hash}");
            assert!(password_matches(&hash, "notify-local"), "{file}");
        }
    }

    #[test]
    fn origins_are_compared_with_the_host_or_the_configured_origin() {
        let mut cfg = cfg();
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        let host = ("host", "127.0.0.1:8080");
        // (configured origin, browser header, same origin?)
        type Header = (&'static str, &'static str);
        let cases: &[(Option<&str>, Option<Header>, bool)] = &[
            (None, None, true),
            (None, Some(("origin", "http://127.0.0.1:8080")), true),
            (None, Some(("origin", "http://evil.test")), false),
            (None, Some(("origin", "null")), false),
            // The scheme counts: the console is served over plain http here.
            (None, Some(("origin", "https://127.0.0.1:8080")), false),
            (None, Some(("origin", "http://127.0.0.1:8080/")), true),
            (None, Some(("origin", "http://127.0.0.1")), false),
            (
                Some("https://ops.example.test"),
                Some(("origin", "https://ops.example.test:443")),
                true,
            ),
            (
                Some("https://ops.example.test"),
                Some(("origin", "http://ops.example.test")),
                false,
            ),
            (
                Some("https://ops.example.test"),
                Some(("origin", "https://ops.example.test:8443")),
                false,
            ),
            (
                None,
                Some(("referer", "http://127.0.0.1:8080/console/confirm?x")),
                true,
            ),
            (
                None,
                Some(("referer", "http://127.0.0.1:8081/console")),
                false,
            ),
            (
                Some("https://ops.example.test"),
                Some(("origin", "https://ops.example.test")),
                true,
            ),
            (
                Some("https://ops.example.test"),
                Some(("origin", "http://127.0.0.1:8080")),
                false,
            ),
        ];
        for (origin, browser, same) in cases {
            cfg.origin = origin.map(str::to_string);
            let headers = h(&[Some(host), *browser]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>());
            assert_eq!(
                same_origin(&cfg, &headers),
                *same,
                "origin {origin:?}, header {browser:?}"
            );
        }
    }

    #[test]
    fn behind_a_tls_proxy_the_forwarded_scheme_is_the_consoles() {
        let cfg = cfg();
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("ops.example.test"));
        headers.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        headers.insert(
            "origin",
            HeaderValue::from_static("https://ops.example.test"),
        );
        assert!(same_origin(&cfg, &headers));
        headers.insert(
            "origin",
            HeaderValue::from_static("http://ops.example.test"),
        );
        assert!(!same_origin(&cfg, &headers));
    }

    #[test]
    fn session_cookies_are_secure_unless_the_local_exception_is_set() {
        let mut cfg = cfg();
        let (id, hash) = new_session_id();
        let c = session_cookie(&cfg, &id);
        assert!(c.contains("; Secure") && c.contains("HttpOnly") && c.contains("SameSite=Strict"));
        cfg.insecure_cookies = true;
        assert!(!session_cookie(&cfg, &id).contains("Secure"));
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            format!("a=b; {COOKIE}={id}").parse().unwrap(),
        );
        assert_eq!(session_id_hash(&headers), Some(hash));
    }
}
