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
//! # A sighting walks down from the host, not across the machine
//!
//! Every job end needs a sighting of that job's live processes, and every
//! reaper tick while jobs run one of every job's. Reading every process on
//! the machine (`/proc/*/stat`, ~150–500 of them on a shared build
//! machine) and walking each one's parents up to the host cost a third of
//! a shell call's time. Where the host is a subreaper and the kernel lists
//! each task's children (`/proc/PID/task/TID/children`,
//! `CONFIG_PROC_CHILDREN`, on in mainstream distribution kernels), a
//! sighting instead walks *down* ([`Finder::Children`]): the jobs' main
//! processes (known by pid) and the orphans the host adopted (all listed
//! by its main thread: the kernel gives an orphan to the subreaper's first
//! live thread); of those, the ones that belong to a job in the sighting's
//! scope (a main process, a member seen before, or the marker in its
//! environment); and everything below those. A job end looks at its own
//! job only. It reads what the jobs have — for a job of `true` that has
//! ended, one small read (the host's child list). It finds what the scan
//! found, because:
//!
//! - every process of a job is a descendant of the host (an orphan goes to
//!   its nearest subreaper ancestor, the host), so it is below one of the
//!   host's children: the walk up that the scan did and the walk down
//!   follow the same parent links;
//! - a child list read while children are being reaped can skip one (the
//!   kernel resumes a list by position when the child it stopped at has
//!   left it). Every listed child's `stat` is read after the list; a list
//!   holding a child that has gone or moved to another parent meanwhile —
//!   what a skip needs — is read again, and after a few unsettled reads the
//!   sighting falls back to the whole-machine scan;
//! - a process re-parented to the host while the sighting walked (its
//!   parent died meanwhile) is found by listing the host's children again
//!   after the walk, until no new one shows (a sighting that found nothing
//!   to walk into lists them once: only a process walked into can hand
//!   children up meanwhile). The kernel re-parents a dying
//!   process's children before the process shows as a zombie, so a kill
//!   round that saw every member dead has seen, in its last listing,
//!   everything they handed over.
//!
//! Without a subreaper or child lists ([`Finder::EveryProcess`]) a
//! sighting reads every process and walks each one's parents, as before.
//! Either way `/proc/PID/stat` is read into a stack buffer and parsed in
//! place, with no allocation per process; jobs ending together share one
//! sighting begun after each asked, and the reaper takes one per tick for
//! everything it does.
//!
//! Considered and not taken: reading only the pids handed out since a job
//! started (pids are allocated in order) is sound only while the pid
//! counter cannot wrap between two looks, and a machine with the default
//! 32 768 pids running builds can wrap within seconds; per-job cgroups
//! need a cgroup the host owns, and it does not own one.
//!
//! # Reaping
//!
//! Adopted orphans are the host's children. A plain thread
//! (`offstage-reaper`) takes a sighting every [`SCAN_EVERY`] while jobs run
//! or killed members are unreaped, and reaps, by pid, only zombies it
//! attributed to a job — never a job's main process (its spawn waits for that
//! one) and never with `waitpid(-1)`, so no other child's exit status is
//! stolen. With no job tracked and nothing to reap it sleeps until a job
//! is registered (woken by [`JobTree::new`]) or a child of the host exits
//! (SIGCHLD: a zombie of a process no job claimed), with a sweep every
//! [`IDLE_SWEEP_EVERY`] as the fallback: an idle host does not look at
//! `/proc` five times a second. A job's first look is a tick after it
//! registered (a look at once would come before its command started).
//!
//! A kill round reaps too, before it lists the host's children: the
//! zombies that sightings found there and attributed to jobs (by the same
//! rules the reaper uses; see `Registry::adopt_zombies`). When many jobs
//! end at once (a cancel of all, a shutdown) every ended job's orphans die
//! into that one list faster than the reaper's ticks empty it, and each
//! kill round would read them all: a cancel of 1,000 jobs made about a
//! million `/proc` reads. A kill round also builds its owners' maps from
//! its own job only, not from every job running.
//!
//! The reaper is housekeeping, and a sighting of many running jobs is
//! not cheap (a thousand jobs: ~40 ms of `/proc` reads). So its thread
//! runs at a lower priority ([`REAPER_NICE`]), and its ticks are spaced
//! [`TICK_PER_SIGHTING`] times its last sighting's length when that is
//! longer than [`SCAN_EVERY`]: it never holds more than a tenth of a
//! core, and a move's commit or a job's end does not wait for it.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fs::File,
    io::{Read, Write},
    sync::{Arc, Condvar, LazyLock, Mutex, OnceLock},
    time::Duration,
};

