//! Shared by the `reliability_*` tests: reading `/proc` (Linux) for the
//! resident memory of this process and for processes left behind.

#![allow(dead_code)]

use std::collections::HashMap;

/// `VmRSS` of this process, in bytes (0 where `/proc` is missing).
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Live processes (zombies excluded) whose parent chain leads to `root`,
/// or whose command line contains `marker`: `(pid, cmdline)`. Cargo's
/// build children are gone by the time tests call this.
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
        // "pid (comm) state ppid ...": comm may hold spaces and parens.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let ppid = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
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
