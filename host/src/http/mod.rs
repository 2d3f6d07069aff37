//! The HTTP API (docs/contract.md, "HTTP API"): routes, the event stream, the
//! access checks, and the server loop `offstage serve` runs.
//!
//! This module is a front end only. Handlers translate HTTP to calls on
//! [`SessionService`] and [`PluginHost`] and their errors back to HTTP, so
//! every behaviour is the same one plugins get through the ABI.
//!
//! Each route is registered once, together with its OpenAPI entry
//! (`utoipa_axum`'s `routes!`): [`router`] and [`openapi`] are both built
//! from one list, `api()`, so the server and `GET /api/openapi.json` cannot drift.
//!
//! - `host.rs`, `sessions.rs`, `jobs.rs`, `permissions.rs`, `plugins.rs`,
//!   `events.rs`: the handlers by resource, each with its `routes`;
//! - `extract.rs`: body/query/path parsing with JSON errors and a body limit;
//! - `error.rs`: the `{"error": {"code", "message"}}` shape, status map and
//!   the answers for unknown paths and methods;
//! - `auth.rs`: bearer token, cross-origin and Host checks;
//! - `openapi.rs`: the document's frame (info, security, tags), and the
//!   refusals the checks around the handlers add to every route;
//! - `server.rs`: the accept loop with its connection cap (on TCP and on
//!   the data dir's unix socket, `api.sock`), and the
//!   open-file limit; `admission.rs`: who holds a slot, and who gives one
//!   up at the cap; `connection.rs`: one connection's timeouts, and
//!   request bodies settled so that a refusal never breaks keep-alive.

mod admission;
pub(crate) mod agents;
pub(crate) mod auth;
mod connection;
pub(crate) mod error;
pub(crate) mod event_schema;
pub(crate) mod events;
pub(crate) mod extract;
pub(crate) mod host;
pub(crate) mod jobs;
#[cfg(feature = "mcp")]
mod mcp;
pub(crate) mod openapi;
pub(crate) mod permissions;
pub(crate) mod plugins;
pub(crate) mod server;
pub(crate) mod sessions;
pub(crate) mod tools;

use std::{
    future::Future,
    sync::{Arc, OnceLock},
    time::Instant,
};

use axum::{
    extract::{DefaultBodyLimit, Request},
    middleware::Next,
    response::Response,
    Router,
};
use tokio::sync::watch;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub(crate) use self::server::{
    bind_unix, raise_open_file_limit_and_log, serve, socket_path, Limits,
};

use self::error::{ApiError, ApiResult};
use crate::{plugin::PluginHost, session::SessionService};

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub(crate) struct AppState {
    pub service: SessionService,
    pub plugins: PluginHost,
    /// The bearer token every route but `/api/health` needs, if any.
    pub token: Option<Arc<str>>,
    /// Turns `true` when the host shuts down; ends event streams.
    pub shutdown: watch::Receiver<bool>,
}

/// Every route of the API with its OpenAPI entry: the one list both
/// [`router`] and [`openapi`] are built from.
fn api() -> OpenApiRouter<AppState> {
    let api = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi());
    let api = host::routes(api);
    let api = sessions::routes(api);
    let api = jobs::routes(api);
    let api = permissions::routes(api);
    let api = plugins::routes(api);
    let api = tools::routes(api);
    let api = agents::routes(api);
    events::routes(api)
}

/// The OpenAPI document served at `GET /api/openapi.json`: every route
/// [`router`] serves, with its schemas.
pub(crate) fn openapi() -> serde_json::Value {
    static DOCUMENT: OnceLock<serde_json::Value> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| {
            let mut document = api().into_openapi();
            // After the routes: they register the record schemas it refines.
            utoipa::Modify::modify(&openapi::NoticeMetadataOfMessages, &mut document);
            openapi::finish(document)
        })
        .clone()
}

/// The API's router with its state, checks and limits.
pub(crate) fn router(state: AppState) -> Router {
    let (routes, _document) = api().split_for_parts();
    // The MCP server (docs/mcp.md), behind the same checks as the API.
    #[cfg(feature = "mcp")]
    let routes = routes.route("/mcp", mcp::route(&state));
    routes
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .layer(DefaultBodyLimit::max(extract::BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(state)
}

/// Runs `work` on its own task so that dropping the request (a client
/// disconnect) does not drop the work.
async fn detached<T: Send + 'static>(
    work: impl Future<Output = crate::error::Result<T>> + Send + 'static,
) -> ApiResult<T> {
    match tokio::spawn(work).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(error) => Err(ApiError::internal(format!("request task failed: {error}"))),
    }
}

/// Logs each request at `debug` (`OFFSTAGE_LOG=offstage::http=debug`):
/// method, path, status and the time to the answer's head.
async fn log_request(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::debug!(
        %method,
        %path,
        status = response.status().as_u16(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}
