//! Undecodable requests are the caller's fault: `INVALID_ARGUMENT`, not `INTERNAL`.
//!
//! tonic's protobuf codec turns a request body that is not a valid message into
//! `Status::internal("failed to decode Protobuf message: …")` (tonic-prost 0.14,
//! `codec.rs`, `from_decode_error`) before any handler runs, so the handlers and
//! [`crate::error`] never see it. [`UndecodableLayer`] sits in front of every service and
//! rewrites exactly that answer: tonic puts the `Status` of an error response into the
//! response's extensions (`Status::into_http`), and a decode failure is the only
//! `INTERNAL` whose message starts with the codec's prefix. The new status goes through
//! [`crate::error`] like every other (`INVALID_ARGUMENT` with one field violation naming
//! the field prost could not read, e.g. `recipients`, or `request` for a body that is not
//! protobuf at all).

use crate::error::ApiError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The message prefix of prost's `DecodeError` (prost 0.14, `error.rs`, `Display`).
const DECODE_PREFIX: &str = "failed to decode Protobuf message: ";

/// Wraps a service with [`Undecodable`].
#[derive(Debug, Clone, Copy, Default)]
pub struct UndecodableLayer;

impl<S> tower_layer::Layer<S> for UndecodableLayer {
    type Service = Undecodable<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Undecodable { inner }
    }
}

/// A service whose decode failures answer `INVALID_ARGUMENT`; see the module docs.
#[derive(Debug, Clone)]
pub struct Undecodable<S> {
    inner: S,
}

impl<S, Req, B> tower_service::Service<Req> for Undecodable<S>
where
    S: tower_service::Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: Default + Send + 'static,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            let field = resp
                .extensions()
                .get::<tonic::Status>()
                .filter(|s| s.code() == tonic::Code::Internal)
                .and_then(|s| s.message().strip_prefix(DECODE_PREFIX))
                .map(|detail| (field_path(detail), detail.to_string()));
            Ok(match field {
                None => resp,
                Some((field, detail)) => {
                    let status: tonic::Status = ApiError::field(
                        &field,
                        format!("the request is not a valid protobuf message ({detail})"),
                    )
                    .into();
                    status.into_http()
                }
            })
        })
    }
}

/// The field path in prost's decode error detail, outermost first: the detail is
/// `Inner.field: Outer.field: description` (innermost first), so
/// `Content.title: CreateEventRequest.content: invalid string value` gives
/// `content.title`. `request` when prost names no field.
fn field_path(detail: &str) -> String {
    let mut fields = Vec::new();
    let mut rest = detail;
    while let Some((head, tail)) = rest.split_once(": ") {
        let Some((message, field)) = head.split_once('.') else {
            break;
        };
        let ident = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_');
        if !ident(message) || !ident(field) {
            break;
        }
        fields.push(field);
        rest = tail;
    }
    if fields.is_empty() {
        return "request".into();
    }
    fields.reverse();
    fields.join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_path_is_read_outermost_first() {
        assert_eq!(
            field_path(
                "Content.title: CreateEventRequest.content: invalid string value: data is not UTF-8 encoded"
            ),
            "content.title"
        );
        assert_eq!(
            field_path(
                "CreateEventRequest.recipients: invalid wire type: Varint (expected LengthDelimited)"
            ),
            "recipients"
        );
        assert_eq!(field_path("buffer underflow"), "request");
        assert_eq!(field_path("invalid tag value: 0"), "request");
    }
}
