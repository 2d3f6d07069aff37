//! Why a plugin file could not be loaded, one variant per cause.
//!
//! Each error is shown to a person reading a log line or the output of
//! `offstage plugin check`, so its `Display` is exactly one line that names
//! the file and the cause. Anything long (abi_stable's layout reports can
//! run to hundreds of lines) is trimmed here and logged in full at debug
//! level where it is produced.

use std::path::PathBuf;

fn known_capabilities() -> &'static [&'static str] {
    offstage_plugin_api::capability::ALL
}

/// Why a plugin file was refused or failed to start.
///
/// Serialisable because an isolated plugin's process runs the same checks
/// and `init`, and hands the host the same error, not a description of it
/// (`plugin/isolate/`): a refusal reads and classifies the same either way.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum LoadError {
    /// The file could not be read or copied.
    #[error("{}: cannot read plugin file: {message}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// What went wrong, in words.
        message: String,
    },

    /// The file or its directory may be changed by other users, who could
    /// then run code inside the host. Refused as ssh refuses such keys.
    #[error(
        "{}: refused: {what} is writable by group or other users (mode {mode:03o}); \
         run `chmod go-w` on it or move the plugin, or for development pass \
         `--allow-insecure-plugins` (`allow_insecure_plugins = true` in the config)",
        path.display()
    )]
    InsecurePermissions {
        /// The file or directory concerned.
        path: PathBuf,
        /// `the plugin file` or `its directory <dir>`.
        what: String,
        /// Its permission bits.
        mode: u32,
    },

    /// The file, a directory above it, or the file a symlink leads to
    /// belongs to another user (not root), who could change it.
    #[error(
        "{}: refused: {what} belongs to another user (uid {uid}); plugins must be owned \
         by the host's user or root, or for development pass `--allow-insecure-plugins` \
         (`allow_insecure_plugins = true` in the config)",
        path.display()
    )]
    ForeignOwner {
        /// The plugin file.
        path: PathBuf,
        /// What belongs to someone else: the file or a directory.
        what: String,
        /// Its owner.
        uid: u32,
    },

    /// The manifest requests, or the host config grants, a capability
    /// this host does not know: a typo would otherwise pass silently.
    #[error(
        "{}: plugin `{name}`: unknown capability {unknown:?} in {}; valid names are: {}",
        path.display(),
        if *in_config { format!("the host config ([plugin.{name}] grant)") } else { "its manifest".into() },
        valid.join(", ")
    )]
    UnknownCapability {
        /// The plugin file.
        path: PathBuf,
        /// The plugin's name.
        name: String,
        /// The names not known, as written.
        unknown: Vec<String>,
        /// Whether the host config (not the manifest) has the names.
        in_config: bool,
        /// Every capability this host knows (the host's own list, also
        /// when the error comes from an isolated plugin's process).
        #[serde(skip, default = "known_capabilities")]
        valid: &'static [&'static str],
    },

    /// `offstage dev` could not build the plugin from its sources; the
    /// generation loaded before (if any) keeps serving.
    #[error("{}: build failed: {message}", path.display())]
    Build {
        /// The library the build would have installed.
        path: PathBuf,
        /// cargo's first error, in one line.
        message: String,
    },

    /// Not an ELF / Mach-O / PE file at all.
    #[error("{}: not a shared library ({detail})", path.display())]
    NotSharedLibrary {
        /// The file or directory concerned.
        path: PathBuf,
        /// What the system said.
        detail: String,
    },

    /// A shared library whose headers point past the end of the file.
    #[error("{}: truncated file ({detail})", path.display())]
    Truncated {
        /// The file or directory concerned.
        path: PathBuf,
        /// What the system said.
        detail: String,
    },

    /// The dynamic loader refused the file for another reason (a missing
    /// dependency, a library for another platform).
    #[error("{}: cannot open library: {detail}", path.display())]
    Open {
        /// The file or directory concerned.
        path: PathBuf,
        /// What the system said.
        detail: String,
    },

    /// A shared library, but not an Offstage plugin: it does not export
    /// abi_stable's root module symbol.
    #[error(
        "{}: no root module: symbol `{symbol}` not found (is it built with offstage_plugin_api::export_plugin!?)",
        path.display()
    )]
    NoRootModule {
        /// The file or directory concerned.
        path: PathBuf,
        /// The symbol looked for.
        symbol: String,
    },

    /// Built with an abi_stable whose ABI differs from the host's.
    #[error(
        "{}: incompatible abi_stable: the plugin's abi_stable ABI is {found}, this host's is {expected}",
        path.display()
    )]
    IncompatibleAbiStable {
        /// The file or directory concerned.
        path: PathBuf,
        /// What the file has.
        found: String,
        /// What this host expects.
        expected: String,
    },

    /// Built against another major version of `offstage-plugin-api`.
    #[error(
        "{}: incompatible API major version: built against offstage-plugin-api {plugin}, \
         this host uses {host}",
        path.display()
    )]
    IncompatibleApiVersion {
        /// The file or directory concerned.
        path: PathBuf,
        /// The plugin's side.
        plugin: String,
        /// The host's side.
        host: String,
    },

    /// A type the plugin and host share has a different layout: the final
    /// `Error:`/`Expected:`/`Found:` lines of abi_stable's report.
    #[error("{}: layout mismatch: {summary}", path.display())]
    LayoutMismatch {
        /// The file or directory concerned.
        path: PathBuf,
        /// The first difference, in words.
        summary: String,
    },

    /// `manifest()` failed; nothing is known about the plugin.
    #[error("{}: manifest failed: {message}", path.display())]
    Manifest {
        /// The file or directory concerned.
        path: PathBuf,
        /// What went wrong, in words.
        message: String,
    },

    /// Built with `panic = "abort"`: a panic in it would kill the host.
    #[error(
        "{}: plugin `{name}` is built with panic = \"abort\", so its panics cannot be contained; \
         rebuild it with panic = \"unwind\"",
        path.display()
    )]
    PanicAbort {
        /// The file or directory concerned.
        path: PathBuf,
        /// The plugin's name.
        name: String,
    },

    /// Another file already provides a plugin of that name.
    #[error(
        "{}: duplicate plugin name `{name}`: already loaded from {}",
        path.display(),
        other.display()
    )]
    DuplicateName {
        /// The file or directory concerned.
        path: PathBuf,
        /// The plugin's name.
        name: String,
        /// The other file with that name.
        other: PathBuf,
    },

    /// The plugin panicked in `init`.
    /// `message` says where: `panicked in init: ...`.
    #[error("{}: plugin `{name}` {message}", path.display())]
    InitPanic {
        /// The file or directory concerned.
        path: PathBuf,
        /// The plugin's name.
        name: String,
        /// What went wrong, in words.
        message: String,
    },

    /// The plugin's `init` returned an error.
    #[error("{}: plugin `{name}` failed in init: {message}", path.display())]
    InitError {
        /// The file or directory concerned.
        path: PathBuf,
        /// The plugin's name.
        name: String,
        /// What went wrong, in words.
        message: String,
    },

    /// The host itself could not load the plugin (no tokio runtime, ...).
    #[error("{}: host error: {message}", path.display())]
    Host {
        /// The file or directory concerned.
        path: PathBuf,
        /// What went wrong, in words.
        message: String,
    },

    /// A reload found another plugin in the file the plugin came from.
    #[error(
        "{}: reload of plugin `{expected}` refused: the file now holds plugin `{found}`",
        path.display()
    )]
    NameChanged {
        /// The file or directory concerned.
        path: PathBuf,
        /// What this host expects.
        expected: String,
        /// What the file has.
        found: String,
    },

    /// An isolated plugin's process refused, failed or died while it
    /// opened or started the plugin (`isolation = "process"`).
    #[error("{}: plugin process: {message}", path.display())]
    Isolated {
        /// The plugin file.
        path: PathBuf,
        /// What the process reported, or how it ended.
        message: String,
    },
    /// An isolated plugin's process could not restrict itself as
    /// `filesystem = "read-only"` asks, before the plugin's manifest was
    /// read; the loader reports it as [`LoadError::Filesystem`] once the
    /// plugin's name is known. Its own variant so that the process's
    /// answer, which crosses as this error, says so by its type.
    #[error(
        "{}: plugin process: filesystem = \"read-only\" is not enforced: {cause}",
        path.display()
    )]
    NotEnforced {
        /// The plugin file.
        path: PathBuf,
        /// Why, in words.
        cause: String,
    },
    /// `filesystem = "read-only"` is set for the plugin, but its process
    /// could not be restricted (no Landlock, or only in part): the plugin
    /// is not started rather than run unrestricted.
    #[error(
        "{}: plugin `{name}` is not started: its `filesystem = \"read-only\"` cannot be enforced: {cause}",
        path.display()
    )]
    Filesystem {
        /// The plugin file.
        path: PathBuf,
        /// The plugin's name.
        name: String,
        /// Why, in words.
        cause: String,
    },
    /// The plugin gave one name where the host looked first (its file's
    /// name section, or a look in a child process) and another where it
    /// loaded it: refused, since where a plugin runs is chosen by name.
    #[error(
        "{}: refused: the plugin is `{first}` by {first_from} but `{then}` by {then_from}; \
         a plugin must have one name wherever it is loaded",
        path.display()
    )]
    NameMismatch {
        /// The plugin file.
        path: PathBuf,
        /// The name the host went by.
        first: String,
        /// Where it learnt it.
        first_from: NameSource,
        /// The name the load found.
        then: String,
        /// Where.
        then_from: NameSource,
    },
    /// The file's `.offstage.plugin` section cannot be read as a name.
    #[error("{}: refused: {message}", path.display())]
    NameSection {
        /// The plugin file.
        path: PathBuf,
        /// What is wrong, in words.
        message: String,
    },
    /// A reload named a plugin the host has never seen.
    #[error("no plugin named `{name}`")]
    Unknown {
        /// The plugin's name.
        name: String,
    },
}

