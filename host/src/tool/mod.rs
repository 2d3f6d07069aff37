//! Tools: what a tool call runs, and the wrappers plugins put around them.
//!
//! A tool call becomes a job (see `session::jobs`). The job's task runs the
//! call through a chain — the tool's wrappers, outermost first, then the
//! tool itself — while the caller waits separately for the job to end or to
//! be moved to the background. So a wrapper never has to know about
//! backgrounding: its `next` simply finishes when the work does. The work
//! behind `next` is the host's, not the wrapper's (`chain.rs`): it goes on
//! when a wrapper that started it is lost.

pub(crate) mod chain;
pub(crate) mod schema;
pub(crate) mod shell;

use crate::util::RwLockExt;
use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::Duration,
};

use offstage_plugin_api::types::{JobStatus, ToolCall, ToolResult};
use serde_json::Value;

use crate::{
    error::{Result, ServiceError},
    process::{output::OutputSink, sandbox::launch::JobSandbox},
};

pub(crate) use crate::util::BoxFuture;

/// How a tool's work ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    pub status: JobStatus,
    pub exit_code: Option<i32>,
}

/// What a running tool gets besides its input.
#[derive(Clone)]
pub struct JobContext {
    pub job_id: String,
    pub session_id: String,
    pub output: Arc<OutputSink>,
    /// Where the job's processes are marked and recorded.
    pub processes: Arc<dyn JobProcesses>,
    /// How the job's commands are confined (`[jobs] sandbox`).
    pub sandbox: Arc<JobSandbox>,
}

/// What a tool that starts processes needs from the host, so that a job's
/// processes die with it even when the host itself is killed (see
/// `process::tree`). The session service implements it; a tool sees
/// nothing else of the service.
pub trait JobProcesses: Send + Sync {
    /// The [`MARKER_VAR`](crate::process::tree::MARKER_VAR) value for a new
    /// run of this job: every process of the run inherits it.
    fn marker(&self) -> String;

    /// Records `pid`, the job's main process (the leader of its process
    /// group), in the store, so that the next start ends its group if the
    /// host is killed.
    fn record(&self, pid: u32);

    /// Whether a call the sandbox refused may run again without it: what
    /// the permission rules say of `tool` doing `pattern`, asking (a
    /// question of this job) when they say `ask` or nothing.
    fn escalate(&self, tool: &str, pattern: &str) -> BoxFuture<bool>;
}

/// What the caller of a blocking tool call does when time runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimeout {
    Kill,
    Background,
}

/// How a call of a tool blocks its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForegroundPolicy {
    /// Start in the background: the caller returns at once.
    pub background: bool,
    pub timeout: Option<Duration>,
    pub on_timeout: OnTimeout,
}

impl Default for ForegroundPolicy {
    fn default() -> Self {
        ForegroundPolicy {
            background: false,
            timeout: None,
            on_timeout: OnTimeout::Kill,
        }
    }
}

/// A tool: built in, or added by a plugin.
pub trait Tool: Send + Sync {
    /// Does the work, writing output to `ctx.output`. Dropping the future
    /// cancels the work (a shell tool kills its process group). Takes the
    /// registry's `Arc`, so the future can keep the tool alive without a
    /// second one inside (a plugin's tool frees the plugin's state when
    /// its last holder lets go).
    fn run(self: Arc<Self>, ctx: JobContext, input: Value) -> BoxFuture<Result<ToolOutcome>>;

    /// Checks the input before anything starts and says how the call blocks.
    fn policy(&self, _input: &Value) -> Result<ForegroundPolicy> {
        Ok(ForegroundPolicy::default())
    }

    /// A short title for the job, e.g. the command line.
    fn title(&self, input: &Value) -> String {
        let text = input.to_string();
        text.chars().take(80).collect()
    }

    /// What permission rules match against, e.g. the command line.
    fn permission_pattern(&self, input: &Value) -> String {
        self.title(input)
    }

    /// What the tool does, for humans and models.
    fn description(&self) -> String {
        String::new()
    }

    /// The JSON Schema of the tool's input, if it declares one: what
    /// `GET /api/tool` shows and what models and MCP clients are given.
    fn input_schema(&self) -> Option<Value> {
        None
    }
}

/// A tool as `GET /api/tool` lists it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct ToolInfo {
    /// The name calls use.
    pub name: String,
    /// `host` for a built-in tool, else the plugin that added it.
    pub owner: String,
    /// What the tool does.
    pub description: String,
    /// The JSON Schema of the tool's input; absent if it declares none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(value_type = Option<Object>))]
    pub input_schema: Option<Value>,
    /// Plugins that wrap the tool, outermost first.
    pub wrapped_by: Vec<String>,
}

/// A tool and its wrappers, outermost first: what one call runs.
pub(crate) type Chain = (Arc<dyn Tool>, Vec<Arc<dyn ToolWrapper>>);

/// An around-style wrapper of a tool.
pub trait ToolWrapper: Send + Sync {
    /// Runs `call` around `next`; takes the registry's `Arc`, as
    /// [`Tool::run`] does.
    fn wrap(self: Arc<Self>, call: ToolCall, next: Next) -> BoxFuture<Result<ToolResult>>;
}

