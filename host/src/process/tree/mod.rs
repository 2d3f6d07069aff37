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
//! - each look at the processes (a *sighting*) records every process
//!   found below the job's main process, so one that clears its
//!   environment is still known once seen.
//!
//! When a job ends (its main process exited and its output drained, or a
//! cancel, interrupt, session removal, timeout or shutdown dropped it), every
//! member still alive is sent SIGKILL, in rounds until a round finds none
//! alive. A host killed outright runs none of this: at the next start,
//! restart recovery kills every process that carries a marker of this data
//! dir ([`kill_marked`]). A process that both clears its environment and
//! detaches before any sighting sees it cannot be attributed to a job (it
//! stays the host's child, and is left alone).
//!
//! The files: `proc.rs` reads `/proc`; `sighting.rs` takes a look at the
//! jobs' processes (walking down from the host, or scanning every
//! process); `kill.rs` ends a job's tree and, at restart, every marked
//! process; `reaper.rs` reaps the orphans the host adopts; `group.rs`
//! ends a process group the host started outside any job (an isolated
//! plugin's process and what it started).

mod group;
mod kill;
pub(crate) mod peer;
mod proc;
mod reaper;
mod sighting;
#[cfg(all(test, target_os = "linux"))]
mod tests;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fs::File,
    sync::{Arc, Condvar, LazyLock, Mutex, OnceLock},
    time::Duration,
};

pub(crate) use self::group::end_group;
pub(crate) use self::kill::kill_marked;
use self::kill::{doom, forget, kill_round};
pub(crate) use self::proc::read_stat;
use self::proc::{Proc, ProcPath};
use self::reaper::{left_a_job, reapable, reaper, still_zombie, wake_on_child_exit};
use self::sighting::Scope;
use crate::util::LockExt;

/// The environment variable that marks a job's processes.
pub(crate) const MARKER_VAR: &str = "OFFSTAGE_JOB";

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
    mains: VecDeque<i32>,
    /// Zombies the host adopted from jobs, by pid, with their start time:
    /// children only this module reaps (see [`Registry::adopt_zombies`]),
    /// so each stays the host's child, under the same pid, until it is
    /// reaped here — by the reaper's tick, or by the next kill round
    /// ([`Registry::reap_adopted`]), whichever comes first.
    adopted_zombies: HashMap<i32, u64>,
}

/// How many recent jobs' main pids are remembered.
const RECENT_MAINS: usize = 4096;

#[derive(Default)]
struct Tracked {
    /// The job's main process (tokio's child); `None` until spawned, and
    /// again once tokio has waited for it ([`JobTree::main_reaped`]).
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

    /// Which job each known process of the jobs in `scope` belongs to:
    /// by main pid, and by member seen before. A kill round's scope is
    /// its own job: it costs what that job has, not what every running
    /// job has.
    fn owners(&self, scope: Scope<'_>) -> (HashMap<i32, String>, HashMap<ProcId, String>) {
        let jobs: Vec<(&String, &Tracked)> = match scope {
            Scope::Every => self.jobs.iter().collect(),
            Scope::Job(marker) => self.jobs.get_key_value(marker).into_iter().collect(),
        };
        let mains = jobs
            .iter()
            .filter_map(|(m, t)| Some((t.main?, (*m).clone())))
            .collect();
        let known = jobs
            .iter()
            .flat_map(|(m, t)| t.members.iter().map(move |id| (*id, (*m).clone())))
            .collect();
        (mains, known)
    }

    /// Remembers the `zombies` (children of the host's main thread, each
    /// with whether the sighting found it a member of a job) that were
    /// adopted from jobs: the ones [`reap`] takes, that is not a job's main
    /// process (their spawns wait for those), and a member of a job, in a job's
    /// process group, or in a session other than the host's. Nobody else
    /// waits for such a child, and everything here that reaps one holds
    /// this lock, so from now until it is reaped under the lock it stays
    /// the host's zombie under the same pid.
    ///
    /// Each is read again first, under the lock: the sighting read it
    /// without the lock, and another thread may have reaped it since (then
    /// its pid is free, and may already be another child's).
    fn adopt_zombies(&mut self, zombies: &[(Proc, bool)]) {
        let new: Vec<&(Proc, bool)> = zombies
            .iter()
            .filter(|(z, _)| self.adopted_zombies.get(&z.pid) != Some(&z.start))
            .collect();
        if new.is_empty() {
            return;
        }
        let host_session = host_session();
        let mains = self.main_pids();
        for (zombie, member) in new {
            let ours = *member || left_a_job(zombie, &mains, host_session);
            if reapable(zombie, &mains) && ours && still_zombie(zombie) {
                self.adopted_zombies.insert(zombie.pid, zombie.start);
            }
        }
    }

