//! Process groups that outlive a killed host.
//!
//! A shell job runs in a process group of its own (so that cancelling it
//! kills grandchildren too). The host kills that group whenever the job
//! ends, is cancelled, or the host shuts down — but a host killed with
//! SIGKILL (or by the OOM killer, or a power cut of its container) runs no
//! code, and the group goes on, re-parented to init. So each running job's
//! group is recorded in the store ([`ProcessRecord`]) and restart recovery
//! kills the groups of the jobs it cancels. The shell tool records a group
//! once its command has run a moment (`tool::shell`, `RECORD_GROUP_AFTER`):
//! most commands end before, and their processes carry the job marker
//! that recovery kills by anyway (`tree::kill_marked`).
//!
//! A group id is a pid, and pids are reused. A group is killed only while
//! its leader is provably the process the job started: same boot
//! (`/proc/sys/kernel/random/boot_id`), same start time in clock ticks
//! since boot (`/proc/PID/stat` field 22), and still leading its group.
//! When the leader has exited but members of its group live on (a command
//! that forked and whose main process ended), the group cannot be told
//! from a later one and is left alone, with a warning in the log. Linux
//! only; elsewhere nothing is recorded and nothing is killed.

use crate::{
    permission::{Action, Reply},
    process::tree::read_stat,
    session::SessionService,
    store::ProcessRecord,
    tool::{BoxFuture, JobProcesses},
};

/// A job's processes, as its tool sees them: the marker for a new run,
/// the record of its main process (see the module docs), and the question
/// that lets a call the sandbox refused run again without it.
pub(crate) struct OfJob {
    pub(crate) service: SessionService,
    pub(crate) session_id: String,
    pub(crate) job_id: String,
}

impl JobProcesses for OfJob {
    fn marker(&self) -> String {
        self.service.job_marker(&self.job_id)
    }

    fn record(&self, pid: u32) {
        self.service.record_job_process(&self.job_id, pid);
    }

    fn escalate(&self, tool: &str, pattern: &str) -> BoxFuture<bool> {
        let (service, session_id, job_id) = (
            self.service.clone(),
            self.session_id.clone(),
            self.job_id.clone(),
        );
        let (tool, pattern) = (tool.to_string(), pattern.to_string());
        Box::pin(async move {
            let permissions = service.permissions();
            match permissions.decide(&tool, &pattern, Action::Ask) {
                Action::Allow => true,
                Action::Deny => false,
                Action::Ask => {
                    // Dropped with the job (a cancel, an interrupt): then
                    // withdrawn, as every question is.
                    let mut question = permissions.ask(&session_id, &job_id, &tool, &pattern);
                    matches!(question.answer().await, Some(Reply::Once | Reply::Always))
                }
            }
        })
    }
}

/// The record of process `pid`, the leader of its own group, or `None`
/// where `/proc` cannot say (not Linux, or the process is gone).
pub(crate) fn capture(pid: u32) -> Option<ProcessRecord> {
    let stat = read_stat(i32::try_from(pid).ok()?)?;
    if stat.pgrp != stat.pid {
        return None;
    }
    Some(ProcessRecord {
        pgid: stat.pid,
        start_ticks: stat.start,
        boot_id: boot_id()?.to_string(),
    })
}

/// What recovery found of a recorded group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Leftover {
    /// Its leader was still running and the group was sent SIGKILL.
    Killed,
    /// The leader is gone (or is another process now): nothing was done.
    Gone,
    /// The record is from another boot: nothing was done.
    OtherBoot,
}

/// Kills the group of `record` if its leader is still the recorded
/// process. `job_id` is for the log.
pub(crate) fn kill_leftover(job_id: &str, record: &ProcessRecord) -> Leftover {
    if boot_id() != Some(record.boot_id.as_str()) {
        return Leftover::OtherBoot;
    }
    let Some(stat) = read_stat(record.pgid) else {
        return Leftover::Gone;
    };
    if stat.start != record.start_ticks || stat.pgrp != record.pgid || stat.zombie {
        if stat.start == record.start_ticks && stat.zombie {
            tracing::warn!(
                job_id,
                pgid = record.pgid,
                "a leftover job's leader has exited; its group is left alone"
            );
        }
        return Leftover::Gone;
    }
    let killed = rustix::process::Pid::from_raw(record.pgid).is_some_and(|pgid| {
        rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL).is_ok()
    });
    if killed {
        tracing::info!(
            job_id,
            pgid = record.pgid,
            "killed the process group a killed host left running"
        );
        Leftover::Killed
    } else {
        Leftover::Gone
    }
}

/// This boot's id, read once: it cannot change while the host runs.
fn boot_id() -> Option<&'static str> {
    static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .as_deref()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn kills_a_recorded_group_and_only_while_its_leader_lives() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let record = capture(child.id()).expect("a group leader has a record");
        assert_eq!(record.pgid, child.id() as i32);

        let mut stale = record.clone();
        stale.start_ticks += 1;
        assert_eq!(
            kill_leftover("job_x", &stale),
            Leftover::Gone,
            "another process: untouched"
        );
        let mut other_boot = record.clone();
        other_boot.boot_id = "not-this-boot".into();
        assert_eq!(kill_leftover("job_x", &other_boot), Leftover::OtherBoot);
        assert!(
            child.try_wait().unwrap().is_none(),
            "still running after refused kills"
        );

        assert_eq!(kill_leftover("job_x", &record), Leftover::Killed);
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert_eq!(
            kill_leftover("job_x", &record),
            Leftover::Gone,
            "reaped: nothing to kill"
        );
    }

    #[test]
    fn a_process_that_does_not_lead_its_group_has_no_record() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(capture(child.id()), None);
        let _ = child.kill();
        let _ = child.wait();
    }
}
