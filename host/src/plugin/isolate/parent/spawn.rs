//! Starting a plugin process: `offstage plugin-host` with its end of the
//! channel as fd 3, restricted from its first instruction when sandboxed;
//! then having it open its library (the loader's checks and the
//! manifest) and, once the host keeps it, run the plugin's `init`.
//!
//! [`Child::spawn`] reads as the list of its steps, each a function of its
//! own below (but the reaper's, `supervise::reap`).

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, RawFd},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock, Weak,
    },
    time::Duration,
};

use tokio::{runtime::Handle, sync::watch};

use super::{output, remote::Remote, serve::Forward, supervise, Link};
use crate::{
    error::Result,
    error::ServiceError,
    plugin::{
        abi::{block_on_host, remote::instance, HostContext, Instance, ManifestInfo},
        generation::GenerationState,
        isolate::{
            harden,
            wire::{Handler, Peer, Request},
            Sandbox,
        },
        LoadError, PluginHost, PluginHostConfig,
    },
    util::LockExt,
};

/// A started child that has opened its library, before `init`.
pub(in crate::plugin) struct Child {
    link: Arc<Link>,
    /// The manifest the child read.
    pub(in crate::plugin) manifest: ManifestInfo,
    consumed: bool,
}

impl Child {
    /// Starts `offstage plugin-host` for `path` and has it run the loader
    /// checks and read the manifest; restricted by `sandbox` from its start
    /// when given (`sandbox.rs`).
    pub(in crate::plugin) fn spawn(
        host: &PluginHost,
        path: &Path,
        sandbox: Option<&Sandbox>,
    ) -> std::result::Result<Child, LoadError> {
        let error = |message: String| LoadError::Isolated {
            path: path.to_path_buf(),
            message,
        };
        let runtime = Handle::try_current()
            .map_err(|_| error("plugins must be loaded inside a tokio runtime".into()))?;
        let exe = child_exe(host).map_err(error)?;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| error(format!("cannot make a socket pair: {e}")))?;
        let mut command = command(&exe, path, &host.inner.config, sandbox);
        pass_channel(&mut command, theirs.as_raw_fd());
        let mut process = command
            .spawn()
            .map_err(|e| error(format!("cannot start {}: {e}", exe.display())))?;
        drop(theirs);
        let pid = process.id().unwrap_or(0);
        let stream = channel_stream(ours, &runtime).map_err(error)?;
        let link = Link::start(stream, pid, &runtime, host);
        keep_output(&link, &mut process, &runtime);
        supervise::reap(&link, process, &runtime);
        let child = Child {
            link,
            manifest: ManifestInfo::default(),
            consumed: false,
        };
        child.open(host, path)
    }

    /// Has the started child run the loader checks and read the manifest;
    /// names its link after the plugin and gives it the plugin's settings.
    fn open(mut self, host: &PluginHost, path: &Path) -> std::result::Result<Child, LoadError> {
        let error = |message: String| LoadError::Isolated {
            path: path.to_path_buf(),
            message,
        };
        let opened = self.control(Request::Open, Duration::from_secs(30));
        let manifest: ManifestInfo = match opened {
            Ok(answer) => serde_json::from_str(&load_answer(&answer, path)??)
                .map_err(|e| error(format!("bad manifest from the plugin process: {e}")))?,
            Err(e) => return Err(error(self.open_error(e))),
        };
        let _ = self.link.name.set(manifest.name.clone());
        let _ = self
            .link
            .settings
            .set(host.inner.isolation.resolve(&manifest.name));
        self.manifest = manifest;
        Ok(self)
    }

    /// The child's process id.
    pub(in crate::plugin) fn pid(&self) -> u32 {
        self.link.pid
    }

    fn control(&self, request: Request, deadline: Duration) -> Result<String> {
        let call = self.link.peer.call(request);
        match block_on_host(&self.link.runtime, async move {
            tokio::time::timeout(deadline, call).await
        })? {
            Ok(result) => result,
            Err(_) => Err(ServiceError::Plugin(format!(
                "the plugin process did not answer within {}",
                humantime::format_duration(deadline)
            ))),
        }
    }

    fn open_error(&self, error: ServiceError) -> String {
        match error {
            ServiceError::PluginPanic { message, .. } => message,
            other => other.to_string(),
        }
    }

    /// Runs the plugin's `init` in the child as the generation behind
    /// `ctx` (`host_ctx` is its context as a plugin's `init` gets it): the
    /// child's registrations reach the host's registries through it
    /// (staged there until the commit). Returns the forwarding instance.
    pub(in crate::plugin) fn init(
        mut self,
        path: &Path,
        ctx: &Arc<GenerationState>,
        host_ctx: HostContext,
        options: String,
        previous_state: Option<String>,
    ) -> std::result::Result<Instance, LoadError> {
        let link = Arc::clone(&self.link);
        let _ = link.ctx.set((Arc::clone(ctx), host_ctx));
        let settings = link.settings().clone();
        *link.last_state.lock_unpoisoned() = previous_state.clone();
        let request = Request::Init {
            name: self.manifest.name.clone(),
            generation: match &ctx.owner {
                crate::tool::Owner::Plugin { generation, .. } => *generation,
                crate::tool::Owner::Host => 0,
            },
            options,
            previous_state,
            memory_limit: settings.memory_limit,
            cpu_limit: settings.cpu_limit,
        };
        match self.control(request, settings.control_timeout) {
            Ok(answer) => drop(load_answer(&answer, path)??),
            Err(e) => {
                return Err(LoadError::Isolated {
                    path: path.to_path_buf(),
                    message: self.open_error(e),
                })
            }
        }
        self.consumed = true;
        link.start_liveness();
        Ok(instance(Arc::new(Remote(link))))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.consumed {
            // Opened only (a probe for its name, a disabled plugin, a
            // failed `init`): the process is not needed.
            self.link.ending.store(true, Ordering::Release);
            self.link.kill();
        }
    }
}

