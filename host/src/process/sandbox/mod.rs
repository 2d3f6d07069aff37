//! Confining a process with Landlock and seccomp: an isolated plugin's
//! process with `filesystem = "read-only"` (`plugin/isolate/`), and the
//! `shell` tool's jobs with `[jobs] sandbox` (`launch.rs`). The process
//! confines itself and what it starts later, for good: it may read
//! everywhere but change files only beneath the [`Sandbox`]'s writable
//! dirs, and open no socket unless its network is allowed.
//!
//! Two mechanisms, each for what it can enforce:
//!
//! - **Landlock** ([`restrict_self`]): every filesystem right the kernel's
//!   Landlock ABI has is handled, so each is denied but where a rule
//!   grants it: reading and executing everywhere; everything but creating
//!   device nodes and device `ioctl`s beneath the writable dirs; reading
//!   and writing `/dev/null`. Where the kernel has them, its scopes confine
//!   signals and abstract unix sockets to the process and what it starts
//!   (ABI 6, Linux 6.12), and TCP `bind`/`connect` is denied without
//!   the network (ABI 4, Linux 6.7).
//! - **seccomp** (`seccomp.rs`): the calls Landlock does not cover — mode,
//!   owner, extended attributes and times of files (unless the sandbox
//!   allows them: a job's tools need `touch` and `chmod +x`), `mknod`,
//!   `io_uring`, and `socket()` without the network — and, for a strict
//!   sandbox (a plugin's) on a kernel whose Landlock lacks a piece, what
//!   of it a filter can express (`Plan`).
//!
//! What neither can enforce on the running kernel is refused: the process
//! is not started ([`SandboxError`], one line), never run with less than
//! it asked for.
//!
//! Why the process confines itself: Landlock and seccomp restrict the
//! calling thread and what it starts later; restricting every thread of a
//! running process needs a newer kernel than we can require. So it is
//! done while the process has one thread: the first thing an isolated
//! plugin's process does, and all a job's launcher does before it execs
//! the command.
//!
//! What it does not restrict: reading (secrets the user can read stay
//! readable), files the process had open before (its stdout, the channel
//! to the host), and with the network allowed the network (and, below
//! Landlock ABI 9, connecting to a pathname unix socket).

pub(crate) mod launch;
#[cfg(target_os = "linux")]
mod seccomp;

use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// Why a process could not be confined as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SandboxError {
    /// The kernel has no Landlock, or not the access rights it needs.
    #[error(
        "this kernel does not enforce Landlock with the rights it needs \
         (Landlock ABI 3, Linux 6.2 or later, enabled in the `lsm=` boot list): {0}"
    )]
    Unsupported(String),
    /// Something asked for that neither Landlock nor seccomp can enforce
    /// on this kernel.
    #[error("this kernel cannot confine {0}")]
    Missing(String),
    /// The kernel took the ruleset but enforces only part of it.
    #[error("this kernel enforces the Landlock rules only in part")]
    Partial,
    /// The kernel took the ruleset but enforces none of it.
    #[error("this kernel does not enforce the Landlock rules")]
    NotEnforced,
    /// Setting the rules up failed (a path that cannot be opened, ...).
    #[error("cannot set up the Landlock rules: {0}")]
    Setup(String),
    /// The seccomp filter could not be built or installed.
    #[error("cannot install the seccomp filter: {0}")]
    Seccomp(String),
    /// The process already runs more than one thread, which the
    /// restriction would not cover.
    #[error("the process runs {0} threads before its restriction; it must run one")]
    Threads(usize),
}

/// How the restricted process is confined.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Sandbox {
    /// The dirs written beneath: a plugin's data dir, a job's working dir
    /// and temp dir; none at all for a process that only reads.
    pub(crate) writable: Vec<PathBuf>,
    /// Sockets may be opened (`network = "allow"`).
    pub(crate) network: bool,
    /// A plugin's: signals and abstract unix sockets are confined even on
    /// a kernel whose Landlock cannot scope them (seccomp allows signals
    /// to the process itself only; an allowed network there is refused).
    /// A job's is not: its shell signals its own children, which a filter
    /// cannot tell from other processes.
    pub(crate) strict: bool,
    /// Changes of mode, owner, times and extended attributes are allowed.
    /// Landlock does not check them, so they are allowed or refused
    /// everywhere: a job that may write its working dir needs them there
    /// (`touch`, `chmod +x`, `git`, `tar`).
    pub(crate) metadata: bool,
}

impl Sandbox {
    /// An isolated plugin's: writing in `writable` only, strict, no
    /// changes of metadata.
    pub(crate) fn plugin(writable: Option<PathBuf>, network: bool) -> Sandbox {
        Sandbox {
            writable: writable.into_iter().collect(),
            network,
            strict: true,
            metadata: false,
        }
    }
}

