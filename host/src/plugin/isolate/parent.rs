//! The host's side of an isolated plugin: starting its process, serving
//! what the child asks for, the forwarding ABI values the registries hold,
//! and what happens when the process dies or stops answering.
//!
//! Death of the child (an abort, a signal, an exit, a kill after a missed
//! liveness check): every call in flight into it fails at once with a
//! plugin failure naming the cause (signal name or exit status, and the
//! last lines it wrote to stderr); the generation is marked failed like a
//! plugin that panicked, which unregisters its hooks; then, by the
//! plugin's restart policy, a new process is started as the next
//! generation (a reload) and handed the state the dead one last exported.

use std::{
    collections::{HashMap, VecDeque},
    os::fd::AsRawFd,
    path::Path,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock, Weak,
    },
    time::{Duration, Instant},
};

use tokio::{io::AsyncBufReadExt, runtime::Handle, sync::watch};

use super::{
    wire::{HookKind, Note, Peer, Request},
    Resolved, RestartPolicy, Sandbox,
};
use crate::{
    error::Result,
    error::ServiceError,
    plugin::{
        abi::{
            block_on_host,
            remote::{instance, Downstream, HeldNext},
            HostContext, Instance, ManifestInfo,
        },
        generation::GenerationState,
        Inner, LoadError, PluginHost,
    },
    util::{BoxFuture, LockExt},
};

/// Lines of a child's stderr kept for the cause of its death.
const STDERR_TAIL: usize = 8;

/// A started child that has opened its library, before `init`.
pub(in crate::plugin) struct Child {
    link: Arc<Link>,
    /// The manifest the child read.
    pub(in crate::plugin) manifest: ManifestInfo,
    consumed: bool,
}

/// Everything the host knows of one child process.
struct Link {
    name: OnceLock<String>,
    pid: u32,
    peer: Arc<Peer>,
    runtime: Handle,
    settings: OnceLock<Resolved>,
    /// The parent generation's context, once `init` is under way.
    ctx: OnceLock<(Arc<GenerationState>, HostContext)>,
    hooks: Mutex<HashMap<u64, HookKind>>,
    nexts: Mutex<HashMap<u64, HeldNext>>,
    next_ids: AtomicU64,
    last_state: Mutex<Option<String>>,
    stderr: Mutex<VecDeque<String>>,
    /// `Some(cause)` once the process has been reaped.
    exited: watch::Sender<Option<String>>,
    /// Set when the host ends the child on purpose (shutdown, drain).
    ending: AtomicBool,
    /// Set when the host let go of the plugin's instance: the child ends
    /// once no call into it is in flight (`in_flight`).
    released: AtomicBool,
    /// Tool, wrapper, agent and event calls into the child not yet
    /// answered. A call that started before the plugin was shut down or
    /// replaced finishes in its process, as it would in process.
    in_flight: AtomicUsize,
    /// A cause decided before the kill (a missed liveness check).
    kill_cause: Mutex<Option<String>>,
    host: Weak<Inner>,
}

impl Link {
    fn name(&self) -> &str {
        self.name.get().map(String::as_str).unwrap_or("?")
    }

    fn kill(&self) {
        // Only while not reaped: the pid is ours until then.
        if self.exited.borrow().is_none() {
            // SAFETY: sending a signal to a pid we spawned and have not reaped.
            unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        }
    }

    fn failure(&self, cause: &str) -> ServiceError {
        ServiceError::PluginPanic {
            plugin: Some(self.name().to_string()),
            message: format!("process died: {cause}"),
        }
    }

    fn host_ctx(&self) -> Result<HostContext> {
        self.ctx
            .get()
            .map(|(_, context)| *context)
            .ok_or_else(|| ServiceError::Plugin("the plugin is not initialised yet".into()))
    }

