//! The one place where the HTTP service's failures become answers.
//!
//! Every JSON error is `{"error": {"code", "message", "field"}}` (a list of `violations`
//! added when several fields are wrong); the console renders the same errors as HTML
//! pages ([`crate::console`]). Store errors are sorted as ingest's gRPC mapping sorts
//! them (`crates/ingest/src/error.rs`): a missing row is 404, a unique-key clash 409, a
//! database that cannot answer now ([`notify_store::StoreError::is_transient`]) 503, and
//! anything else 500. SQL text never reaches a caller; it is logged.

use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use notify_core::validate::FieldViolation;
use notify_store::StoreError;
use serde_json::{Value, json};
use std::time::Duration;

use crate::MAX_BODY_BYTES;

/// Errors of the HTTP service, each with its status code and JSON body.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Bad input in one place: 400 with `code` (`invalid_argument`, `invalid_body`,
    /// `invalid_token`) naming `field` (a query parameter, a JSON path, a header).
    #[error("{field}: {message}")]
    Invalid {
        /// The error code of the body.
        code: &'static str,
        /// What is wrong: a parameter, a JSON path (`windows[0].start`), a header.
        field: String,
        /// The rule it breaks.
        message: String,
    },
    /// Several bad fields: 400 `invalid_argument` naming the first, every one listed
    /// under `violations`. Never empty.
    #[error("invalid argument")]
    Violations(Vec<FieldViolation>),
    /// A body that could not be read: 413 `body_too_large` over [`MAX_BODY_BYTES`],
    /// else 400 `invalid_body`.
    #[error("unreadable body: {0}")]
    Body(#[from] BytesRejection),
    /// No valid end-user token: 401 `unauthenticated` with `WWW-Authenticate: Bearer`;
    /// the text says why (`missing`, `expired`, …).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// A signed webhook whose signature is missing or wrong: 401 `invalid_signature`
    /// naming where the signature is (`field`) and what it must be (`message`): LINE's
    /// `X-Line-Signature` header ([`ApiError::INVALID_LINE_SIGNATURE`]), or an SNS
    /// message's `Signature` ([`ApiError::INVALID_SNS_SIGNATURE`]).
    #[error("invalid signature of {field}")]
    InvalidSignature {
        /// Where the signature is.
        field: &'static str,
        /// The rule it broke.
        message: &'static str,
    },
    /// Refused (the console: a foreign origin, an expired form): 403.
    #[error("forbidden: {0}")]
    Forbidden(&'static str),
    /// The console needs a signed-in staff member: a redirect to its sign-in page (JSON
    /// callers get 401 `unauthenticated`).
    #[error("sign-in required")]
    SignInRequired,
    /// Nothing there for this caller: 404 `not_found` naming `field` (`id`, `user`,
    /// `type`, `path`).
    #[error("{field}: {message}")]
    NotFound {
        /// What names the missing thing.
        field: &'static str,
        /// What is missing, e.g. `no such notification`.
        message: &'static str,
    },
    /// A known path asked with another method: 405 `method_not_allowed` (axum adds
    /// `Allow`); the text names the methods served.
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
    /// An unsubscribe link older than its TTL: 410 `expired_token`.
    #[error("expired unsubscribe token")]
    ExpiredToken,
    /// Over the per-user rate: 429 `rate_limited` with `Retry-After` in whole seconds
    /// (at least 1).
    #[error("rate limited for {0:?}")]
    RateLimited(Duration),
    /// A store failure, sorted by [`store_status`].
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ApiError {
    /// A LINE webhook's `X-Line-Signature` is missing or wrong (LINE Messaging API,
    /// "Verify webhook signature").
    pub const INVALID_LINE_SIGNATURE: ApiError = ApiError::InvalidSignature {
        field: "X-Line-Signature",
        message: "must be the base64 HMAC-SHA256 of the body keyed with the channel secret",
    };
    /// An SNS message whose signature does not verify, whose certificate is not a trusted
    /// SNS one, or whose topic is not subscribed (Amazon SNS, "Verifying the signatures of
    /// Amazon SNS messages").
    pub const INVALID_SNS_SIGNATURE: ApiError = ApiError::InvalidSignature {
        field: "Signature",
        message: "must verify with the certificate at SigningCertURL (an https sns.<region>.amazonaws.com address) over the SNS string to sign, for a subscribed TopicArn",
    };

    /// A 400 `invalid_argument` naming `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            code: "invalid_argument",
            field: field.into(),
            message: message.into(),
        }
    }

    /// A 400 `invalid_body` naming `field`.
    pub fn invalid_body(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            code: "invalid_body",
            field: field.into(),
            message: message.into(),
        }
    }

    /// A 404 `not_found`.
    pub fn not_found(field: &'static str, message: &'static str) -> Self {
        ApiError::NotFound { field, message }
    }

    /// The status code of the answer (for the console's HTML pages too).
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid { .. } | ApiError::Violations(_) => StatusCode::BAD_REQUEST,
            ApiError::Body(e) => e.status(),
            ApiError::Unauthenticated(_)
            | ApiError::InvalidSignature { .. }
            | ApiError::SignInRequired => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::ExpiredToken => StatusCode::GONE,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Store(e) => store_status(e).0,
        }
    }
}

