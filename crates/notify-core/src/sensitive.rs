//! The sensitive-data policy applied to an event before it is stored: what
//! [`crate::guard`]'s findings do to it under the type's `sensitive_data` setting.
//!
//! - Identifiers (`event_key`, `actor_id`, `aggregate_key`, `recipients[i]`) are stored,
//!   shown to operators and used for dedup: they are never masked, so a finding there
//!   refuses the event whatever the type says ([`screen`]).
//! - Content (the payload and the text fields) is scanned as a reader would see it: HTML
//!   without tags and character references, URLs percent-decoded.
//! - With content findings, [`apply`] decides: `reject` refuses the event with one
//!   violation per field path; `mask` replaces the event's payload and text with masked
//!   copies, and refuses it if something is left that masking cannot reach (inside HTML
//!   markup or percent-encoding).
//!
//! A violation names the field and the kind of value, never the value. Pure: the caller
//! reads the type's policy (only when [`screen`] found something).

use crate::SensitiveData;
use crate::event::NewEvent;
use crate::guard::{self, Finding, Kind};
use crate::validate::FieldViolation;

/// Findings in one text field.
fn text_findings(field: &str, text: &str) -> Vec<Finding> {
    guard::scan_text(text)
        .into_iter()
        .map(|kind| Finding {
            path: field.to_string(),
            kind,
        })
        .collect()
}

/// Screens `event`: refuses it when an identifier carries sensitive data, else returns
/// the findings in its content (empty: nothing to decide, no policy needed).
///
/// # Errors
/// One violation per finding in an identifier.
pub fn screen(event: &NewEvent) -> Result<Vec<Finding>, Vec<FieldViolation>> {
    let mut id_findings = text_findings("event_key", &event.event_key);
    id_findings.extend(text_findings("actor_id", &event.actor_id));
    if let Some(a) = &event.aggregate_key {
        id_findings.extend(text_findings("aggregate_key", a));
    }
    for (i, r) in event.recipients.iter().enumerate() {
        id_findings.extend(text_findings(&format!("recipients[{i}]"), r));
    }
    if !id_findings.is_empty() {
        return Err(refusal(id_findings, "identifiers may not carry it"));
    }
    Ok(content_findings(event))
}

/// Findings in the payload and the text fields, each (path, kind) once.
fn content_findings(event: &NewEvent) -> Vec<Finding> {
    let mut findings = guard::scan_json("payload", &event.payload);
    let c = &event.content;
    for (field, text) in [
        ("content.title", c.title.clone()),
        ("content.body", c.body.clone()),
        ("content.email_subject", c.email_subject.clone()),
        ("content.email_html", c.email_html.clone()),
        ("content.email_html", guard::html_text(&c.email_html)),
        ("content.email_text", c.email_text.clone()),
        ("content.url", c.url.clone()),
        ("content.url", guard::percent_decoded(&c.url)),
    ] {
        for f in text_findings(field, &text) {
            if !findings.contains(&f) {
                findings.push(f);
            }
        }
    }
    findings
}

/// Applies `policy` to `event` given the content `findings` of [`screen`] (not empty):
/// `Mask` masks the payload and every text field in place and returns `Ok`; `Reject`
/// leaves the event alone.
///
/// # Errors
/// `Reject`: one violation per finding. `Mask`: one per finding masking cannot reach
/// (the event is then partly masked and must not be stored).
pub fn apply(
    event: &mut NewEvent,
    findings: Vec<Finding>,
    policy: SensitiveData,
) -> Result<(), Vec<FieldViolation>> {
    match policy {
        SensitiveData::Reject => Err(refusal(
            findings,
            "this notification type does not accept sensitive data (sensitive_data = reject)",
        )),
        SensitiveData::Mask => {
            event.payload = guard::mask_json(&event.payload);
            let c = &mut event.content;
            for text in [
                &mut c.title,
                &mut c.body,
                &mut c.email_subject,
                &mut c.email_html,
                &mut c.email_text,
                &mut c.url,
            ] {
                *text = guard::mask_text(text);
            }
            let left: Vec<Finding> = content_findings(event)
                .into_iter()
                .filter(|f| f.kind != Kind::SecretField)
                .collect();
            if left.is_empty() {
                Ok(())
            } else {
                Err(refusal(left, "it is encoded where it cannot be masked"))
            }
        }
    }
}

