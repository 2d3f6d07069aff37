//! Hot reload: load a plugin's file again as a new generation, swap it in,
//! and let the old one drain (module docs of `plugin/`, "Hot reload").
//!
//! Why the steps are split as they are: everything that can fail
//! ([`open_next`](PluginHost::open_next)) happens before anything changes,
//! so a failed reload leaves the old generation serving untouched
//! ([`record_failure`](PluginHost::record_failure)); the one step that
//! changes what serves ([`swap`](PluginHost::swap)) cannot fail.
//!
//! The state handoff is exact for events: the old generation's
//! subscriptions are paused (each finishes the event in hand and lets go
//! of its queue) before `export_state` runs, the queues wait while the new
//! `init` runs, and the new generation's subscriptions take them over at
//! its commit — or the old ones get them back if the reload fails. So the
//! exported state has seen every event the old generation handled, and the
//! new one handles every event after it (ARCHITECTURE.md §SES-8).

use std::{
    panic::{catch_unwind, AssertUnwindSafe},
    path::{Path, PathBuf},
    sync::{Arc, Weak},
};

use serde_json::json;

use super::{
    abi::{Exporter, InstanceError},
    error, file,
    generation::{retire, Generation, GenerationState, Subscriptions},
    load::{loader_panicked, LoadFailure},
    registry::PluginEntry,
    LoadError, PluginHost, PluginInfo,
};
use crate::util::LockExt;

/// After this long, a replaced generation still draining is logged.
const DRAIN_NOTICE: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a reload waits for the old generation's event handlers to
/// finish the event in hand before it exports the state without them.
const EVENT_IN_HAND_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// What a reload starts from: the plugin's file and generation, and, if a
/// generation of it is loaded, that generation.
struct CurrentGeneration {
    path: PathBuf,
    generation: u64,
    loaded: Option<LoadedGeneration>,
}

/// The loaded generation a reload replaces.
struct LoadedGeneration {
    state: Arc<GenerationState>,
    exporter: Exporter,
}

