//! Follows docs/plugins.md literally: in a temp dir outside the workspace,
//! runs the guide's commands (`offstage plugin new`, then `cargo test` in
//! the crate as it comes), checks the `Cargo.toml` it shows is the one the
//! command made, writes the files it shows, builds the crate with cargo,
//! loads the library with the real plugin host using the guide's config,
//! checks that the guide's request gets the guide's answer, and runs the
//! guide's tests (offstage-plugin-test) with `cargo test`. The same load
//! for the template as the fixture makes it. And what the documentation
//! may point at: comments cite only files in the repository, crate
//! metadata has no placeholder URLs.
//!
//! The one costly step is the first `cargo test` in the new crate: it
//! compiles the harness and the host (without its server) into
//! `target/fixtures`; the second compiles only the crate.
//!
//! The blocks are found by the HTML comments before them in the guide
//! (`<!-- guide:run -->`, `<!-- guide:file PATH -->`, ...), so editing the
//! guide's code changes what this test builds.
//!
//! The crates are built where the fixture plugins are (a `.cargo/config.toml`
//! in the temp dir names `target/fixtures` and the workspace's profile), with
//! a copy of the workspace's Cargo.lock: their dependencies are the ones the
//! fixtures compiled already, so each build compiles only the guide's crate.
//! The template is built as a fixture (`offstage_tests::fixtures`).

use std::{collections::BTreeMap, path::Path, process::Command};

use offstage::{
    PluginHost, PluginHostConfig, PluginSettings, PluginStatus, ServiceConfig, SessionService,
};
use offstage_plugin_api::types::{NewSession, ToolRequest, ToolStatus};
use offstage_tests::{
    fixtures::{self, fixtures_target_dir, write_outside_cargo_config, OUTSIDE_PROFILE},
    library_file_name, workspace_root,
};
use serde_json::json;

/// What the guide's placeholder for the checkout becomes.
const CHECKOUT_PLACEHOLDER: &str = "/path/to/offstage";

/// A fenced block of the guide and the marker before it.
#[derive(Debug)]
struct Block {
    marker: String,
    text: String,
}

fn guide_blocks() -> Vec<Block> {
    let guide =
        std::fs::read_to_string(workspace_root().join("docs/plugins.md")).expect("docs/plugins.md");
    let mut blocks = Vec::new();
    let mut lines = guide.lines();
    while let Some(line) = lines.next() {
        let Some(marker) = line
            .trim()
            .strip_prefix("<!-- guide:")
            .and_then(|m| m.strip_suffix("-->"))
        else {
            continue;
        };
        let fence = lines.next().expect("a block after a guide marker");
        assert!(
            fence.starts_with("```"),
            "marker {marker:?} must be followed by a fenced block, not {fence:?}"
        );
        let mut text = String::new();
        for line in lines.by_ref() {
            if line.starts_with("```") {
                break;
            }
            text.push_str(line);
            text.push('\n');
        }
        blocks.push(Block {
            marker: marker.trim().to_string(),
            text,
        });
    }
    blocks
}

fn block<'a>(blocks: &'a [Block], marker: &str) -> &'a Block {
    blocks
        .iter()
        .find(|b| b.marker == marker)
        .unwrap_or_else(|| panic!("the guide has no `<!-- guide:{marker} -->` block"))
}

