//! Starting a command without holding a runtime thread until it execs.
//!
//! `tokio::process` spawns through std, which uses glibc's `posix_spawn`:
//! a `CLONE_VFORK` clone, so the calling thread — a runtime worker — is
//! suspended until the child has called `exec`. On a busy machine the
//! child first waits for a core behind running commands (the kernel puts
//! a new task on the idlest core, usually another one), and the worker
//! stays suspended through that wait: 0.8–1.0 ms per call measured on two
//! cores running eight sessions' shell calls, with the host's other tasks
//! queued behind the blocked worker and its core idle (BENCHMARKS.md,
//! "fourth round"). Handing the spawn to another thread (`spawn_blocking`,
//! `block_in_place`) costs a hand-off per call and measured worse.
//!
//! So on Linux (x86_64 and aarch64) the child is cloned with `CLONE_VM`
//! but without `CLONE_VFORK`: the clone returns at once, and the task
//! awaits the outcome on a close-on-exec pipe — end of file: the child
//! exec'd; four bytes: the `errno` of the step that failed — while the
//! worker runs other tasks. The exit is awaited on a pidfd
//! (`CLONE_PIDFD`), registered with the runtime's reactor like a socket,
//! and reaped by pid (the job tree's reaper never reaps a job's main
//! process).
//!
//! Until it execs, the child runs in the host's memory, concurrently with
//! it. What it runs ([`child_main`]) therefore touches nothing but its own
//! stack and the arguments prepared for it: raw system calls (libc's
//! wrappers set `errno`, and the child runs with the spawning thread's
//! thread pointer, so its `errno` is that thread's), no allocation, no
//! lock. The host keeps that memory alive until the pipe says the child
//! exec'd or died ([`Launching`]). Signal handlers are the host's code:
//! every signal is blocked in the spawning thread across the clone (the
//! child starts with that mask), and the child sets each caught signal
//! back to its default before it unblocks them, as glibc's `posix_spawn`
//! does.
//!
//! Elsewhere, or on a kernel without pidfds (before 5.3), commands start
//! through `tokio::process` as before.

use std::{
    ffi::{c_char, CString},
    io,
    os::{
        fd::OwnedFd,
        unix::{ffi::OsStrExt, process::ExitStatusExt},
    },
    path::Path,
    process::{ExitStatus, Stdio},
    sync::LazyLock,
};

/// A command to start: a program with its arguments, the host's
/// environment plus one variable, a working directory, and the three
/// descriptors that become its stdin, stdout and stderr.
pub(crate) struct Launch<'a> {
    pub program: &'a str,
    pub args: &'a [&'a str],
    /// Added to (or replacing in) the host's environment.
    pub env: (&'a str, &'a str),
    pub cwd: Option<&'a Path>,
    pub stdio: [OwnedFd; 3],
}

/// A started command, killed (SIGKILL) if dropped before it was waited
/// for, like `tokio::process`'s `kill_on_drop`.
pub(crate) enum Child {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[cfg(target_os = "linux")]
    Direct(direct::Child),
    Tokio(tokio::process::Child),
}

impl Child {
    pub(crate) fn id(&self) -> Option<u32> {
        match self {
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            #[cfg(target_os = "linux")]
            Child::Direct(child) => child.id(),
            Child::Tokio(child) => child.id(),
        }
    }

    /// Waits for the command to exit and reaps it.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            #[cfg(target_os = "linux")]
            Child::Direct(child) => child.wait().await,
            Child::Tokio(child) => child.wait().await,
        }
    }
}

/// Starts `launch` in a process group of its own; returns once it has
/// exec'd (or failed to).
pub(crate) async fn spawn(launch: Launch<'_>) -> io::Result<Child> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[cfg(target_os = "linux")]
    let launch = if direct::supported() {
        match direct::spawn(launch).await {
            Ok(spawned) => return spawned.map(Child::Direct),
            // This kernel (or a sandbox around it) refuses the clone.
            Err(launch) => launch,
        }
    } else {
        launch
    };
    spawn_with_tokio(launch)
}

