//! The HTTP API (CONTRACT.md, "HTTP API"): routes, the event stream, the
//! access checks, and the server loop `offstage serve` runs.
//!
//! This module is a front end only. Handlers translate HTTP to calls on
//! [`SessionService`] and [`PluginHost`] and their errors back to HTTP, so
//! every behaviour is the same one plugins get through the ABI.
//!
//! - `routes.rs`, `plugins.rs`, `events.rs`: the handlers;
//! - `extract.rs`: body/query/path parsing with JSON errors and a body limit;
//! - `error.rs`: the `{"error": {"code", "message"}}` shape and status map;
//! - `auth.rs`: bearer token, cross-origin and Host checks;
//! - `openapi.rs`: the generated OpenAPI document.

pub mod auth;
pub mod error;
pub mod events;
pub mod extract;
pub mod openapi;
pub mod plugins;
pub mod routes;

use std::{future::Future, sync::Arc, time::Instant};

use axum::{
    extract::{DefaultBodyLimit, Request},
    middleware::Next,
    response::Response,
    routing::{get, post},
    Router,
};
use tokio::{net::TcpListener, sync::watch};

use crate::{plugin::PluginHost, SessionService};

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub service: SessionService,
    pub plugins: PluginHost,
    /// The bearer token every route but `/api/health` needs, if any.
    pub token: Option<Arc<str>>,
    /// Turns `true` when the host shuts down; ends event streams.
    pub shutdown: watch::Receiver<bool>,
}

/// The API's router with its state, checks and limits.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/health", get(routes::health))
        .route(
            "/api/session",
            get(routes::list_sessions).post(routes::create_session),
        )
        .route(
            "/api/session/{id}",
            get(routes::get_session)
                .patch(routes::rename_session)
                .delete(routes::remove_session),
        )
        .route("/api/session/{id}/message", get(routes::messages))
        .route("/api/session/{id}/prompt", post(routes::prompt))
        .route("/api/session/{id}/tool", post(routes::call_tool))
        .route("/api/session/{id}/background", post(routes::background))
        .route("/api/session/{id}/interrupt", post(routes::interrupt))
        .route("/api/job", get(routes::list_jobs))
        .route(
            "/api/job/{id}",
            get(routes::get_job).delete(routes::cancel_job),
        )
        .route("/api/job/{id}/output", get(routes::job_output))
        .route("/api/permission", get(routes::pending_permissions))
        .route("/api/permission/{id}", post(routes::reply_permission))
        .route("/api/plugin", get(plugins::list_plugins))
        .route("/api/plugin/{name}/reload", post(plugins::reload_plugin))
        .route("/api/event", get(events::events))
        .route("/api/openapi.json", get(openapi::openapi_json))
        .fallback(routes::no_route)
        .method_not_allowed_fallback(routes::wrong_method)
        .layer(DefaultBodyLimit::max(extract::BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .layer(axum::middleware::from_fn(log_request))
        .with_state(state)
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

/// Serves `router` on `listener` until `shutdown` resolves, then stops
/// accepting and waits for open requests to finish. Event streams end
/// by themselves when the state's shutdown flag is raised.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
