//! Reading a request of the inbox API: query parameters given once, `{id}` path
//! segments, and JSON bodies whose errors name the field by its path.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use std::collections::HashMap;
use uuid::Uuid;

/// The query parameters of a request, each given at most once. Unknown parameters are
/// ignored; a repeated one, or a query that is not `application/x-www-form-urlencoded`
/// UTF-8, is a JSON 400 naming it.
pub(crate) struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                ApiError::invalid(
                    "query",
                    format!(
                        "must be a URL-encoded UTF-8 query string: {}",
                        e.body_text()
                    ),
                )
            })?;
        let mut params = HashMap::with_capacity(pairs.len());
        for (name, value) in pairs {
            if params.contains_key(&name) {
                return Err(ApiError::invalid(name, "must be given at most once"));
            }
            params.insert(name, value);
        }
        Ok(Params(params))
    }
}

impl Params {
    /// The value of the parameter `name`, if given.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// The `{id}` path segment as a UUID, or the JSON 400 naming `id` (`what` is `a
/// notification`, `an endpoint`).
pub(crate) fn path_id(
    id: Result<Path<String>, PathRejection>,
    what: &str,
) -> Result<Uuid, ApiError> {
    id.ok()
        .and_then(|Path(id)| Uuid::parse_str(&id).ok())
        .ok_or_else(|| ApiError::invalid("id", format!("must be {what} id (UUID)")))
}

/// A JSON body parsed into `T` ([`parse_json`]); the rejection is the JSON 400/413 naming
/// the problem.
pub(crate) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let body = Bytes::from_request(req, state).await;
        json_body(body).map(JsonBody)
    }
}

/// Parses a JSON body into `T`, or the JSON 400/413 answer naming the problem.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    parse_json(&body?)
}

/// Like [`json_body`], with an empty (or all-whitespace) body meaning `T::default()`.
pub(crate) fn json_body_or_empty<T: serde::de::DeserializeOwned + Default>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body?;
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        parse_json(&body)
    }
}

/// Parses `body` into `T`. Text that is not JSON is reported as `body`; a value of the
/// wrong type, a missing field or an unknown one by its path (`enabled`,
/// `windows[0].start`, `web_push.keys.auth`).
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = serde_path_to_error::deserialize::<_, T>(&mut de)
        .map_err(|e| (e.path().to_string(), e.into_inner()))
        .and_then(|v| de.end().map(|()| v).map_err(|e| (".".to_string(), e)));
    parsed.map_err(|(path, e)| {
        if !e.is_data() {
            return ApiError::invalid_body(
                "body",
                format!("must be JSON of the documented shape: {e}"),
            );
        }
        let message = e.to_string();
        // serde names a missing or unknown field in the message, at its parent's path.
        let named = ["missing field `", "unknown field `"].iter().find_map(|p| {
            message
                .strip_prefix(p)
                .and_then(|rest| rest.split_once('`'))
                .map(|(name, _)| name.to_string())
        });
        let field = match (path.as_str(), named) {
            (".", Some(name)) => name,
            (parent, Some(name)) if !parent.ends_with(&name) => format!("{parent}.{name}"),
            (".", None) => "body".to_string(),
            (path, _) => path.to_string(),
        };
        let rule = message
            .rsplit_once(" at line ")
            .map_or(message.as_str(), |(m, _)| m);
        ApiError::invalid(field, rule)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        enabled: bool,
        #[serde(default)]
        windows: Vec<Inner>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        start: String,
    }

    fn bad_field(body: &str) -> String {
        match parse_json::<Outer>(body.as_bytes()) {
            Err(ApiError::Invalid { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn a_body_of_the_documented_shape_parses() {
        let o: Outer =
            parse_json(br#"{"enabled": true, "windows": [{"start": "22:00"}]}"#).unwrap();
        assert!(o.enabled);
        assert_eq!(o.windows[0].start, "22:00");
    }

    #[test]
    fn json_errors_name_the_field_by_its_path() {
        assert_eq!(bad_field("{not json"), "body");
        assert_eq!(bad_field(r#"{"enabled": true} x"#), "body");
        assert_eq!(bad_field(r#"{"enabled": "yes"}"#), "enabled");
        assert_eq!(bad_field(r#"{}"#), "enabled");
        assert_eq!(bad_field(r#"{"enabled": true, "colour": 1}"#), "colour");
        assert_eq!(
            bad_field(r#"{"enabled": true, "windows": [{"start": "x"}, {"start": 1}]}"#),
            "windows[1].start"
        );
        assert_eq!(
            bad_field(r#"{"enabled": true, "windows": [{}]}"#),
            "windows[0].start"
        );
        assert_eq!(
            bad_field(r#"{"enabled": true, "windows": [{"start": "x", "end": 1}]}"#),
            "windows[0].end"
        );
        assert_eq!(bad_field("[]"), "body");
    }
}
