//! Whether a process talking to the host is inside a job's tree: so that
//! what a job runs cannot answer the questions asked about it
//! (docs/reference.md, "Answers come from outside every job").
//!
//! The jobs' own processes are looked at first, as a fresh sighting finds
//! them (`sighting.rs`).
//!
//! - A unix socket's client is named by the kernel (`SO_PEERCRED`): it is
//!   inside a job when it, or one of its ancestors, is one of the jobs'
//!   processes, when it descends from the host (a job's process that left
//!   its tree is reparented to the host, a subreaper), or when it carries
//!   a job marker (`OFFSTAGE_JOB`).
//! - A loopback TCP client is found through its socket: the entry of
//!   `/proc/net/tcp` (or `tcp6`) whose local end is the client's address
//!   and whose remote end is the host's names the socket's inode, and the
//!   process holding a descriptor of that inode (`/proc/PID/fd`) is the
//!   client, placed as a unix client is. A socket that cannot be found
//!   (its client already closed it) cannot be cleared, so it counts as
//!   unknown.

use std::{collections::HashSet, net::SocketAddr};

use super::{proc::marker_of, read_stat, sighting::fresh_sighting, REGISTRY};
use crate::util::LockExt;

/// Where a client of the host is, as far as its socket tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Inside a job's process tree: this process.
    Job(i32),
    /// Not one of the jobs' processes.
    Outside,
    /// Cannot be told (the reason).
    Unknown(String),
}

/// Ancestors walked up from a unix client before giving up.
const MAX_ANCESTORS: usize = 128;

/// Every process of every running job, as a sighting taken now finds
/// them; none, without a look, when no job runs.
fn job_processes() -> HashSet<i32> {
    if REGISTRY.lock_unpoisoned().jobs.is_empty() {
        return HashSet::new();
    }
    fresh_sighting()
        .jobs
        .values()
        .flatten()
        .map(|p| p.pid)
        .collect()
}

/// Where process `pid` (a unix socket's client) is: inside a job when it
/// or an ancestor is a job's process, or it carries a job marker.
pub(crate) fn process_origin(pid: i32) -> Origin {
    if marker_of(pid).is_some() {
        return Origin::Job(pid);
    }
    let jobs = job_processes();
    let host = std::process::id() as i32;
    let mut current = pid;
    for _ in 0..MAX_ANCESTORS {
        if jobs.contains(&current) {
            return Origin::Job(pid);
        }
        match read_stat(current) {
            // Below the host: a job's process that left its tree (the host
            // is a subreaper, so every orphan of a job becomes its child),
            // or a plugin's. Never an answerer from outside.
            Some(stat) if stat.ppid == host => return Origin::Job(pid),
            Some(stat) if stat.ppid > 1 => current = stat.ppid,
            Some(_) => return Origin::Outside,
            None if current == pid => {
                return Origin::Unknown(format!("process {pid} is gone"));
            }
            None => return Origin::Outside,
        }
    }
    Origin::Unknown(format!(
        "process {pid} has more than {MAX_ANCESTORS} ancestors"
    ))
}

/// Where the TCP client at `client`, connected to the host's `server`
/// address, is (see the module docs).
pub(crate) fn tcp_origin(client: SocketAddr, server: SocketAddr) -> Origin {
    let Some(inode) = socket_inode(client, server) else {
        return Origin::Unknown(format!(
            "no open socket on this machine is {client} connected to {server}"
        ));
    };
    let wanted = format!("socket:[{inode}]");
    let holds = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == &*wanted)
            })
        })
    };
    // The jobs' own processes first (cheap); then whoever holds it, which
    // is inside a job if it descends from the host (`process_origin`): a
    // process that left its job's tree still does. Answers are rare, so
    // reading every process's descriptors here costs little.
    if let Some(pid) = job_processes().into_iter().find(|&pid| holds(pid)) {
        return Origin::Job(pid);
    }
    let holder = std::fs::read_dir("/proc").ok().and_then(|entries| {
        entries
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .find(|&pid| holds(pid))
    });
    match holder.map(|pid| (pid, process_origin(pid))) {
        Some((pid, Origin::Job(_))) => Origin::Job(pid),
        Some((_, Origin::Unknown(why))) => Origin::Unknown(why),
        _ => Origin::Outside,
    }
}