fn spawn_with_tokio(launch: Launch<'_>) -> io::Result<Child> {
    let [stdin, stdout, stderr] = launch.stdio;
    let mut command = tokio::process::Command::new(launch.program);
    command
        .args(launch.args)
        .env(launch.env.0, launch.env.1)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = launch.cwd {
        command.current_dir(dir);
    }
    command.spawn().map(Child::Tokio)
}

/// `bytes` as a C string; a NUL inside is an invalid argument.
fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument, path or variable contains a NUL byte",
        )
    })
}

/// The host's environment as `NAME=value` strings, read at the first
/// command: the host never changes its environment once it runs (in a
/// process with threads `set_var` is unsound, and nothing calls it), and
/// reading and copying it again for every command was a measurable part
/// of a short call (std's `Command::env` does that).
static HOST_ENV: LazyLock<Vec<CString>> = LazyLock::new(|| {
    std::env::vars_os()
        .filter_map(|(key, value)| {
            let mut entry = Vec::with_capacity(key.len() + value.len() + 1);
            entry.extend_from_slice(key.as_bytes());
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            // Never fails: the kernel separates entries with NUL.
            CString::new(entry).ok()
        })
        .collect()
});

/// The host's environment with `name` set to `value`: the pointers for
/// `execve`, the last one before the terminating null pointing into the
/// returned string.
fn environment(name: &str, value: &str) -> io::Result<(CString, Vec<*const c_char>)> {
    let added = c_string(format!("{name}={value}").as_bytes())?;
    let mut envp: Vec<*const c_char> = HOST_ENV
        .iter()
        .filter(|entry| {
            let entry = entry.as_bytes();
            !(entry.starts_with(name.as_bytes()) && entry.get(name.len()) == Some(&b'='))
        })
        .map(|entry| entry.as_ptr())
        .collect();
    envp.push(added.as_ptr());
    envp.push(std::ptr::null());
    Ok((added, envp))
}

