//! How the host is told where plugins are and how to treat each one: the
//! `[plugin]` part of the host config, and what a plugin is granted.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
};

use serde_json::Value;

/// How the host config treats one plugin (its `[plugin.NAME]` table).
#[derive(Debug, Clone, PartialEq)]
pub struct PluginSettings {
    /// `false` skips the plugin; it is listed as `unloaded`.
    pub enabled: bool,
    /// Capabilities granted. `None` grants everything the manifest asks for;
    /// a list grants at most those.
    pub grant: Option<Vec<String>>,
    /// The plugin's options (the table's other keys), a JSON object.
    pub options: Value,
}

impl Default for PluginSettings {
    fn default() -> Self {
        PluginSettings {
            enabled: true,
            grant: None,
            options: Value::Null,
        }
    }
}

/// Where plugins come from and how they are treated.
#[derive(Debug, Clone, Default)]
pub struct PluginHostConfig {
    /// Directories searched by [`PluginHost::load_all`](super::PluginHost::load_all).
    pub dirs: Vec<PathBuf>,
    /// The host's data dir; private copies of loaded libraries go to
    /// `<data_dir>/plugins/`.
    pub data_dir: PathBuf,
    /// Load plugin files (or dirs) writable by other users. For development.
    pub allow_insecure_permissions: bool,
    /// Per-plugin settings by plugin name.
    pub settings: BTreeMap<String, PluginSettings>,
}

impl PluginHostConfig {
    /// The data dir of plugin `name`: `<data_dir>/plugin-data/<name>`
    /// (`Context::data_dir`). Plugin names are checked by the SDK's
    /// manifest, but a library need not use the SDK: every byte other than
    /// `[A-Za-z0-9_-]` is written `.XX` (hex), so no name leaves the dir
    /// (`..`, a separator) and no two names share one (`a.b`, `a_b`).
    pub fn plugin_data_dir(&self, name: &str) -> PathBuf {
        let safe: String = if name.is_empty() {
            // `.` followed by no hex pair: no encoded name looks like it.
            ".none".to_string()
        } else {
            name.bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                        char::from(b).to_string()
                    } else {
                        format!(".{b:02x}")
                    }
                })
                .collect()
        };
        self.data_dir.join("plugin-data").join(safe)
    }
}

/// Requested ∩ granted; everything requested when the config lists nothing.
pub(super) fn granted(requested: &[String], grant: Option<&[String]>) -> BTreeSet<String> {
    requested
        .iter()
        .filter(|c| grant.is_none_or(|g| g.contains(c)))
        .cloned()
        .collect()
}

/// What the config's `grant` lists and the manifest does not ask for:
/// never given (grants only narrow), so worth a warning — usually a
/// capability the plugin's author forgot in the manifest.
pub(super) fn unasked(requested: &[String], grant: Option<&[String]>) -> Vec<String> {
    grant
        .unwrap_or_default()
        .iter()
        .filter(|c| !requested.contains(c))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_data_dirs_stay_under_the_data_dir() {
        let config = PluginHostConfig {
            data_dir: PathBuf::from("/data"),
            ..Default::default()
        };
        let root = PathBuf::from("/data/plugin-data");
        assert_eq!(config.plugin_data_dir("audit-log"), root.join("audit-log"));
        assert_eq!(
            config.plugin_data_dir("a/../b"),
            root.join("a.2f.2e.2e.2fb")
        );
        assert_eq!(config.plugin_data_dir(".."), root.join(".2e.2e"));
        assert_eq!(config.plugin_data_dir(""), root.join(".none"));
        // Names that differ get different dirs.
        assert_ne!(config.plugin_data_dir("a.b"), config.plugin_data_dir("a_b"));
        assert_ne!(
            config.plugin_data_dir("plugin_2"),
            config.plugin_data_dir("..")
        );
    }

    #[test]
    fn grants_are_the_intersection() {
        let requested = vec!["a".to_string(), "b".to_string()];
        assert_eq!(
            granted(&requested, None),
            BTreeSet::from(["a".into(), "b".into()])
        );
        assert_eq!(
            granted(&requested, Some(&["b".to_string(), "c".to_string()])),
            BTreeSet::from(["b".into()])
        );
        assert!(granted(&requested, Some(&[])).is_empty());
    }

    #[test]
    fn a_grant_nobody_asked_for_is_named() {
        let requested = vec!["a".to_string(), "b".to_string()];
        assert!(unasked(&requested, None).is_empty());
        assert!(unasked(&requested, Some(&["b".to_string()])).is_empty());
        assert_eq!(
            unasked(&requested, Some(&["b".to_string(), "c".to_string()])),
            vec!["c".to_string()]
        );
    }
}