/// Runs a shell snippet as a user would type it, with cargo and the
/// `offstage` binary on the PATH (and the config of
/// [`write_outside_cargo_config`] above `dir`).
fn run_shell(script: &str, dir: &Path) {
    let cargo_dir = Path::new(env!("CARGO")).parent().unwrap().to_path_buf();
    let offstage_dir = fixtures::offstage_binary().parent().unwrap().to_path_buf();
    let mut paths = vec![cargo_dir, offstage_dir];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let output = Command::new("sh")
        .arg("-ec")
        .arg(script)
        .current_dir(dir)
        .env("PATH", std::env::join_paths(paths).unwrap())
        .output()
        .expect("run sh");
    assert!(
        output.status.success(),
        "`{script}` failed in {}:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn with_checkout(text: &str) -> String {
    text.replace(
        CHECKOUT_PLACEHOLDER,
        &workspace_root().display().to_string(),
    )
}

/// Reads the guide's config block with the host's own config parser, and
/// turns its `[plugin.NAME]` tables into plugin settings as `serve` does.
fn parse_config(text: &str) -> BTreeMap<String, PluginSettings> {
    let config =
        offstage::FileConfig::parse(text).unwrap_or_else(|e| panic!("the guide's config: {e}"));
    config
        .plugin
        .into_iter()
        .map(|(name, table)| {
            let settings = PluginSettings {
                enabled: table.enabled,
                grant: table.grant,
                options: table.options,
            };
            (name, settings)
        })
        .collect()
}

/// Loads `library` with the real plugin host and runs `request` in a new
/// session; returns the tool result.
fn load_and_call(
    library: &Path,
    settings: BTreeMap<String, PluginSettings>,
    request: ToolRequest,
) -> offstage_plugin_api::types::ToolResult {
    load_and_call_each(library, settings, vec![request])
        .pop()
        .expect("one result")
}

/// [`load_and_call`] for several requests, one after the other, in one
/// session of one host.
fn load_and_call_each(
    library: &Path,
    settings: BTreeMap<String, PluginSettings>,
    requests: Vec<ToolRequest>,
) -> Vec<offstage_plugin_api::types::ToolResult> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::copy(library, plugins.join(library.file_name().unwrap())).unwrap();
        let service = SessionService::new(ServiceConfig {
            data_dir: dir.path().join("data"),
            permissions: vec![],
        });
        let host = PluginHost::new(
            service.clone(),
            PluginHostConfig {
                dirs: vec![plugins],
                data_dir: dir.path().join("data"),
                allow_insecure_permissions: false,
                settings,
            },
        );
        let loaded = host.load_all();
        assert_eq!(loaded.len(), 1, "{loaded:?}");
        assert_eq!(
            loaded[0].status,
            PluginStatus::Loaded,
            "the plugin failed to load: {:?}",
            loaded[0].error
        );
        let session = service.create(NewSession::default()).await.unwrap();
        let mut results = Vec::new();
        for request in requests {
            results.push(service.call_tool(&session.id, request).await.unwrap());
        }
        host.shutdown();
        results
    })
}

#[test]
fn the_guide_works_as_written() {
    let blocks = guide_blocks();
    let work = tempfile::tempdir().unwrap();
    assert!(
        !work.path().starts_with(workspace_root()),
        "must build outside the workspace"
    );
    write_outside_cargo_config(work.path());

    // 1. offstage plugin new, and its tests as it comes (with the
    // workspace's Cargo.lock, so that no index is needed).
    run_shell(&with_checkout(&block(&blocks, "run").text), work.path());
    let krate = work.path().join("word-count");
    assert!(
        krate.join("Cargo.toml").exists(),
        "plugin new made no crate"
    );
    std::fs::copy(
        workspace_root().join("Cargo.lock"),
        krate.join("Cargo.lock"),
    )
    .unwrap();
    run_shell(&block(&blocks, "run word-count as-made").text, work.path());

    // 2. the Cargo.toml it made is the one the guide shows
    let made = std::fs::read_to_string(krate.join("Cargo.toml")).unwrap();
    assert_eq!(
        made,
        with_checkout(&block(&blocks, "made word-count/Cargo.toml").text),
        "the guide's Cargo.toml is not what `offstage plugin new` makes"
    );

    // 3. the files the guide shows
    let files: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.marker.starts_with("file word-count/"))
        .collect();
    assert!(
        files.len() >= 2,
        "the guide shows src/lib.rs and tests/plugin.rs"
    );
    for file in files {
        let path = work
            .path()
            .join(file.marker.trim_start_matches("file ").trim());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, with_checkout(&file.text)).unwrap();
    }

    // 4. cargo build
    run_shell(&block(&blocks, "run word-count").text, &krate);
    let library = fixtures_target_dir()
        .join("debug")
        .join(library_file_name("word-count"));
    assert!(library.exists(), "{} not built", library.display());

    // 6.-7. load it with the guide's config, send the guide's request
    let settings = parse_config(&block(&blocks, "config").text);
    assert!(settings.contains_key("word-count"), "{settings:?}");
    let request: ToolRequest = serde_json::from_str(&block(&blocks, "request").text).unwrap();
    let result = load_and_call(&library, settings, request);
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    assert_eq!(result.output.trim(), block(&blocks, "output").text.trim());

    // Testing your plugin: the guide's tests pass.
    run_shell(&block(&blocks, "run word-count tests").text, &krate);
}