    async fn with_deadline(
        &self,
        deadline: Option<Duration>,
        what: &str,
        fut: BoxFuture<Result<String>>,
    ) -> Result<String> {
        match deadline {
            None => fut.await,
            Some(deadline) => tokio::time::timeout(deadline, fut)
                .await
                .unwrap_or_else(|_| {
                    Err(ServiceError::Plugin(format!(
                        "plugin `{}` did not answer {what} within {}",
                        self.name(),
                        humantime::format_duration(deadline)
                    )))
                }),
        }
    }

    /// A panic of the plugin's own (contained in the child) fails the
    /// plugin as in process (the host's adapter does that); its process is
    /// of no further use and is ended. Not restarted: as in process, a
    /// reload brings the plugin back.
    fn end_if_panicked(&self, result: Result<String>) -> Result<String> {
        if let Err(ServiceError::PluginPanic { plugin: None, .. }) = &result {
            self.ending.store(true, Ordering::Release);
            self.kill();
        }
        result
    }

    fn settings(&self) -> &Resolved {
        self.settings.get().expect("settings are set before init")
    }

    /// Counts a call into the child until the guard drops.
    fn call_in_flight(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self)
    }

    /// The host let go of the plugin: end the child now, or when the
    /// last call in flight into it ends.
    fn release(&self) {
        self.ending.store(true, Ordering::Release);
        self.released.store(true, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            self.kill();
        }
    }
}

/// A call into the child in flight; the last one after a release ends the
/// child.
struct InFlight<'a>(&'a Link);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let link = self.0;
        if link.in_flight.fetch_sub(1, Ordering::SeqCst) == 1
            && link.released.load(Ordering::SeqCst)
        {
            link.kill();
        }
    }
}

impl super::wire::Handler for Link {
    fn call(self: Arc<Self>, request: Request) -> BoxFuture<Result<String>> {
        Box::pin(async move {
            match request {
                Request::Session { method, args } => {
                    self.host_ctx()?.call_session(&method, args).await
                }
                Request::Register { kind, name, hook } => {
                    let ctx = self.host_ctx()?;
                    self.hooks.lock_unpoisoned().insert(hook, kind);
                    let link: Arc<dyn Downstream> = Arc::new(Remote(Arc::clone(&self)));
                    ctx.register_remote(kind, name, link, hook)
                        .map(|()| String::new())
                }
                Request::Next { next, input } => {
                    let held = self.nexts.lock_unpoisoned().remove(&next);
                    match held {
                        Some(held) => held.call(input).await,
                        None => Err(ServiceError::InvalidInput(
                            "a wrapper called its `next` twice or after it returned".into(),
                        )),
                    }
                }
                other => Err(ServiceError::Unsupported(format!(
                    "a plugin process cannot ask the host for {other:?}"
                ))),
            }
        })
    }

    fn note(&self, note: Note) {
        match note {
            Note::Log {
                level,
                target,
                message,
            } => {
                // Under `plugin::NAME`, as an in-process plugin's lines.
                crate::plugin::abi::emit_log(self.name(), level, &target, &message);
            }
            Note::DropNext { next } => {
                self.nexts.lock_unpoisoned().remove(&next);
            }
            Note::DropHook { .. } => {}
        }
    }
}

/// Takes the `next` of a finished or abandoned wrapper call back.
struct NextGuard<'a> {
    link: &'a Link,
    id: u64,
}

impl Drop for NextGuard<'_> {
    fn drop(&mut self) {
        self.link.nexts.lock_unpoisoned().remove(&self.id);
    }
}

/// A link as the forwarding ABI values hold it.
struct Remote(Arc<Link>);

impl Downstream for Remote {
    fn invoke(&self, hook: u64, input: String) -> BoxFuture<Result<String>> {
        let link = Arc::clone(&self.0);
        Box::pin(async move {
            let kind = link.hooks.lock_unpoisoned().get(&hook).copied();
            let (deadline, what) = match kind {
                Some(HookKind::Subscription) => (Some(link.settings().event_timeout), "an event"),
                Some(HookKind::Agent) => (link.settings().call_timeout, "an agent turn"),
                _ => (link.settings().call_timeout, "a tool call"),
            };
            let _in_flight = link.call_in_flight();
            let call = link.peer.call(Request::Invoke { hook, input });
            link.end_if_panicked(link.with_deadline(deadline, what, call).await)
        })
    }