/// The inode of the socket whose local end is `client` and remote end
/// `server`, from `/proc/net/tcp` and `/proc/net/tcp6`; `None` when no
/// such socket is open (an inode of 0 is one no process holds).
fn socket_inode(client: SocketAddr, server: SocketAddr) -> Option<u64> {
    let mut found = None;
    for (file, client, server) in [
        ("/proc/net/tcp", v4(client), v4(server)),
        ("/proc/net/tcp6", Some(v6(client)), Some(v6(server))),
    ] {
        let (Some(client), Some(server)) = (client, server) else {
            continue;
        };
        let Ok(table) = std::fs::read_to_string(file) else {
            continue;
        };
        found = found.or_else(|| find_inode(&table, &client, &server));
    }
    found.filter(|inode| *inode != 0)
}

/// The inode column of `table`'s row from `local` to `remote`.
fn find_inode(table: &str, local: &str, remote: &str) -> Option<u64> {
    table.lines().skip(1).find_map(|row| {
        let fields: Vec<&str> = row.split_whitespace().collect();
        (fields.len() > 9 && fields[1] == local && fields[2] == remote)
            .then(|| fields[9].parse().ok())
            .flatten()
    })
}

/// `addr` as `/proc/net/tcp` writes it (each 32-bit word of the address
/// in the host's byte order, in hex; the port in hex), if it is IPv4 or
/// an IPv4-mapped IPv6 address.
fn v4(addr: SocketAddr) -> Option<String> {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) => ip,
        std::net::IpAddr::V6(ip) => ip.to_ipv4_mapped()?,
    };
    Some(format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(ip.octets()),
        addr.port()
    ))
}

/// `addr` as `/proc/net/tcp6` writes it (an IPv4 address as mapped).
fn v6(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) => ip.to_ipv6_mapped(),
        std::net::IpAddr::V6(ip) => ip,
    };
    let words: String = ip
        .octets()
        .chunks(4)
        .map(|word| {
            format!(
                "{:08X}",
                u32::from_ne_bytes([word[0], word[1], word[2], word[3]])
            )
        })
        .collect();
    format!("{words}:{:04X}", addr.port())
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    #[test]
    fn a_socket_of_this_process_is_found_and_is_no_jobs() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let stream = TcpStream::connect(server).unwrap();
        let client = stream.local_addr().unwrap();
        let inode = socket_inode(client, server).expect("the client's socket");
        let mine = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|t| t.to_string_lossy() == format!("socket:[{inode}]"))
            });
        assert!(mine, "inode {inode} is not this process's socket");
        assert_eq!(tcp_origin(client, server), Origin::Outside);
        // The other direction is the server's end, not a client's.
        drop(stream);
        let gone = SocketAddr::from(([127, 0, 0, 1], 1));
        assert!(matches!(tcp_origin(gone, server), Origin::Unknown(_)));
    }

    #[test]
    fn addresses_are_written_as_proc_net_tcp_writes_them() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        if cfg!(target_endian = "little") {
            assert_eq!(v4(addr).unwrap(), "0100007F:1F90");
            assert_eq!(v6(addr), "0000000000000000FFFF00000100007F:1F90");
        }
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:8080".parse().unwrap();
        assert_eq!(v4(mapped), v4(addr));
        assert!(v4("[::1]:1".parse().unwrap()).is_none());
    }

    #[test]
    fn this_process_is_outside_every_job() {
        assert_eq!(process_origin(std::process::id() as i32), Origin::Outside);
    }

    /// A process below the host that no job's sighting holds (one that
    /// left its job's tree, reparented to the host) is a job's, over the
    /// unix socket and over TCP alike. This test process is the host.
    #[test]
    fn a_process_below_the_host_is_never_outside() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let stream = TcpStream::connect(server).unwrap();
        let client = stream.local_addr().unwrap();
        // The child holds the client's socket (as its stdin); this
        // process's copy is closed once it is started.
        let fd = std::os::fd::OwnedFd::from(stream);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::from(fd))
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert_eq!(process_origin(pid), Origin::Job(pid));
        assert_eq!(tcp_origin(client, server), Origin::Job(pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
