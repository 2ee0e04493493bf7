//! The console's email page (`/console/email`): each email provider's circuit breaker as
//! the workers last recorded it (`email_provider_states`), and the suppression list
//! (`email_suppressions`: complaints, soft bounces, added by staff), which staff can add
//! to and remove from, each through a confirmation page, a CSRF token and the audit log
//! (`suppression_add`, `suppression_remove`).

use super::access::{ActionForm, action_user, require_staff};
use super::render::{HtmlError, Page, csrf_form, page};
use crate::AppState;
use crate::error::ApiError;
use axum::extract::{Form, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect};
use notify_core::content::escape_html as esc;
use serde::Deserialize;

/// The breaker states and the newest 500 suppressions.
pub(super) async fn email_page(State(app): State<AppState>, headers: HeaderMap) -> Page {
    let user = require_staff(&app, &headers).await?.name;
    let states: Vec<(String, String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT provider, state, changed_at FROM email_provider_states ORDER BY provider",
    )
    .fetch_all(&app.pool)
    .await
    .map_err(notify_store::StoreError::from)?;
    type Row = (
        i64,
        Option<String>,
        Option<String>,
        String,
        String,
        String,
        chrono::DateTime<chrono::Utc>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, user_id, address, category, reason, source, created_at
         FROM email_suppressions ORDER BY id DESC LIMIT 500",
    )
    .fetch_all(&app.pool)
    .await
    .map_err(notify_store::StoreError::from)?;
    let mut body = String::from(
        "<h2>Providers</h2><table><tr><th>Provider</th><th>Breaker</th><th>Since</th></tr>",
    );
    if states.is_empty() {
        body.push_str(
            "<tr><td colspan=\"3\">No breaker has changed state yet (all closed).</td></tr>",
        );
    }
    for (p, s, at) in &states {
        body.push_str(&format!(
            "<tr><td>{}</td><td class=\"{}\">{}</td><td>{}</td></tr>",
            esc(p),
            if s == "closed" { "sent" } else { "failed" },
            esc(s),
            at.to_rfc3339()
        ));
    }
    body.push_str(
        "</table><h2>Suppressions</h2><table><tr><th>User</th><th>Address</th><th>Category</th>\
         <th>Reason</th><th>Source</th><th>Since</th><th></th></tr>",
    );
    for (id, u, a, c, r, s, at) in &rows {
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td><a href=\"/console/email/confirm-remove/{id}\">Remove…</a></td></tr>",
            esc(u.as_deref().unwrap_or("")),
            esc(a.as_deref().unwrap_or("")),
            esc(c),
            esc(r),
            esc(s),
            at.to_rfc3339()
        ));
    }
    body.push_str(
        "</table><h3>Add a suppression</h3><form method=\"get\" action=\"/console/email/confirm-add\">\
         <input name=\"user_id\" placeholder=\"user id\"> <input name=\"address\" placeholder=\"address\"> \
         <select name=\"category\"><option value=\"marketing\">marketing</option><option value=\"all\">all</option></select> \
         <button>Add…</button></form>",
    );
    Ok(page("Email", Some(&user), &body))
}

/// A suppression to add.
#[derive(Deserialize)]
pub(super) struct NewSuppression {
    #[serde(default)]
    user_id: String,
    #[serde(default)]
    address: String,
    category: String,
}

impl NewSuppression {
    fn check(&self) -> Result<(Option<&str>, Option<&str>), HtmlError> {
        let user = Some(self.user_id.trim()).filter(|s| !s.is_empty());
        let address = Some(self.address.trim()).filter(|s| !s.is_empty());
        if user.is_none() && address.is_none() {
            return Err(HtmlError(ApiError::invalid(
                "user_id",
                "a user id or an address is required",
            )));
        }
        if !matches!(self.category.as_str(), "marketing" | "all") {
            return Err(HtmlError(ApiError::invalid(
                "category",
                "must be marketing or all",
            )));
        }
        Ok((user, address))
    }
}

