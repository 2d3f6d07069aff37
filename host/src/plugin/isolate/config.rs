//! What the host config says about isolation: `[plugins]` for every
//! plugin, `[plugin.NAME]` for one, and the values in force.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use serde::Serialize;

/// Where a plugin's code runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// In the host's process: native speed, but a crash is the host's.
    #[default]
    None,
    /// In a child process of its own.
    Process,
}

impl std::str::FromStr for Isolation {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Isolation::None),
            "process" => Ok(Isolation::Process),
            other => Err(format!(
                "`isolation` must be \"none\" or \"process\", not {other:?}"
            )),
        }
    }
}

/// What an isolated plugin's process may do to the filesystem
/// (`filesystem = ...`; see `sandbox.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Filesystem {
    /// What the user running the host may do (no restriction).
    #[default]
    Unrestricted,
    /// Read everywhere, write only in the plugin's own data dir (Landlock).
    ReadOnly,
}

impl std::str::FromStr for Filesystem {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "unrestricted" => Ok(Filesystem::Unrestricted),
            "read-only" => Ok(Filesystem::ReadOnly),
            other => Err(format!(
                "`filesystem` must be \"unrestricted\" or \"read-only\", not {other:?}"
            )),
        }
    }
}

/// Whether a `filesystem = "read-only"` plugin's process may open sockets
/// (`network = ...`; see `sandbox.rs`). Without `read-only` nothing is
/// restricted, this included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// No `socket()` (unix, IP, netlink or any other family).
    #[default]
    Deny,
    /// Sockets as the user may open them; abstract unix sockets and
    /// signals stay confined to the process.
    Allow,
}

impl std::str::FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "deny" => Ok(Network::Deny),
            "allow" => Ok(Network::Allow),
            other => Err(format!(
                "`network` must be \"deny\" or \"allow\", not {other:?}"
            )),
        }
    }
}

/// What happens when an isolated plugin's process dies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Start a new process, with backoff, at most `max_restarts` in
    /// `restart_window`; after that the plugin stays failed.
    #[default]
    OnFailure,
    /// Leave the plugin failed.
    Never,
}

impl std::str::FromStr for RestartPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on-failure" => Ok(RestartPolicy::OnFailure),
            "never" => Ok(RestartPolicy::Never),
            other => Err(format!(
                "`restart` must be \"on-failure\" or \"never\", not {other:?}"
            )),
        }
    }
}

/// Isolation settings of `[plugins]` or one `[plugin.NAME]`; what is not
/// set comes from `[plugins]`, then from the defaults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IsolationSettings {
    /// `isolation = "none" | "process"`.
    pub mode: Option<Isolation>,
    /// `restart = "on-failure" | "never"`.
    pub restart: Option<RestartPolicy>,
    /// `max_restarts`: restarts allowed within `restart_window` (default 3).
    pub max_restarts: Option<u32>,
    /// `restart_window`: the window of `max_restarts` (default 60 s).
    pub restart_window: Option<Duration>,
    /// `call_timeout`: deadline of a tool, wrapper or agent call into the
    /// child (default: none; jobs have their own cancel and timeouts).
    pub call_timeout: Option<Duration>,
    /// `event_timeout`: deadline of one event handler call (default 30 s).
    pub event_timeout: Option<Duration>,
    /// `ping_interval`: how often the child is asked if it is alive
    /// (default 2 s); `ping_timeout` is how long it may take to answer
    /// (default 10 s) before it is killed.
    pub ping_interval: Option<Duration>,
    /// See `ping_interval`.
    pub ping_timeout: Option<Duration>,
    /// `memory_limit` in bytes: the child's `RLIMIT_AS`.
    pub memory_limit: Option<u64>,
    /// `cpu_limit` in seconds: the child's `RLIMIT_CPU`.
    pub cpu_limit: Option<u64>,
    /// `filesystem = "unrestricted" | "read-only"` (default unrestricted);
    /// `read-only` needs `isolation = "process"`.
    pub filesystem: Option<Filesystem>,
    /// `network = "deny" | "allow"` (default deny): with `read-only`,
    /// whether the process may open sockets.
    pub network: Option<Network>,
}

/// The isolation part of the host config.
#[derive(Debug, Clone, Default)]
pub struct IsolationConfig {
    /// `[plugins]`: for every plugin.
    pub defaults: IsolationSettings,
    /// `[plugin.NAME]`: for one, by plugin name.
    pub plugins: BTreeMap<String, IsolationSettings>,
    /// The `offstage` binary to run as the plugin's process; the running
    /// executable when `None` (set it when the host is a library in
    /// another program, as in tests).
    pub child_exe: Option<PathBuf>,
}

