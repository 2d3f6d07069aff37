//! What every isolated plugin's process gives up, in any filesystem mode:
//! the host's environment and every capability.
//!
//! - **Environment.** The child starts from an empty environment plus the
//!   few variables in [`KEPT_ENV`] that programs need to run as the user
//!   (the host passes them at spawn, [`child_env`]). Nothing else of the
//!   host's: not `OFFSTAGE_TOKEN` (which would let the plugin call the
//!   host's HTTP API as its owner, around its grants), not other
//!   `OFFSTAGE_*` settings, not the secrets a shell exports.
//! - **Capabilities** ([`drop_capabilities`]). A host run as root would
//!   hand its child every capability: `CAP_MKNOD` (a device node is a raw
//!   disk), `CAP_CHOWN`, `CAP_FOWNER`, `CAP_DAC_OVERRIDE` and the rest.
//!   The child clears its ambient set, drops every capability from its
//!   bounding set (so nothing it executes can regain one; it runs with
//!   no-new-privileges as well) and then its effective, permitted and
//!   inheritable sets, as the first thing it does, before the library is
//!   opened. A process without `CAP_SETPCAP` cannot drop from its
//!   bounding set, but then it has no capability to drop either; what is
//!   checked is that none is left in effect.

use std::ffi::OsString;

/// The host's environment variables a plugin's process gets, when set.
pub(in crate::plugin) const KEPT_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TZ",
    "TMPDIR",
    "RUST_BACKTRACE",
];

/// The child's whole environment: the [`KEPT_ENV`] variables the host has.
pub(in crate::plugin) fn child_env() -> Vec<(&'static str, OsString)> {
    KEPT_ENV
        .iter()
        .filter_map(|name| std::env::var_os(name).map(|value| (*name, value)))
        .collect()
}

/// Why the process kept a capability.
#[derive(Debug, thiserror::Error)]
#[error("the plugin process cannot give up its capabilities: {0}")]
pub(in crate::plugin) struct CapabilityError(String);

/// Gives up every capability of this process, for good (see the module
/// docs). Run while the process has one thread: capabilities are per
/// thread, and threads started later inherit them.
#[cfg(target_os = "linux")]
pub(in crate::plugin) fn drop_capabilities() -> Result<(), CapabilityError> {
    use rustix::thread::{
        capabilities, clear_ambient_capability_set, remove_capability_from_bounding_set,
        set_capabilities, CapabilitySet, CapabilitySets,
    };
    let error = |what: &str, e: rustix::io::Errno| {
        CapabilityError(format!("{what}: {}", std::io::Error::from(e)))
    };
    // Absent before Linux 4.3: then there is no ambient set to clear.
    if let Err(e) = clear_ambient_capability_set() {
        if e != rustix::io::Errno::INVAL {
            return Err(error("ambient set", e));
        }
    }
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(40)
        .min(63);
    let had = capabilities(None).map_err(|e| error("capget", e))?;
    for cap in 0..=last {
        match remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1 << cap)) {
            Ok(()) | Err(rustix::io::Errno::INVAL) => {}
            // Without CAP_SETPCAP: fine only for a process that has none.
            Err(rustix::io::Errno::PERM) if had.permitted.is_empty() => break,
            Err(e) => return Err(error("bounding set", e)),
        }
    }
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    set_capabilities(None, none).map_err(|e| error("capset", e))?;
    let left = capabilities(None).map_err(|e| error("capget", e))?;
    if !(left.effective.is_empty() && left.permitted.is_empty() && left.inheritable.is_empty()) {
        return Err(CapabilityError(format!("still has {left:?}")));
    }
    Ok(())
}

/// Elsewhere there are no Linux capabilities to give up.
#[cfg(not(target_os = "linux"))]
pub(in crate::plugin) fn drop_capabilities() -> Result<(), CapabilityError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_offstage_variable_is_kept() {
        assert!(KEPT_ENV.iter().all(|name| !name.starts_with("OFFSTAGE")));
    }
}