/// Where the host learnt a plugin's name ([`LoadError::NameMismatch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NameSource {
    /// The `.offstage.plugin` section of its file.
    File,
    /// Its manifest, read by a child process before the load.
    Look,
    /// Its manifest, read in the host's process.
    Host,
    /// Its manifest, read in its own process.
    Process,
}

impl std::fmt::Display for NameSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameSource::File => "its file",
            NameSource::Look => "a look in a child process",
            NameSource::Host => "its manifest in the host",
            NameSource::Process => "its manifest in its process",
        })
    }
}

/// Which part of a plugin a [`LoadError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadStage {
    /// The file itself: its format, ABI, manifest, or host vtable layout.
    /// Needs another file or build.
    File,
    /// Who may change the file: it, or a directory above it, is writable
    /// by or belongs to other users. Needs other permissions (or, for
    /// development, `--allow-insecure-plugins`), not another build.
    Permissions,
    /// Its start: the config's grants and options, `init`, what `init`
    /// registers. May need only another config.
    Start,
}

impl LoadError {
    /// Which part of the plugin the error is about (`offstage plugin
    /// check` reports the two apart).
    pub fn stage(&self) -> LoadStage {
        match self {
            LoadError::UnknownCapability { in_config, .. } => {
                if *in_config {
                    LoadStage::Start
                } else {
                    LoadStage::File
                }
            }
            LoadError::InitPanic { .. }
            | LoadError::InitError { .. }
            | LoadError::Host { .. }
            | LoadError::DuplicateName { .. }
            | LoadError::Filesystem { .. }
            | LoadError::Unknown { .. } => LoadStage::Start,
            LoadError::InsecurePermissions { .. } | LoadError::ForeignOwner { .. } => {
                LoadStage::Permissions
            }
            _ => LoadStage::File,
        }
    }

