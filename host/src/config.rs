//! The host's configuration: a TOML file (`--config`) with command-line
//! flags on top.
//!
//! ```toml
//! addr = "127.0.0.1:4545"
//! token = "..."                 # or OFFSTAGE_TOKEN / --token
//! data_dir = "/var/lib/offstage" # relative paths are relative to this file
//! plugin_dirs = ["plugins"]
//! allow_insecure_plugins = false
//!
//! [store]
//! durability = "normal"         # normal (default) | full, see below
//!
//! [http]                        # limits on clients; these are the defaults
//! first_byte_timeout = "5s"     # a new connection's first byte, from its accept
//! header_timeout = "10s"        # a request's head, from its first byte
//! body_timeout = "30s"          # a request's body, from its head
//! idle_timeout = "60s"          # a keep-alive connection with no request
//! max_connections = 1024        # open connections; more get a 503
//! [jobs]
//! max_output = "1GiB"           # bytes of output saved per job (default)
//! max_running = 200             # tool calls running at once; more get a 503
//!                               # (default: from the open-file limit)
//! sandbox = "none"              # none (default) | read-only | workspace-write:
//!                               # where `shell` commands may write (Landlock)
//! network = "allow"             # allow (default) | deny: sockets in the sandbox
//! escalate = "never"            # never (default) | ask: a call the sandbox
//!                               # refused may run again without it, if allowed
//! workspace = "/src/project"    # where workspace-write writes, whatever a
//!                               # call's workdir (default: the call's workdir)
//! [events]
//! history = 4096                # events kept for replay and slow readers
//! history_bytes = 16777216      # and at most this many bytes of them
//!
//! [sessions]
//! default_agent = "gpt"         # the agent of new sessions (default "script")
//!
//! [agent.gpt]                   # a model agent (docs/agents.md)
//! provider = "openai"           # Chat Completions
//! model = "gpt-4.1-mini"
//! api_key_env = "OPENAI_API_KEY" # the variable's name, never the key
//! default_allow = true          # (default) its read-only `shell` commands run
//!                               # unasked; anything else no rule allows asks
//! sandbox = "workspace-write"   # and network, escalate: as [jobs], for its calls
//! workspace = "/src/project"    # where it may write (default: [jobs] workspace,
//!                               # else the host's working directory)
//! max_wake_turns = 20           # wake-up turns per hour (sliding); default no cap
//! max_tokens_per_session = 2000000 # tokens before wake-ups stop; default no cap
//!
//! [plugins]
//! isolation = "none"            # none (default) | process: each plugin in a child
//!
//! [plugin.auto-background]      # keys but `enabled`, `grant` and the
//! grant = ["session.background"] # isolation keys are options
//! after_ms = 5000
//! isolation = "process"         # and restart, max_restarts, restart_window,
//!                               # call_timeout, event_timeout, ping_interval,
//!                               # ping_timeout, memory_limit, cpu_limit,
//!                               # filesystem ("unrestricted" | "read-only":
//!                               # write only in its data dir, Landlock)
//!
//! [[permission]]
//! tool = "shell"
//! pattern = "rm *"
//! action = "ask"                # allow | ask | deny
//! ```
//!
//! The file is strict: an unknown key or a value of the wrong type is an
//! error naming the key, the file and the line, because a typo in a
//! security setting (`tokn = ...`) must not silently mean "no token".
//! A flag given on the command line wins over the file's value.
//!
//! `[store] durability` says what an acknowledged change survives:
//! `"normal"` (the default; WAL with `synchronous = NORMAL`) survives a
//! crash or `kill -9` of the host, and a power cut or OS crash may lose the
//! last moments before it; `"full"` syncs the log on every group commit
//! and survives those too, at the cost of one sync per group.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, ToSocketAddrs},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{de, Deserialize, Deserializer};
use serde_json::Value;

use crate::{
    event::HistoryLimits,
    model::{ApiKey, ModelSettings},
    permission::Rule,
    plugin::{take_isolation_keys, IsolationConfig, IsolationSettings},
    process::sandbox::launch::{JobSandbox, SandboxMode, SandboxOverride},
    session::usage::Caps,
    session::{jobs::call::ModelCaller, model_agent::ModelAgentSettings},
    store::Durability,
};

/// Where the host listens when nothing else is said: loopback only.
pub(crate) const DEFAULT_ADDR: &str = "127.0.0.1:4545";

/// A configuration problem, worded for the person who wrote the config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

/// The config file as written. Every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `addr`: the address to listen on.
    pub addr: Option<String>,
    /// `token`: the bearer token every route but health needs.
    pub token: Option<String>,
    /// `data_dir`: where the store, output and plugin copies live.
    pub data_dir: Option<PathBuf>,
    /// `plugin_dirs`: directories whose plugin files load at start.
    pub plugin_dirs: Option<Vec<PathBuf>>,
    /// `allow_insecure_plugins`: load plugin files others can write.
    pub allow_insecure_plugins: Option<bool>,
    #[serde(default)]
    /// `[plugin.NAME]` tables: grants, `enabled`, isolation and the plugin's options.
    pub plugin: BTreeMap<String, PluginTable>,
    #[serde(default)]
    /// `[plugins]`: isolation settings for every plugin.
    pub plugins: PluginsTable,
    #[serde(default)]
    /// `[[permission]]` rules, checked in order, last match wins.
    pub permission: Vec<Rule>,
    #[serde(default)]
    /// `[store]`: durability.
    pub store: StoreTable,
    #[serde(default)]
    /// `[http]`: timeouts and the connection cap.
    pub http: HttpTable,
    #[serde(default)]
    /// `[jobs]`: limits on each job.
    pub jobs: JobsTable,
    #[serde(default)]
    /// `[events]`: how much event history the host keeps.
    pub events: EventsTable,
    #[serde(default, deserialize_with = "agent_tables")]
    /// `[agent.NAME]` tables: model-driven agents (docs/agents.md).
    pub agent: BTreeMap<String, AgentTable>,
    #[serde(default)]
    /// `[sessions]`: the default agent.
    pub sessions: SessionsTable,
}

