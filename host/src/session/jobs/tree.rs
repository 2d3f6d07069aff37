//! A job is its whole process tree: every process its command starts —
//! including ones that `setsid`, double-fork, `nohup` or daemonise away
//! from its process group — dies with the job. Linux only; unprivileged.
//!
//! How a process is known to belong to a job:
//!
//! - the host is a *child subreaper* (`PR_SET_CHILD_SUBREAPER`), so an
//!   orphaned descendant is re-parented to the host, never to init: no
//!   process a job starts leaves the host's subtree while the host lives;
//! - each job's command gets `OFFSTAGE_JOB=<marker>` in its environment,
//!   which every descendant inherits (a daemon keeps its environment);
//! - each scan of `/proc` records every process whose ancestry leads to the
//!   job's main process, so one that clears its environment is still
//!   known once seen.
//!
//! When a job ends (its main process exited and its output drained, or a
//! cancel, interrupt, session removal, timeout or shutdown dropped it), every
//! member still alive is sent SIGKILL, in rounds until none is left. A host
//! killed outright runs none of this: at the next start, restart recovery
//! kills every process that carries a marker of this data dir
//! ([`kill_marked`]). A process that both clears its environment and
//! detaches before any scan sees it cannot be attributed to a job (it
//! stays the host's child, and is left alone).
//!
//! Reaping: adopted orphans are the host's children. A plain thread
//! (`offstage-reaper`) scans every [`SCAN_EVERY`] while jobs run or killed
//! members are unreaped, and reaps, by pid, only zombies it attributed to a
//! job — never a job's main process (tokio waits for that one) and never
//! with `waitpid(-1)`, so no other child's exit status is stolen. With no
//! job tracked and nothing to reap it sleeps until a job is registered
//! (woken by [`JobTree::new`]) or a child of the host exits (SIGCHLD: a
//! zombie of a process no job claimed), with a sweep every
//! [`IDLE_SWEEP_EVERY`] as the fallback: an idle host does not scan
//! `/proc` five times a second.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Condvar, LazyLock, Mutex, OnceLock},
    time::Duration,
};

use crate::util::LockExt;

/// The environment variable that marks a job's processes.
pub(crate) const MARKER_VAR: &str = "OFFSTAGE_JOB";

/// How often the reaper thread scans while there is something to watch.
const SCAN_EVERY: Duration = Duration::from_millis(200);

/// How often the reaper thread sweeps while no job is tracked.
const IDLE_SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Kill rounds before giving up on a tree that keeps forking.
const MAX_ROUNDS: usize = 50;

/// `(pid, start time in clock ticks)`: a process, not just a reusable pid.
type ProcId = (i32, u64);

#[derive(Default)]
struct Registry {
    jobs: HashMap<String, Tracked>,
    /// Killed members that may still turn into the host's zombies.
    to_reap: HashSet<ProcId>,
    /// The main processes (so the process groups) of recent jobs, newest
    /// last: tokio's children, never reaped here.
    mains: std::collections::VecDeque<i32>,
}

/// How many recent jobs' main pids are remembered.
const RECENT_MAINS: usize = 4096;

#[derive(Default)]
struct Tracked {
    /// The job's main process (tokio's child); `None` until spawned.
    main: Option<i32>,
    /// Every process seen belonging to the job.
    members: HashSet<ProcId>,
    /// The job has ended: the reaper kills what is left, then forgets it.
    doomed: bool,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

/// Wakes the reaper thread when the registry stops being idle (the first
/// job after none).
static WAKE: Condvar = Condvar::new();

impl Registry {
    /// Whether the reaper has anything to watch: a tracked job or a
    /// killed member not reaped yet.
    fn busy(&self) -> bool {
        !self.jobs.is_empty() || !self.to_reap.is_empty()
    }
}

/// Makes this process a child subreaper and starts the reaper thread,
/// once. Returns whether the subreaper is set; the first call logs the
/// outcome (the host calls it at start-up).
pub(crate) fn init() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| {
        let subreaper = set_subreaper();
        if subreaper {
            tracing::info!(
                "job processes: the host is a child subreaper; each job's whole process tree \
                 (setsid and daemons included) is tracked through /proc and killed when the job ends"
            );
        } else {
            tracing::warn!(
                "job processes: cannot become a child subreaper; processes a job detaches are \
                 tracked only while their ancestry or {MARKER_VAR} marker can be seen"
            );
        }
        tracing::info!(
            "job processes: per-job cgroups are not used; tracking is by /proc scans only"
        );
        let _ = std::thread::Builder::new()
            .name("offstage-reaper".into())
            .spawn(reaper);
        wake_on_child_exit();
        subreaper
    })
}

