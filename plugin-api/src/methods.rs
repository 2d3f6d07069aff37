//! The session methods, written down once.
//!
//! [`session_methods!`](crate::session_methods) is the single list of the
//! session domain's methods. Everything that names them one by one is
//! expanded from it, on both sides of the boundary:
//!
//! - the fields of [`SessionDomainVtable`](crate::abi::SessionDomainVtable)
//!   (`abi.rs`), in table order: async face, then blocking face;
//! - the plugin's faces on [`SessionDomain`](crate::SessionDomain)
//!   (`session.rs`), `name(..).await` and `name_blocking(..)`;
//! - the host's method enum, capability check, dispatch, `extern "C"`
//!   faces and vtable (`host/src/plugin/abi/session.rs`), and its parity
//!   test against the HTTP API's OpenAPI document.
//!
//! Why a macro and not a trait or a `const` slice: the vtable is a
//! `#[repr(C)]` prefix type whose field list *is* the ABI, so its fields
//! must be written out as a struct; a callback-style macro lets that
//! struct, the plugin's typed methods and the host's dispatch come from
//! one list without a build script.
//!
//! # One entry
//!
//! ```text
//! /// Docs shown on the plugin's async face.
//! #[cfg(...)]                                    // optional: which API releases have it
//! fn get / get_blocking (session_id: &str) -> $crate::types::Session {
//!     args: $crate::types::args::SessionId<'_> = <expression building args from the parameters>,
//!     capability: SESSION_READ,                  // a name in `crate::capability`
//!     http: Some("GET /api/session/{id}"),       // or `None`: plugin-only
//!     since: "1.0",
//! }
//! ```
//!
//! # Adding a method
//!
//! The code is three pieces; everything else in the code that names the
//! method is expanded from the table:
//!
//! 1. The behaviour, a `pub async fn` on the host's `SessionService`.
//! 2. One entry **appended** at the end here (the order is the vtable's
//!    field order and can never change), with `since` the next minor
//!    release; its args type goes in `types::args` if no existing one fits.
//! 3. The host's one-line handler `async fn NAME(service, args) -> Result<Ret>`
//!    in `handlers` (`host/src/plugin/abi/session.rs`): the host fails to
//!    build until it is there.
//!
//! Then give it an HTTP route (and list it in the OpenAPI document) or
//! write `http: None`, name it in its capability's docs (`crate::capability`
//! in `lib.rs`), and document it in `docs/plugins.md` and
//! `plugin-api/CHANGELOG.md`; host tests check the route and the
//! capability docs against the table. CONTRIBUTING.md, "Adding a session
//! method", has the whole list.

