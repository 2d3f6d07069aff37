//! Plugins out of process: the same plugin file, run in a child process
//! (`isolation = "process"`), chosen per plugin in the host config.
//!
//! Why: in process, only an unwinding panic can be contained. An abort, a
//! segfault, a stack overflow, a constructor that calls `exit`, or a
//! synchronous hook that never returns ends or stalls the host. In a child
//! process each of those ends only the child: its pending calls fail at
//! once with the cause, the plugin is marked failed, and it is restarted
//! by policy. The plugin cannot tell: it gets the same `Context`, through
//! a host vtable whose entries forward to the host.
//!
//! How (see also ARCHITECTURE.md §ISO):
//!
//! - The child is the `offstage` binary itself under a hidden subcommand
//!   (`offstage plugin-host`), so versions always match. It runs the same
//!   loader checks (`PluginHost::open`), opens the library and calls
//!   `init` with a generation whose `upstream` is set: the session faces,
//!   registrations and logging of `abi/` forward to the host instead of
//!   acting locally (`child.rs`).
//! - The host sees the child through the ordinary ABI values (`abi/remote.rs`):
//!   each hook the child registers becomes a `CallbackAbi` or
//!   `WrapperAbi` that forwards, handed to the *same* registration entries
//!   an in-process plugin calls, so grants are checked and hooks staged,
//!   committed, retired and drained exactly as in process (`parent/`).
//! - The channel is a socket pair with length-delimited JSON frames and
//!   request ids in both directions (`wire.rs`); one generic forwarder per
//!   direction serves every method of the method table.
//! - With `filesystem = "read-only"` the child restricts itself with
//!   Landlock before it opens the library (`process/sandbox/`, which
//!   confines the `shell` tool's jobs too).

mod child;
mod config;
mod harden;
mod parent;
pub(in crate::plugin) mod wire;

pub(in crate::plugin) use crate::process::sandbox::{
    available as filesystem_restriction_available, Sandbox,
};
pub(crate) use child::{run_child, ChildArgs};
pub(crate) use config::take_isolation_keys;
pub(in crate::plugin) use config::Resolved;
pub use config::{
    Filesystem, Isolation, IsolationConfig, IsolationSettings, Network, RestartPolicy,
};
pub(in crate::plugin) use parent::{retry_start, Child, Supervisor};
pub(in crate::plugin) use wire::HookKind;

use super::abi::remote::LocalHook;
use crate::{error::Result, util::BoxFuture};

/// Where an isolated plugin's generation sends what it cannot do itself
/// (set on the child's generation state).
pub(in crate::plugin) trait Upstream: Send + Sync {
    /// A session-domain method, by name; the host checks the grant.
    fn session(&self, method: &'static str, args: String) -> BoxFuture<Result<String>>;
    /// Registers `hook` with the host, waiting for its answer.
    fn register(&self, kind: HookKind, name: String, hook: LocalHook) -> Result<()>;
    /// A log record of the plugin.
    fn log(&self, level: u8, target: &str, message: &str);
}
