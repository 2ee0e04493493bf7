//! Status webhooks to callers, as the Standard Webhooks specification defines them
//! (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>):
//! the event types a caller may subscribe to, the `whsec_` secret, the
//! `webhook-signature` value (`v1,` + base64 of HMAC-SHA256 over
//! `{webhook-id}.{webhook-timestamp}.{body}`, keyed with the base64-decoded part after
//! `whsec_`; several space-separated during a rotation), and the endpoint URL rule
//! (the link policy, plus no private, loopback or link-local address literal).
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

    /// The event type of a delivery that just reached `status` (a stored delivery status);
    /// `None` for `sending` (a claim is no state a caller is told about) and unknown text.
    /// `pending` after a change is a retry or a deferral.
    pub fn of_delivery_status(status: &str) -> Option<EventType> {
        Some(match status {
            "sent" => EventType::DeliverySent,
            "failed" => EventType::DeliveryFailed,
            "pending" => EventType::DeliveryDeferred,
            "canceled" => EventType::DeliveryCancelled,
            "skipped" => EventType::DeliverySkipped,
            _ => return None,
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

/// Why `url` may not be a webhook endpoint: the link policy's rule (https with a host;
/// plain http only for `NOTIFY_DEV_HTTP_HOSTS`), and a host that is an IP literal must
/// not be private, loopback, link-local, unspecified or otherwise non-public unless it is
/// an allowed development host. (Names are resolved and their addresses checked again
/// when the worker connects.)
pub fn endpoint_problem(policy: &crate::links::LinkPolicy, url: &str) -> Result<(), String> {
    policy.problem(url)?;
    let host = host_of(url).unwrap_or_default();
    if dev_host(policy, &host) {
        return Ok(());
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>()
        && !is_public(ip)
    {
        return Err("must not name a private, loopback or link-local address".into());
    }
    if bare == "localhost" || bare.ends_with(".localhost") {
        return Err("must not name a private, loopback or link-local address".into());
    }
    Ok(())
}

/// The lowercase host of an `http(s)://` URL, without port (IPv6 literals keep brackets).
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
    policy.http_hosts.iter().any(|h| match h.strip_prefix('.') {
        Some(domain) => host == domain || host.ends_with(&format!(".{domain}")),
        None => host == h,
    })
}

/// Whether `ip` is a public unicast address: not private (RFC 1918, fc00::/7), loopback,
/// link-local (169.254/16, fe80::/10), unspecified, broadcast, documentation, CGNAT
/// (100.64/10), benchmarking (198.18/15), multicast or an IPv4-mapped form of those.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_multicast()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || s[0] == 0x2001 && s[1] == 0x0db8)
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

    #[test]
    fn endpoints_must_be_https_and_public_unless_a_dev_host() {
        let p = LinkPolicy {
            http_hosts: vec!["127.0.0.1".into()],
            deep_link_schemes: vec![],
        };
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
}
