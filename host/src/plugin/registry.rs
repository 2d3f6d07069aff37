//! The registry: every load attempt (loaded, failed, unloaded) and the
//! generations behind the loaded ones, plus the generations a reload
//! replaced that are still draining.
//!
//! Why one list of entries rather than a map by name: a name can have a
//! loaded generation and failed attempts at other files at once, and
//! `list` shows them all in load order.

use std::{collections::HashMap, path::Path};

use super::{error, file, generation::Generation, PluginHost, PluginInfo, PluginStatus};
use crate::util::LockExt;

#[derive(Default)]
pub(super) struct State {
    pub(super) entries: Vec<PluginEntry>,
    /// Last generation handed out per plugin name.
    pub(super) generations: HashMap<String, u64>,
    /// Generations replaced by a reload whose calls are still running,
    /// by (name, generation); shut down when drained or at host shutdown.
    pub(super) draining: HashMap<(String, u64), Generation>,
}

/// One load attempt and, while it is loaded, its generation.
pub(super) struct PluginEntry {
    pub(super) info: PluginInfo,
    pub(super) live: Option<Generation>,
    /// When `info.error` is a failed build of the plugin's sources: the
    /// library file as it was then. Only a file installed since (another
    /// stamp) clears that error; see [`PluginHost::clear_error`].
    pub(super) failed_build_over: Option<file::Stamp>,
}

impl PluginHost {
    /// Every plugin the host knows: loaded, failed and unloaded.
    pub fn list(&self) -> Vec<PluginInfo> {
        self.inner
            .state
            .lock_unpoisoned()
            .entries
            .iter()
            .map(|e| e.info.clone().observed())
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
            .map(|e| e.info.clone().observed())
    }

    /// The state the loaded generation of `name` was handed at its `init`
    /// by the generation a reload replaced (that one's `export_state`), as
    /// JSON text; `None` when none was handed over or no generation of
    /// `name` is loaded. What a test of a plugin's hot-reload handoff
    /// checks (`offstage-plugin-test`).
    pub fn handed_state(&self, name: &str) -> Option<String> {
        let state = self.inner.state.lock_unpoisoned();
        state
            .entries
            .iter()
            .filter(|e| e.info.name == name)
            .find_map(|e| e.live.as_ref())
            .and_then(|live| live.ctx.previous_state.clone())
    }

    pub(super) fn get_generation(&self, name: &str, generation: u64) -> Option<PluginInfo> {
        self.inner
            .state
            .lock_unpoisoned()
            .entries
            .iter()
            .find(|e| e.info.name == name && e.info.generation == generation)
            .map(|e| e.info.clone())
    }

    /// The loaded plugin whose file had exactly `content`, if it came from
    /// another file than `path`.
    pub(super) fn loaded_with_content(
        &self,
        path: &Path,
        content: file::Content,
    ) -> Option<PluginInfo> {
        self.inner
            .state
            .lock_unpoisoned()
            .entries
            .iter()
            .find(|e| {
                e.info.path != path && e.live.as_ref().is_some_and(|live| live.content == content)
            })
            .map(|e| e.info.clone())
    }

    /// Clears the error shown for the loaded generation of `name` (a failed
    /// build or reload that a later success superseded) and returns its
    /// info; `None` if `name` has no loaded generation. `now` is the
    /// library file at hand: a failed build's error stays unless that file
    /// was installed after the failure, since a late event about the file
    /// installed before it says nothing about the failed build.
    pub(super) fn clear_error(&self, name: &str, now: &file::Stamp) -> Option<PluginInfo> {
        let mut state = self.inner.state.lock_unpoisoned();
        let entry = state
            .entries
            .iter_mut()
            .find(|e| e.info.name == name && e.live.is_some())?;
        if entry
            .failed_build_over
            .as_ref()
            .is_none_or(|then| then != now)
        {
            entry.info.error = None;
            entry.failed_build_over = None;
        }
        Some(entry.info.clone())
    }

    /// Adds an entry, replacing an earlier failed or unloaded attempt at the
    /// same file so that repeated loads do not pile up.
    pub(super) fn record(&self, info: PluginInfo, live: Option<Generation>) {
        let mut state = self.inner.state.lock_unpoisoned();
        state
            .entries
            .retain(|e| !(e.info.path == info.path && e.info.status != PluginStatus::Loaded));
        state.entries.push(PluginEntry {
            info,
            live,
            failed_build_over: None,
        });
    }

    /// Marks generation `generation` of `name` failed, if it is loaded. Its
    /// instance is neither shut down nor freed: a plugin that panicked is not
    /// trusted to shut down cleanly, and the adapter has already unhooked it.
    pub(super) fn mark_failed(&self, name: &str, generation: u64, message: &str) {
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
            entry.failed_build_over = None;
            entry.info.clone()
        };
        // Logged once, where it was detected (`GenerationState::fail`).
        self.inner.service.events().publish("plugin.failed", &info);
    }
}
