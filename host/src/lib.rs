//! # offstage
//!
//! A session host for agent tools with native, hot-reloadable plugins.
//! See the repository README for the tour and ARCHITECTURE.md for the
//! design; module docs explain each part.
//!
//! Data flows one way: `http`/`cli` → `session` (and its `jobs`) → `tool` →
//! `store`/`event`. The [`plugin`] module adapts the same [`SessionService`]
//! to the plugin ABI and holds no session logic of its own.
//!
//! The public surface is small on purpose: the `offstage` binary is the
//! product, and this library exists so that the binary, the end-to-end
//! tests and the benchmarks share one implementation. The implementation
//! modules are private; what an embedder or a test needs is re-exported
//! below, and store internals that only tests and benchmarks reach sit in
//! the hidden [`testing`] module.

mod agent;
mod cli;
mod config;
pub mod demo;
mod error;
mod event;
mod http;
mod ids;
mod permission;
pub mod plugin;
mod session;
mod store;
mod tool;
mod util;

pub use crate::{
    cli::main,
    config::FileConfig,
    error::{Result, ServiceError},
    event::{Delivery, Event, EventBus, HistoryLimits, PreparedEvent, Published, Subscriber},
    permission::{Action, PermissionRequest, Reply, Rule},
    session::{ServiceConfig, SessionService},
};

/// Store internals for the end-to-end tests and benchmarks: opening the
/// store directly, its file names and schema version, the tail size of a
/// job's output. Not a stable API.
#[doc(hidden)]
pub mod testing {
    pub use crate::http::error::status_of;
    pub use crate::session::jobs::output::TAIL_BYTES;
    pub use crate::store::{Durability, NoticeReason, Store, StoreError, DB_FILE, SCHEMA_VERSION};
}
