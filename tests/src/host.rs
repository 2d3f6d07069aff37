//! Building a host in process: a session service over a data dir, a plugin
//! host over it, and the small file chores the plugin tests share.

use std::{collections::BTreeMap, path::Path, path::PathBuf};

use offstage::{
    Isolation, IsolationConfig, IsolationSettings, PluginHost, PluginHostConfig, PluginSettings,
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

/// `[plugins] isolation = MODE` with default settings: with
/// [`Isolation::Process`] every plugin runs in a child process of its own
/// (the `offstage` binary, built once per test process).
///
/// The suites that run in both modes (`isolation::*`) take their mode here.
pub fn isolation(mode: Isolation) -> IsolationConfig {
    IsolationConfig {
        defaults: IsolationSettings {
            mode: Some(mode),
            ..Default::default()
        },
        child_exe: (mode == Isolation::Process).then(crate::fixtures::offstage_binary),
        ..Default::default()
    }
}

/// A plugin host for `service` over one plugin dir (nothing loaded yet),
/// its plugins run as `mode` says.
pub fn plugin_host(
    service: &SessionService,
    plugin_dir: PathBuf,
    data_dir: PathBuf,
    settings: BTreeMap<String, PluginSettings>,
    mode: Isolation,
) -> PluginHost {
    PluginHost::with_isolation(
        service.clone(),
        PluginHostConfig {
            dirs: vec![plugin_dir],
            data_dir,
            allow_insecure_permissions: false,
            settings,
        },
        isolation(mode),
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
