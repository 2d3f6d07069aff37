//! Jobs: list, read, page through output, cancel.

use axum::{extract::State, Json};
use offstage_plugin_api::types::Job;
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{
    detached,
    error::{ApiResult, ErrorBody},
    extract::{PathId, QueryParams},
    AppState,
};
use crate::{
    error::ServiceError,
    process::output::{OutputChunk, DEFAULT_OUTPUT_LIMIT},
};

/// Registers this file's routes with their OpenAPI entries (one
/// `routes!` per path).
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(list_jobs))
        .routes(routes!(get_job, cancel_job))
        .routes(routes!(job_output))
}

/// Query of `GET /api/job`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct JobsQuery {
    /// Only this session's jobs.
    pub session_id: Option<String>,
}

#[utoipa::path(get, path = "/api/job", tag = "job",
    params(JobsQuery),
    responses((status = 200, description = "Jobs, oldest first", body = [Job]), (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub(crate) async fn list_jobs(
    State(state): State<AppState>,
    QueryParams(query): QueryParams<JobsQuery>,
) -> ApiResult<Json<Vec<Job>>> {
    Ok(Json(state.service.jobs(query.session_id.as_deref()).await?))
}

#[utoipa::path(get, path = "/api/job/{id}", tag = "job",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, description = "The job", body = Job), (status = 404, description = "No such id", body = ErrorBody)))]
pub(crate) async fn get_job(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<Json<Job>> {
    Ok(Json(state.service.job(&id).await?))
}

/// Query of `GET /api/job/:id/output`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct OutputQuery {
    /// Byte offset to start at; 0 when absent.
    pub offset: Option<u64>,
    /// Most bytes to return, at least 1 (0 is refused: such a page would
    /// never get to the end); 1 MiB when absent, at most 4 MiB.
    #[param(minimum = 1)]
    pub limit: Option<u64>,
    /// The last `tail` bytes of the file instead (at most 4 MiB), starting
    /// on a whole character; not with `offset` or `limit`.
    pub tail: Option<u64>,
}

#[utoipa::path(get, path = "/api/job/{id}/output", tag = "job",
    params(("id" = String, Path, description = "Job id"), OutputQuery),
    responses((status = 200, description = "A byte range of the job's output file", body = OutputChunk),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub(crate) async fn job_output(
    State(state): State<AppState>,
    PathId(id): PathId,
    QueryParams(query): QueryParams<OutputQuery>,
) -> ApiResult<Json<OutputChunk>> {
    if let Some(bytes) = query.tail {
        if query.offset.is_some() || query.limit.is_some() {
            return Err(ServiceError::InvalidInput(
                "tail reads the end of the output: give it alone, without offset or limit".into(),
            )
            .into());
        }
        return Ok(Json(state.service.job_output_tail(&id, bytes).await?));
    }
    let offset = query.offset.unwrap_or(0);
    let limit = query.limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);
    Ok(Json(state.service.job_output(&id, offset, limit).await?))
}

#[utoipa::path(delete, path = "/api/job/{id}", tag = "job",
    params(("id" = String, Path, description = "Job id")),
    responses((status = 200, description = "The job as it ended", body = Job), (status = 404, description = "No such id", body = ErrorBody)))]
pub(crate) async fn cancel_job(
    State(state): State<AppState>,
    PathId(id): PathId,
) -> ApiResult<Json<Job>> {
    let service = state.service.clone();
    Ok(Json(
        detached(async move { service.cancel_job(&id).await }).await?,
    ))
}
