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
//! but without `CLONE_VFORK`, and [`spawn`] returns at once: the child
//! sets itself up and execs while the worker runs other tasks. Its exit is
//! awaited on a pidfd (`CLONE_PIDFD`), registered with the runtime's
//! reactor like a socket, and reaped by pid (the job tree's reaper never
//! reaps a job's main process). A step before the `exec` that fails (the
//! working directory, the program) is written by the child into memory it
//! shares with the host, and [`Child::wait`] reports it once the child is
//! reaped. A close-on-exec pipe that the host awaits — std's way, and this
//! module's first — cost a pipe, two reactor registrations and a wake-up
//! per call; memory the child writes needs none of them.
//!
//! Until it execs, the child runs in the host's memory, concurrently with
//! it. What it runs (`child_main`) therefore touches nothing but its own
//! stack and what was prepared for it: raw system calls (libc's wrappers
//! set `errno`, and the child runs with the spawning thread's thread
//! pointer, so its `errno` is that thread's), no allocation, no lock. The
//! host keeps that memory until the kernel says the child let go of it
//! (`CLONE_CHILD_CLEARTID`: a word cleared at its `exec` or exit) or the
//! child is reaped; a child dropped before is killed, and its memory kept
//! until it is gone. Signal handlers are the host's code: every signal is
//! blocked in the spawning thread across the clone (the child starts with
//! that mask), and the child sets each caught signal back to its default
//! before it unblocks them, as glibc's `posix_spawn` does. The child puts
//! the command's stdio on 0, 1 and 2; a descriptor of the host's that is
//! itself 0, 1 or 2 (a host started with its stdio closed) is duplicated
//! above them first, so that none is replaced before it is used.
//!
//! Elsewhere, on a kernel without pidfds (before 5.3), or where the clone
//! is refused (a sandbox's filter), commands start through
//! `tokio::process`.

use std::{
    io,
    os::fd::OwnedFd,
    path::Path,
    process::{ExitStatus, Stdio},
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

/// Why [`Child::wait`] has no exit status.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// The command never ran: a step before its `exec` failed (its
    /// working directory, its program).
    Start(io::Error),
    /// Waiting failed.
    Wait(io::Error),
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
    pub(crate) async fn wait(&mut self) -> Result<ExitStatus, WaitError> {
        match self {
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            #[cfg(target_os = "linux")]
            Child::Direct(child) => child.wait().await,
            Child::Tokio(child) => child.wait().await.map_err(WaitError::Wait),
        }
    }
}

