//! Native plugins: finding, loading and keeping track of them.
//!
//! A plugin is a `cdylib` built against `offstage-plugin-api`. At start-up
//! the host loads every file with the platform's library suffix from each
//! configured plugin directory ([`PluginHost::load_all`]). Loading one file
//! (`load.rs`; `abi/library.rs` does the abi_stable part) goes:
//!
//! 1. **Permissions.** The file a path resolves to (symlinks followed),
//!    every directory above it and above the link must belong to us or
//!    root and not be writable by group or other users (sticky dirs
//!    excepted): a plugin runs with the host's privileges, so such a file
//!    lets other users run code as us. Refused like ssh refuses keys,
//!    unless [`PluginHostConfig::allow_insecure_permissions`] is set.
//! 2. **Format.** The headers must describe a complete shared library
//!    (`file.rs`, which reads only the headers): clear causes for text
//!    files and truncated builds, and no `SIGBUS` from mapping a segment
//!    past the end of a file.
//! 3. **Private copy.** The file is streamed (never held in memory) to a
//!    unique path under `<data_dir>/plugins/` and that copy is opened:
//!    abi_stable never unloads a library and reopening a path can return
//!    the image already mapped, so every load needs a path of its own (hot
//!    reload relies on it). A file with the same bytes as a plugin loaded
//!    from another file is refused as a duplicate here, before it is
//!    mapped for good.
//! 4. **Root module and manifest**, checked by abi_stable: its ABI header,
//!    the API's major version, the frozen root module's layout.
//! 5. **Refusals by policy**: `panic = "abort"` builds (their panics cannot be
//!    contained), capability names the host does not know (in the manifest
//!    or the config's `grant`), disabled plugins (listed as `unloaded`),
//!    duplicate names.
//! 6. **`init`** with a host handle for the new generation (from
//!    `abi/`), its granted capabilities and its options. The plugin
//!    checks the host vtable's layout itself; a mismatch comes back as a
//!    layout error naming both types.
//!
//! 7. **Commit.** What `init` registered was staged in the generation's
//!    context; only now does it reach the tool and agent registries and
//!    start its subscriptions, so a failed `init` leaves nothing behind:
//!    tasks it spawned are aborted and calls it makes later refused.
//!
//! Every failure is one [`LoadError`] — one line naming the file and the
//! cause — logged once at `warn`, published as a `plugin.failed` event and kept
//! in [`PluginHost::list`] with status `failed`. One plugin's failure never
//! stops the others, and a plugin that panics later (in a hook or a future)
//! is marked failed by the adapter's failure callback while the host goes on.
//!
//! ## Hot reload ([`PluginHost::reload`])
//!
//! abi_stable never unloads a library, so a reload loads the file again as
//! a new *generation* beside the old one (its own private copy, so its own
//! image and statics) and swaps:
//!
//! 1. steps 1–5 above for the file the plugin came from; the manifest must
//!    name the same plugin;
//! 2. the old generation's `export_state()` is handed to the new one's
//!    `init` as `previous_state`;
//! 3. the new generation's staged registrations are committed in one step
//!    per registry: tools and agents replaced by name, each wrapper put in
//!    its predecessor's place (a wrapped tool never runs unwrapped), the
//!    old generation's leftovers removed. From here new calls reach the new
//!    generation;
//! 4. the old generation is retired: its subscriptions finish the event in
//!    hand and stop; calls, turns and hooks already running on it finish
//!    there (each holds the adapter it started with);
//! 5. once the last of its adapters is dropped (*drained*), its `shutdown`
//!    runs and its instance is freed. Its code stays mapped, as do tasks it
//!    spawned: those are the plugin's to end in `shutdown`.
//!
//! If any of 1–3 fails, nothing changed: the old generation keeps serving,
//! and the failure is logged, published as `plugin.failed` and shown as
//! the still-loaded plugin's `error` until a reload succeeds.
//!
//! ## Where things are
//!
//! - `config.rs`, `info.rs`: what the host config says, what the host tells.
//! - `registry.rs`: every load attempt and the generations behind them.
//! - `load.rs`: the load steps above; `reload.rs`: hot reload and drain.
//! - `generation.rs`: one generation's life (staged, committed, retired,
//!   drained).
//! - `check.rs`: `offstage plugin check`; `file.rs`: permission and format
//!   checks; `watch/`: `offstage dev`'s watcher; `error.rs`: [`LoadError`].
//! - `abi/`: the only code that touches the raw ABI, behind safe wrappers.

mod abi;
mod check;
mod config;
mod crash;
mod error;
mod file;
mod generation;
mod info;
mod isolate;
mod load;
mod registry;
mod reload;
mod section;
pub(crate) mod watch;
mod watchdog;