    /// The jobs' main processes, running and recent: tokio's children,
    /// never reaped here (and their pids name the jobs' process groups).
    fn main_pids(&self) -> HashSet<i32> {
        let mut mains: HashSet<i32> = self.mains.iter().copied().collect();
        mains.extend(self.jobs.values().filter_map(|t| t.main));
        mains
    }

    /// Reaps every adopted zombie (see [`Registry::adopt_zombies`]).
    ///
    /// A kill round does this before it lists the host's children. When
    /// many jobs end at once (a cancel of all, a shutdown), each ended
    /// job's adopted processes die into that list, and the reaper, which
    /// runs below the others and ticks at most every [`SCAN_EVERY`], is
    /// far behind: every kill round then read every one of them (its
    /// `stat`, and the kernel walks the list from its start for each entry
    /// of the `children` file). 1,000 jobs cancelled made a million reads,
    /// seconds of CPU. Reaped here, the list holds what died since the
    /// last round.
    fn reap_adopted(&mut self) {
        for (pid, start) in std::mem::take(&mut self.adopted_zombies) {
            // Checked when adopted, under this lock, and only this lock's
            // holders reap it: still so. Read again all the same, since a
            // wrong pid here would take another child's exit status.
            if read_stat(pid).is_some_and(|p| p.start == start && p.zombie) {
                reap_child(pid);
            }
            self.to_reap.remove(&(pid, start));
        }
    }
}

/// The host's session id (its own process's), read from `/proc` the way
/// every other process's is, so the two compare alike.
///
/// Not `getsid(2)`: when the session's leader lives outside the host's pid
/// namespace (a container started under another session), the kernel
/// answers 0 there, and `rustix` asserts a pid is never 0.
fn host_session() -> i32 {
    read_stat(std::process::id() as i32).map_or(-1, |p| p.session)
}

/// Reaps child `pid`, if it has exited, without blocking: by pid only, so
/// no other child's exit status is taken.
fn reap_child(pid: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
    }
}

/// How a sighting finds the jobs' processes, decided once by [`init`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Finder {
    /// Down from the host through the kernel's child lists: costs what
    /// the jobs have.
    Children,
    /// Every process in `/proc`, each one's parents walked up: costs what
    /// the machine runs.
    EveryProcess,
}

static FINDER: OnceLock<Finder> = OnceLock::new();

fn finder() -> Finder {
    FINDER.get().copied().unwrap_or(Finder::EveryProcess)
}

/// Makes this process a child subreaper and starts the reaper thread,
/// once. Returns whether the subreaper is set; the first call logs the
/// outcome (the host calls it at start-up).
pub(crate) fn init() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| {
        let subreaper = set_subreaper();
        let host = std::process::id() as i32;
        let finder = if subreaper && child_lists_readable(host) {
            Finder::Children
        } else {
            Finder::EveryProcess
        };
        let _ = FINDER.set(finder);
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
        match finder {
            Finder::Children => tracing::info!(
                "job processes: per-job cgroups are not used; a job's processes are found through \
                 the kernel's child lists, down from the host"
            ),
            Finder::EveryProcess => tracing::info!(
                "job processes: per-job cgroups are not used, and the kernel lists no children \
                 (/proc/PID/task/TID/children); a job's processes are found by reading every \
                 process in /proc"
            ),
        }
        let _ = std::thread::Builder::new()
            .name("offstage-reaper".into())
            .spawn(reaper);
        wake_on_child_exit();
        subreaper
    })
}

/// Whether the kernel lists a task's children (`CONFIG_PROC_CHILDREN`).
fn child_lists_readable(host: i32) -> bool {
    let mut path = ProcPath::default();
    path.set(format_args!("/proc/{host}/task/{host}/children"))
        .and_then(|p| File::open(p).ok())
        .is_some()
}

#[cfg(target_os = "linux")]
fn set_subreaper() -> bool {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).is_ok()
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

    /// Says that the main process has been waited for: its pid may name
    /// another process from now on, and nothing can be its child any
    /// more, so the tree's looks stop reading it (one `/proc` read fewer
    /// in each kill round at the job's end). It stays among the recent
    /// main pids that the zombie rules leave to tokio.
    pub(crate) fn main_reaped(&self) {
        if let Some(tracked) = REGISTRY.lock_unpoisoned().jobs.get_mut(&*self.marker) {
            tracked.main = None;
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
