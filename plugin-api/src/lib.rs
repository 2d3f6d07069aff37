//! # offstage-plugin-api
//!
//! The one crate an Offstage plugin depends on. A plugin is a `cdylib`
//! that implements [`Plugin`] and calls [`export_plugin!`]; the host loads
//! it at start-up (and reloads it during development) and gives it a
//! [`Context`]: its options, the session domain — with `background`, so a
//! plugin can move its own tool call off the session's turn — tool hooks,
//! events, agents, timers and a task spawner.
//!
//! ## Quick start
//!
//! ```sh
//! offstage plugin new my-plugin   # a crate with a tool, a wrapper, a subscription and a test
//! cd my-plugin
//! cargo test                      # loads it into a real host (offstage-plugin-test)
//! cargo build                     # target/debug/libmy_plugin.so, for `offstage serve --plugin-dir`
//! ```
//!
//! Or by hand: a `[lib]` with `crate-type = ["cdylib", "rlib"]` (the
//! `rlib` lets `cargo test` build the library before tests that load it),
//! this crate under `[dependencies]` and `offstage-plugin-test` under
//! `[dev-dependencies]`, and:
//!
//! ```
//! use offstage_plugin_api::prelude::*;
//!
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     fn manifest() -> Manifest {
//!         Manifest::new("hello", env!("CARGO_PKG_VERSION")).capabilities([capability::TOOL_ADD])
//!     }
//!
//!     fn init(ctx: Context) -> Result<Self> {
//!         ctx.tools().add(ToolSpec::new("hello", "greets input.name"), |call: ToolCall| async move {
//!             let name = call.input["name"].as_str().unwrap_or("world").to_string();
//!             Ok(ToolResult::completed(&call, format!("hello, {name}")))
//!         })?;
//!         Ok(Hello)
//!     }
//! }
//!
//! export_plugin!(Hello, name = "hello");
//! ```
//!
//! with a test in `tests/plugin.rs`:
//!
//! ```ignore
//! use offstage_plugin_test::{plugin_library, TestHost};
//!
//! #[test]
//! fn hello_greets() {
//!     let host = TestHost::load(plugin_library!());
//!     let session = host.session();
//!     let result = host.call(&session, "hello", serde_json::json!({ "name": "ada" }));
//!     assert_eq!(result.output, "hello, ada");
//! }
//! ```
//!
//! The guide, docs/plugins.md in the Offstage repository, goes on from
//! there: options, grants, isolation, hot reload.
//!
//! ## A wrapper
//!
//! ```
//! use offstage_plugin_api::prelude::*;
//!
//! /// Moves any shell call still running after two seconds to the background.
//! struct AutoBackground;
//!
//! impl Plugin for AutoBackground {
//!     fn manifest() -> Manifest {
//!         Manifest::new("auto-background-doc", env!("CARGO_PKG_VERSION"))
//!             .capabilities([capability::TOOL_WRAP, capability::SESSION_BACKGROUND])
//!     }
//!
//!     fn init(ctx: Context) -> Result<Self> {
//!         let host = ctx.clone();
//!         ctx.tools().wrap("shell", move |call: ToolCall, next: Next| {
//!             let ctx = host.clone();
//!             async move {
//!                 let (session, job) = (call.session_id.clone(), call.job_id.clone());
//!                 match ctx.race(Duration::from_secs(2), next.run(call)).await {
//!                     // Done in time: its result, exactly once.
//!                     Raced::Finished(result) => result,
//!                     // Still running: move it, then wait for its end.
//!                     Raced::Running(run) => {
//!                         // No `?`: failing the wrapper would kill the command.
//!                         // If the move fails, the call stays in the foreground.
//!                         let request = BackgroundRequest::job(session, job);
//!                         if let Err(error) = ctx.session().background(request).await {
//!                             tracing::warn!(%error, "could not move the call to the background");
//!                         }
//!                         run.await
//!                     }
//!                 }
//!             }
//!         })?;
//!         Ok(AutoBackground)
//!     }
//! }
//!
//! export_plugin!(AutoBackground);
//! ```
//!
//! ## What you never write
//!
//! `extern "C"`, `R*` types, `FfiFuture`: the crate's internal `abi`
//! module and the macro hold all of it. Your code uses `async fn`, `?` and
//! [`Result`].
//!
//! ## Rules of the road
//!
//! - **No tokio inside a plugin.** A plugin links its own copy of every
//!   crate, so tokio's runtime is not there: use [`Context::sleep`],
//!   [`Context::timeout`], [`Context::race`] and [`Context::spawn`], which
//!   run on the host's.
//! - **Panics are contained** — in `init`, in hooks, in futures — and come
//!   back as [`ErrorKind::PluginPanic`], saying where; the host marks the
//!   plugin failed and keeps serving. That needs unwinding: a plugin built
//!   with `panic = "abort"` is refused at load, unless it runs isolated
//!   (`isolation = "process"`), where an abort ends only its own process.
//! - **`tracing` works**: events go to the host's log under the plugin's name.
//! - **Compatibility**: a plugin built against 1.x loads in any 1.y host. A
//!   method the host is too old for returns [`ErrorKind::Unsupported`]; a
//!   host newer than the plugin simply offers more than it uses.
//! - **Grants** stop mistakes, not malice: a native plugin runs with the
//!   host's privileges. Ask for the [`capability`] values you use; the host
//!   refuses calls outside what its config grants, naming the missing grant.

#![warn(missing_docs)]

#[doc(hidden)]
pub mod abi;
mod context;
mod error;
pub mod event;
mod futures;
#[doc(hidden)]
pub use futures::panic_message;
mod hooks;
mod logging;
#[doc(hidden)]
pub mod methods;
pub mod pattern;
mod plugin;
mod session;
pub mod types;

pub use context::Context;
pub use error::{Error, ErrorKind, Result};
pub use futures::{Elapsed, JoinHandle, Raced};
pub use hooks::{Agents, Events, Next, Tools};
pub use plugin::{Manifest, Plugin};
pub use session::SessionDomain;

/// Names of the capabilities a plugin can ask for in its manifest and a host
/// config can grant.
pub mod capability {
    // Which session methods each allows is the method table's
    // (`methods.rs`); a host test checks that these docs say the same.

    /// `list`, `get`, `messages`, `jobs`, `wait_idle`, `job`, `job_output`.
    pub const SESSION_READ: &str = "session.read";
    /// `create`, `rename`, `remove`, `prompt`, `notice`, `interrupt`,
    /// `cancel_job`.
    pub const SESSION_WRITE: &str = "session.write";
    /// `call_tool`.
    pub const TOOL_CALL: &str = "tool.call";
    /// `background`.
    pub const SESSION_BACKGROUND: &str = "session.background";
    /// `tools().wrap`.
    pub const TOOL_WRAP: &str = "tool.wrap";
    /// `tools().add`.
    pub const TOOL_ADD: &str = "tool.add";
    /// `events().subscribe`.
    pub const EVENTS: &str = "events";
    /// `agents().register`.
    pub const AGENTS: &str = "agents";

    /// Every capability this version of the API knows.
    pub const ALL: &[&str] = &[
        SESSION_READ,
        SESSION_WRITE,
        TOOL_CALL,
        SESSION_BACKGROUND,
        TOOL_WRAP,
        TOOL_ADD,
        EVENTS,
        AGENTS,
    ];
}

/// What a plugin usually needs, in one `use`.
pub mod prelude {
    pub use crate::capability;
    pub use crate::event::{self, EventPayload};
    pub use crate::types::{
        AgentTurn, BackgroundRequest, Event, Job, JobStatus, Message, NewSession, OutputChunk,
        Role, Session, SessionStatus, ToolCall, ToolRequest, ToolResult, ToolSpec, ToolStatus,
    };
    pub use crate::{
        export_plugin, Context, Error, ErrorKind, Manifest, Next, Plugin, Raced, Result,
    };
    pub use serde_json::{json, Value};
    pub use std::time::Duration;
}

pub mod name_record;

#[doc(hidden)]
pub mod __private {
    pub use crate::plugin::root_module;
    pub use abi_stable::library::{
        __call_root_module_loader, CheckTypeLayout, LibHeader, RootModuleResult,
    };
    /// For the method table's expansions, whatever the expanding crate
    /// depends on.
    pub use serde_json::Value;
}

/// Exports a [`Plugin`] type as this library's plugin. Call it once, at the
/// crate root of a `cdylib`.
///
/// Give the plugin's name too (the name its [`Manifest`] has), as
/// `export_plugin!(MyPlugin, name = "my-plugin")`: it is written into the
/// library file, in a section of its own ([`name_record`](crate::name_record)), where the
/// host reads it without running any of the library's code, and so
/// decides how to run it (`isolation` in the host's `[plugin.NAME]`)
/// before any of the plugin's code runs in the host. A file whose
/// manifest then names another plugin is refused. Without it (the form of
/// 1.2 and older, still accepted), a host that isolates any plugin by name
/// first starts the file in a child process to learn its name. *Since
/// 1.3.*
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        $crate::export_plugin!(@header $plugin, {});
    };
    ($plugin:ty, name = $name:expr $(,)?) => {
        /// The plugin's name as the host reads it from the file.
        #[doc(hidden)]
        #[used]
        #[cfg_attr(
            any(target_os = "linux", target_os = "android", target_os = "freebsd"),
            link_section = ".offstage.plugin"
        )]
        pub static __OFFSTAGE_PLUGIN_NAME: [u8; $crate::name_record::len($name)] =
            $crate::name_record::encode($name);
        $crate::export_plugin!(@header $plugin, {
            // Referenced from the root module, so that no linker drops it.
            ::core::hint::black_box(&__OFFSTAGE_PLUGIN_NAME);
        });
    };
    (@header $plugin:ty, { $($keep:tt)* }) => {
        // The symbol name is abi_stable's root-module loader name; a unit
        // test in offstage-plugin-api keeps the two in step.
        #[doc(hidden)]
        #[export_name = "_1as_0lib_1header_0root_bmodule_bloader"]
        pub static __OFFSTAGE_PLUGIN_HEADER: $crate::__private::LibHeader = {
            extern "C" fn __offstage_root_module() -> $crate::__private::RootModuleResult {
                $crate::__private::__call_root_module_loader(__offstage_module)
            }
            fn __offstage_module() -> $crate::abi::PluginModuleRef {
                $($keep)*
                $crate::__private::root_module::<$plugin, { cfg!(panic = "abort") }>()
            }
            // SAFETY: the constructor returns the root module of the type it
            // names, as abi_stable's own `export_root_module` does.
            unsafe {
                $crate::__private::LibHeader::from_constructor::<$crate::abi::PluginModuleRef>(
                    __offstage_root_module,
                    $crate::__private::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn export_name_matches_abi_stable() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }
}