/// What each mechanism takes on, for the kernel's Landlock ABI.
#[cfg(target_os = "linux")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The kernel's Landlock ABI.
    pub(crate) abi: ABI,
    /// Landlock scopes signals and abstract unix sockets (ABI 6);
    /// otherwise seccomp limits signals to the process itself.
    pub(crate) scopes: bool,
    /// Landlock denies device `ioctl`s (ABI 5); otherwise seccomp allows
    /// only a few generic `ioctl`s.
    pub(crate) device_ioctl: bool,
    /// Landlock denies TCP `bind` and `connect` (ABI 4, without
    /// `network = "allow"`; seccomp denies `socket()` anyway).
    pub(crate) tcp: bool,
    /// The network may be used (`network = "allow"`).
    pub(crate) network: bool,
    /// See [`Sandbox::strict`].
    pub(crate) strict: bool,
    /// See [`Sandbox::metadata`].
    pub(crate) metadata: bool,
}

#[cfg(target_os = "linux")]
impl Plan {
    /// The plan of a strict sandbox (a plugin's) for `abi`; an error names
    /// what could not be enforced.
    pub(crate) fn new(abi: ABI, network: bool) -> Result<Plan, SandboxError> {
        Plan::of(abi, &Sandbox::plugin(None, network))
    }

    /// The plan of `sandbox` for `abi`.
    pub(crate) fn of(abi: ABI, sandbox: &Sandbox) -> Result<Plan, SandboxError> {
        let network = sandbox.network;
        if abi < ABI::V3 {
            return Err(SandboxError::Unsupported(format!(
                "the kernel has Landlock ABI {}",
                abi as i32
            )));
        }
        let scopes = abi >= ABI::V6;
        if network && !scopes && sandbox.strict {
            // A filter cannot read the address a socket connects to.
            return Err(SandboxError::Missing(
                "abstract unix sockets with `network = \"allow\"` (needs Landlock ABI 6, \
                 Linux 6.12)"
                    .into(),
            ));
        }
        Ok(Plan {
            abi,
            scopes,
            device_ioctl: abi >= ABI::V5,
            tcp: abi >= ABI::V4 && !network,
            network,
            strict: sandbox.strict,
            metadata: sandbox.metadata,
        })
    }
}

/// Maps the status the kernel reports after `restrict_self` to the
/// outcome: only a fully enforced ruleset passes.
#[cfg(target_os = "linux")]
pub(crate) fn check_status(status: RulesetStatus) -> Result<(), SandboxError> {
    match status {
        RulesetStatus::FullyEnforced => Ok(()),
        RulesetStatus::PartiallyEnforced => Err(SandboxError::Partial),
        RulesetStatus::NotEnforced => Err(SandboxError::NotEnforced),
    }
}

/// The running kernel's Landlock ABI (`Unsupported` without Landlock); a
/// newer one than this build knows counts as the newest it knows.
#[cfg(target_os = "linux")]
pub(crate) fn kernel_abi() -> ABI {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and this flag the call
    // only returns the ABI version; no memory is read or written.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    const KNOWN: [ABI; 10] = [
        ABI::V1,
        ABI::V2,
        ABI::V3,
        ABI::V4,
        ABI::V5,
        ABI::V6,
        ABI::V7,
        ABI::V8,
        ABI::V9,
        ABI::V10,
    ];
    match version {
        v if v < 1 => ABI::Unsupported,
        v => KNOWN[(v as usize).min(KNOWN.len()) - 1],
    }
}

/// Whether this kernel can enforce the restriction, without restricting
/// anything (the host asks before it starts a restricted process).
#[cfg(target_os = "linux")]
pub(crate) fn available(network: bool) -> Result<(), SandboxError> {
    Plan::new(kernel_abi(), network).map(drop)
}

/// Whether this kernel can enforce `sandbox`, without restricting
/// anything.
#[cfg(target_os = "linux")]
pub(crate) fn available_for(sandbox: &Sandbox) -> Result<(), SandboxError> {
    Plan::of(kernel_abi(), sandbox).map(drop)
}

/// See the Linux version: Landlock is Linux's.
#[cfg(not(target_os = "linux"))]
pub(crate) fn available_for(_: &Sandbox) -> Result<(), SandboxError> {
    available(false)
}

/// See the Linux version: Landlock is Linux's.
#[cfg(not(target_os = "linux"))]
pub(crate) fn available(_network: bool) -> Result<(), SandboxError> {
    Err(SandboxError::Unsupported(
        "Landlock exists on Linux only".into(),
    ))
}

/// Confines this process (which must run one thread) as `sandbox` says:
/// Landlock, then the seccomp filter. For good: nothing can lift either.
#[cfg(target_os = "linux")]
pub(crate) fn restrict_self(sandbox: &Sandbox) -> Result<Plan, SandboxError> {
    let threads = thread_count();
    if threads > 1 {
        return Err(SandboxError::Threads(threads));
    }
    let plan = Plan::of(kernel_abi(), sandbox)?;
    landlock_self(sandbox, &plan)?;
    seccomp::install(&plan).map_err(|e| SandboxError::Seccomp(e.to_string()))?;
    Ok(plan)
}