/// The settings in force for one plugin.
#[derive(Debug, Clone)]
pub(in crate::plugin) struct Resolved {
    pub(in crate::plugin) mode: Isolation,
    pub(in crate::plugin) restart: RestartPolicy,
    pub(in crate::plugin) max_restarts: u32,
    pub(in crate::plugin) restart_window: Duration,
    pub(in crate::plugin) call_timeout: Option<Duration>,
    pub(in crate::plugin) event_timeout: Duration,
    pub(in crate::plugin) control_timeout: Duration,
    pub(in crate::plugin) ping_interval: Duration,
    pub(in crate::plugin) ping_timeout: Duration,
    pub(in crate::plugin) memory_limit: Option<u64>,
    pub(in crate::plugin) cpu_limit: Option<u64>,
    pub(in crate::plugin) filesystem: Filesystem,
    pub(in crate::plugin) network: Network,
}

impl IsolationConfig {
    /// The settings in force for the plugin called `name`.
    pub(in crate::plugin) fn resolve(&self, name: &str) -> Resolved {
        let own = self.plugins.get(name);
        let d = &self.defaults;
        macro_rules! pick {
            ($field:ident) => {
                own.and_then(|o| o.$field).or(d.$field)
            };
        }
        Resolved {
            mode: pick!(mode).unwrap_or_default(),
            restart: pick!(restart).unwrap_or_default(),
            max_restarts: pick!(max_restarts).unwrap_or(3),
            restart_window: pick!(restart_window).unwrap_or(Duration::from_secs(60)),
            call_timeout: pick!(call_timeout),
            event_timeout: pick!(event_timeout).unwrap_or(Duration::from_secs(30)),
            control_timeout: Duration::from_secs(30),
            ping_interval: pick!(ping_interval).unwrap_or(Duration::from_secs(2)),
            ping_timeout: pick!(ping_timeout).unwrap_or(Duration::from_secs(10)),
            memory_limit: pick!(memory_limit),
            cpu_limit: pick!(cpu_limit),
            filesystem: pick!(filesystem).unwrap_or_default(),
            network: pick!(network).unwrap_or_default(),
        }
    }

    /// Refuses `filesystem = "read-only"` where the plugin would run in
    /// the host: Landlock would restrict the whole host. Checked for
    /// `[plugins]` and for every `[plugin.NAME]` as they resolve.
    pub fn check(&self) -> Result<(), String> {
        let refuse = |table: &str| {
            Err(format!(
                "{table}: `filesystem = \"read-only\"` needs `isolation = \"process\"`: \
                 the restriction applies to a plugin's own process, and in the host's \
                 process it would restrict the whole host"
            ))
        };
        let d = &self.defaults;
        if d.filesystem == Some(Filesystem::ReadOnly)
            && d.mode.unwrap_or_default() != Isolation::Process
        {
            return refuse("[plugins]");
        }
        for name in self.plugins.keys() {
            let resolved = self.resolve(name);
            if resolved.filesystem == Filesystem::ReadOnly && resolved.mode != Isolation::Process {
                return refuse(&format!("[plugin.{name}]"));
            }
        }
        Ok(())
    }

    /// Whether some plugin may run with `filesystem = "read-only"`: then
    /// a file's plugin name is learnt in a process that may write nowhere
    /// first, since the restriction must be set before the library opens.
    pub(in crate::plugin) fn any_read_only(&self) -> bool {
        self.defaults.filesystem == Some(Filesystem::ReadOnly)
            || self
                .plugins
                .values()
                .any(|s| s.filesystem == Some(Filesystem::ReadOnly))
    }

    /// Whether some plugin, by name, runs isolated while the default is
    /// in process: then a file's name is learnt in a child first, since
    /// opening it here would already run its code.
    pub(in crate::plugin) fn any_by_name(&self) -> bool {
        self.defaults.mode.unwrap_or_default() == Isolation::None
            && self
                .plugins
                .values()
                .any(|s| s.mode == Some(Isolation::Process))
    }

    /// Whether every plugin runs isolated unless its own table says not.
    pub(in crate::plugin) fn default_mode(&self) -> Isolation {
        self.defaults.mode.unwrap_or_default()
    }
}

