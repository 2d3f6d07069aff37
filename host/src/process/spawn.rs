//! Starting a command: `tokio::process`, in a process group of its own.
//!
//! The command's exit is awaited through tokio's child handling, which
//! reaps it; the job tree's reaper never reaps a job's main process (see
//! `process::tree`). A step before the command's `exec` that fails (its
//! working directory, its program) is reported by [`spawn`] itself.
//!
//! Why not a hand-made clone: std spawns with `posix_spawn`, a
//! `CLONE_VFORK` clone that holds the calling runtime worker until the
//! child has exec'd (under a millisecond, more on a loaded machine). A
//! `CLONE_VM` clone without `CLONE_VFORK` returned at once and won about a
//! fifth of the throughput of `sh -c true` on two cores, for a command
//! that does nothing; real commands do not notice, and it ran the child in
//! the host's memory with raw system calls. ARCHITECTURE.md §PERF has the
//! figures.

use std::{io, os::fd::OwnedFd, path::Path, process::Stdio};

/// A command to start: a program with its arguments, the host's
/// environment less every `OFFSTAGE_*` variable plus one variable, a
/// working directory, and the three descriptors that become its stdin,
/// stdout and stderr.
pub(crate) struct Launch<'a> {
    pub program: &'a std::ffi::OsStr,
    pub args: &'a [std::ffi::OsString],
    /// Added to the host's environment (after the host's own `OFFSTAGE_*`
    /// variables are taken out).
    pub env: &'a [(&'a str, &'a std::ffi::OsStr)],
    pub cwd: Option<&'a Path>,
    pub stdio: [OwnedFd; 3],
}

/// What the names of the host's own environment variables start with; no
/// command gets one of them.
pub(crate) const HOST_PREFIX: &str = "OFFSTAGE_";

/// A started command, killed (SIGKILL) if dropped before it was waited
/// for.
pub(crate) type Child = tokio::process::Child;

/// Kills a command's process group (SIGKILL) when dropped, or when told
/// to: the command started it, so its grandchildren die with it.
pub(crate) struct GroupGuard {
    pgid: Option<rustix::process::Pid>,
}

impl GroupGuard {
    /// A guard of the group led by `pid` (the command's, which leads its
    /// own group); `None` guards nothing.
    pub(crate) fn new(pid: Option<u32>) -> GroupGuard {
        GroupGuard {
            pgid: pid.and_then(|pid| rustix::process::Pid::from_raw(pid.try_into().ok()?)),
        }
    }

