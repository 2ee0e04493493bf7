//! Templates per notification type x channel x locale, rendered with minijinja.
//!
//! A template gives any of `title`, `body`, `email_subject` and `email_html` (empty
//! fields keep the caller's content). The context is `payload` (the event's payload),
//! `content` (what the caller sent), `recipient` (`user_id`, `display_name`, `locale`,
//! `timezone`), `event` (`id`, `key`, `type`) and `digest` (`count`, `items`: each with
//! `event_key`, `payload`, `content`; one item, this event, when not a digest). Undefined variables are errors (strict),
//! so a typo fails when the type is saved, against its sample payload, not at send time.
//! `email_html` is HTML-escaped automatically; the other fields are plain text.
//!
//! Choosing a template for a recipient, first match wins: the recipient's locale
//! (`th-TH`), its language (`th`), the type's default locale and its language; at each
//! step the channel's own template before one for every channel (`*`).
//!
//! Filters, in the recipient's locale and time zone:
//! - `amount|money` or `amount|money("USD")`: grouped digits and two decimals, `1,250.00
//!   บาท` in Thai for THB, `THB 1,250.00` otherwise;
//! - `when|date`, `when|date("short")`, `when|datetime`: an RFC 3339 string or Unix
//!   seconds in the recipient's time zone; Thai uses Thai month names and the Buddhist-era
//!   year (CE + 543): `1 ธันวาคม 2569`, `1 ธ.ค. 2569`, `1 ธันวาคม 2569 14:30 น.`.
//!
//! Rendering is sandboxed: no file or network access, at most 50,000 instructions
//! (minijinja fuel) and 20 levels of nesting per render.

use crate::event::Content;
use crate::validate::FieldViolation;
use chrono::{DateTime, Datelike, Timelike, Utc};
use minijinja::value::Value as JValue;
use minijinja::{Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One template: a type's wording for one channel (or `*`) and one locale.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// Channel name or `*`.
    pub channel: String,
    /// BCP 47 tag (`th-TH`) or language (`th`, `en`).
    pub locale: String,
    /// Title (inbox, push, LINE first line, default email subject).
    #[serde(default)]
    pub title: String,
    /// Main text.
    #[serde(default)]
    pub body: String,
    /// Email subject.
    #[serde(default)]
    pub email_subject: String,
    /// Email HTML part (auto-escaped).
    #[serde(default)]
    pub email_html: String,
}

/// Who and what a template is rendered for.
#[derive(Debug, Clone, Serialize)]
pub struct RenderContext<'a> {
    /// The event's payload.
    pub payload: &'a Value,
    /// The caller's content.
    pub content: &'a Content,
    /// The recipient.
    pub recipient: RecipientContext<'a>,
    /// The event.
    pub event: EventContext<'a>,
    /// The events a digest lists (one, this event's, when not a digest).
    pub digest: DigestContext,
}

/// `digest` in the template context: the events a digest delivery lists (for a delivery
/// that is not a digest, just its own event).
#[derive(Debug, Clone, Serialize)]
pub struct DigestContext {
    /// How many events.
    pub count: usize,
    /// The events, oldest first.
    pub items: Vec<DigestItem>,
}

/// One event of a digest.
#[derive(Debug, Clone, Serialize)]
pub struct DigestItem {
    /// The caller's event key.
    pub event_key: String,
    /// Its payload.
    pub payload: Value,
    /// Its content.
    pub content: Content,
}

