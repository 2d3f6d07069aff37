//! Reading `/proc`: a process's `stat`, a task's child list, a
//! process's marker. Into stack buffers, with no allocation per process.

use std::{
    fs::File,
    io::{Read, Write},
    sync::{Mutex, OnceLock},
};

use super::MARKER_VAR;
use crate::util::LockExt;

/// Reads of one child list before a sighting gives up on it (children
/// kept leaving it while it was read) and scans every process instead.
pub(super) const LIST_TRIES: usize = 4;

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    pub(crate) pgrp: i32,
    pub(crate) session: i32,
    /// Start time in clock ticks since boot: with the pid, the process.
    pub(crate) start: u64,
    /// Its threads, when read (a task's children hang off the thread
    /// that started them).
    pub(super) threads: u32,
    /// Dead and not reaped yet (`Z`), or being torn down (`X`).
    pub(crate) zombie: bool,
}

/// `/proc/...` paths, built on the stack.
pub(super) struct ProcPath {
    bytes: [u8; 64],
}

impl Default for ProcPath {
    fn default() -> Self {
        ProcPath { bytes: [0; 64] }
    }
}

impl ProcPath {
    pub(super) fn set(&mut self, args: std::fmt::Arguments<'_>) -> Option<&str> {
        let mut cursor = std::io::Cursor::new(&mut self.bytes[..]);
        cursor.write_fmt(args).ok()?;
        let len = usize::try_from(cursor.position()).ok()?;
        std::str::from_utf8(&self.bytes[..len]).ok()
    }
}

/// Reads `/proc/PID/stat`, into a stack buffer: no allocation. `None` if
/// the process is gone (or `/proc` cannot say).
pub(crate) fn read_stat(pid: i32) -> Option<Proc> {
    let mut path = ProcPath::default();
    let mut file = File::open(path.set(format_args!("/proc/{pid}/stat"))?).ok()?;
    // 52 numeric fields and a name of at most 64 bytes fit with room.
    let mut buffer = [0u8; 2048];
    let mut len = 0;
    loop {
        match file.read(&mut buffer[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len == buffer.len() {
                    return None;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    parse_stat(pid, &buffer[..len])
}

/// `pid (comm) state ppid pgrp session ...`: the name may hold spaces and
/// parentheses, so the fields start after the last `)`.
pub(super) fn parse_stat(pid: i32, text: &[u8]) -> Option<Proc> {
    let close = text.iter().rposition(|b| *b == b')')?;
    let mut fields = text[close + 1..]
        .split(|b| *b == b' ' || *b == b'\n')
        .filter(|f| !f.is_empty());
    // Field N of proc(5) is the (N - 3)th after the name.
    let mut next = |skip: usize| fields.nth(skip);
    let state = *next(0)?.first()?;
    let ppid = number(next(0)?)?;
    let pgrp = number(next(0)?)?;
    let session = number(next(0)?)?;
    let threads = number(next(13)?)?; // field 20
    let start = number(next(1)?)?; // field 22
    Some(Proc {
        pid,
        ppid,
        pgrp,
        session,
        start,
        threads,
        zombie: matches!(state, b'Z' | b'X'),
    })
}

pub(super) fn number<T: std::str::FromStr>(field: &[u8]) -> Option<T> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// Reads a `/proc` file to its end into `buffer`. Not `File::read_to_end`
/// or `fs::read`: they ask the file's size first (`statx`, `lseek`), two
/// more syscalls per file that `/proc` answers with 0 anyway, and a
/// sighting reads a few such files per job end.
pub(super) fn read_proc_file(file: File, buffer: &mut Vec<u8>) -> std::io::Result<usize> {
    // `Take` has no size hint, so the read loop reads without asking.
    file.take(u64::MAX).read_to_end(buffer)
}

/// Reads the host main thread's child list into `buffer` through one
/// descriptor opened once: every kill round reads this list, and opening
/// a `/proc` file (five path components, two pid lookups) cost more than
/// reading it. A read from offset 0 starts the kernel's listing afresh
/// (`seq_file`), so each read is a new look; one reader at a time, so a
/// list longer than one read is read in one pass, as through a descriptor
/// of its own. `false` if it cannot be read.
pub(super) fn read_host_children(buffer: &mut Vec<u8>) -> bool {
    use std::os::unix::fs::FileExt;
    static FILE: OnceLock<Option<Mutex<File>>> = OnceLock::new();
    let Some(file) = FILE
        .get_or_init(|| {
            let host = std::process::id();
            File::open(format!("/proc/{host}/task/{host}/children"))
                .ok()
                .map(Mutex::new)
        })
        .as_ref()
    else {
        return false;
    };
    let file = file.lock_unpoisoned();
    buffer.clear();
    let mut chunk = [0u8; 4096];
    loop {
        match file.read_at(&mut chunk, buffer.len() as u64) {
            Ok(0) => return true,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Lists a process's children, from each of its threads, into `pids`.
/// A process that is gone has none. Reuses `buffer` for the reads.
pub(super) fn list_children(pid: i32, threads: u32, buffer: &mut Vec<u8>, pids: &mut Vec<i32>) {
    pids.clear();
    if pid == std::process::id() as i32 && threads == 1 && read_host_children(buffer) {
        pids.extend(
            buffer
                .split(|b| *b == b' ' || *b == b'\n')
                .filter_map(number::<i32>),
        );
        return;
    }
    let mut path = ProcPath::default();
    let mut read_thread = |tid: i32, pids: &mut Vec<i32>| {
        let Some(path) = path.set(format_args!("/proc/{pid}/task/{tid}/children")) else {
            return;
        };
        let Ok(file) = File::open(path) else {
            return;
        };
        buffer.clear();
        if read_proc_file(file, buffer).is_err() {
            return;
        }
        pids.extend(
            buffer
                .split(|b| *b == b' ' || *b == b'\n')
                .filter_map(number::<i32>),
        );
    };
    if threads == 1 {
        read_thread(pid, pids);
        return;
    }
    let mut path = ProcPath::default();
    let Some(dir) = path.set(format_args!("/proc/{pid}/task")) else {
        return;
    };
    let Ok(dir) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in dir.flatten() {
        if let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse().ok()) {
            read_thread(tid, pids);
        }
    }
}

/// A process's children with their `stat`, read so that none was
/// skipped: every listed child must still be there, and still this
/// parent's, once the list is read (see the module doc). `None` if the
/// list did not settle in [`LIST_TRIES`] reads.
pub(super) fn settled_children(
    parent: i32,
    threads: u32,
    buffer: &mut Vec<u8>,
    pids: &mut Vec<i32>,
) -> Option<Vec<Proc>> {
    for _ in 0..LIST_TRIES {
        list_children(parent, threads, buffer, pids);
        let children: Vec<Proc> = pids
            .iter()
            .filter_map(|pid| read_stat(*pid))
            .filter(|child| child.ppid == parent)
            .collect();
        if children.len() == pids.len() {
            return Some(children);
        }
    }
    None
}

/// The [`MARKER_VAR`] value in a process's environment, if it has one
/// (and `/proc` lets us read it: our own user's processes only).
pub(super) fn marker_of(pid: i32) -> Option<String> {
    let mut path = ProcPath::default();
    let file = File::open(path.set(format_args!("/proc/{pid}/environ"))?).ok()?;
    let mut environ = Vec::with_capacity(4096);
    read_proc_file(file, &mut environ).ok()?;
    let prefix = format!("{MARKER_VAR}=");
    environ
        .split(|b| *b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
}
