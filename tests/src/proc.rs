//! Reading `/proc` (Linux): whether a process lives, resident memory, and
//! the processes a test (or a benchmark) left behind.

use std::{collections::HashMap, process::Command};

/// Whether `pid` is a live process: present in `/proc` and not a zombie
/// (an exited process nobody has reaped yet counts as gone).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(stat_fields(&stat).0, "Z" | "X"),
        Err(_) => false,
    }
}

/// Whether `pid` sleeps (state `S`: blocked in a wait it chose, such as
/// `nanosleep`), as a started command does once its loading is over.
pub fn pid_sleeping(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat_fields(&stat).0 == "S")
}

/// `VmRSS` of process `pid` (`"self"` for this one), in bytes (0 where
/// `/proc` is missing).
pub fn rss_bytes(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The state and parent pid of a `/proc/PID/stat` line ("pid (comm) state
/// ppid ..."; comm may hold spaces and parens, so split after the last
/// `)`). `("", 0)` where the line is not one.
fn stat_fields(stat: &str) -> (&str, u32) {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return ("", 0);
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("");
    let ppid = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (state, ppid)
}

/// Live processes (zombies excluded) whose parent chain leads to `root`,
/// or whose command line contains `marker`: `(pid, cmdline)`, sorted.
pub fn processes_of(root: u32, marker: &str) -> Vec<(u32, String)> {
    let mut parent: HashMap<u32, u32> = HashMap::new();
    let mut cmdlines: HashMap<u32, String> = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if !stat.contains(')') {
            continue;
        }
        let (state, ppid) = stat_fields(&stat);
        if matches!(state, "Z" | "X") {
            continue;
        }
        parent.insert(pid, ppid);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        cmdlines.insert(pid, cmdline);
    }
    let mut found: Vec<(u32, String)> = cmdlines
        .iter()
        .filter(|(&pid, cmdline)| {
            if pid == root {
                return false;
            }
            let mut current = pid;
            for _ in 0..64 {
                match parent.get(&current) {
                    Some(&p) if p == root => return true,
                    Some(&p) if p > 1 => current = p,
                    _ => break,
                }
            }
            !marker.is_empty() && cmdline.contains(marker)
        })
        .map(|(&pid, cmdline)| (pid, cmdline.clone()))
        .collect();
    found.sort();
    found
}

/// Runs `command` to its end and returns its exit code and its peak
/// resident memory (`ru_maxrss` of wait4(2) for that one child, in bytes).
/// Stdout and stderr are discarded.
pub fn run_measured(command: &mut Command) -> (i32, u64) {
    use std::process::Stdio;

    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the measured command");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our unreaped child; both pointers are valid for the
    // call. `child` is not waited on by std afterwards (it is forgotten).
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    std::mem::forget(child);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    // Linux reports kilobytes.
    (code, usage.ru_maxrss as u64 * 1024)
}