#[cfg(target_os = "linux")]
fn landlock_self(sandbox: &Sandbox, plan: &Plan) -> Result<(), SandboxError> {
    let abi = plan.abi;
    let setup = |e: &dyn std::fmt::Display| SandboxError::Setup(e.to_string());
    let beneath = |path: &Path, access| -> Result<PathBeneath<PathFd>, SandboxError> {
        let fd = PathFd::new(path).map_err(|e| setup(&e))?;
        Ok(PathBeneath::new(fd, access))
    };
    let all = AccessFs::from_all(abi);
    let mut rules = vec![beneath(Path::new("/"), AccessFs::from_read(abi))?];
    for dir in &sandbox.writable {
        // No device nodes (a block device there is a raw disk), and no
        // device `ioctl`s.
        let devices = AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::IoctlDev;
        rules.push(beneath(dir, all & !devices)?);
    }
    if Path::new("/dev/null").exists() {
        rules.push(beneath(
            Path::new("/dev/null"),
            AccessFs::ReadFile | AccessFs::WriteFile,
        )?);
    }
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)
        .map_err(|e| SandboxError::Unsupported(e.to_string()))?;
    if plan.tcp {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(|e| SandboxError::Unsupported(e.to_string()))?;
    }
    if plan.scopes {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(|e| SandboxError::Unsupported(e.to_string()))?;
    }
    let mut created = ruleset
        .create()
        .map_err(|e| SandboxError::Unsupported(e.to_string()))?;
    for rule in rules {
        created = created.add_rule(rule).map_err(|e| setup(&e))?;
    }
    let status = created.restrict_self().map_err(|e| setup(&e))?;
    check_status(status.ruleset)
}

/// See the Linux version: Landlock is Linux's.
#[cfg(not(target_os = "linux"))]
pub(crate) fn restrict_self(_: &Sandbox) -> Result<(), SandboxError> {
    available(false)
}

/// Threads of this process (`/proc/self/task`); 0 when unknown, which the
/// caller treats as one.
#[cfg(target_os = "linux")]
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| tasks.count())
        .unwrap_or(0)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn only_a_fully_enforced_ruleset_passes() {
        assert_eq!(check_status(RulesetStatus::FullyEnforced), Ok(()));
        assert_eq!(
            check_status(RulesetStatus::PartiallyEnforced),
            Err(SandboxError::Partial)
        );
        assert_eq!(
            check_status(RulesetStatus::NotEnforced),
            Err(SandboxError::NotEnforced)
        );
        // Each refusal says why in words.
        assert!(SandboxError::Partial.to_string().contains("only in part"));
        assert!(SandboxError::NotEnforced
            .to_string()
            .contains("does not enforce"));
    }

    /// Per kernel: what Landlock takes on, what seccomp covers instead,
    /// and what is refused.
    #[test]
    fn the_plan_follows_the_kernels_landlock_abi() {
        assert!(matches!(
            Plan::new(ABI::V2, false),
            Err(SandboxError::Unsupported(_))
        ));
        let v3 = Plan::new(ABI::V3, false).unwrap();
        assert!(!v3.scopes && !v3.device_ioctl && !v3.tcp);
        let v4 = Plan::new(ABI::V4, false).unwrap();
        assert!(v4.tcp && !v4.device_ioctl);
        let v5 = Plan::new(ABI::V5, false).unwrap();
        assert!(v5.device_ioctl && !v5.scopes);
        let v6 = Plan::new(ABI::V6, false).unwrap();
        assert!(v6.scopes && v6.tcp);
        // With the network allowed, TCP is not handled, and abstract unix
        // sockets need the scope: refused below ABI 6, in one line.
        assert!(!Plan::new(ABI::V7, true).unwrap().tcp);
        let refused = Plan::new(ABI::V5, true).unwrap_err();
        assert!(
            refused.to_string().contains("abstract unix sockets"),
            "{refused}"
        );
        assert!(!refused.to_string().contains('\n'));
    }

    #[test]
    fn the_refusal_names_the_plugin_the_setting_and_the_cause() {
        let error = crate::plugin::LoadError::Filesystem {
            path: "/plugins/libwriter.so".into(),
            name: "writer".into(),
            cause: SandboxError::Partial.to_string(),
        };
        let text = error.to_string();
        assert!(text.starts_with("/plugins/libwriter.so: plugin `writer` is not started"));
        assert!(text.contains("filesystem = \"read-only\""), "{text}");
        assert!(text.ends_with("this kernel enforces the Landlock rules only in part"));
        assert_eq!(error.plugin_name(), Some("writer"));
    }

    /// The test process runs many threads: restricting it would cover only
    /// the calling one, so it is refused before anything is restricted.
    #[test]
    fn a_process_with_threads_is_not_restricted() {
        let _other = std::thread::spawn(std::thread::park);
        let refused = restrict_self(&Sandbox::default()).unwrap_err();
        assert!(
            matches!(refused, SandboxError::Threads(n) if n > 1),
            "{refused}"
        );
        // Still unrestricted: this thread can write a temp file.
        tempfile::NamedTempFile::new().unwrap();
    }
}