use std::{
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

pub use check::check_file;

/// The plugin name a library file declares (`export_plugin!(T, name =
/// "...")`), read from the file without running any of its code; `None`
/// when it declares none or cannot be read. The plugin test harness keys a
/// plugin's settings by it before loading the file.
pub fn declared_name(path: &std::path::Path) -> Option<String> {
    section::declared_name(path).ok().flatten()
}
pub(crate) use check::{check_file_with, CheckOptions};
pub use config::{PluginHostConfig, PluginSettings};
pub use crash::LastCrash;
pub(crate) use crash::{install as install_crash_report, take_last as take_last_crash};
pub use error::{LoadError, LoadStage, NameSource};
pub use info::{PluginInfo, PluginStatus};
pub(crate) use isolate::{run_child, take_isolation_keys, ChildArgs};
pub use isolate::{
    Filesystem, Isolation, IsolationConfig, IsolationSettings, Network, RestartPolicy,
};

use crate::{session::SessionService, util::LockExt};
use generation::{Generation, Subscriptions};
use load::{plugin_files, Opened};
use registry::State;

/// Loads plugins and keeps track of them. Cheap to clone.
#[derive(Clone)]
pub struct PluginHost {
    inner: Arc<Inner>,
}

struct Inner {
    service: SessionService,
    config: PluginHostConfig,
    state: Mutex<State>,
    /// Replaced generations whose `shutdown` runs now, after their drain
    /// (`reload.rs`): [`PluginHost::shutdown`] waits for them, so that the
    /// runtime is not dropped under a plugin's `shutdown`.
    finishing: AtomicUsize,
    /// Loads run one at a time, so a duplicate-name check and the insert
    /// that follows it cannot interleave with another load. Never held by
    /// anything a plugin can call back into.
    loading: Mutex<()>,
    /// Which plugins run in a child process, and how (`isolate/`).
    isolation: IsolationConfig,
    /// Restarts of isolated plugins, held to their policy.
    supervisor: isolate::Supervisor,
    /// This host is an isolated plugin's process: it opens here.
    in_child: bool,
}

impl PluginHost {
    /// A plugin host for `service`. Loads nothing yet.
    pub fn new(service: SessionService, config: PluginHostConfig) -> Self {
        Self::with_isolation(service, config, IsolationConfig::default())
    }

    /// [`new`](Self::new), with plugins run in child processes as
    /// `isolation` says (`[plugins]` and `[plugin.NAME] isolation`).
    pub fn with_isolation(
        service: SessionService,
        config: PluginHostConfig,
        isolation: IsolationConfig,
    ) -> Self {
        Self::build(service, config, isolation, false)
    }

    /// The host inside an isolated plugin's process.
    fn for_child(service: SessionService, config: PluginHostConfig) -> Self {
        Self::build(service, config, IsolationConfig::default(), true)
    }

    fn build(
        service: SessionService,
        config: PluginHostConfig,
        isolation: IsolationConfig,
        in_child: bool,
    ) -> Self {
        PluginHost {
            inner: Arc::new(Inner {
                service,
                config,
                state: Mutex::new(State::default()),
                finishing: AtomicUsize::new(0),
                loading: Mutex::new(()),
                isolation,
                supervisor: isolate::Supervisor::default(),
                in_child,
            }),
        }
    }

    /// Loads every plugin file (platform library suffix) in every plugin
    /// dir, in name order. One failure never stops the others; never panics.
    /// Must run inside a multi-thread tokio runtime: plugins get its handle.
    pub fn load_all(&self) -> Vec<PluginInfo> {
        let mut infos = Vec::new();
        for dir in &self.inner.config.dirs {
            let files = match plugin_files(dir) {
                Ok(files) => files,
                Err(e) => {
                    tracing::warn!("plugin dir {}: cannot read it: {e}", dir.display());
                    continue;
                }
            };
            for path in files {
                infos.push(self.load_recorded(&path).0);
            }
        }
        infos
    }

    /// Loads one plugin file. A disabled plugin is `Ok` with status
    /// `unloaded`. The outcome, failure included, is kept for [`list`](Self::list).
    pub fn load_file(&self, path: &Path) -> Result<PluginInfo, LoadError> {
        let (info, result) = self.load_recorded(path);
        result.map(|()| info)
    }

    /// Retires every loaded plugin: removes its tools and agents, calls its
    /// `shutdown`, frees its state, and lists it as `unloaded`. Generations
    /// a reload replaced and that are still draining are shut down too,
    /// without waiting further; one whose drain already ended and whose
    /// `shutdown` runs now is waited for (at most 10 s), so the caller
    /// may drop the runtime after. Safe to call twice.
    pub fn shutdown(&self) {
        self.inner.supervisor.stop();
        let serial = self.inner.loading.lock_unpoisoned();
        let retiring: Vec<(String, Generation)> = {
            let mut state = self.inner.state.lock_unpoisoned();
            let mut retiring: Vec<(String, Generation)> = state
                .entries
                .iter_mut()
                .filter(|e| e.info.status == PluginStatus::Loaded)
                .filter_map(|e| {
                    e.info.status = PluginStatus::Unloaded;
                    e.live.take().map(|live| (e.info.name.clone(), live))
                })
                .collect();
            retiring.extend(state.draining.drain().map(|((name, _), live)| (name, live)));
            retiring
        };
        for (name, live) in retiring {
            live.finish(&name, Subscriptions::Abort);
        }
        drop(serial);
        // A replaced generation whose drain ended just before is shutting
        // down on a blocking thread: let it finish, within bounds.
        let deadline = Instant::now() + FINISHING_PATIENCE;
        while self.inner.finishing.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// How long [`PluginHost::shutdown`] waits for replaced generations already
/// shutting down.
const FINISHING_PATIENCE: Duration = Duration::from_secs(10);

/// Counts one replaced generation shutting down, until dropped.
pub(crate) struct Finishing(Arc<Inner>);

impl Finishing {
    fn start(inner: &Arc<Inner>) -> Finishing {
        inner.finishing.fetch_add(1, Ordering::AcqRel);
        Finishing(Arc::clone(inner))
    }
}

impl Drop for Finishing {
    fn drop(&mut self) {
        self.0.finishing.fetch_sub(1, Ordering::AcqRel);
    }
}
