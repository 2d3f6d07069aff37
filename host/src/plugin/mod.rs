//! Native plugins: finding, loading and keeping track of them.
//!
//! A plugin is a `cdylib` built against `offstage-plugin-api`. At start-up
//! the host loads every file with the platform's library suffix from each
//! configured plugin directory ([`PluginHost::load_all`]). Loading one file
//! (`loader.rs` does the abi_stable part) goes:
//!
//! 1. **Permissions.** The file and its directory must not be writable by
//!    group or other users: a plugin runs with the host's privileges, so such
//!    a file lets other users run code as us. Refused like ssh refuses keys,
//!    unless [`PluginHostConfig::allow_insecure_permissions`] is set.
//! 2. **Format.** The bytes must be a complete shared library (`file.rs`):
//!    clear causes for text files and truncated builds, and no `SIGBUS` from
//!    mapping a segment past the end of a file.
//! 3. **Private copy.** The bytes are written to a unique path under
//!    `<data_dir>/plugins/` and that copy is opened: abi_stable never unloads
//!    a library and reopening a path can return the image already mapped,
//!    so every load needs a path of its own (hot reload relies on it).
//! 4. **Root module and manifest**, checked by abi_stable: its ABI header,
//!    the API's major version, the frozen root module's layout.
//! 5. **Refusals by policy**: `panic = "abort"` builds (their panics cannot be
//!    contained), disabled plugins (listed as `unloaded`), duplicate names.
//! 6. **`init`** with a host handle for the new generation (from
//!    `adapter.rs`), its granted capabilities and its options. The plugin
//!    checks the host vtable's layout itself; a mismatch comes back as a
//!    layout error naming both types.
//!
//! 7. **Commit.** What `init` registered was staged in the generation's
//!    context; only now does it reach the tool and agent registries and
//!    start its subscriptions, so a failed `init` leaves nothing behind.
//!
//! Every failure is one [`LoadError`] — one line naming the file and the
//! cause — logged at `warn`, published as a `plugin.failed` event and kept
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

mod abi;
mod adapter;
mod error;
mod file;
mod loader;
pub mod watch;

use crate::util::LockExt;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    panic::{catch_unwind, AssertUnwindSafe},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, Weak,
    },
};

use abi_stable::std_types::{ROption, RResult};
use offstage_plugin_api::abi::{PluginInstance, PluginModuleRef};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::runtime::Handle;

pub use error::LoadError;

use crate::{session::SessionService, tool::Owner};
use loader::ManifestInfo;

/// How the host config treats one plugin (its `[plugin.NAME]` table).
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSettings {
    /// `false` skips the plugin; it is listed as `unloaded`.
    pub enabled: bool,
    /// Capabilities granted. `None` grants everything the manifest asks for;
    /// a list grants at most those.
    pub grant: Option<Vec<String>>,
    /// The plugin's options (the table's other keys), a JSON object.
    pub options: Value,
}

impl Default for PluginSettings {
    fn default() -> Self {
        PluginSettings {
            enabled: true,
            grant: None,
            options: Value::Null,
        }
    }
}

/// Where plugins come from and how they are treated.
#[derive(Debug, Clone, Default)]
pub struct PluginHostConfig {
    /// Directories searched by [`PluginHost::load_all`].
    pub dirs: Vec<PathBuf>,
    /// The host's data dir; private copies of loaded libraries go to
    /// `<data_dir>/plugins/`.
    pub data_dir: PathBuf,
    /// Load plugin files (or dirs) writable by other users. For development.
    pub allow_insecure_permissions: bool,
    /// Per-plugin settings by plugin name.
    pub settings: BTreeMap<String, PluginSettings>,
}

/// Where a plugin is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = Plugin)]
pub struct PluginInfo {
    /// The manifest's name; for a file refused before its manifest was read,
    /// the file's stem.
    pub name: String,
    pub version: String,
    /// The plugin file as found in the plugin dir (not the private copy).
    #[schema(value_type = String)]
    pub path: PathBuf,
    /// 1 for the first `init` of a name, 0 when `init` was never reached.
    pub generation: u64,
    pub status: PluginStatus,
    /// Why it failed: the one-line [`LoadError`] or the panic message.
    pub error: Option<String>,
    /// Capabilities granted (requested ∩ config's grant list).
    pub capabilities: Vec<String>,
    pub description: String,
    /// The `offstage-plugin-api` version it was built against.
    pub api_version: String,
}

