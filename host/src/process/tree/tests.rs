//! The job tree's tests, with real processes.
use super::*;
use super::{
    kill::kill_marked,
    proc::{marker_of, parse_stat},
    reaper::REAPER_NICE,
    sighting::{attribute, scan, walk_down},
};

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
