//! The host's side of the session domain, expanded from the method table
//! ([`offstage_plugin_api::session_methods!`]): the [`Method`] enum with
//! each method's name, capability and HTTP route, one `dispatch` into
//! [`SessionService`] (the calls the HTTP layer makes), the `extern "C"`
//! faces, and the vtable a plugin receives.
//!
//! Adding a method to the table makes this file fail to build until
//! [`handlers`] has an `async fn` of the same name; its return type must be
//! the table's, so the plugin and the host cannot disagree on a reply.
//!
//! The boundary costs only what it must: replies are encoded straight
//! from the record (`serde_json::to_string`, no `serde_json::Value` in
//! between), and the method's name is a `&'static str` from the table.

use std::{
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::LazyLock,
    task::{Context as TaskContext, Poll, Waker},
};

use abi_stable::{prefix_type::PrefixTypeTrait, std_types::RString};
use async_ffi::{FfiFuture, FutureExt as _};
use offstage_plugin_api::{
    abi::{AbiResult, HostCtx, SessionDomainRef, SessionDomainVtable},
    capability,
};
use serde::{de::DeserializeOwned, Serialize};
use tokio::runtime::{Handle, RuntimeFlavor};

use super::{
    convert::{to_abi, InRuntime},
    state_from,
};
use crate::{error::Result, session::SessionService, util::panic_message, ServiceError};

/// One handler per method of the table, same name, same return type: the
/// host's whole implementation of the session domain for plugins.
mod handlers {
    use offstage_plugin_api::types::{
        args, BackgroundRequest, Job, Message, NewSession, OutputChunk, Session, ToolResult,
    };
    use serde_json::Value;

    use crate::{
        error::Result,
        session::{jobs::output::DEFAULT_OUTPUT_LIMIT, SessionService},
    };

    pub(super) async fn list(service: &SessionService, _: Value) -> Result<Vec<Session>> {
        service.list().await
    }

    pub(super) async fn create(service: &SessionService, new: NewSession) -> Result<Session> {
        service.create(new).await
    }

    pub(super) async fn get(service: &SessionService, a: args::SessionId) -> Result<Session> {
        service.get(&a.session_id).await
    }

    pub(super) async fn rename(service: &SessionService, a: args::Rename) -> Result<Session> {
        service.rename(&a.session_id, &a.title).await
    }

    pub(super) async fn remove(service: &SessionService, a: args::SessionId) -> Result<()> {
        service.remove(&a.session_id).await
    }

    pub(super) async fn messages(
        service: &SessionService,
        a: args::SessionId,
    ) -> Result<Vec<Message>> {
        service.messages(&a.session_id).await
    }

    pub(super) async fn prompt(service: &SessionService, a: args::Prompt) -> Result<Vec<Message>> {
        service
            .prompt(&a.session_id, &a.text, a.agent.as_deref())
            .await
    }

    pub(super) async fn notice(service: &SessionService, a: args::Notice) -> Result<Message> {
        service.notice(&a.session_id, &a.text, a.metadata).await
    }

    pub(super) async fn interrupt(service: &SessionService, a: args::SessionId) -> Result<bool> {
        service.interrupt(&a.session_id).await
    }

    pub(super) async fn jobs(service: &SessionService, a: args::Jobs) -> Result<Vec<Job>> {
        service.jobs(a.session_id.as_deref()).await
    }

    pub(super) async fn call_tool(
        service: &SessionService,
        a: args::CallTool,
    ) -> Result<ToolResult> {
        service.call_tool(&a.session_id, a.request).await
    }

    pub(super) async fn background(
        service: &SessionService,
        request: BackgroundRequest,
    ) -> Result<Vec<Job>> {
        service.background(request).await
    }

    pub(super) async fn wait_idle(service: &SessionService, a: args::SessionId) -> Result<Session> {
        service.wait_idle(&a.session_id).await
    }

    pub(super) async fn job(service: &SessionService, a: args::JobId) -> Result<Job> {
        service.job(&a.job_id).await
    }

    pub(super) async fn job_output(
        service: &SessionService,
        a: args::JobOutput,
    ) -> Result<OutputChunk> {
        let limit = a.limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);
        service.job_output(&a.job_id, a.offset, limit).await
    }

    pub(super) async fn cancel_job(service: &SessionService, a: args::JobId) -> Result<Job> {
        service.cancel_job(&a.job_id).await
    }
}

