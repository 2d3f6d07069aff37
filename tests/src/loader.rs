//! Set-up for the plugin loader tests (`loader`, `reload`, `reliability`):
//! a temp dir with a plugin dir the tests fill with real cdylibs (and
//! broken files), and a session service plus plugin host over it.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use offstage::{
    Isolation, IsolationConfig, IsolationSettings, PluginHost, PluginHostConfig, PluginInfo,
    PluginSettings, PluginStatus, SessionService,
};
use offstage_plugin_api::types::{NewSession, ToolRequest, ToolResult};
use serde_json::Value;

pub use crate::{
    host::set_mode,
    wait::{watchdog, PATIENCE},
};

/// A temp dir holding `plugins/` (the plugin dir) and `data/`.
pub struct Fixture {
    /// The temp dir holding both dirs below.
    pub dir: tempfile::TempDir,
    /// Where plugin files are installed.
    pub plugin_dir: PathBuf,
    /// The host's data dir.
    pub data_dir: PathBuf,
    /// Per-plugin settings by name.
    pub settings: BTreeMap<String, PluginSettings>,
    /// Load files others can write (tests copy into temp dirs).
    pub allow_insecure_permissions: bool,
    /// Which plugins run in a child process (none by default).
    pub isolation: IsolationConfig,
}

/// A loaded host.
pub struct Host {
    /// The service the plugins call.
    pub service: SessionService,
    /// The plugin host.
    pub plugins: PluginHost,
    /// What `load_all` returned.
    pub loaded: Vec<PluginInfo>,
    /// The dirs it runs in.
    pub fixture: Fixture,
}

impl Default for Fixture {
    fn default() -> Self {
        Self::new()
    }
}

impl Fixture {
    /// Empty plugin and data dirs in a new temp dir.
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let plugin_dir = dir.path().join("plugins");
        let data_dir = dir.path().join("data");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        std::fs::create_dir_all(&data_dir).unwrap();
        set_mode(&plugin_dir, 0o755);
        Fixture {
            dir,
            plugin_dir,
            data_dir,
            settings: BTreeMap::new(),
            allow_insecure_permissions: false,
            isolation: IsolationConfig::default(),
        }
    }

    /// A fixture whose plugins run as `mode` says: every plugin in a child
    /// process of its own (the `offstage` binary) with
    /// [`Isolation::Process`], in the host with [`Isolation::None`].
    pub fn with_mode(mode: Isolation) -> Fixture {
        Fixture::new().isolation(mode, IsolationSettings::default())
    }

    /// Sets `[plugins]` isolation: `mode` for every plugin, with `settings`
    /// (its `mode` is overridden).
    pub fn isolation(mut self, mode: Isolation, settings: IsolationSettings) -> Fixture {
        self.isolation.defaults = IsolationSettings {
            mode: Some(mode),
            ..settings
        };
        if mode == Isolation::Process {
            self.isolation.child_exe = Some(crate::fixtures::offstage_binary());
        }
        self
    }

    /// Installs the cdylib of workspace package `package` under its own
    /// file name, mode 0755.
    pub fn install(&self, package: &str) -> PathBuf {
        let path = crate::install_plugin(package, &self.plugin_dir);
        set_mode(&path, 0o755);
        path
    }

    /// Copies `source` into the plugin dir as `file_name`, mode 0755.
    pub fn install_file(&self, source: &Path, file_name: &str) -> PathBuf {
        let path = self.plugin_dir.join(file_name);
        std::fs::copy(source, &path).unwrap();
        set_mode(&path, 0o755);
        path
    }

    /// Writes `bytes` into the plugin dir as `file_name`, mode 0755.
    pub fn write_file(&self, file_name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.plugin_dir.join(file_name);
        std::fs::write(&path, bytes).unwrap();
        set_mode(&path, 0o755);
        path
    }

    /// Sets `[plugin.NAME]` options (enabled, all grants).
    pub fn options(mut self, name: &str, options: Value) -> Fixture {
        self.settings.insert(
            name.to_string(),
            PluginSettings {
                options,
                ..Default::default()
            },
        );
        self
    }

    /// Sets plugin `name`'s settings.
    pub fn settings(mut self, name: &str, settings: PluginSettings) -> Fixture {
        self.settings.insert(name.to_string(), settings);
        self
    }

    /// Creates the service and plugin host and runs `load_all`. Call it
    /// inside a multi-thread tokio runtime.
    pub fn start(self) -> Host {
        let service = crate::host::service(self.data_dir.clone(), vec![]);
        let plugins = PluginHost::with_isolation(
            service.clone(),
            PluginHostConfig {
                dirs: vec![self.plugin_dir.clone()],
                data_dir: self.data_dir.clone(),
                allow_insecure_permissions: self.allow_insecure_permissions,
                settings: self.settings.clone(),
            },
            self.isolation.clone(),
        );
        let loaded = plugins.load_all();
        Host {
            service,
            plugins,
            loaded,
            fixture: self,
        }
    }
}

impl Host {
    /// The info `load_all` returned for the file called `file_name`.
    pub fn outcome(&self, file_name: &str) -> &PluginInfo {
        self.loaded
            .iter()
            .find(|i| i.path.file_name().unwrap() == file_name)
            .unwrap_or_else(|| panic!("no load attempt for {file_name}: {:#?}", self.loaded))
    }

    /// The error `load_all` recorded for `file_name`.
    pub fn error(&self, file_name: &str) -> String {
        let info = self.outcome(file_name);
        assert_eq!(info.status, PluginStatus::Failed, "{info:#?}");
        info.error.clone().expect("a failed plugin has an error")
    }

    /// Asserts that plugin `name` is loaded.
    pub fn assert_loaded(&self, name: &str) {
        let info = self
            .plugins
            .get(name)
            .unwrap_or_else(|| panic!("{name} unknown: {:#?}", self.loaded));
        assert_eq!(info.status, PluginStatus::Loaded, "{info:#?}");
        assert_eq!(info.error, None);
    }

    /// Creates a session and returns its id.
    pub async fn session(&self) -> String {
        self.service.create(NewSession::default()).await.unwrap().id
    }

    /// Calls `tool` in a new session, within [`PATIENCE`].
    pub async fn call(&self, tool: &str, input: Value) -> offstage::Result<ToolResult> {
        let session = self.session().await;
        let _watchdog = watchdog(tool);
        tokio::time::timeout(
            PATIENCE,
            self.service
                .call_tool(&session, ToolRequest::new(tool, input)),
        )
        .await
        .unwrap_or_else(|_| panic!("{tool} did not answer within {PATIENCE:?}: deadlock?"))
    }

    /// Asserts that the `hello` test plugin answers.
    pub async fn assert_hello_works(&self) {
        self.assert_loaded("hello");
        let result = self
            .call("hello", serde_json::json!({ "name": "ada" }))
            .await
            .unwrap();
        assert_eq!(result.output, "hello, ada");
    }
}

/// The library file name of `package` on this platform.
pub fn lib_name(package: &str) -> String {
    crate::library_file_name(package)
}

/// Asserts `error` is one line that names `path` and contains each of `parts`.
pub fn assert_one_line(error: &str, path: &Path, parts: &[&str]) {
    assert!(!error.contains('\n'), "not one line: {error:?}");
    assert!(
        error.starts_with(&path.display().to_string()),
        "does not start with the file {}: {error}",
        path.display()
    );
    for part in parts {
        assert!(error.contains(part), "{error:?} lacks {part:?}");
    }
}
