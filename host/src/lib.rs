//! # offstage
//!
//! A session host for agent tools with native, hot-reloadable plugins.
//! See the repository README for the tour; module docs explain each part.
//!
//! Data flows one way: `http`/`cli` → [`session`] (and its `jobs`) → [`tool`] →
//! `event`. The [`plugin`] module adapts the same [`SessionService`] to the
//! plugin ABI and holds no session logic of its own.

pub mod agent;
pub mod cli;
pub mod config;
pub mod demo;
pub mod error;
pub mod event;
pub mod http;
pub mod ids;
pub mod permission;
pub mod plugin;
pub mod session;
pub mod store;
pub mod tool;
mod util;

/// The old path of [`session::jobs`], kept so that `offstage::job::output`
/// still names the same module.
#[doc(hidden)]
pub use session::jobs as job;

pub use error::{Result, ServiceError};
pub use session::{ServiceConfig, SessionService};
