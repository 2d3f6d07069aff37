//! `/mcp`: the MCP server (`crate::mcp`, docs/mcp.md) under the API's
//! token, origin and Host checks, with each POSTed message checked first
//! so that bad input gets a JSON-RPC error rather than rmcp's plain-text
//! refusal (`mcp/input.rs`).

use axum::{
    body::{Body, Bytes},
    extract::{FromRequest, Request},
    http::{header, HeaderValue, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    routing::{any_service, MethodRouter},
};
use rmcp::model::JsonRpcError;

use super::{extract::BODY_LIMIT, permissions, server::Peer, AppState};
use crate::mcp::{input, McpHost, PROTOCOL_SESSION_HEADER};

/// The `/mcp` route: rmcp's Streamable HTTP service behind [`check_message`].
pub(super) fn route(state: &AppState) -> MethodRouter<AppState> {
    let host = McpHost::new(state.service.clone(), state.token.as_deref());
    let token = state.token.is_some();
    let streams = host.clone();
    any_service(crate::mcp::http_service(host, BODY_LIMIT))
        .layer(axum::middleware::from_fn(check_message))
        .layer(axum::middleware::from_fn(
            move |mut request: Request, next: Next| {
                let streams = streams.clone();
                async move {
                    // Who the client is, for the answers it gives to
                    // permission questions by elicitation: checked as the
                    // API's own route checks them (no answer from inside a
                    // job).
                    let Some(peer) = request.extensions().get::<Peer>().copied() else {
                        return next.run(request).await;
                    };
                    let answerer = permissions::answerer(peer, token);
                    request.extensions_mut().insert(answerer);
                    // A standing stream, once rmcp opened it for a session
                    // it knows: the questions of the jobs the client
                    // follows go out on it (`McpHost::stream_opened`).
                    let stream = (request.method() == Method::GET)
                        .then(|| request.headers().get(PROTOCOL_SESSION_HEADER))
                        .flatten()
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    let response = next.run(request).await;
                    if let (Some(id), true) = (stream, response.status().is_success()) {
                        streams.stream_opened(&id, answerer);
                    }
                    response
                }
            },
        ))
}

/// Reads a POSTed body (within the API's body limit) and answers what is
/// not one MCP message with its JSON-RPC error; passes the rest on, with
/// a 2025-11-25 `params.task` moved where rmcp keeps it (`mcp/input.rs`).
async fn check_message(request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let announced_too_large =
        http_body::Body::size_hint(&body).lower() > u64::try_from(BODY_LIMIT).unwrap_or(u64::MAX);
    if announced_too_large {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, input::too_large(BODY_LIMIT));
    }
    let bytes = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(bytes) => bytes,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return refuse(StatusCode::PAYLOAD_TOO_LARGE, input::too_large(BODY_LIMIT))
        }
        Err(rejection) => return rejection.into_response(),
    };
    let body = match input::check(&bytes) {
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
        Ok(Some(rewritten)) => {
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
            Body::from(rewritten)
        }
        Ok(None) => Body::from(bytes),
    };
    next.run(Request::from_parts(parts, body)).await
}

fn refuse(status: StatusCode, error: JsonRpcError) -> Response {
    let body = serde_json::to_vec(&error).unwrap_or_default();
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
