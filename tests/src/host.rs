//! Building a host in process: a session service over a data dir, a plugin
//! host over it, and the small file chores the plugin tests share.

use std::{collections::BTreeMap, path::Path, path::PathBuf};

use offstage::{
    plugin::{PluginHost, PluginHostConfig, PluginSettings},
    Rule, ServiceConfig, SessionService,
};
use offstage_plugin_api::types::NewSession;

/// A session service keeping its data in `data_dir`.
pub fn service(data_dir: PathBuf, permissions: Vec<Rule>) -> SessionService {
    SessionService::new(ServiceConfig {
        data_dir,
        permissions,
    })
}

/// A plugin host for `service` over one plugin dir (nothing loaded yet).
pub fn plugin_host(
    service: &SessionService,
    plugin_dir: PathBuf,
    data_dir: PathBuf,
    settings: BTreeMap<String, PluginSettings>,
    allow_insecure_permissions: bool,
) -> PluginHost {
    PluginHost::new(
        service.clone(),
        PluginHostConfig {
            dirs: vec![plugin_dir],
            data_dir,
            allow_insecure_permissions,
            settings,
        },
    )
}

/// A new session titled `test` running the `script` agent.
pub async fn script_session(service: &SessionService) -> String {
    service
        .create(NewSession {
            title: Some("test".into()),
            agent: Some("script".into()),
            parent_id: None,
        })
        .await
        .unwrap()
        .id
}

/// Sets the Unix mode of `path` (nothing elsewhere).
pub fn set_mode(path: &Path, mode: u32) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    #[cfg(not(unix))]
    let _ = (path, mode);
}
