//! Building a watched plugin crate: running `cargo build` in it with its
//! output streamed to the host's log, finding the cdylibs it built in
//! cargo's JSON messages, installing them into the plugin dir (where the
//! watcher sees them land), and reporting each build as a `plugin.build`
//! event, a failed one also as the plugin's own failure.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::json;

use super::{PluginDir, WatchState};
use crate::plugin::PluginHost;

/// Builds each of `sources` and installs what it built into the first
/// plugin dir (the watcher then sees the files land); reports each build
/// as a `plugin.build` event, and a failed one also as the plugin's own
/// failure.
pub(super) async fn build_sources(
    host: &PluginHost,
    sources: &BTreeSet<PathBuf>,
    plugin_dirs: &[PluginDir],
    state: &mut WatchState,
) {
    let Some(install_dir) = plugin_dirs.first() else {
        return;
    };
    for source in sources {
        let (source, install) = (source.clone(), install_dir.watched.clone());
        let built = tokio::task::spawn_blocking(move || {
            let outcome = build_and_install(&source, &install);
            (source, outcome)
        })
        .await;
        let Ok((source, outcome)) = built else {
            continue;
        };
        let event = match outcome {
            Ok(installed) => {
                let known = installed
                    .iter()
                    .filter_map(|path| Some(install_dir.configured.join(path.file_name()?)))
                    .collect();
                state.installed.insert(source.clone(), known);
                json!({
                    "dir": source,
                    "status": "ok",
                    "installed": installed,
                })
            }
            Err(errors) => {
                let libraries = match state.installed.get(&source) {
                    Some(known) => known.clone(),
                    None => {
                        let dir = source.clone();
                        tokio::task::spawn_blocking(move || expected_libraries(&dir))
                            .await
                            .unwrap_or_default()
                            .into_iter()
                            .map(|name| install_dir.configured.join(name))
                            .collect()
                    }
                };
                let message = first_error(&errors);
                host.inner.service.events().publish(
                    "plugin.build",
                    &json!({
                        "dir": source,
                        "status": "failed",
                        "errors": errors,
                    }),
                );
                // After the build's own event: the plugin's failure.
                for library in libraries {
                    host.record_build_failure(&library, &message);
                }
                continue;
            }
        };
        host.inner.service.events().publish("plugin.build", &event);
    }
}

/// cargo's first error line (`error[E0425]: cannot find ...`), the one a
/// plugin's `error` shows; the whole output is in the log and the
/// `plugin.build` event.
fn first_error(output: &str) -> String {
    output
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("error"))
        .or_else(|| output.lines().map(str::trim).find(|l| !l.is_empty()))
        .map(crate::plugin::error::one_line)
        .unwrap_or_else(|| "cargo build failed".into())
}

/// The library file names the crate in `source` builds, from `cargo
/// metadata` (for a build that failed before anything was installed).
fn expected_libraries(source: &Path) -> Vec<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(source)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let Ok(output) = output else {
        return Vec::new();
    };
    let Ok(metadata) = serde_json::from_slice::<serde_json::Value>(&output.stdout) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        for target in package["targets"].as_array().into_iter().flatten() {
            let is_cdylib = target["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"));
            if let (true, Some(name)) = (is_cdylib, target["name"].as_str()) {
                names.push(format!(
                    "{}{}{}",
                    std::env::consts::DLL_PREFIX,
                    name.replace('-', "_"),
                    std::env::consts::DLL_SUFFIX
                ));
            }
        }
    }
    names
}

/// How much of cargo's output a failed build's event carries.
const ERRORS_TAIL: usize = 8 * 1024;

