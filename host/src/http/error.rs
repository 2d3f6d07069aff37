//! The API's one error shape, `{"error": {"code", "message"}}`, and how
//! service errors and request rejections map onto HTTP statuses.
//!
//! Everything a client can cause — a malformed or oversized body, a wrong
//! type, an unknown id — is a 4xx. A 5xx means the host itself is at fault,
//! so the mapping keeps `ServiceError::Internal` as the only way to get one.
//! A path the API does not have, or a method a path does not take, gets
//! the same shape ([`no_route`], [`wrong_method`]).

use axum::{
    extract::Request,
    http::StatusCode,
    response::{IntoResponse, Response},
    Json,
};
use serde::Serialize;
use serde_json::json;

use crate::error::ServiceError;

/// What a handler returns.
pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// An error answer: status, stable code, human message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

/// The JSON body of an error answer, as the OpenAPI document describes it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail {
    /// Stable, lower-case: `not_found`, `bad_request`, `conflict`,
    /// `forbidden`, `unauthorized`, `unsupported`, `payload_too_large`,
    /// `request_timeout`, `too_many_connections`, `busy`, ...
    pub code: String,
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

/// The status for each kind of service error.
///
/// - `Unsupported` is 422: the request is well-formed but asks for
///   something this host (or plugin) does not do; 501 would blame the
///   server for what is a client's choice.
/// - `Busy` is 503 with `Retry-After`: the host is at its cap of running
///   jobs; the same call succeeds once jobs end.
/// - `Plugin` is 424 (Failed Dependency): a plugin the request went through
///   failed. It is not the host's fault, and the host keeps serving.
pub fn status_of(error: &ServiceError) -> StatusCode {
    match error {
        ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
        ServiceError::InvalidInput(_) => StatusCode::BAD_REQUEST,
        ServiceError::Conflict(_) => StatusCode::CONFLICT,
        ServiceError::PermissionDenied(_) => StatusCode::FORBIDDEN,
        ServiceError::Unsupported(_) => StatusCode::UNPROCESSABLE_ENTITY,
        ServiceError::Plugin(_) | ServiceError::PluginPanic { .. } => StatusCode::FAILED_DEPENDENCY,
        ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        ServiceError::StorageFull(_) => StatusCode::INSUFFICIENT_STORAGE,
        ServiceError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> Self {
        ApiError {
            status: status_of(&error),
            code: error.code(),
            message: error.to_string(),
        }
    }
}

/// Any path the API does not have.
pub(crate) async fn no_route(request: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route {} {}",
        request.method(),
        request.uri().path()
    ))
}

/// A known path with a method it does not take.
pub(crate) async fn wrong_method(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

/// `Retry-After` of every 503 (`busy`, `too_many_connections`), in seconds.
pub(crate) const RETRY_AFTER_SECONDS: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A refusal for want of capacity (at the job cap) is expected
        // under load, not a fault: a warning would flood the log.
        if self.code == "busy" {
            tracing::debug!(code = self.code, message = %self.message, "request refused");
        } else if self.status.is_server_error() {
            tracing::error!(code = self.code, message = %self.message, "request failed");
        } else {
            tracing::debug!(status = %self.status, code = self.code, message = %self.message, "request refused");
        }
        let retry = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        let mut response = (self.status, Json(body)).into_response();
        if retry {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_internal_errors_are_5xx() {
        let errors = [
            ServiceError::NotFound("x".into()),
            ServiceError::InvalidInput("x".into()),
            ServiceError::Conflict("x".into()),
            ServiceError::PermissionDenied("x".into()),
            ServiceError::Unsupported("x".into()),
            ServiceError::Plugin("x".into()),
        ];
        for error in errors {
            let api = ApiError::from(error.clone());
            assert!(api.status.is_client_error(), "{error:?} -> {}", api.status);
            assert_eq!(api.code, error.code());
        }
        assert!(ApiError::from(ServiceError::Internal("x".into()))
            .status
            .is_server_error());
    }

    #[test]
    fn busy_is_503_with_retry_after() {
        let api = ApiError::from(ServiceError::Busy("at the cap".into()));
        assert_eq!(api.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.code, "busy");
        let response = api.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()["retry-after"], RETRY_AFTER_SECONDS);
    }
}