/// The content of a digest without a template: the latest title with the number of
/// others (`ตอบกลับใหม่ (+4)`), and one line per event (`• title: body`), oldest first.
pub fn default_digest_content(items: &[DigestItem]) -> Content {
    let Some(last) = items.last() else {
        return Content::default();
    };
    let title = if items.len() == 1 {
        last.content.title.clone()
    } else {
        format!("{} (+{})", last.content.title, items.len() - 1)
    };
    let body = items
        .iter()
        .map(|i| {
            if i.content.body.is_empty() {
                format!("• {}", i.content.title)
            } else {
                format!("• {}: {}", i.content.title, i.content.body)
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    Content {
        title,
        body,
        url: last.content.url.clone(),
        ..Default::default()
    }
}

/// `recipient` in the template context.
#[derive(Debug, Clone, Serialize)]
pub struct RecipientContext<'a> {
    /// User id.
    pub user_id: &'a str,
    /// Display name (may be empty).
    pub display_name: &'a str,
    /// BCP 47 locale.
    pub locale: &'a str,
    /// IANA time zone.
    pub timezone: &'a str,
}

/// `event` in the template context.
#[derive(Debug, Clone, Serialize)]
pub struct EventContext<'a> {
    /// Event id.
    pub id: String,
    /// Caller's event key.
    pub key: &'a str,
    /// Type key.
    #[serde(rename = "type")]
    pub type_key: &'a str,
}

/// A template that failed to render: which one, where, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template {name} line {line}: {message}")]
pub struct TemplateError {
    /// `<type>/<channel>/<locale>:<field>`.
    pub name: String,
    /// 1-based line in that field (0 when unknown).
    pub line: usize,
    /// What went wrong.
    pub message: String,
}

/// Most bytes in one template field.
pub const MAX_TEMPLATE_BYTES: usize = 64 * 1024;

/// Most minijinja instructions one render may run.
pub const FUEL: u64 = 50_000;

const TH_MONTHS: [&str; 12] = [
    "มกราคม",
    "กุมภาพันธ์",
    "มีนาคม",
    "เมษายน",
    "พฤษภาคม",
    "มิถุนายน",
    "กรกฎาคม",
    "สิงหาคม",
    "กันยายน",
    "ตุลาคม",
    "พฤศจิกายน",
    "ธันวาคม",
];
const TH_MONTHS_SHORT: [&str; 12] = [
    "ม.ค.",
    "ก.พ.",
    "มี.ค.",
    "เม.ย.",
    "พ.ค.",
    "มิ.ย.",
    "ก.ค.",
    "ส.ค.",
    "ก.ย.",
    "ต.ค.",
    "พ.ย.",
    "ธ.ค.",
];
const EN_MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

fn language(locale: &str) -> &str {
    locale.split(['-', '_']).next().unwrap_or(locale)
}

/// Picks the template for `channel` and `locale` (fallback order in the module docs).
pub fn pick<'a>(
    templates: &'a [Template],
    channel: &str,
    locale: &str,
    default_locale: &str,
) -> Option<&'a Template> {
    let mut chain: Vec<&str> = vec![
        locale,
        language(locale),
        default_locale,
        language(default_locale),
    ];
    chain.dedup();
    chain.iter().find_map(|loc| {
        let same = |t: &&Template| t.locale.eq_ignore_ascii_case(loc);
        templates
            .iter()
            .filter(same)
            .find(|t| t.channel == channel)
            .or_else(|| templates.iter().filter(same).find(|t| t.channel == "*"))
    })
}

fn recipient_attr(state: &State, attr: &str, default: &str) -> String {
    state
        .lookup("recipient")
        .and_then(|r| r.get_attr(attr).ok())
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| default.to_string())
}

/// `1234567.5` -> `1,234,567.50`.
fn group_digits(amount: f64) -> String {
    let cents = (amount.abs() * 100.0).round() as u128;
    let (units, frac) = (cents / 100, cents % 100);
    let digits = units.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{}{out}.{frac:02}", if amount < 0.0 { "-" } else { "" })
}

fn money(state: &State, value: JValue, currency: Option<String>) -> Result<String, Error> {
    let amount = match value.as_str() {
        Some(s) => s.replace(',', "").trim().parse::<f64>().ok(),
        None => f64::try_from(value.clone()).ok(),
    }
    .ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("money: {value} is not an amount"),
        )
    })?;
    let currency = currency
        .unwrap_or_else(|| "THB".into())
        .to_ascii_uppercase();
    let locale = recipient_attr(state, "locale", "th-TH");
    Ok(if language(&locale) == "th" && currency == "THB" {
        format!("{} บาท", group_digits(amount))
    } else {
        format!("{currency} {}", group_digits(amount))
    })
}

fn instant(value: &JValue) -> Option<DateTime<Utc>> {
    match value.as_str() {
        Some(s) => s.parse::<DateTime<Utc>>().ok(),
        None => i64::try_from(value.clone())
            .ok()
            .and_then(|s| DateTime::from_timestamp(s, 0)),
    }
}

