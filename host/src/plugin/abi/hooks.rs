//! What a plugin registers, as the host's own traits: its tools
//! ([`Tool`]), tool wrappers ([`ToolWrapper`], with the host's `next`
//! handed back across), agents ([`Agent`]) and event handlers.
//!
//! Each is a function pointer, an opaque state and a drop function
//! (`CallbackAbi`, `WrapperAbi`, `NextAbi`); the adapters here own that
//! state, free it exactly once, and count themselves in their generation
//! so it knows when it is drained. A panic that comes back from a hook is
//! pinned on the plugin it came from, which is then disabled.

use std::{ffi::c_void, sync::Arc};

use abi_stable::std_types::{RResult, RString};
use async_ffi::{FfiFuture, FutureExt as _};
use offstage_plugin_api::{
    abi::{AbiError, AbiResult, CallbackAbi, CallbackState, HostCtx, NextAbi, WrapperAbi},
    capability,
    types::{AgentTurn, ToolCall, ToolResult, ToolSpec},
};
use serde_json::Value;
use tokio::runtime::Handle;

use super::{
    convert::{parse, to_abi_unit, to_json, FromPlugin, InRuntime},
    remote::LocalHook,
    state_from,
};
use crate::{
    error::Result,
    error::ServiceError,
    plugin::{
        generation::{GenerationState, Staged},
        isolate::HookKind,
        watchdog::Hook,
    },
    session::agent::{Agent, TurnReply},
    session::SessionService,
    tool::{JobContext, Next, Tool, ToolOutcome, ToolWrapper},
    util::BoxFuture,
};

/// A plugin callback the host holds; frees the plugin's state when the
/// last holder lets go. Counted in its generation's `hooks`.
pub(in crate::plugin) struct Callback {
    abi: CallbackAbi,
    pub(in crate::plugin) plugin: &'static GenerationState,
    hook: Hook,
}

impl Callback {
    fn new(abi: CallbackAbi, plugin: &'static GenerationState, hook: Hook) -> Self {
        plugin.hook_created();
        Callback { abi, plugin, hook }
    }

    pub(in crate::plugin) async fn call(&self, input: String) -> Result<String> {
        let started = (self.abi.call)(self.abi.state, RString::from(input));
        let result = FromPlugin::new(started)
            .watched(self.plugin, self.hook)
            .await;
        result.map_err(|error| self.plugin.fail_if_own_panic(error))
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        (self.abi.drop)(self.abi.state);
        self.plugin.hook_dropped();
    }
}

/// A plugin's tool wrapper; counted like [`Callback`].
struct Wrapper {
    abi: WrapperAbi,
    plugin: &'static GenerationState,
}

impl Wrapper {
    fn new(abi: WrapperAbi, plugin: &'static GenerationState) -> Self {
        plugin.hook_created();
        Wrapper { abi, plugin }
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        (self.abi.drop)(self.abi.state);
        self.plugin.hook_dropped();
    }
}