/// The `[agent.NAME]` tables, each error naming its table.
fn agent_tables<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, AgentTable>, D::Error> {
    let raw = BTreeMap::<String, toml::Value>::deserialize(deserializer)?;
    raw.into_iter()
        .map(|(name, value)| {
            let table = AgentTable::deserialize(value)
                .map_err(|e| de::Error::custom(format!("[agent.{name}]: {}", e.message())))?;
            Ok((name, table))
        })
        .collect()
}

/// The `[sessions]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionsTable {
    /// `default_agent`: the agent of a session created without one
    /// (`script` unless set).
    pub default_agent: Option<String>,
}

/// An `[agent.NAME]` table as written: a model-driven agent
/// (docs/agents.md). The key itself is never here, only the name of the
/// variable that holds it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTable {
    /// `provider = "openai"`: the Chat Completions wire format.
    pub provider: Option<String>,
    /// `base_url`: up to and including `/v1`.
    pub base_url: Option<String>,
    /// `model`: the model's name on that server.
    pub model: Option<String>,
    /// `api_key_env`: the name of the variable holding the key.
    pub api_key_env: Option<String>,
    /// `system`: the system prompt.
    pub system: Option<String>,
    /// `system_file`: a file holding the system prompt (relative to the
    /// config file).
    pub system_file: Option<PathBuf>,
    /// `temperature`, sent only when set.
    pub temperature: Option<f64>,
    /// `max_tokens`, sent only when set.
    pub max_tokens: Option<u32>,
    /// `tools`: the tools the model may call (default: all).
    pub tools: Option<Vec<String>>,
    /// `max_steps`: model requests per turn, at most (default 25).
    pub max_steps: Option<u32>,
    /// `context_tokens`: the window requests are cut to.
    pub context_tokens: Option<usize>,
    /// `request_timeout = "120s"`: the longest wait for an answer's head
    /// and between two pieces of its stream.
    #[serde(default, deserialize_with = "duration")]
    pub request_timeout: Option<Duration>,
    /// `max_retries`: retries of 429, 5xx and failed connections (default 3).
    pub max_retries: Option<u32>,
    /// `default_allow = false`: no shipped allow list; every `shell` call
    /// of the model that no rule allows is asked about.
    pub default_allow: Option<bool>,
    /// `sandbox`, `network`, `escalate`: as in `[jobs]`, for this agent's
    /// calls only (unset keys keep the `[jobs]` values).
    pub sandbox: Option<SandboxMode>,
    /// `network = "deny"` for this agent's sandboxed calls.
    pub network: Option<JobNetwork>,
    /// `escalate = "ask"` for this agent's refused calls.
    pub escalate: Option<Escalate>,
    /// `workspace = "DIR"`: where `workspace-write` lets this agent's
    /// calls write (default: `[jobs] workspace`, else the host's working
    /// directory; never the directory a call names).
    pub workspace: Option<PathBuf>,
    /// `max_wake_turns`: wake-up turns a session may take in any hour
    /// (sliding); past it the session stops waking. Default: no cap.
    pub max_wake_turns: Option<u32>,
    /// `max_tokens_per_session`: input plus output tokens a session may use
    /// before it stops waking. Default: no cap.
    pub max_tokens_per_session: Option<u64>,
}

impl AgentTable {
    /// The agent's settings, with the key read from its variable through
    /// `env` and `system_file` read relative to `base`. Errors name the
    /// table.
    pub(crate) fn resolve(
        &self,
        name: &str,
        base: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ModelAgentSettings, ConfigError> {
        let invalid = |message: String| ConfigError::Invalid(format!("[agent.{name}]: {message}"));
        let provider = self.provider.clone().ok_or_else(|| {
            invalid("`provider` is missing (provider = \"openai\" for Chat Completions)".into())
        })?;
        if provider != "openai" {
            return Err(invalid(format!(
                "unknown provider {provider:?}; known: \"openai\" (Chat Completions)"
            )));
        }
        let base_url = self
            .base_url
            .clone()
            .unwrap_or_else(|| "https://api.openai.com/v1".to_string());
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(invalid(format!(
                "base_url {base_url:?} must start with http:// or https://"
            )));
        }
        let model = self
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .ok_or_else(|| invalid("`model` is missing".into()))?;
        let api_key = match &self.api_key_env {
            None => None,
            Some(var) => match env(var) {
                Some(key) if !key.trim().is_empty() => Some(ApiKey::new(key.trim().to_string())),
                _ => {
                    return Err(invalid(format!(
                        "api_key_env = {var:?}, but the environment variable {var} is not set (or empty)"
                    )))
                }
            },
        };
        let system = match (&self.system, &self.system_file) {
            (Some(_), Some(_)) => {
                return Err(invalid("give `system` or `system_file`, not both".into()))
            }
            (Some(text), None) => Some(text.clone()),
            (None, Some(file)) => {
                let path = base.map_or_else(|| file.clone(), |base| base.join(file));
                Some(std::fs::read_to_string(&path).map_err(|e| {
                    invalid(format!("cannot read system_file {}: {e}", path.display()))
                })?)
            }
            (None, None) => None,
        };
        if self.max_steps == Some(0) {
            return Err(invalid("max_steps must be at least 1".into()));
        }
        Ok(ModelAgentSettings {
            model: ModelSettings {
                provider,
                base_url,
                model,
                api_key_env: self.api_key_env.clone(),
                api_key,
                temperature: self.temperature,
                max_tokens: self.max_tokens,
                request_timeout: self
                    .request_timeout
                    .unwrap_or(ModelSettings::DEFAULT_TIMEOUT),
                max_retries: self.max_retries.unwrap_or(ModelSettings::DEFAULT_RETRIES),
            },
            system,
            tools: self.tools.clone(),
            max_steps: self
                .max_steps
                .unwrap_or(ModelAgentSettings::DEFAULT_MAX_STEPS),
            context_tokens: self.context_tokens,
            caller: self.caller(),
            caps: Caps {
                max_wake_turns: self.max_wake_turns,
                max_tokens_per_session: self.max_tokens_per_session,
            },
        })
    }

