//! The host's side of the session domain, expanded from the method table
//! ([`offstage_plugin_api::session_methods!`]): the [`Method`] enum with
//! each method's name, capability and HTTP route, one call per method into
//! [`SessionService`] (the calls the HTTP layer makes), the `extern "C"`
//! faces, and the vtable a plugin receives.
//!
//! Adding a method to the table makes this file fail to build until
//! [`handlers`] has an `async fn` of the same name; its return type must be
//! the table's (or a smart pointer that borrows as it, such as
//! `Arc<Session>`), so the plugin and the host cannot disagree on a reply.
//!
//! The boundary costs only what it must: replies are encoded straight
//! from the record (no `serde_json::Value` in between) into a buffer sized
//! by the method's earlier replies; `get` encodes the service's shared
//! record instead of a copy; arguments are parsed borrowed from the
//! plugin's buffer; each method's future is its own (sized to its handler,
//! one allocation for the async face); the generation's runtime handle and
//! service are borrowed, not cloned; and the method's name is a
//! `&'static str` from the table.

use std::{
    borrow::Borrow,
    future::Future,
    panic::{catch_unwind, AssertUnwindSafe},
    sync::{
        atomic::{AtomicUsize, Ordering},
        LazyLock,
    },
    task::{Context as TaskContext, Poll, Waker},
};

use abi_stable::{prefix_type::PrefixTypeTrait, std_types::RString};
use async_ffi::{FfiFuture, FutureExt as _};
use offstage_plugin_api::{
    abi::{AbiResult, HostCtx, SessionDomainRef, SessionDomainVtable},
    capability,
};
use serde::{Deserialize, Serialize};
use tokio::runtime::{Handle, RuntimeFlavor};

use super::{
    convert::{to_abi, InRuntime},
    state_from,
};
use crate::{error::Result, error::ServiceError, session::SessionService, util::panic_message};

/// One handler per method of the table, same name, same return type: the
/// host's whole implementation of the session domain for plugins.
mod handlers {
    use std::sync::Arc;

    use offstage_plugin_api::types::{
        args, BackgroundRequest, Job, Message, NewSession, OutputChunk, Session, ToolResult,
    };
    use serde_json::Value;

    use crate::{error::Result, process::output::DEFAULT_OUTPUT_LIMIT, session::SessionService};

    pub(super) async fn list(service: &SessionService, _: Value) -> Result<Vec<Session>> {
        service.list().await
    }

    pub(super) async fn create(service: &SessionService, new: NewSession) -> Result<Session> {
        service.create(new).await
    }

    /// The shared record, not a copy: it is only encoded.
    pub(super) async fn get(
        service: &SessionService,
        a: args::SessionId<'_>,
    ) -> Result<Arc<Session>> {
        service.shared_session(&a.session_id)
    }

    pub(super) async fn rename(service: &SessionService, a: args::Rename<'_>) -> Result<Session> {
        service.rename(&a.session_id, &a.title).await
    }

    pub(super) async fn remove(service: &SessionService, a: args::SessionId<'_>) -> Result<()> {
        service.remove(&a.session_id).await
    }

    pub(super) async fn messages(
        service: &SessionService,
        a: args::SessionId<'_>,
    ) -> Result<Vec<Message>> {
        service.messages(&a.session_id).await
    }

    pub(super) async fn prompt(
        service: &SessionService,
        a: args::Prompt<'_>,
    ) -> Result<Vec<Message>> {
        service
            .prompt(&a.session_id, &a.text, a.agent.as_deref())
            .await
    }

    pub(super) async fn notice(service: &SessionService, a: args::Notice<'_>) -> Result<Message> {
        service.notice(&a.session_id, &a.text, a.metadata).await
    }

    pub(super) async fn interrupt(
        service: &SessionService,
        a: args::SessionId<'_>,
    ) -> Result<bool> {
        service.interrupt(&a.session_id).await
    }

    pub(super) async fn jobs(service: &SessionService, a: args::Jobs<'_>) -> Result<Vec<Job>> {
        service.jobs(a.session_id.as_deref()).await
    }

    pub(super) async fn call_tool(
        service: &SessionService,
        a: args::CallTool<'_>,
    ) -> Result<ToolResult> {
        service.call_tool(&a.session_id, a.request).await
    }

    pub(super) async fn background(
        service: &SessionService,
        request: BackgroundRequest,
    ) -> Result<Vec<Job>> {
        service.background(request).await
    }

    pub(super) async fn wait_idle(
        service: &SessionService,
        a: args::SessionId<'_>,
    ) -> Result<Session> {
        service.wait_idle(&a.session_id).await
    }