fn format_date(
    state: &State,
    value: JValue,
    style: &str,
    with_time: bool,
) -> Result<String, Error> {
    let at = instant(&value).ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("date: {value} is not an RFC 3339 time or Unix seconds"),
        )
    })?;
    let tz = crate::validate::parse_timezone(&recipient_attr(state, "timezone", "Asia/Bangkok"))
        .unwrap_or(chrono_tz::Asia::Bangkok);
    let local = at.with_timezone(&tz);
    let m = local.month0() as usize;
    let thai = language(&recipient_attr(state, "locale", "th-TH")) == "th";
    let mut out = match (thai, style) {
        (true, "short") => format!(
            "{} {} {}",
            local.day(),
            TH_MONTHS_SHORT[m],
            local.year() + 543
        ),
        (true, _) => format!("{} {} {}", local.day(), TH_MONTHS[m], local.year() + 543),
        (false, "short") => format!("{} {} {}", local.day(), &EN_MONTHS[m][..3], local.year()),
        (false, _) => format!("{} {} {}", local.day(), EN_MONTHS[m], local.year()),
    };
    if with_time {
        out.push_str(&format!(" {:02}:{:02}", local.hour(), local.minute()));
        if thai {
            out.push_str(" น.");
        }
    }
    Ok(out)
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(20);
    env.set_auto_escape_callback(|name| {
        if name.ends_with(":email_html") {
            minijinja::AutoEscape::Html
        } else {
            minijinja::AutoEscape::None
        }
    });
    env.add_filter("money", money);
    env.add_filter("date", |state: &State, v: JValue, style: Option<String>| {
        format_date(state, v, style.as_deref().unwrap_or("long"), false)
    });
    env.add_filter(
        "datetime",
        |state: &State, v: JValue, style: Option<String>| {
            format_date(state, v, style.as_deref().unwrap_or("long"), true)
        },
    );
    env
}

/// Renders `template` of type `type_key` for `ctx` into the content to send: the
/// template's non-empty fields replace the caller's.
pub fn render(
    type_key: &str,
    template: &Template,
    ctx: &RenderContext,
) -> Result<Content, TemplateError> {
    let env = environment();
    let context = JValue::from(minijinja::value::Serde(ctx));
    let mut out = ctx.content.clone();
    let fields: [(&str, &str, &mut String); 4] = [
        ("title", &template.title, &mut out.title),
        ("body", &template.body, &mut out.body),
        (
            "email_subject",
            &template.email_subject,
            &mut out.email_subject,
        ),
        ("email_html", &template.email_html, &mut out.email_html),
    ];
    for (field, source, slot) in fields {
        if source.is_empty() {
            continue;
        }
        let name = format!(
            "{type_key}/{}/{}:{field}",
            template.channel, template.locale
        );
        let rendered = env
            .render_named_str(&name, source, context.clone())
            .map_err(|e| TemplateError {
                line: e.line().unwrap_or(0),
                message: e
                    .detail()
                    .map(str::to_string)
                    .unwrap_or_else(|| e.kind().to_string()),
                name: name.clone(),
            })?;
        *slot = rendered;
    }
    Ok(out)
}

