//! The one place where service errors become gRPC statuses (Google API conventions,
//! google.aip.dev/193). SQL text never reaches a caller.

use notify_core::FieldViolation;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Errors of the gRPC services.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Bad input: one violation per bad field.
    #[error("invalid argument")]
    Invalid(Vec<FieldViolation>),
    /// A named resource does not exist.
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// What kind of thing, e.g. `notification type`.
        kind: &'static str,
        /// Its name or id.
        name: String,
    },
    /// The event key exists with other content.
    #[error("event_key {event_key:?} was already used for another request (event {event_id})")]
    EventKeyConflict {
        /// The normalised key.
        event_key: String,
        /// The existing event's id.
        event_id: uuid::Uuid,
    },
    /// No valid credential (API key or client certificate).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller's key lacks the scope.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Over one of the caller's quotas.
    #[error("quota exceeded: {description}")]
    QuotaExceeded {
        /// Whose quota, e.g. `api_key:shop-checkout`.
        subject: String,
        /// Which limit, e.g. `events: at most 50 per second for this key`.
        description: String,
        /// When a retry may succeed (rates); `None` for size limits.
        retry_after: Option<std::time::Duration>,
    },
    /// A store failure.
    #[error(transparent)]
    Store(#[from] notify_store::StoreError),
}

impl ApiError {
    /// A single-field violation.
    pub fn field(field: &str, description: impl Into<String>) -> Self {
        ApiError::Invalid(vec![FieldViolation::new(field, description)])
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        let status = status_of(e);
        // The gRPC server span of this call (RPC semantic conventions).
        let span = tracing::Span::current();
        span.record("rpc.grpc.status_code", status.code() as i32);
        if matches!(
            status.code(),
            Code::Internal | Code::Unavailable | Code::DeadlineExceeded | Code::Unknown
        ) {
            span.record("otel.status_code", "ERROR");
        }
        status
    }
}

fn status_of(e: ApiError) -> Status {
    {
        match e {
            ApiError::Invalid(violations) => {
                let summary = violations
                    .iter()
                    .map(|v| format!("{}: {}", v.field, v.description))
                    .collect::<Vec<_>>()
                    .join("; ");
                let details = ErrorDetails::with_bad_request(
                    violations
                        .into_iter()
                        .map(|v| tonic_types::FieldViolation::new(v.field, v.description))
                        .collect::<Vec<_>>(),
                );
                Status::with_error_details(Code::InvalidArgument, summary, details)
            }
            ApiError::NotFound { kind, name } => {
                // Never echo unbounded input into trailers.
                let name = if name.len() > 100 {
                    let mut end = 100;
                    while !name.is_char_boundary(end) {
                        end -= 1;
                    }
                    format!("{}...", &name[..end])
                } else {
                    name
                };
                Status::with_error_details(
                    Code::NotFound,
                    format!("{kind} {name:?} not found"),
                    ErrorDetails::with_resource_info(kind, name, "", "does not exist"),
                )
            }
            ApiError::EventKeyConflict {
                event_key,
                event_id,
            } => Status::with_error_details(
                Code::AlreadyExists,
                format!(
                    "event_key {event_key:?} already names event {event_id} with different content; \
                     use a new event_key for a different event"
                ),
                ErrorDetails::with_resource_info(
                    "notification event",
                    event_id.to_string(),
                    "",
                    "existing event",
                ),
            ),
            ApiError::Unauthenticated(why) => Status::unauthenticated(why),
            ApiError::PermissionDenied(why) => Status::permission_denied(why),
            ApiError::QuotaExceeded {
                subject,
                description,
                retry_after,
            } => {
                let mut details =
                    ErrorDetails::with_quota_failure(vec![tonic_types::QuotaViolation::new(
                        subject,
                        description.clone(),
                    )]);
                let mut message = description;
                if let Some(wait) = retry_after {
                    details.set_retry_info(Some(wait));
                    message = format!("{message}; retry in {} ms", wait.as_millis().max(1));
                }
                Status::with_error_details(Code::ResourceExhausted, message, details)
            }
            ApiError::Store(e) => store_status(&e),
        }
    }
}

fn store_status(e: &notify_store::StoreError) -> Status {
    use notify_store::StoreError;
    match e {
        StoreError::NotFound(what) => Status::not_found(format!("{what} not found")),
        // The store's one classification (`StoreError::is_transient`), as HTTP uses it.
        e if e.is_transient() => {
            tracing::error!(error = %e, "database unavailable");
            Status::unavailable("database unavailable; retry with the same event_key")
        }
        _ => {
            tracing::error!(error = %e, "store error");
            Status::internal("internal error; retry with the same event_key")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_argument_carries_one_violation_per_field() {
        let status: Status = ApiError::Invalid(vec![
            FieldViolation::new("event_key", "is required"),
            FieldViolation::new("recipients[2]", "must not be blank"),
        ])
        .into();
        assert_eq!(status.code(), Code::InvalidArgument);
        let br = status.get_details_bad_request().expect("BadRequest detail");
        let fields: Vec<_> = br
            .field_violations
            .iter()
            .map(|v| v.field.as_str())
            .collect();
        assert_eq!(fields, ["event_key", "recipients[2]"]);
        assert!(
            status
                .message()
                .contains("recipients[2]: must not be blank")
        );
    }

    #[test]
    fn conflict_names_the_existing_event() {
        let id = uuid::Uuid::from_u128(42);
        let status: Status = ApiError::EventKeyConflict {
            event_key: "k".into(),
            event_id: id,
        }
        .into();
        assert_eq!(status.code(), Code::AlreadyExists);
        assert_eq!(
            status.get_details_resource_info().unwrap().resource_name,
            id.to_string()
        );
    }

    #[test]
    fn store_errors_are_sorted_by_the_stores_own_transient_rule() {
        use notify_store::StoreError;
        let code = |e: StoreError| Status::from(ApiError::Store(e)).code();
        assert_eq!(
            code(StoreError::Db(sqlx::Error::PoolTimedOut)),
            Code::Unavailable
        );
        assert_eq!(code(StoreError::NotFound("type x".into())), Code::NotFound);
        assert_eq!(
            code(StoreError::BadValue {
                column: "channel",
                message: "sms is not a channel".into(),
            }),
            Code::Internal
        );
    }
}