/// Loads plugins and keeps track of them. Cheap to clone.
#[derive(Clone)]
pub struct PluginHost {
    inner: Arc<Inner>,
}

struct Inner {
    service: SessionService,
    config: PluginHostConfig,
    state: Mutex<State>,
    /// Loads run one at a time, so a duplicate-name check and the insert
    /// that follows it cannot interleave with another load. Never held by
    /// anything a plugin can call back into.
    loading: Mutex<()>,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    /// Last generation handed out per plugin name.
    generations: HashMap<String, u64>,
    /// Generations replaced by a reload whose calls are still running,
    /// by (name, generation); shut down when drained or at host shutdown.
    draining: HashMap<(String, u64), Live>,
}

struct Entry {
    info: PluginInfo,
    live: Option<Live>,
}

/// A plugin generation that has been initialised: what `shutdown` needs.
struct Live {
    instance: PluginInstance,
    owner: Owner,
    ctx: Arc<adapter::PluginCtx>,
}

impl Live {
    /// Retires the generation and calls its `shutdown`, then frees it. A
    /// generation that panicked is not trusted to shut down and is left
    /// as it is (see [`PluginHost::mark_failed`]).
    fn finish(self, name: &str, subscriptions: adapter::Subscriptions) {
        let generation = match &self.owner {
            Owner::Plugin { generation, .. } => *generation,
            Owner::Host => 0,
        };
        adapter::retire(&self.ctx, subscriptions);
        if self.ctx.has_failed() {
            return;
        }
        let instance = &self.instance;
        let shutdown = catch_unwind(AssertUnwindSafe(|| {
            if let RResult::RErr(e) = (instance.shutdown)(instance.state) {
                tracing::warn!(plugin = %name, generation, "plugin shutdown failed: {}", error::one_line(&e.message));
            }
            (instance.drop)(instance.state);
        }));
        if shutdown.is_err() {
            tracing::warn!(plugin = %name, generation, "plugin shutdown panicked");
        }
        tracing::info!(plugin = %name, generation, "plugin generation shut down");
    }
}

/// What was learnt about a file before `init`: enough to start it.
struct Opened {
    runtime: Handle,
    module: PluginModuleRef,
    manifest: ManifestInfo,
    settings: PluginSettings,
}

/// After this long, a replaced generation still draining is logged.
const DRAIN_NOTICE: std::time::Duration = std::time::Duration::from_secs(10);

/// Distinguishes private copies made by this process.
static COPY_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A load that failed, with what was learnt before it did.
struct Failure {
    error: LoadError,
    manifest: Option<Box<ManifestInfo>>,
    generation: u64,
}

impl From<LoadError> for Failure {
    fn from(error: LoadError) -> Self {
        Failure {
            error,
            manifest: None,
            generation: 0,
        }
    }
}