#[test]
fn the_template_builds_and_loads() {
    // Copied out and built as an author would (see the fixture).
    let library = offstage_tests::fixtures::template_library();

    let mut settings = BTreeMap::new();
    settings.insert(
        "my-plugin".to_string(),
        PluginSettings {
            enabled: true,
            grant: None,
            options: json!({"slow_ms": 50}),
        },
    );
    let result = load_and_call(
        &library,
        settings,
        ToolRequest::new("my_tool", json!({"text": "from the template"})),
    );
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    assert_eq!(result.output, "from the template");
}

/// Builds the guide's wrapper example (`slow-shell`): the guide's
/// `word-count/Cargo.toml` renamed, and its `slow-shell/src/lib.rs`.
fn build_wrapper_example() -> std::path::PathBuf {
    let blocks = guide_blocks();
    let work = tempfile::tempdir().unwrap();
    write_outside_cargo_config(work.path());
    let krate = work.path().join("slow-shell");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    let manifest = block(&blocks, "made word-count/Cargo.toml")
        .text
        .replace("name = \"word-count\"", "name = \"slow-shell\"");
    assert!(manifest.contains("slow-shell"), "{manifest}");
    std::fs::write(krate.join("Cargo.toml"), with_checkout(&manifest)).unwrap();
    std::fs::write(
        krate.join("src/lib.rs"),
        &block(&blocks, "file slow-shell/src/lib.rs").text,
    )
    .unwrap();
    std::fs::copy(
        workspace_root().join("Cargo.lock"),
        krate.join("Cargo.lock"),
    )
    .unwrap();
    run_shell("cargo build", &krate);
    let library = fixtures_target_dir()
        .join("debug")
        .join(library_file_name("slow-shell"));
    assert!(library.exists(), "{} not built", library.display());
    library
}

/// The wrapper example's settings: a timer of 300 ms, and the grants given.
fn wrapper_settings(grant: &[&str]) -> BTreeMap<String, PluginSettings> {
    let mut settings = BTreeMap::new();
    settings.insert(
        "slow-shell".to_string(),
        PluginSettings {
            enabled: true,
            grant: Some(grant.iter().map(|g| g.to_string()).collect()),
            options: json!({ "after_ms": 300 }),
        },
    );
    settings
}

/// The guide's wrapper with a call that ends before its timer and one that
/// outlives it: the fast one gets its own result (the race hands it back
/// once; awaiting the call again would panic the plugin), the slow one is
/// moved with the grant and, without it, runs to its end in the
/// foreground instead of being killed.
#[test]
fn the_guide_wrapper_gives_each_call_its_result_before_and_after_the_timer() {
    let library = build_wrapper_example();
    let fast = || ToolRequest::new("shell", json!({ "command": "echo fast" }));
    let slow = || ToolRequest::new("shell", json!({ "command": "sleep 1; echo done" }));

    let granted = load_and_call_each(
        &library,
        wrapper_settings(&["tool.wrap", "session.background"]),
        vec![fast(), slow(), fast()],
    );
    for quick in [&granted[0], &granted[2]] {
        assert_eq!(quick.status, ToolStatus::Completed, "{quick:?}");
        assert_eq!(quick.output.trim(), "fast", "{quick:?}");
    }
    assert_eq!(granted[1].status, ToolStatus::Backgrounded, "{granted:?}");

    // Without the grant `background` fails; the wrapper logs and the
    // command runs to its end in the foreground instead of being killed.
    let kept = load_and_call_each(
        &library,
        wrapper_settings(&["tool.wrap"]),
        vec![slow(), fast()],
    );
    assert_eq!(kept[0].status, ToolStatus::Completed, "{kept:?}");
    assert_eq!(kept[0].output.trim(), "done", "{kept:?}");
    assert_eq!(kept[0].exit_code, Some(0), "{kept:?}");
    assert_eq!(kept[1].output.trim(), "fast", "{kept:?}");
}

