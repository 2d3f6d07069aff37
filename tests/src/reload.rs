//! Set-up for the hot-reload tests (`reload`): the `reloadable` test
//! plugin built three ways by cargo (see [`crate::fixtures`]), so a reload
//! loads a genuinely different library, and a host whose plugin dir holds
//! one of them.

use std::path::{Path, PathBuf};

use offstage::Isolation;
use offstage_plugin_api::types::{ToolRequest, ToolResult};
use serde_json::{json, Value};

use crate::{
    loader::{lib_name, set_mode, Fixture, Host, PATIENCE},
    wait::poll_showing,
};

/// The reloadable test plugin's package.
pub const PACKAGE: &str = "offstage-test-reloadable";

/// The builds of the `reloadable` test plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The first build.
    A,
    /// The second build, with different answers.
    B,
    /// `init` registers everything, then fails.
    Broken,
}

impl Variant {
    /// The variant's library, built by cargo once per test process.
    pub fn library(self) -> PathBuf {
        match self {
            Variant::A => crate::fixtures::plugin_library(PACKAGE),
            Variant::B => crate::fixtures::reloadable_b(),
            Variant::Broken => crate::fixtures::reloadable_broken(),
        }
    }

    /// What the plugin stamps on its answers.
    pub fn name(self) -> &'static str {
        match self {
            Variant::A => "a",
            Variant::B => "b",
            Variant::Broken => "broken",
        }
    }
}

/// A host with variant `first` of the plugin loaded, logging to `log`.
pub struct ReloadHost {
    /// The host running the plugin.
    pub host: Host,
    /// The plugin file in the plugin dir.
    pub path: PathBuf,
    /// Where the plugin appends `event ...` and `shutdown ...` lines.
    pub log: PathBuf,
}

impl ReloadHost {
    /// A host with build `first` loaded in process.
    pub fn start(first: Variant) -> ReloadHost {
        Self::start_as(Isolation::None, first)
    }

    /// A host with build `first` loaded, run as `mode` says.
    pub fn start_as(mode: Isolation, first: Variant) -> ReloadHost {
        Self::start_with(mode, first, json!({}))
    }

    /// As [`start_as`](Self::start_as), with more plugin options.
    pub fn start_with(mode: Isolation, first: Variant, options: Value) -> ReloadHost {
        let fixture = Fixture::with_mode(mode);
        let log = fixture.dir.path().join("plugin.log");
        let mut options = options;
        options["log"] = json!(log);
        let fixture = fixture.options("reloadable", options);
        let path = fixture.install_file(&first.library(), &lib_name(PACKAGE));
        let host = fixture.start();
        host.assert_loaded("reloadable");
        ReloadHost { host, path, log }
    }

    /// Puts `variant` in place of the plugin file, as a build would:
    /// written beside it, then renamed over it.
    pub fn install(&self, variant: Variant) {
        let temp = self.path.with_extension("partial");
        std::fs::copy(variant.library(), &temp).unwrap();
        set_mode(&temp, 0o755);
        std::fs::rename(&temp, &self.path).unwrap();
    }

    /// Writes `bytes` in place of the plugin file.
    pub fn install_bytes(&self, bytes: &[u8]) {
        let temp = self.path.with_extension("partial");
        std::fs::write(&temp, bytes).unwrap();
        set_mode(&temp, 0o755);
        std::fs::rename(&temp, &self.path).unwrap();
    }

    /// Installs `variant` and reloads the plugin, off the runtime's
    /// workers as an HTTP handler would.
    pub async fn reload_to(
        &self,
        variant: Variant,
    ) -> Result<offstage::PluginInfo, offstage::LoadError> {
        self.install(variant);
        self.reload().await
    }

    /// Reloads the plugin from its installed file.
    pub async fn reload(&self) -> Result<offstage::PluginInfo, offstage::LoadError> {
        let plugins = self.host.plugins.clone();
        tokio::time::timeout(
            PATIENCE,
            tokio::task::spawn_blocking(move || plugins.reload("reloadable")),
        )
        .await
        .expect("reload did not finish: deadlock?")
        .unwrap()
    }

    /// Calls `tool` with `input` in a new session.
    pub async fn call(&self, tool: &str, input: Value) -> offstage::Result<ToolResult> {
        self.host.call(tool, input).await
    }

    /// Calls `tool` and returns its output; it must complete.
    pub async fn output(&self, tool: &str, input: Value) -> String {
        let result = self.call(tool, input).await.unwrap();
        assert_eq!(
            result.status,
            offstage_plugin_api::types::ToolStatus::Completed,
            "{result:#?}"
        );
        result.output
    }

    /// The stamp of the generation answering `reloadable_whoami` now.
    pub async fn whoami(&self) -> String {
        self.output("reloadable_whoami", json!({})).await
    }

    /// Runs `echo TEXT` through `shell` (and so through the wrapper).
    pub async fn echo(&self, text: &str) -> String {
        self.output("shell", json!({ "command": format!("echo {text}") }))
            .await
    }

    /// The plugin's log lines so far.
    pub fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits until the plugin's log has a line equal to `line`.
    pub async fn wait_for_log(&self, line: &str) {
        poll_showing(&format!("a line {line:?} in the plugin log"), async || {
            let lines = self.log_lines();
            if lines.iter().any(|l| l == line) {
                Ok(())
            } else {
                Err(lines)
            }
        })
        .await
    }

    /// Waits until `n` jobs are running.
    pub async fn wait_for_running_jobs(&self, n: usize) {
        poll_showing(&format!("{n} jobs running"), async || {
            let jobs = self.host.service.jobs(None).await.unwrap();
            let running = jobs
                .iter()
                .filter(|j| j.status == offstage_plugin_api::types::JobStatus::Running)
                .count();
            if running >= n {
                Ok(())
            } else {
                Err(jobs)
            }
        })
        .await
    }

    /// A tool call request in a new session, for spawning.
    pub async fn spawn_call(
        &self,
        tool: &str,
        input: Value,
    ) -> tokio::task::JoinHandle<offstage::Result<ToolResult>> {
        let session = self.host.session().await;
        let service = self.host.service.clone();
        let tool = tool.to_string();
        tokio::spawn(async move {
            tokio::time::timeout(
                PATIENCE,
                service.call_tool(&session, ToolRequest::new(&tool, input)),
            )
            .await
            .expect("a call did not answer: deadlock?")
        })
    }
}

/// `variant=V loads=N`.
pub fn stamp(variant: Variant, loads: u64) -> String {
    format!("variant={} loads={loads}", variant.name())
}

/// What `shell` printing `output` answers through the wrapper of
/// `variant` at `loads`.
pub fn wrapped(output: &str, variant: Variant, loads: u64) -> String {
    format!("[wrapped by {}]\n{output}", stamp(variant, loads))
}

/// A file that does not exist yet, for `wait_for` gates.
pub fn gate(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}