/// How a store error is answered: (status, code, message). Logs it (the SQL text stays
/// in the log).
pub(crate) fn store_status(e: &StoreError) -> (StatusCode, &'static str, &'static str) {
    match e {
        StoreError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", "not found"),
        e if e.is_transient() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the database is unavailable; try again",
        ),
        StoreError::Db(sqlx::Error::Database(db)) if db.is_unique_violation() => (
            StatusCode::CONFLICT,
            "conflict",
            "conflicts with a change made meanwhile; try again",
        ),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; try again later",
        ),
    }
}

/// Logs a store error once, where it is answered.
pub(crate) fn log_store_error(e: &StoreError) {
    match e {
        StoreError::NotFound(what) => tracing::debug!(%what, "not found in the database"),
        e => tracing::error!(error = %e, "database error"),
    }
}

/// An error answer: `{"error": {"code", "message", "field"}}`.
pub(crate) fn error(status: StatusCode, code: &str, field: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"code": code, "message": message, "field": field}})),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        match self {
            ApiError::Invalid {
                code,
                field,
                message,
            } => error(status, code, &field, &message),
            ApiError::Violations(v) => {
                let Some(first) = v.first() else {
                    return error(status, "invalid_argument", "", "invalid argument");
                };
                let all: Vec<Value> = v
                    .iter()
                    .map(|f| json!({"field": f.field, "message": f.description}))
                    .collect();
                let body = json!({"error": {
                    "code": "invalid_argument",
                    "message": first.description,
                    "field": first.field,
                    "violations": all,
                }});
                (status, Json(body)).into_response()
            }
            ApiError::Body(e) => {
                if status == StatusCode::PAYLOAD_TOO_LARGE {
                    let message = format!("must be at most {MAX_BODY_BYTES} bytes");
                    error(status, "body_too_large", "body", &message)
                } else {
                    error(status, "invalid_body", "body", &e.body_text())
                }
            }
            ApiError::Unauthenticated(why) => {
                let message = format!("a valid Bearer token is required ({why})");
                let mut r = error(status, "unauthenticated", "Authorization", &message);
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                r
            }
            ApiError::InvalidSignature { field, message } => {
                error(status, "invalid_signature", field, message)
            }
            ApiError::Forbidden(why) => error(status, "forbidden", "", why),
            ApiError::SignInRequired => {
                error(status, "unauthenticated", "", "sign in to the console")
            }
            ApiError::NotFound { field, message } => error(status, "not_found", field, message),
            ApiError::MethodNotAllowed(message) => {
                error(status, "method_not_allowed", "method", &message)
            }
            ApiError::ExpiredToken => error(
                status,
                "expired_token",
                "token",
                "has expired; nothing was changed: use the link in a more recent email",
            ),
            ApiError::RateLimited(wait) => {
                let mut r = error(
                    status,
                    "rate_limited",
                    "",
                    "too many requests for this user; slow down",
                );
                r.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(wait.as_secs().max(1)),
                );
                r
            }
            ApiError::Store(e) => {
                log_store_error(&e);
                let (_, code, message) = store_status(&e);
                error(status, code, "", message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response) -> Value {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn a_missing_row_is_404_and_a_broken_pool_503() {
        let r = ApiError::from(StoreError::NotFound("user".into())).into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(body(r).await["error"]["code"], "not_found");
        let r = ApiError::from(StoreError::Db(sqlx::Error::PoolTimedOut)).into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body(r).await,
            json!({"error": {"code": "unavailable", "field": "",
                "message": "the database is unavailable; try again"}})
        );
    }

    #[tokio::test]
    async fn a_failure_that_would_repeat_is_500_without_sql_text() {
        let e = StoreError::Db(sqlx::Error::ColumnNotFound("secret_column".into()));
        let r = ApiError::from(e).into_response();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let v = body(r).await;
        assert_eq!(v["error"]["code"], "internal");
        assert!(!v.to_string().contains("secret_column"));
    }

    #[tokio::test]
    async fn rate_limits_say_when_to_come_back_in_whole_seconds() {
        let r = ApiError::RateLimited(Duration::from_millis(10)).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = ApiError::Unauthenticated("expired".into()).into_response();
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
        assert_eq!(
            body(r).await["error"]["message"],
            "a valid Bearer token is required (expired)"
        );
    }

    #[tokio::test]
    async fn violations_name_the_first_field_and_list_all() {
        let r = ApiError::Violations(vec![
            FieldViolation::new("type", "is required"),
            FieldViolation::new("channel", "is unknown"),
        ])
        .into_response();
        let v = body(r).await;
        assert_eq!(v["error"]["field"], "type");
        assert_eq!(v["error"]["violations"][1]["field"], "channel");
    }
}