    /// How the host treats this agent's tool calls: the shipped allow
    /// list unless `default_allow = false`, and its own sandbox keys.
    fn caller(&self) -> ModelCaller {
        ModelCaller {
            default_allow: self.default_allow.unwrap_or(true),
            sandbox: SandboxOverride {
                mode: self.sandbox,
                network: self.network.map(|n| n == JobNetwork::Allow),
                escalate: self.escalate.map(|e| e == Escalate::Ask),
                workspace: self.workspace.as_deref().map(absolute),
            },
        }
    }
}

/// The `[http]` table: how long a client may take, and how many may be
/// connected at once (docs/contract.md, "Config file").
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTable {
    /// `first_byte_timeout = "5s"`: time to send the first byte of the
    /// first request, from the connection's accept.
    #[serde(default, deserialize_with = "duration")]
    pub first_byte_timeout: Option<Duration>,
    /// `header_timeout = "10s"`: time to send a request's head, from its
    /// first byte.
    #[serde(default, deserialize_with = "duration")]
    pub header_timeout: Option<Duration>,
    /// `body_timeout = "30s"`: time to send a request's body, from the end
    /// of its head.
    #[serde(default, deserialize_with = "duration")]
    pub body_timeout: Option<Duration>,
    /// `idle_timeout = "60s"`: how long a keep-alive connection may wait
    /// for its next request (and a client may leave an answer unread).
    #[serde(default, deserialize_with = "duration")]
    pub idle_timeout: Option<Duration>,
    /// `max_connections = 1024`: open connections; one more gets a 503.
    pub max_connections: Option<usize>,
}

/// A duration written as `"10s"`, `"1m 30s"`, `"500ms"`; zero is refused.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    let value = humantime::parse_duration(&text).map_err(|error| {
        de::Error::custom(format!(
            "{text:?} is not a duration ({error}); write e.g. \"10s\" or \"500ms\""
        ))
    })?;
    if value.is_zero() {
        return Err(de::Error::custom("a timeout must be longer than zero"));
    }
    Ok(Some(value))
}

/// The `[jobs]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsTable {
    /// `max_output = "64MiB"`: bytes of output saved per job.
    pub max_output: Option<ByteSize>,
    /// `max_running = 200`: tool calls running at once; one more is
    /// refused (503 `busy`). At least 1; unset, it is worked out from the
    /// open-file limit (`session::jobs_for_open_files`).
    pub max_running: Option<std::num::NonZeroUsize>,
    /// `sandbox = "workspace-write"`: where `shell` commands may write.
    pub sandbox: Option<SandboxMode>,
    /// `network = "deny"`: sandboxed commands open no socket.
    pub network: Option<JobNetwork>,
    /// `escalate = "ask"`: a call the sandbox refused may be run again
    /// without it, once a permission question allows it.
    pub escalate: Option<Escalate>,
    /// `workspace = "DIR"`: where `workspace-write` lets commands write,
    /// whatever working directory a call names.
    pub workspace: Option<PathBuf>,
}

/// `[jobs] network`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobNetwork {
    /// Sockets may be opened (the default).
    Allow,
    /// No socket of any kind (TCP, UDP, unix).
    Deny,
}

/// `[jobs] escalate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Escalate {
    /// A refused call stays refused (the default).
    Never,
    /// A refused call asks (`shell:unsandboxed`) whether to run it again
    /// without the sandbox.
    Ask,
}

impl JobsTable {
    /// The sandbox of every caller's `shell` commands.
    pub(crate) fn job_sandbox(&self) -> JobSandbox {
        JobSandbox {
            mode: self.sandbox.unwrap_or_default(),
            network: self.network != Some(JobNetwork::Deny),
            escalate: self.escalate == Some(Escalate::Ask),
            launcher: None,
            workspace: self.workspace.as_deref().map(absolute),
        }
    }
}

