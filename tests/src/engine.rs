//! Set-up for the `engine` tests: a service in a temporary data dir, shell
//! commands to drive it, and checks on real processes through `/proc`.
//! `use offstage_tests::engine::*` brings the bounded waits along.

use std::path::{Path, PathBuf};

use offstage::{PluginHost, PluginHostConfig, PluginSettings, PluginStatus, Rule, SessionService};
use offstage_plugin_api::types::{Event, Job, JobStatus, Message, Role, ToolRequest, ToolResult};
use serde_json::{json, Value};
use tokio::{sync::broadcast, task::JoinHandle};

use crate::wait::eventually;

pub use crate::{
    proc::pid_alive,
    wait::{poll, within, PATIENCE},
};

/// A service with its data in a temporary directory that lives as long as
/// the value.
pub struct Engine {
    /// The service under test.
    pub service: SessionService,
    /// Its data dir, removed on drop.
    pub dir: tempfile::TempDir,
}

impl Default for Engine {
    fn default() -> Self {
        Self::new()
    }
}

impl Engine {
    /// A service that allows every call.
    pub fn new() -> Self {
        Self::with_rules(Vec::new())
    }

    /// A service with these permission rules.
    pub fn with_rules(permissions: Vec<Rule>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let service = crate::host::service(dir.path().join("data"), permissions);
        Engine { service, dir }
    }

    /// A path inside the test's temporary directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A new session running the `script` agent.
    pub async fn session(&self) -> String {
        crate::host::script_session(&self.service).await
    }

    /// A plugin host on this engine with the racer test plugin
    /// (`tests/plugins/racer`) installed and loaded with `options`, run as
    /// `mode` says; fails the test unless it loaded.
    pub fn load_racer(&self, options: Value, mode: offstage::Isolation) -> PluginHost {
        let plugin_dir = self.path("plugins");
        crate::install_plugin("offstage-test-racer", &plugin_dir);
        let mut settings = std::collections::BTreeMap::new();
        settings.insert(
            "racer".to_string(),
            PluginSettings {
                options,
                ..PluginSettings::default()
            },
        );
        let host = PluginHost::with_isolation(
            self.service.clone(),
            PluginHostConfig {
                dirs: vec![plugin_dir],
                data_dir: self.path("data"),
                allow_insecure_permissions: false,
                settings,
            },
            crate::host::isolation(mode),
        );
        let loaded = host.load_all();
        assert_eq!(loaded.len(), 1, "{loaded:#?}");
        assert_eq!(loaded[0].status, PluginStatus::Loaded, "{loaded:#?}");
        host
    }

    /// Starts a blocking `shell` call with a known job id on its own task;
    /// the handle yields what the caller got.
    pub fn spawn_shell(
        &self,
        session: &str,
        call_id: &str,
        input: Value,
    ) -> JoinHandle<offstage::Result<ToolResult>> {
        let request = ToolRequest {
            tool: "shell".into(),
            input,
            call_id: Some(call_id.into()),
        };
        self.spawn_call(session, request)
    }

    /// Starts a tool call on its own task; the handle yields its result.
    pub fn spawn_call(
        &self,
        session: &str,
        request: ToolRequest,
    ) -> JoinHandle<offstage::Result<ToolResult>> {
        let service = self.service.clone();
        let session = session.to_string();
        tokio::spawn(async move { service.call_tool(&session, request).await })
    }

    /// Waits until job `id` exists and its output file contains `text`:
    /// the command has really started and got that far.
    pub async fn wait_output(&self, id: &str, text: &str) -> String {
        let service = self.service.clone();
        let (id, text) = (id.to_string(), text.to_string());
        poll(&format!("output of {id} to contain {text:?}"), || {
            let (service, id, text) = (service.clone(), id.clone(), text.clone());
            async move {
                let data = service.job_output(&id, 0, u64::MAX).await.ok()?.data;
                data.contains(&text).then_some(data)
            }
        })
        .await
    }

    /// Waits until job `id` has ended and returns it.
    pub async fn wait_job_end(&self, id: &str) -> Job {
        let service = self.service.clone();
        let id = id.to_string();
        poll(&format!("job {id} to end"), || {
            let (service, id) = (service.clone(), id.clone());
            async move {
                let job = service.job(&id).await.ok()?;
                job.status.is_final().then_some(job)
            }
        })
        .await
    }

    /// Waits until job `id` exists and is running.
    pub async fn wait_job_running(&self, id: &str) -> Job {
        let service = self.service.clone();
        let id = id.to_string();
        poll(&format!("job {id} to run"), || {
            let (service, id) = (service.clone(), id.clone());
            async move {
                let job = service.job(&id).await.ok()?;
                (job.status == JobStatus::Running).then_some(job)
            }
        })
        .await
    }

    /// The session's notices.
    pub async fn notices(&self, session: &str) -> Vec<Message> {
        let messages = self.service.messages(session).await.unwrap();
        messages
            .into_iter()
            .filter(|m| m.role == Role::Notice)
            .collect()
    }

    /// Waits until the session has an assistant message containing `text`.
    pub async fn wait_assistant(&self, session: &str, text: &str) -> Message {
        let service = self.service.clone();
        let (session, text) = (session.to_string(), text.to_string());
        poll(&format!("an assistant reply mentioning {text:?}"), || {
            let (service, session, text) = (service.clone(), session.clone(), text.clone());
            async move {
                let messages = service.messages(&session).await.ok()?;
                messages
                    .into_iter()
                    .find(|m| m.role == Role::Assistant && m.text.contains(&text))
            }
        })
        .await
    }
}

/// The `shell` input for `command`.
pub fn shell(command: &str) -> Value {
    json!({ "command": command })
}

/// A command that prints `first`, waits for `flag` to exist, then prints
/// `second`.
pub fn gated(first: &str, flag: &Path, second: &str) -> String {
    format!(
        "echo {first}; while [ ! -e '{}' ]; do sleep 0.02; done; echo {second}",
        flag.display()
    )
}

/// Reads events until one satisfies `matches`.
pub async fn next_event(
    events: &mut offstage::Subscriber,
    what: &str,
    matches: impl Fn(&Event) -> bool,
) -> Event {
    within(what, async {
        loop {
            match events.recv().await {
                Ok(event) if matches(&event) => return event,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    panic!("event reader lagged by {n} while waiting for {what}")
                }
                Err(broadcast::error::RecvError::Closed) => panic!("event bus closed"),
            }
        }
    })
    .await
}

/// Every event already queued on `events`, without waiting.
pub fn drain(events: &mut offstage::Subscriber) -> Vec<Event> {
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    seen
}

/// Waits until `pid` is gone.
pub async fn wait_pid_gone(pid: u32) {
    poll(&pid_gone(pid), async || (!pid_alive(pid)).then_some(())).await
}

/// [`wait_pid_gone`] from a plain thread: for a test whose runtime has
/// been dropped, which is what it checks the processes outlive.
pub fn wait_pid_gone_blocking(pid: u32) {
    eventually(&pid_gone(pid), || (!pid_alive(pid)).then_some(()))
}

fn pid_gone(pid: u32) -> String {
    format!("process {pid} to be gone")
}

/// Reads a file of pids (one per line) once every line a command promised
/// has been written.
pub async fn read_pids(path: &Path, count: usize) -> Vec<u32> {
    let path = path.to_path_buf();
    poll(&format!("{count} pids in {}", path.display()), || {
        let path = path.clone();
        async move {
            let text = std::fs::read_to_string(&path).ok()?;
            let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
            (pids.len() >= count).then_some(pids)
        }
    })
    .await
}
