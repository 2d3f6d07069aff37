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
//!
//! The parts, each in its own file:
//!
//! - `spawn.rs`: starting the process ([`Child::spawn`]), having it open
//!   its library, then run `init`.
//! - `serve.rs`: what the child asks of the host over the channel.
//! - `remote.rs`: the forwarding ABI values the registries hold, whose
//!   calls go to the child.
//! - `output.rs`: reading what it writes to stdout and stderr, bounded.
//! - `supervise.rs`: reaping the process, liveness checks, death and
//!   restart by policy ([`Supervisor`]).
//!
//! This file holds what they share: the [`Link`] to one child process.

mod output;
mod remote;
mod serve;
mod spawn;
mod supervise;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock, Weak,
    },
    time::Duration,
};

use tokio::{runtime::Handle, sync::watch};

pub(in crate::plugin) use spawn::Child;
pub(in crate::plugin) use supervise::{retry_start, Supervisor};

use super::{
    wire::{HookKind, Peer},
    Resolved,
};
use crate::{
    error::Result,
    error::ServiceError,
    plugin::{
        abi::{remote::HeldNext, HostContext},
        generation::GenerationState,
        Inner,
    },
    util::BoxFuture,
};

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
    /// The last lines it wrote (`output.rs`).
    stderr: Mutex<output::Tail>,
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
            if let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
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