/// Checks every template of a type by rendering it against `sample_payload` for a Thai
/// recipient in Asia/Bangkok: a violation per broken field (`templates[i].body`, ...),
/// naming the line.
pub fn validate(
    type_key: &str,
    templates: &[Template],
    sample_payload: &Value,
) -> Vec<FieldViolation> {
    let content = Content {
        title: "sample".into(),
        body: "sample".into(),
        ..Default::default()
    };
    let mut out = Vec::new();
    for (i, t) in templates.iter().enumerate() {
        if t.channel != "*" && t.channel.parse::<crate::Channel>().is_err() {
            out.push(FieldViolation::new(
                format!("templates[{i}].channel"),
                "must be a channel name or \"*\"",
            ));
        }
        if t.locale.is_empty() || t.locale.len() > 35 {
            out.push(FieldViolation::new(
                format!("templates[{i}].locale"),
                "must be a BCP 47 tag such as th-TH or en",
            ));
        }
        let ctx = RenderContext {
            payload: sample_payload,
            content: &content,
            recipient: RecipientContext {
                user_id: "sample-user",
                display_name: "ตัวอย่าง",
                locale: &t.locale,
                timezone: "Asia/Bangkok",
            },
            event: EventContext {
                id: uuid::Uuid::nil().to_string(),
                key: "sample",
                type_key,
            },
            digest: DigestContext {
                count: 2,
                items: vec![
                    DigestItem {
                        event_key: "sample-1".into(),
                        payload: sample_payload.clone(),
                        content: content.clone(),
                    };
                    2
                ],
            },
        };
        if let Err(e) = render(type_key, t, &ctx) {
            let field = e.name.rsplit(':').next().unwrap_or("body").to_string();
            out.push(FieldViolation::new(
                format!("templates[{i}].{field}"),
                format!(
                    "line {}: {} (rendered against sample_payload)",
                    e.line, e.message
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(channel: &str, locale: &str, body: &str) -> Template {
        Template {
            channel: channel.into(),
            locale: locale.into(),
            body: body.into(),
            ..Default::default()
        }
    }

    fn ctx<'a>(payload: &'a Value, content: &'a Content, locale: &'a str) -> RenderContext<'a> {
        RenderContext {
            payload,
            content,
            recipient: RecipientContext {
                user_id: "u1",
                display_name: "สมชาย",
                locale,
                timezone: "Asia/Bangkok",
            },
            event: EventContext {
                id: "e1".into(),
                key: "order:1001:paid",
                type_key: "order_paid",
            },
            digest: DigestContext {
                count: 0,
                items: vec![],
            },
        }
    }

    #[test]
    fn the_locale_chain_falls_back_to_the_language_then_the_default() {
        let ts = [
            t("email", "th", "th email"),
            t("*", "th-TH", "th-TH any"),
            t("*", "en", "en any"),
        ];
        assert_eq!(pick(&ts, "line", "th-TH", "en").unwrap().body, "th-TH any");
        assert_eq!(
            pick(&ts, "email", "th-TH", "en").unwrap().body,
            "th-TH any",
            "locale before channel"
        );
        assert_eq!(pick(&ts, "email", "th", "en").unwrap().body, "th email");
        assert_eq!(pick(&ts, "email", "ja-JP", "en").unwrap().body, "en any");
        assert!(pick(&ts, "email", "ja-JP", "fr").is_none());
    }

    #[test]
    fn thai_money_and_buddhist_era_dates_in_the_recipients_zone() {
        let payload = json!({"total": "1250", "paid_at": "2026-11-30T18:30:00Z", "items": 3});
        let content = Content::default();
        let tpl = Template {
            channel: "*".into(),
            locale: "th".into(),
            title: "ชำระเงิน {{ payload.total|money }} แล้ว".into(),
            body: "วันที่ {{ payload.paid_at|date }} ({{ payload.paid_at|date('short') }}) เวลา {{ payload.paid_at|datetime }}".into(),
            ..Default::default()
        };
        let out = render("order_paid", &tpl, &ctx(&payload, &content, "th-TH")).unwrap();
        assert_eq!(out.title, "ชำระเงิน 1,250.00 บาท แล้ว");
        // 18:30 UTC is 01:30 on 1 December in Bangkok; 2026 CE is 2569 BE.
        assert_eq!(
            out.body,
            "วันที่ 1 ธันวาคม 2569 (1 ธ.ค. 2569) เวลา 1 ธันวาคม 2569 01:30 น."
        );
        let en = render(
            "order_paid",
            &Template {
                locale: "en".into(),
                ..tpl
            },
            &ctx(&payload, &content, "en-US"),
        )
        .unwrap();
        assert_eq!(en.title, "ชำระเงิน THB 1,250.00 แล้ว");
        assert!(en.body.contains("1 December 2026"), "{}", en.body);
        assert_eq!(group_digits(1234567.5), "1,234,567.50");
        assert_eq!(group_digits(-5.0), "-5.00");
    }

    #[test]
    fn errors_name_the_template_and_line_and_html_is_escaped() {
        let payload = json!({"name": "<b>สมชาย</b>"});
        let content = Content::default();
        let broken = t("email", "th", "สวัสดี\n{{ payload.missing.deeper }}");
        let e = render("order_paid", &broken, &ctx(&payload, &content, "th")).unwrap_err();
        assert_eq!(e.name, "order_paid/email/th:body");
        assert_eq!(e.line, 2);
        let html = Template {
            email_html: "<p>{{ payload.name }}</p>".into(),
            ..t("email", "th", "{{ payload.name }}")
        };
        let out = render("order_paid", &html, &ctx(&payload, &content, "th")).unwrap();
        assert_eq!(out.email_html, "<p>&lt;b&gt;สมชาย&lt;&#x2f;b&gt;</p>");
        assert_eq!(out.body, "<b>สมชาย</b>", "plain text is not escaped");
        let endless = t("*", "th", "{% for i in range(100000) %}{{ i }}{% endfor %}");
        assert!(
            render("order_paid", &endless, &ctx(&payload, &content, "th")).is_err(),
            "fuel runs out"
        );
        let v = validate(
            "order_paid",
            &[t("*", "th", "ok"), broken, t("fax", "th", "x")],
            &payload,
        );
        let fields: Vec<&str> = v.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["templates[1].body", "templates[2].channel"]);
    }
}
