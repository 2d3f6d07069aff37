//! A hostile plugin: it tries what an isolated plugin must not be able to
//! do, to show what `filesystem = "read-only"` and the child's start-up
//! take away, and floods its output.
//!
//! Tool `try` `{"what", "path"?, "pid"?, "name"?}` answers a completed
//! result `ok: ...` when the attempt worked and an error result
//! `denied: ERROR` when the system refused it:
//!
//! - `chmod`, `fchmod`, `chown`, `setxattr`, `removexattr`, `utimes`:
//!   that call on `path` (chown to the file's own owner; the xattr is
//!   `user.offstage`);
//! - `mknod-block`, `mknod-char`: a block device node (loop 7:0) or a
//!   character one (1:3, null) at `path`; never written;
//! - `socket-inet`, `socket-unix`, `socket-netlink`: `socket()` of that
//!   family;
//! - `connect-abstract`: connects to the abstract unix socket `name`;
//! - `io-uring`: `io_uring_setup`;
//! - `kill`: signal 0 to `pid`;
//! - `env`: (always ok) the environment, as JSON;
//! - `caps`: (always ok) the `Cap*` lines of `/proc/self/status`;
//! - `stderr` `{"mib", "line"}`: writes `mib` MiB to stderr in 1 MiB
//!   writes: one line (`line: 0`), else lines of `line` bytes; `invalid`
//!   adds a byte that is not UTF-8 first;
//! - `fork` `{"zombies", "sleepers"}`: forks children that exit at once
//!   and are never waited for, and children that sleep for an hour;
//!   answers their pids.
//!
//! Its `shutdown` writes `shutdown ran` to `shutdown.txt` in its data
//! dir. In a plugin process (`offstage plugin-host FILE`), when
//! `FILE.fail-once` exists, its constructor removes that file and exits
//! with status 9: a start that fails once.
//!
//! Its manifest names it `hostile`, and so does its file
//! (`export_plugin!(.., name = "hostile")`) — except in an isolated
//! plugin's process (`offstage plugin-host FILE`) for a file whose name
//! contains `dodge`: there it says it is `sneaky`, to dodge a
//! `[plugin.hostile] isolation = "process"`.

use std::{ffi::CString, io::Write, os::linux::net::SocketAddrExt};

use offstage_plugin_api::prelude::*;

struct Hostile {
    data_dir: std::path::PathBuf,
}

#[used]
#[cfg_attr(target_os = "linux", link_section = ".init_array")]
static FAIL_ONCE: extern "C" fn() = fail_once;

extern "C" fn fail_once() {
    let args = args();
    if args.get(1).map(String::as_str) == Some("plugin-host") {
        if let Some(file) = args.get(2) {
            let marker = format!("{file}.fail-once");
            if std::fs::remove_file(&marker).is_ok() {
                eprintln!("hostile: failing this start once");
                std::process::exit(9);
            }
        }
    }
}

/// The process's command line.
fn args() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect()
}

fn name() -> &'static str {
    let args = args();
    let dodging = args.get(1).map(String::as_str) == Some("plugin-host")
        && args.get(2).is_some_and(|file| file.contains("dodge"));
    if dodging {
        "sneaky"
    } else {
        "hostile"
    }
}

fn c_path(input: &Value) -> CString {
    CString::new(input["path"].as_str().unwrap_or_default()).unwrap_or_default()
}

/// `Ok` when `result` is not -1, else the OS error.
fn checked(result: libc::c_long) -> std::result::Result<String, String> {
    if result == -1 {
        Err(std::io::Error::last_os_error().to_string())
    } else {
        Ok(format!("returned {result}"))
    }
}