    /// The plugin file the error is about (empty for [`LoadError::Unknown`]).
    pub fn path(&self) -> &std::path::Path {
        match self {
            LoadError::Io { path, .. }
            | LoadError::InsecurePermissions { path, .. }
            | LoadError::ForeignOwner { path, .. }
            | LoadError::UnknownCapability { path, .. }
            | LoadError::Build { path, .. }
            | LoadError::NotSharedLibrary { path, .. }
            | LoadError::Truncated { path, .. }
            | LoadError::Open { path, .. }
            | LoadError::NoRootModule { path, .. }
            | LoadError::IncompatibleAbiStable { path, .. }
            | LoadError::IncompatibleApiVersion { path, .. }
            | LoadError::LayoutMismatch { path, .. }
            | LoadError::Manifest { path, .. }
            | LoadError::PanicAbort { path, .. }
            | LoadError::DuplicateName { path, .. }
            | LoadError::InitPanic { path, .. }
            | LoadError::InitError { path, .. }
            | LoadError::Host { path, .. }
            | LoadError::Isolated { path, .. }
            | LoadError::NameMismatch { path, .. }
            | LoadError::NameSection { path, .. }
            | LoadError::NotEnforced { path, .. }
            | LoadError::Filesystem { path, .. }
            | LoadError::NameChanged { path, .. } => path,
            LoadError::Unknown { .. } => std::path::Path::new(""),
        }
    }

    /// The plugin's name when the error happened after its manifest was read.
    pub fn plugin_name(&self) -> Option<&str> {
        match self {
            LoadError::PanicAbort { name, .. }
            | LoadError::DuplicateName { name, .. }
            | LoadError::InitPanic { name, .. }
            | LoadError::InitError { name, .. }
            | LoadError::UnknownCapability { name, .. }
            | LoadError::Filesystem { name, .. }
            | LoadError::Unknown { name } => Some(name),
            LoadError::NameChanged { expected, .. } => Some(expected),
            LoadError::NameMismatch { first, .. } => Some(first),
            _ => None,
        }
    }
}

