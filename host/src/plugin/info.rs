//! What the host tells about a plugin (`GET /api/plugin`, `offstage plugin
//! list|check`): one [`PluginInfo`] per load attempt, built here from what
//! the loader learnt.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{
    abi::ManifestInfo,
    load::{file_stem, LoadFailure},
};

/// Where a plugin is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PluginStatus {
    /// Initialised and serving.
    Loaded,
    /// Refused at load, failed in `init`, or panicked later.
    Failed,
    /// Disabled by config, or shut down.
    Unloaded,
}

/// A plugin as `GET /api/plugin` and `offstage plugin check` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "server", schema(as = Plugin))]
pub struct PluginInfo {
    /// The manifest's name; for a file refused before its manifest was read,
    /// the file's stem.
    pub name: String,
    /// The version its manifest gives.
    pub version: String,
    /// The plugin file as found in the plugin dir (not the private copy).
    #[cfg_attr(feature = "server", schema(value_type = String))]
    pub path: PathBuf,
    /// 1 for the first `init` of a name, 0 when `init` was never reached.
    pub generation: u64,
    /// Loaded, failed or unloaded.
    pub status: PluginStatus,
    /// Why it failed: the one-line [`LoadError`](super::LoadError) or the panic message.
    pub error: Option<String>,
    /// Capabilities granted (requested ∩ config's grant list).
    pub capabilities: Vec<String>,
    /// Its manifest's one-line description.
    pub description: String,
    /// The `offstage-plugin-api` version it was built against.
    pub api_version: String,
    /// Where its code runs: `none` (in the host) or `process`.
    pub isolation: super::Isolation,
    /// The process id of its child process, when isolated and loaded.
    pub pid: Option<u32>,
    /// What its process may do to the filesystem: `unrestricted`, or
    /// `read-only` (read everywhere, write only in its data dir).
    pub filesystem: super::Filesystem,
    /// How many polls of its hooks held one of the host's runtime workers
    /// past 50 ms since the host started (in-process plugins; each is
    /// also a logged warning, at most one a minute). Blocking code in a
    /// hook stalls the host's other work.
    pub blocking_polls: u64,
    /// The fatal signal that ended the host's last run while one of its
    /// threads ran this plugin's code (in process), if the last run ended
    /// so; shown from the start after it until the host stops.
    pub last_crash: Option<super::LastCrash>,
}

impl PluginInfo {
    /// With what the host observed of it since it started.
    pub(super) fn observed(mut self) -> Self {
        self.blocking_polls = super::watchdog::blocking_polls(&self.name);
        self.last_crash = super::crash::last_crash_of(&self.name);
        self
    }
}

pub(super) fn info_from(
    path: &Path,
    manifest: &ManifestInfo,
    generation: u64,
    status: PluginStatus,
    capabilities: Vec<String>,
) -> PluginInfo {
    PluginInfo {
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        path: path.to_path_buf(),
        generation,
        status,
        error: None,
        capabilities,
        description: manifest.description.clone(),
        api_version: manifest.api_version.clone(),
        isolation: super::Isolation::None,
        pid: None,
        filesystem: super::Filesystem::Unrestricted,
        blocking_polls: 0,
        last_crash: None,
    }
}

pub(super) fn failed_info(path: &Path, failure: &LoadFailure) -> PluginInfo {
    let mut info = match &failure.manifest {
        Some(manifest) => info_from(
            path,
            manifest,
            failure.generation,
            PluginStatus::Failed,
            Vec::new(),
        ),
        None => PluginInfo {
            name: file_stem(path),
            version: String::new(),
            path: path.to_path_buf(),
            generation: 0,
            status: PluginStatus::Failed,
            error: None,
            capabilities: Vec::new(),
            description: String::new(),
            api_version: String::new(),
            isolation: super::Isolation::None,
            pid: None,
            filesystem: super::Filesystem::Unrestricted,
            blocking_polls: 0,
            last_crash: None,
        },
    };
    info.error = Some(super::error::capped(&failure.error.to_string()).into_owned());
    info
}
