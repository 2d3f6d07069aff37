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
    ffi::{CString, OsStr},
    io,
    os::{
        fd::OwnedFd,
        unix::{ffi::OsStrExt, process::ExitStatusExt},
    },
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
    if direct::supported() {
        return direct::spawn(launch).await.map(Child::Direct);
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

/// `bytes` as a C string; a NUL inside is an invalid argument.
fn c_string(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument, path or variable contains a NUL byte",
        )
    })
}

/// The host's environment with `name` set to `value`, as `NAME=value`
/// strings.
fn environment(name: &str, value: &str) -> io::Result<Vec<CString>> {
    let mut env = Vec::new();
    for (key, val) in std::env::vars_os() {
        if key == OsStr::new(name) {
            continue;
        }
        let mut entry = Vec::with_capacity(key.len() + val.len() + 1);
        entry.extend_from_slice(key.as_bytes());
        entry.push(b'=');
        entry.extend_from_slice(val.as_bytes());
        // A variable that cannot be passed is left out, as std does not:
        // it fails the spawn. Such a variable is not ours to judge, but
        // the host's environment never holds one (the kernel separates
        // entries with NUL).
        if let Ok(entry) = CString::new(entry) {
            env.push(entry);
        }
    }
    env.push(c_string(format!("{name}={value}").as_bytes())?);
    Ok(env)
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
        sync::{LazyLock, Mutex},
    };

    use tokio::io::unix::AsyncFd;

    use super::{c_string, environment, exit_status, Launch};
    use crate::util::LockExt;

    /// Whether this kernel has pidfds that can be polled (5.3 and later).
    pub(super) fn supported() -> bool {
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
        _env: Vec<CString>,
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

    impl Drop for Child {
        fn drop(&mut self) {
            let Some(pidfd) = self.pidfd.take() else {
                return;
            };
            send_kill(pidfd.get_ref());
            let pid = self.pid;
            if let Ok(Some(_)) = try_reap(pid) {
                return;
            }
            // Reaped when it has died, without blocking this thread.
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        loop {
                            let Ok(mut ready) = pidfd.readable().await else {
                                break;
                            };
                            if !matches!(try_reap(pid), Ok(None)) {
                                break;
                            }
                            ready.clear_ready();
                        }
                    });
                }
                Err(_) => {
                    let mut status = 0;
                    // SAFETY: our own child, killed above.
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                }
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

    pub(super) async fn spawn(launch: Launch<'_>) -> io::Result<Child> {
        let (mut launching, pidfd, report) = clone_child(launch)?;
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
        let pidfd = unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
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

    /// Prepares the child's memory and clones it.
    fn clone_child(launch: Launch<'_>) -> io::Result<(Launching, OwnedFd, std::io::PipeReader)> {
        let program = c_string(launch.program.as_bytes())?;
        let mut args = vec![program.clone()];
        for arg in launch.args {
            args.push(c_string(arg.as_bytes())?);
        }
        let env = environment(launch.env.0, launch.env.1)?;
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
        let envp: Vec<*const c_char> = env
            .iter()
            .map(|e| e.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let (report_read, report_write) = std::io::pipe()?;
        let [stdin, stdout, stderr] = &launch.stdio;
        let child = ChildArgs {
            program: program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            stdio: [stdin.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()],
            report: report_write.as_raw_fd(),
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
        let args_ptr = std::ptr::from_ref(&prepared.child).cast_mut().cast::<c_void>();
        let mut pidfd: c_int = -1;
        // SAFETY: every signal is blocked in this thread across the clone,
        // so that no handler of the host runs in the child before it reset
        // the handlers; the previous mask is put back right after. The
        // child runs `child_main` on its own stack with pointers into
        // `prepared`, which outlives its use (`Launching`).
        let pid = unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut previous);
            let pid = libc::clone(
                child_main,
                stack_top,
                libc::CLONE_VM | libc::CLONE_PIDFD | libc::SIGCHLD,
                args_ptr,
                &mut pidfd as *mut c_int,
            );
            let error = io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
            if pid < 0 {
                return Err(error);
            }
            pid
        };
        // The child has its own copies of these now.
        drop(report_write);
        drop(launch.stdio);
        let launching = Launching {
            prepared: Some(prepared),
            pid,
        };
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
                [args.report as usize, bytes.as_ptr() as usize, bytes.len(), 0],
            );
            sys::call(libc::SYS_exit, [127, 0, 0, 0]);
        }
        127
    }

    /// Sets the child up and execs; returns the `errno` of what failed.
    unsafe fn set_up_and_exec(args: &ChildArgs) -> i32 {
        // SAFETY: the caller's: this is the child, before it execs.
        unsafe { set_up_and_exec_unchecked(args) }
    }

    #[allow(unsafe_op_in_unsafe_fn)]
    unsafe fn set_up_and_exec_unchecked(args: &ChildArgs) -> i32 {
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
