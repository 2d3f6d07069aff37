//! What happens when a plugin process ends or stops answering: reaping it
//! and naming the cause, liveness checks, failing the generation and
//! restarting it by the plugin's policy ([`Supervisor`]).

use std::{
    collections::HashMap,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::runtime::Handle;

use super::Link;
use crate::{
    plugin::{
        isolate::{wire::Request, Isolation, Resolved, RestartPolicy},
        PluginHost, PluginStatus,
    },
    util::LockExt,
};

/// Waits for the child's end and reaps it, then ends its process group
/// (every process it started: killed, and those the host adopted reaped;
/// `process::tree::end_group`); then names the cause (one decided before
/// a kill, else the exit status in words, with the last lines it wrote),
/// fails every call in flight with it and, unless the host ended the
/// child on purpose, handles its death ([`Link::died`]).
pub(super) fn reap(link: &Arc<Link>, mut process: tokio::process::Child, runtime: &Handle) {
    let weak = Arc::downgrade(link);
    let group = link.pid as i32;
    runtime.spawn(async move {
        let status = process.wait().await;
        let _ = tokio::task::spawn_blocking(move || {
            crate::process::tree::end_group(group, GROUP_PATIENCE)
        })
        .await;
        let Some(link) = weak.upgrade() else { return };
        // Let the output readers catch the last lines.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut cause = match (link.kill_cause.lock_unpoisoned().take(), status) {
            (Some(cause), _) => cause,
            (None, Ok(status)) => describe(status),
            (None, Err(e)) => format!("cannot tell how it ended: {e}"),
        };
        let tail = link.stderr.lock_unpoisoned().joined();
        if !tail.is_empty() {
            cause.push_str("; last output: ");
            cause.push_str(&tail);
        }
        link.exited.send_replace(Some(cause.clone()));
        link.peer.close(link.failure(&cause));
        if !link.ending.load(Ordering::Acquire) {
            link.died(&cause);
        }
    });
}

/// How long the processes a dead plugin process started get to die.
const GROUP_PATIENCE: Duration = Duration::from_secs(5);

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

impl Link {
    /// Asks the child every `ping_interval` whether it answers, and keeps
    /// the state it exports (handed over if it dies); a child that does not
    /// answer within `ping_timeout` is killed (and so restarted by policy).
    pub(super) fn start_liveness(self: &Arc<Self>) {
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
        if settings.restart == RestartPolicy::Never
            || host.inner.supervisor.stopped.load(Ordering::Acquire)
        {
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
    /// Set at host shutdown: nothing is restarted after it.
    stopped: AtomicBool,
}

/// A start of the isolated plugin `name` from `path` whose process failed
/// or died while it opened or started the plugin: tried again by its
/// restart policy, as a death after the start would be. (A refusal or a
/// failed `init` is the plugin's answer, not retried, as in process.)
pub(in crate::plugin) fn retry_start(host: &PluginHost, path: &Path, name: &str) {
    let settings = host.inner.isolation.resolve(name);
    if settings.mode != Isolation::Process
        || settings.restart == RestartPolicy::Never
        || host.inner.supervisor.stopped.load(Ordering::Acquire)
    {
        return;
    }
    let Ok(runtime) = Handle::try_current() else {
        return;
    };
    let Some(attempt) = host.inner.supervisor.allow(name, &settings) else {
        tracing::error!(
            plugin = %name,
            "plugin process failed to start {} times within {}; it stays failed",
            settings.max_restarts + 1,
            humantime::format_duration(settings.restart_window)
        );
        return;
    };
    let backoff = Duration::from_millis(100 * (1 << attempt.min(6)));
    tracing::info!(plugin = %name, "plugin process failed to start; trying again in {}", humantime::format_duration(backoff));
    let (host, path) = (host.clone(), path.to_path_buf());
    runtime.spawn(async move {
        tokio::time::sleep(backoff).await;
        let still_failed = host
            .inner
            .state
            .lock_unpoisoned()
            .entries
            .iter()
            .any(|e| e.info.path == path && e.info.status == PluginStatus::Failed);
        if !still_failed || host.inner.supervisor.stopped.load(Ordering::Acquire) {
            return; // loaded, reloaded or removed meanwhile, or shut down
        }
        let _ = tokio::task::spawn_blocking(move || host.load_recorded(&path)).await;
    });
}

impl Supervisor {
    /// The host shuts down: nothing is restarted from now on.
    pub(in crate::plugin) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

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
