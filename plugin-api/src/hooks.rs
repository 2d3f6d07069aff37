//! Registering callbacks with the host: tool wrappers, tools, event
//! handlers and agents.
//!
//! Each registration hands the host a function pointer, the closure behind
//! it as opaque state, and a function that frees that state. The closure
//! runs on the host's runtime; its future is wrapped so that a panic comes
//! back as an error instead of unwinding into the host.

use std::{future::Future, pin::Pin};

use abi_stable::std_types::{RResult, RString};
use async_ffi::FfiFuture;
use serde::Serialize;

use crate::{
    abi::{AbiResult, CallbackAbi, CallbackState, NextAbi, WrapperAbi},
    event::EventPayload,
    futures::{export_json_future, from_abi_result, guard},
    types::{AgentTurn, Event, ToolCall, ToolResult, ToolSpec},
    Context, Error, Result,
};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;
type JsonHandler = Box<dyn Fn(String) -> BoxFuture<Result<String>> + Send + Sync>;
type JsonWrapper = Box<dyn Fn(String, Next) -> BoxFuture<Result<String>> + Send + Sync>;

fn to_json(value: &impl Serialize) -> Result<String> {
    Ok(serde_json::to_string(value)?)
}

extern "C" fn call_handler(state: CallbackState, input: RString) -> FfiFuture<AbiResult> {
    // SAFETY: `state` was made from a leaked `JsonHandler` in `handler_abi`
    // and is freed only by `drop_handler`, after the host's last call.
    let handler = unsafe { &*(state.0 as *const JsonHandler) };
    let started = guard("a hook", || Ok(handler(input.into_string())));
    export_json_future("a hook", async move { started?.await })
}

extern "C" fn drop_handler(state: CallbackState) {
    let _ = guard("dropping a hook", || {
        // SAFETY: see `call_handler`; the host calls this exactly once.
        drop(unsafe { Box::from_raw(state.0 as *mut JsonHandler) });
        Ok(())
    });
}

fn handler_abi(handler: JsonHandler) -> CallbackAbi {
    CallbackAbi {
        state: CallbackState(Box::into_raw(Box::new(handler)) as *const _),
        call: call_handler,
        drop: drop_handler,
    }
}

extern "C" fn call_wrapper(
    state: CallbackState,
    input: RString,
    next: NextAbi,
) -> FfiFuture<AbiResult> {
    // SAFETY: as in `call_handler`, for a leaked `JsonWrapper`.
    let wrapper = unsafe { &*(state.0 as *const JsonWrapper) };
    let next = Next { abi: Some(next) };
    let started = guard("a tool wrapper", || Ok(wrapper(input.into_string(), next)));
    export_json_future("a tool wrapper", async move { started?.await })
}

extern "C" fn drop_wrapper(state: CallbackState) {
    let _ = guard("dropping a tool wrapper", || {
        // SAFETY: see `call_wrapper`; the host calls this exactly once.
        drop(unsafe { Box::from_raw(state.0 as *mut JsonWrapper) });
        Ok(())
    });
}

fn registered(result: RResult<(), crate::abi::AbiError>) -> Result<()> {
    match result {
        RResult::ROk(()) => Ok(()),
        RResult::RErr(error) => Err(Error::from_abi(error)),
    }
}

fn missing(what: &str) -> Error {
    Error::unsupported(format!("this host does not support {what}"))
}

/// The rest of a tool's chain, handed to a wrapper: the next wrapper, or the
/// tool itself. Call [`run`](Self::run) at most once; a wrapper that never
/// calls it replaces the tool.
pub struct Next {
    abi: Option<NextAbi>,
}

impl std::fmt::Debug for Next {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Next")
    }
}

impl Next {
    /// Runs the rest of the chain with `call` (changed or not) and returns
    /// the job's final result. If the job is moved to the background
    /// meanwhile, the *caller* of the tool is released with the output so
    /// far; this future goes on until the job ends, and what the wrapper
    /// returns then is what the session's notice reports.
    ///
    /// The call it starts is the host's, not this future's: if the plugin
    /// dies or hangs past its deadline after calling `run`, the host lets
    /// the call run on unwrapped to its own result (hosts since 1.3).
    /// Dropping this future and then returning still ends the call.
    pub fn run(
        mut self,
        call: ToolCall,
    ) -> impl Future<Output = Result<ToolResult>> + Send + 'static {
        let abi = self.abi.take();
        let started = to_json(&call).map(|json| {
            let abi = abi.expect("Next holds its chain until run");
            (abi.call)(abi.state, RString::from(json))
        });
        async move {
            let json = from_abi_result(started?.await)?;
            serde_json::from_str(&json).map_err(|e| {
                Error::new(
                    crate::ErrorKind::HostFailure,
                    format!("host sent a bad tool result: {e}"),
                )
            })
        }
    }
}

impl Drop for Next {
    fn drop(&mut self) {
        if let Some(abi) = self.abi.take() {
            (abi.drop)(abi.state);
        }
    }
}

/// Tool hooks: see [`Context::tools`].
#[derive(Clone, Debug)]
pub struct Tools {
    ctx: Context,
}

impl Tools {
    pub(crate) fn new(ctx: Context) -> Self {
        Tools { ctx }
    }