/// `GET /console/email/confirm-add`: the confirmation of an addition.
pub(super) async fn confirm_add(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<NewSuppression>,
) -> Page {
    let s = require_staff(&app, &headers).await?;
    let (user, address) = q.check()?;
    let form = csrf_form(
        &app,
        &s.binding,
        "/console/actions/suppressions/add",
        "Confirm",
    );
    let hidden = format!(
        "<input type=\"hidden\" name=\"user_id\" value=\"{}\"><input type=\"hidden\" name=\"address\" value=\"{}\">\
         <input type=\"hidden\" name=\"category\" value=\"{}\">",
        esc(user.unwrap_or("")),
        esc(address.unwrap_or("")),
        esc(&q.category)
    );
    let form = form.replacen("<button>", &format!("{hidden}<button>"), 1);
    Ok(page(
        "Confirm",
        Some(&s.name),
        &format!(
            "<p>Suppress {} email for user {:?} / address {:?}?</p>{form}",
            esc(&q.category),
            esc(user.unwrap_or("-")),
            esc(address.unwrap_or("-"))
        ),
    ))
}

/// The add form as posted.
#[derive(Deserialize)]
pub(super) struct AddForm {
    csrf: String,
    #[serde(flatten)]
    new: NewSuppression,
}

/// `POST /console/actions/suppressions/add`.
pub(super) async fn add(
    State(app): State<AppState>,
    headers: HeaderMap,
    Form(f): Form<AddForm>,
) -> Page {
    let staff = action_user(
        &app,
        &headers,
        &ActionForm {
            csrf: f.csrf.clone(),
        },
    )
    .await?;
    let (user, address) = f.new.check()?;
    let mut conn = app
        .pool
        .acquire()
        .await
        .map_err(notify_store::StoreError::from)?;
    let added =
        crate::email_events::suppress(&mut conn, user, address, &f.new.category, "console", &staff)
            .await
            .map_err(HtmlError)?;
    if added {
        notify_telemetry::metrics::count_suppression_added("console");
    }
    let target = format!("{}/{}", user.unwrap_or(""), address.unwrap_or(""));
    let detail = format!(
        "{} ({})",
        f.new.category,
        if added { "added" } else { "already there" }
    );
    notify_store::console::record(&app.pool, &staff, "suppression_add", &target, &detail).await?;
    tracing::info!(staff = %staff, %target, "console: suppression added");
    Ok(Redirect::to("/console/email").into_response())
}

/// `GET /console/email/confirm-remove/{id}`.
pub(super) async fn confirm_remove(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Page {
    let s = require_staff(&app, &headers).await?;
    let row: Option<(Option<String>, Option<String>, String)> =
        sqlx::query_as("SELECT user_id, address, category FROM email_suppressions WHERE id = $1")
            .bind(id)
            .fetch_optional(&app.pool)
            .await
            .map_err(notify_store::StoreError::from)?;
    let Some((u, a, c)) = row else {
        return Err(HtmlError::not_found());
    };
    Ok(page(
        "Confirm",
        Some(&s.name),
        &format!(
            "<p>Remove the {} suppression of user {:?} / address {:?}? Email to them goes out again.</p>{}",
            esc(&c),
            esc(u.as_deref().unwrap_or("-")),
            esc(a.as_deref().unwrap_or("-")),
            csrf_form(
                &app,
                &s.binding,
                &format!("/console/actions/suppressions/{id}/remove"),
                "Confirm"
            )
        ),
    ))
}

/// `POST /console/actions/suppressions/{id}/remove`.
pub(super) async fn remove(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<i64>,
    Form(f): Form<ActionForm>,
) -> Page {
    let staff = action_user(&app, &headers, &f).await?;
    let gone: Option<(Option<String>, Option<String>, String, String)> = sqlx::query_as(
        "DELETE FROM email_suppressions WHERE id = $1 RETURNING user_id, address, category, reason",
    )
    .bind(id)
    .fetch_optional(&app.pool)
    .await
    .map_err(notify_store::StoreError::from)?;
    let Some((u, a, c, r)) = gone else {
        return Err(HtmlError::not_found());
    };
    let target = format!("{}/{}", u.unwrap_or_default(), a.unwrap_or_default());
    notify_store::console::record(
        &app.pool,
        &staff,
        "suppression_remove",
        &target,
        &format!("{c} ({r})"),
    )
    .await?;
    tracing::info!(staff = %staff, %target, "console: suppression removed");
    Ok(Redirect::to("/console/email").into_response())
}
