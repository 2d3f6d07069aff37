//! `filesystem = "read-only"`: an isolated plugin's process restricts its
//! own filesystem access with Landlock, so that the plugin may read
//! everywhere but write only in its own data dir (`Context::data_dir`).
//!
//! Why here and when: the restriction is set by the child on itself as the
//! first thing it does, while it has one thread (Landlock restricts the
//! calling thread and what it starts later; restricting every thread of a
//! running process needs a newer kernel than we can require), so it holds
//! for everything after it: the library's constructors, `manifest`,
//! `init` and every hook. The loader's checks and the private copy of the
//! library (`<data_dir>/plugins/`) are made before it, and the copy is
//! held open and unlinked, so the restricted process needs no right to that
//! dir — where the host's own copies are.
//!
//! Why hard requirements: a restriction that the kernel enforces only in
//! part (or not at all) must not pass for one. The ruleset asks for the
//! access rights of Landlock ABI 3 (Linux 6.2: writes, renames, links and
//! truncation) as a [`CompatLevel::HardRequirement`], so an older kernel is
//! an error at set-up, and the status after `restrict_self` is checked to
//! be [`RulesetStatus::FullyEnforced`] too ([`check_status`]). The plugin
//! is then refused with the cause; the host serves the other plugins.
//!
//! What it does not restrict: reading (secrets the user can read stay
//! readable), the network, other processes (signals, `ptrace` as far as the
//! system allows), and files the process had open before (its stderr, the
//! channel to the host).

use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use landlock::{
    Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, ABI,
};

/// Why a plugin's filesystem restriction could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(in crate::plugin) enum SandboxError {
    /// The kernel has no Landlock, or not the access rights it needs.
    #[error(
        "this kernel does not enforce Landlock with the rights it needs \
         (Landlock ABI 3, Linux 6.2 or later, enabled in the `lsm=` boot list): {0}"
    )]
    Unsupported(String),
    /// The kernel took the ruleset but enforces only part of it.
    #[error("this kernel enforces the Landlock rules only in part")]
    Partial,
    /// The kernel took the ruleset but enforces none of it.
    #[error("this kernel does not enforce the Landlock rules")]
    NotEnforced,
    /// Setting the rules up failed (a path that cannot be opened, ...).
    #[error("cannot set up the Landlock rules: {0}")]
    Setup(String),
    /// The process already runs more than one thread, which the
    /// restriction would not cover.
    #[error("the plugin process runs {0} threads before its restriction; it must run one")]
    Threads(usize),
}

/// What the restricted process may write, besides `/dev/null`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(in crate::plugin) struct Sandbox {
    /// The one dir written beneath (the plugin's data dir), or none at all
    /// (a process that only learns a file's plugin name).
    pub(in crate::plugin) writable: Option<PathBuf>,
}

/// Maps the status the kernel reports after `restrict_self` to the
/// outcome: only a fully enforced ruleset passes.
#[cfg(target_os = "linux")]
pub(in crate::plugin) fn check_status(status: RulesetStatus) -> Result<(), SandboxError> {
    match status {
        RulesetStatus::FullyEnforced => Ok(()),
        RulesetStatus::PartiallyEnforced => Err(SandboxError::Partial),
        RulesetStatus::NotEnforced => Err(SandboxError::NotEnforced),
    }
}

/// The access rights the ruleset handles: those of Landlock ABI 3.
#[cfg(target_os = "linux")]
const ABI_NEEDED: ABI = ABI::V3;

/// Whether this kernel can enforce the restriction, without restricting
/// anything (the host asks before it starts a restricted process).
#[cfg(target_os = "linux")]
pub(in crate::plugin) fn available() -> Result<(), SandboxError> {
    Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI_NEEDED))
        .and_then(|ruleset| ruleset.create())
        .map(drop)
        .map_err(|e| SandboxError::Unsupported(e.to_string()))
}

/// See the Linux version: Landlock is Linux's.
#[cfg(not(target_os = "linux"))]
pub(in crate::plugin) fn available() -> Result<(), SandboxError> {
    Err(SandboxError::Unsupported(
        "Landlock exists on Linux only".into(),
    ))
}

/// Restricts this process (which must run one thread) to reading
/// everywhere and writing only beneath `sandbox.writable` and to
/// `/dev/null`. For good: nothing can lift it.
#[cfg(target_os = "linux")]
pub(in crate::plugin) fn restrict_self(sandbox: &Sandbox) -> Result<(), SandboxError> {
    let threads = thread_count();
    if threads > 1 {
        return Err(SandboxError::Threads(threads));
    }
    let setup = |e: &dyn std::fmt::Display| SandboxError::Setup(e.to_string());
    let beneath = |path: &Path, access| -> Result<PathBeneath<PathFd>, SandboxError> {
        let fd = PathFd::new(path).map_err(|e| setup(&e))?;
        Ok(PathBeneath::new(fd, access))
    };
    let mut rules = vec![beneath(Path::new("/"), AccessFs::from_read(ABI_NEEDED))?];
    if let Some(dir) = &sandbox.writable {
        rules.push(beneath(dir, AccessFs::from_all(ABI_NEEDED))?);
    }
    if Path::new("/dev/null").exists() {
        rules.push(beneath(
            Path::new("/dev/null"),
            AccessFs::ReadFile | AccessFs::WriteFile,
        )?);
    }
    let mut created = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI_NEEDED))
        .and_then(|ruleset| ruleset.create())
        .map_err(|e| SandboxError::Unsupported(e.to_string()))?;
    for rule in rules {
        created = created.add_rule(rule).map_err(|e| setup(&e))?;
    }
    let status = created.restrict_self().map_err(|e| setup(&e))?;
    check_status(status.ruleset)
}

/// See the Linux version: Landlock is Linux's.
#[cfg(not(target_os = "linux"))]
pub(in crate::plugin) fn restrict_self(_: &Sandbox) -> Result<(), SandboxError> {
    available()
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