/// While no job is tracked, a child's exit (SIGCHLD: an orphan no job
/// claimed has died) wakes the reaper at once instead of at its idle
/// sweep. Needs the runtime `init` is called in (the host's); without one
/// the sweep does it.
fn wake_on_child_exit() {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut exits) = signal(SignalKind::child()) else {
            return;
        };
        while exits.recv().await.is_some() {
            // While busy the reaper scans every tick anyway.
            if !REGISTRY.lock_unpoisoned().busy() {
                WAKE.notify_all();
            }
        }
    });
}

#[cfg(target_os = "linux")]
fn set_subreaper() -> bool {
    // SAFETY: a plain prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn set_subreaper() -> bool {
    false
}

/// One job's process tree, registered from before its command starts.
/// Dropping it kills the tree (see [`JobTree::finish`] for the awaited
/// form).
pub(crate) struct JobTree {
    marker: Arc<str>,
    finished: bool,
}

impl JobTree {
    /// Registers a job whose processes will carry `marker` in
    /// [`MARKER_VAR`].
    pub(crate) fn new(marker: String) -> JobTree {
        init();
        let mut registry = REGISTRY.lock_unpoisoned();
        let was_idle = !registry.busy();
        registry.jobs.insert(marker.clone(), Tracked::default());
        drop(registry);
        if was_idle {
            WAKE.notify_all();
        }
        JobTree {
            marker: marker.into(),
            finished: false,
        }
    }

    /// The marker value for the command's environment.
    pub(crate) fn marker(&self) -> &str {
        &self.marker
    }

    /// Records the job's main process, the tree's root.
    pub(crate) fn set_main(&self, pid: i32) {
        let mut registry = REGISTRY.lock_unpoisoned();
        if let Some(tracked) = registry.jobs.get_mut(&*self.marker) {
            tracked.main = Some(pid);
        }
        registry.mains.push_back(pid);
        if registry.mains.len() > RECENT_MAINS {
            registry.mains.pop_front();
        }
    }

    /// Kills every process of the tree still alive, once. Returns how many
    /// were found.
    pub(crate) fn kill_round(&self) -> usize {
        kill_round(&self.marker)
    }

    /// Kills the whole tree and waits until nothing of it is left alive
    /// (bounded: a tree that keeps forking is left to the reaper thread).
    pub(crate) async fn finish(mut self) {
        self.finished = true;
        doom(&self.marker);
        for _ in 0..MAX_ROUNDS {
            if kill_round(&self.marker) == 0 {
                forget(&self.marker);
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!(marker = %self.marker, "a job's processes keep forking; still killing them");
    }
}

impl Drop for JobTree {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // One round now; the reaper thread finishes the job.
        doom(&self.marker);
        if kill_round(&self.marker) == 0 {
            forget(&self.marker);
        }
    }
}

fn doom(marker: &str) {
    if let Some(tracked) = REGISTRY.lock_unpoisoned().jobs.get_mut(marker) {
        tracked.doomed = true;
    }
}

fn forget(marker: &str) {
    REGISTRY.lock_unpoisoned().jobs.remove(marker);
}

/// Scans, attributes, and sends SIGKILL to every live member of `marker`'s
/// job. Returns how many live members were found.
fn kill_round(marker: &str) -> usize {
    let attributed = fresh_attribution();
    let mut registry = REGISTRY.lock_unpoisoned();
    let main = registry.jobs.get(marker).and_then(|t| t.main);
    let mut found = 0;
    for proc in attributed.get(marker).into_iter().flatten() {
        if proc.zombie {
            continue;
        }
        found += 1;
        kill(proc.pid, proc.start);
        if Some(proc.pid) != main {
            registry.to_reap.insert((proc.pid, proc.start));
        }
    }
    found
}

/// Scans of `/proc` shared between kill rounds, like commits in a group:
/// a scan reads every process on the machine (milliseconds on a busy
/// one), and jobs ending together each need one. A round needs a scan
/// that *began* after it asked (so it sees every process alive then); one
/// scan begun after several rounds asked serves them all.
#[derive(Default)]
struct SharedScans {
    /// Scans begun so far; the one running, if any, is number `begun`.
    begun: u64,
    /// The number of the last scan finished, and its attribution.
    done: u64,
    result: Arc<HashMap<String, Vec<Proc>>>,
    running: bool,
}

static SCANS: LazyLock<(Mutex<SharedScans>, std::sync::Condvar)> = LazyLock::new(Default::default);

/// The attribution of a scan begun after this call: run by this thread,
/// or by another one that began it meanwhile.
fn fresh_attribution() -> Arc<HashMap<String, Vec<Proc>>> {
    let (lock, finished) = &*SCANS;
    let mut scans = lock.lock_unpoisoned();
    // Scan `begun` may have begun before this call: a later one is needed.
    let needed = scans.begun + 1;
    loop {
        if scans.done >= needed {
            return scans.result.clone();
        }
        if !scans.running {
            scans.running = true;
            scans.begun += 1;
            let number = scans.begun;
            drop(scans);
            // Should the scan panic, the others must not wait forever.
            let attributed = std::panic::catch_unwind(|| attribute(&scan()));
            scans = lock.lock_unpoisoned();
            scans.running = false;
            finished.notify_all();
            let attributed = match attributed {
                Ok(attributed) => Arc::new(attributed),
                Err(panic) => std::panic::resume_unwind(panic),
            };
            scans.running = false;
            scans.done = number;
            scans.result = attributed.clone();
            finished.notify_all();
            return attributed;
        }
        scans = finished.wait(scans).unwrap_or_else(|e| e.into_inner());
    }
}

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy)]
struct Proc {
    pid: i32,
    ppid: i32,
    pgrp: i32,
    session: i32,
    start: u64,
    zombie: bool,
}

