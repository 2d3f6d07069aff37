//! `offstage plugin check FILE`: one file loaded in isolation — the full
//! load, `init` included — against a throwaway session service, then shut
//! down. Why the full load: most plugin faults show in `init` (a grant it
//! lacks, a name it cannot register, a panic), not in the file's headers.

use std::{collections::BTreeMap, path::Path};

use tokio::runtime::Handle;

use super::{LoadError, PluginHost, PluginHostConfig, PluginInfo};
use crate::session::SessionService;

/// How [`check_file_with`] treats a file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckOptions {
    /// Load the file even if it (or its directory) is writable by other
    /// users. For development.
    pub allow_insecure_permissions: bool,
    /// Where to run it: in this process, or in a child process as
    /// `isolation = "process"` would (the `offstage` binary running this).
    pub isolation: super::Isolation,
}

/// Loads one plugin file in isolation, as `offstage plugin check FILE` does:
/// the full load including `init`, against a fresh session service in a
/// temporary data dir, then shuts it down. Uses the current tokio runtime if
/// there is one, else starts its own. Insecure permissions are refused.
pub fn check_file(path: &Path) -> Result<PluginInfo, LoadError> {
    check_file_with(path, CheckOptions::default())
}

/// [`check_file`] with [`CheckOptions`].
pub fn check_file_with(path: &Path, options: CheckOptions) -> Result<PluginInfo, LoadError> {
    let host_error = |message: String| LoadError::Host {
        path: path.to_path_buf(),
        message,
    };
    let temp = tempfile::tempdir()
        .map_err(|e| host_error(format!("cannot create a temporary dir: {e}")))?;
    let check = || {
        let service = SessionService::new(crate::session::ServiceConfig {
            data_dir: temp.path().join("data"),
            permissions: Vec::new(),
        });
        let host = PluginHost::with_isolation(
            service,
            PluginHostConfig {
                dirs: Vec::new(),
                data_dir: temp.path().to_path_buf(),
                allow_insecure_permissions: options.allow_insecure_permissions,
                settings: BTreeMap::new(),
            },
            super::IsolationConfig {
                defaults: super::IsolationSettings {
                    mode: Some(options.isolation),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        let result = host.load_file(path);
        host.shutdown();
        result
    };
    if Handle::try_current().is_ok() {
        return check();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| host_error(format!("cannot start a tokio runtime: {e}")))?;
    let result = {
        let _enter = runtime.enter();
        check()
    };
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    result
}