impl PluginHost {
    /// A plugin host for `service`. Loads nothing yet.
    pub fn new(service: SessionService, config: PluginHostConfig) -> Self {
        PluginHost {
            inner: Arc::new(Inner {
                service,
                config,
                state: Mutex::new(State::default()),
                loading: Mutex::new(()),
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

    /// Every plugin the host knows: loaded, failed and unloaded.
    pub fn list(&self) -> Vec<PluginInfo> {
        self.inner
            .state
            .lock_unpoisoned()
            .entries
            .iter()
            .map(|e| e.info.clone())
            .collect()
    }

    /// The plugin called `name`: the loaded one if there is one, else the
    /// latest attempt.
    pub fn get(&self, name: &str) -> Option<PluginInfo> {
        let state = self.inner.state.lock_unpoisoned();
        let mut named = state.entries.iter().filter(|e| e.info.name == name);
        named
            .clone()
            .find(|e| e.info.status == PluginStatus::Loaded)
            .or_else(|| named.next_back())
            .map(|e| e.info.clone())
    }

    /// Retires every loaded plugin: removes its tools and agents, calls its
    /// `shutdown`, frees its state, and lists it as `unloaded`. Generations
    /// a reload replaced and that are still draining are shut down too,
    /// without waiting further. Safe to call twice.
    pub fn shutdown(&self) {
        let _serial = self.inner.loading.lock_unpoisoned();
        let retiring: Vec<(String, Live)> = {
            let mut state = self.inner.state.lock_unpoisoned();
            let mut retiring: Vec<(String, Live)> = state
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
            live.finish(&name, adapter::Subscriptions::Abort);
        }
    }

    /// Loads `path` again as a new generation of the plugin called `name`
    /// and swaps it in (see the module docs, "Hot reload"). Calls already
    /// running finish on the old generation, whose `shutdown` runs once
    /// they have. Must run inside a multi-thread tokio runtime, and may
    /// block (file checks, `dlopen`, the plugin's `init`): from async code,
    /// call it through `spawn_blocking`.
    ///
    /// On failure the old generation keeps serving and its [`PluginInfo`]
    /// shows the error until a reload succeeds. A plugin known only as a
    /// failed or disabled attempt is loaded afresh from its file.
    pub fn reload(&self, name: &str) -> Result<PluginInfo, LoadError> {
        let _serial = self.inner.loading.lock_unpoisoned();
        let current = {
            let state = self.inner.state.lock_unpoisoned();
            let mut named = state.entries.iter().filter(|e| e.info.name == name);
            match named.clone().find(|e| e.live.is_some()) {
                Some(entry) => {
                    let live = entry.live.as_ref().expect("found by live");
                    Some((
                        entry.info.path.clone(),
                        entry.info.generation,
                        Some((
                            Arc::clone(&live.ctx),
                            live.instance.state,
                            live.instance.export_state,
                        )),
                    ))
                }
                None => named
                    .next_back()
                    .map(|e| (e.info.path.clone(), e.info.generation, None)),
            }
        };
        let Some((path, generation, old)) = current else {
            return Err(LoadError::Unknown {
                name: name.to_string(),
            });
        };
        let Some((old_ctx, state, export_state)) = old else {
            let (info, result) = self.load_recorded_serial(&path);
            return result.map(|()| info);
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let opened = self.open(&path)?;
            if opened.manifest.name != name {
                return Err(Failure::from(LoadError::NameChanged {
                    path: path.clone(),
                    expected: name.to_string(),
                    found: opened.manifest.name.clone(),
                }));
            }
            let previous_state = match catch_unwind(AssertUnwindSafe(|| export_state(state))) {
                Ok(RResult::ROk(ROption::RSome(json))) => Some(json.into_string()),
                Ok(RResult::ROk(ROption::RNone)) => None,
                Ok(RResult::RErr(e)) => {
                    tracing::warn!(plugin = %name, generation, "export_state failed, the new generation starts without state: {}", error::one_line(&e.message));
                    None
                }
                Err(_) => {
                    tracing::warn!(plugin = %name, generation, "export_state panicked, the new generation starts without state");
                    None
                }
            };
            self.start(&path, opened, previous_state, Some(&old_ctx))
        }))
        .unwrap_or_else(|payload| Err(loader_panicked(&path, payload.as_ref()).into()));
        match outcome {
            Ok((info, live)) => {
                let old = {
                    let mut state = self.inner.state.lock_unpoisoned();
                    let entry = state.entries.iter_mut().find(|e| {
                        e.live
                            .as_ref()
                            .is_some_and(|l| Arc::ptr_eq(&l.ctx, &old_ctx))
                    });
                    match entry {
                        Some(entry) => {
                            entry.info = info.clone();
                            entry.live.replace(live)
                        }
                        None => {
                            // Cannot happen while `loading` is held (only
                            // loads, reloads and shutdown replace entries).
                            state.entries.push(Entry {
                                info: info.clone(),
                                live: Some(live),
                            });
                            None
                        }
                    }
                };
                if let Some(old) = old {
                    // Nothing of the old generation is registered any more
                    // (the commit replaced or removed it); this stops its
                    // subscriptions after the event in hand.
                    adapter::retire(&old.ctx, adapter::Subscriptions::Finish);
                    self.drain(name, generation, old);
                }
                tracing::info!(
                    plugin = %name,
                    version = %info.version,
                    generation = info.generation,
                    previous = generation,
                    path = %path.display(),
                    "plugin reloaded"
                );
                self.inner
                    .service
                    .events()
                    .publish("plugin.reloaded", json!(info));
                Ok(self.get_generation(name, info.generation).unwrap_or(info))
            }
            Err(failure) => {
                let message = failure.error.to_string();
                tracing::warn!(
                    plugin = %name,
                    generation,
                    "reload failed, generation {generation} keeps serving: {message}"
                );
                let info = {
                    let mut state = self.inner.state.lock_unpoisoned();
                    let entry = state.entries.iter_mut().find(|e| {
                        e.live
                            .as_ref()
                            .is_some_and(|l| Arc::ptr_eq(&l.ctx, &old_ctx))
                    });
                    entry.map(|entry| {
                        entry.info.error = Some(message);
                        entry.info.clone()
                    })
                };
                if let Some(info) = info {
                    let mut properties = json!(info);
                    if failure.generation > 0 {
                        properties["failed_generation"] = json!(failure.generation);
                    }
                    self.inner
                        .service
                        .events()
                        .publish("plugin.failed", properties);
                }
                Err(failure.error)
            }
        }
    }

    /// Loads `path` if no plugin came from it yet, else reloads the plugin
    /// that did: what `offstage dev` does when a file in a plugin dir
    /// changes.
    pub fn load_or_reload(&self, path: &Path) -> Result<PluginInfo, LoadError> {
        let canonical = std::fs::canonicalize(path).ok();
        let same_file = |known: &Path| {
            known == path || canonical.is_some() && std::fs::canonicalize(known).ok() == canonical
        };
        let name = self
            .inner
            .state
            .lock_unpoisoned()
            .entries
            .iter()
            .find(|e| e.live.is_some() && same_file(&e.info.path))
            .map(|e| e.info.name.clone());
        match name {
            Some(name) => self.reload(&name),
            None => self.load_file(path),
        }
    }

    /// Waits (on the runtime, not here) until the replaced generation
    /// `old` has no call running, then shuts it down.
    fn drain(&self, name: &str, generation: u64, old: Live) {
        let key = (name.to_string(), generation);
        let ctx = Arc::clone(&old.ctx);
        self.inner
            .state
            .lock_unpoisoned()
            .draining
            .insert(key.clone(), old);
        let host = Arc::downgrade(&self.inner);
        ctx.runtime().clone().spawn(async move {
            let drained = ctx.drained();
            let mut drained = std::pin::pin!(drained);
            if tokio::time::timeout(DRAIN_NOTICE, drained.as_mut())
                .await
                .is_err()
            {
                tracing::info!(
                    plugin = %key.0,
                    generation = key.1,
                    "replaced generation still has calls running; it shuts down when they end"
                );
                drained.await;
            }
            let Some(inner) = Weak::upgrade(&host) else {
                return;
            };
            // Gone if the host shut it down meanwhile.
            let Some(live) = inner.state.lock_unpoisoned().draining.remove(&key) else {
                return;
            };
            tracing::debug!(plugin = %key.0, generation = key.1, "replaced generation drained");
            let _ = tokio::task::spawn_blocking(move || {
                live.finish(&key.0, adapter::Subscriptions::Finish)
            })
            .await;
        });
    }

    /// Loads `path` and records the outcome; the info is the recorded one.
    fn load_recorded(&self, path: &Path) -> (PluginInfo, Result<(), LoadError>) {
        let _serial = self.inner.loading.lock_unpoisoned();
        self.load_recorded_serial(path)
    }

    /// [`load_recorded`](Self::load_recorded) with `loading` held.
    fn load_recorded_serial(&self, path: &Path) -> (PluginInfo, Result<(), LoadError>) {
        let outcome = catch_unwind(AssertUnwindSafe(|| self.load(path)))
            .unwrap_or_else(|payload| Err(loader_panicked(path, payload.as_ref()).into()));
        match outcome {
            Ok((info, live)) => {
                self.record(info.clone(), live);
                match info.status {
                    PluginStatus::Unloaded => {
                        tracing::info!(plugin = %info.name, path = %path.display(), "plugin disabled by config")
                    }
                    _ => {
                        tracing::info!(
                            plugin = %info.name,
                            version = %info.version,
                            generation = info.generation,
                            path = %path.display(),
                            "plugin loaded"
                        );
                        self.inner
                            .service
                            .events()
                            .publish("plugin.loaded", json!(info));
                    }
                }
                // A hook may have panicked between `init` and `record`.
                let info = self
                    .get_generation(&info.name, info.generation)
                    .unwrap_or(info);
                (info, Ok(()))
            }
            Err(failure) => {
                let info = failed_info(path, &failure);
                tracing::warn!("{}", failure.error);
                self.record(info.clone(), None);
                self.inner
                    .service
                    .events()
                    .publish("plugin.failed", json!(info));
                (info, Err(failure.error))
            }
        }
    }

    fn get_generation(&self, name: &str, generation: u64) -> Option<PluginInfo> {
        self.inner
            .state
            .lock_unpoisoned()
            .entries
            .iter()
            .find(|e| e.info.name == name && e.info.generation == generation)
            .map(|e| e.info.clone())
    }

    /// Adds an entry, replacing an earlier failed or unloaded attempt at the
    /// same file so that repeated loads do not pile up.
    fn record(&self, info: PluginInfo, live: Option<Live>) {
        let mut state = self.inner.state.lock_unpoisoned();
        state
            .entries
            .retain(|e| !(e.info.path == info.path && e.info.status != PluginStatus::Loaded));
        state.entries.push(Entry { info, live });
    }

    /// Marks generation `generation` of `name` failed, if it is loaded. Its
    /// instance is neither shut down nor freed: a plugin that panicked is not
    /// trusted to shut down cleanly, and the adapter has already unhooked it.
    fn mark_failed(&self, name: &str, generation: u64, message: &str) {
        let info = {
            let mut state = self.inner.state.lock_unpoisoned();
            let Some(entry) = state.entries.iter_mut().find(|e| {
                e.info.name == name
                    && e.info.generation == generation
                    && e.info.status == PluginStatus::Loaded
            }) else {
                return;
            };
            entry.info.status = PluginStatus::Failed;
            entry.info.error = Some(error::one_line(message));
            entry.info.clone()
        };
        tracing::warn!(plugin = %name, generation, "plugin failed: {}", error::one_line(message));
        self.inner
            .service
            .events()
            .publish("plugin.failed", json!(info));
    }

    fn load(&self, path: &Path) -> Result<(PluginInfo, Option<Live>), Failure> {
        let opened = self.open(path)?;
        let manifest = &opened.manifest;
        if !opened.settings.enabled {
            let info = info_from(path, manifest, 0, PluginStatus::Unloaded, Vec::new());
            return Ok((info, None));
        }
        let duplicate = self
            .inner
            .state
            .lock_unpoisoned()
            .entries
            .iter()
            .find(|e| e.info.name == manifest.name && e.info.status == PluginStatus::Loaded)
            .map(|e| e.info.path.clone());
        if let Some(other) = duplicate {
            return Err(Failure {
                error: LoadError::DuplicateName {
                    path: path.to_path_buf(),
                    name: manifest.name.clone(),
                    other,
                },
                manifest: Some(Box::new(manifest.clone())),
                generation: 0,
            });
        }
        let (info, live) = self.start(path, opened, None, None)?;
        Ok((info, Some(live)))
    }

    /// Steps 1–5 of a load: permissions, format, private copy, root module
    /// and manifest, `panic = "abort"`.
    fn open(&self, path: &Path) -> Result<Opened, Failure> {
        let config = &self.inner.config;
        let runtime = Handle::try_current().map_err(|_| LoadError::Host {
            path: path.to_path_buf(),
            message: "plugins must be loaded inside a tokio runtime".into(),
        })?;
        if !config.allow_insecure_permissions {
            file::check_permissions(path)?;
        }
        let io = |e: std::io::Error| LoadError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let bytes = std::fs::read(path).map_err(io)?;
        file::check_format(path, &bytes)?;
        let copy = private_copy(&config.data_dir, path, &bytes).map_err(io)?;
        let opened = loader::open(path, &copy);
        // The mapping stays valid after the copy is gone; removing it keeps
        // the data dir from growing with every start. (Windows cannot remove
        // a loaded library; there the copy stays.)
        if cfg!(unix) || opened.is_err() {
            let _ = std::fs::remove_file(&copy);
        }
        let module = opened?;
        let manifest = loader::manifest(path, module)?;
        if manifest.panic_abort {
            return Err(Failure {
                error: LoadError::PanicAbort {
                    path: path.to_path_buf(),
                    name: manifest.name.clone(),
                },
                manifest: Some(Box::new(manifest)),
                generation: 0,
            });
        }
        let settings = config
            .settings
            .get(&manifest.name)
            .cloned()
            .unwrap_or_default();
        Ok(Opened {
            runtime,
            module,
            manifest,
            settings,
        })
    }

    /// Steps 6–7: `init` as a new generation (handing it `previous_state`),
    /// then commits its registrations in place of `previous`'s. On failure
    /// nothing it registered took effect.
    fn start(
        &self,
        path: &Path,
        opened: Opened,
        previous_state: Option<String>,
        previous: Option<&Arc<adapter::PluginCtx>>,
    ) -> Result<(PluginInfo, Live), Failure> {
        let Opened {
            runtime,
            module,
            manifest,
            settings,
        } = opened;
        let grants = granted(&manifest.capabilities, settings.grant.as_deref());
        let options = match settings.options {
            Value::Object(map) => Value::Object(map),
            _ => json!({}),
        };
        let generation = {
            let mut state = self.inner.state.lock_unpoisoned();
            let last = state.generations.entry(manifest.name.clone()).or_insert(0);
            *last += 1;
            *last
        };
        let failure = |error: LoadError| Failure {
            error,
            manifest: Some(Box::new(manifest.clone())),
            generation,
        };
        let owner = Owner::Plugin {
            name: manifest.name.clone(),
            generation,
        };
        let ctx = adapter::new_ctx(
            self.inner.service.clone(),
            runtime.clone(),
            owner.clone(),
            grants.clone(),
            options,
            previous_state,
            self.failure_callback(&manifest.name, generation),
        );
        let handle = adapter::host_handle(&ctx);
        let initialised = {
            let _runtime = runtime.enter();
            loader::init(path, &manifest.name, module, handle)
        };
        let instance = match initialised {
            Ok(instance) => instance,
            Err(error) => {
                // Whatever it staged is dropped; nothing was registered.
                adapter::retire(&ctx, adapter::Subscriptions::Abort);
                return Err(failure(error));
            }
        };
        let live = Live {
            instance,
            owner,
            ctx,
        };
        if let Err(error) = adapter::commit(&live.ctx, previous.map(|p| &**p)) {
            live.finish(&manifest.name, adapter::Subscriptions::Abort);
            return Err(failure(LoadError::Host {
                path: path.to_path_buf(),
                message: format!("cannot register what the plugin added: {error}"),
            }));
        }
        let info = info_from(
            path,
            &manifest,
            generation,
            PluginStatus::Loaded,
            grants.into_iter().collect(),
        );
        Ok((info, live))
    }

    /// What the adapter calls when a hook or future of this generation
    /// panics. Holds the host weakly: the host owns the generation's context,
    /// which owns this callback.
    fn failure_callback(&self, name: &str, generation: u64) -> Arc<dyn Fn(String) + Send + Sync> {
        let host = Arc::downgrade(&self.inner);
        let name = name.to_string();
        Arc::new(move |message: String| {
            if let Some(inner) = Weak::upgrade(&host) {
                PluginHost { inner }.mark_failed(&name, generation, &message);
            }
        })
    }
}

/// The one-line error for a panic that escaped the loader itself.
fn loader_panicked(path: &Path, payload: &(dyn std::any::Any + Send)) -> LoadError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    LoadError::Host {
        path: path.to_path_buf(),
        message: format!("the loader panicked: {message}"),
    }
}

/// Plugin files in `dir`: regular files (or links to them) with the
/// platform's library suffix, sorted by name.
fn plugin_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let is_library = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(std::env::consts::DLL_SUFFIX));
        if is_library && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Writes `bytes` to `<data_dir>/plugins/<stem>-<n>-<pid>.<ext>`, a path no
