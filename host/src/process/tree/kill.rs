//! Ending a job's process tree: kill rounds, and at restart every
//! process that carries this data dir's marker.

use std::{collections::HashSet, time::Duration};

use super::proc::{marker_of, read_stat, Proc};
use super::sighting::{fresh_sighting, scan, walk_down, Scope, Sighting};
use super::{finder, Finder, MAX_ROUNDS, REGISTRY};
use crate::util::LockExt;

pub(super) fn doom(marker: &str) {
    if let Some(tracked) = REGISTRY.lock_unpoisoned().jobs.get_mut(marker) {
        tracked.doomed = true;
    }
}

pub(super) fn forget(marker: &str) {
    REGISTRY.lock_unpoisoned().jobs.remove(marker);
}

/// Takes a sighting begun after this call, and sends SIGKILL to every
/// live member of `marker`'s job in it. Returns how many live members
/// were found.
///
/// Walking down, the sighting is of this job alone: cheap enough to take
/// for each round. The whole-machine scan is shared with the rounds that
/// asked meanwhile ([`fresh_sighting`]).
pub(super) fn kill_round(marker: &str) -> usize {
    if finder() == Finder::Children {
        if let Some(sighting) = walk_down(Scope::Job(marker)) {
            return kill_seen(marker, &sighting);
        }
    }
    kill_seen(marker, &fresh_sighting())
}

/// Sends SIGKILL to every live member of `marker`'s job in `sighting`.
/// Returns how many were found.
pub(super) fn kill_seen(marker: &str, sighting: &Sighting) -> usize {
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

/// SIGKILL to the process `pid` started at `start`, through a pidfd where
/// the kernel has them, so a reused pid is never hit.
pub(super) fn kill(pid: i32, start: u64) {
    use rustix::process::{kill_process, pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
    let Some(pid) = Pid::from_raw(pid) else {
        return;
    };
    let same = || read_stat(pid.as_raw_nonzero().get()).is_some_and(|p| p.start == start);
    // The pidfd names the process it was opened on, even if the pid is
    // reused after the check.
    #[cfg(target_os = "linux")]
    if let Ok(pidfd) = pidfd_open(pid, PidfdFlags::empty()) {
        if same() {
            let _ = pidfd_send_signal(&pidfd, Signal::KILL);
        }
        return;
    }
    if same() {
        let _ = kill_process(pid, Signal::KILL);
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