use crate::util::LockExt;

/// The environment variable that marks a job's processes.
pub(crate) const MARKER_VAR: &str = "OFFSTAGE_JOB";

/// How often the reaper thread looks while there is something to watch,
/// at most.
const SCAN_EVERY: Duration = Duration::from_millis(200);

/// The reaper's ticks are at least this many times as far apart as its
/// last sighting took: a sighting costs what the jobs have (a thousand
/// running jobs, ~40 ms of reads), and the reaper is housekeeping — it
/// must not take a core from the jobs and the commits.
const TICK_PER_SIGHTING: u32 = 10;

/// How far the reaper thread's nice value is above the host's (capped at
/// 19, the lowest priority): below the host's other threads, so that a
/// sighting that does run gives way to a move's commit and the callers it
/// releases. Relative, so that a host started under `nice` keeps it.
const REAPER_NICE: libc::c_int = 10;

/// How often the reaper thread sweeps while no job is tracked.
const IDLE_SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Kill rounds before giving up on a tree that keeps forking.
const MAX_ROUNDS: usize = 50;

/// Reads of one child list before a sighting gives up on it (children
/// kept leaving it while it was read) and scans every process instead.
const LIST_TRIES: usize = 4;

/// Listings of the host's children per sighting before it gives up on
/// them settling (orphans kept arriving) and scans every process instead.
const HOST_LISTINGS: usize = 8;

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
        // SAFETY: a plain syscall.
        let host_session = unsafe { libc::getsid(0) };
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
                let mut status = 0;
                // SAFETY: waits for one specific child, without blocking.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            }
            self.to_reap.remove(&(pid, start));
        }
    }
}

/// Whether `proc`, as read, is a zombie this module may reap: the host's
/// child and not a job's main process (see [`Registry::main_pids`]).
fn reapable(proc: &Proc, mains: &HashSet<i32>) -> bool {
    proc.zombie && proc.ppid == std::process::id() as i32 && !mains.contains(&proc.pid)
}

/// Whether `proc` is known by where it lived to have left a job: in a
/// job's process group, or in a session other than the host's (it called
/// `setsid`). A child the host itself started (a `cargo build` of
/// `offstage dev`, a plugin's own process) lives in the host's session
/// and in no job's group.
fn left_a_job(proc: &Proc, mains: &HashSet<i32>, host_session: i32) -> bool {
    mains.contains(&proc.pgrp) || proc.session != host_session
}

