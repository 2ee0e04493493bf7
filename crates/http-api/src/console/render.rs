//! How the console's pages look: the page frame, and errors ([`ApiError`]) answered as
//! HTML pages rather than JSON.

use super::staff;
use crate::AppState;
use crate::error::{ApiError, log_store_error, store_status};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use notify_core::content::escape_html as esc;

/// What a console handler answers: a page, or an error rendered as a page.
pub(super) type Page = Result<Response, HtmlError>;

/// An [`ApiError`] answered as an HTML page: 404 and 403 as short pages, a sign-in
/// requirement as a redirect to `/console/login`, store errors with the status ingest's
/// mapping gives them ([`store_status`]).
#[derive(Debug)]
pub(super) struct HtmlError(pub(super) ApiError);

impl From<ApiError> for HtmlError {
    fn from(e: ApiError) -> Self {
        HtmlError(e)
    }
}

impl From<notify_store::StoreError> for HtmlError {
    fn from(e: notify_store::StoreError) -> Self {
        HtmlError(e.into())
    }
}

impl HtmlError {
    /// The console's 404 (also what every route answers when the console is off).
    pub(super) fn not_found() -> Self {
        HtmlError(ApiError::not_found("path", "not found"))
    }
}

impl IntoResponse for HtmlError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let text = match self.0 {
            ApiError::SignInRequired => return Redirect::to("/console/login").into_response(),
            e if status == StatusCode::NOT_FOUND => {
                if let ApiError::Store(e) = &e {
                    log_store_error(e);
                }
                return (
                    StatusCode::NOT_FOUND,
                    Html("<!doctype html><title>Not found</title><p>Not found.</p>"),
                )
                    .into_response();
            }
            ApiError::Forbidden(message) => {
                return (
                    status,
                    Html(format!(
                        "<!doctype html><title>Refused</title><p>{}</p>",
                        esc(message)
                    )),
                )
                    .into_response();
            }
            ApiError::Store(e) if status == StatusCode::SERVICE_UNAVAILABLE => {
                log_store_error(&e);
                return (
                    status,
                    Html("<!doctype html><title>Unavailable</title><p>The database is unavailable; try again.</p>"),
                )
                    .into_response();
            }
            ApiError::Store(e) => {
                log_store_error(&e);
                store_status(&e).2.to_string()
            }
            e => e.to_string(),
        };
        (
            status,
            Html(format!(
                "<!doctype html><title>Error</title><p>{}</p>",
                esc(&text)
            )),
        )
            .into_response()
    }
}

/// A console page: the navigation (when `user` is signed in), `title` as the heading,
/// then `body` (HTML the caller escaped).
pub(super) fn page(title: &str, user: Option<&str>, body: &str) -> Response {
    let nav = match user {
        Some(u) => format!(
            "<nav><a href=\"/console\">Overview</a> · <a href=\"/console/audit\">Audit</a> · <a href=\"/console/email\">Email</a> · <a href=\"/console/webhooks\">Webhooks</a> · \
             <form method=\"get\" action=\"/console/search\" style=\"display:inline\"><input name=\"q\" placeholder=\"event key, event id, user id or type\" size=\"40\"> <button>Search</button></form> \
             <span style=\"float:right\">{} · <a href=\"/console/logout\">Sign out…</a></span></nav>",
            esc(u)
        ),
        None => String::new(),
    };
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · notify console</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}}table{{border-collapse:collapse;margin:.5rem 0}}\
         td,th{{border:1px solid #ccc;padding:.25rem .5rem;text-align:left;vertical-align:top}}th{{background:#f4f4f4}}\
         .failed{{color:#b00020;font-weight:600}}.sent{{color:#137333}}.pending{{color:#a56300}}.skipped,.canceled{{color:#5f6368;font-style:italic}}pre{{white-space:pre-wrap;max-width:60rem;margin:0}}\
         nav{{margin-bottom:1rem;padding-bottom:.5rem;border-bottom:1px solid #ddd}}</style></head>\
         <body>{nav}<h1>{}</h1>{body}</body></html>",
        esc(title),
        esc(title)
    ))
    .into_response()
}

/// Seconds as `12 s`, or `–` for none.
pub(super) fn secs(s: Option<i64>) -> String {
    s.map_or("–".into(), |s| format!("{s} s"))
}

/// A UUID from a path or form, or the console's 404.
pub(super) fn uuid(text: &str) -> Result<uuid::Uuid, HtmlError> {
    uuid::Uuid::parse_str(text).map_err(|_| HtmlError::not_found())
}

/// A form that POSTs to `action` with the CSRF token bound to `binding`
/// ([`staff::csrf`]), a `button` and a link back to the overview.
pub(super) fn csrf_form(app: &AppState, binding: &str, action: &str, button: &str) -> String {
    format!(
        "<form method=\"post\" action=\"{}\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <button>{button}</button> <a href=\"/console\">Back</a></form>",
        esc(action),
        esc(&staff::csrf(&app.console, binding))
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify_store::StoreError;

    #[test]
    fn console_errors_are_pages_with_the_status_of_the_api() {
        let r = HtmlError::from(StoreError::Db(sqlx::Error::PoolTimedOut)).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        let r = HtmlError::from(StoreError::NotFound("x".into())).into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let r = HtmlError(ApiError::SignInRequired).into_response();
        assert_eq!(r.headers()["location"], "/console/login");
        let r = HtmlError(ApiError::Forbidden("no")).into_response();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        let e = StoreError::Db(sqlx::Error::ColumnNotFound("c".into()));
        assert_eq!(
            HtmlError::from(e).into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
