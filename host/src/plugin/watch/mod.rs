//! `offstage dev`: hot reload driven by the file system.
//!
//! - **Plugin dirs.** A library file that appears or changes in a plugin
//!   dir is loaded, or reloaded if a plugin came from it
//!   ([`PluginHost::load_or_reload`]; a file with the same bytes as the
//!   loaded generation is not reloaded). Changes are debounced: the watcher
//!   acts once the dir has been quiet for [`DEBOUNCE`], so a build or a
//!   copy that writes a file in many steps causes one reload. On Linux it
//!   also waits for the writer to close the file (or for a rename into
//!   place): a slow writer that pauses longer than the debounce never gets
//!   half its file loaded.
//! - **Source dirs** (`--watch-src DIR`, a plugin crate). A change to a
//!   `.rs` file or a `Cargo.toml` under it (not under `target/`) runs
//!   `cargo build` there, its output streamed to the host's log; so does
//!   starting the watcher, so the plugin is there without a first save. On
//!   success, the cdylibs it built are copied into the first plugin dir
//!   (written beside it and renamed, so the watcher never sees half a
//!   file), which reloads them as above. On failure the errors are logged,
//!   the old generation keeps serving, and the plugin shows the failure
//!   like a failed reload: a `plugin.failed` event and the plugin's
//!   `error` (cargo's first error), until a later build is installed.
//!   Either way a `plugin.build` event says how it went: `{"dir",
//!   "status": "ok" | "failed", "installed": [paths], "errors": text}`.
//!
//! A failed load or reload is reported by the plugin host itself (log line,
//! `plugin.failed` event, the plugin's `error`).
//!
//! This file watches and decides what a change asks for; running cargo,
//! reading its output and installing what it built is `cargo.rs`.

mod cargo;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use notify::{
    event::{AccessKind, AccessMode, CreateKind, ModifyKind},
    EventKind, RecommendedWatcher, RecursiveMode, Watcher,
};
use tokio::sync::mpsc;

use super::PluginHost;
use cargo::build_sources;

/// How long the watched dirs must be quiet before the watcher acts.
pub const DEBOUNCE: Duration = Duration::from_millis(300);