/// earlier load in any process has used (`create_new` makes sure).
fn private_copy(data_dir: &Path, source: &Path, bytes: &[u8]) -> std::io::Result<PathBuf> {
    use std::io::Write;

    let dir = data_dir.join("plugins");
    std::fs::create_dir_all(&dir)?;
    let stem = file_stem(source);
    loop {
        let n = COPY_SEQUENCE.fetch_add(1, Ordering::Relaxed) + 1;
        let copy = dir.join(format!(
            "{stem}-{n}-{}.{}",
            std::process::id(),
            std::env::consts::DLL_EXTENSION
        ));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o700);
        match options.open(&copy) {
            Ok(mut file) => {
                // No fsync: the copy is scratch, opened at once through the
                // page cache and remade on every load, so a crash loses
                // nothing it holds. Syncing cost a third of load time.
                file.write_all(bytes)?;
                return Ok(copy);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `libfoo_bar.so` → `foo_bar`.
fn file_stem(path: &Path) -> String {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("plugin");
    let name = name
        .strip_suffix(std::env::consts::DLL_SUFFIX)
        .unwrap_or(name);
    let name = name
        .strip_prefix(std::env::consts::DLL_PREFIX)
        .unwrap_or(name);
    if name.is_empty() {
        "plugin".to_string()
    } else {
        name.to_string()
    }
}

/// Requested ∩ granted; everything requested when the config lists nothing.
fn granted(requested: &[String], grant: Option<&[String]>) -> BTreeSet<String> {
    requested
        .iter()
        .filter(|c| grant.is_none_or(|g| g.contains(c)))
        .cloned()
        .collect()
}

fn info_from(
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
    }
}

fn failed_info(path: &Path, failure: &Failure) -> PluginInfo {
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
        },
    };
    info.error = Some(failure.error.to_string());
    info
}

