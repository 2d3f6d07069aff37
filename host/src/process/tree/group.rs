//! A process group the host started outside any job — an isolated
//! plugin's process and every process it started — ended as one: killed,
//! and the members the host adopted reaped, by pid.
//!
//! Why here: the host is a child subreaper, so when a plugin's process
//! dies, the processes it started (zombies it never waited for, children
//! still running) become the host's children. They are in no job, so the
//! reaper thread leaves them alone; this reaps them, by pid and only
//! those whose process group is the plugin's, never with `waitpid(-1)`.
//! The group's leader is the plugin's process itself, reaped by whoever
//! spawned it before [`end_group`] is called; its pid is not reused while
//! its group has members, so signalling the group stays safe.

use std::time::{Duration, Instant};

use super::{
    proc::{list_children, read_stat},
    reap_child,
};

/// How often [`end_group`] looks again while members remain.
const LOOK_EVERY: Duration = Duration::from_millis(5);

/// Kills every process of the process group `leader` and reaps those
/// that are (or become) the host's children, until the group is empty or
/// `patience` runs out. Returns how many it reaped. Blocks: call it off
/// the runtime's workers.
pub(crate) fn end_group(leader: i32, patience: Duration) -> usize {
    let Some(group) = rustix::process::Pid::from_raw(leader) else {
        return 0;
    };
    let host = std::process::id() as i32;
    let deadline = Instant::now() + patience;
    let (mut buffer, mut pids) = (Vec::new(), Vec::new());
    let mut reaped = 0;
    loop {
        let killed = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        if killed == Err(rustix::io::Errno::SRCH) {
            // Gone: every member has been reaped, by us or another parent.
            return reaped;
        }
        let threads = read_stat(host).map_or(1, |p| p.threads);
        list_children(host, threads, &mut buffer, &mut pids);
        for &pid in &pids {
            let Some(child) = read_stat(pid) else {
                continue;
            };
            if child.pgrp == leader && child.zombie && child.ppid == host {
                reap_child(pid);
                reaped += 1;
            }
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                group = leader,
                "processes of an ended plugin process are still alive after {patience:?}"
            );
            return reaped;
        }
        std::thread::sleep(LOOK_EVERY);
    }
}