/// The longest error text kept (a plugin's error, a dead child's cause):
/// it goes into log lines, `plugin.failed` events and the plugin's record,
/// which a plugin must not be able to blow up.
pub(crate) const MAX_ERROR: usize = 8 * 1024;

/// Squeezes text that may span lines (an error a plugin returned, a
/// dynamic-loader message) into one line of at most [`MAX_ERROR`] bytes.
pub(crate) fn one_line(text: &str) -> String {
    let text = capped(text);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` cut to [`MAX_ERROR`] bytes (at a character boundary, marked).
pub(crate) fn capped(text: &str) -> std::borrow::Cow<'_, str> {
    crate::util::cut(text, MAX_ERROR)
}

/// Reduces abi_stable's layout report to its final `Error:`, `Expected:`
/// and `Found:` entries, as one line: `mismatched type: expected X, found Y`.
/// Falls back to the report's last non-empty line when it has no `Error:`.
pub(crate) fn trim_layout_report(report: &str) -> String {
    let lines: Vec<&str> = report.lines().collect();
    let Some(start) = lines
        .iter()
        .rposition(|l| l.trim_start().starts_with("Error:"))
    else {
        return one_line(
            lines
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or(&""),
        );
    };
    let error = lines[start]
        .trim_start()
        .trim_start_matches("Error:")
        .trim();
    let (mut expected, mut found) = (Vec::new(), Vec::new());
    let mut section = 0; // 0 = none, 1 = expected, 2 = found
    for line in &lines[start + 1..] {
        match line.trim() {
            "Expected:" => section = 1,
            "Found:" => section = 2,
            "" => {}
            other if other.starts_with("Extra:") => section = 0,
            other if section == 1 => expected.push(other),
            other if section == 2 => found.push(other),
            _ => {}
        }
    }
    let mut summary = error.to_string();
    if let Some(place) = error_place(&lines[..start]) {
        summary.push_str(&format!(" in {place}"));
    }
    if !expected.is_empty() {
        summary.push_str(&format!(": expected {}", expected.join(" ")));
    }
    if !found.is_empty() {
        summary.push_str(&format!(", found {}", found.join(" ")));
    }
    one_line(&summary)
}

/// Where the last error sits: the field path of the report's last
/// `N error(s)inside:` stack, e.g. `field session.get_blocking (return type)`.
fn error_place(lines: &[&str]) -> Option<String> {
    let stack = lines.iter().rposition(|l| l.contains("error(s)inside:"))?;
    let mut path: Vec<&str> = lines[stack..]
        .iter()
        .take_while(|l| !l.starts_with("Layout of expected type:"))
        .filter_map(|l| l.trim().strip_prefix("field_name:"))
        .filter(|name| !name.is_empty() && !name.chars().all(|c| c.is_ascii_digit()))
        .collect();
    let returns = path.last() == Some(&"__returns");
    if returns {
        path.pop();
    }
    if path.is_empty() {
        return None;
    }
    Some(format!(
        "field {}{}",
        path.join("."),
        if returns { " (return type)" } else { "" }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_to_the_final_error() {
        // The shape of abi_stable's report, shortened.
        let report = "incompatible host vtable layout:\nCompared <this>:\n    A\nTo <other>:\n    B\n\n\
                      0 error(s).\n\n1 error(s)inside:\n    <other>\n\n    field_name:0\n    type:HostVtable\n\n\
                      \x20   field_name:session\n\n    field_name:get_blocking\n    type:AFunctionPointer\n\n\
                      \x20   field_name:__returns\n    type:RResult\n\nLayout of expected type:\n    field_name:x\n\n\
                      Error:too many fields\nExpected:\n    3\nFound:\n    2\n\n\
                      Error:mismatched type\nExpected:\n    u64\nFound:\n    RResult\n";
        assert_eq!(
            trim_layout_report(report),
            "mismatched type in field session.get_blocking (return type): expected u64, found RResult"
        );
    }

    #[test]
    fn falls_back_to_the_last_line() {
        assert_eq!(
            trim_layout_report("something\n  went wrong \n\n"),
            "went wrong"
        );
    }

    #[test]
    fn one_line_joins_lines() {
        assert_eq!(one_line(" a\n b\tc \n"), "a b c");
    }
}