fn attempt(input: &Value) -> std::result::Result<String, String> {
    let path = c_path(input);
    let what = input["what"].as_str().unwrap_or_default();
    match what {
        // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
        "chmod" => checked(unsafe { libc::chmod(path.as_ptr(), 0o777) }.into()),
        "fchmod" => {
            let file = std::fs::File::open(path.to_str().unwrap_or_default())
                .map_err(|e| e.to_string())?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
            // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
            checked(unsafe { libc::fchmod(fd, 0o777) }.into())
        }
        "chown" => {
            let meta =
                std::fs::metadata(path.to_str().unwrap_or_default()).map_err(|e| e.to_string())?;
            let (uid, gid) = (
                std::os::unix::fs::MetadataExt::uid(&meta),
                std::os::unix::fs::MetadataExt::gid(&meta),
            );
            // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
            checked(unsafe { libc::chown(path.as_ptr(), uid, gid) }.into())
        }
        "setxattr" => {
            let name = c"user.offstage";
            checked(
                // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
                unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), b"x".as_ptr().cast(), 1, 0) }
                    .into(),
            )
        }
        "removexattr" => {
            let name = c"user.offstage";
            // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
            checked(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }.into())
        }
        // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
        "utimes" => checked(unsafe { libc::utimes(path.as_ptr(), std::ptr::null()) }.into()),
        "mknod-block" | "mknod-char" => {
            let (kind, dev) = if what == "mknod-block" {
                (libc::S_IFBLK, libc::makedev(7, 0))
            } else {
                (libc::S_IFCHR, libc::makedev(1, 3))
            };
            // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
            checked(unsafe { libc::mknod(path.as_ptr(), kind | 0o600, dev) }.into())
        }
        "socket-inet" | "socket-unix" | "socket-netlink" => {
            let (family, kind) = match what {
                "socket-inet" => (libc::AF_INET, libc::SOCK_STREAM),
                "socket-unix" => (libc::AF_UNIX, libc::SOCK_STREAM),
                _ => (libc::AF_NETLINK, libc::SOCK_RAW),
            };
            // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
            let fd = unsafe { libc::socket(family, kind | libc::SOCK_CLOEXEC, 0) };
            let result = checked(fd.into());
            if fd >= 0 {
                // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
                unsafe { libc::close(fd) };
            }
            result
        }
        "connect-abstract" => {
            let name = input["name"].as_str().unwrap_or_default();
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name)
                .map_err(|e| e.to_string())?;
            std::os::unix::net::UnixStream::connect_addr(&address)
                .map(|_| "connected".to_string())
                .map_err(|e| e.to_string())
        }
        "io-uring" => {
            let mut params = [0u8; 120];
            // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
            let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
            let result = checked(fd);
            if fd >= 0 {
                // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
                unsafe { libc::close(fd as i32) };
            }
            result
        }
        "kill" => {
            let pid = input["pid"].as_i64().unwrap_or(0) as libc::pid_t;
            // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
            checked(unsafe { libc::kill(pid, 0) }.into())
        }
        "env" => {
            let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
            Ok(json!(env).to_string())
        }
        "caps" => Ok(std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("Cap"))
            .collect::<Vec<_>>()
            .join("\n")),
        "stderr" => {
            let mib = input["mib"].as_u64().unwrap_or(1) as usize;
            let line = input["line"].as_u64().unwrap_or(0) as usize;
            let mut chunk = vec![b'x'; 1 << 20];
            if line > 0 {
                for end in chunk.iter_mut().skip(line).step_by(line + 1) {
                    *end = b'\n';
                }
            }
            let mut stderr = std::io::stderr().lock();
            if input["invalid"].as_bool().unwrap_or(false) {
                stderr
                    .write_all(b"not utf-8: \xff\xfe\n")
                    .map_err(|e| e.to_string())?;
            }
            for _ in 0..mib {
                stderr.write_all(&chunk).map_err(|e| e.to_string())?;
            }
            stderr
                .write_all(b"\nend of flood\n")
                .map_err(|e| e.to_string())?;
            Ok(format!("wrote {mib} MiB"))
        }
        "fork" => {
            let mut pids = Vec::new();
            for (count, sleep) in [
                (input["zombies"].as_u64().unwrap_or(0), false),
                (input["sleepers"].as_u64().unwrap_or(0), true),
            ] {
                for _ in 0..count {
                    // Only async-signal-safe calls in the forked child.
                    // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
                    let pid = unsafe { libc::fork() };
                    if pid == 0 {
                        if sleep {
                            // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
                            unsafe { libc::sleep(3600) };
                        }
                        // SAFETY: a plain system call; its pointers are valid C strings or buffers that outlive it.
                        unsafe { libc::_exit(0) };
                    }
                    if pid < 0 {
                        return Err(std::io::Error::last_os_error().to_string());
                    }
                    pids.push(pid);
                }
            }
            Ok(json!(pids).to_string())
        }
        other => Err(format!("unknown attempt {other}")),
    }
}

impl Plugin for Hostile {
    fn manifest() -> Manifest {
        Manifest::new(name(), env!("CARGO_PKG_VERSION"))
            .description("tries what it must not")
            .capabilities([capability::TOOL_ADD])
    }

    fn init(ctx: Context) -> Result<Self> {
        ctx.tools().add(
            ToolSpec::new("try", "tries something"),
            |call: ToolCall| async move {
                Ok(match attempt(&call.input) {
                    Ok(done) => ToolResult::completed(&call, format!("ok: {done}")),
                    Err(error) => ToolResult::error(&call, format!("denied: {error}")),
                })
            },
        )?;
        Ok(Hostile {
            data_dir: ctx.data_dir()?,
        })
    }

    fn shutdown(&self) {
        let _ = std::fs::write(self.data_dir.join("shutdown.txt"), "shutdown ran");
    }
}

export_plugin!(Hostile, name = "hostile");