fn read_stat(pid: i32) -> Option<Proc> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    Some(Proc {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
        zombie: matches!(state, 'Z' | 'X'),
    })
}

fn scan() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_stat)
        .collect()
}

/// The [`MARKER_VAR`] value in a process's environment, if it has one
/// (and `/proc` lets us read it: our own user's processes only).
fn marker_of(pid: i32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{MARKER_VAR}=");
    environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
}

/// The processes of each registered job, among the host's descendants,
/// recording new members as it goes.
fn attribute(procs: &[Proc]) -> HashMap<String, Vec<Proc>> {
    let host = std::process::id() as i32;
    let by_pid: HashMap<i32, &Proc> = procs.iter().map(|p| (p.pid, p)).collect();
    let mut registry = REGISTRY.lock_unpoisoned();
    let mains: HashMap<i32, String> = registry
        .jobs
        .iter()
        .filter_map(|(m, t)| Some((t.main?, m.clone())))
        .collect();
    let known: HashMap<ProcId, String> = registry
        .jobs
        .iter()
        .flat_map(|(m, t)| t.members.iter().map(move |id| (*id, m.clone())))
        .collect();
    let mut out: HashMap<String, Vec<Proc>> = HashMap::new();
    for proc in procs {
        // Walk up: a job's main process on the way, and the host at the end.
        let (mut current, mut via_main, mut under_host) = (proc.pid, None, false);
        for _ in 0..256 {
            if let Some(marker) = mains.get(&current) {
                via_main.get_or_insert_with(|| marker.clone());
            }
            if current == host {
                under_host = true;
                break;
            }
            match by_pid.get(&current) {
                Some(p) if p.ppid > 0 && p.ppid != current => current = p.ppid,
                _ => break,
            }
        }
        if !under_host || proc.pid == host {
            continue;
        }
        let marker = via_main
            .or_else(|| known.get(&(proc.pid, proc.start)).cloned())
            .or_else(|| marker_of(proc.pid).filter(|m| registry.jobs.contains_key(m)));
        if let Some(marker) = marker {
            if let Some(tracked) = registry.jobs.get_mut(&marker) {
                tracked.members.insert((proc.pid, proc.start));
            }
            out.entry(marker).or_default().push(*proc);
        }
    }
    out
}

