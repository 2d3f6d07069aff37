//! Sightings: one look at the jobs' processes.
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

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Condvar, LazyLock, Mutex},
};

use super::proc::{marker_of, read_stat, settled_children, Proc};
use super::{finder, Finder, ProcId, REGISTRY};
use crate::util::LockExt;

/// Listings of the host's children per sighting before it gives up on
/// them settling (orphans kept arriving) and scans every process instead.
pub(super) const HOST_LISTINGS: usize = 8;

/// One look at the processes: each registered job's processes, and every
/// process read on the way (the host's own children among them, which is
/// what the reaper needs).
#[derive(Default)]
pub(super) struct Sighting {
    pub(super) jobs: HashMap<String, Vec<Proc>>,
    pub(super) procs: HashMap<i32, Proc>,
}

/// Sightings shared between kill rounds, like commits in a group: jobs
/// ending together each need one. A round needs a sighting that *began*
/// after it asked (so it sees every process alive then); one begun after
/// several rounds asked serves them all.
#[derive(Default)]
pub(super) struct SharedSightings {
    /// Sightings begun so far; the one running, if any, is number `begun`.
    begun: u64,
    /// The number of the last sighting finished, and the sighting.
    done: u64,
    result: Arc<Sighting>,
    running: bool,
}

pub(super) static SIGHTINGS: LazyLock<(Mutex<SharedSightings>, Condvar)> =
    LazyLock::new(Default::default);

/// A sighting begun after this call: taken by this thread, or by another
/// one that began it meanwhile.
pub(super) fn fresh_sighting() -> Arc<Sighting> {
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
pub(super) fn look() -> Sighting {
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

/// The jobs a sighting looks for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Scope<'a> {
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
pub(super) fn walk_down(scope: Scope<'_>) -> Option<Sighting> {
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
pub(super) fn main_thread_children(
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
pub(super) fn scan() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_stat)
        .collect()
}

/// The processes of each registered job among `procs` (every process on
/// the machine): those whose parents lead up to the host, through the
/// job's main process, a member seen before or the marker. Records new
/// members as it goes.
pub(super) fn attribute(procs: &[Proc]) -> HashMap<String, Vec<Proc>> {
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
