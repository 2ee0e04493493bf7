//! Status webhooks to callers, as the Standard Webhooks specification defines them
//! (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>):
//! the event types a caller may subscribe to, the `whsec_` secret, the
//! `webhook-signature` value (`v1,` + base64 of HMAC-SHA256 over
//! `{webhook-id}.{webhook-timestamp}.{body}`, keyed with the base64-decoded part after
//! `whsec_`; several space-separated during a rotation), and the endpoint URL rule
//! (the link policy, then the host as the WHATWG URL parser reads it: no private,
//! loopback, link-local or other non-public address however spelt, no `localhost`).
//!
//! Pure: no DNS, no I/O; randomness is passed in.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::net::IpAddr;

/// What happened, as named in the payload's `type` and in an endpoint's filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// The provider accepted the delivery.
    DeliverySent,
    /// The delivery ended failed.
    DeliveryFailed,
    /// The delivery waits: a retry was scheduled, or a due-time rule deferred it.
    DeliveryDeferred,
    /// The delivery was canceled (`CancelEvent`, the console).
    DeliveryCancelled,
    /// The delivery was skipped at its due time (opt-out, unfollow, revoked endpoint).
    DeliverySkipped,
    /// The in-app notification was read.
    NotificationRead,
    /// The notification (or one of its actions) was clicked.
    NotificationClicked,
}

impl EventType {
    /// Every event type, in the order the docs list them.
    pub const ALL: [EventType; 7] = [
        EventType::DeliverySent,
        EventType::DeliveryFailed,
        EventType::DeliveryDeferred,
        EventType::DeliveryCancelled,
        EventType::DeliverySkipped,
        EventType::NotificationRead,
        EventType::NotificationClicked,
    ];

    /// The name on the wire (`delivery.sent` ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::DeliverySent => "delivery.sent",
            EventType::DeliveryFailed => "delivery.failed",
            EventType::DeliveryDeferred => "delivery.deferred",
            EventType::DeliveryCancelled => "delivery.cancelled",
            EventType::DeliverySkipped => "delivery.skipped",
            EventType::NotificationRead => "notification.read",
            EventType::NotificationClicked => "notification.clicked",
        }
    }

    /// Parses a wire name; `None` for anything else.
    pub fn parse(s: &str) -> Option<EventType> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The event type of a delivery that just reached `status`; `None` for `sending` (a
    /// claim is no state a caller is told about). `pending` after a change is a retry or a
    /// deferral.
    pub fn of_delivery_status(status: crate::DeliveryStatus) -> Option<EventType> {
        use crate::DeliveryStatus as S;
        Some(match status {
            S::Sent => EventType::DeliverySent,
            S::Failed => EventType::DeliveryFailed,
            S::Pending => EventType::DeliveryDeferred,
            S::Canceled => EventType::DeliveryCancelled,
            S::Skipped => EventType::DeliverySkipped,
            S::Sending => return None,
        })
    }
}

/// Prefix of a secret as shown to the caller (the spec's and Svix's convention).
pub const SECRET_PREFIX: &str = "whsec_";

/// Bytes of key in a new secret (the spec asks for 24 to 64; Svix uses 24).
pub const SECRET_BYTES: usize = 32;

/// A new secret from `random` (at least [`SECRET_BYTES`] bytes from a CSPRNG):
/// `whsec_` + standard base64 of the first [`SECRET_BYTES`].
pub fn new_secret(random: &[u8; SECRET_BYTES]) -> String {
    format!("{SECRET_PREFIX}{}", STANDARD.encode(random))
}

/// The HMAC key of a secret: the base64-decoded part after `whsec_` (a secret without the
/// prefix is decoded whole). `None` when it is not base64.
pub fn secret_key(secret: &str) -> Option<Vec<u8>> {
    STANDARD
        .decode(secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret))
        .ok()
}

/// The `msg_...` value of the `webhook-id` header for a stored message id.
pub fn message_id(id: uuid::Uuid) -> String {
    format!("msg_{}", id.simple())
}

/// One `v1,<base64>` signature of `body` sent with `id` at `timestamp` (Unix seconds),
/// keyed with `secret`. `None` when the secret is not base64.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = secret_key(secret)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes a key of any length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    Some(format!(
        "v1,{}",
        STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// The `webhook-signature` header: one signature per secret (the current one first, then
