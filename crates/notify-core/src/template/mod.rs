//! Templates per notification type x channel x locale, rendered with minijinja.
//!
//! A template gives any of `title`, `body`, `email_subject`, `email_html`, and the rich
//! fields `url`, `image_url`, `thread`, `actions`, `badge` and `overrides` (empty fields
//! keep the caller's content). Every string of the rich fields is a template too, down to
//! each text of a LINE Flex card given as JSON in `overrides.line_messages`. The context is `payload` (the event's payload),
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

use crate::content::Content;
use crate::validate::FieldViolation;
use minijinja::value::Value as JValue;
use minijinja::{Environment, State, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod filters;

/// One template: a type's wording for one channel (or `*`) and one locale.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// The tap link.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// The image URL.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_url: String,
    /// The thread key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub thread: String,
    /// The actions; each label, URL and id is a template. Non-empty = replaces the
    /// caller's actions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<crate::Action>,
    /// The badge policy; unchanged = the caller's.
    #[serde(default, skip_serializing_if = "crate::Badge::is_unchanged")]
    pub badge: crate::Badge,
    /// Per-channel overrides; every string in them is a template (in the LINE messages,
    /// every string value of the JSON tree, so a Flex card's structure is plain JSON and
    /// its texts are templates). A non-empty field replaces the caller's.
    #[serde(default, skip_serializing_if = "crate::Overrides::is_empty")]
    pub overrides: crate::Overrides,
}

impl Template {
    /// The fields beyond title, body, email subject and HTML (`url`, `image_url`,
    /// `thread`, `actions`, `badge`, `overrides`) as one JSON object, as the store keeps
    /// them; `{}` when none is set.
    pub fn rich_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            for k in [
                "channel",
                "locale",
                "title",
                "body",
                "email_subject",
                "email_html",
            ] {
                m.remove(k);
            }
        }
        v
    }

    /// Sets the fields [`Template::rich_json`] gives from such an object.
    ///
    /// # Errors
    /// The object does not have that shape.
    pub fn set_rich_json(&mut self, rich: Value) -> Result<(), serde_json::Error> {
        #[derive(Deserialize)]
        struct Rich {
            #[serde(default)]
            url: String,
            #[serde(default)]
            image_url: String,
            #[serde(default)]
            thread: String,
            #[serde(default)]
            actions: Vec<crate::Action>,
            #[serde(default)]
            badge: crate::Badge,
            #[serde(default)]
            overrides: crate::Overrides,
        }
        let r: Rich = serde_json::from_value(rich)?;
        self.url = r.url;
        self.image_url = r.image_url;
        self.thread = r.thread;
        self.actions = r.actions;
        self.badge = r.badge;
        self.overrides = r.overrides;
        Ok(())
    }
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
    env.add_filter("money", filters::money);
    env.add_filter("date", |state: &State, v: JValue, style: Option<String>| {
        filters::format_date(state, v, style.as_deref().unwrap_or("long"), false)
    });
    env.add_filter(
        "datetime",
        |state: &State, v: JValue, style: Option<String>| {
            filters::format_date(state, v, style.as_deref().unwrap_or("long"), true)
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
        *slot = render_one(&env, name, source, &context)?;
    }
    render_rich(&env, type_key, template, &context, &mut out)?;
    Ok(out)
}

/// Renders one template text named `name`, an error naming it and the line.
fn render_one(
    env: &Environment,
    name: String,
    source: &str,
    context: &JValue,
) -> Result<String, TemplateError> {
    env.render_named_str(&name, source, context.clone())
        .map_err(|e| TemplateError {
            line: e.line().unwrap_or(0),
            message: e
                .detail()
                .map(str::to_string)
                .unwrap_or_else(|| e.kind().to_string()),
            name,
        })
}

/// Renders every string of `value` (a JSON tree) as a plain-text template named
/// `<prefix><path>`, leaving the structure as it is.
fn render_tree(
    env: &Environment,
    prefix: &str,
    path: &str,
    value: &mut Value,
    context: &JValue,
) -> Result<(), TemplateError> {
    match value {
        Value::String(source) if source.contains("{{") || source.contains("{%") => {
            *source = render_one(env, format!("{prefix}{path}"), source, context)?;
        }
        Value::Array(items) => {
            for (i, x) in items.iter_mut().enumerate() {
                render_tree(env, prefix, &format!("{path}[{i}]"), x, context)?;
            }
        }
        Value::Object(map) => {
            for (k, x) in map.iter_mut() {
                render_tree(env, prefix, &format!("{path}.{k}"), x, context)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Renders the template's rich fields (every string a template) and puts each non-empty
/// one in place of the caller's.
fn render_rich(
    env: &Environment,
    type_key: &str,
    template: &Template,
    context: &JValue,
    out: &mut Content,
) -> Result<(), TemplateError> {
    let mut rich = template.rich_json();
    if rich.as_object().is_none_or(|m| m.is_empty()) {
        return Ok(());
    }
    let prefix = format!("{type_key}/{}/{}:", template.channel, template.locale);
    if let Some(m) = rich.as_object_mut() {
        for (k, x) in m.iter_mut() {
            if k != "badge" {
                render_tree(env, &prefix, k, x, context)?;
            }
        }
    }
    let mut rendered = Template::default();
    rendered.set_rich_json(rich).map_err(|e| TemplateError {
        name: format!("{prefix}overrides"),
        line: 0,
        message: e.to_string(),
    })?;
    let replace = |slot: &mut String, new: String| {
        if !new.is_empty() {
            *slot = new;
        }
    };
    replace(&mut out.url, rendered.url);
    replace(&mut out.image_url, rendered.image_url);
    replace(&mut out.thread, rendered.thread);
    if !rendered.actions.is_empty() {
        out.actions = rendered.actions;
    }
    if !rendered.badge.is_unchanged() {
        out.badge = rendered.badge;
    }
    let (o, r) = (&mut out.overrides, rendered.overrides);
    if !r.line_messages.is_empty() {
        o.line_messages = r.line_messages;
    }
    if !r.fcm_data.is_empty() {
        o.fcm_data = r.fcm_data;
    }
    replace(&mut o.android_channel_id, r.android_channel_id);
    replace(&mut o.apns_category, r.apns_category);
    replace(&mut o.apns_thread_id, r.apns_thread_id);
    replace(&mut o.apns_sound, r.apns_sound);
    replace(&mut o.apns_interruption_level, r.apns_interruption_level);
    replace(&mut o.webpush_icon, r.webpush_icon);
    replace(&mut o.webpush_image, r.webpush_image);
    if !r.webpush_actions.is_empty() {
        o.webpush_actions = r.webpush_actions;
    }
    *out = std::mem::take(out).normalized();
    Ok(())
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
        match render(type_key, t, &ctx) {
            Ok(rendered) => {
                let mut v = crate::validate::Violations::default();
                rendered.check(&mut v);
                out.extend(v.0.into_iter().map(|f| {
                    let field = f.field.strip_prefix("content.").unwrap_or(&f.field);
                    FieldViolation::new(
                        format!("templates[{i}].{field}"),
                        format!("{} (rendered against sample_payload)", f.description),
                    )
                }));
            }
            Err(e) => {
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
    }
    out
}

#[cfg(test)]
mod tests;