/// Converts an exit status from `waitpid`.
fn exit_status(raw: i32) -> ExitStatus {
    ExitStatus::from_raw(raw)
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[cfg(target_os = "linux")]
mod direct {
    use std::{
        ffi::{c_char, c_int, c_void, CString},
        io,
        os::fd::{AsRawFd, FromRawFd, OwnedFd},
        process::ExitStatus,
        sync::{
            atomic::{AtomicBool, Ordering},
            LazyLock, Mutex,
        },
    };

    use tokio::io::unix::AsyncFd;

    use super::{c_string, environment, exit_status, Launch};
    use crate::util::LockExt;

    /// Set once a clone was refused (a sandbox's filter, an emulated
    /// kernel): every command starts through `tokio::process` from then on.
    static REFUSED: AtomicBool = AtomicBool::new(false);

    /// Whether commands start here: the kernel has pidfds that can be
    /// polled (5.3 and later, which also have `CLONE_PIDFD`), and no clone
    /// was refused.
    pub(super) fn supported() -> bool {
        if REFUSED.load(Ordering::Relaxed) {
            return false;
        }
        static SUPPORTED: LazyLock<bool> = LazyLock::new(|| {
            // SAFETY: a plain syscall; the descriptor is closed at once.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
            if fd < 0 {
                return false;
            }
            // SAFETY: the syscall just returned this descriptor to us.
            drop(unsafe { OwnedFd::from_raw_fd(fd as c_int) });
            true
        });
        *SUPPORTED
    }

    /// Bytes of stack the child gets before it execs: it runs one small
    /// function of raw system calls, so a few hundred bytes would do.
    const STACK_SIZE: usize = 64 * 1024;

    /// Stacks of children that have exec'd, kept for the next spawns: a
    /// fresh 64 KiB allocation per call and its free cost more than the
    /// clone's own bookkeeping.
    static STACKS: Mutex<Vec<Box<[u128]>>> = Mutex::new(Vec::new());

    /// Stacks kept at most (the calls starting at once, in practice).
    const STACKS_KEPT: usize = 32;

    fn take_stack() -> Box<[u128]> {
        STACKS
            .lock_unpoisoned()
            .pop()
            .unwrap_or_else(|| vec![0u128; STACK_SIZE / 16].into_boxed_slice())
    }

    fn give_back_stack(stack: Box<[u128]>) {
        let mut stacks = STACKS.lock_unpoisoned();
        if stacks.len() < STACKS_KEPT {
            stacks.push(stack);
        }
    }

    /// What the child reads before it execs: pointers into [`Prepared`].
    #[repr(C)]
    struct ChildArgs {
        program: *const c_char,
        argv: *const *const c_char,
        envp: *const *const c_char,
        /// Null: stay in the host's directory.
        cwd: *const c_char,
        stdio: [c_int; 3],
        /// The write end of the report pipe.
        report: c_int,
    }

    /// Everything the child's pointers point into. Boxed, so that it stays
    /// where it is while the spawning future moves, and freed only once
    /// the child can no longer read it.
    struct Prepared {
        _program: CString,
        _args: Vec<CString>,
        /// The variable added to the host's environment (the rest of
        /// `envp` points into the static `HOST_ENV`).
        _env: CString,
        _cwd: Option<CString>,
        _argv: Vec<*const c_char>,
        _envp: Vec<*const c_char>,
        stack: Option<Box<[u128]>>,
        child: ChildArgs,
    }

    // SAFETY: the raw pointers point into the CStrings owned alongside,
    // which are never changed; nothing is shared with another thread of
    // the host.
    unsafe impl Send for Prepared {}

    /// A child that has been cloned and may not have exec'd yet: until the
    /// report pipe says it did (or it died), it may read [`Prepared`].
    /// Dropped early (the spawning task was cancelled, or the child
    /// reported a failure), it kills the child and reaps it, blocking for
    /// the moment a killed process takes to die, before the memory goes.
    struct Launching {
        prepared: Option<Box<Prepared>>,
        pid: i32,
    }

    impl Drop for Launching {
        fn drop(&mut self) {
            let Some(mut prepared) = self.prepared.take() else {
                return;
            };
            // SAFETY: a plain syscall; the child is not reaped yet, so its
            // pid names it and nothing else.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let mut status = 0;
            // SAFETY: our own child, never reaped elsewhere; killed above,
            // so this returns once it is gone and reads nothing more.
            while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0
                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
            {}
            if let Some(stack) = prepared.stack.take() {
                give_back_stack(stack);
            }
        }
    }

    fn send_kill(pidfd: &OwnedFd) {
        // SAFETY: a plain syscall on a pidfd we own; a child that already
        // exited makes it fail harmlessly (the pidfd never names another
        // process).
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }

    /// A started command, see [`super::Child`].
    pub(crate) struct Child {
        pid: i32,
        /// `None` once reaped.
        pidfd: Option<AsyncFd<OwnedFd>>,
    }

    impl Child {
        pub(super) fn id(&self) -> Option<u32> {
            self.pidfd.as_ref().map(|_| self.pid as u32)
        }

        pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
            let Some(pidfd) = &self.pidfd else {
                return Err(io::Error::other("the command was already waited for"));
            };
            loop {
                let mut ready = pidfd.readable().await?;
                if let Some(status) = try_reap(self.pid)? {
                    self.pidfd = None;
                    return Ok(status);
                }
                ready.clear_ready();
            }
        }
    }

    /// Children killed on drop and not reaped yet (they had not died
    /// yet). A task reaps them as each dies; whatever it could not (the
    /// runtime was shutting down) the next spawn reaps.
    static UNREAPED: Mutex<Vec<i32>> = Mutex::new(Vec::new());

    /// Reaps each of [`UNREAPED`] that has died.
    fn reap_unreaped() {
        let mut unreaped = UNREAPED.lock_unpoisoned();
        if !unreaped.is_empty() {
            unreaped.retain(|&pid| matches!(try_reap(pid), Ok(None)));
        }
    }

    impl Drop for Child {
        fn drop(&mut self) {
            let Some(pidfd) = self.pidfd.take() else {
                return;
            };
            send_kill(pidfd.get_ref());
            if let Ok(Some(_)) = try_reap(self.pid) {
                return;
            }
            UNREAPED.lock_unpoisoned().push(self.pid);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    // Readable once it has died (or never, if registering
                    // failed: the next spawn reaps it then).
                    let _ = pidfd.readable().await;
                    reap_unreaped();
                });
            }
        }
    }

    /// Reaps `pid` if it has exited.
    fn try_reap(pid: i32) -> io::Result<Option<ExitStatus>> {
        let mut status = 0;
        loop {
            // SAFETY: waits for one specific child of ours, without
            // blocking; nothing else reaps it (see the module doc).
            let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            match reaped {
                0 => return Ok(None),
                -1 => {
                    let error = io::Error::last_os_error();
                    if error.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(error);
                }
                _ => return Ok(Some(exit_status(status))),
            }
        }
    }

    /// Starts `launch`, or gives it back if the kernel refuses the clone.
    pub(super) async fn spawn(launch: Launch<'_>) -> Result<io::Result<Child>, Launch<'_>> {
        reap_unreaped();
        let (launching, pidfd, report) = match clone_child(&launch) {
            Ok(cloned) => cloned,
            Err(Cloned::Refused) => {
                REFUSED.store(true, Ordering::Relaxed);
                tracing::warn!("commands start through posix_spawn: this kernel refuses a CLONE_VM | CLONE_PIDFD clone");
                return Err(launch);
            }
            Err(Cloned::Failed(error)) => return Ok(Err(error)),
        };
        // The child has its own copies of the command's descriptors.
        drop(launch);
        Ok(await_exec(launching, pidfd, report).await)
    }

    /// Waits for the child's report: exec'd, or why not.
    async fn await_exec(
        mut launching: Launching,
        pidfd: OwnedFd,
        report: std::io::PipeReader,
    ) -> io::Result<Child> {
        let report = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(report))?;
        let mut failed = [0u8; 4];
        let mut read = 0;
        loop {
            report.readable().await?;
            match report.try_read(&mut failed[read..]) {
                Ok(0) => break,
                Ok(n) => {
                    read += n;
                    if read == failed.len() {
                        break;
                    }
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(error) => return Err(error),
            }
        }
        if read == failed.len() {
            // It wrote its error and exits: `launching` reaps it.
            return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(failed)));
        }
        // End of file with nothing written: it exec'd (or was killed from
        // outside first; its exit status will say).
        // SAFETY: the pidfd is owned by the AsyncFd from here on.
        let pidfd =
            unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
                .map_err(|error| error.into_parts().1)?;
        // Its memory is its own now.
        let mut prepared = launching.prepared.take().expect("set by clone_child");
        if let Some(stack) = prepared.stack.take() {
            give_back_stack(stack);
        }
        Ok(Child {
            pid: launching.pid,
            pidfd: Some(pidfd),
        })
    }

    /// Why [`clone_child`] did not start a child.
    enum Cloned {
        /// The kernel refused this kind of clone; another way may work.
        Refused,
        Failed(io::Error),
    }

    impl From<io::Error> for Cloned {
        fn from(error: io::Error) -> Self {
            Cloned::Failed(error)
        }
    }

    /// `fd`, or a close-on-exec duplicate of it numbered 3 or above if it
    /// is 0, 1 or 2 (the host may have closed its own stdio): the child
    /// puts its stdio on 0, 1 and 2, and a descriptor it still needs
    /// there would be replaced under it — the report pipe's write end
    /// closed early would tell the host it exec'd before it did.
    fn above_stdio(fd: &OwnedFd, kept: &mut Vec<OwnedFd>) -> io::Result<c_int> {
        if fd.as_raw_fd() > 2 {
            return Ok(fd.as_raw_fd());
        }
        // SAFETY: a plain fcntl; the new descriptor is owned by `kept`.
        let raised = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
        if raised < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fcntl just returned this descriptor to us.
        kept.push(unsafe { OwnedFd::from_raw_fd(raised) });
        Ok(raised)
    }

    /// Prepares the child's memory and clones it.
    fn clone_child(
        launch: &Launch<'_>,
    ) -> Result<(Launching, OwnedFd, std::io::PipeReader), Cloned> {
        let program = c_string(launch.program.as_bytes())?;
        let mut args = vec![program.clone()];
        for arg in launch.args {
            args.push(c_string(arg.as_bytes())?);
        }
        let (env, envp) = environment(launch.env.0, launch.env.1)?;
        let cwd = match launch.cwd {
            Some(dir) => Some(c_string(std::os::unix::ffi::OsStrExt::as_bytes(
                dir.as_os_str(),
            ))?),
            None => None,
        };
        let argv: Vec<*const c_char> = args
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let (report_read, report_write) = std::io::pipe()?;
        let report_write = OwnedFd::from(report_write);
        // Dropped after the clone, as `report_write` and the launch's
        // descriptors are: the child has its own copies then.
        let mut kept = Vec::new();
        let report = above_stdio(&report_write, &mut kept)?;
        let [stdin, stdout, stderr] = &launch.stdio;
        let stdio = [
            above_stdio(stdin, &mut kept)?,
            above_stdio(stdout, &mut kept)?,
            above_stdio(stderr, &mut kept)?,
        ];
        let child = ChildArgs {
            program: program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            stdio,
            report,
        };
        let mut prepared = Box::new(Prepared {
            _program: program,
            _args: args,
            _env: env,
            _cwd: cwd,
            _argv: argv,
            _envp: envp,
            stack: Some(take_stack()),
            child,
        });
        let stack = prepared.stack.as_mut().expect("just set");
        // SAFETY: one past the end of the stack's allocation, 16-byte
        // aligned (it is made of u128); the stack grows down from there.
        let stack_top = unsafe { stack.as_mut_ptr().add(stack.len()) }.cast::<c_void>();
        let args_ptr = std::ptr::from_ref(&prepared.child)
            .cast_mut()
            .cast::<c_void>();
        let mut pidfd: c_int = -1;
        // SAFETY: every signal is blocked in this thread across the clone
        // (by the system call: libc's wrappers leave out the two it uses
        // itself), so that no handler of the host runs in the child before
        // it reset the handlers; the previous mask is put back right
        // after. The child runs `child_main` on its own stack with
        // pointers into `prepared`, which outlives its use (`Launching`).
        let (pid, error) = unsafe {
            let all: u64 = !0;
            let mut previous: u64 = 0;
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &raw const all,
                &raw mut previous,
                8,
            );
            let pid = libc::clone(
                child_main,
                stack_top,
                libc::CLONE_VM | libc::CLONE_PIDFD | libc::SIGCHLD,
                args_ptr,
                &raw mut pidfd,
            );
            let error = io::Error::last_os_error();
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &raw const previous,
                std::ptr::null_mut::<u64>(),
                8,
            );
            (pid, error)
        };
        drop(kept);
        drop(report_write);
        if pid < 0 {
            return Err(match error.raw_os_error() {
                Some(libc::EINVAL | libc::ENOSYS | libc::EPERM) => Cloned::Refused,
                _ => Cloned::Failed(error),
            });
        }
        let launching = Launching {
            prepared: Some(prepared),
            pid,
        };
        if pidfd < 0 {
            // A kernel that ignored the flag: `launching` kills and reaps
            // the child as it goes.
            return Err(Cloned::Refused);
        }
        // SAFETY: CLONE_PIDFD stored a new descriptor here.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        Ok((launching, pidfd, report_read))
    }

    /// The kernel's `struct sigaction` (x86_64 and aarch64 alike).
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }

    /// The child, in the host's memory until it execs: raw system calls
    /// only (see the module doc). Never returns.
    extern "C" fn child_main(arg: *mut c_void) -> c_int {
        // SAFETY: `arg` is the `ChildArgs` that the parent keeps alive
        // until this process has exec'd or died.
        let args = unsafe { &*(arg as *const ChildArgs) };
        // SAFETY: system calls on the child's own descriptors, signal
        // table and memory it only reads.
        let errno = unsafe { set_up_and_exec(args) };
        let bytes = errno.to_ne_bytes();
        // SAFETY: as above; `exit` ends this process only (no
        // CLONE_THREAD).
        unsafe {
            sys::call(
                libc::SYS_write,
                [
                    args.report as usize,
                    bytes.as_ptr() as usize,
                    bytes.len(),
                    0,
                ],
            );
            sys::call(libc::SYS_exit, [127, 0, 0, 0]);
        }
        127
    }

    /// Sets the child up and execs; returns the `errno` of what failed.
    ///
    /// Every statement is a raw system call on the child's own descriptors
    /// and signal state, reading memory the host keeps alive: one safety
    /// argument (the caller's) covers them all.
    #[allow(unsafe_op_in_unsafe_fn)]
    unsafe fn set_up_and_exec(args: &ChildArgs) -> i32 {
        macro_rules! check {
            ($call:expr) => {
                let result = $call;
                if result < 0 {
                    return (-result) as i32;
                }
            };
        }
        // A process group of its own: the job is killed by its group.
        check!(sys::call(libc::SYS_setpgid, [0, 0, 0, 0]));
        for (target, &fd) in args.stdio.iter().enumerate() {
            if fd as usize == target {
                // Already in place: only its close-on-exec flag goes.
                check!(sys::call(
                    libc::SYS_fcntl,
                    [fd as usize, libc::F_SETFD as usize, 0, 0]
                ));
            } else {
                check!(sys::call(libc::SYS_dup3, [fd as usize, target, 0, 0]));
            }
        }
        if !args.cwd.is_null() {
            check!(sys::call(libc::SYS_chdir, [args.cwd as usize, 0, 0, 0]));
        }
        // Handlers are the host's code: each caught signal goes back to its
        // default. SIGPIPE too, which Rust's runtime ignores and std resets
        // for its children.
        let default = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        for signal in 1..=64usize {
            if signal == libc::SIGKILL as usize || signal == libc::SIGSTOP as usize {
                continue;
            }
            let mut current = KernelSigaction {
                handler: 0,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            let read = sys::call(
                libc::SYS_rt_sigaction,
                [signal, 0, &raw mut current as usize, 8],
            );
            let caught = current.handler != libc::SIG_DFL && current.handler != libc::SIG_IGN;
            if read == 0 && (caught || signal == libc::SIGPIPE as usize) {
                sys::call(
                    libc::SYS_rt_sigaction,
                    [signal, &raw const default as usize, 0, 8],
                );
            }
        }
        // No signal blocked, as std gives its children.
        let empty: u64 = 0;
        check!(sys::call(
            libc::SYS_rt_sigprocmask,
            [libc::SIG_SETMASK as usize, &raw const empty as usize, 0, 8]
        ));
        let result = sys::call(
            libc::SYS_execve,
            [
                args.program as usize,
                args.argv as usize,
                args.envp as usize,
                0,
            ],
        );
        (-result) as i32
    }

    /// Raw system calls: a negative result is `-errno`, and nothing else
    /// is touched.
    mod sys {
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        pub(super) unsafe fn call(number: libc::c_long, args: [usize; 4]) -> isize {
            let result: isize;
            // SAFETY: the caller's; `syscall` clobbers rcx and r11.
            unsafe {
                std::arch::asm!(
                    "syscall",
                    inlateout("rax") number as isize => result,
                    in("rdi") args[0],
                    in("rsi") args[1],
                    in("rdx") args[2],
                    in("r10") args[3],
                    lateout("rcx") _,
                    lateout("r11") _,
                    options(nostack),
                );
            }
            result
        }

        #[cfg(target_arch = "aarch64")]
        #[inline(always)]
        pub(super) unsafe fn call(number: libc::c_long, args: [usize; 4]) -> isize {
            let result: isize;
            // SAFETY: the caller's.
            unsafe {
                std::arch::asm!(
                    "svc 0",
                    in("x8") number,
                    inlateout("x0") args[0] as isize => result,
                    in("x1") args[1],
                    in("x2") args[2],
                    in("x3") args[3],
                    options(nostack),
                );
            }
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{future::Future, io::Read, os::fd::OwnedFd, path::Path, task::Poll, time::Duration};

    use super::{spawn, Launch};

    /// Runs `script` under `/bin/sh -c` in `cwd`, with `OFFSTAGE_SPAWN_TEST`
    /// set: its exit status and what it wrote to stdout and stderr.
    async fn run(script: &str, cwd: Option<&Path>) -> std::io::Result<(i32, String)> {
        let (mut reader, writer) = std::io::pipe()?;
        let mut child = spawn(Launch {
            program: "/bin/sh",
            args: &["-c", script],
            env: ("OFFSTAGE_SPAWN_TEST", "marked"),
            cwd,
            stdio: [
                OwnedFd::from(std::fs::File::open("/dev/null")?),
                writer.try_clone()?.into(),
                writer.into(),
            ],
        })
        .await?;
        let status = child.wait().await?;
        let mut output = String::new();
        reader.read_to_string(&mut output)?;
        Ok((status.code().unwrap_or(-1), output))
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
    async fn the_variable_replaces_one_of_the_same_name() {
        // `PATH` is in every environment: it is replaced, not doubled.
        let (mut reader, writer) = std::io::pipe().unwrap();
        let mut child = spawn(Launch {
            program: "/bin/sh",
            args: &["-c", "env | grep '^PATH='"],
            env: ("PATH", "/usr/bin:/bin:/offstage-test"),
            cwd: None,
            stdio: [
                OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
                writer.try_clone().unwrap().into(),
                writer.into(),
            ],
        })
        .await
        .unwrap();
        assert!(child.wait().await.unwrap().success());
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
    async fn what_cannot_start_fails_the_spawn_with_the_reason() {
        let gone = Path::new("/nonexistent/offstage-spawn-test");
        let error = run("true", Some(gone)).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound, "{error}");
        let error = spawn(Launch {
            program: "/nonexistent/offstage-program",
            args: &[],
            env: ("OFFSTAGE_SPAWN_TEST", "marked"),
            cwd: None,
            stdio: [
                OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
                OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
                OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
            ],
        })
        .await
        .err()
        .expect("a missing program cannot start");
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound, "{error}");
        let error = run("true", Some(Path::new("a\0b"))).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{error}");
    }

    /// Set in a child run of this test binary, which closes its stdin and
    /// stdout first.
    const LOW_FDS_VAR: &str = "OFFSTAGE_SPAWN_TEST_LOW_FDS";

    #[tokio::test]
    async fn a_host_without_stdin_and_stdout_still_hears_why_a_command_failed() {
        if std::env::var_os(LOW_FDS_VAR).is_some() {
            let stdio = null_stdio();
            // The next descriptors opened are 0 and 1: the report pipe's
            // among them, where the command's stdio goes.
            // SAFETY: nothing in this process uses them any more (std
            // ignores writes to a closed stdout).
            unsafe {
                libc::close(0);
                libc::close(1);
            }
            let error = spawn(Launch {
                program: "/nonexistent/offstage-program",
                args: &[],
                env: ("OFFSTAGE_SPAWN_TEST", "marked"),
                cwd: None,
                stdio,
            })
            .await
            .err()
            .expect("a missing program cannot start");
            assert_eq!(error.kind(), std::io::ErrorKind::NotFound, "{error}");
            let (code, output) = run("echo still here", None).await.unwrap();
            assert_eq!((code, output.as_str()), (0, "still here\n"));
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tool::spawn::tests::a_host_without_stdin_and_stdout_still_hears_why_a_command_failed",
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

    fn null_stdio() -> [OwnedFd; 3] {
        std::array::from_fn(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
    }

    #[tokio::test]
    async fn a_dropped_command_is_killed_and_reaped() {
        let child = spawn(Launch {
            program: "/bin/sleep",
            args: &["30"],
            env: ("OFFSTAGE_SPAWN_TEST", "marked"),
            cwd: None,
            stdio: null_stdio(),
        })
        .await
        .unwrap();
        let pid = child.id().unwrap();
        assert!(exists(pid));
        drop(child);
        assert!(gone(pid).await, "process {pid} outlived its handle");
    }

    #[tokio::test]
    async fn a_spawn_dropped_before_the_exec_kills_its_command() {
        let dir = tempfile::tempdir().unwrap();
        let late = dir.path().join("late");
        let script = format!("sleep 0.3; touch {}", late.display());
        let args = ["-c", script.as_str()];
        for _ in 0..20 {
            let mut spawning = Box::pin(spawn(Launch {
                program: "/bin/sh",
                args: &args,
                env: ("OFFSTAGE_SPAWN_TEST", "marked"),
                cwd: None,
                stdio: null_stdio(),
            }));
            // One poll clones the child; dropping the future then must
            // not leave it running (nor free what it still reads).
            let first =
                std::future::poll_fn(|cx| Poll::Ready(spawning.as_mut().poll(cx).is_pending()))
                    .await;
            drop(spawning);
            assert!(first || !late.exists());
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(!late.exists(), "a cancelled spawn's command ran on");
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