fn parse<T: DeserializeOwned>(method: Method, json: &str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| {
        ServiceError::InvalidInput(format!("bad arguments for {}: {e}", method.name()))
    })
}

fn encode(reply: &impl Serialize) -> Result<String> {
    serde_json::to_string(reply)
        .map_err(|e| ServiceError::Internal(format!("cannot encode a reply: {e}")))
}

macro_rules! host_session {
    ($(
        $(#[doc = $doc:literal])*
        $(#[cfg($cfg:meta)])*
        fn $name:ident / $blocking:ident ( $($param:ident : $pty:ty),* ) -> $ret:ty {
            args: $args:ty = $build:expr,
            capability: $cap:ident,
            http: $http:expr,
            since: $since:literal,
        }
    )*) => {
        /// A session-domain method, named as in the table.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Method {
            $( $(#[cfg($cfg)])* $name, )*
        }

        impl Method {
            /// Every method, in table (vtable) order.
            pub(crate) const ALL: &[Method] = &[$( $(#[cfg($cfg)])* Method::$name, )*];

            /// The method's name, as plugins call it.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $( $(#[cfg($cfg)])* Method::$name => stringify!($name), )*
                }
            }

            /// The grant a plugin needs to call it.
            pub(crate) fn capability(self) -> &'static str {
                match self {
                    $( $(#[cfg($cfg)])* Method::$name => capability::$cap, )*
                }
            }

            /// The HTTP route that does the same (`"GET /api/session/{id}"`),
            /// or `None` for a plugin-only method.
            #[cfg_attr(not(test), allow(dead_code))]
            pub(crate) fn http(self) -> Option<&'static str> {
                match self {
                    $( $(#[cfg($cfg)])* Method::$name => $http, )*
                }
            }
        }

        /// The one place both faces reach the session service.
        async fn dispatch(service: SessionService, method: Method, args: String) -> Result<String> {
            match method {
                $(
                    $(#[cfg($cfg)])*
                    Method::$name => {
                        let args: $args = parse(method, &args)?;
                        let reply: $ret = handlers::$name(&service, args).await?;
                        encode(&reply)
                    }
                )*
            }
        }

        /// The `extern "C"` entries of the vtable, two per method.
        mod faces {
            use super::*;
            $(
                $(#[cfg($cfg)])*
                pub(super) extern "C" fn $name(ctx: HostCtx, args: RString) -> FfiFuture<AbiResult> {
                    run_async(ctx, Method::$name, args)
                }
                $(#[cfg($cfg)])*
                pub(super) extern "C" fn $blocking(ctx: HostCtx, args: RString) -> AbiResult {
                    run_blocking(ctx, Method::$name, args)
                }
            )*
        }

        /// The session-domain vtable every plugin generation receives.
        pub(crate) static SESSION_DOMAIN: LazyLock<SessionDomainRef> = LazyLock::new(|| {
            SessionDomainVtable {
                $(
                    $(#[cfg($cfg)])* $name: faces::$name,
                    $(#[cfg($cfg)])* $blocking: faces::$blocking,
                )*
            }
            .leak_into_prefix()
        });
    };
}

offstage_plugin_api::session_methods!(host_session);

fn run_async(ctx: HostCtx, method: Method, args: RString) -> FfiFuture<AbiResult> {
    let plugin = state_from(ctx);
    if let Some(upstream) = plugin.upstream.get() {
        // An isolated plugin's process: the host checks the grant.
        let fut = upstream.session(method.name(), args.into_string());
        return InRuntime::new(plugin.runtime.clone(), fut).into_ffi();
    }
    let checked = plugin.check_grant(method.capability());
    let service = plugin.service.clone();
    let fut = async move {
        checked?;
        dispatch(service, method, args.into_string()).await
    };
    InRuntime::new(plugin.runtime.clone(), fut).into_ffi()
}

fn run_blocking(ctx: HostCtx, method: Method, args: RString) -> AbiResult {
    let plugin = state_from(ctx);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if let Some(upstream) = plugin.upstream.get() {
            let fut = upstream.session(method.name(), args.into_string());
            return block_on_host(&plugin.runtime, fut)?;
        }
        plugin.check_grant(method.capability())?;
        let fut = dispatch(plugin.service.clone(), method, args.into_string());
        block_on_host(&plugin.runtime, fut)?
    }));
    to_abi(outcome.unwrap_or_else(|payload| {
        Err(ServiceError::Internal(format!(
            "host panicked: {}",
            panic_message(payload.as_ref())
        )))
    }))
}

/// The async face of the method called `name`, for the generation behind
/// `ctx`: how the host serves an isolated plugin's session calls
/// (`plugin/isolate/`), grant check included.
pub(in crate::plugin) fn call_by_name(
    ctx: HostCtx,
    name: &str,
    args: String,
) -> crate::util::BoxFuture<Result<String>> {
    let Some(method) = Method::ALL.iter().copied().find(|m| m.name() == name) else {
        let error = ServiceError::Unsupported(format!("no session method `{name}` in this host"));
        return Box::pin(async move { Err(error) });
    };
    Box::pin(super::convert::FromPlugin {
        inner: run_async(ctx, method, RString::from(args)),
    })
}

/// Runs `fut` to completion from synchronous code (the blocking face).
///
/// Fast path first: most calls (a `get`, a `list`) complete without
/// waiting, so the future is polled once, inside the runtime's context,
/// with a waker that does nothing. Only a call that has to wait pays for
/// blocking: from a thread outside the runtime, `Handle::block_on`; from a
/// runtime worker (a plugin hook calling `_blocking`), `block_in_place`
/// first, so the worker's other tasks move elsewhere and nothing
/// deadlocks — that hand-off is what costs tens of microseconds. A
/// current-thread runtime cannot hand off; the call fails with a clear
/// error instead of hanging.
pub(in crate::plugin) fn block_on_host<F: Future>(handle: &Handle, fut: F) -> Result<F::Output> {
    let on_worker = match Handle::try_current() {
        Err(_) => false,
        Ok(current) if current.runtime_flavor() == RuntimeFlavor::MultiThread => true,
        Ok(_) => return Err(ServiceError::Unsupported(
            "a blocking call cannot run on a single-threaded runtime's thread; use the async face"
                .into(),
        )),
    };
    let mut fut = std::pin::pin!(fut);
    {
        let _entered = handle.enter();
        let mut cx = TaskContext::from_waker(Waker::noop());
        if let Poll::Ready(output) = fut.as_mut().poll(&mut cx) {
            return Ok(output);
        }
    }
    if on_worker {
        Ok(tokio::task::block_in_place(|| handle.block_on(fut)))
    } else {
        Ok(handle.block_on(fut))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Session-domain routes with no plugin method, on purpose. Each needs a
    /// reason; a route missing from both the table and this list fails.
    /// Empty: a plugin can do everything the HTTP API's session and job
    /// routes do.
    const HTTP_ONLY: &[&str] = &[];

    /// `"METHOD /path"` of every operation tagged `session` or `job` in the
    /// host's OpenAPI document.
    fn session_domain_routes() -> BTreeSet<String> {
        let doc = serde_json::to_value(crate::http::openapi()).unwrap();
        let mut routes = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (verb, operation) in item.as_object().expect("path item") {
                let tags = operation["tags"].as_array().cloned().unwrap_or_default();
                if tags.iter().any(|t| t == "session" || t == "job") {
                    routes.insert(format!("{} {path}", verb.to_uppercase()));
                }
            }
        }
        routes
    }

    #[test]
    fn the_method_table_and_the_http_api_agree() {
        let routes = session_domain_routes();
        assert!(
            !routes.is_empty(),
            "no session routes in the OpenAPI document"
        );
        let mut claimed = BTreeSet::new();
        for method in Method::ALL {
            if let Some(route) = method.http() {
                assert!(
                    routes.contains(route),
                    "`{}` claims the route {route:?}, which the OpenAPI document lacks",
                    method.name()
                );
                assert!(claimed.insert(route), "two methods claim {route:?}");
            }
        }
        for route in &routes {
            assert!(
                claimed.contains(route.as_str()) || HTTP_ONLY.contains(&route.as_str()),
                "the route {route:?} has no session method; add one to the table \
                 (plugin-api/src/methods.rs) or list it here as HTTP-only, with a reason"
            );
        }
        for route in HTTP_ONLY {
            assert!(
                routes.contains(*route),
                "HTTP_ONLY lists {route:?}, which does not exist"
            );
            assert!(
                !claimed.contains(route),
                "{route:?} is both HTTP-only and a method's"
            );
        }
    }

    #[test]
    fn methods_are_in_vtable_order_with_both_faces() {
        let names: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names.first(), Some(&"list"));
        assert_eq!(names.last(), Some(&"cancel_job"));
    }
}
