//! Rendering a delivery's content from its type's templates just before the provider
//! call (`notify_core::template`). Templates are read from Postgres per type and kept
//! with the type's `updated_at` as the claim read it: a delivery claimed after the type was
//! saved carries the new `updated_at` and so never renders with templates cached before
//! the save (a cache by time alone sent the old wording for up to its lifetime).

use notify_core::links::LinkPolicy;
use notify_core::template::{
    self, DigestContext, DigestItem, EventContext, RecipientContext, RenderContext,
};
use notify_core::validate::Violations;
use notify_core::{AttemptOutcome, Content, ErrorClass, FieldViolation};
use notify_store::PgPool;
use notify_store::deliveries::DeliveryJob;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a type's cache entry holds: the type's `updated_at` it was loaded for, and the
/// default locale with the templates.
type Entry = (
    Option<chrono::DateTime<chrono::Utc>>,
    Arc<(String, Vec<template::Template>)>,
);

/// Per-type template cache, and the checks rendered content must pass.
#[derive(Default)]
pub struct TemplateCache {
    types: Mutex<HashMap<String, Entry>>,
    links: LinkPolicy,
}

/// Every rule rendered `content` breaks: the content rules of ingest
/// ([`notify_core::Content::check`]) and the link policy over its links.
pub fn rendered_problems(content: &Content, links: &LinkPolicy) -> Vec<FieldViolation> {
    let mut v = Violations::default();
    content.check(&mut v);
    for (field, url) in content.links() {
        if let Err(why) = links.problem_at(&field, &url) {
            v.add(field, why);
        }
    }
    v.0
}

impl TemplateCache {
    /// An empty cache whose rendered content must obey `links`.
    pub fn new(links: LinkPolicy) -> Self {
        Self {
            types: Mutex::default(),
            links,
        }
    }

    async fn load(
        &self,
        pool: &PgPool,
        type_key: &str,
        version: Option<chrono::DateTime<chrono::Utc>>,
    ) -> notify_store::Result<Arc<(String, Vec<template::Template>)>> {
        if let Some((loaded_for, entry)) = self
            .types
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(type_key)
            && *loaded_for == version
            && version.is_some()
        {
            return Ok(entry.clone());
        }
        let loaded = notify_store::catalog::get_templates(pool, type_key)
            .await?
            .unwrap_or_else(|| ("th".into(), Vec::new()));
        let entry = Arc::new(loaded);
        self.types
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(type_key.to_string(), (version, entry.clone()));
        Ok(entry)
    }

    /// Replaces `job.content` with its type's template for the job's channel and the
    /// recipient's locale, when there is one. `Err` is the attempt's outcome when the
    /// template fails (permanent, `template_error`, naming the template and line) or the
    /// templates cannot be read (transient).
    pub async fn apply(&self, pool: &PgPool, job: &mut DeliveryJob) -> Result<(), AttemptOutcome> {
        let entry = self
            .load(pool, &job.type_key, job.type_updated_at)
            .await
            .map_err(|e| {
                AttemptOutcome::failed(
                    ErrorClass::Transient,
                    "templates_unavailable",
                    serde_json::json!({}),
                )
                .with_response(e.to_string())
            })?;
        let (default_locale, templates) = (&entry.0, &entry.1);
        // A digest lists the events attached to it; any other delivery, its own event.
        let is_digest = job.digest_key.is_some() && job.channel != notify_core::Channel::InApp;
        let items = if is_digest {
            notify_store::events::digest_items_of(pool, job.id)
                .await
                .map_err(|e| {
                    AttemptOutcome::failed(
                        ErrorClass::Transient,
                        "digest_unavailable",
                        serde_json::json!({}),
                    )
                    .with_response(e.to_string())
                })?
        } else {
            vec![DigestItem {
                event_key: job.event_key.clone(),
                payload: job.payload.clone(),
                content: job.content.clone(),
            }]
        };
        let Some(t) = template::pick(templates, job.channel.as_str(), &job.locale, default_locale)
        else {
            if is_digest && !items.is_empty() {
                job.content = template::default_digest_content(&items);
            }
            return Ok(());
        };
        let ctx = RenderContext {
            payload: &job.payload,
            content: &job.content,
            recipient: RecipientContext {
                user_id: &job.user_id,
                display_name: &job.display_name,
                locale: &job.locale,
                timezone: &job.timezone,
            },
            event: EventContext {
                id: job.event_id.to_string(),
                key: &job.event_key,
                type_key: &job.type_key,
            },
            digest: DigestContext {
                count: items.len(),
                items,
            },
        };
        match template::render(&job.type_key, t, &ctx) {
            Ok(mut content) => {
                // The caller's input passed the sensitive-data guard, but a template can
                // join pieces into an id or a card number: whatever the guard finds in
                // the rendered text is masked before it is sent or stored.
                for text in [
                    &mut content.title,
                    &mut content.body,
                    &mut content.email_subject,
                    &mut content.email_html,
                    &mut content.email_text,
                ] {
                    if !notify_core::guard::scan_text(text).is_empty() {
                        *text = notify_core::guard::mask_text(text);
                    }
                }
                for a in &mut content.actions {
                    if !notify_core::guard::scan_text(&a.label).is_empty() {
                        a.label = notify_core::guard::mask_text(&a.label);
                    }
                }
                let problems = rendered_problems(&content, &self.links);
                if !problems.is_empty() {
                    let listed: Vec<String> = problems
                        .iter()
                        .map(|f| format!("{}: {}", f.field, f.description))
                        .collect();
                    return Err(AttemptOutcome::failed(
                        ErrorClass::Permanent,
                        "content_invalid",
                        serde_json::json!({"fields": problems.iter().map(|f| &f.field).collect::<Vec<_>>()}),
                    )
                    .with_response(listed.join("; "))
                    .quoting_response());
                }
                job.content = content;
                Ok(())
            }
            Err(e) => Err(AttemptOutcome::failed(
                ErrorClass::Permanent,
                "template_error",
                serde_json::json!({"template": e.name, "line": e.line}),
            )
            .with_response(e.to_string())
            .quoting_response()),
        }
    }
}
