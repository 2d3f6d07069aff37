//! The plugin's process: `offstage plugin-host FILE` (hidden), started by
//! the host with its end of the channel as file descriptor 3.
//!
//! It runs the loader's own checks and opens the library
//! (`PluginHost::open`), and `init`s the plugin with a generation whose
//! `upstream` is this process's channel: the plugin's session calls (both
//! faces, from any thread), registrations and logs go to the host; its
//! `sleep`, `spawn` and options are served here. The hooks it registers
//! are kept here by id and called when the host asks. When the host closes
//! the channel, the process exits.
//!
//! With `--read-only` (`filesystem = "read-only"`), before it starts a
//! thread or opens the library, it runs the loader's file checks, makes
//! and holds its private copy, and restricts itself (`sandbox.rs`); an
//! error there is the answer to the host's `open`.

use std::{
    collections::{BTreeSet, HashMap},
    os::fd::FromRawFd,
    path::PathBuf,
    process::ExitCode,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, OnceLock,
    },
};

use tokio::runtime::Handle;

use super::{
    harden,
    sandbox::{self, Sandbox},
    wire::{Handler, HookKind, Note, Peer, Request},
    Upstream,
};
use crate::{
    error::Result,
    error::ServiceError,
    plugin::{
        abi::{
            self, block_on_host,
            remote::{forwarded_next, LocalHook, NextUpstream},
            Instance, InstanceError,
        },
        generation::{new_state, Start},
        load::{stage, CheckedLibrary, Staged},
        LoadError, Opened, PluginHost, PluginHostConfig,
    },
    session::{ServiceConfig, SessionService},
    tool::Owner,
    util::{BoxFuture, LockExt},
};

/// The state of the plugin's process.
struct ChildState {
    file: PathBuf,
    host: PluginHost,
    runtime: Handle,
    peer: OnceLock<Arc<Peer>>,
    opened: Mutex<Option<CheckedLibrary>>,
    /// With `--read-only`: the file staged before the restriction, or why
    /// staging or the restriction failed.
    staged: Mutex<Option<std::result::Result<Staged, LoadError>>>,
    instance: Mutex<Option<Instance>>,
    hooks: Mutex<HashMap<u64, Arc<LocalHook>>>,
    hook_ids: AtomicU64,
}

/// What the host tells the plugin's process on its command line.
#[derive(Debug, Clone)]
pub(crate) struct ChildArgs {
    /// The plugin file.
    pub file: PathBuf,
    /// The host's data dir.
    pub data_dir: PathBuf,
    /// Load files others can write.
    pub allow_insecure: bool,
    /// Restrict this process with Landlock before opening the file.
    pub read_only: bool,
    /// With `read_only`: the one dir it may write in (the plugin's data
    /// dir); none at all without it.
    pub writable: Option<PathBuf>,
    /// With `read_only`: sockets may be opened (`network = "allow"`).
    pub network: bool,
    /// The host's log level (0 off ... 5 trace), which the plugin is told;
    /// this process's own otherwise.
    pub log_level: Option<u8>,
}

