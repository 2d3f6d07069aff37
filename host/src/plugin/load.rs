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

use serde_json::{json, Value};
use tokio::runtime::Handle;

use super::{
    abi::{self, ManifestInfo},
    config::{granted, unasked, PluginSettings},
    error::{one_line, NameSource},
    file,
    generation::{commit, new_state, retire, Generation, GenerationState, Start, Subscriptions},
    info::{failed_info, info_from},
    isolate, section, LoadError, PluginHost, PluginInfo, PluginStatus,
};
use crate::{
    tool::Owner,
    util::{panic_message, LockExt},
};

/// What was learnt about a file before `init`: enough to start it.
pub(super) struct CheckedLibrary {
    pub(super) runtime: Handle,
    pub(super) module: Opened,
    pub(super) manifest: ManifestInfo,
    pub(super) settings: PluginSettings,
    /// Length and hash of the bytes loaded.
    pub(super) content: file::Content,
    /// The library mapped here (`None` when it runs in a child process).
    pub(super) mapping: Option<abi::Mapping>,
}

/// Where the library was opened.
pub(super) enum Opened {
    /// In this process.
    Local(abi::Module),
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

/// Where a plugin file is opened: in a child process (opened there
/// already), or here, with the name it must give when it is.
pub(super) enum Placement {
    Isolated(Box<CheckedLibrary>),
    Here(Option<Known>),
}

impl Placement {
    fn isolated(opened: CheckedLibrary) -> Placement {
        Placement::Isolated(Box::new(opened))
    }
}

/// A plugin's name as the host learnt it before loading the plugin, and
/// where from.
pub(super) struct Known {
    name: String,
    from: NameSource,
}

impl Known {
    /// Refuses a plugin whose name at its load, `found` (learnt
    /// `found_from`), is not the one the host went by.
    fn check(&self, path: &Path, found: &str, found_from: NameSource) -> Result<(), LoadError> {
        if found == self.name {
            return Ok(());
        }
        Err(LoadError::NameMismatch {
            path: path.to_path_buf(),
            first: self.name.clone(),
            first_from: self.from,
            then: found.to_string(),
            then_from: found_from,
        })
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
                        self.inner.service.events().publish("plugin.loaded", &info);
                    }
                }
                // A hook may have panicked between `init` and `record`.
                let info = self
                    .get_generation(&info.name, info.generation)
                    .unwrap_or(info);
                (info, Ok(()))
            }
            Err(failure) => {
                let mut info = failed_info(path, &failure);
                if failure.manifest.is_none() {
                    // Known from its file, even when its process died
                    // before it said.
                    if let Ok(Some(name)) = section::declared_name(path) {
                        info.name = name;
                    }
                }
                tracing::warn!("{}", failure.error);
                self.record(info.clone(), None);
                self.inner.service.events().publish("plugin.failed", &info);
                if matches!(failure.error, LoadError::Isolated { .. }) {
                    isolate::retry_start(self, path, &info.name);
                }
                (info, Err(failure.error))
            }
        }
    }

    fn load(&self, path: &Path) -> Result<(PluginInfo, Option<Generation>), LoadFailure> {
        let opened = self.open(path)?;
        let manifest = &opened.manifest;
        if !opened.settings.enabled {
            let info = info_from(path, manifest, 0, PluginStatus::Unloaded, Vec::new());
            // Only its manifest ran: nothing keeps it mapped.
            unmap(opened);
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
            let failure = LoadFailure {
                error: LoadError::DuplicateName {
                    path: path.to_path_buf(),
                    name: manifest.name.clone(),
                    other,
                },
                manifest: Some(Box::new(manifest.clone())),
                generation: 0,
            };
            // Refused before `init`: only its manifest ran, so it is not
            // kept mapped.
            unmap(opened);
            return Err(failure);
        }
        let (info, live) = self.start(path, opened, None, None)?;
        Ok((info, Some(live)))
    }

    /// Steps 1–5 of a load: permissions, format, private copy, root module
    /// and manifest, `panic = "abort"`. Where it runs is decided first, by
    /// the name its file declares (`section.rs`) or a look in a child
    /// process, before any of its code runs here; a plugin whose manifest
    /// then names another plugin is refused.
    pub(super) fn open(&self, path: &Path) -> Result<CheckedLibrary, LoadFailure> {
        let runtime = Handle::try_current().map_err(|_| LoadError::Host {
            path: path.to_path_buf(),
            message: "plugins must be loaded inside a tokio runtime".into(),
        })?;
        let declared = section::declared_name(path).map_err(|e| match e {
            section::SectionError::Io(e) => LoadError::Io {
                path: path.to_path_buf(),
                message: e.to_string(),
            },
            other => LoadError::NameSection {
                path: path.to_path_buf(),
                message: other.to_string(),
            },
        })?;
        let expected = match self.open_isolated(path, &runtime, declared)? {
            Placement::Isolated(opened) => return Ok(*opened),
            Placement::Here(expected) => expected,
        };
        let staged = stage(&self.inner.config, path, |content| {
            self.loaded_with_content(path, content)
        })?;
        let opened = self.open_staged(path, staged)?;
        if let Some(known) = expected {
            let here = if self.inner.in_child {
                NameSource::Process
            } else {
                NameSource::Host
            };
            if let Err(error) = known.check(path, &opened.manifest.name, here) {
                // Only its manifest ran: nothing keeps it mapped.
                unmap(opened);
                return Err(error.into());
            }
        }
        Ok(opened)
    }

    /// Steps 4–5 for a file [`stage`]d: maps the private copy and reads
    /// the manifest.
    pub(super) fn open_staged(
        &self,
        path: &Path,
        staged: Staged,
    ) -> Result<CheckedLibrary, LoadFailure> {
        let config = &self.inner.config;
        let runtime = Handle::try_current().map_err(|_| LoadError::Host {
            path: path.to_path_buf(),
            message: "plugins must be loaded inside a tokio runtime".into(),
        })?;
        let Staged {
            copy,
            content,
            held,
        } = staged;
        let opened = abi::open(path, &copy);
        // The mapping stays valid after the copy is gone; removing it keeps
        // the data dir from growing with every start. (Windows cannot remove
        // a loaded library; there the copy stays.) A held copy was unlinked
        // already; its descriptor closes here.
        if held.is_none() && (cfg!(unix) || opened.is_err()) {
            let _ = std::fs::remove_file(&copy);
        }
        drop(held);
        let (module, mapping) = opened?;
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
        check_capabilities(path, &manifest, &settings)?;
        Ok(CheckedLibrary {
            runtime,
            module: Opened::Local(module),
            manifest,
            settings,
            content,
            mapping: Some(mapping),
        })
    }

    /// Steps 1–5 in a child process, when the plugin runs isolated
    /// (`plugin/isolate/`); [`Placement::Here`] when it runs here, with the
    /// name it must have.
    ///
    /// By the name its file declares (`declared`): a plugin isolated by
    /// it gets its child at once (restricted to its data dir with
    /// `filesystem = "read-only"`), whose manifest must give that name.
    ///
    /// A file that declares none, with isolation chosen by name, is looked
    /// at in a child process first, which learns the name without running
    /// the file's code in the host; a plugin that turns out not to be
    /// isolated is then opened here, and must give the same name. With
    /// `filesystem = "read-only"` for any plugin, that look is restricted
    /// from its start to writing nowhere (so the file's constructors never
    /// run unrestricted where they might have to be restricted); a
    /// read-only plugin then gets a new child restricted to its own data
    /// dir, an unrestricted one a new child without the restriction. Where
    /// the kernel cannot restrict, a read-only plugin is refused
    /// (`process/sandbox/`).
    fn open_isolated(
        &self,
        path: &Path,
        runtime: &Handle,
        declared: Option<String>,
    ) -> Result<Placement, LoadFailure> {
        let isolation = &self.inner.isolation;
        let from_file = declared.map(|name| Known {
            name,
            from: NameSource::File,
        });
        if self.inner.in_child
            || (isolation.default_mode() == isolate::Isolation::None
                && !isolation.any_by_name()
                && !isolation.any_read_only())
        {
            return Ok(Placement::Here(from_file));
        }
        let landlock = |network| isolate::filesystem_restriction_available(network);
        let (known, probe) = match from_file {
            Some(known) => (known, None),
            None => {
                let probe = if isolation.any_read_only() && landlock(false).is_ok() {
                    Some(isolate::Sandbox::default())
                } else {
                    None
                };
                let child = isolate::Child::spawn(self, path, probe.as_ref())?;
                let known = Known {
                    name: child.manifest.name.clone(),
                    from: NameSource::Look,
                };
                (known, Some((child, probe.is_some())))
            }
        };
        let name = known.name.clone();
        let resolved = isolation.resolve(&name);
        let looked = probe
            .as_ref()
            .map(|(child, _)| Box::new(child.manifest.clone()));
        let refuse = |cause: String| LoadFailure {
            error: LoadError::Filesystem {
                path: path.to_path_buf(),
                name: name.clone(),
                cause,
            },
            manifest: looked.clone(),
            generation: 0,
        };
        if resolved.mode != isolate::Isolation::Process {
            if resolved.filesystem == isolate::Filesystem::ReadOnly {
                // `IsolationConfig::check` refuses such a config; a host
                // built without it refuses the plugin.
                return Err(refuse(
                    "the plugin does not run isolated, and in the host's process the \
                     restriction would restrict the whole host"
                        .into(),
                ));
            }
            return Ok(Placement::Here(Some(known)));
        }
        let sandbox = match resolved.filesystem {
            isolate::Filesystem::ReadOnly => {
                let network = resolved.network == isolate::Network::Allow;
                if let Err(cause) = landlock(network) {
                    return Err(refuse(cause.to_string()));
                }
                Some(isolate::Sandbox::plugin(
                    Some(self.inner.config.plugin_data_dir(&name)),
                    network,
                ))
            }
            isolate::Filesystem::Unrestricted => None,
        };
        if let Some((child, restricted)) = probe {
            if sandbox.is_none() && !restricted {
                // The look ran as the plugin is to run: it is the plugin's.
                return self.isolated(path, runtime, child).map(Placement::isolated);
            }
        }
        let child = match isolate::Child::spawn(self, path, sandbox.as_ref()) {
            Ok(child) => child,
            Err(LoadError::NotEnforced { cause, .. }) => return Err(refuse(cause)),
            Err(error) => return Err(error.into()),
        };
        known.check(path, &child.manifest.name, NameSource::Process)?;
        self.isolated(path, runtime, child).map(Placement::isolated)
    }

    /// The rest of [`open_isolated`](Self::open_isolated) for the child
    /// that runs the plugin.
    fn isolated(
        &self,
        path: &Path,
        runtime: &Handle,
        child: isolate::Child,
    ) -> Result<CheckedLibrary, LoadFailure> {
        let manifest = child.manifest.clone();
        let settings = self
            .inner
            .config
            .settings
            .get(&manifest.name)
            .cloned()
            .unwrap_or_default();
        // Grants are the host's to check, as in process.
        check_capabilities(path, &manifest, &settings)?;
        // What the child loaded, for telling copies apart (the file was
        // checked there; here it is only read).
        let content = std::fs::File::open(path)
            .and_then(|mut file| file::content_of(&mut file))
            .map_err(|e| LoadError::Io {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        Ok(CheckedLibrary {
            runtime: runtime.clone(),
            module: Opened::Isolated(child),
            manifest,
            settings,
            content,
            mapping: None,
        })
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
            content,
            mapping,
        } = opened;
        // From here its code may start threads: mapped for good.
        drop(mapping);
        let grants = granted(&manifest.capabilities, settings.grant.as_deref());
        let unasked = unasked(&manifest.capabilities, settings.grant.as_deref());
        if !unasked.is_empty() {
            tracing::warn!(
                plugin = %manifest.name,
                "[plugin.{}] grant lists {unasked:?}, which the plugin's manifest does not ask \
                 for: not given (a grant only narrows what the manifest asks for)",
                manifest.name
            );
        }
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
            Start {
                owner: owner.clone(),
                grants: grants.clone(),
                options,
                previous_state,
                data_dir: self.inner.config.plugin_data_dir(&manifest.name),
                on_failure: self.failure_callback(&manifest.name, generation),
            },
        );
        let context = abi::HostContext::new(&ctx);
        let mut pid = None;
        let initialised = match module {
            Opened::Local(module) => {
                ctx.in_process
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                let _runtime = runtime.enter();
                // Named in a crash report if `init` brings the host down.
                let _marked = super::watchdog::enter(context.state(), super::watchdog::Hook::Init);
                abi::init(path, &manifest.name, module, context)
            }
            Opened::Isolated(child) => {
                pid = Some(child.pid());
                child.init(path, &ctx, context, options_json, handed_state)
            }
        };
        let instance = match initialised {
            Ok(instance) => instance,
            Err(error) => {
                // Whatever it staged is dropped; nothing was registered.
                let tools = ctx.staged_tool_names();
                retire(&ctx, Subscriptions::Abort);
                ctx.abandon();
                if previous.is_none() {
                    // A first load: calls of its tools say why they fail.
                    // (A failed reload leaves the old generation's tools.)
                    self.inner.service.tools().mark_unavailable(
                        &tools,
                        &format!(
                            "its plugin {} failed to start: {}",
                            manifest.name,
                            one_line(&error.to_string())
                        ),
                    );
                }
                return Err(failure(error));
            }
        };
        let live = Generation {
            instance,
            owner,
            ctx,
            content,
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
            info.filesystem = self.inner.isolation.resolve(&manifest.name).filesystem;
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
    LoadError::Host {
        path: path.to_path_buf(),
        message: format!("the loader panicked: {}", panic_message(payload)),
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

/// A plugin file checked and copied, not yet mapped: steps 1–3.
pub(super) struct Staged {
    /// The path to map: the private copy, or `/proc/self/fd/N` for a held one.
    copy: PathBuf,
    /// Length and hash of the bytes copied.
    content: file::Content,
    /// The copy, open and already unlinked ([`Staged::hold`]).
    held: Option<std::fs::File>,
}

impl Staged {
    /// Keeps the copy open and unlinks it, to be mapped through
    /// `/proc/self/fd`: a process that then loses the right to write in
    /// `<data_dir>/plugins/` (`process/sandbox/`) can still map it, and
    /// leaves no copy behind.
    pub(super) fn hold(mut self) -> std::io::Result<Staged> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(&self.copy)?;
        std::fs::remove_file(&self.copy)?;
        self.copy = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        self.held = Some(file);
        Ok(self)
    }
}

/// Steps 1–3 of a load, which run no code of the plugin: permissions, the
/// format read from the headers, and the private copy. `duplicate` may
/// refuse the file by its content before it is copied.
pub(super) fn stage(
    config: &super::PluginHostConfig,
    path: &Path,
    duplicate: impl FnOnce(file::Content) -> Option<PluginInfo>,
) -> Result<Staged, LoadFailure> {
    if !config.allow_insecure_permissions {
        file::check_permissions(path)?;
    }
    let io = |e: std::io::Error| LoadError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    // One open file for every step, so what is checked is what is
    // copied even if the path is replaced meanwhile.
    let mut file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    file::check_format(path, &mut file, len)?;
    let content = file::content_of(&mut file).map_err(io)?;
    if let Some(other) = duplicate(content) {
        // The same bytes as a plugin loaded from another file: its
        // name is known without mapping this copy, which would stay
        // mapped for good (§ABI-11).
        return Err(LoadFailure {
            error: LoadError::DuplicateName {
                path: path.to_path_buf(),
                name: other.name.clone(),
                other: other.path.clone(),
            },
            manifest: Some(Box::new(ManifestInfo {
                name: other.name,
                version: other.version,
                api_version: other.api_version,
                description: other.description,
                capabilities: Vec::new(),
                panic_abort: false,
            })),
            generation: 0,
        });
    }
    let (copy, copied) = private_copy(&config.data_dir, path, &mut file).map_err(io)?;
    if copied != content {
        let _ = std::fs::remove_file(&copy);
        return Err(LoadError::Io {
            path: path.to_path_buf(),
            message: "the file changed while it was being loaded; try again".into(),
        }
        .into());
    }
    Ok(Staged {
        copy,
        content,
        held: None,
    })
}

/// Streams `source` to `<data_dir>/plugins/<stem>-<n>-<pid>.<ext>`, a
/// path no earlier load in any process has used (`create_new` makes
/// sure), and returns the copy's path with what was copied.
fn private_copy(
    data_dir: &Path,
    source_path: &Path,
    source: &mut std::fs::File,
) -> std::io::Result<(PathBuf, file::Content)> {
    let dir = data_dir.join("plugins");
    std::fs::create_dir_all(&dir)?;
    let stem = file_stem(source_path);
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
                let copied = file::copy_streaming(source, &mut file).inspect_err(|_| {
                    let _ = std::fs::remove_file(&copy);
                })?;
                return Ok((copy, copied));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Refuses capability names this host does not know, in the manifest's
/// request or the config's grant list, naming the valid ones.
fn check_capabilities(
    path: &Path,
    manifest: &ManifestInfo,
    settings: &PluginSettings,
) -> Result<(), LoadFailure> {
    let known = offstage_plugin_api::capability::ALL;
    let unknown = |names: &[String]| -> Vec<String> {
        names
            .iter()
            .filter(|name| !known.contains(&name.as_str()))
            .cloned()
            .collect()
    };
    let places = [
        (unknown(&manifest.capabilities), false),
        (unknown(settings.grant.as_deref().unwrap_or_default()), true),
    ];
    for (unknown, in_config) in places {
        if !unknown.is_empty() {
            return Err(LoadFailure {
                error: LoadError::UnknownCapability {
                    path: path.to_path_buf(),
                    name: manifest.name.clone(),
                    unknown,
                    in_config,
                    valid: known,
                },
                manifest: Some(Box::new(manifest.clone())),
                generation: 0,
            });
        }
    }
    Ok(())
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

/// Unmaps a library refused before `init` (a child process, if isolated,
/// ends when its handle goes).
fn unmap(opened: CheckedLibrary) {
    if let Some(mapping) = opened.mapping {
        mapping.unmap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(capabilities: &[&str]) -> ManifestInfo {
        ManifestInfo {
            name: "typo".into(),
            version: "0.1.0".into(),
            api_version: "1.1.0".into(),
            description: String::new(),
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            panic_abort: false,
        }
    }

    #[test]
    fn unknown_capabilities_are_refused_in_the_manifest_and_the_config() {
        let path = Path::new("libtypo.so");
        let fine = PluginSettings::default();
        assert!(check_capabilities(path, &manifest(&["session.read", "events"]), &fine).is_ok());

        let Err(failure) = check_capabilities(path, &manifest(&["session.read", "evnets"]), &fine)
        else {
            panic!("a typo in the manifest passed");
        };
        let message = failure.error.to_string();
        assert!(
            message.contains("unknown capability [\"evnets\"] in its manifest"),
            "{message}"
        );
        assert!(message.contains("valid names are: session.read, session.write"));
        assert_eq!(failure.error.stage(), super::super::LoadStage::File);

        let typo = PluginSettings {
            grant: Some(vec!["sesion.read".into()]),
            ..PluginSettings::default()
        };
        let Err(failure) = check_capabilities(path, &manifest(&["session.read"]), &typo) else {
            panic!("a typo in the grant passed");
        };
        let message = failure.error.to_string();
        assert!(
            message.contains("in the host config ([plugin.typo] grant)"),
            "{message}"
        );
        assert_eq!(failure.error.stage(), super::super::LoadStage::Start);
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