/// The rest of a tool's chain. One-shot.
pub struct Next {
    run: Box<dyn FnOnce(ToolCall) -> BoxFuture<Result<ToolResult>> + Send>,
}

impl Next {
    pub(crate) fn new(
        run: impl FnOnce(ToolCall) -> BoxFuture<Result<ToolResult>> + Send + 'static,
    ) -> Self {
        Next { run: Box::new(run) }
    }

    /// Runs the rest of the chain.
    pub fn run(self, call: ToolCall) -> BoxFuture<Result<ToolResult>> {
        (self.run)(call)
    }
}

/// Who registered a tool or wrapper: the host itself or a plugin generation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    Host,
    Plugin { name: String, generation: u64 },
}

impl Owner {
    /// Whether both are generations (the same or not) of one plugin.
    pub(crate) fn same_plugin(&self, other: &Owner) -> bool {
        matches!((self, other),
            (Owner::Plugin { name: a, .. }, Owner::Plugin { name: b, .. }) if a == b)
    }
}

struct Registered<T: ?Sized> {
    owner: Owner,
    item: Arc<T>,
}

impl<T: ?Sized> Clone for Registered<T> {
    fn clone(&self) -> Self {
        Registered {
            owner: self.owner.clone(),
            item: Arc::clone(&self.item),
        }
    }
}

#[derive(Default)]
struct Registry {
    tools: HashMap<String, Registered<dyn Tool>>,
    wrappers: HashMap<String, Vec<Registered<dyn ToolWrapper>>>,
    /// Tools gone because the plugin that provided them failed, with why:
    /// a call names the failure instead of "not found". Cleared for a name
    /// when a tool of that name is added again.
    unavailable: HashMap<String, String>,
}

impl Registry {
    fn check_add(&self, name: &str, owner: &Owner) -> Result<()> {
        if let Some(existing) = self.tools.get(name) {
            if !existing.owner.same_plugin(owner) {
                return Err(ServiceError::Conflict(format!(
                    "tool {name} already exists"
                )));
            }
        }
        Ok(())
    }

    /// Adds a wrapper of `tool`; a newer generation of a plugin takes its
    /// predecessor's place. Returns the predecessor.
    fn put_wrapper(
        &mut self,
        tool: &str,
        owner: Owner,
        wrapper: Arc<dyn ToolWrapper>,
    ) -> Option<Arc<dyn ToolWrapper>> {
        let wrappers = self.wrappers.entry(tool.to_string()).or_default();
        let predecessor = wrappers.iter().position(|w| match (&w.owner, &owner) {
            (
                Owner::Plugin {
                    name: a,
                    generation: old,
                },
                Owner::Plugin {
                    name: b,
                    generation: new,
                },
            ) => a == b && old < new,
            _ => false,
        });
        let entry = Registered {
            owner,
            item: wrapper,
        };
        // Swapping in place keeps the wrapper's position, so there is no
        // moment where the tool runs without it.
        match predecessor {
            Some(index) => Some(std::mem::replace(&mut wrappers[index], entry).item),
            None => {
                wrappers.push(entry);
                None
            }
        }
    }
}

/// Every tool the host can run, and the wrappers around each.
#[derive(Default, Clone)]
pub struct ToolRegistry {
    inner: Arc<RwLock<Registry>>,
}

impl ToolRegistry {
    /// Adds `tool` under `name`. A plugin cannot replace a built-in tool
    /// (it can wrap it) nor another plugin's.
    pub fn add(&self, name: &str, owner: Owner, tool: Arc<dyn Tool>) -> Result<()> {
        let mut registry = self.inner.write_unpoisoned();
        registry.check_add(name, &owner)?;
        registry.unavailable.remove(name);
        registry
            .tools
            .insert(name.to_string(), Registered { owner, item: tool });
        Ok(())
    }

    /// Whether [`add`](Self::add) would accept `name` from `owner` now.
    pub fn check_add(&self, name: &str, owner: &Owner) -> Result<()> {
        self.inner.read_unpoisoned().check_add(name, owner)
    }