/// `path` against the host's working directory, as the host's own
/// relative paths are.
fn absolute(path: &Path) -> PathBuf {
    std::env::current_dir()
        .map(|cwd| cwd.join(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// A size in bytes, written as a number of bytes or a string with a unit:
/// `"512KiB"`, `"64MiB"`, `"1GiB"` (powers of 1024; `KB`, `MB`, `GB`, `TB`
/// are powers of 1000; `B` or no unit is bytes). At least one byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses `"64MiB"`, `"1 GiB"`, `"1000"`; the error says what is
    /// accepted.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let digits = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(digits);
        let unit_size: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            _ => return Err(Self::expected(text)),
        };
        let size = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(unit_size))
            .ok_or_else(|| Self::expected(text))?;
        if size == 0 {
            return Err(format!("size {text:?} must be at least one byte"));
        }
        Ok(ByteSize(size))
    }

    fn expected(text: &str) -> String {
        format!(
            "{text:?} is not a size: write a whole number with a unit, such as \"64MiB\" or \"1GiB\" \
             (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), or a number of bytes"
        )
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match toml::Value::deserialize(deserializer)? {
            toml::Value::Integer(n) if n > 0 => Ok(ByteSize(n.unsigned_abs())),
            toml::Value::Integer(n) => Err(de::Error::custom(format!(
                "size {n} must be at least one byte"
            ))),
            toml::Value::String(text) => ByteSize::parse(&text).map_err(de::Error::custom),
            other => Err(de::Error::custom(format!(
                "a size must be a string such as \"64MiB\" or a number of bytes, not a {}",
                other.type_str()
            ))),
        }
    }
}

/// The `[events]` table: the event history's limits (whichever is reached
/// first drops the oldest events).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsTable {
    /// `history = N`: at most N events (default 4096).
    pub history: Option<usize>,
    /// `history_bytes = N`: at most N bytes of serialised events (default
    /// 16 MiB).
    pub history_bytes: Option<usize>,
}

/// The `[store]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreTable {
    /// `durability = "normal" | "full"`.
    pub durability: Option<Durability>,
}

/// The `[plugins]` table: isolation settings for every plugin.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PluginsTable {
    /// `isolation`, `restart`, ... (see [`crate::plugin::take_isolation_keys`]).
    pub isolation: IsolationSettings,
}

impl<'de> Deserialize<'de> for PluginsTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut table = toml::Table::deserialize(deserializer)?;
        let isolation = take_isolation_keys(&mut table).map_err(de::Error::custom)?;
        if let Some(key) = table.keys().next() {
            return Err(de::Error::custom(format!(
                "unknown key `{key}` in [plugins] (plugin options go in [plugin.NAME])"
            )));
        }
        Ok(PluginsTable { isolation })
    }
}

/// One `[plugin.NAME]` table.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginTable {
    /// `isolation = "process"` and the other isolation keys.
    pub isolation: IsolationSettings,
    /// `enabled = false` keeps the plugin from loading.
    pub enabled: bool,
    /// `grant = [..]`: the capabilities given; all it asks for when absent.
    pub grant: Option<Vec<String>>,
    /// Every other key, as a JSON object: the plugin's options.
    pub options: Value,
}

impl<'de> Deserialize<'de> for PluginTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut table = toml::Table::deserialize(deserializer)?;
        let enabled = match table.remove("enabled") {
            None => true,
            Some(toml::Value::Boolean(enabled)) => enabled,
            Some(other) => {
                return Err(de::Error::custom(format!(
                    "`enabled` must be true or false, not {}",
                    other.type_str()
                )))
            }
        };
        let grant = match table.remove("grant") {
            None => None,
            Some(toml::Value::Array(items)) => Some(
                items
                    .into_iter()
                    .map(|item| match item {
                        toml::Value::String(s) => Ok(s),
                        other => Err(de::Error::custom(format!(
                            "`grant` must list capability names (strings), found a {}",
                            other.type_str()
                        ))),
                    })
                    .collect::<Result<Vec<_>, D::Error>>()?,
            ),
            Some(other) => {
                return Err(de::Error::custom(format!(
                    "`grant` must be a list of capability names, not {}",
                    other.type_str()
                )))
            }
        };
        let isolation = take_isolation_keys(&mut table).map_err(de::Error::custom)?;
        let options = Value::Object(
            table
                .into_iter()
                .map(|(k, v)| (k, toml_to_json(v)))
                .collect(),
        );
        Ok(PluginTable {
            isolation,
            enabled,
            grant,
            options,
        })
    }
}

/// TOML to JSON; dates and times become RFC 3339 strings.
fn toml_to_json(value: toml::Value) -> Value {
    match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(items) => Value::Array(items.into_iter().map(toml_to_json).collect()),
        toml::Value::Table(table) => Value::Object(
            table
                .into_iter()
                .map(|(k, v)| (k, toml_to_json(v)))
                .collect(),
        ),
    }
}

impl FileConfig {
    /// Reads and checks the file at `path`. Relative paths in it are made
    /// relative to the file's directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut config = Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let rebase = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if let Some(dir) = config.data_dir.as_mut() {
            rebase(dir);
        }
        for dir in config.plugin_dirs.iter_mut().flatten() {
            rebase(dir);
        }
        Ok(config)
    }

    /// Parses config text; the error names the key, line and column.
    pub fn parse(text: &str) -> Result<Self, String> {
        let config: FileConfig =
            toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())?;
        config.isolation().check()?;
        Ok(config)
    }

    /// `[plugins]` and each `[plugin.NAME]`'s isolation keys.
    pub fn isolation(&self) -> IsolationConfig {
        IsolationConfig {
            defaults: self.plugins.isolation.clone(),
            plugins: self
                .plugin
                .iter()
                .map(|(name, table)| (name.clone(), table.isolation.clone()))
                .collect(),
            child_exe: None,
        }
    }
}