/// the previous one during a rotation's overlap), space-separated. Secrets that are not
/// base64 are left out.
pub fn signature_header(secrets: &[&str], id: &str, timestamp: i64, body: &[u8]) -> String {
    secrets
        .iter()
        .filter_map(|s| sign(s, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Longest endpoint URL, in bytes: 2,048, the common practical URL limit (what
/// browsers, CDNs and webhook services such as Svix and Stripe accept). Without one, a
/// million-byte URL could be stored and `ListWebhookEndpoints` would exceed gRPC's
/// 4 MiB message limit.
pub const MAX_URL_BYTES: usize = 2048;

/// Why `url` may not be a webhook endpoint: at most [`MAX_URL_BYTES`]; the link policy's
/// rule (https with a host; plain http only for `NOTIFY_DEV_HTTP_HOSTS`); and the host
/// as the WHATWG URL parser reads it (the `url` crate, the parser reqwest connects with,
/// so `127.1`, `0x7f000001`, `%31%32%37.0.0.1` or `127。0。0。1` are the IP addresses they
/// become): an IP address must be [`is_public`], a name must not be `localhost` or
/// `*.localhost` and must be a valid DNS name, unless the host is an allowed development
/// host. (Names are resolved and their addresses checked again when the worker
/// connects.)
///
/// # Errors
/// The description of the violation, never echoing the URL.
pub fn endpoint_problem(policy: &crate::links::LinkPolicy, url: &str) -> Result<(), String> {
    endpoint_url(policy, url).map(|_| ())
}

/// [`endpoint_problem`], returning the parsed URL, which is the one to connect to (so what
/// was checked is what is connected to).
///
/// # Errors
/// As [`endpoint_problem`].
pub fn endpoint_url(policy: &crate::links::LinkPolicy, url: &str) -> Result<url::Url, String> {
    if url.len() > MAX_URL_BYTES {
        return Err(format!(
            "must be at most {MAX_URL_BYTES} bytes (the common practical URL limit)"
        ));
    }
    policy.problem(url)?;
    let parsed = url::Url::parse(url).map_err(|e| format!("is not a valid URL: {e}"))?;
    if !matches!(parsed.scheme(), "https" | "http") {
        return Err("must be an https:// URL".into());
    }
    let host = parsed.host().ok_or("names no host")?;
    let shown = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
    if dev_host(policy, shown.strip_suffix('.').unwrap_or(&shown)) {
        return Ok(parsed);
    }
    const NOT_PUBLIC: &str = "must not name a private, loopback, link-local or other non-public address (RFC 6890 special-purpose)";
    match host {
        url::Host::Ipv4(v4) if !is_public(IpAddr::V4(v4)) => return Err(NOT_PUBLIC.into()),
        url::Host::Ipv6(v6) if !is_public(IpAddr::V6(v6)) => return Err(NOT_PUBLIC.into()),
        url::Host::Domain(d) => {
            let d = d.to_ascii_lowercase();
            let d = d.strip_suffix('.').unwrap_or(&d);
            if d == "localhost" || d.ends_with(".localhost") {
                return Err(NOT_PUBLIC.into());
            }
            if !dns_name(d) {
                return Err("must name a valid DNS name (labels of 1 to 63 letters, digits, hyphens or underscores, not starting or ending with a hyphen; 253 characters at most) or an IP address".into());
            }
        }
        _ => {}
    }
    Ok(parsed)
}

/// Whether `d` (lowercase, without trailing dot, after IDNA: ASCII) is a DNS name a
/// resolver can be asked for: at most 253 characters of dot-separated labels of 1 to 63
/// letters, digits, `-` or `_` (RFC 1035 §2.3.4, RFC 1123 §2.1; `_` as service names use
/// it), no label starting or ending with `-`.
fn dns_name(d: &str) -> bool {
    !d.is_empty()
        && d.len() <= 253
        && d.split('.').all(|l| {
            (1..=63).contains(&l.len())
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The lowercase host of an `http(s)://` URL, without port (IPv6 literals keep brackets),
/// as written (not as the URL parser reads it: see [`endpoint_url`]).
pub fn host_of(url: &str) -> Option<String> {
    let lower = url.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if !port.contains(']') => h,
        _ => authority,
    };
    Some(host.to_string())
}

/// Whether `host` is one of the policy's development hosts (allowed to be anywhere,
/// loopback included).
pub fn dev_host(policy: &crate::links::LinkPolicy, host: &str) -> bool {
    crate::links::host_listed(&policy.http_hosts, host)
}

/// IPv4 blocks that are not globally reachable (IANA IPv4 Special-Purpose Address
/// Registry, RFC 6890 and its updates), plus multicast (RFC 5771) and reserved 240/4
/// (RFC 1112, with the limited broadcast 255.255.255.255): `(network, prefix length)`.
const V4_NOT_PUBLIC: [([u8; 4], u8); 16] = [
    ([0, 0, 0, 0], 8),       // "this network" (RFC 791)
    ([10, 0, 0, 0], 8),      // private (RFC 1918)
    ([100, 64, 0, 0], 10),   // shared address space, CGNAT (RFC 6598)
    ([127, 0, 0, 0], 8),     // loopback (RFC 1122)
    ([169, 254, 0, 0], 16),  // link-local (RFC 3927)
    ([172, 16, 0, 0], 12),   // private (RFC 1918)
    ([192, 0, 0, 0], 24),    // IETF protocol assignments (RFC 6890)
    ([192, 0, 2, 0], 24),    // documentation TEST-NET-1 (RFC 5737)
    ([192, 88, 99, 0], 24),  // deprecated 6to4 relay anycast (RFC 7526)
    ([192, 168, 0, 0], 16),  // private (RFC 1918)
    ([198, 18, 0, 0], 15),   // benchmarking (RFC 2544)
    ([198, 51, 100, 0], 24), // documentation TEST-NET-2 (RFC 5737)
    ([203, 0, 113, 0], 24),  // documentation TEST-NET-3 (RFC 5737)
    ([224, 0, 0, 0], 4),     // multicast (RFC 5771)
    ([240, 0, 0, 0], 4),     // reserved (RFC 1112), 255.255.255.255 included (RFC 919)
    ([255, 255, 255, 255], 32),
];

/// IPv6 blocks refused whole (IANA IPv6 Special-Purpose Address Registry, RFC 6890 and
/// its updates; multicast RFC 4291): `(network, prefix length)`. The blocks that embed
/// an IPv4 address (mapped, NAT64 64:ff9b::/96, 6to4) are judged by that address in
/// [`is_public`] instead.
const V6_NOT_PUBLIC: [(u128, u8); 13] = [
    (0, 96), // ::/96: ::, ::1, IPv4-compatible (deprecated, RFC 4291 §2.5.5.1)
    (0x0064_ff9b_0001 << 80, 48), // local-use NAT64 64:ff9b:1::/48 (RFC 8215)
    (0x0100 << 112, 64), // discard-only 100::/64 (RFC 6666)
    (0x2001 << 112, 32), // Teredo 2001::/32 (RFC 4380)
    ((0x2001 << 112) | (0x0002 << 96), 48), // benchmarking 2001:2::/48 (RFC 5180)
    ((0x2001 << 112) | (0x0db8 << 96), 32), // documentation 2001:db8::/32 (RFC 3849)
    (0x3fff << 112, 20), // documentation 3fff::/20 (RFC 9637)
    (0x5f00 << 112, 16), // SRv6 SIDs 5f00::/16 (RFC 9602)
    (0xfc00 << 112, 7), // unique local (RFC 4193)
    (0xfe80 << 112, 10), // link-local (RFC 4291)
    (0xfec0 << 112, 10), // site-local, deprecated (RFC 3879)
    (0xff00 << 112, 8), // multicast (RFC 4291)
    ((0x2001 << 112) | (0x0010 << 96), 28), // ORCHID 2001:10::/28 (RFC 4843, deprecated)
];

fn in_block(addr: u128, net: u128, prefix: u8, bits: u32) -> bool {
    let shift = bits - u32::from(prefix);
    shift >= bits || (addr >> shift) == (net >> shift)
}

/// Whether `ip` is a public unicast address a webhook may be POSTed to: not in any block
/// the IANA special-purpose address registries (RFC 6890 and its updates:
/// <https://www.iana.org/assignments/iana-ipv4-special-registry>,
/// <https://www.iana.org/assignments/iana-ipv6-special-registry>) mark not globally
/// reachable, nor multicast or reserved. IPv4: 0/8, 10/8, 100.64/10, 127/8, 169.254/16,
/// 172.16/12, 192.0.0/24, 192.0.2/24, 192.88.99/24, 192.168/16, 198.18/15,
/// 198.51.100/24, 203.0.113/24, 224/4, 240/4 (255.255.255.255 included). IPv6: ::/96
/// (::, ::1 and the deprecated IPv4-compatible form), 64:ff9b:1::/48, 100::/64, 2001::/32
/// (Teredo), 2001:2::/48, 2001:10::/28, 2001:db8::/32, 3fff::/20, 5f00::/16, fc00::/7,
/// fe80::/10, fec0::/10, ff00::/8; and the forms embedding an IPv4 address are judged by
/// it: ::ffff:0:0/96 (mapped), 64:ff9b::/96 (NAT64, RFC 6052), 2002::/16 (6to4, RFC 3056).
/// Used at registration and again by the worker when it connects.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let a = u128::from(u32::from(v4));
            !V4_NOT_PUBLIC
                .iter()
                .any(|(net, p)| in_block(a, u128::from(u32::from_be_bytes(*net)), *p, 32))
        }
        IpAddr::V6(v6) => {
            let a = u128::from(v6);
            let embedded = |bits: u128| {
                is_public(IpAddr::V4(std::net::Ipv4Addr::from(
                    (bits & 0xffff_ffff) as u32,
                )))
            };
            if in_block(a, 0xffff << 32, 96, 128) || in_block(a, 0x0064_ff9b << 96, 96, 128) {
                return embedded(a);
            }
            if in_block(a, 0x2002 << 112, 16, 128) {
                return embedded(a >> 80);
            }
            !V6_NOT_PUBLIC
                .iter()
                .any(|(net, p)| in_block(a, *net, *p, 128))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::links::LinkPolicy;

    // The example of the spec's reference libraries (standard-webhooks, python tests).
    #[test]
    fn the_signature_is_v1_base64_hmac_over_id_timestamp_body() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let sig = sign(
            secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_rotation_signs_with_both_secrets_space_separated() {
        let a = new_secret(&[1; SECRET_BYTES]);
        let b = new_secret(&[2; SECRET_BYTES]);
        let h = signature_header(&[&a, &b], "msg_1", 10, b"{}");
        let parts: Vec<&str> = h.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], sign(&a, "msg_1", 10, b"{}").unwrap());
        assert_eq!(parts[1], sign(&b, "msg_1", 10, b"{}").unwrap());
        assert_ne!(parts[0], parts[1]);
    }

    fn dev(hosts: &[&str]) -> LinkPolicy {
        LinkPolicy {
            http_hosts: hosts.iter().map(|h| h.to_string()).collect(),
            deep_link_schemes: vec![],
            ..Default::default()
        }
    }

    #[test]
    fn endpoints_must_be_https_and_public_unless_a_dev_host() {
        let p = dev(&["127.0.0.1"]);
        assert!(endpoint_problem(&p, "https://hooks.example.com/x").is_ok());
        assert!(endpoint_problem(&p, "http://127.0.0.1:9000/hook").is_ok());
        assert!(endpoint_problem(&p, "http://hooks.example.com/x").is_err());
        for bad in [
            "https://10.0.0.5/x",
            "https://192.168.1.1/",
            "https://169.254.169.254/latest",
            "https://[::1]/x",
            "https://[fe80::1]/x",
            "https://[::ffff:10.0.0.1]/x",
            "https://localhost/x",
            "https://100.64.0.1/",
        ] {
            assert!(endpoint_problem(&p, bad).is_err(), "{bad}");
        }
    }

    /// The spellings a tester had accepted (127.0.0.1 no dev host): each is an address the
    /// WHATWG parser (and so reqwest) reads as loopback or another non-public one.
    #[test]
    fn every_spelling_of_a_non_public_address_is_refused() {
        let p = dev(&[]);
        for bad in [
            "https://127.1:59830/a",
            "https://2130706433:59830/b",
            "https://0x7f000001:59830/c",
            "https://0177.0.0.1:59830/d",
            "https://127.0.0.1.:59830/e",
            "https://%31%32%37.0.0.1:59830/f",
            "https://127\u{3002}0\u{3002}0\u{3002}1:59830/g",
            "https://0x7f.1:443/",
            "https://0/",
            "https://0x0a.1/",
            "https://[::127.0.0.1]/",
            "https://[::]/",
            "https://[0:0:0:0:0:0:0:1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://[::ffff:7f00:1]/",
            "https://[64:ff9b::7f00:1]/",
            "https://[64:ff9b::10.0.0.1]/",
            "https://[64:ff9b:1::1]/",
            "https://[100::1]/",
            "https://[2001::1]/",
            "https://[2001:db8::1]/",
            "https://[2002:7f00:1::]/",
            "https://[2002:a9fe:a9fe::1]/",
            "https://[fc00::1]/",
            "https://[fd12:3456::1]/",
            "https://[fe80::1]/",
            "https://[fec0::1]/",
            "https://[ff02::1]/",
            "https://LOCALHOST./",
            "https://localhost/",
            "https://api.localhost/",
            "https://API.LocalHost./",
            "https://l%6fcalhost/",
            "https://255.255.255.255/",
            "https://224.0.0.1/",
            "https://240.0.0.1/",
            "https://192.0.0.8/",
            "https://192.0.2.1/",
            "https://198.18.0.1/",
            "https://198.51.100.7/",
            "https://203.0.113.9/",
            "https://172.31.255.255/",
        ] {
            let e = endpoint_problem(&p, bad).expect_err(bad);
            assert!(e.contains("non-public"), "{bad}: {e}");
            assert!(!e.contains("59830"), "the violation echoes no URL: {e}");
        }
    }

    #[test]
    fn public_addresses_and_names_are_accepted() {
        let p = dev(&[]);
        for ok in [
            "https://hooks.example.com/x",
            "https://93.184.216.34/",
            "https://[2606:4700::1]/",
            "https://[2002:5db8:d822::1]/",
            "https://[64:ff9b::5db8:d822]/",
            "https://[::ffff:93.184.216.34]/",
            "https://172.32.0.1/",
            "https://hooks.example.com.:8443/x?y=1",
            "https://b\u{fc}cher.example/",
            "https://_svc.example.com/",
        ] {
            assert_eq!(endpoint_problem(&p, ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn development_hosts_stay_exempt_however_spelt() {
        let p = dev(&["127.0.0.1", "localhost", ".test"]);
        for ok in [
            "http://127.0.0.1:9000/hook",
            "https://127.0.0.1/",
            "https://0x7f000001/",
            "http://localhost:8080/",
            "https://LOCALHOST./",
            "http://hooks.test/",
        ] {
            assert_eq!(endpoint_problem(&p, ok), Ok(()), "{ok}");
        }
        // A dev host over http must be written as listed (the link policy's rule).
        assert!(endpoint_problem(&p, "http://127.1/").is_err());
        assert!(endpoint_problem(&p, "https://[::1]/").is_err());
    }

    #[test]
    fn long_urls_bad_ports_and_bad_names_are_refused() {
        let p = dev(&[]);
        let long = format!("https://hooks.example.com/{}", "a".repeat(MAX_URL_BYTES));
        let e = endpoint_problem(&p, &long).unwrap_err();
        assert!(e.contains("2048 bytes"), "{e}");
        let at_limit = format!(
            "https://hooks.example.com/{}",
            "a".repeat(MAX_URL_BYTES - "https://hooks.example.com/".len())
        );
        assert_eq!(endpoint_problem(&p, &at_limit), Ok(()));
        let e = endpoint_problem(&p, "https://example.com:99999/").unwrap_err();
        assert!(e.contains("not a valid URL"), "{e}");
        for bad in [
            "https://-bad.example.com/",
            "https://a..example.com/",
            "https://ex$ample.com/",
            &format!("https://{}.com/", "a".repeat(64)),
        ] {
            assert!(endpoint_problem(&p, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_address_rule_covers_the_special_purpose_registries() {
        for (ip, public) in [
            ("8.8.8.8", true),
            ("1.1.1.1", true),
            ("100.63.255.255", true),
            ("100.128.0.0", true),
            ("198.20.0.0", true),
            ("223.255.255.255", true),
            ("0.1.2.3", false),
            ("100.127.255.255", false),
            ("127.255.255.254", false),
            ("198.19.255.255", false),
            ("2606:4700::1", true),
            ("2a00:1450::1", true),
            ("2001:4860::1", true),
            ("::", false),
            ("::1", false),
            ("::8.8.8.8", false),
            ("::ffff:8.8.8.8", true),
            ("::ffff:192.168.0.1", false),
            ("64:ff9b::8.8.8.8", true),
            ("64:ff9b::127.0.0.1", false),
            ("2002:0808:0808::", true),
            ("2002:c0a8:0001::", false),
            ("2001:0:4136:e378::", false),
            ("3fff::1", false),
            ("febf::1", false),
            ("fec0::1", false),
        ] {
            assert_eq!(is_public(ip.parse().unwrap()), public, "{ip}");
        }
    }
}