/// Every crate the guide's Rust blocks name (`serde_json::from_value`,
/// `tracing::info!`) is a dependency of the guide's `Cargo.toml`, so an
/// author who copies a snippet into the guide's crate can build it.
#[test]
fn the_guide_cargo_toml_has_every_crate_its_code_uses() {
    let guide =
        std::fs::read_to_string(workspace_root().join("docs/plugins.md")).expect("docs/plugins.md");
    let blocks = guide_blocks();
    let manifest = &block(&blocks, "made word-count/Cargo.toml").text;
    let dependencies: Vec<String> = manifest
        .split("[dependencies]")
        .nth(1)
        .expect("a [dependencies] table")
        .lines()
        .filter(|line| !line.trim_start().starts_with('#'))
        .filter_map(|line| {
            line.split_once('=')
                .map(|(key, _)| key.trim().replace('-', "_"))
        })
        .collect();
    let mut code = String::new();
    let mut in_rust = false;
    for line in guide.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            in_rust = !in_rust && info.starts_with("rust");
            continue;
        }
        if in_rust {
            code.push_str(line);
            code.push('\n');
        }
    }
    let mut missing = std::collections::BTreeSet::new();
    for (at, _) in code.match_indices("::") {
        let before = &code[..at];
        let start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let name = &before[start..];
        // `a::b` is a path into `a`; `x.options::<T>()` is a method.
        let after_path = before[..start].ends_with("::") || before[..start].ends_with('.');
        let is_crate = name.starts_with(|c: char| c.is_ascii_lowercase())
            && !matches!(
                name,
                "std" | "core" | "crate" | "self" | "super" | "capability"
            );
        if is_crate && !after_path && !dependencies.iter().any(|d| d == name) {
            missing.insert(name.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "the guide's code uses crates its Cargo.toml lacks: {missing:?} (has {dependencies:?})"
    );
}

/// The workspace's source files (`.rs`) and manifests (`Cargo.toml`),
/// outside build output.
fn workspace_files(extension: &str) -> Vec<std::path::PathBuf> {
    let root = workspace_root();
    let mut pending = vec![root.clone()];
    let mut files = Vec::new();
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "target" {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else if name.ends_with(extension) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn comments_cite_only_files_in_the_repository() {
    let root = workspace_root();
    let mut missing = Vec::new();
    for file in workspace_files(".rs") {
        let text = std::fs::read_to_string(&file).unwrap();
        let crate_dir = file
            .ancestors()
            .find(|dir| dir.join("Cargo.toml").is_file())
            .unwrap_or(&root)
            .to_path_buf();
        for (number, line) in text.lines().enumerate() {
            if !line.trim_start().starts_with("//") {
                continue;
            }
            let words = line.split(|c: char| {
                !(c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '_' | '-'))
            });
            for word in words.filter(|w| w.ends_with(".md") && w.len() > 3) {
                let cited = Path::new(word);
                let found = [&root, &crate_dir, &file.parent().unwrap().to_path_buf()]
                    .iter()
                    .any(|base| base.join(cited).is_file());
                if !found {
                    missing.push(format!(
                        "{}:{}: {word}",
                        file.strip_prefix(&root).unwrap().display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "comments cite files that are not in the repository:\n{}",
        missing.join("\n")
    );
}

#[test]
fn crate_metadata_has_no_placeholder_urls() {
    let mut found = Vec::new();
    for manifest in workspace_files("Cargo.toml") {
        let text = std::fs::read_to_string(&manifest).unwrap();
        // `key = "value"` lines are all this needs of TOML.
        let pairs = text.lines().filter_map(|line| {
            let (key, value) = line.split_once('=')?;
            Some((key.trim(), value.trim().trim_matches('"')))
        });
        for (key, value) in pairs {
            let is_url_key = matches!(key, "repository" | "homepage" | "documentation");
            let placeholder = [
                "example.com",
                "example.org",
                "your-",
                "todo",
                "xxx",
                "changeme",
            ]
            .iter()
            .any(|p| value.to_ascii_lowercase().contains(p));
            if is_url_key && (placeholder || !value.contains("://")) {
                found.push(format!("{}: {key} = {value}", manifest.display()));
            }
        }
    }
    assert!(found.is_empty(), "placeholder URLs:\n{}", found.join("\n"));
}

/// The crates built outside the workspace (the guide's, the template, the
/// compat plugins) share the fixtures' compiled dependencies only while
/// `fixtures::OUTSIDE_PROFILE` says what the root Cargo.toml's
/// `[profile.dev]` says.
#[test]
fn outside_crates_build_with_the_workspace_profile() {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    let mut section = String::new();
    let mut profile = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = header.to_string();
        } else if section.starts_with("profile.dev") && !line.starts_with('#') {
            if let Some((key, value)) = line.split_once('=') {
                profile.push((
                    format!("{section}.{}", key.trim()),
                    value.trim().to_string(),
                ));
            }
        }
    }
    let outside: Vec<(String, String)> = OUTSIDE_PROFILE
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect();
    assert_eq!(profile, outside, "the root Cargo.toml's [profile.dev*]");
}