/// Runs `cargo build` in `source`, logging its output, and copies each
/// cdylib it produced into `install`. Returns the files installed, or why
/// there are none (for a failed build, the end of cargo's output).
fn build_and_install(source: &Path, install: &Path) -> Result<Vec<PathBuf>, String> {
    tracing::info!(dir = %source.display(), "dev: sources changed; running cargo build");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let child = Command::new(cargo)
        .current_dir(source)
        .args(["build", "--message-format=json-render-diagnostics"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => {
            tracing::error!(dir = %source.display(), %error, "dev: cannot run cargo");
            return Err(format!("cannot run cargo: {error}"));
        }
    };
    // Human-readable output (progress, rendered errors) comes on stderr.
    let stderr = child.stderr.take().expect("piped");
    let dir = source.display().to_string();
    let logger = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            tracing::info!(target: "offstage::dev::cargo", dir = %dir, "{line}");
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut libraries = Vec::new();
    let stdout = child.stdout.take().expect("piped");
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        libraries.extend(cdylibs(&line));
    }
    let output = logger.join().unwrap_or_default();
    match child.wait() {
        Ok(status) if status.success() => {}
        Ok(status) => {
            tracing::error!(dir = %source.display(), %status, "dev: cargo build failed; the loaded plugin keeps serving");
            let mut start = output.len().saturating_sub(ERRORS_TAIL);
            while !output.is_char_boundary(start) {
                start += 1;
            }
            return Err(output[start..].to_string());
        }
        Err(error) => {
            tracing::error!(dir = %source.display(), %error, "dev: cargo build did not finish");
            return Err(format!("cargo build did not finish: {error}"));
        }
    }
    if libraries.is_empty() {
        tracing::warn!(dir = %source.display(), "dev: cargo built no cdylib; is the crate a plugin (crate-type = [\"cdylib\"])?");
        return Err("cargo built no cdylib".into());
    }
    let mut installed = Vec::new();
    for library in libraries {
        match install_file(&library, install) {
            Ok(dest) => {
                tracing::info!(from = %library.display(), to = %dest.display(), "dev: installed the new build");
                installed.push(dest);
            }
            Err(error) => {
                tracing::error!(from = %library.display(), %error, "dev: cannot install the new build");
                return Err(format!("cannot install {}: {error}", library.display()));
            }
        }
    }
    Ok(installed)
}

/// The cdylib files named by one line of cargo's JSON messages.
fn cdylibs(line: &str) -> Vec<PathBuf> {
    let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
        return Vec::new();
    };
    if message["reason"] != "compiler-artifact" {
        return Vec::new();
    }
    let is_cdylib = message["target"]["kind"]
        .as_array()
        .is_some_and(|kinds| kinds.iter().any(|k| k == "cdylib"));
    if !is_cdylib {
        return Vec::new();
    }
    message["filenames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str())
        .filter(|f| f.ends_with(std::env::consts::DLL_SUFFIX))
        .map(PathBuf::from)
        .collect()
}

/// Copies `library` into `dir` under its own name: written to a hidden
/// temporary name first and renamed, so the file appears complete.
fn install_file(library: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    let name = library
        .file_name()
        .ok_or_else(|| std::io::Error::other("the build output has no file name"))?;
    let dest = dir.join(name);
    let temp = dir.join(format!(".{}.partial", name.to_string_lossy()));
    std::fs::copy(library, &temp)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::rename(&temp, &dest)?;
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_of_a_build_is_its_summary() {
        let output = "   Compiling x v0.1.0\nerror: expected item, found `this`\n --> src/lib.rs:1:1\nerror: could not compile `x`\n";
        assert_eq!(first_error(output), "error: expected item, found `this`");
        assert_eq!(first_error(""), "cargo build failed");
    }

    #[test]
    fn cdylibs_come_from_compiler_artifacts() {
        let lib = format!("/t/debug/libx{}", std::env::consts::DLL_SUFFIX);
        let line = serde_json::json!({
            "reason": "compiler-artifact",
            "target": { "kind": ["cdylib"] },
            "filenames": [lib, "/t/debug/libx.rlib"],
        })
        .to_string();
        assert_eq!(cdylibs(&line), vec![PathBuf::from(&lib)]);
        let rlib = serde_json::json!({
            "reason": "compiler-artifact",
            "target": { "kind": ["lib"] },
            "filenames": ["/t/debug/liby.rlib"],
        })
        .to_string();
        assert!(cdylibs(&rlib).is_empty());
        assert!(cdylibs("Compiling x").is_empty());
    }
}
