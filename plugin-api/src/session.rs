//! The session domain as a plugin calls it.
//!
//! Every method comes twice: `name(..).await` for async code and
//! `name_blocking(..)` for a plugin's own threads or synchronous hooks. Both
//! reach the one host implementation the HTTP API uses. The blocking face
//! works from any thread; called from inside a future the host is polling it
//! parks that worker while the call runs, so prefer `.await` there.

use abi_stable::std_types::RString;
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

use crate::{
    abi::{AsyncMethod, BlockingMethod, SessionDomainRef},
    futures::from_abi_result,
    types::{args, BackgroundRequest, Job, Message, NewSession, Session, ToolRequest, ToolResult},
    Context, Error, Result,
};

/// Handle on the host's session service. Get one with
/// [`Context::session`]; it is cheap to clone.
#[derive(Clone, Debug)]
pub struct SessionDomain {
    ctx: Context,
}

fn encode(args: impl Serialize) -> Result<RString> {
    Ok(RString::from(serde_json::to_string(&args)?))
}

fn decode<T: DeserializeOwned>(method: &str, json: String) -> Result<T> {
    serde_json::from_str(&json).map_err(|e| {
        Error::new(
            crate::ErrorKind::HostFailure,
            format!("host sent a bad {method} reply: {e}"),
        )
    })
}

fn unsupported(method: &str) -> Error {
    Error::unsupported(format!(
        "this host does not support `{method}`: it is older than the plugin API this plugin was built against"
    ))
}

macro_rules! methods {
    ($(
        $(#[$doc:meta])*
        fn $name:ident / $blocking:ident ( $($param:ident : $ty:ty),* ) -> $ret:ty
            = $args:expr, [$get_async:expr, $get_blocking:expr];
    )*) => {$(
        $(#[$doc])*
        pub async fn $name(&self, $($param: $ty),*) -> Result<$ret> {
            let getter: fn(SessionDomainRef) -> Option<AsyncMethod> = $get_async;
            let method = getter(self.vtable()).ok_or_else(|| unsupported(stringify!($name)))?;
            let json = from_abi_result(method(self.ctx.inner.ctx, encode($args)?).await)?;
            decode(stringify!($name), json)
        }

        #[doc = concat!("The blocking face of [`", stringify!($name), "`](Self::", stringify!($name), ").")]
        pub fn $blocking(&self, $($param: $ty),*) -> Result<$ret> {
            let getter: fn(SessionDomainRef) -> Option<BlockingMethod> = $get_blocking;
            let method = getter(self.vtable()).ok_or_else(|| unsupported(stringify!($name)))?;
            let json = from_abi_result(method(self.ctx.inner.ctx, encode($args)?))?;
            decode(stringify!($name), json)
        }
    )*};
}

impl SessionDomain {
    pub(crate) fn new(ctx: Context) -> Self {
        SessionDomain { ctx }
    }

    fn vtable(&self) -> SessionDomainRef {
        self.ctx.inner.vtable.session()
    }

    methods! {
        /// Every session, oldest first.
        fn list / list_blocking () -> Vec<Session>
            = Value::Null, [|v| Some(v.list()), |v| v.list_blocking()];
        /// Creates a session.
        fn create / create_blocking (new: NewSession) -> Session
            = new, [|v| v.create(), |v| v.create_blocking()];
        /// One session by id.
        fn get / get_blocking (session_id: &str) -> Session
            = args::SessionId { session_id: session_id.to_string() },
              [|v| v.get(), |v| get_blocking_field(v)];
        /// Changes a session's title.
        fn rename / rename_blocking (session_id: &str, title: &str) -> Session
            = args::Rename { session_id: session_id.to_string(), title: title.to_string() },
              [|v| v.rename(), |v| v.rename_blocking()];
        /// Deletes a session and cancels its jobs.
        fn remove / remove_blocking (session_id: &str) -> ()
            = args::SessionId { session_id: session_id.to_string() },
              [|v| v.remove(), |v| v.remove_blocking()];
        /// A session's messages, oldest first.
        fn messages / messages_blocking (session_id: &str) -> Vec<Message>
            = args::SessionId { session_id: session_id.to_string() },
              [|v| v.messages(), |v| v.messages_blocking()];
        /// Adds a user message and runs the session's agent for one turn;
        /// returns the messages the turn added.
        fn prompt / prompt_blocking (session_id: &str, text: &str) -> Vec<Message>
            = args::Prompt { session_id: session_id.to_string(), text: text.to_string(), agent: None },
              [|v| v.prompt(), |v| v.prompt_blocking()];
        /// Adds a notice to a session and wakes it, as finished background
        /// work does.
        fn notice / notice_blocking (session_id: &str, text: &str, metadata: Value) -> Message
            = args::Notice { session_id: session_id.to_string(), text: text.to_string(), metadata },
              [|v| v.notice(), |v| v.notice_blocking()];
        /// Cancels the session's foreground jobs and its running turn;
        /// background jobs go on. Returns whether anything was interrupted.
        fn interrupt / interrupt_blocking (session_id: &str) -> bool
            = args::SessionId { session_id: session_id.to_string() },
              [|v| v.interrupt(), |v| v.interrupt_blocking()];
        /// Jobs of one session, or of all sessions with `None`.
        fn jobs / jobs_blocking (session_id: Option<&str>) -> Vec<Job>
            = args::Jobs { session_id: session_id.map(str::to_string) },
              [|v| v.jobs(), |v| v.jobs_blocking()];
        /// Runs a tool in a session and waits until its job ends or is moved
        /// to the background.
        fn call_tool / call_tool_blocking (session_id: &str, request: ToolRequest) -> ToolResult
            = args::CallTool { session_id: session_id.to_string(), request },
              [|v| v.call_tool(), |v| v.call_tool_blocking()];
        /// Moves a session's blocking jobs — all, one type, or one job — to
        /// the background. Their callers return at once with the output so
        /// far; a notice follows when each ends. Returns the jobs moved.
        fn background / background_blocking (request: BackgroundRequest) -> Vec<Job>
            = request, [|v| v.background(), |v| v.background_blocking()];
    }

    #[cfg(not(offstage_api_variant = "older"))]
    methods! {
        /// Waits until the session is idle and returns it. *Since 1.1.*
        fn wait_idle / wait_idle_blocking (session_id: &str) -> Session
            = args::SessionId { session_id: session_id.to_string() },
              [|v| v.wait_idle(), |v| v.wait_idle_blocking()];
    }

    #[cfg(offstage_api_variant = "newer")]
    methods! {
        /// Copies a session. *Since 1.2* (a fixture for compatibility tests).
        fn fork / fork_blocking (session_id: &str) -> Session
            = args::SessionId { session_id: session_id.to_string() },
              [|v| v.fork(), |v| v.fork_blocking()];
    }
}

#[cfg(not(offstage_api_variant = "changed"))]
fn get_blocking_field(v: SessionDomainRef) -> Option<BlockingMethod> {
    v.get_blocking()
}

#[cfg(offstage_api_variant = "changed")]
fn get_blocking_field(_: SessionDomainRef) -> Option<BlockingMethod> {
    None
}
