//! Set-up for the example-plugin tests: a session service plus a plugin
//! host that loads real builds of the plugins under `plugins/`.

use std::{collections::BTreeMap, path::PathBuf};

use offstage::{Event, Isolation, PluginHost, PluginSettings, PluginStatus, SessionService};
use offstage_plugin_api::types::{Message, Role};
use serde_json::Value;
use tokio::sync::broadcast;

pub use crate::wait::{poll, PATIENCE};

/// A host with some example plugins loaded, in its own temp dir.
pub struct Host {
    /// The service the plugins call.
    pub service: SessionService,
    /// The plugin host.
    pub plugins: PluginHost,
    /// Data and plugin dirs, removed on drop.
    pub dir: tempfile::TempDir,
    /// Subscribed before any plugin loaded, so no event is missed.
    pub events: offstage::Subscriber,
}

/// One plugin to load: cargo package, manifest name, options.
pub struct Load<'a> {
    /// The cargo package to build.
    pub package: &'a str,
    /// The plugin's name (its config table).
    pub name: &'a str,
    /// Its options, as JSON.
    pub options: Value,
}

impl Host {
    /// Builds (once per test process) and installs `plugins`, and loads
    /// them in process. Fails the test if one does not load.
    pub fn start(plugins: &[Load<'_>]) -> Host {
        Host::start_as(Isolation::None, plugins)
    }

    /// As [`start`](Self::start), the plugins run as `mode` says.
    pub fn start_as(mode: Isolation, plugins: &[Load<'_>]) -> Host {
        let host = Host::start_unchecked_as(mode, plugins);
        for info in host.plugins.list() {
            assert_eq!(
                info.status,
                PluginStatus::Loaded,
                "plugin {} not loaded: {:?}",
                info.name,
                info.error
            );
        }
        for load in plugins {
            assert!(
                host.plugins.list().iter().any(|p| p.name == load.name),
                "plugin {} not loaded",
                load.name
            );
        }
        host
    }

    /// As [`start`](Self::start), but leaves checking the result to the test.
    pub fn start_unchecked(plugins: &[Load<'_>]) -> Host {
        Host::start_unchecked_as(Isolation::None, plugins)
    }

    /// As [`start_as`](Self::start_as), but leaves checking the result to
    /// the test.
    pub fn start_unchecked_as(mode: Isolation, plugins: &[Load<'_>]) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let plugin_dir = dir.path().join("plugins");
        let mut settings = BTreeMap::new();
        for load in plugins {
            crate::install_plugin(load.package, &plugin_dir);
            settings.insert(
                load.name.to_string(),
                PluginSettings {
                    enabled: true,
                    grant: None,
                    options: load.options.clone(),
                },
            );
        }
        let data_dir = dir.path().join("data");
        std::fs::create_dir_all(&data_dir).unwrap();
        let service = crate::host::service(data_dir.clone(), vec![]);
        let events = service.events().subscribe();
        let plugins = crate::host::plugin_host(&service, plugin_dir, data_dir, settings, mode);
        plugins.load_all();
        Host {
            service,
            plugins,
            dir,
            events,
        }
    }

    /// A path inside the host's temp dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A new session with the `script` agent.
    pub async fn session(&self) -> String {
        crate::host::script_session(&self.service).await
    }

    /// Waits for the next event that `matches`.
    pub async fn wait_event(&mut self, what: &str, matches: impl Fn(&Event) -> bool) -> Event {
        let wait = async {
            loop {
                match self.events.recv().await {
                    Ok(event) if matches(&event) => return event,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(error) => panic!("event stream ended while waiting for {what}: {error}"),
                }
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    /// Waits for the notice of `job_id` in `session`.
    pub async fn wait_notice(&mut self, session: &str, job_id: &str) -> Message {
        let event = self
            .wait_event(&format!("the notice of {job_id}"), |e| {
                e.kind == "message.added"
                    && e.properties["session_id"] == session
                    && e.properties["role"] == "notice"
                    && e.properties["metadata"]["job_id"] == job_id
            })
            .await;
        serde_json::from_value(event.properties).unwrap()
    }

    /// The session's messages with `role`.
    pub async fn messages(&self, session: &str, role: Role) -> Vec<Message> {
        let all = self.service.messages(session).await.unwrap();
        all.into_iter().filter(|m| m.role == role).collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.plugins.shutdown();
    }
}
