//! The reaper thread, and what it may reap.
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

use std::{collections::HashSet, time::Duration};

use super::kill::{forget, kill_seen};
use super::proc::{read_stat, Proc};
use super::sighting::{fresh_sighting, Sighting};
use super::{finder, host_session, reap_child, Finder, ProcId, REGISTRY, WAKE};
use crate::util::LockExt;

/// How often the reaper thread looks while there is something to watch,
/// at most.
pub(super) const SCAN_EVERY: Duration = Duration::from_millis(200);

/// The reaper's ticks are at least this many times as far apart as its
/// last sighting took: a sighting costs what the jobs have (a thousand
/// running jobs, ~40 ms of reads), and the reaper is housekeeping — it
/// must not take a core from the jobs and the commits.
pub(super) const TICK_PER_SIGHTING: u32 = 10;

/// How far the reaper thread's nice value is above the host's (capped at
/// 19, the lowest priority): below the host's other threads, so that a
/// sighting that does run gives way to a move's commit and the callers it
/// releases. Relative, so that a host started under `nice` keeps it.
pub(super) const REAPER_NICE: libc::c_int = 10;

/// How often the reaper thread sweeps while no job is tracked.
pub(super) const IDLE_SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Whether `proc`, as read, is a zombie this module may reap: the host's
/// child and not a job's main process (see [`Registry::main_pids`]).
pub(super) fn reapable(proc: &Proc, mains: &HashSet<i32>) -> bool {
    proc.zombie && proc.ppid == std::process::id() as i32 && !mains.contains(&proc.pid)
}

/// Whether `proc` is known by where it lived to have left a job: in a
/// job's process group, or in a session other than the host's (it called
/// `setsid`). A child the host itself started (a `cargo build` of
/// `offstage dev`, a plugin's own process) lives in the host's session
/// and in no job's group.
pub(super) fn left_a_job(proc: &Proc, mains: &HashSet<i32>, host_session: i32) -> bool {
    mains.contains(&proc.pgrp) || proc.session != host_session
}

/// Whether `zombie` is, read now, still that zombie and the host's child.
/// Called with the registry locked, this makes it safe to reap by pid:
/// only the lock's holders reap the zombies this module attributes.
pub(super) fn still_zombie(zombie: &Proc) -> bool {
    let host = std::process::id() as i32;
    read_stat(zombie.pid)
        .is_some_and(|now| now.start == zombie.start && now.zombie && now.ppid == host)
}

/// While no job is tracked, a child's exit (SIGCHLD: an orphan no job
/// claimed has died) wakes the reaper at once instead of at its idle
/// sweep. Needs the runtime `init` is called in (the host's); without one
/// the sweep does it.
pub(super) fn wake_on_child_exit() {
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

/// The reaper thread: records members while jobs run, finishes killing
/// ended jobs, and reaps the zombies the host adopted from them — all
/// from one sighting per tick.
pub(super) fn reaper() {
    // With a thread id, `getpriority`/`setpriority` read and set that
    // thread's nice value on Linux (raising it needs no privilege).
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let tid = Some(rustix::thread::gettid());
        if let Ok(own) = getpriority_process(tid) {
            let _ = setpriority_process(tid, (own + REAPER_NICE).min(19));
        }
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
pub(super) fn reap(sighting: &Sighting) {
    let host_session = host_session();
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
                    reap_child(pid);
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
