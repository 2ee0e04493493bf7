//! Keeping a push payload within its provider's byte limit.
//!
//! What gives way, in order:
//! 1. the body, shortened at a text boundary with an ellipsis
//!    ([`notify_core::text::shorten_to_fit`]), but never below [`MIN_BODY_CHARS`]
//!    characters (or the whole body when it is shorter);
//! 2. nothing else: the title, the image, the actions, the link, the thread and the
//!    overrides are what the sender asked for, and dropping one silently would show a
//!    different notification. When the payload still does not fit, the delivery fails
//!    permanently with `payload_too_large` before any call, and the attempt's response
//!    names the payload's largest parts with their sizes in bytes, so the sender knows what
//!    to cut.

use notify_core::text::{ELLIPSIS, shorten_to_fit};
use notify_core::{AttemptOutcome, ErrorClass};
use serde_json::{Value, json};

/// Fewest characters of the body that are kept when it has to be shortened (the whole
/// body when it is shorter): about one short Thai sentence. Below this a notification
/// says too little to be worth sending, so the image, actions or data must give way
/// instead (the sender's choice, named in the failure).
pub const MIN_BODY_CHARS: usize = 40;

/// How one provider's payload is built, measured and described.
pub(crate) struct Fit<'a, B: Fn(&str) -> Value> {
    /// Provider name used in the failure text (`FCM`, `APNs`, `Web Push`).
    pub(crate) provider: &'a str,
    /// Most bytes the payload may have.
    pub(crate) limit: usize,
    /// The payload carrying a given body.
    pub(crate) build: B,
    /// The JSON-pointer paths of the payload's parts named in a failure (e.g.
    /// `/message/data`); each is measured as its JSON text.
    pub(crate) parts: &'a [&'a str],
}

impl<B: Fn(&str) -> Value> Fit<'_, B> {
    /// The payload for the longest version of `body` whose size (measured by `size`)
    /// fits the limit. `Err` is the attempt's permanent `payload_too_large` outcome when
    /// the body would have to be cut below [`MIN_BODY_CHARS`].
    pub(crate) fn fit(
        &self,
        body: &str,
        size: impl Fn(&Value) -> usize,
    ) -> Result<Value, Box<AttemptOutcome>> {
        let fits = |b: &str| size(&(self.build)(b)) <= self.limit;
        let floor = MIN_BODY_CHARS.min(body.chars().count());
        if let Some(fitted) = shorten_to_fit(body, fits)
            && fitted.trim_end_matches(ELLIPSIS).chars().count() >= floor
        {
            return Ok((self.build)(&fitted));
        }
        let kept: String = body.chars().take(floor).collect();
        let smallest = (self.build)(&kept);
        let bytes = size(&smallest);
        let mut parts: Vec<(&str, usize)> = self
            .parts
            .iter()
            .filter_map(|p| smallest.pointer(p).map(|v| (*p, v.to_string().len())))
            .collect();
        parts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let named = parts
            .iter()
            .map(|(p, n)| format!("{p} {n} bytes"))
            .collect::<Vec<_>>()
            .join(", ");
        Err(Box::new(
            AttemptOutcome::failed(
                ErrorClass::Permanent,
                "payload_too_large",
                json!({"request": smallest}),
            )
            .with_response(format!(
                "the {provider} payload is {bytes} bytes with the body cut to {floor} characters; \
                 {provider} allows {limit}; its largest parts: {named}",
                provider = self.provider,
                limit = self.limit,
            )),
        ))
    }

    /// [`Fit::fit`] for a payload whose size is its JSON text.
    pub(crate) fn fit_json(&self, body: &str) -> Result<Value, Box<AttemptOutcome>> {
        self.fit(body, |v| v.to_string().len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(limit: usize) -> Fit<'static, impl Fn(&str) -> Value> {
        Fit {
            provider: "Test",
            limit,
            build: |b: &str| json!({"body": b, "image": "https://cdn.example.test/i.png", "data": {"k": "x".repeat(100)}}),
            parts: &["/image", "/data", "/missing"],
        }
    }

    #[test]
    fn a_body_that_fits_is_sent_whole() {
        let v = fit(4096).fit_json("สวัสดี").unwrap();
        assert_eq!(v["body"], "สวัสดี");
    }

    #[test]
    fn a_long_body_is_shortened_to_the_limit_and_no_further() {
        let body = "ก".repeat(2000);
        let v = fit(1000).fit_json(&body).unwrap();
        let len = v.to_string().len();
        assert!(len <= 1000 && len > 1000 - 4, "{len}");
        assert!(v["body"].as_str().unwrap().ends_with(ELLIPSIS));
    }

    #[test]
    fn what_cannot_fit_above_the_minimum_body_fails_naming_the_largest_parts() {
        // The fixed parts take ~190 bytes; 40 Thai characters need 120 more.
        let body = "ข".repeat(200);
        let out = fit(250).fit_json(&body).unwrap_err();
        let text = format!("{out:?}");
        assert!(text.contains("payload_too_large"), "{text}");
        assert!(
            text.contains("body cut to 40 characters")
                && text.contains("/data 108 bytes, /image 32 bytes"),
            "{text}"
        );
        assert!(!text.contains("/missing"), "{text}");
    }

    #[test]
    fn a_short_body_is_never_cut_below_itself() {
        // 10 characters is under the minimum: the body is kept whole or the send fails.
        let body = "ค".repeat(10);
        assert!(fit(150).fit_json(&body).is_err());
        assert_eq!(fit(4096).fit_json(&body).unwrap()["body"], body.as_str());
    }
}