/// Loads one plugin file in isolation, as `offstage plugin check FILE` does:
/// the full load including `init`, against a fresh session service in a
/// temporary data dir, then shuts it down. Uses the current tokio runtime if
/// there is one, else starts its own. Insecure permissions are refused.
pub fn check_file(path: &Path) -> Result<PluginInfo, LoadError> {
    check_file_with(path, false)
}

/// [`check_file`], optionally allowing files writable by other users.
pub fn check_file_with(
    path: &Path,
    allow_insecure_permissions: bool,
) -> Result<PluginInfo, LoadError> {
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
        let host = PluginHost::new(
            service,
            PluginHostConfig {
                dirs: Vec::new(),
                data_dir: temp.path().to_path_buf(),
                allow_insecure_permissions,
                settings: BTreeMap::new(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_the_intersection() {
        let requested = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            granted(&requested, None),
            BTreeSet::from(["a".into(), "b".into()])
        );
        assert_eq!(
            granted(&requested, Some(&["b".to_string(), "c".to_string()])),
            BTreeSet::from(["b".into()])
        );
        assert!(granted(&requested, Some(&[])).is_empty());
    }

    #[test]
    fn stems_drop_prefix_and_suffix() {
        let name = format!(
            "{}offstage_test_hello{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        );
        assert_eq!(file_stem(Path::new(&name)), "offstage_test_hello");
    }
}