/// One violation per finding, saying `why`; never the value found.
fn refusal(findings: Vec<Finding>, why: &str) -> Vec<FieldViolation> {
    findings
        .into_iter()
        .map(|f| FieldViolation::new(f.path, format!("{}; {why}", f.kind.describe())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Thai national id with a valid check digit, and a Luhn-valid card number.
    const THAI_ID: &str = "1-1037-00123-45-8";
    const CARD: &str = "4111 1111 1111 1111";

    fn event(payload: serde_json::Value) -> NewEvent {
        let content = crate::Content {
            title: "Paid".into(),
            ..Default::default()
        };
        crate::test_fixtures::new_event("order:1", "order_paid", payload, content)
    }

    fn fields(v: &[FieldViolation]) -> Vec<&str> {
        v.iter().map(|v| v.field.as_str()).collect()
    }

    #[test]
    fn a_clean_event_has_no_findings() {
        assert_eq!(screen(&event(json!({"order": 1}))), Ok(vec![]));
    }

    #[test]
    fn identifiers_are_refused_whatever_the_policy_and_never_echoed() {
        let mut e = event(json!({}));
        e.actor_id = THAI_ID.into();
        e.recipients = vec!["u1".into(), format!("card {CARD}")];
        e.aggregate_key = Some(CARD.into());
        let v = screen(&e).unwrap_err();
        assert_eq!(fields(&v), ["actor_id", "aggregate_key", "recipients[1]"]);
        for x in &v {
            assert!(x.description.ends_with("identifiers may not carry it"));
            assert!(!x.description.contains("1111") && !x.description.contains("0123"));
        }
    }

    #[test]
    fn content_is_scanned_as_a_reader_sees_it() {
        let mut e = event(json!({"customer": {"id_card": THAI_ID}, "password": "hunter2"}));
        e.content.email_html = "<p>&#52;111 1111 1111 1111</p>".into();
        e.content.url = "https://shop.example/?c=4111%201111%201111%201111".into();
        let found = screen(&e).unwrap();
        let paths: Vec<(&str, Kind)> = found.iter().map(|f| (f.path.as_str(), f.kind)).collect();
        assert_eq!(
            paths,
            [
                ("payload.customer.id_card", Kind::ThaiNationalId),
                ("payload.password", Kind::SecretField),
                ("content.email_html", Kind::PaymentCard),
                ("content.url", Kind::PaymentCard),
            ]
        );
    }

    #[test]
    fn reject_refuses_with_one_violation_per_finding_and_changes_nothing() {
        let mut e = event(json!({"id": THAI_ID}));
        e.content.body = format!("card {CARD}");
        let before = e.clone();
        let found = screen(&e).unwrap();
        let v = apply(&mut e, found, SensitiveData::Reject).unwrap_err();
        assert_eq!(fields(&v), ["payload.id", "content.body"]);
        assert!(v[0].description.ends_with("(sensitive_data = reject)"));
        assert_eq!(e, before);
    }

    #[test]
    fn mask_stores_a_masked_copy() {
        let mut e = event(json!({"id": THAI_ID, "pin": "1234", "n": 1}));
        e.content.body = format!("card {CARD}");
        let found = screen(&e).unwrap();
        apply(&mut e, found, SensitiveData::Mask).unwrap();
        assert_eq!(
            e.payload,
            json!({"id": "X-XXXX-XXXX3-45-8", "pin": "[REDACTED]", "n": 1})
        );
        assert_eq!(e.content.body, "card XXXX XXXX XXXX 1111");
        assert_eq!(e.content.title, "Paid");
        // Only the redacted secret field is still named (its key is the finding).
        let left = screen(&e).unwrap();
        assert!(left.iter().all(|f| f.kind == Kind::SecretField), "{left:?}");
    }

    #[test]
    fn mask_refuses_what_it_cannot_reach() {
        let mut e = event(json!({}));
        e.content.email_html = "<p>&#52;111 1111 1111 1111</p>".into();
        let found = screen(&e).unwrap();
        let v = apply(&mut e, found, SensitiveData::Mask).unwrap_err();
        assert_eq!(fields(&v), ["content.email_html"]);
        assert!(
            v[0].description
                .ends_with("it is encoded where it cannot be masked")
        );
    }
}
