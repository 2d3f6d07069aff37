//! `GET /api/plugin` and `POST /api/plugin/:name/reload`: the plugin host's
//! view of its plugins, and hot reload on request, both as the plugin host
//! does them.

use super::{
    error::{ApiError, ErrorBody},
    extract::PathId,
    AppState,
};
use crate::plugin::{LoadError, PluginInfo};
use axum::{extract::State, Json};
use utoipa_axum::{router::OpenApiRouter, routes};

/// Registers this file's routes with their OpenAPI entries (one
/// `routes!` per path).
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(list_plugins))
        .routes(routes!(reload_plugin))
}

#[utoipa::path(get, path = "/api/plugin", tag = "plugin",
    responses((status = 200, description = "Loaded, failed and unloaded plugins", body = [PluginInfo])))]
pub(crate) async fn list_plugins(State(state): State<AppState>) -> Json<Vec<PluginInfo>> {
    Json(state.plugins.list())
}

#[utoipa::path(post, path = "/api/plugin/{name}/reload", tag = "plugin",
    params(("name" = String, Path, description = "Plugin name")),
    responses((status = 200, description = "The plugin after the reload: its new generation", body = PluginInfo),
        (status = "4XX", description = "Refused; `error.code` says why", body = ErrorBody)))]
pub(crate) async fn reload_plugin(
    State(state): State<AppState>,
    PathId(name): PathId,
) -> Result<Json<PluginInfo>, ApiError> {
    // Reloading blocks (file checks, dlopen, the plugin's `init`); it runs
    // to its end even if the client hangs up.
    let plugins = state.plugins.clone();
    match tokio::task::spawn_blocking(move || plugins.reload(&name)).await {
        Ok(Ok(info)) => Ok(Json(info)),
        Ok(Err(error)) => Err(load_error(&error)),
        Err(error) => Err(ApiError::internal(format!("reload task failed: {error}"))),
    }
}

/// A failed reload: an unknown name is 404; a new build that cannot be
/// loaded is the plugin's failure (424, the old generation keeps serving);
/// only the host's own trouble is a 5xx.
fn load_error(error: &LoadError) -> ApiError {
    let message = error.to_string();
    match error {
        LoadError::Unknown { .. } => ApiError::not_found(message),
        LoadError::Host { .. } => ApiError::internal(message),
        _ => ApiError::from(crate::error::ServiceError::Plugin(message)),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use crate::plugin::{PluginInfo, PluginStatus};

    #[test]
    fn mirror_matches_plugin_info() {
        let doc = serde_json::to_value(crate::http::openapi()).unwrap();
        let described: BTreeSet<String> = doc["components"]["schemas"]["Plugin"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        let info = PluginInfo {
            name: "x".into(),
            version: "1.0.0".into(),
            path: "/x.so".into(),
            generation: 1,
            status: PluginStatus::Loaded,
            error: None,
            capabilities: vec![],
            description: String::new(),
            api_version: "1.1.0".into(),
            isolation: crate::plugin::Isolation::Process,
            pid: Some(1),
            filesystem: crate::plugin::Filesystem::ReadOnly,
            blocking_polls: 0,
            last_crash: Some(crate::plugin::LastCrash {
                signal: "SIGSEGV".into(),
                hook: Some("a tool".into()),
                at: 1,
                pid: 2,
                plugin: Some("x".into()),
            }),
        };
        let real: BTreeSet<String> = serde_json::to_value(info)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(described, real);
    }
}