/// Watches plugin dirs and plugin sources until dropped.
pub struct DevWatcher {
    _watcher: RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DevWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts watching `plugin_dirs` (reloading what changes in them) and
/// `source_dirs` (rebuilding with cargo and installing into the first
/// plugin dir). Must run inside a tokio runtime. Fails if a dir cannot be
/// watched, or sources are given without a plugin dir to install into.
pub fn watch(
    host: PluginHost,
    plugin_dirs: Vec<PathBuf>,
    source_dirs: Vec<PathBuf>,
) -> Result<DevWatcher, String> {
    if !source_dirs.is_empty() && plugin_dirs.is_empty() {
        return Err("--watch-src needs a --plugin-dir to install the built plugins into".into());
    }
    let absolute = |dir: &PathBuf| {
        std::fs::canonicalize(dir).map_err(|e| format!("cannot watch {}: {e}", dir.display()))
    };
    // Events name canonical paths; the plugin host knows each file by the
    // path it was loaded from, under the dir as configured.
    let plugin_dirs = plugin_dirs
        .iter()
        .map(|dir| {
            Ok(PluginDir {
                watched: absolute(dir)?,
                configured: dir.clone(),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let source_dirs = source_dirs
        .iter()
        .map(absolute)
        .collect::<Result<Vec<_>, _>>()?;

    let (sender, receiver) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let _ = sender.send(event);
    })
    .map_err(|e| format!("cannot start the file watcher: {e}"))?;
    for dir in &plugin_dirs {
        watcher
            .watch(&dir.watched, RecursiveMode::NonRecursive)
            .map_err(|e| format!("cannot watch plugin dir {}: {e}", dir.configured.display()))?;
    }
    for dir in &source_dirs {
        watcher
            .watch(dir, RecursiveMode::Recursive)
            .map_err(|e| format!("cannot watch sources in {}: {e}", dir.display()))?;
    }
    tracing::info!(
        plugin_dirs = ?plugin_dirs.iter().map(|d| &d.configured).collect::<Vec<_>>(),
        sources = ?source_dirs,
        "dev mode: watching for changes"
    );
    let task = tokio::spawn(run(host, plugin_dirs, source_dirs, receiver));
    Ok(DevWatcher {
        _watcher: watcher,
        task,
    })
}

/// A watched plugin dir.
#[derive(Debug, Clone)]
struct PluginDir {
    /// Canonical: what events name.
    watched: PathBuf,
    /// As given: what the plugin host's paths start with.
    configured: PathBuf,
}

/// What one quiet period's changes ask for.
#[derive(Debug, Default, PartialEq)]
struct Changes {
    /// Library files in a plugin dir, to load or reload.
    libraries: BTreeSet<PathBuf>,
    /// Source dirs whose crate must be rebuilt.
    sources: BTreeSet<PathBuf>,
}

/// Whether the platform's watcher reports a writer closing a file
/// (inotify's `IN_CLOSE_WRITE`). Where it does, a file being written is
/// left alone until then; elsewhere the debounce alone decides.
const SEES_CLOSE: bool = cfg!(target_os = "linux");

/// What the watcher remembers between quiet periods.
#[derive(Debug, Default)]
struct WatchState {
    /// Library files some writer has open (created or written, not yet
    /// closed): not loaded until closed or replaced by a rename.
    writing: BTreeSet<PathBuf>,
    /// Per source dir, the library files its last good build installed,
    /// as the plugin host knows them (under the configured plugin dir).
    installed: BTreeMap<PathBuf, Vec<PathBuf>>,
}

async fn run(
    host: PluginHost,
    plugin_dirs: Vec<PluginDir>,
    source_dirs: Vec<PathBuf>,
    mut events: mpsc::UnboundedReceiver<notify::Result<notify::Event>>,
) {
    let mut state = WatchState::default();
    // Built once at start, so a watched crate's plugin is there without a
    // first save; installing it is seen below like any other change.
    let all_sources: BTreeSet<PathBuf> = source_dirs.iter().cloned().collect();
    build_sources(&host, &all_sources, &plugin_dirs[..], &mut state).await;
    while let Some(first) = events.recv().await {
        let mut changes = Changes::default();
        classify(&mut changes, &mut state, first, &plugin_dirs, &source_dirs);
        // Debounce: go on collecting until nothing happens for DEBOUNCE.
        loop {
            match tokio::time::timeout(DEBOUNCE, events.recv()).await {
                Ok(Some(event)) => {
                    classify(&mut changes, &mut state, event, &plugin_dirs, &source_dirs)
                }
                Ok(None) => return,
                Err(_) => break,
            }
        }
        build_sources(&host, &changes.sources, &plugin_dirs, &mut state).await;
        for library in changes.libraries {
            if state.writing.contains(&library) {
                tracing::debug!(path = %library.display(), "plugin file still being written; waiting for it to be closed");
                continue;
            }
            if !library.is_file() {
                tracing::info!(path = %library.display(), "plugin file removed; the loaded generation keeps serving");
                continue;
            }
            let host = host.clone();
            let outcome = tokio::task::spawn_blocking(move || host.load_or_reload(&library)).await;
            if let Ok(Ok(info)) = outcome {
                tracing::info!(plugin = %info.name, generation = info.generation, "dev: plugin is up to date");
            }
            // Failures were reported by the plugin host.
        }
    }
}

fn classify(
    changes: &mut Changes,
    state: &mut WatchState,
    event: notify::Result<notify::Event>,
    plugin_dirs: &[PluginDir],
    source_dirs: &[PathBuf],
) {
    let event = match event {
        Ok(event) => event,
        Err(error) => {
            tracing::warn!(%error, "file watcher error");
            return;
        }
    };
    let relevant = match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    };
    if !relevant {
        return;
    }
    for path in event.paths {
        if let Some(library) = plugin_library(&path, plugin_dirs) {
            if SEES_CLOSE {
                track_writer(state, &event.kind, &path, &library);
            }
            changes.libraries.insert(library);
        } else if let Some(source) = source_of(&path, source_dirs) {
            changes.sources.insert(source);
        }
    }
}

/// Keeps [`WatchState::writing`]: a file is being written from its
/// creation or first write until its writer closes it, or until a rename
/// puts a (complete) file in its place. A symlink is complete when made.
fn track_writer(state: &mut WatchState, kind: &EventKind, path: &Path, library: &Path) {
    match kind {
        EventKind::Create(CreateKind::File | CreateKind::Any) => {
            let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            if !is_link {
                state.writing.insert(library.to_path_buf());
            }
        }
        EventKind::Modify(ModifyKind::Data(_)) => {
            state.writing.insert(library.to_path_buf());
        }
        EventKind::Access(AccessKind::Close(AccessMode::Write))
        | EventKind::Modify(ModifyKind::Name(_))
        | EventKind::Remove(_) => {
            state.writing.remove(library);
        }
        _ => {}
    }
}

/// If `path` is a library file directly inside a plugin dir, its path
/// under the dir as configured.
fn plugin_library(path: &Path, plugin_dirs: &[PluginDir]) -> Option<PathBuf> {
    let dir = path.parent()?;
    let name = path.file_name()?.to_str()?;
    if !name.ends_with(std::env::consts::DLL_SUFFIX) || name.starts_with('.') {
        return None;
    }
    let dir = plugin_dirs.iter().find(|d| d.watched == dir)?;
    Some(dir.configured.join(name))
}

/// The source dir `path` belongs to, if it is a `.rs` file or a
/// `Cargo.toml` outside the build output.
fn source_of(path: &Path, source_dirs: &[PathBuf]) -> Option<PathBuf> {
    let dir = source_dirs.iter().find(|d| path.starts_with(d))?;
    let inside = path.strip_prefix(dir).ok()?;
    if inside
        .components()
        .any(|c| c.as_os_str() == "target" || c.as_os_str().to_string_lossy().starts_with('.'))
    {
        return None;
    }
    let name = path.file_name()?.to_str()?;
    (name.ends_with(".rs") || name == "Cargo.toml").then(|| dir.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_in_plugin_dirs_and_sources_are_told_apart() {
        let plugins = vec![PluginDir {
            watched: PathBuf::from("/p"),
            configured: PathBuf::from("here/p"),
        }];
        let sources = vec![PathBuf::from("/src/crate")];
        let lib = format!("/p/libx{}", std::env::consts::DLL_SUFFIX);
        let configured = format!("here/p/libx{}", std::env::consts::DLL_SUFFIX);
        assert_eq!(
            plugin_library(Path::new(&lib), &plugins),
            Some(PathBuf::from(configured))
        );
        let hidden = format!("/p/.libx{}.partial", std::env::consts::DLL_SUFFIX);
        assert_eq!(plugin_library(Path::new(&hidden), &plugins), None);
        assert_eq!(plugin_library(Path::new("/p/notes.txt"), &plugins), None);
        let nested = format!("/p/sub/libx{}", std::env::consts::DLL_SUFFIX);
        assert_eq!(plugin_library(Path::new(&nested), &plugins), None);

        let crate_dir = Some(PathBuf::from("/src/crate"));
        assert_eq!(
            source_of(Path::new("/src/crate/src/lib.rs"), &sources),
            crate_dir
        );
        assert_eq!(
            source_of(Path::new("/src/crate/Cargo.toml"), &sources),
            crate_dir
        );
        assert_eq!(
            source_of(Path::new("/src/crate/target/debug/build/x.rs"), &sources),
            None
        );
        assert_eq!(source_of(Path::new("/src/crate/README.md"), &sources), None);
        assert_eq!(source_of(Path::new("/elsewhere/lib.rs"), &sources), None);
    }

    #[test]
    fn a_file_is_being_written_until_closed_or_renamed_into_place() {
        use notify::event::{DataChange, RenameMode};

        let mut state = WatchState::default();
        let (path, library) = (Path::new("/p/libx.so"), Path::new("here/p/libx.so"));
        track_writer(
            &mut state,
            &EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            path,
            library,
        );
        assert!(state.writing.contains(library));
        track_writer(
            &mut state,
            &EventKind::Access(AccessKind::Close(AccessMode::Write)),
            path,
            library,
        );
        assert!(state.writing.is_empty());
        track_writer(
            &mut state,
            &EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            path,
            library,
        );
        track_writer(
            &mut state,
            &EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            path,
            library,
        );
        assert!(state.writing.is_empty());
    }
}