/// Whether `zombie` is, read now, still that zombie and the host's child.
/// Called with the registry locked, this makes it safe to reap by pid:
/// only the lock's holders reap the zombies this module attributes.
fn still_zombie(zombie: &Proc) -> bool {
    let host = std::process::id() as i32;
    read_stat(zombie.pid)
        .is_some_and(|now| now.start == zombie.start && now.zombie && now.ppid == host)
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
            // While busy the reaper looks every tick anyway.
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

fn doom(marker: &str) {
    if let Some(tracked) = REGISTRY.lock_unpoisoned().jobs.get_mut(marker) {
        tracked.doomed = true;
    }
}

fn forget(marker: &str) {
    REGISTRY.lock_unpoisoned().jobs.remove(marker);
}

/// Takes a sighting begun after this call, and sends SIGKILL to every
/// live member of `marker`'s job in it. Returns how many live members
/// were found.
///
/// Walking down, the sighting is of this job alone: cheap enough to take
/// for each round. The whole-machine scan is shared with the rounds that
/// asked meanwhile ([`fresh_sighting`]).
fn kill_round(marker: &str) -> usize {
    if finder() == Finder::Children {
        if let Some(sighting) = walk_down(Scope::Job(marker)) {
            return kill_seen(marker, &sighting);
        }
    }
    kill_seen(marker, &fresh_sighting())
}

/// Sends SIGKILL to every live member of `marker`'s job in `sighting`.
/// Returns how many were found.
fn kill_seen(marker: &str, sighting: &Sighting) -> usize {
    let mut registry = REGISTRY.lock_unpoisoned();
    let main = registry.jobs.get(marker).and_then(|t| t.main);
    let mut found = 0;
    for proc in sighting.jobs.get(marker).into_iter().flatten() {
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

/// One look at the processes: each registered job's processes, and every
/// process read on the way (the host's own children among them, which is
/// what the reaper needs).
#[derive(Default)]
struct Sighting {
    jobs: HashMap<String, Vec<Proc>>,
    procs: HashMap<i32, Proc>,
}

/// Sightings shared between kill rounds, like commits in a group: jobs
/// ending together each need one. A round needs a sighting that *began*
/// after it asked (so it sees every process alive then); one begun after
/// several rounds asked serves them all.
#[derive(Default)]
struct SharedSightings {
    /// Sightings begun so far; the one running, if any, is number `begun`.
    begun: u64,
    /// The number of the last sighting finished, and the sighting.
    done: u64,
    result: Arc<Sighting>,
    running: bool,
}

static SIGHTINGS: LazyLock<(Mutex<SharedSightings>, Condvar)> = LazyLock::new(Default::default);

/// A sighting begun after this call: taken by this thread, or by another
/// one that began it meanwhile.
fn fresh_sighting() -> Arc<Sighting> {
    let (lock, finished) = &*SIGHTINGS;
    let mut shared = lock.lock_unpoisoned();
    // Sighting `begun` may have begun before this call: a later one is needed.
    let needed = shared.begun + 1;
    loop {
        if shared.done >= needed {
            return shared.result.clone();
        }
        if !shared.running {
            shared.running = true;
            shared.begun += 1;
            let number = shared.begun;
            drop(shared);
            // Should it panic, the others must not wait forever.
            let sighting = std::panic::catch_unwind(look);
            shared = lock.lock_unpoisoned();
            shared.running = false;
            finished.notify_all();
            let sighting = match sighting {
                Ok(sighting) => Arc::new(sighting),
                Err(panic) => std::panic::resume_unwind(panic),
            };
            shared.done = number;
            shared.result = sighting.clone();
            return sighting;
        }
        shared = finished.wait(shared).unwrap_or_else(|e| e.into_inner());
    }
}

/// Takes a sighting with the host's [`Finder`], and records the members
/// it found.
fn look() -> Sighting {
    if finder() == Finder::Children {
        if let Some(sighting) = walk_down(Scope::Every) {
            return sighting;
        }
        tracing::debug!("job processes: child lists kept changing; reading every process");
    }
    let procs = scan();
    let jobs = attribute(&procs);
    Sighting {
        jobs,
        procs: procs.into_iter().map(|p| (p.pid, p)).collect(),
    }
}

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    pub(crate) pgrp: i32,
    pub(crate) session: i32,
    /// Start time in clock ticks since boot: with the pid, the process.
    pub(crate) start: u64,
    /// Its threads, when read (a task's children hang off the thread
    /// that started them).
    threads: u32,
    /// Dead and not reaped yet (`Z`), or being torn down (`X`).
    pub(crate) zombie: bool,
}

/// `/proc/...` paths, built on the stack.
struct ProcPath {
    bytes: [u8; 64],
}

impl Default for ProcPath {
    fn default() -> Self {
        ProcPath { bytes: [0; 64] }
    }
}

impl ProcPath {
    fn set(&mut self, args: std::fmt::Arguments<'_>) -> Option<&str> {
        let mut cursor = std::io::Cursor::new(&mut self.bytes[..]);
        cursor.write_fmt(args).ok()?;
        let len = usize::try_from(cursor.position()).ok()?;
        std::str::from_utf8(&self.bytes[..len]).ok()
    }
}

/// Reads `/proc/PID/stat`, into a stack buffer: no allocation. `None` if
/// the process is gone (or `/proc` cannot say).
pub(crate) fn read_stat(pid: i32) -> Option<Proc> {
    let mut path = ProcPath::default();
    let mut file = File::open(path.set(format_args!("/proc/{pid}/stat"))?).ok()?;
    // 52 numeric fields and a name of at most 64 bytes fit with room.
    let mut buffer = [0u8; 2048];
    let mut len = 0;
    loop {
        match file.read(&mut buffer[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len == buffer.len() {
                    return None;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    parse_stat(pid, &buffer[..len])
}

/// `pid (comm) state ppid pgrp session ...`: the name may hold spaces and
/// parentheses, so the fields start after the last `)`.
fn parse_stat(pid: i32, text: &[u8]) -> Option<Proc> {
    let close = text.iter().rposition(|b| *b == b')')?;
    let mut fields = text[close + 1..]
        .split(|b| *b == b' ' || *b == b'\n')
        .filter(|f| !f.is_empty());
    // Field N of proc(5) is the (N - 3)th after the name.
    let mut next = |skip: usize| fields.nth(skip);
    let state = *next(0)?.first()?;
    let ppid = number(next(0)?)?;
    let pgrp = number(next(0)?)?;
    let session = number(next(0)?)?;
    let threads = number(next(13)?)?; // field 20
    let start = number(next(1)?)?; // field 22
    Some(Proc {
        pid,
        ppid,
        pgrp,
        session,
        start,
        threads,
        zombie: matches!(state, b'Z' | b'X'),
    })
}

fn number<T: std::str::FromStr>(field: &[u8]) -> Option<T> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// Reads a `/proc` file to its end into `buffer`. Not `File::read_to_end`
/// or `fs::read`: they ask the file's size first (`statx`, `lseek`), two
/// more syscalls per file that `/proc` answers with 0 anyway, and a
/// sighting reads a few such files per job end.
fn read_proc_file(file: File, buffer: &mut Vec<u8>) -> std::io::Result<usize> {
    // `Take` has no size hint, so the read loop reads without asking.
    file.take(u64::MAX).read_to_end(buffer)
}

/// Reads the host main thread's child list into `buffer` through one
/// descriptor opened once: every kill round reads this list, and opening
/// a `/proc` file (five path components, two pid lookups) cost more than
/// reading it. A read from offset 0 starts the kernel's listing afresh
/// (`seq_file`), so each read is a new look; one reader at a time, so a
/// list longer than one read is read in one pass, as through a descriptor
/// of its own. `false` if it cannot be read.
fn read_host_children(buffer: &mut Vec<u8>) -> bool {
    use std::os::unix::fs::FileExt;
    static FILE: OnceLock<Option<Mutex<File>>> = OnceLock::new();
    let Some(file) = FILE
        .get_or_init(|| {
            let host = std::process::id();
            File::open(format!("/proc/{host}/task/{host}/children"))
                .ok()
                .map(Mutex::new)
        })
        .as_ref()
    else {
        return false;
    };
    let file = file.lock_unpoisoned();
    buffer.clear();
    let mut chunk = [0u8; 4096];
    loop {
        match file.read_at(&mut chunk, buffer.len() as u64) {
            Ok(0) => return true,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Lists a process's children, from each of its threads, into `pids`.
/// A process that is gone has none. Reuses `buffer` for the reads.
fn list_children(pid: i32, threads: u32, buffer: &mut Vec<u8>, pids: &mut Vec<i32>) {
    pids.clear();
    if pid == std::process::id() as i32 && threads == 1 && read_host_children(buffer) {
        pids.extend(
            buffer
                .split(|b| *b == b' ' || *b == b'\n')
                .filter_map(number::<i32>),
        );
        return;
    }
    let mut path = ProcPath::default();
    let mut read_thread = |tid: i32, pids: &mut Vec<i32>| {
        let Some(path) = path.set(format_args!("/proc/{pid}/task/{tid}/children")) else {
            return;
        };
        let Ok(file) = File::open(path) else {
            return;
        };
        buffer.clear();
        if read_proc_file(file, buffer).is_err() {
            return;
        }
        pids.extend(
            buffer
                .split(|b| *b == b' ' || *b == b'\n')
                .filter_map(number::<i32>),
        );
    };
    if threads == 1 {
        read_thread(pid, pids);
        return;
    }
    let mut path = ProcPath::default();
    let Some(dir) = path.set(format_args!("/proc/{pid}/task")) else {
        return;
    };
    let Ok(dir) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in dir.flatten() {
        if let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) {
            read_thread(tid, pids);
        }
    }
}

/// A process's children with their `stat`, read so that none was
/// skipped: every listed child must still be there, and still this
/// parent's, once the list is read (see the module doc). `None` if the
/// list did not settle in [`LIST_TRIES`] reads.
fn settled_children(
    parent: i32,
    threads: u32,
    buffer: &mut Vec<u8>,
    pids: &mut Vec<i32>,
) -> Option<Vec<Proc>> {
    for _ in 0..LIST_TRIES {
        list_children(parent, threads, buffer, pids);
        let children: Vec<Proc> = pids
            .iter()
            .filter_map(|pid| read_stat(*pid))
            .filter(|child| child.ppid == parent)
            .collect();
        if children.len() == pids.len() {
            return Some(children);
        }
    }
    None
}

/// The jobs a sighting looks for.
#[derive(Debug, Clone, Copy)]
enum Scope<'a> {
    /// Every registered job (the reaper's tick).
    Every,
    /// One job (its kill round): the others' trees are not walked.
    Job(&'a str),
}

/// A sighting down from the host ([`Finder::Children`]) of the jobs in
/// `scope`, recording the members it finds. `None` if a child list did
/// not settle: the caller reads every process instead.
///
/// The host's children it reads are the jobs' main processes (by pid:
/// each hangs off the thread that spawned it) and the host's *main
/// thread's* child list: the kernel hands an orphan to the first live
/// thread of its subreaper (`find_new_reaper` → `find_alive_thread`),
/// which is the main thread for as long as the process lives. Other
/// threads' lists hold only children the host started itself (main
/// processes, plugin processes, builds), so they are not read: a look at
/// a job that has ended costs a few small reads, not two per thread.
fn walk_down(scope: Scope<'_>) -> Option<Sighting> {
    let host = std::process::id() as i32;
    let (mains, known, registered) = {
        let registry = REGISTRY.lock_unpoisoned();
        let (mains, known) = registry.owners(scope);
        let registered: HashSet<String> = match scope {
            Scope::Every => registry.jobs.keys().cloned().collect(),
            Scope::Job(marker) => registry
                .jobs
                .get_key_value(marker)
                .map(|(m, _)| m.clone())
                .into_iter()
                .collect(),
        };
        (mains, known, registered)
    };
    let (mut buffer, mut pids) = (Vec::with_capacity(256), Vec::new());
    let mut sighting = Sighting::default();
    // Zombies among the host's children, each with whether it is a
    // job's member, to remember as adopted.
    let mut zombies: Vec<(Proc, bool)> = Vec::new();
    // Processes to descend into, with their job.
    let mut below: Vec<(Proc, String)> = Vec::new();
    // Host children looked at, and processes descended into.
    let (mut host_children, mut visited) = (HashSet::<ProcId>::new(), HashSet::<ProcId>::new());
    // Still the host's children (alive, or zombies tokio has not waited
    // for): read once, as nothing is re-parented to them later.
    let mut main_processes: Vec<Proc> = mains
        .keys()
        .filter_map(|pid| read_stat(*pid))
        .filter(|proc| proc.ppid == host)
        .collect();
    for listing in 0.. {
        if listing == HOST_LISTINGS {
            return None;
        }
        // The main thread's list, where orphans arrive.
        let mut children = main_thread_children(scope, &mut buffer, &mut pids)?;
        children.append(&mut main_processes);
        let mut new = 0;
        for child in children {
            // The latest word on it (the reaper reaps from it).
            sighting.procs.insert(child.pid, child);
            let id = (child.pid, child.start);
            // Looked at already, or re-parented here from a job's tree
            // (so descended into already).
            if !host_children.insert(id) || visited.contains(&id) {
                continue;
            }
            new += 1;
            // A main process, a member seen before, or the marker (which a
            // zombie no longer shows).
            let job = mains
                .get(&child.pid)
                .or_else(|| known.get(&id))
                .cloned()
                .or_else(|| {
                    (!child.zombie)
                        .then(|| marker_of(child.pid).filter(|m| registered.contains(m)))
                        .flatten()
                });
            if child.zombie {
                zombies.push((child, job.is_some()));
            }
            if let Some(job) = job {
                below.push((child, job));
            }
        }
        // Only a process descended into can die meanwhile and hand its
        // children up to the host: with none (a job whose command is
        // gone, the common case at its end), one listing sees it all.
        if (listing > 0 && new == 0) || (listing == 0 && below.is_empty()) {
            break;
        }
        while let Some((proc, job)) = below.pop() {
            if !visited.insert((proc.pid, proc.start)) {
                continue;
            }
            sighting.procs.insert(proc.pid, proc);
            // Zombies hand their children over before they show as such.
            if !proc.zombie {
                let children = settled_children(proc.pid, proc.threads, &mut buffer, &mut pids)?;
                below.extend(children.into_iter().map(|c| (c, job.clone())));
            }
            sighting.jobs.entry(job).or_default().push(proc);
        }
    }
    let mut registry = REGISTRY.lock_unpoisoned();
    for (job, procs) in &sighting.jobs {
        if let Some(tracked) = registry.jobs.get_mut(job) {
            tracked
                .members
                .extend(procs.iter().map(|p| (p.pid, p.start)));
        }
    }
    registry.adopt_zombies(&zombies);
    Some(sighting)
}

/// The children of the host's main thread, where orphans arrive (its one
/// thread's list), read as [`settled_children`] does. A kill round
/// ([`Scope::Job`]) first reaps the zombies adopted from jobs
/// ([`Registry::reap_adopted`]), so that it does not read what earlier
/// rounds left dead there. The reaper's sighting ([`Scope::Every`]) reaps
/// after it looks, as it always has.
fn main_thread_children(
    scope: Scope<'_>,
    buffer: &mut Vec<u8>,
    pids: &mut Vec<i32>,
) -> Option<Vec<Proc>> {
    let host = std::process::id() as i32;
    if matches!(scope, Scope::Every) {
        return settled_children(host, 1, buffer, pids);
    }
    REGISTRY.lock_unpoisoned().reap_adopted();
    settled_children(host, 1, buffer, pids)
}

/// Every process on the machine ([`Finder::EveryProcess`], and restart
/// recovery).
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
    let mut path = ProcPath::default();
    let file = File::open(path.set(format_args!("/proc/{pid}/environ"))?).ok()?;
    let mut environ = Vec::with_capacity(4096);
    read_proc_file(file, &mut environ).ok()?;
    let prefix = format!("{MARKER_VAR}=");
    environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
}

/// The processes of each registered job among `procs` (every process on
/// the machine): those whose parents lead up to the host, through the
/// job's main process, a member seen before or the marker. Records new
/// members as it goes.
fn attribute(procs: &[Proc]) -> HashMap<String, Vec<Proc>> {
    let host = std::process::id() as i32;
    let by_pid: HashMap<i32, &Proc> = procs.iter().map(|p| (p.pid, p)).collect();
    let mut registry = REGISTRY.lock_unpoisoned();
    let (mains, known) = registry.owners(Scope::Every);
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
/// ended jobs, and reaps the zombies the host adopted from them — all
/// from one sighting per tick.
fn reaper() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscalls; `getpriority`/`setpriority` with a thread
    // id read and set that thread's nice value on Linux (raising it needs
    // no privilege).
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        let own = libc::getpriority(libc::PRIO_PROCESS, tid);
        libc::setpriority(libc::PRIO_PROCESS, tid, (own + REAPER_NICE).min(19));
    }
    let mut tick = SCAN_EVERY;
    loop {
        {
            // Every tick while a job is tracked (so a detaching process is
            // seen within one); asleep otherwise, until the next job, an
            // orphan's exit or the idle sweep.
            let registry = REGISTRY.lock_unpoisoned();
            let was_busy = registry.busy();
            let wait = if was_busy { tick } else { IDLE_SWEEP_EVERY };
            let (registry, _) = WAKE
                .wait_timeout(registry, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Woken by the first job after none: its first look is a tick
            // from now, as for any job. A look at once would come before
            // its command has even started, and a short job has ended
            // (with its own kill round) before the tick.
            if !was_busy && registry.busy() {
                continue;
            }
        }
        // The ended jobs, taken before the sighting begins: it then sees
        // whatever they had left when they ended.
        let doomed: Vec<String> = {
            let registry = REGISTRY.lock_unpoisoned();
            // Nothing to do before the first job.
            if registry.mains.is_empty() {
                continue;
            }
            registry
                .jobs
                .iter()
                .filter(|(_, t)| t.doomed)
                .map(|(m, _)| m.clone())
                .collect()
        };
        let started = std::time::Instant::now();
        let sighting = fresh_sighting();
        tick = SCAN_EVERY.max(started.elapsed() * TICK_PER_SIGHTING);
        for marker in doomed {
            if kill_seen(&marker, &sighting) == 0 {
                forget(&marker);
            }
        }
        reap(&sighting);
    }
}

/// Reaps, by pid, the host's zombie children that belong (or belonged) to
/// a job, never a job's main process.
///
/// A zombie can no longer show its environment, so an orphan that died
/// before any sighting saw it alive (the middle process of a double fork)
/// is known by where it lived ([`left_a_job`]); a child the host itself
/// started is left to whoever waits for it.
fn reap(sighting: &Sighting) {
    // SAFETY: a plain syscall.
    let host_session = unsafe { libc::getsid(0) };
    let procs = &sighting.procs;
    let mut registry = REGISTRY.lock_unpoisoned();
    let mains = registry.main_pids();
    let mut candidates: HashSet<ProcId> = registry.to_reap.clone();
    candidates.extend(
        procs
            .values()
            .filter(|p| reapable(p, &mains) && left_a_job(p, &mains, host_session))
            .map(|p| (p.pid, p.start)),
    );
    for (marker, members) in &sighting.jobs {
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
    for (pid, start) in candidates {
        // A walk down reads only the jobs' trees and the host's children:
        // a killed member elsewhere (still below a dying parent) is read
        // on its own.
        let now = procs.get(&pid).copied().or_else(|| {
            (finder() == Finder::Children)
                .then(|| read_stat(pid))
                .flatten()
        });
        match now {
            Some(p) if p.start == start => {
                // The sighting was taken without the lock, and a kill round
                // may have reaped this zombie since (`reap_adopted`): then
                // its pid is free. Read again, under the lock, before the
                // wait.
                if reapable(&p, &mains) && still_zombie(&p) {
                    let mut status = 0;
                    // SAFETY: waits for one specific child, without blocking.
                    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
                    registry.to_reap.remove(&(pid, start));
                    registry.adopted_zombies.remove(&pid);
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

    #[test]
    fn stat_fields_are_found_after_a_name_with_spaces_and_parentheses() {
        let line = b"4242 (a) b (c) S 17 4242 4200 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 10 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
        let proc = parse_stat(4242, line).unwrap();
        assert_eq!(
            proc,
            Proc {
                pid: 4242,
                ppid: 17,
                pgrp: 4242,
                session: 4200,
                start: 987654,
                threads: 3,
                zombie: false,
            }
        );
        let zombie = b"7 (z) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0";
        assert!(parse_stat(7, zombie).unwrap().zombie);
        assert_eq!(parse_stat(7, b"7 (cut) S 1 7"), None);
    }

    /// The reaper gives way to the host's other threads, whatever nice value
    /// the host itself was started with.
    #[test]
    fn the_reaper_thread_runs_below_the_others() {
        init();
        let nice_of = |tid: &str| -> Option<(String, i64)> {
            let task = format!("/proc/self/task/{tid}");
            let comm = std::fs::read_to_string(format!("{task}/comm")).ok()?;
            let stat = std::fs::read_to_string(format!("{task}/stat")).ok()?;
            // Field 19, counted after the name's closing parenthesis.
            let nice = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(16)?
                .parse()
                .ok()?;
            Some((comm.trim().to_string(), nice))
        };
        // SAFETY: a plain syscall.
        let this_thread = unsafe { libc::syscall(libc::SYS_gettid) };
        // Every thread of the test process starts at the process's value.
        let (_, mine) = nice_of(&this_thread.to_string()).unwrap();
        let expected = (mine + i64::from(REAPER_NICE)).min(19);
        let mut reaper = None;
        for _ in 0..500 {
            reaper = std::fs::read_dir("/proc/self/task")
                .unwrap()
                .flatten()
                .filter_map(|e| nice_of(e.file_name().to_str()?))
                .find(|(comm, _)| comm == "offstage-reaper");
            if reaper.as_ref().is_some_and(|(_, nice)| *nice == expected) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let (_, nice) = reaper.expect("the reaper thread runs");
        assert_eq!(nice, expected, "this thread is at {mine}");
        assert!(
            mine == 19 || mine < nice,
            "this thread is at {mine}, the reaper at {nice}"
        );
    }

    /// A zombie adopted from a job is reaped by the next kill round of
    /// any job, without waiting for the reaper's tick; a zombie that is
    /// not a job's (a child this process started itself, in its own
    /// session and group) is never adopted, and is left to its parent;
    /// nor is one reaped since the sighting saw it.
    #[test]
    fn adopted_zombies_are_reaped_and_others_left() {
        let host = std::process::id() as i32;
        let spawn_zombie = |command: &mut std::process::Command| {
            let child = command.spawn().unwrap();
            let pid = child.id() as i32;
            // Not waited for: it stays this process's zombie.
            std::mem::forget(child);
            for _ in 0..1000 {
                if let Some(proc) = read_stat(pid).filter(|p| p.zombie) {
                    assert_eq!(proc.ppid, host);
                    return proc;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            panic!("{pid} did not turn into a zombie");
        };
        use std::os::unix::process::CommandExt;
        // A member of a job: the kind a job leaves behind.
        let member = spawn_zombie(std::process::Command::new("true").process_group(0));
        // This process's own child: same session and group as the host.
        let own = spawn_zombie(&mut std::process::Command::new("true"));
        // A zombie a sighting saw but that is gone by the time it would be
        // adopted (another thread reaped it): its pid is free, and must not
        // be remembered.
        let gone = spawn_zombie(std::process::Command::new("true").process_group(0));
        let mut status = 0;
        // SAFETY: waits for this test's own child.
        assert_eq!(unsafe { libc::waitpid(gone.pid, &mut status, 0) }, gone.pid);
        {
            // One lock throughout: another test's kill round reaps what is
            // adopted (that is the point), and must not do it in between.
            let mut registry = REGISTRY.lock_unpoisoned();
            registry.adopt_zombies(&[(member, true), (own, false), (gone, true)]);
            assert_eq!(
                registry.adopted_zombies.get(&member.pid),
                Some(&member.start)
            );
            assert!(!registry.adopted_zombies.contains_key(&own.pid));
            assert!(!registry.adopted_zombies.contains_key(&gone.pid));
            registry.reap_adopted();
            assert!(!registry.adopted_zombies.contains_key(&member.pid));
        }
        assert!(
            read_stat(member.pid).is_none(),
            "the adopted zombie was not reaped"
        );
        assert!(
            read_stat(own.pid).is_some_and(|p| p.zombie),
            "a zombie that is not a job's was reaped"
        );
        let mut status = 0;
        // SAFETY: waits for this test's own child.
        assert_eq!(unsafe { libc::waitpid(own.pid, &mut status, 0) }, own.pid);
    }

    #[test]
    fn this_process_reads_as_itself() {
        let me = read_stat(std::process::id() as i32).unwrap();
        // SAFETY: plain syscalls.
        let (ppid, pgrp, session) = unsafe { (libc::getppid(), libc::getpgrp(), libc::getsid(0)) };
        assert_eq!((me.ppid, me.pgrp, me.session), (ppid, pgrp, session));
        assert!(me.threads >= 1 && !me.zombie);
    }

    /// The walk down and the whole-machine scan find the same processes
    /// of a job whose tree has a detached part: a `setsid` child that
    /// stays below the main process, and a double-forked one adopted by
    /// this (subreaper) process, with a child of its own.
    #[test]
    fn walking_down_finds_what_the_scan_finds() {
        init();
        if finder() != Finder::Children {
            eprintln!("no child lists on this kernel: nothing to compare");
            return;
        }
        let tree = JobTree::new("unit.walk.x".into());
        let mut main = std::process::Command::new("sh")
            .arg("-c")
            .arg("setsid sleep 30 & ( ( sh -c 'sleep 30 & exec sleep 30' & ) & ) ; exec sleep 30")
            .env(MARKER_VAR, tree.marker())
            .spawn()
            .unwrap();
        tree.set_main(main.id() as i32);
        // The main sleep, the setsid one, the adopted sh's (now sleep) and
        // its child: four processes once the middle one has gone.
        let host = std::process::id() as i32;
        let mut pids = Vec::new();
        for _ in 0..1000 {
            let mut scanned: Vec<i32> = attribute(&scan())
                .remove("unit.walk.x")
                .unwrap_or_default()
                .into_iter()
                .filter(|p| !p.zombie)
                .map(|p| p.pid)
                .collect();
            scanned.sort_unstable();
            let adopted = scanned
                .iter()
                .filter_map(|pid| read_stat(*pid))
                .any(|p| p.ppid == host && p.pid != main.id() as i32);
            if scanned.len() == 4 && adopted {
                pids = scanned;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(pids.len(), 4, "the job's processes did not all start");
        let mut walked: Vec<i32> = walk_down(Scope::Every)
            .expect("a quiet tree settles")
            .jobs
            .remove("unit.walk.x")
            .unwrap_or_default()
            .into_iter()
            .filter(|p| !p.zombie)
            .map(|p| p.pid)
            .collect();
        walked.sort_unstable();
        assert_eq!(walked, pids);

        drop(tree);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(main.wait().unwrap().signal(), Some(libc::SIGKILL));
        for _ in 0..1000 {
            if pids
                .iter()
                .all(|pid| read_stat(*pid).is_none_or(|p| p.zombie))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the job's processes outlived it: {pids:?}");
    }
}