/// Calls `$callback! { entries }` with every session-domain method; see the
/// [module docs](crate::methods) for an entry's shape and how to add one.
/// Internal to the plugin API and the host.
#[doc(hidden)]
#[macro_export]
macro_rules! session_methods {
    ($callback:ident) => {
        $callback! {
            /// Every session, oldest first.
            fn list / list_blocking () -> ::std::vec::Vec<$crate::types::Session> {
                args: $crate::__private::Value = $crate::__private::Value::Null,
                capability: SESSION_READ,
                http: Some("GET /api/session"),
                since: "1.0",
            }
            /// Creates a session.
            fn create / create_blocking (new: $crate::types::NewSession) -> $crate::types::Session {
                args: $crate::types::NewSession = new,
                capability: SESSION_WRITE,
                http: Some("POST /api/session"),
                since: "1.0",
            }
            /// One session by id.
            fn get / get_blocking (session_id: &str) -> $crate::types::Session {
                args: $crate::types::args::SessionId<'_> =
                    $crate::types::args::SessionId { session_id: session_id.into() },
                capability: SESSION_READ,
                http: Some("GET /api/session/{id}"),
                since: "1.0",
            }
            /// Changes a session's title.
            fn rename / rename_blocking (session_id: &str, title: &str) -> $crate::types::Session {
                args: $crate::types::args::Rename<'_> = $crate::types::args::Rename {
                    session_id: session_id.into(),
                    title: title.into(),
                },
                capability: SESSION_WRITE,
                http: Some("PATCH /api/session/{id}"),
                since: "1.0",
            }
            /// Deletes a session and cancels its jobs.
            fn remove / remove_blocking (session_id: &str) -> () {
                args: $crate::types::args::SessionId<'_> =
                    $crate::types::args::SessionId { session_id: session_id.into() },
                capability: SESSION_WRITE,
                http: Some("DELETE /api/session/{id}"),
                since: "1.0",
            }
            /// A session's messages, oldest first.
            fn messages / messages_blocking (session_id: &str) -> ::std::vec::Vec<$crate::types::Message> {
                args: $crate::types::args::SessionId<'_> =
                    $crate::types::args::SessionId { session_id: session_id.into() },
                capability: SESSION_READ,
                http: Some("GET /api/session/{id}/message"),
                since: "1.0",
            }
            /// Adds a user message and runs the session's agent for one turn;
            /// returns the messages the turn added.
            fn prompt / prompt_blocking (session_id: &str, text: &str) -> ::std::vec::Vec<$crate::types::Message> {
                args: $crate::types::args::Prompt<'_> = $crate::types::args::Prompt {
                    session_id: session_id.into(),
                    text: text.into(),
                    agent: None,
                },
                capability: SESSION_WRITE,
                http: Some("POST /api/session/{id}/prompt"),
                since: "1.0",
            }
            /// Adds a notice to a session and wakes it, as finished background
            /// work does.
            fn notice / notice_blocking (session_id: &str, text: &str, metadata: $crate::__private::Value) -> $crate::types::Message {
                args: $crate::types::args::Notice<'_> = $crate::types::args::Notice {
                    session_id: session_id.into(),
                    text: text.into(),
                    metadata,
                },
                capability: SESSION_WRITE,
                http: None,
                since: "1.0",
            }
            /// Cancels the session's foreground jobs and its running turn;
            /// background jobs go on. Returns whether anything was interrupted.
            fn interrupt / interrupt_blocking (session_id: &str) -> bool {
                args: $crate::types::args::SessionId<'_> =
                    $crate::types::args::SessionId { session_id: session_id.into() },
                capability: SESSION_WRITE,
                http: Some("POST /api/session/{id}/interrupt"),
                since: "1.0",
            }
            /// Jobs of one session, or of all sessions with `None`.
            fn jobs / jobs_blocking (session_id: Option<&str>) -> ::std::vec::Vec<$crate::types::Job> {
                args: $crate::types::args::Jobs<'_> =
                    $crate::types::args::Jobs { session_id: session_id.map(::std::borrow::Cow::Borrowed) },
                capability: SESSION_READ,
                http: Some("GET /api/job"),
                since: "1.0",
            }
            /// Runs a tool in a session and waits until its job ends or is moved
            /// to the background.
            fn call_tool / call_tool_blocking (session_id: &str, request: $crate::types::ToolRequest) -> $crate::types::ToolResult {
                args: $crate::types::args::CallTool<'_> =
                    $crate::types::args::CallTool { session_id: session_id.into(), request },
                capability: TOOL_CALL,
                http: Some("POST /api/session/{id}/tool"),
                since: "1.0",
            }
            /// Moves a session's blocking jobs — all, one type, or one job — to
            /// the background. Their callers return at once with the output so
            /// far; a notice follows when each ends. Returns the jobs moved.
            fn background / background_blocking (request: $crate::types::BackgroundRequest) -> ::std::vec::Vec<$crate::types::Job> {
                args: $crate::types::BackgroundRequest = request,
                capability: SESSION_BACKGROUND,
                http: Some("POST /api/session/{id}/background"),
                since: "1.0",
            }
            // 1.0 ended here. The "older" compatibility fixture
            // (tests/compat/api-older) is 1.0.
            /// Waits until the session is idle and returns it. *Since 1.1.*
            #[cfg(not(offstage_api_variant = "older"))]
            fn wait_idle / wait_idle_blocking (session_id: &str) -> $crate::types::Session {
                args: $crate::types::args::SessionId<'_> =
                    $crate::types::args::SessionId { session_id: session_id.into() },
                capability: SESSION_READ,
                http: None,
                since: "1.1",
            }
            // 1.1 ended here.
            /// One job by id. *Since 1.2.*
            #[cfg(not(offstage_api_variant = "older"))]
            fn job / job_blocking (job_id: &str) -> $crate::types::Job {
                args: $crate::types::args::JobId<'_> =
                    $crate::types::args::JobId { job_id: job_id.into() },
                capability: SESSION_READ,
                http: Some("GET /api/job/{id}"),
                since: "1.2",
            }
            /// A byte range of a job's full output file, from `offset`, at
            /// most `limit` bytes (`None`: 1 MiB; never more than 4 MiB) —
            /// the page `GET /api/job/{id}/output` answers. Ask again from
            /// `next_offset` until `eof`; the file of a running job grows.
            /// *Since 1.2.*
            #[cfg(not(offstage_api_variant = "older"))]
            fn job_output / job_output_blocking (job_id: &str, offset: u64, limit: Option<u64>) -> $crate::types::OutputChunk {
                args: $crate::types::args::JobOutput<'_> =
                    $crate::types::args::JobOutput { job_id: job_id.into(), offset, limit, tail: None },
                capability: SESSION_READ,
                http: Some("GET /api/job/{id}/output"),
                since: "1.2",
            }
            /// Cancels a job (killing its process group) and returns it as it
            /// ended; a job that has already ended is returned unchanged.
            /// Moving it to the background first is not needed. *Since 1.2.*
            #[cfg(not(offstage_api_variant = "older"))]
            fn cancel_job / cancel_job_blocking (job_id: &str) -> $crate::types::Job {
                args: $crate::types::args::JobId<'_> =
                    $crate::types::args::JobId { job_id: job_id.into() },
                capability: SESSION_WRITE,
                http: Some("DELETE /api/job/{id}"),
                since: "1.2",
            }
            // A method of a future release that today's host does not have:
            // only the "newer" compatibility fixture (tests/compat/api-newer)
            // has it.
            /// Copies a session. *Since 1.3* (a fixture for compatibility tests).
            #[cfg(offstage_api_variant = "newer")]
            fn fork / fork_blocking (session_id: &str) -> $crate::types::Session {
                args: $crate::types::args::SessionId<'_> =
                    $crate::types::args::SessionId { session_id: session_id.into() },
                capability: SESSION_READ,
                http: None,
                since: "1.3",
            }
        }
    };
}