    /// Puts a plugin generation's registrations in place in one step, as
    /// hot reload needs: `tools` are added (replacing the previous
    /// generation's by name), each wrapper takes its predecessor's place as
    /// [`wrap`](Self::wrap) does, and what `previous` registered and `owner`
    /// did not is removed. Nothing changes if a tool name is taken by
    /// someone else. Returns what was replaced or removed, for the caller
    /// to drop outside the registry's lock.
    pub fn replace_owner(
        &self,
        owner: &Owner,
        previous: Option<&Owner>,
        tools: Vec<(String, Arc<dyn Tool>)>,
        wrappers: Vec<(String, Arc<dyn ToolWrapper>)>,
    ) -> Result<Vec<Box<dyn Send + Sync>>> {
        let mut registry = self.inner.write_unpoisoned();
        for (name, _) in &tools {
            registry.check_add(name, owner)?;
        }
        let mut replaced: Vec<Box<dyn Send + Sync>> = Vec::new();
        for (name, tool) in tools {
            registry.unavailable.remove(&name);
            let entry = Registered {
                owner: owner.clone(),
                item: tool,
            };
            if let Some(old) = registry.tools.insert(name, entry) {
                replaced.push(Box::new(old.item));
            }
        }
        for (tool, wrapper) in wrappers {
            if let Some(old) = registry.put_wrapper(&tool, owner.clone(), wrapper) {
                replaced.push(Box::new(old));
            }
        }
        if let Some(previous) = previous {
            registry.tools.retain(|_, t| {
                let keep = &t.owner != previous;
                if !keep {
                    replaced.push(Box::new(t.item.clone()));
                }
                keep
            });
            for wrappers in registry.wrappers.values_mut() {
                wrappers.retain(|w| {
                    let keep = &w.owner != previous;
                    if !keep {
                        replaced.push(Box::new(w.item.clone()));
                    }
                    keep
                });
            }
        }
        Ok(replaced)
    }

    /// Wraps `tool`. Wrappers run in registration order, outermost first;
    /// a newer generation of a plugin takes its predecessor's place.
    pub fn wrap(&self, tool: &str, owner: Owner, wrapper: Arc<dyn ToolWrapper>) {
        let mut registry = self.inner.write_unpoisoned();
        registry.put_wrapper(tool, owner, wrapper);
    }

    /// Removes everything `owner` registered.
    pub fn remove_owner(&self, owner: &Owner) {
        let mut registry = self.inner.write_unpoisoned();
        registry.tools.retain(|_, t| &t.owner != owner);
        for wrappers in registry.wrappers.values_mut() {
            wrappers.retain(|w| &w.owner != owner);
        }
    }

    /// The names of the tools `owner` registered.
    pub fn names_of(&self, owner: &Owner) -> Vec<String> {
        let registry = self.inner.read_unpoisoned();
        let mut names: Vec<_> = registry
            .tools
            .iter()
            .filter(|(_, t)| &t.owner == owner)
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// Records that the tools `names` (no longer registered) are gone
    /// because their plugin failed; `why` says so, e.g. ``plugin `x` has
    /// failed: ...``. A call of one of them then fails with that reason
    /// ([`chain_for_call`](Self::chain_for_call)) until a tool of that name
    /// is added again. Names that are registered (by a generation still
    /// serving) are left alone.
    pub fn mark_unavailable(&self, names: &[String], why: &str) {
        let mut registry = self.inner.write_unpoisoned();
        for name in names {
            if !registry.tools.contains_key(name) {
                registry.unavailable.insert(name.clone(), why.to_string());
            }
        }
    }

    /// [`chain`](Self::chain) for a call: a tool that does not exist is
    /// `NotFound`, one whose plugin failed is a plugin failure saying so.
    pub fn chain_for_call(&self, name: &str) -> Result<Chain> {
        if let Some(chain) = self.chain(name) {
            return Ok(chain);
        }
        match self.inner.read_unpoisoned().unavailable.get(name) {
            Some(why) => Err(ServiceError::Plugin(format!(
                "tool {name} is unavailable: {why}"
            ))),
            None => Err(ServiceError::not_found("tool", name)),
        }
    }

    /// The tool and its wrappers as they are now; a call keeps this chain
    /// even if a plugin is reloaded while it runs.
    pub fn chain(&self, name: &str) -> Option<Chain> {
        let registry = self.inner.read_unpoisoned();
        let tool = registry.tools.get(name)?.item.clone();
        let wrappers = registry
            .wrappers
            .get(name)
            .map(|ws| ws.iter().map(|w| w.item.clone()).collect())
            .unwrap_or_default();
        Some((tool, wrappers))
    }

    /// Every tool, by name, with its owner, description, input schema and
    /// wrappers.
    pub fn list(&self) -> Vec<ToolInfo> {
        let registry = self.inner.read_unpoisoned();
        let owner_name = |owner: &Owner| match owner {
            Owner::Host => "host".to_string(),
            Owner::Plugin { name, .. } => name.clone(),
        };
        let mut tools: Vec<ToolInfo> = registry
            .tools
            .iter()
            .map(|(name, registered)| ToolInfo {
                name: name.clone(),
                owner: owner_name(&registered.owner),
                description: registered.item.description(),
                input_schema: registered.item.input_schema(),
                wrapped_by: registry
                    .wrappers
                    .get(name)
                    .into_iter()
                    .flatten()
                    .map(|w| owner_name(&w.owner))
                    .collect(),
            })
            .collect();
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools
    }

    /// Names of every tool.
    pub fn names(&self) -> Vec<String> {
        let registry = self.inner.read_unpoisoned();
        let mut names: Vec<_> = registry.tools.keys().cloned().collect();
        names.sort();
        names
    }
}

/// Registers the built-in tools.
pub(crate) fn register_builtin(registry: &ToolRegistry) {
    registry
        .add("shell", Owner::Host, Arc::new(shell::Shell))
        .expect("a fresh registry has no tools");
}
