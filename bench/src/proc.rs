//! Reading `/proc` (Linux): resident memory and a process's descendants.

use std::collections::HashMap;

/// `VmRSS` of process `pid` (`"self"` for this one), in bytes.
pub fn rss_bytes(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Live processes (not zombies) that descend from `root`, or whose command
/// line contains `marker`: `(pid, cmdline)`.
pub fn descendants_or_marked(root: u32, marker: &str) -> Vec<(u32, String)> {
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
        // pid (comm) state ppid ...: comm may hold spaces; split after ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if state == "Z" || state == "X" {
            continue;
        }
        parent.insert(pid, ppid);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        cmdlines.insert(pid, cmdline);
    }
    let mut found = Vec::new();
    for (&pid, cmdline) in &cmdlines {
        if pid == root {
            continue;
        }
        let mut current = pid;
        let mut descends = false;
        for _ in 0..64 {
            match parent.get(&current) {
                Some(&p) if p == root => {
                    descends = true;
                    break;
                }
                Some(&p) if p > 1 => current = p,
                _ => break,
            }
        }
        if descends || (!marker.is_empty() && cmdline.contains(marker)) {
            found.push((pid, cmdline.clone()));
        }
    }
    found.sort();
    found
}
