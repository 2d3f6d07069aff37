//! A real `offstage serve` with the `hostile` test plugin isolated, and
//! what that plugin's `try` tool answers (see
//! `tests/plugins/hostile/src/lib.rs`).

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::{install_plugin, server::Server, wait::eventually};

/// A host serving `hostile` in a process of its own.
pub struct HostileServer {
    /// The host.
    pub server: Server,
    /// The host's data dir.
    pub data_dir: PathBuf,
    tool: String,
    _dir: tempfile::TempDir,
}

impl HostileServer {
    /// Starts a host whose `[plugin.hostile]` table is `isolation =
    /// "process"` plus `table` (more TOML lines), with `env` added to the
    /// host's environment.
    pub fn start(table: &str, env: &[(&str, &str)]) -> HostileServer {
        let dir = tempfile::tempdir().unwrap();
        install_plugin("offstage-test-hostile", &dir.path().join("plugins"));
        let data_dir = dir.path().join("data");
        let config = crate::server::write_file(
            dir.path(),
            "offstage.toml",
            &format!(
                "plugin_dirs = [\"plugins\"]\n\n[plugin.hostile]\nisolation = \"process\"\n{table}\n"
            ),
        );
        let server =
            Server::start_on_with_env(&data_dir, &["--config", config.to_str().unwrap()], env);
        let session = server.expect("POST", "/api/session", None, 201);
        let tool = format!("/api/session/{}/tool", session["id"].as_str().unwrap());
        let hostile = HostileServer {
            server,
            data_dir,
            tool,
            _dir: dir,
        };
        hostile.pid();
        hostile
    }

    /// The plugin's record in `GET /api/plugin`, once it is loaded.
    pub fn plugin(&self) -> Value {
        let list = self.server.plugins_until("hostile loaded", |list| {
            list.as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "hostile" && p["status"] == "loaded")
        });
        list.as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "hostile")
            .unwrap()
            .clone()
    }

    /// The server, and the temp dir its data dir is in (removed when it
    /// drops): to stop the server and look at its files after.
    pub fn into_parts(self) -> (Server, tempfile::TempDir) {
        (self.server, self._dir)
    }

    /// The pid of the plugin's process.
    pub fn pid(&self) -> u32 {
        self.plugin()["pid"]
            .as_u64()
            .expect("an isolated plugin has a pid") as u32
    }

    /// Runs `try` with `input`: `Ok(output)` when the attempt worked,
    /// `Err(output)` when it was refused.
    pub fn attempt(&self, input: Value) -> Result<String, String> {
        let call = json!({ "tool": "try", "input": input });
        let result = self.server.expect("POST", &self.tool, Some(&call), 200);
        let output = result["output"].as_str().unwrap_or_default().to_string();
        match result["status"].as_str() {
            Some("completed") => Ok(output),
            _ => Err(output),
        }
    }

    /// `try` `what` on `path`.
    pub fn on(&self, what: &str, path: &Path) -> Result<String, String> {
        self.attempt(json!({ "what": what, "path": path }))
    }

    /// The plugin's data dir.
    pub fn plugin_data(&self) -> PathBuf {
        self.data_dir.join("plugin-data/hostile")
    }

    /// Waits until the plugin runs in a process other than `old`.
    pub fn restarted(&self, old: u32) -> u32 {
        eventually("hostile in a new process", || {
            let pid = self.plugin()["pid"].as_u64()? as u32;
            (pid != old).then_some(pid)
        })
    }
}

/// Whether this process runs as root (some attempts need it to succeed
/// without the confinement, and some confinements are for root's powers).
pub fn is_root() -> bool {
    // SAFETY: no arguments, no memory; it cannot fail.
    unsafe { libc::geteuid() == 0 }
}