impl PluginHost {
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
        let Some(current) = self.current(name) else {
            return Err(LoadError::Unknown {
                name: name.to_string(),
            });
        };
        let CurrentGeneration {
            path,
            generation,
            loaded,
        } = current;
        let Some(old) = loaded else {
            let (info, result) = self.load_recorded_serial(&path);
            return result.map(|()| info);
        };
        // From here the old generation takes no more events: what it
        // exports is exactly what it handled, and the events after it wait
        // in the queues for whichever generation serves next.
        let paused = old.state.pause_subscriptions(EVENT_IN_HAND_PATIENCE);
        match self.open_next(name, &path, generation, &old) {
            Ok((info, live)) => {
                let info = self.swap(name, &path, generation, &old.state, info, live);
                // The old subscriptions are stopped (retired in `swap`);
                // the new ones, waiting on the queues, take them now.
                drop(paused);
                Ok(info)
            }
            Err(failure) => {
                paused.resume();
                self.record_failure(name, generation, &old.state, &failure);
                Err(failure.error)
            }
        }
    }

    /// The generation of `name` to reload: the loaded one if there is one,
    /// else the latest attempt (loaded afresh).
    fn current(&self, name: &str) -> Option<CurrentGeneration> {
        let state = self.inner.state.lock_unpoisoned();
        let mut named = state.entries.iter().filter(|e| e.info.name == name);
        match named.clone().find(|e| e.live.is_some()) {
            Some(entry) => {
                let live = entry.live.as_ref().expect("found by live");
                Some(CurrentGeneration {
                    path: entry.info.path.clone(),
                    generation: entry.info.generation,
                    loaded: Some(LoadedGeneration {
                        state: Arc::clone(&live.ctx),
                        exporter: live.instance.exporter(),
                    }),
                })
            }
            None => named.next_back().map(|e| CurrentGeneration {
                path: e.info.path.clone(),
                generation: e.info.generation,
                loaded: None,
            }),
        }
    }

    /// Opens `path` as the next generation of `name`, hands it the old
    /// generation's exported state and commits its registrations in place
    /// of the old one's. Nothing changes for the old generation if this
    /// fails.
    fn open_next(
        &self,
        name: &str,
        path: &Path,
        generation: u64,
        old: &LoadedGeneration,
    ) -> Result<(PluginInfo, Generation), LoadFailure> {
        catch_unwind(AssertUnwindSafe(|| {
            let opened = self.open(path)?;
            if opened.manifest.name != name {
                return Err(LoadFailure::from(LoadError::NameChanged {
                    path: path.to_path_buf(),
                    expected: name.to_string(),
                    found: opened.manifest.name.clone(),
                }));
            }
            // Called with `loading` held: the old generation cannot be shut
            // down meanwhile, so this exports its state (an exporter of an
            // instance shut down would be refused, never run).
            let previous_state = match old.exporter.export() {
                Ok(state) => state,
                Err(InstanceError::Failed(message)) => {
                    tracing::warn!(plugin = %name, generation, "export_state failed, the new generation starts without state: {}", error::one_line(&message));
                    None
                }
                Err(InstanceError::Panicked) => {
                    tracing::warn!(plugin = %name, generation, "export_state panicked, the new generation starts without state");
                    None
                }
            };
            self.start(path, opened, previous_state, Some(&old.state))
        }))
        .unwrap_or_else(|payload| Err(loader_panicked(path, payload.as_ref()).into()))
    }

    /// Puts the new generation in the old one's entry, retires the old one
    /// and leaves it to drain. From here new calls reach the new generation.
    fn swap(
        &self,
        name: &str,
        path: &Path,
        generation: u64,
        old_state: &Arc<GenerationState>,
        mut info: PluginInfo,
        live: Generation,
    ) -> PluginInfo {
        let installed = file::Stamp::of(path);
        let old = {
            let mut state = self.inner.state.lock_unpoisoned();
            let entry = state.entries.iter_mut().find(|e| {
                e.live
                    .as_ref()
                    .is_some_and(|l| Arc::ptr_eq(&l.ctx, old_state))
            });
            match entry {
                Some(entry) => {
                    // A build that failed after this very file was
                    // installed is still the plugin's latest word: the file
                    // loads (it is a good build, only an older one), and
                    // the failure stays shown.
                    if entry.failed_build_over.as_ref() == Some(&installed) {
                        info.error = entry.info.error.clone();
                    } else {
                        entry.failed_build_over = None;
                    }
                    entry.info = info.clone();
                    entry.live.replace(live)
                }
                None => {
                    // Cannot happen while `loading` is held (only
                    // loads, reloads and shutdown replace entries).
                    state.entries.push(PluginEntry {
                        info: info.clone(),
                        live: Some(live),
                        failed_build_over: None,
                    });
                    None
                }
            }
        };
        if let Some(old) = old {
            // Nothing of the old generation is registered any more
            // (the commit replaced or removed it); this stops its
            // subscriptions after the event in hand.
            retire(&old.ctx, Subscriptions::Finish);
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
            .publish("plugin.reloaded", &info);
        self.get_generation(name, info.generation).unwrap_or(info)
    }

    /// A failed reload: the old generation keeps serving and shows the
    /// error until a reload succeeds; `plugin.failed` is published.
    fn record_failure(
        &self,
        name: &str,
        generation: u64,
        old_state: &Arc<GenerationState>,
        failure: &LoadFailure,
    ) {
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
                    .is_some_and(|l| Arc::ptr_eq(&l.ctx, old_state))
            });
            entry.map(|entry| {
                entry.info.error = Some(message);
                entry.failed_build_over = None;
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
                .publish("plugin.failed", &properties);
        }
    }

    /// A build of the plugin that would be installed at `path` failed
    /// (`offstage dev --watch-src`): shown like a failed reload. A
    /// generation loaded from `path` keeps serving and shows the error
    /// until a later build is installed; with none, `path` is listed as
    /// failed. Either way `plugin.failed` is published. `message` is
    /// cargo's first error.
    pub fn record_build_failure(&self, path: &Path, message: &str) {
        let error = LoadError::Build {
            path: path.to_path_buf(),
            message: error::one_line(message),
        };
        // Logged by the watcher (cargo's output and its status) already.
        let loaded = {
            let mut state = self.inner.state.lock_unpoisoned();
            state
                .entries
                .iter_mut()
                .find(|e| e.live.is_some() && e.info.path == path)
                .map(|entry| {
                    entry.info.error = Some(error.to_string());
                    entry.failed_build_over = Some(file::Stamp::of(path));
                    entry.info.clone()
                })
        };
        let info = match loaded {
            Some(info) => info,
            None => {
                // Named as an earlier attempt at the same file was, if any.
                let earlier = self
                    .inner
                    .state
                    .lock_unpoisoned()
                    .entries
                    .iter()
                    .rev()
                    .find(|e| e.info.path == path)
                    .map(|e| e.info.clone());
                let mut info = super::info::failed_info(path, &LoadFailure::from(error));
                if let Some(earlier) = earlier {
                    info = PluginInfo {
                        generation: 0,
                        status: super::PluginStatus::Failed,
                        error: info.error,
                        capabilities: Vec::new(),
                        ..earlier
                    };
                }
                self.record(info.clone(), None);
                info
            }
        };
        self.inner.service.events().publish("plugin.failed", &info);
    }

    /// Loads `path` if no plugin came from it yet, else reloads the plugin
    /// that did: what `offstage dev` does when a file in a plugin dir
    /// changes. A file whose bytes are those the loaded generation came
    /// from (a rebuild that produced the same library) is not reloaded:
    /// the loaded plugin is returned as it is, with the error it showed
    /// cleared, unless that error is a failed build and the file is still
    /// the one installed before it (a late event about an old install).
    pub fn load_or_reload(&self, path: &Path) -> Result<PluginInfo, LoadError> {
        let canonical = std::fs::canonicalize(path).ok();
        let same_file = |known: &Path| {
            known == path || canonical.is_some() && std::fs::canonicalize(known).ok() == canonical
        };
        let loaded = {
            let state = self.inner.state.lock_unpoisoned();
            state.entries.iter().find_map(|e| {
                let live = e.live.as_ref()?;
                same_file(&e.info.path).then(|| (e.info.name.clone(), live.content))
            })
        };
        let Some((name, content)) = loaded else {
            return self.load_file(path);
        };
        let unchanged = std::fs::File::open(path)
            .and_then(|mut file| file::content_of(&mut file))
            .is_ok_and(|now| now == content);
        if unchanged {
            tracing::info!(plugin = %name, path = %path.display(), "plugin file unchanged; not reloaded");
            if let Some(info) = self.clear_error(&name, &file::Stamp::of(path)) {
                return Ok(info);
            }
        }
        self.reload(&name)
    }

    /// Waits (on the runtime, not here) until the replaced generation
    /// `old` has no call running, then shuts it down.
    fn drain(&self, name: &str, generation: u64, old: Generation) {
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
            // Counted before it leaves `draining`, so that a host shutting
            // down meanwhile sees it in one or the other.
            let finishing = super::Finishing::start(&inner);
            // Gone if the host shut it down meanwhile.
            let Some(live) = inner.state.lock_unpoisoned().draining.remove(&key) else {
                return;
            };
            drop(inner);
            tracing::debug!(plugin = %key.0, generation = key.1, "replaced generation drained");
            let _ = tokio::task::spawn_blocking(move || {
                live.finish(&key.0, Subscriptions::Finish);
                drop(finishing);
            })
            .await;
        });
    }
}