/// Values given on the command line; each wins over the file.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overrides {
    pub config: Option<PathBuf>,
    pub addr: Option<String>,
    pub data_dir: Option<PathBuf>,
    /// Replaces the file's `plugin_dirs` when not empty.
    pub plugin_dirs: Vec<PathBuf>,
    pub token: Option<String>,
    /// `--no-token`: no token at all, not even the data dir's token file.
    pub no_token: bool,
    /// `--allow-insecure-plugins`: only ever turns the setting on.
    pub allow_insecure_plugins: bool,
}

/// Everything `offstage serve` runs with, after file and flags are merged.
#[derive(Debug, Clone)]
pub(crate) struct ServeConfig {
    /// The address to bind, resolved.
    pub addr: SocketAddr,
    /// The token given (flag, environment or file); with none and not
    /// `no_token`, the host uses its token file (`cli/token.rs`).
    pub token: Option<String>,
    /// `--no-token`: serve without any token (loopback only).
    pub no_token: bool,
    pub data_dir: PathBuf,
    pub plugin_dirs: Vec<PathBuf>,
    pub allow_insecure_plugins: bool,
    pub plugins: BTreeMap<String, PluginTable>,
    /// `[plugins]` and each `[plugin.NAME]`'s isolation keys.
    pub isolation: IsolationConfig,
    pub permissions: Vec<Rule>,
    /// `[store] durability`.
    pub durability: Durability,
    /// `[http]`: client timeouts and the connection cap, as written
    /// (defaults are applied by `http::Limits`).
    pub http: HttpTable,
    /// `[jobs] max_output`, in bytes.
    pub max_output: u64,
    /// `[jobs] max_running`, if set.
    pub max_running: Option<usize>,
    /// `[jobs] sandbox`, `network` and `escalate`.
    pub job_sandbox: JobSandbox,
    /// `[events]`: the event history's limits.
    pub event_history: HistoryLimits,
    /// `[agent.NAME]`: model-driven agents, resolved (keys read).
    pub agents: Vec<(String, ModelAgentSettings)>,
    /// `[sessions] default_agent`.
    pub default_agent: Option<String>,
    /// Things worth a warning in the log, e.g. a token in a file that
    /// other users can read.
    pub warnings: Vec<String>,
}

impl ServeConfig {
    /// Reads the config file if one is named, applies `overrides`, and
    /// checks the result: a resolvable address, a non-empty token, and no
    /// non-loopback address without a token.
    pub(crate) fn resolve(overrides: Overrides) -> Result<Self, ConfigError> {
        let file = match &overrides.config {
            Some(path) => FileConfig::load(path)?,
            None => FileConfig::default(),
        };
        let isolation = file.isolation();
        let addr_text = overrides
            .addr
            .or(file.addr)
            .unwrap_or_else(|| DEFAULT_ADDR.to_string());
        let addr = resolve_addr(&addr_text)?;
        let mut warnings = Vec::new();
        if let (None, Some(_), Some(path)) = (&overrides.token, &file.token, &overrides.config) {
            if readable_by_others(path) {
                warnings.push(format!(
                    "{} holds the token and other users can read it; chmod 600 it",
                    path.display()
                ));
            }
        }
        let token = overrides.token.or(file.token);
        if let Some(token) = &token {
            if token.trim().is_empty() {
                return Err(ConfigError::Invalid("the token must not be empty".into()));
            }
            if token.trim() != token || token.chars().any(char::is_control) {
                return Err(ConfigError::Invalid(
                    "the token must not contain spaces at its ends or control characters".into(),
                ));
            }
        }
        if overrides.no_token && token.is_some() {
            return Err(ConfigError::Invalid(
                "--no-token contradicts the token given (--token, OFFSTAGE_TOKEN or `token` in the config); \
                 drop one of them"
                    .into(),
            ));
        }
        if token.is_none() && !addr.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on {addr_text} ({addr}) without a token: anyone who can reach it could run \
                 commands as you. Set --token, OFFSTAGE_TOKEN or `token` in the config, or use a loopback \
                 address such as {DEFAULT_ADDR}"
            )));
        }
        if file.http.max_connections == Some(0) {
            return Err(ConfigError::Invalid(
                "[http] max_connections must be at least 1".into(),
            ));
        }
        let data_dir = match overrides.data_dir.or(file.data_dir) {
            Some(dir) => dir,
            None => default_data_dir()?,
        };
        // The data dir's `plugins/` holds the host's private copies of
        // loaded libraries, so it is never a default source: no flag and
        // no `plugin_dirs` means no plugins.
        let plugin_dirs = if overrides.plugin_dirs.is_empty() {
            file.plugin_dirs.unwrap_or_default()
        } else {
            overrides.plugin_dirs
        };
        let base = overrides.config.as_deref().and_then(Path::parent);
        let agents = file
            .agent
            .iter()
            .map(|(name, table)| {
                let settings = table.resolve(name, base, |var| std::env::var(var).ok())?;
                Ok((name.clone(), settings))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        Ok(ServeConfig {
            agents,
            default_agent: file.sessions.default_agent,
            addr,
            token,
            no_token: overrides.no_token,
            data_dir,
            plugin_dirs,
            allow_insecure_plugins: overrides.allow_insecure_plugins
                || file.allow_insecure_plugins.unwrap_or(false),
            isolation,
            plugins: file.plugin,
            permissions: file.permission,
            durability: file.store.durability.unwrap_or_default(),
            http: file.http,
            max_output: file
                .jobs
                .max_output
                .map_or(crate::process::output::DEFAULT_MAX_OUTPUT, |size| size.0),
            max_running: file.jobs.max_running.map(std::num::NonZeroUsize::get),
            job_sandbox: file.jobs.job_sandbox(),
            event_history: event_history(&file.events)?,
            warnings,
        })
    }
}

