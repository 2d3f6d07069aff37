//! `offstage plugin check FILE [--config FILE]`: one file loaded in
//! isolation — the full load, `init` included — against a throwaway
//! session service, then shut down. Why the full load: most plugin faults
//! show in `init` (a grant it lacks, a name it cannot register, a panic),
//! not in the file's headers. The report tells the two kinds apart
//! ([`LoadStage`]): a problem of the file (format, ABI, manifest) needs a
//! new build; a problem of its start (options, grants, `init`) may need
//! only another config.

use std::{collections::BTreeMap, path::Path};

use tokio::runtime::Handle;

use super::{LoadError, LoadStage, PluginHost, PluginHostConfig, PluginInfo, PluginSettings};
use crate::session::SessionService;

/// How [`check_file_with`] treats a file.
#[derive(Debug, Clone, Default)]
pub(crate) struct CheckOptions {
    /// Load the file even if it (or its directory) is writable by other
    /// users. For development.
    pub allow_insecure_permissions: bool,
    /// Per-plugin settings (grants, options) by plugin name, as a host
    /// config's `[plugin.NAME]` tables give them; none by default.
    pub settings: BTreeMap<String, PluginSettings>,
    /// Where to run it and how, as a host config's `[plugins]` and
    /// `[plugin.NAME]` isolation keys say (resolved by the plugin's name,
    /// once its manifest is read): in this process by default, or in a
    /// child process (the `offstage` binary running this, unless
    /// `child_exe` names another).
    pub isolation: super::IsolationConfig,
}

/// What [`check_file_with`] found.
#[derive(Debug)]
pub(crate) struct CheckReport {
    /// The plugin as the throwaway host listed it (a failed load
    /// included); `None` only if the host itself could not start.
    pub plugin: Option<PluginInfo>,
    /// Why it did not load, if it did not.
    pub error: Option<LoadError>,
}

impl CheckReport {
    /// Which part failed, if any: the file (format, ABI, manifest) or
    /// its start (config, options, `init`).
    pub(crate) fn failed_stage(&self) -> Option<LoadStage> {
        self.error.as_ref().map(LoadError::stage)
    }
}

/// Loads one plugin file in isolation, as `offstage plugin check FILE` does:
/// the full load including `init`, against a fresh session service in a
/// temporary data dir, then shuts it down. Uses the current tokio runtime if
/// there is one, else starts its own. Insecure permissions are refused.
pub fn check_file(path: &Path) -> Result<PluginInfo, LoadError> {
    let report = check_file_with(path, CheckOptions::default());
    match (report.error, report.plugin) {
        (Some(error), _) => Err(error),
        (None, Some(info)) => Ok(info),
        (None, None) => Err(LoadError::Host {
            path: path.to_path_buf(),
            message: "the check produced no result".into(),
        }),
    }
}

/// [`check_file`] with [`CheckOptions`], reporting the plugin's info
/// even when it failed.
pub(crate) fn check_file_with(path: &Path, options: CheckOptions) -> CheckReport {
    match check_inner(path, options) {
        Ok(report) => report,
        Err(error) => CheckReport {
            plugin: None,
            error: Some(error),
        },
    }
}

fn check_inner(path: &Path, options: CheckOptions) -> Result<CheckReport, LoadError> {
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
                settings: options.settings.clone(),
            },
            options.isolation.clone(),
        );
        let (plugin, error) = host.load_recorded(path);
        host.shutdown();
        CheckReport {
            plugin: Some(plugin),
            error: error.err(),
        }
    };
    if Handle::try_current().is_ok() {
        return Ok(check());
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
    Ok(result)
}
