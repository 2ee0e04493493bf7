//! Push endpoints a device registers: the registration's check ([`check_endpoint`]) and
//! the rule a Web Push endpoint URL follows ([`LinkPolicy::web_push_endpoint`]: a known
//! push service on a public address, the status webhooks' URL rule). Pure.

use crate::links::{LinkPolicy, host_listed};
use crate::validate::Violations;
use crate::webhook;

impl LinkPolicy {
    /// The URL to POST a Web Push message to, if `endpoint` (a `PushSubscription`'s
    /// endpoint, W3C Push API) may be one: an `https://` URL passing the public-address
    /// rule of status webhooks ([`webhook::endpoint_url`]: no private, loopback,
    /// link-local or other special-purpose address however spelt, no `localhost`, no
    /// `user:password@`, at most 2,048 bytes) whose host, as the URL parser reads it, is
    /// one of [`Self::web_push_hosts`]. Checked when a device is registered and again
    /// before every send, so a row written some other way is never connected to.
    ///
    /// # Errors
    /// The rule broken, never echoing the URL.
    pub fn web_push_endpoint(&self, endpoint: &str) -> Result<url::Url, String> {
        if !endpoint
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        {
            return Err("must be an https:// URL".into());
        }
        let url = webhook::endpoint_url(self, endpoint)?;
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        let host = host.strip_suffix('.').unwrap_or(&host);
        if !matches!(url.host(), Some(url::Host::Domain(_)))
            || !host_listed(&self.web_push_hosts, host)
        {
            return Err(format!(
                "must name a known push service ({}; NOTIFY_WEB_PUSH_HOSTS)",
                self.web_push_hosts.join(", ")
            ));
        }
        Ok(url)
    }
}

/// Checks a push endpoint registration: `platform` `fcm` or `apns` with a `token`, or
/// `webpush` with a subscription `(endpoint, p256dh, auth)` (W3C Push API; RFC 8291: p256dh
/// is a 65-byte uncompressed P-256 point, auth 16 bytes, both base64url) whose endpoint
/// the link policy allows ([`LinkPolicy::web_push_endpoint`]: a known push
/// service on a public address). Returns what to store: the token (the endpoint URL for
/// Web Push) and the subscription keys.
pub fn check_endpoint(
    v: &mut Violations,
    links: &LinkPolicy,
    platform: &str,
    token: &str,
    web_push: Option<(&str, &str, &str)>,
) -> (String, Option<serde_json::Value>) {
    match platform {
        "fcm" | "apns" => {
            if v.check_id("token", token, 4096) && token.chars().any(char::is_whitespace) {
                v.add("token", "must not contain whitespace");
            }
            if web_push.is_some() {
                v.add("web_push", "must be empty for platform fcm and apns");
            }
            (token.to_string(), None)
        }
        "webpush" => match web_push {
            None => {
                v.add("web_push", "is required for platform webpush");
                (String::new(), None)
            }
            Some((endpoint, p256dh, auth)) => {
                if !token.is_empty() {
                    v.add(
                        "token",
                        "must be empty for platform webpush (the endpoint is in web_push)",
                    );
                }
                if let Err(why) = links.web_push_endpoint(endpoint) {
                    v.add("web_push.endpoint", why);
                }
                let b64url = |x: &str, lens: std::ops::RangeInclusive<usize>| {
                    lens.contains(&x.len())
                        && x.chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '='))
                };
                if !b64url(p256dh, 86..=88) {
                    v.add(
                        "web_push.p256dh",
                        "must be a base64url P-256 public key (65 bytes)",
                    );
                }
                if !b64url(auth, 22..=24) {
                    v.add("web_push.auth", "must be a base64url 16-byte secret");
                }
                (
                    endpoint.to_string(),
                    Some(serde_json::json!({"p256dh": p256dh, "auth": auth})),
                )
            }
        },
        _ => {
            v.add("platform", "must be one of fcm, apns, webpush");
            (String::new(), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_push_endpoints_must_be_known_push_services_on_public_addresses() {
        let p = LinkPolicy::default();
        for ok in [
            "https://fcm.googleapis.com/fcm/send/abc:APA91b",
            "https://updates.push.services.mozilla.com/wpush/v2/gAAAA",
            "https://web.push.apple.com/QGuQyavXut",
            "https://wns2-par02p.notify.windows.com/w/?token=BQYAAA",
            "HTTPS://FCM.googleapis.com/fcm/send/x",
        ] {
            assert!(p.web_push_endpoint(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://fcm.googleapis.com/fcm/send/x",
            "https://127.0.0.1/x",
            "https://169.254.169.254/latest",
            "https://10.0.0.1/x",
            "https://localhost/x",
            "https://[::1]/x",
            "https://0x7f000001/x",
            "https://user:pw@fcm.googleapis.com/x",
            "https://fcm.googleapis.com.evil.test/x",
            "https://evil.test/fcm.googleapis.com",
            "https://notify.windows.com.evil.test/x",
        ] {
            assert!(p.web_push_endpoint(bad).is_err(), "{bad}");
        }
        // Even a list naming an address keeps IP literals out.
        let p = LinkPolicy {
            web_push_hosts: vec!["127.0.0.1".into()],
            ..Default::default()
        };
        assert!(p.web_push_endpoint("https://127.0.0.1/x").is_err());
    }
}
