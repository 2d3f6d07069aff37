//! Request extractors whose every rejection is an [`ApiError`].
//!
//! axum's own `Json`, `Query` and `Path` reject with plain-text bodies and,
//! for a wrong type, a 422; the API promises one JSON error shape instead,
//! so these wrappers parse the same way and say what was wrong in it.
//!
//! [`JsonBody`] also insists on `Content-Type: application/json` for a
//! non-empty body. That is not pedantry: a browser may send a `text/plain`
//! POST to `127.0.0.1` from any web page without asking first, but must ask
//! (a CORS preflight, which this server never grants) before sending JSON.
//! An empty body reads as `{}`, so `POST .../background` with no body works.

use axum::{
    body::Bytes,
    extract::{rejection::BytesRejection, FromRequest, FromRequestParts, Path, Query, Request},
    http::{header, request::Parts, StatusCode},
};
use serde::de::DeserializeOwned;

use super::{connection::RequestBodyError, error::ApiError};

/// Largest request body accepted, in bytes.
pub(crate) const BODY_LIMIT: usize = 1024 * 1024;

/// A JSON request body of type `T`.
pub(crate) struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, ApiError> {
        // `None`: no Content-Type at all; `Some(false)`: another type.
        let json_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|value| value.to_str().is_ok_and(is_json_type));
        // A body announced as too large is refused before any of it is
        // read (the connection then closes: see `connection.rs`).
        if http_body::Body::size_hint(request.body()).lower() > BODY_LIMIT as u64 {
            return Err(too_large());
        }
        let bytes = read_body(request).await?.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large()
            } else if let Some(timeout) = body_timeout(&rejection) {
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    timeout.to_string(),
                )
            } else {
                ApiError::bad_request(format!(
                    "cannot read request body: {}",
                    rejection.body_text()
                ))
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return parse(b"{}").map(JsonBody);
        }
        if json_type != Some(true) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "a request body must be sent with Content-Type: application/json",
            ));
        }
        parse(&bytes).map(JsonBody)
    }
}

/// The request's body, read on a task of its own unless it is empty.
///
/// Taking a chunk from hyper's body channel wakes the connection's task so
/// that it reads on. Read from the handler, that task is the one running:
/// tokio then queues it again as a yield and wakes another worker for it,
/// a `futex` call and a cross-CPU wake-up that, for `POST …/background`,
/// came between the commit and the held caller's answer, in every request
/// (ARCHITECTURE.md §PERF). Read from another task, the wake is an
/// ordinary one of a task that waits, and no other worker is woken.
///
/// The task ends with the body: read to its end, cut by the size limit or
/// the body timeout (`connection.rs`), or failed when the connection
/// closes, so a reader the handler stopped waiting for does not linger.
async fn read_body(request: Request) -> Result<Result<Bytes, BytesRejection>, ApiError> {
    // `Bytes` reads the body limit from the request, not from the state.
    if http_body::Body::size_hint(request.body()).exact() == Some(0) {
        return Ok(Bytes::from_request(request, &()).await);
    }
    tokio::spawn(async move { Bytes::from_request(request, &()).await })
        .await
        .map_err(|error| ApiError::internal(format!("reading the request body failed: {error}")))
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("request body is larger than {BODY_LIMIT} bytes"),
    )
}

/// The body timeout (`connection.rs`) behind a failed body read, if that
/// is why it failed.
fn body_timeout(rejection: &BytesRejection) -> Option<&RequestBodyError> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(error) = source {
        if let Some(found @ RequestBodyError::TimedOut(_)) = error.downcast_ref() {
            return Some(found);
        }
        source = error.source();
    }
    None
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|error| {
        let what = match error.classify() {
            serde_json::error::Category::Data => "invalid request body",
            _ => "malformed JSON in request body",
        };
        ApiError::bad_request(format!("{what}: {error}"))
    })
}

/// `application/json`, or any `application/*+json`, with parameters.
fn is_json_type(value: &str) -> bool {
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Query parameters of type `T`.
pub(crate) struct QueryParams<T>(pub T);

impl<S, T> FromRequestParts<S> for QueryParams<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| QueryParams(value))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

/// The one `:id` (or `:name`) segment of a route.
pub(crate) struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(id)| PathId(id))
            .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
    }
}

#[cfg(test)]
mod tests {
    use super::is_json_type;

    #[test]
    fn json_content_types() {
        assert!(is_json_type("application/json"));
        assert!(is_json_type("Application/JSON; charset=utf-8"));
        assert!(is_json_type("application/merge-patch+json"));
        assert!(!is_json_type("text/plain"));
        assert!(!is_json_type("application/x-www-form-urlencoded"));
    }
}