/// Reads the child's answer to `Open` or `Init`: the loader's result there,
/// whose error is the host's to report as if it had loaded the file itself
/// (a truncated file, a layout mismatch or an `init` that failed read and
/// classify the same in both modes). The outer error: an unreadable answer.
fn load_answer(
    answer: &str,
    path: &Path,
) -> std::result::Result<std::result::Result<String, LoadError>, LoadError> {
    serde_json::from_str(answer).map_err(|e| LoadError::Isolated {
        path: path.to_path_buf(),
        message: format!("bad answer from the plugin process: {e}"),
    })
}

/// The binary to run as the child: the configured one, else this very
/// `offstage` (so that versions always match).
fn child_exe(host: &PluginHost) -> std::result::Result<PathBuf, String> {
    match &host.inner.isolation.child_exe {
        Some(exe) => Ok(exe.clone()),
        None => {
            std::env::current_exe().map_err(|e| format!("cannot find the offstage binary: {e}"))
        }
    }
}

/// `offstage plugin-host` for `path`, with the host's data dir and the
/// sandbox's restrictions as arguments; stdout and stderr piped (see
/// [`keep_output`]).
fn command(
    exe: &Path,
    path: &Path,
    config: &PluginHostConfig,
    sandbox: Option<&Sandbox>,
) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("plugin-host")
        .arg(path)
        .arg("--data-dir")
        .arg(&config.data_dir)
        // The plugin is told the host's log level, not the child's own.
        .arg("--log-level")
        .arg(crate::plugin::abi::own_log_level().to_string())
        .env_clear()
        .envs(harden::child_env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A process group of its own: a terminal's Ctrl+C (SIGINT to the
        // foreground group) reaches the host only, which then shuts the
        // plugin down in order; and the group is what ends with it.
        .process_group(0)
        .kill_on_drop(false);
    if config.allow_insecure_permissions {
        command.arg("--allow-insecure");
    }
    if let Some(sandbox) = sandbox {
        command.arg("--read-only");
        if let Some(dir) = &sandbox.writable {
            command.arg("--writable").arg(dir);
        }
        if sandbox.network {
            command.arg("--network");
        }
    }
    command
}

/// Has the child find its end of the channel, `their_fd`, as fd 3, and
/// never gain privileges.
fn pass_channel(command: &mut tokio::process::Command, their_fd: RawFd) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if their_fd == 3 {
                if libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(their_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The child never gains privileges (setuid, file caps).
            // (Not PR_SET_PDEATHSIG: it fires when the *thread* that
            // forked ends, and loads run on pool threads. The child
            // leaves when its channel closes, which the host's death
            // does too.)
            #[cfg(target_os = "linux")]
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The host's end of the channel, as a stream of `runtime`.
fn channel_stream(
    ours: std::os::unix::net::UnixStream,
    runtime: &Handle,
) -> std::result::Result<tokio::net::UnixStream, String> {
    ours.set_nonblocking(true)
        .map_err(|e| format!("socket: {e}"))?;
    let _entered = runtime.enter();
    tokio::net::UnixStream::from_std(ours).map_err(|e| format!("socket: {e}"))
}

impl Link {
    /// The link to the child `pid` over `stream`, its channel served on
    /// `runtime`; a channel that breaks while the process lives ends it.
    fn start(
        stream: tokio::net::UnixStream,
        pid: u32,
        runtime: &Handle,
        host: &PluginHost,
    ) -> Arc<Link> {
        Arc::new_cyclic(|weak: &Weak<Link>| {
            let handler: Arc<dyn Handler> = Arc::new(Forward(weak.clone()));
            let (peer, reader) = Peer::start(stream, |_| handler, runtime, runtime);
            let link = Link {
                name: OnceLock::new(),
                pid,
                peer,
                runtime: runtime.clone(),
                settings: OnceLock::new(),
                ctx: OnceLock::new(),
                hooks: Mutex::new(HashMap::new()),
                nexts: Mutex::new(HashMap::new()),
                next_ids: AtomicU64::new(1),
                last_state: Mutex::new(None),
                stderr: Mutex::new(output::Tail::default()),
                exited: watch::Sender::new(None),
                ending: AtomicBool::new(false),
                released: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                kill_cause: Mutex::new(None),
                host: Arc::downgrade(&host.inner),
            };
            // A channel that breaks while the process lives: end it.
            let weak = weak.clone();
            runtime.spawn(async move {
                let _ = reader.await;
                if let Some(link) = weak.upgrade() {
                    link.kill();
                }
            });
            link
        })
    }
}

/// Reads what the child writes to stdout and stderr (`output.rs`).
fn keep_output(link: &Arc<Link>, process: &mut tokio::process::Child, runtime: &Handle) {
    if let Some(stdout) = process.stdout.take() {
        runtime.spawn(output::drain(stdout, Arc::downgrade(link)));
    }
    if let Some(stderr) = process.stderr.take() {
        runtime.spawn(output::drain(stderr, Arc::downgrade(link)));
    }
}