/// SIGKILL to the process `pid` started at `start`, through a pidfd where
/// the kernel has them, so a reused pid is never hit.
fn kill(pid: i32, start: u64) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls; the fd is closed below.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        if fd >= 0 {
            if read_stat(pid).is_some_and(|p| p.start == start) {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd,
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
            libc::close(fd);
            return;
        }
    }
    if read_stat(pid).is_some_and(|p| p.start == start) {
        // SAFETY: a plain syscall on a pid checked just above.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// The reaper thread: records members while jobs run, finishes killing
/// ended jobs, and reaps the zombies the host adopted from them.
fn reaper() {
    loop {
        {
            // Every tick while a job is tracked (so a detaching process is
            // seen within one); asleep otherwise, until the next job or
            // the idle sweep. A wake-up before the tick scans early, which
            // only the idle-to-busy step causes.
            let registry = REGISTRY.lock_unpoisoned();
            let wait = if registry.busy() {
                SCAN_EVERY
            } else {
                IDLE_SWEEP_EVERY
            };
            drop(
                WAKE.wait_timeout(registry, wait)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
        }
        // Nothing to do before the first job.
        if REGISTRY.lock_unpoisoned().mains.is_empty() {
            continue;
        }
        let procs = scan();
        let attributed = attribute(&procs);
        let doomed: Vec<String> = REGISTRY
            .lock_unpoisoned()
            .jobs
            .iter()
            .filter(|(_, t)| t.doomed)
            .map(|(m, _)| m.clone())
            .collect();
        for marker in doomed {
            if kill_round(&marker) == 0 {
                forget(&marker);
            }
        }
        reap(&procs, &attributed);
    }
}

/// Reaps, by pid, the host's zombie children that belong (or belonged) to
/// a job, never a job's main process.
///
/// A zombie can no longer show its environment, so an orphan that died
/// before any scan saw it alive (the middle process of a double fork) is
/// known by where it lived: in a job's process group, or in a session
/// other than the host's (it called `setsid`). A child the host itself
/// started (a `cargo build` of `offstage dev`, a plugin's own command)
/// lives in the host's session and in no job's group, and is left to
/// whoever waits for it.
fn reap(procs: &[Proc], attributed: &HashMap<String, Vec<Proc>>) {
    let host = std::process::id() as i32;
    // SAFETY: a plain syscall.
    let host_session = unsafe { libc::getsid(0) };
    let by_pid: HashMap<i32, &Proc> = procs.iter().map(|p| (p.pid, p)).collect();
    let mut registry = REGISTRY.lock_unpoisoned();
    let recent_mains: HashSet<i32> = registry.mains.iter().copied().collect();
    let mut candidates: HashSet<ProcId> = registry.to_reap.clone();
    candidates.extend(
        procs
            .iter()
            .filter(|p| p.zombie && p.ppid == host && !recent_mains.contains(&p.pid))
            .filter(|p| recent_mains.contains(&p.pgrp) || p.session != host_session)
            .map(|p| (p.pid, p.start)),
    );
    for (marker, members) in attributed {
        let Some(main) = registry.jobs.get(marker).and_then(|t| t.main) else {
            continue; // not spawned yet: its zombie could be tokio's child
        };
        candidates.extend(
            members
                .iter()
                .filter(|p| p.pid != main)
                .map(|p| (p.pid, p.start)),
        );
    }
    let mut mains: HashSet<i32> = registry.jobs.values().filter_map(|t| t.main).collect();
    mains.extend(recent_mains);
    for (pid, start) in candidates {
        match by_pid.get(&pid) {
            Some(p) if p.start == start => {
                if p.zombie && p.ppid == host && !mains.contains(&pid) {
                    let mut status = 0;
                    // SAFETY: waits for one specific child, without blocking.
                    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                    registry.to_reap.remove(&(pid, start));
                }
            }
            // Gone (reaped by its own parent), or the pid is another process now.
            _ => {
                registry.to_reap.remove(&(pid, start));
            }
        }
    }
}

/// Kills every process, anywhere, whose [`MARKER_VAR`] starts with
/// `prefix`: what a killed host on the same data dir left running (restart
/// recovery, before any new job starts). Returns how many were killed.
pub(crate) fn kill_marked(prefix: &str) -> usize {
    let mut killed = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let victims: Vec<Proc> = scan()
            .into_iter()
            .filter(|p| !p.zombie)
            .filter(|p| marker_of(p.pid).is_some_and(|m| m.starts_with(prefix)))
            .collect();
        if victims.is_empty() {
            break;
        }
        for p in victims {
            kill(p.pid, p.start);
            killed.insert((p.pid, p.start));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    killed.len()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn marker_is_read_from_the_environment() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env(MARKER_VAR, "unit.marker.x")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // The environment is readable once the exec is done.
        let mut seen = None;
        for _ in 0..500 {
            seen = marker_of(pid);
            if seen.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(seen.as_deref(), Some("unit.marker.x"));
        assert_eq!(kill_marked("unit.marker."), 1);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    }
}