    /// Wraps `tool` around-style: every call of it goes through `wrapper`,
    /// which gets the call (with its job id) and `next`, and may change the
    /// input, the output, or race `next` against a timer.
    ///
    /// ```no_run
    /// # use offstage_plugin_api::prelude::*;
    /// # fn init(ctx: &Context) -> Result<()> {
    /// ctx.tools().wrap("shell", |mut call: ToolCall, next: Next| async move {
    ///     call.input["workdir"] = "/tmp".into();
    ///     next.run(call).await
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn wrap<F, Fut>(&self, tool: &str, wrapper: F) -> Result<()>
    where
        F: Fn(ToolCall, Next) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolResult>> + Send + 'static,
    {
        let json_wrapper: JsonWrapper = Box::new(move |input: String, next: Next| {
            let call: std::result::Result<ToolCall, _> = serde_json::from_str(&input);
            let fut = call.map(|call| wrapper(call, next));
            Box::pin(async move {
                let result = fut
                    .map_err(|e| {
                        Error::new(crate::ErrorKind::HostFailure, format!("bad tool call: {e}"))
                    })?
                    .await?;
                to_json(&result)
            })
        });
        let abi = WrapperAbi {
            state: CallbackState(Box::into_raw(Box::new(json_wrapper)) as *const _),
            call: call_wrapper,
            drop: drop_wrapper,
        };
        let (ctx, vtable) = self.ctx.host();
        let wrap = vtable.wrap_tool().ok_or_else(|| missing("tool wrappers"))?;
        registered(wrap(ctx, RString::from(tool), abi))
    }

    /// Adds a tool that sessions can call like a built-in one.
    pub fn add<F, Fut>(&self, spec: ToolSpec, handler: F) -> Result<()>
    where
        F: Fn(ToolCall) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolResult>> + Send + 'static,
    {
        let handler = json_handler(move |call: ToolCall| handler(call));
        let (ctx, vtable) = self.ctx.host();
        let add = vtable.add_tool().ok_or_else(|| missing("plugin tools"))?;
        registered(add(
            ctx,
            RString::from(to_json(&spec)?),
            handler_abi(handler),
        ))
    }
}

fn json_handler<In, Out, F, Fut>(f: F) -> JsonHandler
where
    In: serde::de::DeserializeOwned,
    Out: Serialize,
    F: Fn(In) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Out>> + Send + 'static,
{
    Box::new(move |input: String| {
        let parsed: std::result::Result<In, _> = serde_json::from_str(&input);
        let fut = parsed.map(&f);
        Box::pin(async move {
            let out = fut
                .map_err(|e| {
                    Error::new(
                        crate::ErrorKind::HostFailure,
                        format!("host sent bad input: {e}"),
                    )
                })?
                .await?;
            to_json(&out)
        })
    })
}

/// Event subscriptions: see [`Context::events`].
#[derive(Clone, Debug)]
pub struct Events {
    ctx: Context,
}

impl Events {
    pub(crate) fn new(ctx: Context) -> Self {
        Events { ctx }
    }

    /// Calls `handler` for every event whose type is in `types` (every event
    /// when `types` is empty), one at a time, in order. Name the types with
    /// the constants of [`event`](crate::event) (`event::JOB_FINISHED`): a
    /// 1.3 host refuses a name it never publishes, with the list of those
    /// it does.
    pub fn subscribe<F, Fut>(&self, types: &[&str], handler: F) -> Result<()>
    where
        F: Fn(Event) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let handler = json_handler(move |event: Event| handler(event));
        let (ctx, vtable) = self.ctx.host();
        let subscribe = vtable
            .subscribe()
            .ok_or_else(|| missing("event subscriptions"))?;
        registered(subscribe(
            ctx,
            RString::from(to_json(&types)?),
            handler_abi(handler),
        ))
    }

    /// Calls `handler` with the payload of every event of `P`'s type
    /// ([`JobFinished`](crate::event::JobFinished) for `job.finished`...),
    /// one at a time, in order: [`subscribe`](Self::subscribe) to
    /// `P::TYPE`, with the properties decoded. An event whose properties do
    /// not decode is an error of the handler (logged by the host, as any
    /// other). *Since 1.3.*
    pub fn on<P, F, Fut>(&self, handler: F) -> Result<()>
    where
        P: EventPayload,
        F: Fn(P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let handler = std::sync::Arc::new(handler);
        self.subscribe(&[P::TYPE], move |event: Event| {
            let handler = std::sync::Arc::clone(&handler);
            async move {
                match event.payload::<P>()? {
                    Some(payload) => handler(payload).await,
                    None => Ok(()),
                }
            }
        })
    }
}

/// Agent registration: see [`Context::agents`].
#[derive(Clone, Debug)]
pub struct Agents {
    ctx: Context,
}

impl Agents {
    pub(crate) fn new(ctx: Context) -> Self {
        Agents { ctx }
    }

    /// Registers an agent under `name`. For each turn it gets the messages
    /// the session added since its last turn and returns its reply; it may
    /// call tools in the session through [`Context::session`] meanwhile.
    pub fn register<F, Fut>(&self, name: &str, agent: F) -> Result<()>
    where
        F: Fn(AgentTurn) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String>> + Send + 'static,
    {
        let handler = json_handler(move |turn: AgentTurn| agent(turn));
        let (ctx, vtable) = self.ctx.host();
        let register = vtable.register_agent().ok_or_else(|| missing("agents"))?;
        registered(register(ctx, RString::from(name), handler_abi(handler)))
    }
}