/// Removes the isolation keys from a `[plugins]` or `[plugin.NAME]` table
/// of the config file and reads them; what is left are the plugin's options.
pub(crate) fn take_isolation_keys(table: &mut toml::Table) -> Result<IsolationSettings, String> {
    fn text(table: &mut toml::Table, key: &str) -> Result<Option<String>, String> {
        match table.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(format!(
                "`{key}` must be a string, not {}",
                other.type_str()
            )),
        }
    }
    fn duration(table: &mut toml::Table, key: &str) -> Result<Option<Duration>, String> {
        text(table, key)?
            .map(|s| {
                humantime::parse_duration(&s)
                    .map_err(|e| format!("`{key}` = {s:?} is not a duration like \"30s\": {e}"))
            })
            .transpose()
    }
    fn count(table: &mut toml::Table, key: &str) -> Result<Option<u64>, String> {
        match table.remove(key) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) if i >= 0 => Ok(Some(i as u64)),
            Some(toml::Value::String(s)) => parse_size(&s)
                .map(Some)
                .ok_or_else(|| format!("`{key}` = {s:?} is not a size like \"512M\"")),
            Some(other) => Err(format!("`{key}` must be a positive integer, not {other}")),
        }
    }
    Ok(IsolationSettings {
        mode: text(table, "isolation")?.map(|s| s.parse()).transpose()?,
        restart: text(table, "restart")?.map(|s| s.parse()).transpose()?,
        max_restarts: count(table, "max_restarts")?.map(|n| n.min(u32::MAX as u64) as u32),
        restart_window: duration(table, "restart_window")?,
        call_timeout: duration(table, "call_timeout")?,
        event_timeout: duration(table, "event_timeout")?,
        ping_interval: duration(table, "ping_interval")?,
        ping_timeout: duration(table, "ping_timeout")?,
        memory_limit: count(table, "memory_limit")?,
        cpu_limit: count(table, "cpu_limit")?,
        filesystem: text(table, "filesystem")?.map(|s| s.parse()).transpose()?,
        network: text(table, "network")?.map(|s| s.parse()).transpose()?,
    })
}

/// `"512M"`, `"2G"`, `"100K"`, or plain bytes.
fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let n: u64 = digits.parse().ok()?;
    let unit = match unit.trim().trim_end_matches("iB").trim_end_matches('B') {
        "" => 1,
        "K" | "k" => 1 << 10,
        "M" | "m" => 1 << 20,
        "G" | "g" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_keys_are_read_and_the_rest_left() {
        let mut table: toml::Table = toml::from_str(
            "isolation = \"process\"\nrestart = \"never\"\nmemory_limit = \"512M\"\ncall_timeout = \"2s\"\nother = 1\n",
        )
        .unwrap();
        let settings = take_isolation_keys(&mut table).unwrap();
        assert_eq!(settings.mode, Some(Isolation::Process));
        assert_eq!(settings.restart, Some(RestartPolicy::Never));
        assert_eq!(settings.memory_limit, Some(512 << 20));
        assert_eq!(settings.call_timeout, Some(Duration::from_secs(2)));
        assert_eq!(table.len(), 1);
        let mut sandboxed: toml::Table = toml::from_str("filesystem = \"read-only\"\n").unwrap();
        assert_eq!(
            take_isolation_keys(&mut sandboxed).unwrap().filesystem,
            Some(Filesystem::ReadOnly)
        );
        let mut typo: toml::Table = toml::from_str("filesystem = \"readonly\"\n").unwrap();
        assert!(take_isolation_keys(&mut typo)
            .unwrap_err()
            .contains("\"unrestricted\" or \"read-only\""));
        let mut bad: toml::Table = toml::from_str("isolation = \"thread\"\n").unwrap();
        assert!(take_isolation_keys(&mut bad)
            .unwrap_err()
            .contains("\"none\" or \"process\""));
    }

    #[test]
    fn a_plugin_table_overrides_plugins() {
        let mut config = IsolationConfig::default();
        config.defaults.mode = Some(Isolation::Process);
        config.defaults.max_restarts = Some(5);
        config.plugins.insert(
            "a".into(),
            IsolationSettings {
                mode: Some(Isolation::None),
                ..Default::default()
            },
        );
        assert_eq!(config.resolve("a").mode, Isolation::None);
        assert_eq!(config.resolve("a").max_restarts, 5);
        assert_eq!(config.resolve("b").mode, Isolation::Process);
        assert!(!config.any_by_name());
    }

    #[test]
    fn read_only_is_refused_where_a_plugin_runs_in_the_host() {
        let read_only = |mode| IsolationSettings {
            mode,
            filesystem: Some(Filesystem::ReadOnly),
            ..Default::default()
        };
        // For every plugin, without isolating every plugin.
        let config = IsolationConfig {
            defaults: read_only(None),
            ..Default::default()
        };
        let error = config.check().unwrap_err();
        assert!(error.starts_with("[plugins]: "), "{error}");
        assert!(error.contains("restrict the whole host"), "{error}");
        // One plugin, isolated: fine; the same plugin in the host: refused.
        let mut config = IsolationConfig::default();
        config
            .plugins
            .insert("a".into(), read_only(Some(Isolation::Process)));
        assert_eq!(config.check(), Ok(()));
        assert!(config.any_read_only());
        assert_eq!(config.resolve("a").filesystem, Filesystem::ReadOnly);
        assert_eq!(config.resolve("b").filesystem, Filesystem::Unrestricted);
        config.plugins.insert("b".into(), read_only(None));
        assert!(config.check().unwrap_err().starts_with("[plugin.b]: "));
        // Inherited from `[plugins]` by a plugin that runs in the host.
        let config = IsolationConfig {
            defaults: read_only(Some(Isolation::Process)),
            plugins: [(
                "c".to_string(),
                IsolationSettings {
                    mode: Some(Isolation::None),
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        };
        assert!(config.check().unwrap_err().starts_with("[plugin.c]: "));
    }
}