    /// Kills the group now, once.
    pub(crate) fn kill(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            // A group that is gone already fails with ESRCH: nothing to do.
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Variables of the host's environment that no command gets, beside the
/// `OFFSTAGE_*` ones: the model agents' key variables (`api_key_env`),
/// which a model's own `echo $OPENAI_API_KEY` would otherwise print into
/// its output, the store and the events.
static HIDDEN: std::sync::RwLock<Vec<std::ffi::OsString>> = std::sync::RwLock::new(Vec::new());

/// Keeps the variable `name` out of every command started from now on.
pub(crate) fn hide_from_commands(name: &str) {
    let mut hidden = HIDDEN.write().unwrap_or_else(|e| e.into_inner());
    if !hidden.iter().any(|h| h == name) {
        hidden.push(name.into());
    }
}

/// Starts `launch` in a process group of its own. A command that cannot
/// start (its working directory, its program) fails here.
pub(crate) fn spawn(launch: Launch<'_>) -> io::Result<Child> {
    let [stdin, stdout, stderr] = launch.stdio;
    let mut command = tokio::process::Command::new(launch.program);
    // The host's settings are not the command's: `OFFSTAGE_TOKEN` would let
    // it call the host's API as its owner (and answer its own permission
    // questions), and the others say where the host's files are.
    for (name, _) in std::env::vars_os() {
        if name.as_encoded_bytes().starts_with(HOST_PREFIX.as_bytes()) {
            command.env_remove(name);
        }
    }
    for name in HIDDEN.read().unwrap_or_else(|e| e.into_inner()).iter() {
        command.env_remove(name);
    }
    command
        .args(launch.args)
        .envs(launch.env.iter().copied())
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = launch.cwd {
        command.current_dir(dir);
    }
    command.spawn()
}

#[cfg(test)]
mod tests {
    use std::{io::Read, os::fd::OwnedFd, path::Path, time::Duration};

    use super::{spawn, Launch};

    fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    fn dev_null() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    /// The command's exit code, or why it did not run.
    async fn exit_code(launch: Launch<'_>) -> std::io::Result<i32> {
        let mut child = spawn(launch)?;
        Ok(child.wait().await?.code().unwrap_or(-1))
    }

    /// Runs `script` under `/bin/sh -c` in `cwd`, with `OFFSTAGE_SPAWN_TEST`
    /// set: its exit code and what it wrote to stdout and stderr.
    async fn run(script: &str, cwd: Option<&Path>) -> std::io::Result<(i32, String)> {
        let (mut reader, writer) = std::io::pipe()?;
        let code = exit_code(Launch {
            program: "/bin/sh".as_ref(),
            args: &os(&["-c", script]),
            env: &[("OFFSTAGE_SPAWN_TEST", "marked".as_ref())],
            cwd,
            stdio: [dev_null(), writer.try_clone()?.into(), writer.into()],
        })
        .await?;
        let mut output = String::new();
        reader.read_to_string(&mut output)?;
        Ok((code, output))
    }

    /// A `/proc/self/status` line's hexadecimal mask.
    fn mask(status: &str, field: &str) -> u64 {
        let line = status
            .lines()
            .find(|line| line.starts_with(field))
            .unwrap_or_else(|| panic!("no {field} in {status}"));
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    }

    #[tokio::test]
    async fn a_command_gets_its_stdio_environment_directory_and_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let (code, output) = run(
            "echo out; echo err >&2; echo \"$OFFSTAGE_SPAWN_TEST\"; pwd; exit 7",
            Some(dir.path()),
        )
        .await
        .unwrap();
        assert_eq!(code, 7);
        let cwd = dir.path().canonicalize().unwrap();
        assert_eq!(output, format!("out\nerr\nmarked\n{}\n", cwd.display()));
    }

    #[tokio::test]
    async fn no_host_variable_reaches_the_command() {
        if std::env::var_os("OFFSTAGE_TOKEN").is_some() {
            let (code, output) = run("env | grep '^OFFSTAGE_' ; true", None).await.unwrap();
            assert_eq!(code, 0);
            assert_eq!(output, "OFFSTAGE_SPAWN_TEST=marked\n");
            return;
        }
        // Run again in a process that has the host's variables.
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "process::spawn::tests::no_host_variable_reaches_the_command",
            ])
            .env("OFFSTAGE_TOKEN", "secret-of-the-host")
            .env("OFFSTAGE_LOG", "debug")
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "the run with the host's variables failed");
    }

    #[tokio::test]
    async fn the_variable_replaces_one_of_the_same_name() {
        // `PATH` is in every environment: it is replaced, not doubled.
        let (mut reader, writer) = std::io::pipe().unwrap();
        let code = exit_code(Launch {
            program: "/bin/sh".as_ref(),
            args: &os(&["-c", "env | grep '^PATH='"]),
            env: &[("PATH", "/usr/bin:/bin:/offstage-test".as_ref())],
            cwd: None,
            stdio: [
                dev_null(),
                writer.try_clone().unwrap().into(),
                writer.into(),
            ],
        })
        .await
        .unwrap();
        assert_eq!(code, 0);
        let mut output = String::new();
        reader.read_to_string(&mut output).unwrap();
        assert_eq!(output, "PATH=/usr/bin:/bin:/offstage-test\n");
    }

    #[tokio::test]
    async fn a_command_leads_its_own_group_with_no_signal_blocked_and_sigpipe_default() {
        // `exec`: the status read is `cat`'s, which sets no handler itself.
        let (code, status) = run("exec cat /proc/self/status", None).await.unwrap();
        assert_eq!(code, 0);
        assert_eq!(mask(&status, "SigBlk:"), 0, "{status}");
        // Rust's runtime ignores SIGPIPE; its children get the default.
        assert_eq!(mask(&status, "SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0);
        let (_, ids) = run("exec cut -d' ' -f1,5 /proc/self/stat", None)
            .await
            .unwrap();
        let ids: Vec<&str> = ids.split_whitespace().collect();
        assert_eq!(ids[0], ids[1], "pid and process group: {ids:?}");
    }

    #[tokio::test]
    async fn what_cannot_start_fails_with_the_reason() {
        let gone = Path::new("/nonexistent/offstage-spawn-test");
        let error = run("true", Some(gone)).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound, "{error}");
        let error = exit_code(Launch {
            program: "/nonexistent/offstage-program".as_ref(),
            args: &os(&[]),
            env: &[("OFFSTAGE_SPAWN_TEST", "marked".as_ref())],
            cwd: None,
            stdio: [dev_null(), dev_null(), dev_null()],
        })
        .await
        .unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound, "{error}");
        let error = run("true", Some(Path::new("a\0b"))).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{error}");
    }

    /// Set in a child run of this test binary, which closes its stdin and
    /// stdout first.
    const LOW_FDS_VAR: &str = "OFFSTAGE_SPAWN_TEST_LOW_FDS";

    #[tokio::test]
    async fn descriptors_on_0_1_2_reach_the_right_stdio() {
        if std::env::var_os(LOW_FDS_VAR).is_some() {
            // SAFETY: nothing in this process uses them any more (std
            // ignores writes to a closed stdout).
            unsafe {
                libc::close(0);
                libc::close(1);
            }
            // Opened on 0 and 1: stderr's pipe sits where the child puts
            // its stdout, and would be replaced before it is used.
            let (mut err_read, err_write) = std::io::pipe().unwrap();
            let (mut out_read, out_write) = std::io::pipe().unwrap();
            let code = exit_code(Launch {
                program: "/bin/sh".as_ref(),
                args: &os(&["-c", "echo out; echo err >&2"]),
                env: &[("OFFSTAGE_SPAWN_TEST", "marked".as_ref())],
                cwd: None,
                stdio: [dev_null(), out_write.into(), err_write.into()],
            })
            .await
            .unwrap();
            assert_eq!(code, 0);
            let (mut out, mut err) = (String::new(), String::new());
            out_read.read_to_string(&mut out).unwrap();
            err_read.read_to_string(&mut err).unwrap();
            assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "process::spawn::tests::descriptors_on_0_1_2_reach_the_right_stdio",
            ])
            .env(LOW_FDS_VAR, "1")
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "the run with stdio closed failed");
    }

    /// Whether `pid` names a process (a zombie included).
    fn exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    async fn gone(pid: u32) -> bool {
        for _ in 0..200 {
            if !exists(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_dropped_command_is_killed_and_reaped() {
        let child = spawn(Launch {
            program: "/bin/sleep".as_ref(),
            args: &os(&["30"]),
            env: &[("OFFSTAGE_SPAWN_TEST", "marked".as_ref())],
            cwd: None,
            stdio: [dev_null(), dev_null(), dev_null()],
        })
        .unwrap();
        let pid = child.id().unwrap();
        // Exec'd: the command is `sleep` now, not a copy of this process.
        let mut name = String::new();
        for _ in 0..500 {
            name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
            if name.trim() == "sleep" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(name.trim(), "sleep");
        drop(child);
        assert!(gone(pid).await, "process {pid} outlived its handle");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_commands_start_at_once() {
        let mut tasks = Vec::new();
        for i in 0..64 {
            tasks.push(tokio::spawn(async move {
                run(&format!("echo {i}"), None).await.unwrap()
            }));
        }
        for (i, task) in tasks.into_iter().enumerate() {
            assert_eq!(task.await.unwrap(), (0, format!("{i}\n")));
        }
    }
}