/// Runs the plugin's process until the host closes the channel. Started by
/// the host only; the channel is file descriptor 3.
pub(crate) fn run_child(args: ChildArgs) -> ExitCode {
    let ChildArgs {
        file,
        data_dir,
        allow_insecure,
        read_only,
        writable,
        network,
        log_level,
    } = args;
    crate::logging::init("warn");
    if let Some(level) = log_level {
        abi::forward_log_level(level);
    }
    let config = PluginHostConfig {
        dirs: Vec::new(),
        data_dir: data_dir.clone(),
        allow_insecure_permissions: allow_insecure,
        settings: Default::default(),
    };
    // Before any thread is started and before the library is opened: see
    // `harden.rs` and `sandbox.rs`. A failure is the answer to `open`.
    let staged = match harden::drop_capabilities() {
        Err(e) => Some(Err(host_error(&file, e))),
        Ok(()) => read_only.then(|| restrict(&config, &file, Sandbox { writable, network })),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("offstage plugin-host: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The channel's own thread (see `Peer::start`).
    let io = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("plugin-host-io")
        .enable_all()
        .build()
    {
        Ok(io) => io,
        Err(e) => {
            eprintln!("offstage plugin-host: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let io_handle = io.handle().clone();
    // SAFETY: the host passes our end of its socket pair as fd 3, ours alone.
    let socket = unsafe { std::os::unix::net::UnixStream::from_raw_fd(3) };
    if let Err(e) = socket.set_nonblocking(true) {
        eprintln!("offstage plugin-host: fd 3 is not the host's socket: {e}");
        return ExitCode::FAILURE;
    }
    runtime.block_on(async move {
        let registered = {
            let _io = io_handle.enter();
            tokio::net::UnixStream::from_std(socket)
        };
        let stream = match registered {
            Ok(stream) => stream,
            Err(e) => {
                eprintln!("offstage plugin-host: fd 3 is not the host's socket: {e}");
                return;
            }
        };
        // A stand-in service: nothing of it is consulted, the generation's
        // upstream sends everything to the host.
        let scratch = data_dir.join("plugin-host-scratch");
        let service = SessionService::new(ServiceConfig {
            data_dir: scratch,
            permissions: Vec::new(),
        });
        let host = PluginHost::for_child(service, config);
        let state = Arc::new(ChildState {
            file,
            host,
            runtime: Handle::current(),
            peer: OnceLock::new(),
            opened: Mutex::new(None),
            staged: Mutex::new(staged),
            instance: Mutex::new(None),
            hooks: Mutex::new(HashMap::new()),
            hook_ids: AtomicU64::new(1),
        });
        // The peer is set before the first request is read: the plugin's
        // code (run by `Open`) may log or call the host at once.
        let handler = |peer: &Arc<Peer>| -> Arc<dyn Handler> {
            let _ = state.peer.set(Arc::clone(peer));
            state.clone()
        };
        let (_peer, closed) = Peer::start(stream, handler, &io_handle, &Handle::current());
        let _ = closed.await;
    });
    // The host is gone or done with us: leave without running the plugin's
    // destructors (it was shut down, or it is not trusted to).
    std::process::exit(0)
}

/// Stages `file` (checks and private copy, held open), then restricts this
/// process to writing in `writable` only.
fn restrict(
    config: &PluginHostConfig,
    file: &std::path::Path,
    sandbox: Sandbox,
) -> std::result::Result<Staged, LoadError> {
    let staged = stage(config, file, |_| None)
        .map_err(|failure| failure.error)?
        .hold()
        .map_err(|e| host_error(file, format!("cannot hold the private copy: {e}")))?;
    if let Some(dir) = &sandbox.writable {
        // It must exist to be named in a rule (`Context::data_dir` makes
        // it the same way).
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(dir).map_err(|e| {
            host_error(
                file,
                format!("cannot create the plugin's data dir {}: {e}", dir.display()),
            )
        })?;
    }
    sandbox::restrict_self(&sandbox).map_err(|e| LoadError::NotEnforced {
        path: file.to_path_buf(),
        cause: e.to_string(),
    })?;
    Ok(staged)
}

/// A failure of this process's own, as the loader reports its own.
fn host_error(file: &std::path::Path, message: impl std::fmt::Display) -> LoadError {
    LoadError::Host {
        path: file.to_path_buf(),
        message: message.to_string(),
    }
}

impl ChildState {
    fn peer(&self) -> &Arc<Peer> {
        self.peer.get().expect("the peer is set before any request")
    }

    /// A failure of this process's own, as the loader reports its own.
    fn host_error(&self, message: impl std::fmt::Display) -> LoadError {
        host_error(&self.file, message)
    }

    fn open(&self) -> std::result::Result<String, LoadError> {
        let staged = self.staged.lock_unpoisoned().take();
        let opened = match staged {
            None => self.host.open(&self.file),
            Some(Ok(staged)) => self.host.open_staged(&self.file, staged),
            Some(Err(error)) => return Err(error),
        }
        .map_err(|failure| failure.error)?;
        let json = serde_json::to_string(&opened.manifest).map_err(|e| self.host_error(e))?;
        *self.opened.lock_unpoisoned() = Some(opened);
        Ok(json)
    }

    fn init(
        self: &Arc<Self>,
        name: String,
        generation: u64,
        options: String,
        previous_state: Option<String>,
        limits: (Option<u64>, Option<u64>),
    ) -> std::result::Result<String, LoadError> {
        let opened = self
            .opened
            .lock_unpoisoned()
            .take()
            .ok_or_else(|| self.host_error("init before open"))?;
        let Opened::Local(module) = opened.module else {
            return Err(self.host_error("nested isolation"));
        };
        apply_limits(limits).map_err(|e| self.host_error(e))?;
        let options = serde_json::from_str(&options).unwrap_or_default();
        let ctx = new_state(
            self.host.inner.service.clone(),
            self.runtime.clone(),
            Start {
                data_dir: self.host.inner.config.plugin_data_dir(&name),
                owner: Owner::Plugin {
                    name: name.clone(),
                    generation,
                },
                grants: BTreeSet::new(),
                options,
                previous_state,
                on_failure: Arc::new(|_| {}),
            },
        );
        let upstream: Arc<dyn Upstream> = self.clone();
        let _ = ctx.upstream.set(upstream);
        let context = abi::HostContext::new(&ctx);
        let instance = {
            let _entered = self.runtime.enter();
            abi::init(&self.file, &name, module, context)
        }?;
        *self.instance.lock_unpoisoned() = Some(instance);
        Ok(String::new())
    }

    fn hook(&self, hook: u64) -> Result<Arc<LocalHook>> {
        self.hooks
            .lock_unpoisoned()
            .get(&hook)
            .cloned()
            .ok_or_else(|| ServiceError::NotFound(format!("no hook {hook} in the plugin process")))
    }
}

fn instance_error(error: InstanceError) -> ServiceError {
    match error {
        InstanceError::Failed(message) => ServiceError::Plugin(message),
        InstanceError::Panicked => ServiceError::PluginPanic {
            plugin: None,
            message: "panicked in export_state or shutdown".into(),
        },
    }
}

/// The answer to `Open` and `Init`: the loader's own result, error
/// included, for the host to report as it reports its own (`Child::spawn`,
/// `Child::init` in `parent.rs`).
fn load_answer(result: std::result::Result<String, LoadError>) -> Result<String> {
    serde_json::to_string(&result).map_err(|e| ServiceError::Internal(e.to_string()))
}

/// Sets the process's own `RLIMIT_AS` and `RLIMIT_CPU` (before `init`).
fn apply_limits((memory, cpu): (Option<u64>, Option<u64>)) -> Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    for (resource, value, what) in [
        (Resource::As, memory, "memory_limit"),
        (Resource::Cpu, cpu, "cpu_limit"),
    ] {
        let Some(value) = value else { continue };
        let limit = Rlimit {
            current: Some(value),
            maximum: Some(value),
        };
        if let Err(error) = setrlimit(resource, limit) {
            return Err(ServiceError::Unsupported(format!(
                "cannot set {what}: {}",
                std::io::Error::from(error)
            )));
        }
    }
    Ok(())
}

impl Handler for ChildState {
    fn call(self: Arc<Self>, request: Request) -> BoxFuture<Result<String>> {
        Box::pin(async move {
            match request {
                Request::Open => {
                    let this = Arc::clone(&self);
                    let opened = tokio::task::spawn_blocking(move || this.open())
                        .await
                        .map_err(|e| ServiceError::Internal(format!("open: {e}")))?;
                    load_answer(opened)
                }
                Request::Init {
                    name,
                    generation,
                    options,
                    previous_state,
                    memory_limit,
                    cpu_limit,
                } => {
                    let this = Arc::clone(&self);
                    let initialised = tokio::task::spawn_blocking(move || {
                        this.init(
                            name,
                            generation,
                            options,
                            previous_state,
                            (memory_limit, cpu_limit),
                        )
                    })
                    .await
                    .map_err(|e| ServiceError::Internal(format!("init: {e}")))?;
                    load_answer(initialised)
                }
                Request::Invoke { hook, input } => self.hook(hook)?.invoke(input).await,
                Request::Wrap { hook, input, next } => {
                    let up: Arc<dyn NextUpstream> = self.clone();
                    self.hook(hook)?.wrap(input, forwarded_next(up, next)).await
                }
                Request::Export => {
                    // The lock is held while the plugin exports: a
                    // `Shutdown` meanwhile waits for the export to end.
                    let state = match &*self.instance.lock_unpoisoned() {
                        Some(instance) => instance.export_state().map_err(instance_error)?,
                        None => None,
                    };
                    serde_json::to_string(&state).map_err(|e| ServiceError::Internal(e.to_string()))
                }
                Request::Shutdown => {
                    let instance = self.instance.lock_unpoisoned().take();
                    self.hooks.lock_unpoisoned().clear();
                    if let Some(instance) = instance {
                        instance.shutdown().map_err(instance_error)?;
                    }
                    Ok(String::new())
                }
                Request::Ping => Ok(String::new()),
                other => Err(ServiceError::Unsupported(format!(
                    "the host cannot ask a plugin process for {other:?}"
                ))),
            }
        })
    }

    fn note(&self, note: Note) {
        if let Note::DropHook { hook } = note {
            self.hooks.lock_unpoisoned().remove(&hook);
        }
    }
}

impl Upstream for ChildState {
    fn session(&self, method: &'static str, args: String) -> BoxFuture<Result<String>> {
        self.peer().call(Request::Session {
            method: method.to_string(),
            args,
        })
    }

    fn register(&self, kind: HookKind, name: String, hook: LocalHook) -> Result<()> {
        let id = self.hook_ids.fetch_add(1, Ordering::Relaxed);
        self.hooks.lock_unpoisoned().insert(id, Arc::new(hook));
        let call = self.peer().call(Request::Register {
            kind,
            name,
            hook: id,
        });
        let result = block_on_host(&self.runtime, call).and_then(|r| r);
        if result.is_err() {
            self.hooks.lock_unpoisoned().remove(&id);
        }
        result.map(drop)
    }

    fn log(&self, level: u8, target: &str, message: &str) {
        self.peer().note(Note::Log {
            level,
            target: target.to_string(),
            message: message.to_string(),
        });
    }
}

impl NextUpstream for ChildState {
    fn next(&self, next: u64, input: String) -> BoxFuture<Result<String>> {
        self.peer().call(Request::Next { next, input })
    }

    fn drop_next(&self, next: u64) {
        self.peer().note(Note::DropNext { next });
    }

    fn runtime(&self) -> &Handle {
        &self.runtime
    }
}
