//! The host's layers, checked: a module imports only from layers below its
//! own, so data and calls run one way (ARCHITECTURE.md §FLOW).
//!
//! The test reads the host's source as text — every `crate::` path, in
//! `use` items and in expressions — and fails on an import that points up
//! or sideways. Test code is left out (`tests.rs` files and `#[cfg(test)]
//! mod tests` bodies): a test may reach anywhere. It reads text, not the
//! compiler's view, so a path it cannot place (a crate-root re-export such
//! as `crate::ServiceError`) fails too: inside the crate, name the module
//! that defines an item.

use std::path::{Path, PathBuf};

/// Bottom first. A module belongs to the longest entry that prefixes its
/// path; it may import from entries before its own.
const LAYERS: &[&str] = &[
    // Foundations: no knowledge of sessions, jobs or plugins.
    "util",
    "error",
    "ids",
    "logging",
    "perf",
    // Processes: starting commands, their output, their trees.
    "process",
    // What the store persists of permissions, below the store.
    "permission::rule",
    "store",
    "event",
    "permission",
    // Tools see processes and their context, never the service.
    "tool",
    // Model providers: wire formats, clients, retries; no sessions.
    "model",
    // The service: sessions, jobs, agents, the built-in `subagent` tool.
    "session",
    // The plugin host adapts the service to the ABI.
    "plugin",
    "config",
    // The MCP server: another front end of the service, mounted by `http`.
    "mcp",
    "http",
    "demo",
    "cli",
];

/// The layer of a module path (`session::jobs::call`), if any.
fn layer_of(path: &str) -> Option<(usize, &'static str)> {
    LAYERS
        .iter()
        .enumerate()
        .filter(|(_, layer)| {
            path == **layer
                || path
                    .strip_prefix(**layer)
                    .is_some_and(|rest| rest.starts_with("::"))
        })
        .max_by_key(|(_, layer)| layer.len())
        .map(|(index, layer)| (index, *layer))
}

/// The module path of a source file: `session/jobs/mod.rs` is
/// `session::jobs`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("a file under src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("host/src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The text the check reads: no comment lines, no unit-test module.
fn code_of(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut previous_is_cfg_test = false;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if previous_is_cfg_test && trimmed.starts_with("mod ") && trimmed.ends_with('{') {
            // A unit-test module runs to the end of its file.
            break;
        }
        previous_is_cfg_test = trimmed.starts_with("#[cfg(") && trimmed.contains("test");
        if trimmed.starts_with("//") {
            continue;
        }
        lines.push((index + 1, line.to_string()));
    }
    lines
}

/// Every path that `text` names after `crate::`, with `use` groups
/// expanded: `crate::{a::b, c::{d, e}}` names `a::b`, `c::d` and `c::e`.
fn crate_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `offstage_crate::`, not ours
        }
        paths.extend(expand("", rest));
    }
    paths
}

/// The paths of one `use` tree starting at `text`, under `prefix`.
fn expand(prefix: &str, text: &str) -> Vec<String> {
    let text = text.trim_start();
    if let Some(group) = text.strip_prefix('{') {
        let mut depth = 0;
        let mut start = 0;
        let mut paths = Vec::new();
        for (index, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    paths.extend(expand(prefix, &group[start..index]));
                    return paths;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths.extend(expand(prefix, &group[start..index]));
                    start = index + 1;
                }
                _ => {}
            }
        }
        return paths;
    }
    let name: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if name.is_empty() {
        return Vec::new();
    }
    let path = if prefix.is_empty() {
        name.clone()
    } else {
        format!("{prefix}::{name}")
    };
    match text[name.len()..].strip_prefix("::") {
        Some(more) if more.starts_with(|c: char| c == '{' || c.is_alphanumeric() || c == '_') => {
            expand(&path, more)
        }
        _ => vec![path],
    }
}

#[test]
fn every_import_points_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        if matches!(module.as_str(), "lib" | "main" | "layers")
            || module.split("::").any(|part| part == "tests")
        {
            continue;
        }
        let Some((own, own_layer)) = layer_of(&module) else {
            wrong.push(format!("{module}: in no layer; add it to LAYERS"));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let code = code_of(&text);
        let joined: String = code.iter().map(|(_, line)| format!("{line}\n")).collect();
        for path in crate_paths(&joined) {
            let Some((target, target_layer)) = layer_of(&path) else {
                wrong.push(format!(
                    "{module} names crate::{path}: a crate-root re-export or an unknown \
                     module; name the module that defines it"
                ));
                continue;
            };
            if target_layer != own_layer && target >= own {
                wrong.push(format!(
                    "{module} ({own_layer}) imports crate::{path} ({target_layer}), \
                     which is not below it"
                ));
            }
        }
    }
    wrong.dedup();
    assert!(
        wrong.is_empty(),
        "imports against the layer order in host/src/layers.rs:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_check_reads_use_groups_and_finds_an_upward_import() {
    let paths = crate_paths(
        "use crate::{error::Result, process::{output::X, tree}, session::SessionService};\n\
         let x = crate::store::Store::open();",
    );
    assert_eq!(
        paths,
        [
            "error::Result",
            "process::output::X",
            "process::tree",
            "session::SessionService",
            "store::Store::open",
        ]
    );
    let (tool, _) = layer_of("tool::shell").unwrap();
    let (session, _) = layer_of("session::SessionService").unwrap();
    assert!(session > tool, "tool importing session is caught");
    assert_eq!(
        layer_of("permission::rule::Rule").unwrap().1,
        "permission::rule"
    );
    assert_eq!(layer_of("permission::Permissions").unwrap().1, "permission");
    assert_eq!(layer_of("ServiceError"), None);
}