    fn wrap(&self, hook: u64, input: String, next: HeldNext) -> BoxFuture<Result<String>> {
        let link = Arc::clone(&self.0);
        Box::pin(async move {
            let id = link.next_ids.fetch_add(1, Ordering::Relaxed);
            link.nexts.lock_unpoisoned().insert(id, next);
            let _guard = NextGuard { link: &link, id };
            let _in_flight = link.call_in_flight();
            let call = link.peer.call(Request::Wrap {
                hook,
                input,
                next: id,
            });
            let answered = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&answered);
            let call = Box::pin(async move {
                let result = call.await;
                flag.store(true, Ordering::SeqCst);
                result
            });
            let deadline = link.settings().call_timeout;
            let result = link.with_deadline(deadline, "a tool wrapper", call).await;
            // Given up on (past its deadline) or dead: the wrapper is lost,
            // and a call it started goes on without it (`tool::chain`).
            let dead = link.exited.borrow().is_some();
            if result.is_err() && (dead || !answered.load(Ordering::SeqCst)) {
                crate::tool::chain::note_wrapper_lost();
            }
            link.end_if_panicked(result)
        })
    }

    fn drop_hook(&self, hook: u64) {
        self.0.hooks.lock_unpoisoned().remove(&hook);
        self.0.peer.note(Note::DropHook { hook });
    }

    fn export(&self) -> Result<Option<String>> {
        if !self.0.peer.is_closed() {
            let call = self.0.peer.call(Request::Export);
            let deadline = self.0.settings().control_timeout;
            let exported = block_on_host(&self.0.runtime, async move {
                tokio::time::timeout(deadline, call).await
            })?;
            if let Ok(Ok(json)) = exported {
                let state: Option<String> = serde_json::from_str(&json)
                    .map_err(|e| ServiceError::Plugin(format!("bad exported state: {e}")))?;
                *self.0.last_state.lock_unpoisoned() = state.clone();
                return Ok(state);
            }
        }
        // Dead or not answering: what it exported last.
        Ok(self.0.last_state.lock_unpoisoned().clone())
    }

    fn shutdown(&self) -> Result<()> {
        self.0.ending.store(true, Ordering::Release);
        if self.0.peer.is_closed() {
            return Ok(());
        }
        let call = self.0.peer.call(Request::Shutdown);
        let deadline = self.0.settings().control_timeout;
        let done = block_on_host(&self.0.runtime, async move {
            tokio::time::timeout(deadline, call).await
        })?;
        match done {
            Ok(result) => result.map(drop),
            Err(_) => Err(ServiceError::Plugin(
                "shutdown did not answer in time".into(),
            )),
        }
    }

    fn release(&self) {
        self.0.release();
    }

    fn runtime(&self) -> &Handle {
        &self.0.runtime
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

/// Describes how a process ended, in words.
fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(signal) = status.signal() {
        let name = match signal {
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGABRT => "SIGABRT",
            libc::SIGKILL => "SIGKILL",
            libc::SIGBUS => "SIGBUS",
            libc::SIGILL => "SIGILL",
            libc::SIGFPE => "SIGFPE",
            libc::SIGTERM => "SIGTERM",
            libc::SIGXCPU => "SIGXCPU",
            libc::SIGTRAP => "SIGTRAP",
            _ => "",
        };
        let core = if status.core_dumped() {
            ", core dumped"
        } else {
            ""
        };
        if name.is_empty() {
            format!("killed by signal {signal}{core}")
        } else {
            format!("killed by signal {signal} ({name}){core}")
        }
    } else {
        match status.code() {
            Some(code) => format!("exited with status {code}"),
            None => "ended".to_string(),
        }
    }
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
        let config = &host.inner.config;
        let exe = match &host.inner.isolation.child_exe {
            Some(exe) => exe.clone(),
            None => std::env::current_exe()
                .map_err(|e| error(format!("cannot find the offstage binary: {e}")))?,
        };
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| error(format!("cannot make a socket pair: {e}")))?;
        let their_fd = theirs.as_raw_fd();
        let mut command = tokio::process::Command::new(&exe);
        command
            .arg("plugin-host")
            .arg(path)
            .arg("--data-dir")
            .arg(&config.data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        if config.allow_insecure_permissions {
            command.arg("--allow-insecure");
        }
        if let Some(sandbox) = sandbox {
            command.arg("--read-only");
            if let Some(dir) = &sandbox.writable {
                command.arg("--writable").arg(dir);
            }
        }
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
        let mut process = command
            .spawn()
            .map_err(|e| error(format!("cannot start {}: {e}", exe.display())))?;
        drop(theirs);
        let pid = process.id().unwrap_or(0);
        ours.set_nonblocking(true)
            .map_err(|e| error(format!("socket: {e}")))?;
        let stream = {
            let _entered = runtime.enter();
            tokio::net::UnixStream::from_std(ours).map_err(|e| error(format!("socket: {e}")))?
        };
        let link = Arc::new_cyclic(|weak: &Weak<Link>| {
            let handler: Arc<dyn super::wire::Handler> = Arc::new(Forward(weak.clone()));
            let (peer, reader) = Peer::start(stream, handler, &runtime, &runtime);
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
                stderr: Mutex::new(VecDeque::new()),
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
        });
        for output in [
            process
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            process
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ]
        .into_iter()
        .flatten()
        {
            let weak = Arc::downgrade(&link);
            runtime.spawn(async move {
                let mut lines = tokio::io::BufReader::new(output).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let Some(link) = weak.upgrade() else { break };
                    tracing::debug!(plugin = link.name(), pid = link.pid, "{line}");
                    let mut tail = link.stderr.lock_unpoisoned();
                    if tail.len() == STDERR_TAIL {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
            });
        }
        let weak = Arc::downgrade(&link);
        runtime.spawn(async move {
            let status = process.wait().await;
            let Some(link) = weak.upgrade() else { return };
            // Let the output readers catch the last lines.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut cause = match (link.kill_cause.lock_unpoisoned().take(), status) {
                (Some(cause), _) => cause,
                (None, Ok(status)) => describe(status),
                (None, Err(e)) => format!("cannot tell how it ended: {e}"),
            };
            let tail: Vec<String> = link.stderr.lock_unpoisoned().iter().cloned().collect();
            if !tail.is_empty() {
                cause.push_str("; last output: ");
                cause.push_str(&tail.join(" | "));
            }
            link.exited.send_replace(Some(cause.clone()));
            link.peer.close(link.failure(&cause));
            if !link.ending.load(Ordering::Acquire) {
                link.died(&cause);
            }
        });
        let mut child = Child {
            link,
            manifest: ManifestInfo::default(),
            consumed: false,
        };
        let opened = child.control(Request::Open, Duration::from_secs(30));
        let manifest: ManifestInfo = match opened {
            Ok(answer) => serde_json::from_str(&load_answer(&answer, path)??)
                .map_err(|e| error(format!("bad manifest from the plugin process: {e}")))?,
            Err(e) => return Err(error(child.open_error(e))),
        };
        let _ = child.link.name.set(manifest.name.clone());
        let _ = child
            .link
            .settings
            .set(host.inner.isolation.resolve(&manifest.name));
        child.manifest = manifest;
        Ok(child)
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

/// The handler of a link's channel; weak, so a link dies with its last
/// holder rather than with its reader.
struct Forward(Weak<Link>);

impl super::wire::Handler for Forward {
    fn call(self: Arc<Self>, request: Request) -> BoxFuture<Result<String>> {
        match self.0.upgrade() {
            Some(link) => link.call(request),
            None => Box::pin(async { Err(ServiceError::Plugin("the plugin is gone".into())) }),
        }
    }

    fn note(&self, note: Note) {
        if let Some(link) = self.0.upgrade() {
            super::wire::Handler::note(&*link, note);
        }
    }
}

impl Link {
    /// Asks the child every `ping_interval` whether it answers, and keeps
    /// the state it exports (handed over if it dies); a child that does not
    /// answer within `ping_timeout` is killed (and so restarted by policy).
    fn start_liveness(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let (interval, timeout) = (self.settings().ping_interval, self.settings().ping_timeout);
        let mut exited = self.exited.subscribe();
        self.runtime.spawn(async move {
            loop {
                tokio::select! {
                    _ = exited.wait_for(|e| e.is_some()) => return,
                    _ = tokio::time::sleep(interval) => {}
                }
                let Some(link) = weak.upgrade() else { return };
                if link.ending.load(Ordering::Acquire) || link.peer.is_closed() {
                    return;
                }
                let ping = link.peer.call(Request::Ping);
                match tokio::time::timeout(timeout, ping).await {
                    Ok(Ok(_)) => {
                        let export = link.peer.call(Request::Export);
                        if let Ok(Ok(Ok(json))) = tokio::time::timeout(timeout, export)
                            .await
                            .map(|r| r.map(|json| serde_json::from_str::<Option<String>>(&json)))
                        {
                            *link.last_state.lock_unpoisoned() = json;
                        }
                    }
                    Ok(Err(_)) => return,
                    Err(_) => {
                        *link.kill_cause.lock_unpoisoned() = Some(format!(
                            "stopped answering (no reply to a liveness check within {}); killed",
                            humantime::format_duration(timeout)
                        ));
                        link.kill();
                        return;
                    }
                }
            }
        });
    }

    /// The child died on its own: fail the generation, restart by policy.
    fn died(self: &Arc<Self>, cause: &str) {
        let Some((ctx, _)) = self.ctx.get() else {
            return; // still opening: the caller sees the error
        };
        if ctx.has_failed() {
            return;
        }
        let message = self.failure(cause).to_string();
        ctx.fail(message);
        let Some(inner) = self.host.upgrade() else {
            return;
        };
        let host = PluginHost { inner };
        let name = self.name().to_string();
        let settings = self.settings().clone();
        if settings.restart == RestartPolicy::Never {
            tracing::warn!(plugin = %name, "plugin process died; restart = \"never\", it stays failed");
            return;
        }
        let Some(attempt) = host.inner.supervisor.allow(&name, &settings) else {
            tracing::error!(
                plugin = %name,
                "plugin process died {} times within {}; it stays failed",
                settings.max_restarts + 1,
                humantime::format_duration(settings.restart_window)
            );
            return;
        };
        let backoff = Duration::from_millis(100 * (1 << attempt.min(6)));
        self.runtime.spawn(async move {
            tokio::time::sleep(backoff).await;
            let restarted = tokio::task::spawn_blocking(move || host.reload(&name).map(|i| (name, i))).await;
            match restarted {
                Ok(Ok((name, info))) => tracing::info!(plugin = %name, generation = info.generation, pid = ?info.pid, "plugin process restarted"),
                Ok(Err(error)) => tracing::error!(%error, "plugin process could not be restarted"),
                Err(error) => tracing::error!(%error, "plugin restart panicked"),
            }
        });
    }
}

/// Restarts of isolated plugins, per name, to hold each to its policy.
#[derive(Default)]
pub(in crate::plugin) struct Supervisor {
    restarts: Mutex<HashMap<String, Vec<Instant>>>,
}

impl Supervisor {
    /// Records a restart of `name` if its policy allows one now; returns
    /// how many it had in the window before this one.
    fn allow(&self, name: &str, settings: &Resolved) -> Option<u32> {
        let mut restarts = self.restarts.lock_unpoisoned();
        let times = restarts.entry(name.to_string()).or_default();
        let now = Instant::now();
        times.retain(|t| now.duration_since(*t) < settings.restart_window);
        if times.len() as u32 >= settings.max_restarts {
            return None;
        }
        times.push(now);
        Some(times.len() as u32 - 1)
    }
}