/// Starts `launch` in a process group of its own. Returns at once: a step
/// before the command's `exec` that fails (its working directory, its
/// program) may be reported here or by [`Child::wait`].
pub(crate) fn spawn(launch: Launch<'_>) -> io::Result<Child> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[cfg(target_os = "linux")]
    if direct::supported() {
        match direct::spawn(&launch) {
            Ok(child) => return Ok(Child::Direct(child)),
            Err(direct::Refused::Failed(error)) => return Err(error),
            // This kernel (or a sandbox around it) refuses the clone.
            Err(direct::Refused::Clone) => {
                tracing::warn!(
                    "commands start through posix_spawn: this kernel refuses a CLONE_VM | CLONE_PIDFD clone"
                );
                direct::refuse();
            }
        }
    }
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

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[cfg(target_os = "linux")]
mod direct {
    use std::{
        ffi::{c_char, c_int, c_void, CString},
        io,
        os::{
            fd::{AsRawFd, FromRawFd, OwnedFd},
            unix::{ffi::OsStrExt, process::ExitStatusExt},
        },
        process::ExitStatus,
        sync::{
            atomic::{AtomicBool, AtomicI32, Ordering},
            LazyLock, Mutex,
        },
    };

    use tokio::io::unix::AsyncFd;

    use super::{Launch, WaitError};
    use crate::util::LockExt;

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

    /// Set once a clone was refused (a sandbox's filter, an emulated
    /// kernel): every command starts through `tokio::process` from then on.
    static REFUSED: AtomicBool = AtomicBool::new(false);

    pub(super) fn refuse() {
        REFUSED.store(true, Ordering::Relaxed);
    }

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

    /// Bytes of stack the child gets before it execs. It runs one small
    /// function of raw system calls (under a kilobyte of frames even in a
    /// debug build); a stack is held until its child has exec'd and the
    /// host has looked, so it is kept small.
    const STACK_SIZE: usize = 16 * 1024;

    /// Stacks given back, kept for the next spawns: an allocation and its
    /// free per call cost more than the clone's own bookkeeping.
    static STACKS: Mutex<Vec<Box<[u128]>>> = Mutex::new(Vec::new());

    /// Stacks kept at most (the calls starting at once, in practice).
    const STACKS_KEPT: usize = 32;

    fn take_stack() -> Box<[u128]> {
        STACKS
            .lock_unpoisoned()
            .pop()
            .unwrap_or_else(|| vec![0u128; STACK_SIZE / 16].into_boxed_slice())
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
        /// Where the child writes the `errno` of the step that failed.
        failed: *const AtomicI32,
    }

    /// Everything the child's pointers point into. Boxed, so that it stays
    /// where it is while the [`Child`] moves, and let go only once the
    /// child can no longer read it.
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

    // SAFETY: the raw pointers point into the CStrings owned alongside and
    // into the `Outcome` of the same `Child`, neither ever moved or changed
    // by the host while the child may read them.
    unsafe impl Send for Prepared {}

    impl Drop for Prepared {
        fn drop(&mut self) {
            if let Some(stack) = self.stack.take() {
                let mut stacks = STACKS.lock_unpoisoned();
                if stacks.len() < STACKS_KEPT {
                    stacks.push(stack);
                }
            }
        }
    }

    /// What the kernel and the child write for the host.
    struct Outcome {
        /// `CLONE_CHILD_CLEARTID`'s word: the kernel sets it to 0 once the
        /// child has let go of the host's memory (it exec'd or exited).
        attached: AtomicI32,
        /// The `errno` of the step that failed, or 0: it exec'd.
        failed: AtomicI32,
    }

    /// A started command, see [`super::Child`].
    pub(crate) struct Child {
        pid: i32,
        /// `None` once reaped.
        pidfd: Option<AsyncFd<OwnedFd>>,
        /// `None` once the child let go of it.
        prepared: Option<Box<Prepared>>,
        outcome: Box<Outcome>,
    }

    impl Child {
        pub(super) fn id(&self) -> Option<u32> {
            self.pidfd.as_ref().map(|_| self.pid as u32)
        }

        /// Lets go of the child's arguments and stack once it no longer
        /// uses them.
        fn release_if_detached(&mut self) {
            if self.prepared.is_some() && self.outcome.attached.load(Ordering::Acquire) == 0 {
                self.prepared = None;
            }
        }

        pub(super) async fn wait(&mut self) -> Result<ExitStatus, WaitError> {
            self.release_if_detached();
            let Some(pidfd) = &self.pidfd else {
                return Err(WaitError::Wait(io::Error::other(
                    "the command was already waited for",
                )));
            };
            let status = loop {
                let mut ready = pidfd.readable().await.map_err(WaitError::Wait)?;
                if let Some(status) = try_reap(self.pid).map_err(WaitError::Wait)? {
                    break status;
                }
                ready.clear_ready();
            };
            self.pidfd = None;
            // Reaped: it reads and writes nothing any more.
            self.prepared = None;
            match self.outcome.failed.load(Ordering::Acquire) {
                0 => Ok(status),
                errno => Err(WaitError::Start(io::Error::from_raw_os_error(errno))),
            }
        }
    }

    /// A child killed on drop that had not died yet, with the memory it
    /// may still use until it has.
    struct Unreaped {
        pid: i32,
        _prepared: Option<Box<Prepared>>,
        _outcome: Box<Outcome>,
    }

    /// Children killed on drop and not reaped yet. A task reaps them as
    /// each dies; whatever it could not (the runtime was shutting down)
    /// the next spawn reaps.
    static UNREAPED: Mutex<Vec<Unreaped>> = Mutex::new(Vec::new());

    /// Reaps each of [`UNREAPED`] that has died, and lets go of its memory.
    fn reap_unreaped() {
        let mut unreaped = UNREAPED.lock_unpoisoned();
        if !unreaped.is_empty() {
            unreaped.retain(|child| matches!(try_reap(child.pid), Ok(None)));
        }
    }

    impl Drop for Child {
        fn drop(&mut self) {
            let Some(pidfd) = self.pidfd.take() else {
                return;
            };
            // SAFETY: a plain syscall on a pidfd we own, of a child not
            // reaped yet.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            }
            if let Ok(Some(_)) = try_reap(self.pid) {
                return;
            }
            UNREAPED.lock_unpoisoned().push(Unreaped {
                pid: self.pid,
                _prepared: self.prepared.take(),
                _outcome: std::mem::replace(
                    &mut self.outcome,
                    Box::new(Outcome {
                        attached: AtomicI32::new(0),
                        failed: AtomicI32::new(0),
                    }),
                ),
            });
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
                _ => return Ok(Some(ExitStatus::from_raw(status))),
            }
        }
    }

    /// Why [`spawn`] did not start a child.
    #[derive(Debug)]
    pub(super) enum Refused {
        /// The kernel refused this kind of clone; another way may work.
        Clone,
        Failed(io::Error),
    }

    impl From<io::Error> for Refused {
        fn from(error: io::Error) -> Self {
            Refused::Failed(error)
        }
    }

    /// `fd`, or a close-on-exec duplicate of it numbered 3 or above if it
    /// is 0, 1 or 2 (the host may have closed its own stdio): the child
    /// puts the command's stdio on 0, 1 and 2, and a descriptor it still
    /// needs there would be replaced under it.
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

    /// Prepares the child's memory and clones it; returns at once (the
    /// child may not have exec'd yet).
    pub(super) fn spawn(launch: &Launch<'_>) -> Result<Child, Refused> {
        // The child is waited for on the runtime's reactor. Without one,
        // registering its pidfd below would panic with the child already
        // running in this process's memory, and unwinding would free that
        // memory under it: refuse before cloning.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Refused::Failed(io::Error::other(
                "a command can only start inside a tokio runtime",
            )));
        }
        reap_unreaped();
        let program = c_string(launch.program.as_bytes())?;
        let mut args = vec![program.clone()];
        for arg in launch.args {
            args.push(c_string(arg.as_bytes())?);
        }
        let (env, envp) = environment(launch.env.0, launch.env.1)?;
        let cwd = match launch.cwd {
            Some(dir) => Some(c_string(dir.as_os_str().as_bytes())?),
            None => None,
        };
        let argv: Vec<*const c_char> = args
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        // Dropped after the clone, as the launch's descriptors are: the
        // child has its own copies then.
        let mut kept = Vec::new();
        let [stdin, stdout, stderr] = &launch.stdio;
        let stdio = [
            above_stdio(stdin, &mut kept)?,
            above_stdio(stdout, &mut kept)?,
            above_stdio(stderr, &mut kept)?,
        ];
        let outcome = Box::new(Outcome {
            attached: AtomicI32::new(-1),
            failed: AtomicI32::new(0),
        });
        let child = ChildArgs {
            program: program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            stdio,
            failed: &raw const outcome.failed,
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
        // pointers into `prepared` and `outcome`, which the `Child` keeps
        // until the kernel clears `attached` or the child is reaped.
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
                libc::CLONE_VM | libc::CLONE_PIDFD | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD,
                args_ptr,
                &raw mut pidfd,
                std::ptr::null_mut::<c_void>(),
                outcome.attached.as_ptr(),
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
        if pid < 0 {
            return Err(match error.raw_os_error() {
                Some(libc::EINVAL | libc::ENOSYS | libc::EPERM) => Refused::Clone,
                _ => Refused::Failed(error),
            });
        }
        if pidfd < 0 {
            // A kernel that ignored the flag.
            kill_and_reap(pid);
            return Err(Refused::Clone);
        }
        // SAFETY: CLONE_PIDFD stored a new descriptor here.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let mut child = Child {
            pid,
            pidfd: None,
            prepared: Some(prepared),
            outcome,
        };
        // SAFETY: the pidfd is owned by the AsyncFd from here on. If it
        // cannot be registered, the child is killed and reaped by pid
        // before `child` (and the memory it may still use) drops; with no
        // pidfd, `Drop` does not run its kill.
        match unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) } {
            Ok(registered) => child.pidfd = Some(registered),
            Err(error) => {
                kill_and_reap(pid);
                return Err(Refused::Failed(error.into_parts().1));
            }
        }
        Ok(child)
    }

    /// Kills our child `pid`, not reaped yet, and waits until it is gone:
    /// for a child that cannot be waited for on the runtime, before the
    /// memory it may still be using is freed. Blocks for as long as a
    /// killed process takes to go.
    fn kill_and_reap(pid: libc::pid_t) {
        // SAFETY: our child, not reaped: its pid names it.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let mut status = 0;
        // SAFETY: as above.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
            && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
        {}
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
        // SAFETY: `failed` points into the host's `Outcome`, kept as long
        // as `args`; an atomic store is a plain instruction. `exit` ends
        // this process only (no CLONE_THREAD), and the kernel then clears
        // `attached`, which the host reads after this store.
        unsafe {
            (*args.failed).store(errno.max(1), Ordering::Release);
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
        // Each is numbered 3 or above (`above_stdio`): a `dup3` onto 0–2
        // always moves it.
        for (target, &fd) in args.stdio.iter().enumerate() {
            check!(sys::call(libc::SYS_dup3, [fd as usize, target, 0, 0]));
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
    use std::{io::Read, os::fd::OwnedFd, path::Path, time::Duration};

    use super::{spawn, Launch, WaitError};

    fn dev_null() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    /// The command's exit code, or why it did not run.
    async fn exit_code(launch: Launch<'_>) -> std::io::Result<i32> {
        let mut child = spawn(launch)?;
        match child.wait().await {
            Ok(status) => Ok(status.code().unwrap_or(-1)),
            Err(WaitError::Start(error) | WaitError::Wait(error)) => Err(error),
        }
    }

    /// Runs `script` under `/bin/sh -c` in `cwd`, with `OFFSTAGE_SPAWN_TEST`
    /// set: its exit code and what it wrote to stdout and stderr.
    async fn run(script: &str, cwd: Option<&Path>) -> std::io::Result<(i32, String)> {
        let (mut reader, writer) = std::io::pipe()?;
        let code = exit_code(Launch {
            program: "/bin/sh",
            args: &["-c", script],
            env: ("OFFSTAGE_SPAWN_TEST", "marked"),
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
    async fn the_variable_replaces_one_of_the_same_name() {
        // `PATH` is in every environment: it is replaced, not doubled.
        let (mut reader, writer) = std::io::pipe().unwrap();
        let code = exit_code(Launch {
            program: "/bin/sh",
            args: &["-c", "env | grep '^PATH='"],
            env: ("PATH", "/usr/bin:/bin:/offstage-test"),
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
        // Said by the spawn (posix_spawn) or by the wait (a direct clone).
        let error = exit_code(Launch {
            program: "/nonexistent/offstage-program",
            args: &[],
            env: ("OFFSTAGE_SPAWN_TEST", "marked"),
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
                program: "/bin/sh",
                args: &["-c", "echo out; echo err >&2"],
                env: ("OFFSTAGE_SPAWN_TEST", "marked"),
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
                "tool::spawn::tests::descriptors_on_0_1_2_reach_the_right_stdio",
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
            program: "/bin/sleep",
            args: &["30"],
            env: ("OFFSTAGE_SPAWN_TEST", "marked"),
            cwd: None,
            stdio: [dev_null(), dev_null(), dev_null()],
        })
        .unwrap();
        let pid = child.id().unwrap();
        // On a kernel that takes the clone, the host's own way is the one
        // that ran (a refused clone turns `supported` off for good).
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        #[cfg(target_os = "linux")]
        if super::direct::supported() {
            assert!(matches!(child, super::Child::Direct(_)));
        }
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

    #[tokio::test]
    async fn a_command_dropped_before_its_exec_never_runs() {
        let dir = tempfile::tempdir().unwrap();
        let late = dir.path().join("late");
        let script = format!("sleep 0.3; touch {}", late.display());
        let mut pids = Vec::new();
        for _ in 0..20 {
            let child = spawn(Launch {
                program: "/bin/sh",
                args: &["-c", &script],
                env: ("OFFSTAGE_SPAWN_TEST", "marked"),
                cwd: None,
                stdio: [dev_null(), dev_null(), dev_null()],
            })
            .unwrap();
            pids.push(child.id().unwrap());
            // At once: usually before the child has exec'd, while it still
            // runs in this process's memory (which must outlive it).
            drop(child);
        }
        for pid in pids {
            assert!(gone(pid).await, "process {pid} outlived its handle");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!late.exists(), "a dropped command ran on");
    }

    /// Outside a runtime the child could not be waited for: the host's own
    /// way refuses before it clones (the child would otherwise run in
    /// memory freed under it).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[cfg(target_os = "linux")]
    #[test]
    fn outside_a_runtime_a_command_is_refused_before_it_starts() {
        if !super::direct::supported() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let ran = dir.path().join("ran");
        let script = format!("touch {}", ran.display());
        let error = super::direct::spawn(&Launch {
            program: "/bin/sh",
            args: &["-c", &script],
            env: ("OFFSTAGE_SPAWN_TEST", "marked"),
            cwd: None,
            stdio: [dev_null(), dev_null(), dev_null()],
        })
        .err()
        .expect("refused outside a runtime");
        assert!(
            matches!(&error, super::direct::Refused::Failed(e) if e.to_string().contains("tokio runtime")),
            "{error:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
        assert!(!ran.exists(), "the command ran");
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