/// The `[events]` limits, defaults filled in; zero is refused.
fn event_history(table: &EventsTable) -> Result<HistoryLimits, ConfigError> {
    let limits = HistoryLimits {
        events: table.history.unwrap_or(HistoryLimits::DEFAULT.events),
        bytes: table.history_bytes.unwrap_or(HistoryLimits::DEFAULT.bytes),
    };
    if limits.events == 0 || limits.bytes == 0 {
        return Err(ConfigError::Invalid(
            "[events] history and history_bytes must be at least 1".into(),
        ));
    }
    Ok(limits)
}

/// Whether group or other users may read the file at `path`.
#[cfg(unix)]
fn readable_by_others(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o044 != 0)
}

#[cfg(not(unix))]
fn readable_by_others(_: &Path) -> bool {
    false
}

/// `HOST:PORT` to a socket address; a name is looked up, and a name with
/// several addresses uses the first.
pub(crate) fn resolve_addr(text: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bad = |why: String| {
        ConfigError::Invalid(format!("bad address {text:?}: {why} (expected HOST:PORT)"))
    };
    let mut addrs = text.to_socket_addrs().map_err(|e| bad(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| bad("it resolves to no address".into()))
}

/// `$XDG_DATA_HOME/offstage`, else `~/.local/share/offstage`.
pub(crate) fn default_data_dir() -> Result<PathBuf, ConfigError> {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").map(PathBuf::from) {
        if dir.is_absolute() {
            return Ok(dir.join("offstage"));
        }
    }
    match std::env::var_os("HOME").map(PathBuf::from) {
        Some(home) if home.is_absolute() => Ok(home.join(".local/share/offstage")),
        _ => Err(ConfigError::Invalid(
            "cannot choose a data dir: neither XDG_DATA_HOME nor HOME is set; pass --data-dir"
                .into(),
        )),
    }
}

#[cfg(test)]
mod store_table_tests {
    use super::*;

    #[test]
    fn durability_is_normal_unless_the_file_says_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offstage.toml");
        std::fs::write(&path, "").unwrap();
        let resolve = || {
            ServeConfig::resolve(Overrides {
                config: Some(path.clone()),
                data_dir: Some(dir.path().into()),
                ..Overrides::default()
            })
        };
        assert_eq!(resolve().unwrap().durability, Durability::Normal);
        std::fs::write(&path, "[store]\ndurability = \"full\"\n").unwrap();
        assert_eq!(resolve().unwrap().durability, Durability::Full);
        std::fs::write(&path, "[store]\ndurability = \"sometimes\"\n").unwrap();
        let error = resolve().unwrap_err().to_string();
        assert!(error.contains("durability"), "{error}");
    }

    #[test]
    fn event_history_has_defaults_and_refuses_zero_and_unknown_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offstage.toml");
        let resolve = |text: &str| {
            std::fs::write(&path, text).unwrap();
            ServeConfig::resolve(Overrides {
                config: Some(path.clone()),
                data_dir: Some(dir.path().into()),
                ..Overrides::default()
            })
        };
        assert_eq!(resolve("").unwrap().event_history, HistoryLimits::DEFAULT);
        let set = resolve("[events]\nhistory = 10\nhistory_bytes = 65536\n").unwrap();
        assert_eq!(
            set.event_history,
            HistoryLimits {
                events: 10,
                bytes: 65536
            }
        );
        let zero = resolve("[events]\nhistory = 0\n").unwrap_err().to_string();
        assert!(zero.contains("[events]"), "{zero}");
        let typo = resolve("[events]\nhistroy = 5\n").unwrap_err().to_string();
        assert!(typo.contains("histroy"), "{typo}");
    }
}

#[cfg(test)]
mod http_table_tests {
    use super::*;