    pub(super) async fn job(service: &SessionService, a: args::JobId<'_>) -> Result<Job> {
        service.job(&a.job_id).await
    }

    pub(super) async fn job_output(
        service: &SessionService,
        a: args::JobOutput<'_>,
    ) -> Result<OutputChunk> {
        if let Some(bytes) = a.tail {
            return service.job_output_tail(&a.job_id, bytes).await;
        }
        let limit = a.limit.unwrap_or(DEFAULT_OUTPUT_LIMIT);
        service.job_output(&a.job_id, a.offset, limit).await
    }

    pub(super) async fn cancel_job(service: &SessionService, a: args::JobId<'_>) -> Result<Job> {
        service.cancel_job(&a.job_id).await
    }
}

fn parse<'a, T: Deserialize<'a>>(method: Method, json: &'a str) -> Result<T> {
    serde_json::from_str(json).map_err(|e| {
        ServiceError::InvalidInput(format!("bad arguments for {}: {e}", method.name()))
    })
}

/// Encodes a reply straight from the record into a buffer of the size the
/// method's replies had so far (`size_hint`, at most [`MAX_SIZE_HINT`]),
/// so a typical reply is written without growing its buffer.
fn encode<T: Serialize + ?Sized>(reply: &T, size_hint: &AtomicUsize) -> Result<String> {
    let hint = size_hint.load(Ordering::Relaxed);
    let mut json = Vec::with_capacity(hint);
    serde_json::to_writer(&mut json, reply)
        .map_err(|e| ServiceError::Internal(format!("cannot encode a reply: {e}")))?;
    if json.len() > hint && hint < MAX_SIZE_HINT {
        size_hint.store(json.len().min(MAX_SIZE_HINT), Ordering::Relaxed);
    }
    // SAFETY: serde_json writes valid UTF-8 only.
    Ok(unsafe { String::from_utf8_unchecked(json) })
}