/// Hands the host's `next` to a plugin: a boxed [`Next`] behind the state
/// pointer, consumed by `call` or freed by `drop`.
extern "C" fn next_call(state: CallbackState, input: RString) -> FfiFuture<AbiResult> {
    // SAFETY: `state` is the `Box<(Next, &Handle)>` made in `Wrapper::wrap`;
    // the plugin calls `call` or `drop`, once.
    let (next, handle) = *unsafe { Box::from_raw(state.0 as *mut (Next, &'static Handle)) };
    // Started now, not when first polled: from this call on the inner call
    // is the host's (`tool::chain`).
    let started = parse::<ToolCall>("next", input.as_str()).map(|call| next.run(call));
    let fut = async move {
        let result = started?.await?;
        to_json(&result)
    };
    InRuntime::new(handle, fut).into_ffi()
}

extern "C" fn next_drop(state: CallbackState) {
    // SAFETY: see `next_call`.
    drop(unsafe { Box::from_raw(state.0 as *mut (Next, &'static Handle)) });
}

// The registries hold `Arc<dyn ToolWrapper>` (and `Arc<dyn Tool>`,
// `Arc<dyn Agent>`), whose methods take that `Arc`: each future keeps its
// adapter (and so the plugin's state) alive until it is done.
impl ToolWrapper for Wrapper {
    fn wrap(self: Arc<Self>, call: ToolCall, next: Next) -> BoxFuture<Result<ToolResult>> {
        Box::pin(async move {
            let state = Box::into_raw(Box::new((next, &self.plugin.runtime)));
            let next = NextAbi {
                state: CallbackState(state as *const c_void),
                call: next_call,
                drop: next_drop,
            };
            let started = (self.abi.call)(self.abi.state, RString::from(to_json(&call)?), next);
            let result = FromPlugin::new(started)
                .watched(self.plugin, Hook::Wrapper)
                .await;
            let json = result.map_err(|error| {
                let error = self.plugin.fail_if_own_panic(error);
                // Its plugin's failure, not its decision: a call it started
                // goes on without it (`tool::chain`).
                if matches!(error, ServiceError::PluginPanic { .. }) || self.plugin.has_failed() {
                    crate::tool::chain::note_wrapper_lost();
                }
                error
            })?;
            serde_json::from_str(&json).map_err(|e| {
                ServiceError::Plugin(format!(
                    "plugin {} returned a bad tool result: {e}",
                    self.plugin.name
                ))
            })
        })
    }
}

struct PluginTool {
    callback: Callback,
    name: String,
    description: String,
    input_schema: Option<Value>,
}

impl Tool for PluginTool {
    fn description(&self) -> String {
        self.description.clone()
    }

    fn input_schema(&self) -> Option<Value> {
        self.input_schema.clone()
    }

    fn run(self: Arc<Self>, ctx: JobContext, input: Value) -> BoxFuture<Result<ToolOutcome>> {
        Box::pin(async move {
            let call = ToolCall {
                session_id: ctx.session_id.clone(),
                job_id: ctx.job_id.clone(),
                tool: self.name.clone(),
                input,
            };
            let json = self.callback.call(to_json(&call)?).await?;
            let result: ToolResult = serde_json::from_str(&json).map_err(|e| {
                ServiceError::Plugin(format!(
                    "plugin tool {} returned a bad result: {e}",
                    self.name
                ))
            })?;
            ctx.output.write(result.output.as_bytes());
            Ok(ToolOutcome {
                status: result.status.into(),
                exit_code: result.exit_code,
            })
        })
    }
}

struct PluginAgent {
    callback: Callback,
}

impl Agent for PluginAgent {
    fn turn(
        self: Arc<Self>,
        _service: SessionService,
        turn: AgentTurn,
    ) -> BoxFuture<Result<TurnReply>> {
        Box::pin(async move {
            let json = self.callback.call(to_json(&turn)?).await?;
            serde_json::from_str::<String>(&json)
                .map(TurnReply::from)
                .map_err(|e| ServiceError::Plugin(format!("agent reply is not a string: {e}")))
        })
    }
}

pub(in crate::plugin) extern "C" fn wrap_tool(
    ctx: HostCtx,
    tool: RString,
    abi: WrapperAbi,
) -> RResult<(), AbiError> {
    let plugin = state_from(ctx);
    if let Some(upstream) = plugin.upstream.get() {
        // An isolated plugin's process: the host checks and registers.
        return to_abi_unit(upstream.register(
            HookKind::Wrapper,
            tool.into_string(),
            LocalHook::Wrapper(abi),
        ));
    }
    let wrapper = Arc::new(Wrapper::new(abi, plugin));
    to_abi_unit((|| {
        plugin.check_grant(capability::TOOL_WRAP)?;
        plugin.register(Staged::Wrapper(tool.into_string(), wrapper))
    })())
}

pub(in crate::plugin) extern "C" fn add_tool(
    ctx: HostCtx,
    spec: RString,
    abi: CallbackAbi,
) -> RResult<(), AbiError> {
    let plugin = state_from(ctx);
    if let Some(upstream) = plugin.upstream.get() {
        // An isolated plugin's process: the host checks and registers.
        return to_abi_unit(upstream.register(
            HookKind::Tool,
            spec.into_string(),
            LocalHook::Callback(abi),
        ));
    }
    let callback = Callback::new(abi, plugin, Hook::Tool);
    to_abi_unit((|| {
        plugin.check_grant(capability::TOOL_ADD)?;
        let spec: ToolSpec = parse("add_tool", spec.as_str())?;
        // Checked now as well as at commit, so `init` sees a clash.
        plugin
            .service
            .tools()
            .check_add(&spec.name, &plugin.owner)?;
        if let Some(schema) = &spec.input_schema {
            check_input_schema(&spec.name, schema)?;
        }
        let tool = Arc::new(PluginTool {
            callback,
            name: spec.name.clone(),
            description: spec.description,
            input_schema: spec.input_schema,
        });
        plugin.register(Staged::Tool(spec.name, tool))
    })())
}

/// A tool's input schema must at least be a JSON object describing an
/// object: models and MCP clients are given it as the shape of the
/// arguments, which are always an object.
fn check_input_schema(tool: &str, schema: &Value) -> Result<()> {
    let Some(object) = schema.as_object() else {
        return Err(ServiceError::InvalidInput(format!(
            "tool {tool}: its input schema must be a JSON object, not {schema}"
        )));
    };
    match object.get("type") {
        None => Ok(()),
        Some(Value::String(kind)) if kind == "object" => Ok(()),
        Some(other) => Err(ServiceError::InvalidInput(format!(
            "tool {tool}: its input schema must describe an object (\"type\": \"object\"), not {other}"
        ))),
    }
}

pub(in crate::plugin) extern "C" fn register_agent(
    ctx: HostCtx,
    name: RString,
    abi: CallbackAbi,
) -> RResult<(), AbiError> {
    let plugin = state_from(ctx);
    if let Some(upstream) = plugin.upstream.get() {
        // An isolated plugin's process: the host checks and registers.
        return to_abi_unit(upstream.register(
            HookKind::Agent,
            name.into_string(),
            LocalHook::Callback(abi),
        ));
    }
    let callback = Callback::new(abi, plugin, Hook::Agent);
    to_abi_unit((|| {
        plugin.check_grant(capability::AGENTS)?;
        plugin
            .service
            .agents()
            .check_register(name.as_str(), &plugin.owner)?;
        let agent = Arc::new(PluginAgent { callback });
        plugin.register(Staged::Agent(name.into_string(), agent))
    })())
}

pub(in crate::plugin) extern "C" fn subscribe(
    ctx: HostCtx,
    types: RString,
    abi: CallbackAbi,
) -> RResult<(), AbiError> {
    let plugin = state_from(ctx);
    if let Some(upstream) = plugin.upstream.get() {
        // An isolated plugin's process: the host checks and registers.
        return to_abi_unit(upstream.register(
            HookKind::Subscription,
            types.into_string(),
            LocalHook::Callback(abi),
        ));
    }
    let callback = Callback::new(abi, plugin, Hook::Event);
    to_abi_unit((|| {
        plugin.check_grant(capability::EVENTS)?;
        let types: Vec<String> = parse("subscribe", types.as_str())?;
        crate::event::check_subscription(&types)?;
        plugin.register(Staged::Subscription(types, callback, plugin.new_queue()))
    })())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::check_input_schema;

    #[test]
    fn an_input_schema_must_describe_an_object() {
        check_input_schema("t", &json!({ "type": "object", "properties": {} })).unwrap();
        check_input_schema("t", &json!({ "properties": {} })).unwrap();
        for bad in [json!("object"), json!({ "type": "string" }), json!([])] {
            let error = check_input_schema("t", &bad).unwrap_err().to_string();
            assert!(
                error.starts_with("tool t: its input schema must"),
                "{error}"
            );
        }
    }
}