    #[test]
    fn http_limits_are_durations_and_a_positive_cap() {
        let config = FileConfig::parse(
            "[http]\nheader_timeout = \"2s\"\nbody_timeout = \"1m 30s\"\nidle_timeout = \"500ms\"\nmax_connections = 8\n",
        )
        .unwrap();
        assert_eq!(config.http.header_timeout, Some(Duration::from_secs(2)));
        assert_eq!(config.http.body_timeout, Some(Duration::from_secs(90)));
        assert_eq!(config.http.idle_timeout, Some(Duration::from_millis(500)));
        assert_eq!(config.http.max_connections, Some(8));
        assert!(FileConfig::parse("").unwrap().http.header_timeout.is_none());
        for bad in [
            "[http]\nheader_timeout = 10\n",
            "[http]\nheader_timeout = \"soon\"\n",
            "[http]\nidle_timeout = \"0s\"\n",
            "[http]\nheader_timeot = \"1s\"\n",
        ] {
            assert!(FileConfig::parse(bad).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offstage.toml");
        std::fs::write(&path, "[http]\nmax_connections = 0\n").unwrap();
        let error = ServeConfig::resolve(Overrides {
            config: Some(path),
            data_dir: Some(dir.path().into()),
            ..Overrides::default()
        })
        .unwrap_err()
        .to_string();
        assert!(error.contains("max_connections"), "{error}");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::permission::Action;

    #[test]
    fn parses_a_full_file() {
        let config = FileConfig::parse(
            r#"
addr = "127.0.0.1:0"
token = "t0k"
data_dir = "/tmp/x"
plugin_dirs = ["a", "b"]
allow_insecure_plugins = true

[plugin.auto-background]
grant = ["session.background"]
after_ms = 5000
nested = { k = [1, 2] }

[plugin.off]
enabled = false

[[permission]]
tool = "shell"
pattern = "rm *"
action = "ask"

[[permission]]
tool = "subagent"
action = "deny"
"#,
        )
        .unwrap();
        assert_eq!(config.token.as_deref(), Some("t0k"));
        assert_eq!(config.plugin_dirs.unwrap().len(), 2);
        let auto = &config.plugin["auto-background"];
        assert!(auto.enabled);
        assert_eq!(auto.grant, Some(vec!["session.background".to_string()]));
        assert_eq!(
            auto.options,
            json!({"after_ms": 5000, "nested": {"k": [1, 2]}})
        );
        assert!(!config.plugin["off"].enabled);
        assert_eq!(config.permission.len(), 2);
        assert_eq!(config.permission[0].action, Action::Ask);
        assert_eq!(config.permission[1].pattern, "*");
    }

    #[test]
    fn max_output_takes_sizes_with_units() {
        let max = |text: &str| FileConfig::parse(text).map(|c| c.jobs.max_output);
        assert_eq!(max("").unwrap(), None);
        for (text, bytes) in [
            ("max_output = \"64MiB\"", 64 << 20),
            ("max_output = \"1 GiB\"", 1 << 30),
            ("max_output = \"512KiB\"", 512 << 10),
            ("max_output = \"2MB\"", 2_000_000),
            ("max_output = \"100B\"", 100),
            ("max_output = \"4096\"", 4096),
            ("max_output = 4096", 4096),
        ] {
            assert_eq!(
                max(&format!("[jobs]\n{text}\n")).unwrap(),
                Some(ByteSize(bytes)),
                "{text}"
            );
        }
        for bad in [
            "\"64 furlongs\"",
            "\"MiB\"",
            "\"-1KiB\"",
            "\"0\"",
            "0",
            "-5",
            "1.5",
            "\"99999999999TiB\"",
        ] {
            let error = max(&format!("[jobs]\nmax_output = {bad}\n")).unwrap_err();
            assert!(error.contains("line 2"), "{bad}: {error}");
        }
        let running = |text: &str| FileConfig::parse(text).map(|c| c.jobs.max_running);
        assert_eq!(running("").unwrap(), None);
        assert_eq!(
            running("[jobs]\nmax_running = 7\n")
                .unwrap()
                .map(|n| n.get()),
            Some(7)
        );
        for bad in ["0", "-1", "\"many\""] {
            let error = running(&format!("[jobs]\nmax_running = {bad}\n")).unwrap_err();
            assert!(error.contains("line 2"), "{bad}: {error}");
        }
        let error = FileConfig::parse("[jobs]\nmax_outptu = 1\n").unwrap_err();
        assert!(error.contains("max_outptu"), "{error}");
    }

    #[test]
    fn agent_tables_resolve_and_their_errors_name_the_table() {
        let file = FileConfig::parse(
            "[sessions]\ndefault_agent = \"gpt\"\n\n[agent.gpt]\nprovider = \"openai\"\n\
             model = \"gpt-4.1-mini\"\napi_key_env = \"TEST_KEY\"\ntools = [\"shell\"]\n\
             max_steps = 4\ncontext_tokens = 8000\nrequest_timeout = \"30s\"\nmax_retries = 1\n\
             max_wake_turns = 6\nmax_tokens_per_session = 500000\n",
        )
        .unwrap();
        assert_eq!(file.sessions.default_agent.as_deref(), Some("gpt"));
        let table = &file.agent["gpt"];
        let settings = table
            .resolve("gpt", None, |var| {
                (var == "TEST_KEY").then(|| "sk-secret".to_string())
            })
            .unwrap();
        assert_eq!(settings.model.base_url, "https://api.openai.com/v1");
        assert_eq!(settings.model.request_timeout, Duration::from_secs(30));
        assert_eq!(settings.max_steps, 4);
        assert_eq!(
            settings.caps,
            Caps {
                max_wake_turns: Some(6),
                max_tokens_per_session: Some(500_000),
            }
        );
        assert_eq!(settings.model.temperature, None, "sent only when set");
        assert!(
            !format!("{settings:?}").contains("sk-secret"),
            "the key is never printed"
        );

        let missing = table
            .resolve("gpt", None, |_| None)
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("[agent.gpt]") && missing.contains("TEST_KEY"),
            "{missing}"
        );
        let error =
            FileConfig::parse("[agent.gpt]\nprovider = \"openai\"\nmodle = \"x\"\n").unwrap_err();
        assert!(
            error.contains("modle") && error.contains("agent"),
            "{error}"
        );
        let no_model = FileConfig::parse("[agent.local]\nprovider = \"openai\"\n").unwrap();
        let error = no_model.agent["local"]
            .resolve("local", None, |_| None)
            .unwrap_err();
        assert!(error.to_string().contains("[agent.local]"), "{error}");
    }

    #[test]
    fn an_agents_default_allow_and_sandbox_keys() {
        let caller = |extra: &str| {
            let text = format!("[agent.m]\nprovider = \"openai\"\nmodel = \"x\"\n{extra}");
            let file = FileConfig::parse(&text)?;
            file.agent["m"]
                .resolve("m", None, |_| None)
                .map(|s| s.caller)
                .map_err(|e| e.to_string())
        };
        let default = caller("").unwrap();
        assert!(default.default_allow && default.sandbox == SandboxOverride::default());
        let set =
            caller("default_allow = false\nsandbox = \"read-only\"\nnetwork = \"deny\"\n").unwrap();
        assert!(!set.default_allow);
        let jobs = JobSandbox {
            mode: SandboxMode::WorkspaceWrite,
            network: true,
            escalate: true,
            launcher: None,
            workspace: None,
        };
        // Its keys replace `[jobs]`'s; the one it leaves unset is kept.
        let own = set.sandbox.over(&jobs);
        assert_eq!(own.mode, SandboxMode::ReadOnly);
        assert!(!own.network && own.escalate);
        let error = caller("sandbox = \"danger-full-access\"\n").unwrap_err();
        assert!(error.contains("[agent.m]"), "{error}");
    }

    #[test]
    fn jobs_sandbox_settings() {
        let sandbox = |text: &str| FileConfig::parse(text).map(|c| c.jobs.job_sandbox());
        // None by default: commands have the host's rights.
        let default = sandbox("").unwrap();
        assert_eq!(default.mode, SandboxMode::None);
        assert!(default.network && !default.escalate);
        let set = sandbox(
            "[jobs]\nsandbox = \"workspace-write\"\nnetwork = \"deny\"\nescalate = \"ask\"\n",
        )
        .unwrap();
        assert_eq!(set.mode, SandboxMode::WorkspaceWrite);
        assert!(!set.network && set.escalate);
        assert_eq!(
            sandbox("[jobs]\nsandbox = \"read-only\"\n").unwrap().mode,
            SandboxMode::ReadOnly
        );
        for bad in [
            "sandbox = \"danger-full-access\"",
            "network = \"none\"",
            "escalate = true",
        ] {
            let error = sandbox(&format!("[jobs]\n{bad}\n")).unwrap_err();
            assert!(error.contains("line 2"), "{bad}: {error}");
        }
    }

    #[test]
    fn errors_name_key_and_line() {
        let error = FileConfig::parse("addr = \"127.0.0.1:1\"\ntokn = \"x\"\n").unwrap_err();
        assert!(error.contains("line 2"), "{error}");
        assert!(error.contains("tokn"), "{error}");

        let error = FileConfig::parse("\n\nallow_insecure_plugins = \"yes\"\n").unwrap_err();
        assert!(error.contains("line 3"), "{error}");

        let error = FileConfig::parse("[[permission]]\ntool = \"shell\"\naction = \"maybe\"\n")
            .unwrap_err();
        assert!(
            error.contains("line 3") && error.contains("maybe"),
            "{error}"
        );

        let error = FileConfig::parse("[plugin.x]\nenabled = 1\n").unwrap_err();
        assert!(
            error.contains("enabled") && error.contains("line"),
            "{error}"
        );

        let error =
            FileConfig::parse("[[permission]]\ntool = \"shell\"\naction = \"deny\"\ncolour = 1\n")
                .unwrap_err();
        assert!(error.contains("colour"), "{error}");
    }

    #[test]
    fn flags_win_and_relative_paths_follow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offstage.toml");
        std::fs::write(
            &path,
            "addr = \"127.0.0.1:1\"\ndata_dir = \"data\"\nplugin_dirs = [\"p\"]\n",
        )
        .unwrap();
        let config = ServeConfig::resolve(Overrides {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(config.addr.port(), 1);
        assert_eq!(config.data_dir, dir.path().join("data"));
        assert_eq!(config.plugin_dirs, vec![dir.path().join("p")]);

        let config = ServeConfig::resolve(Overrides {
            config: Some(path),
            addr: Some("127.0.0.1:2".into()),
            data_dir: Some("/elsewhere".into()),
            plugin_dirs: vec!["/q".into()],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(config.addr.port(), 2);
        assert_eq!(config.data_dir, PathBuf::from("/elsewhere"));
        assert_eq!(config.plugin_dirs, vec![PathBuf::from("/q")]);
    }

    #[test]
    fn read_only_filesystem_needs_isolation() {
        let error = FileConfig::parse(
            "[plugins]\nisolation = \"process\"\n[plugin.a]\nisolation = \"none\"\nfilesystem = \"read-only\"\n",
        )
        .unwrap_err();
        assert!(error.starts_with("[plugin.a]: "), "{error}");
        assert!(error.contains("restrict the whole host"), "{error}");
        let config = FileConfig::parse(
            "[plugins]\nisolation = \"process\"\nfilesystem = \"read-only\"\n[plugin.a]\nfilesystem = \"unrestricted\"\n",
        )
        .unwrap();
        // Isolation keys are not the plugin's options.
        assert_eq!(config.plugin["a"].options, serde_json::json!({}));
    }

    #[test]
    fn refuses_open_addresses_without_a_token() {
        let open = |token: Option<&str>| {
            ServeConfig::resolve(Overrides {
                addr: Some("0.0.0.0:0".into()),
                data_dir: Some("/tmp".into()),
                token: token.map(str::to_string),
                ..Default::default()
            })
        };
        let error = open(None).unwrap_err().to_string();
        assert!(error.contains("without a token"), "{error}");
        assert!(open(Some("secret")).is_ok());
        assert!(open(Some("")).is_err());
        assert!(ServeConfig::resolve(Overrides {
            addr: Some("nonsense".into()),
            data_dir: Some("/tmp".into()),
            ..Default::default()
        })
        .is_err());
    }
}