/// The largest buffer [`encode`] starts with; a larger reply grows it.
const MAX_SIZE_HINT: usize = 4096;

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

        /// The one place both faces reach the session service: per method,
        /// parse the arguments, run the handler, encode the reply. One
        /// function per method (not one `match`), so each call's future is
        /// the size of its own handler's.
        mod calls {
            use super::*;
            $(
                $(#[cfg($cfg)])*
                pub(super) async fn $name(service: &SessionService, args: RString) -> Result<String> {
                    static SIZE_HINT: AtomicUsize = AtomicUsize::new(128);
                    let parsed: $args = parse(Method::$name, args.as_str())?;
                    let reply = handlers::$name(service, parsed).await?;
                    encode::<$ret>(reply.borrow(), &SIZE_HINT)
                }
            )*
        }

        impl Method {
            /// The method's async face, as in the vtable.
            fn async_face(self) -> extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult> {
                match self {
                    $( $(#[cfg($cfg)])* Method::$name => faces::$name, )*
                }
            }
        }

        /// The `extern "C"` entries of the vtable, two per method.
        mod faces {
            use super::*;
            $(
                $(#[cfg($cfg)])*
                pub(super) extern "C" fn $name(ctx: HostCtx, args: RString) -> FfiFuture<AbiResult> {
                    run_async(ctx, Method::$name, args, calls::$name)
                }
                $(#[cfg($cfg)])*
                pub(super) extern "C" fn $blocking(ctx: HostCtx, args: RString) -> AbiResult {
                    run_blocking(ctx, Method::$name, args, calls::$name)
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

fn run_async<Fut>(
    ctx: HostCtx,
    method: Method,
    args: RString,
    call: impl FnOnce(&'static SessionService, RString) -> Fut,
) -> FfiFuture<AbiResult>
where
    Fut: Future<Output = Result<String>> + Send + 'static,
{
    let plugin = state_from(ctx);
    if let Some(upstream) = plugin.upstream.get() {
        // An isolated plugin's process: the host checks the grant.
        let fut = upstream.session(method.name(), args.into_string());
        return InRuntime::new(&plugin.runtime, fut).into_ffi();
    }
    let fut = match plugin.check_grant(method.capability()) {
        Ok(()) => Ok(call(&plugin.service, args)),
        Err(error) => Err(error),
    };
    InRuntime::new(&plugin.runtime, async move { fut?.await }).into_ffi()
}

fn run_blocking<Fut>(
    ctx: HostCtx,
    method: Method,
    args: RString,
    call: impl FnOnce(&'static SessionService, RString) -> Fut,
) -> AbiResult
where
    Fut: Future<Output = Result<String>>,
{
    let plugin = state_from(ctx);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if let Some(upstream) = plugin.upstream.get() {
            let fut = upstream.session(method.name(), args.into_string());
            return block_on_host(&plugin.runtime, fut)?;
        }
        plugin.check_grant(method.capability())?;
        block_on_host(&plugin.runtime, call(&plugin.service, args))?
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
pub(super) fn call_by_name(
    ctx: HostCtx,
    name: &str,
    args: String,
) -> crate::util::BoxFuture<Result<String>> {
    let Some(method) = Method::ALL.iter().copied().find(|m| m.name() == name) else {
        let error = ServiceError::Unsupported(format!("no session method `{name}` in this host"));
        return Box::pin(async move { Err(error) });
    };
    Box::pin(super::convert::FromPlugin::new(method.async_face()(
        ctx,
        RString::from(args),
    )))
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
        // The hook waits for the host, its worker's tasks moved elsewhere:
        // no stall for the watchdog to count.
        Ok(crate::plugin::watchdog::waiting_for_host(|| {
            tokio::task::block_in_place(|| handle.block_on(fut))
        }))
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
    #[cfg(feature = "server")]
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
    #[cfg(feature = "server")]
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

    /// The fields of the vtable as abi_stable lays it out, which is what a
    /// plugin checks against: `Method::ALL` is read from the same table, so
    /// only the layout can show they disagree.
    fn vtable_fields() -> Vec<&'static str> {
        use abi_stable::abi_stability::PrefixStableAbi;
        use offstage_plugin_api::abi::SessionDomainVtable_Prefix;

        let layout = <SessionDomainVtable_Prefix as PrefixStableAbi>::LAYOUT;
        assert!(layout.is_prefix_kind(), "{}", layout.full_type());
        layout
            .get_fields()
            .expect("a prefix type has fields")
            .iter()
            .map(|field| field.name())
            .collect()
    }

    #[test]
    fn methods_are_in_vtable_order_with_both_faces() {
        let names: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
        // The prefix every host has, so never anything else.
        assert_eq!(names.first(), Some(&"list"));
        let faces: Vec<String> = names
            .iter()
            .flat_map(|name| [name.to_string(), format!("{name}_blocking")])
            .collect();
        assert_eq!(vtable_fields(), faces);
    }

    /// The capability docs in `plugin-api/src/lib.rs`: per capability's
    /// value, the backquoted names its doc comment lists.
    fn documented_capabilities() -> Vec<(String, Vec<String>)> {
        const LIB_RS: &str = include_str!("../../../../plugin-api/src/lib.rs");
        let module = LIB_RS
            .split_once("pub mod capability {")
            .expect("lib.rs has the capability module")
            .1;
        let mut documented = Vec::new();
        let mut names = Vec::new();
        for line in module.lines().map(str::trim) {
            if let Some(doc) = line.strip_prefix("///") {
                names.extend(
                    doc.split('`')
                        .skip(1)
                        .step_by(2)
                        .map(|name| name.to_string()),
                );
            } else if let Some(constant) = line.strip_prefix("pub const ") {
                let Some((_, value)) = constant.split_once("= \"") else {
                    break; // `ALL`, after the last capability
                };
                let value = value.trim_end_matches("\";").to_string();
                documented.push((value, std::mem::take(&mut names)));
            }
        }
        documented
    }

    #[test]
    fn the_capability_docs_list_every_method_under_its_capability() {
        let documented = documented_capabilities();
        assert_eq!(
            documented
                .iter()
                .map(|(c, _)| c.as_str())
                .collect::<Vec<_>>(),
            capability::ALL,
            "the capability docs were not read right"
        );
        for method in Method::ALL {
            let (_, names) = documented
                .iter()
                .find(|(c, _)| c == method.capability())
                .expect("every method's capability is documented");
            assert!(
                names.iter().any(|n| n == method.name()),
                "the docs of `{}` (plugin-api/src/lib.rs) do not list `{}`",
                method.capability(),
                method.name()
            );
        }
        for (capability, names) in &documented {
            // Hooks (`tools().add`) are not session methods.
            for name in names.iter().filter(|n| !n.contains('(')) {
                let method = Method::ALL.iter().find(|m| m.name() == name);
                assert_eq!(
                    method.map(|m| m.capability()),
                    Some(capability.as_str()),
                    "the docs of `{capability}` list `{name}`, which is no method of it"
                );
            }
        }
    }
}
