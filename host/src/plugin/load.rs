//! Loading one plugin file: permissions → format → private copy → root
//! module and manifest → policy → `init` → commit (steps 1–7 in the module
//! docs of `plugin/`), and recording the outcome.
//!
//! Why the steps are in this order: the cheap checks that need no plugin
//! code come first, so a file that would crash or mislead the loader is
//! refused before it is mapped; `init` runs last, and what it registers is
//! staged until the commit, so a failure anywhere leaves nothing behind.

use std::{
    panic::{catch_unwind, AssertUnwindSafe},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Weak,
    },
};

use offstage_plugin_api::abi::PluginModuleRef;
use serde_json::{json, Value};
use tokio::runtime::Handle;

use super::{
    abi::{self, ManifestInfo},
    config::{granted, PluginSettings},
    file,
    generation::{commit, new_state, retire, Generation, GenerationState, Subscriptions},
    info::{failed_info, info_from},
    isolate, LoadError, PluginHost, PluginInfo, PluginStatus,
};
use crate::{tool::Owner, util::LockExt};

/// What was learnt about a file before `init`: enough to start it.
pub(super) struct CheckedLibrary {
    pub(super) runtime: Handle,
    pub(super) module: Opened,
    pub(super) manifest: ManifestInfo,
    pub(super) settings: PluginSettings,
}

/// Where the library was opened.
pub(super) enum Opened {
    /// In this process.
    Local(PluginModuleRef),
    /// In a child process of its own (`isolation = "process"`).
    Isolated(isolate::Child),
}

/// Distinguishes private copies made by this process.
static COPY_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A load that failed, with what was learnt before it did.
pub(super) struct LoadFailure {
    pub(super) error: LoadError,
    pub(super) manifest: Option<Box<ManifestInfo>>,
    pub(super) generation: u64,
}

impl From<LoadError> for LoadFailure {
    fn from(error: LoadError) -> Self {
        LoadFailure {
            error,
            manifest: None,
            generation: 0,
        }
    }
}

impl PluginHost {
    /// Loads `path` and records the outcome; the info is the recorded one.
    pub(super) fn load_recorded(&self, path: &Path) -> (PluginInfo, Result<(), LoadError>) {
        let _serial = self.inner.loading.lock_unpoisoned();
        self.load_recorded_serial(path)
    }

    /// [`load_recorded`](Self::load_recorded) with `loading` held.
    pub(super) fn load_recorded_serial(&self, path: &Path) -> (PluginInfo, Result<(), LoadError>) {
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

    fn load(&self, path: &Path) -> Result<(PluginInfo, Option<Generation>), LoadFailure> {
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
            return Err(LoadFailure {
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
    pub(super) fn open(&self, path: &Path) -> Result<CheckedLibrary, LoadFailure> {
        let config = &self.inner.config;
        let runtime = Handle::try_current().map_err(|_| LoadError::Host {
            path: path.to_path_buf(),
            message: "plugins must be loaded inside a tokio runtime".into(),
        })?;
        if let Some(opened) = self.open_isolated(path, &runtime)? {
            return Ok(opened);
        }
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
        let opened = abi::open(path, &copy);
        // The mapping stays valid after the copy is gone; removing it keeps
        // the data dir from growing with every start. (Windows cannot remove
        // a loaded library; there the copy stays.)
        if cfg!(unix) || opened.is_err() {
            let _ = std::fs::remove_file(&copy);
        }
        let module = opened?;
        let manifest = abi::manifest(path, module)?;
        // In an isolated plugin's process an abort ends only that process.
        if manifest.panic_abort && !self.inner.in_child {
            return Err(LoadFailure {
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
        Ok(CheckedLibrary {
            runtime,
            module: Opened::Local(module),
            manifest,
            settings,
        })
    }

    /// Steps 1–5 in a child process, when the plugin runs isolated
    /// (`plugin/isolate/`). `None`: it runs here. With isolation chosen
    /// by name only, the child is also how the name is learnt without
    /// running the file's code in the host; a plugin that turns out not to
    /// be isolated is then opened again here.
    fn open_isolated(
        &self,
        path: &Path,
        runtime: &Handle,
    ) -> Result<Option<CheckedLibrary>, LoadFailure> {
        let isolation = &self.inner.isolation;
        if self.inner.in_child
            || (isolation.default_mode() == isolate::Isolation::None && !isolation.any_by_name())
        {
            return Ok(None);
        }
        let child = isolate::Child::spawn(self, path)?;
        if isolation.resolve(&child.manifest.name).mode != isolate::Isolation::Process {
            return Ok(None);
        }
        let manifest = child.manifest.clone();
        let settings = self
            .inner
            .config
            .settings
            .get(&manifest.name)
            .cloned()
            .unwrap_or_default();
        Ok(Some(CheckedLibrary {
            runtime: runtime.clone(),
            module: Opened::Isolated(child),
            manifest,
            settings,
        }))
    }

    /// Steps 6–7: `init` as a new generation (handing it `previous_state`),
    /// then commits its registrations in place of `previous`'s. On failure
    /// nothing it registered took effect.
    pub(super) fn start(
        &self,
        path: &Path,
        opened: CheckedLibrary,
        previous_state: Option<String>,
        previous: Option<&Arc<GenerationState>>,
    ) -> Result<(PluginInfo, Generation), LoadFailure> {
        let CheckedLibrary {
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
        let failure = |error: LoadError| LoadFailure {
            error,
            manifest: Some(Box::new(manifest.clone())),
            generation,
        };
        let owner = Owner::Plugin {
            name: manifest.name.clone(),
            generation,
        };
        let (options_json, handed_state) = (options.to_string(), previous_state.clone());
        let ctx = new_state(
            self.inner.service.clone(),
            runtime.clone(),
            owner.clone(),
            grants.clone(),
            options,
            previous_state,
            self.failure_callback(&manifest.name, generation),
        );
        let handle = abi::host_handle(&ctx);
        let mut pid = None;
        let initialised = match module {
            Opened::Local(module) => {
                let _runtime = runtime.enter();
                abi::init(path, &manifest.name, module, handle)
            }
            Opened::Isolated(child) => {
                pid = Some(child.pid());
                child.init(path, &ctx, handle.ctx, options_json, handed_state)
            }
        };
        let instance = match initialised {
            Ok(instance) => instance,
            Err(error) => {
                // Whatever it staged is dropped; nothing was registered.
                retire(&ctx, Subscriptions::Abort);
                return Err(failure(error));
            }
        };
        let live = Generation {
            instance,
            owner,
            ctx,
        };
        if let Err(error) = commit(&live.ctx, previous.map(|p| &**p)) {
            live.finish(&manifest.name, Subscriptions::Abort);
            return Err(failure(LoadError::Host {
                path: path.to_path_buf(),
                message: format!("cannot register what the plugin added: {error}"),
            }));
        }
        let mut info = info_from(
            path,
            &manifest,
            generation,
            PluginStatus::Loaded,
            grants.into_iter().collect(),
        );
        if pid.is_some() {
            info.isolation = isolate::Isolation::Process;
            info.pid = pid;
        }
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
pub(super) fn loader_panicked(path: &Path, payload: &(dyn std::any::Any + Send)) -> LoadError {
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
pub(super) fn plugin_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
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
pub(super) fn file_stem(path: &Path) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
