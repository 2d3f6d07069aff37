//! The seccomp filter of a sandboxed process (a `filesystem = "read-only"`
//! plugin's, a sandboxed job's): the system calls Landlock does not cover
//! (`mod.rs`), refused with `EPERM`, on top of the Landlock ruleset.
//!
//! Always: `mknod` and `mknodat`; `io_uring` (whose operations bypass the
//! filter). Unless the sandbox allows changes of metadata: changing a
//! file's mode (`chmod`, `fchmod`, `fchmodat`, `fchmodat2`), owner
//! (`chown`, `fchown`, `lchown`, `fchownat`), extended attributes (every
//! `set*xattr*` and `remove*xattr*`, the `*at` ones of Linux 6.13
//! included) or times (`utime`, `utimes`, `futimesat`, `utimensat`).
//! Landlock checks none of these on a file the process can read, and a
//! file opened read-only is enough for the `f*` forms.
//!
//! Without `network = "allow"`: `socket()` of every family.
//!
//! For a strict sandbox, where the kernel's Landlock lacks a piece
//! ([`Plan`]): without scopes
//! (ABI 6), signals only to the process itself (`kill` of its own pid or
//! process group, `tgkill` and `rt_*sigqueueinfo` to itself; no `tkill`
//! or `pidfd_send_signal`), so also not to its own children; without
//! device `ioctl` control (ABI 5), only the generic `ioctl`s that every
//! program uses on any descriptor (non-blocking, close-on-exec, bytes
//! readable, terminal size and mode).
//!
//! The filter checks the architecture (a call through another ABI, such
//! as `int 0x80` on x86-64, kills the process) and, on x86-64, refuses the
//! x32 numbering of each call too.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use super::Plan;

/// `setxattrat` and `removexattrat` (Linux 6.13), one number on every
/// architecture; not in `libc` yet.
const SYS_SETXATTRAT: i64 = 463;
const SYS_REMOVEXATTRAT: i64 = 466;
/// On x86-64, the bit that selects the x32 numbering.
#[cfg(target_arch = "x86_64")]
const X32: i64 = 0x4000_0000;

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub(super) enum SeccompError {
    /// seccompiler refused the filter or the kernel refused it.
    #[error("{0}")]
    Filter(#[from] seccompiler::Error),
    /// A rule could not be made.
    #[error("{0}")]
    Rule(#[from] seccompiler::BackendError),
}

/// The calls refused on every kernel.
fn always() -> Vec<i64> {
    let mut calls = vec![
        libc::SYS_mknodat,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ];
    #[cfg(target_arch = "x86_64")]
    calls.push(libc::SYS_mknod);
    calls
}

/// The calls that change a file's metadata.
fn metadata() -> Vec<i64> {
    let mut calls = vec![
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        libc::SYS_fchmodat2,
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_setxattr,
        libc::SYS_lsetxattr,
        libc::SYS_fsetxattr,
        libc::SYS_removexattr,
        libc::SYS_lremovexattr,
        libc::SYS_fremovexattr,
        SYS_SETXATTRAT,
        SYS_REMOVEXATTRAT,
        libc::SYS_utimensat,
    ];
    // The old path-only forms, where the architecture still has them.
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        libc::SYS_chmod,
        libc::SYS_chown,
        libc::SYS_lchown,
        libc::SYS_utime,
        libc::SYS_utimes,
        libc::SYS_futimesat,
    ]);
    calls
}

/// The filter for `plan`, as a BPF program for this architecture.
pub(super) fn program(plan: &Plan, own_pid: u32) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // An empty rule list: refused whatever the arguments.
    for call in always() {
        rules.insert(call, Vec::new());
    }
    if !plan.metadata {
        for call in metadata() {
            rules.insert(call, Vec::new());
        }
    }
    if !plan.network {
        rules.insert(libc::SYS_socket, Vec::new());
    }
    if !plan.scopes && plan.strict {
        let pid = own_pid as u64;
        let group = (-(own_pid as i32)) as u32 as u64;
        // Refused unless the target is this process (or its group).
        let other = |values: &[u64]| -> Result<Vec<SeccompRule>, SeccompError> {
            let conditions = values
                .iter()
                .map(|v| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *v))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(vec![SeccompRule::new(conditions)?])
        };
        rules.insert(libc::SYS_kill, other(&[pid, 0, group])?);
        rules.insert(libc::SYS_tgkill, other(&[pid])?);
        rules.insert(libc::SYS_rt_sigqueueinfo, other(&[pid])?);
        rules.insert(libc::SYS_rt_tgsigqueueinfo, other(&[pid])?);
        rules.insert(libc::SYS_tkill, Vec::new());
        rules.insert(libc::SYS_pidfd_send_signal, Vec::new());
    }
    if !plan.device_ioctl {
        let generic = [
            libc::FIONBIO,
            libc::FIOCLEX,
            libc::FIONCLEX,
            libc::FIONREAD,
            libc::FIOASYNC,
            libc::TCGETS,
            libc::TIOCGWINSZ,
        ];
        let conditions = generic
            .iter()
            .map(|cmd| SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *cmd))
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(libc::SYS_ioctl, vec![SeccompRule::new(conditions)?]);
    }
    #[cfg(target_arch = "x86_64")]
    {
        let x32: Vec<(i64, Vec<SeccompRule>)> = rules
            .iter()
            .map(|(call, rule)| (call | X32, rule.clone()))
            .collect();
        rules.extend(x32);
        // x32's own numbers of the calls above that have one.
        if let Some(ioctl) = rules.get(&(libc::SYS_ioctl | X32)).cloned() {
            rules.insert(514 | X32, ioctl);
        }
        if !plan.scopes && plan.strict {
            rules.insert(524 | X32, Vec::new()); // rt_sigqueueinfo
            rules.insert(536 | X32, Vec::new()); // rt_tgsigqueueinfo
        }
    }
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(seccompiler::Error::Backend)?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// Installs the filter for `plan` on this thread (and every thread it
/// starts later). For good.
pub(super) fn install(plan: &Plan) -> Result<(), SeccompError> {
    let program = program(plan, std::process::id())?;
    seccompiler::apply_filter(&program)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use landlock::ABI;

    use super::*;

    /// Every kernel's plan compiles to a filter.
    #[test]
    fn every_plan_compiles() {
        for (abi, network) in [
            (ABI::V3, false),
            (ABI::V4, false),
            (ABI::V5, false),
            (ABI::V6, false),
            (ABI::V7, true),
        ] {
            let plan = Plan::new(abi, network).unwrap();
            let program = program(&plan, 4242).unwrap();
            assert!(program.len() > 20, "{abi:?}");
        }
    }
}
