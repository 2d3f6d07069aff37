//! `offstage demo`: the background scenario, end to end, in a throw-away
//! data dir, with the example plugins from `plugins/`.
//!
//! A session's agent runs a shell command that takes longer than the
//! auto-background plugin's timer. The transcript shows the caller getting
//! the output so far when the timer fires, the command going on in the
//! background, the notice with the rest of its output, and the session
//! waking up to answer that notice. Then two more example plugins show
//! their part: the `check` agent (check-agent) answers a `subagent` call,
//! and audit-log has written one line per finished job.
//!
//! Everything here uses the same public pieces a real host does:
//! [`SessionService`], [`PluginHost`] and the event bus.

use std::{
    collections::BTreeMap,
    fmt,
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use offstage_plugin_api::types::{Event, Message, NewSession, Role, ToolRequest, ToolStatus};
use serde_json::{json, Value};

use crate::{
    plugin::{PluginHost, PluginHostConfig, PluginInfo, PluginSettings, PluginStatus},
    session::{ServiceConfig, SessionService},
};

/// The example plugins the demo loads: (cargo package, manifest name).
pub const EXAMPLE_PLUGINS: &[(&str, &str)] = &[
    ("offstage-auto-background", "auto-background"),
    ("offstage-audit-log", "audit-log"),
    ("offstage-check-agent", "check-agent"),
];

/// The command the demo's session runs: it prints, works for a while, and
/// prints again.
pub(crate) const DEMO_COMMAND: &str =
    "echo 'step 1: fetching sources'; sleep 3; echo 'step 2: build finished'";

/// How the demo runs. `offstage demo` uses [`DemoOptions::default`]; tests pass
/// the plugin files they built and turn colour off.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The example plugins' libraries (all of [`EXAMPLE_PLUGINS`]; others
    /// may be added). `None`: those in this workspace's target dir, built
    /// first if missing.
    pub plugin_files: Option<Vec<PathBuf>>,
    /// ANSI colour in the transcript.
    pub colour: bool,
    /// auto-background's `after_ms`.
    pub after: Duration,
    /// The whole scenario fails if it takes longer than this.
    pub deadline: Duration,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            plugin_files: None,
            colour: std::io::stdout().is_terminal(),
            after: Duration::from_millis(1500),
            deadline: Duration::from_secs(60),
        }
    }
}

/// Why the demo failed, in words for the person who ran it.
#[derive(Debug)]
pub struct DemoError(String);

impl fmt::Display for DemoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DemoError {}

fn fail(message: impl Into<String>) -> DemoError {
    DemoError(message.into())
}

impl From<std::io::Error> for DemoError {
    fn from(error: std::io::Error) -> Self {
        fail(format!("I/O error: {error}"))
    }
}

impl From<crate::error::ServiceError> for DemoError {
    fn from(error: crate::error::ServiceError) -> Self {
        fail(format!("the session service failed: {error}"))
    }
}

/// Entry point of `offstage demo`: runs the scenario, printing the
/// transcript to stdout. Exit code 0 when every step happened, 1 (with the
/// reason on stderr) otherwise.
pub(crate) fn run() -> ExitCode {
    let mut stdout = std::io::stdout();
    match run_with(&DemoOptions::default(), &mut stdout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let _ = stdout.flush();
            eprintln!("\noffstage demo failed: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the scenario with `options`, writing the transcript to `out`.
pub fn run_with(options: &DemoOptions, out: &mut dyn Write) -> Result<(), DemoError> {
    let style = Style {
        colour: options.colour,
    };
    let plugin_files = match &options.plugin_files {
        Some(files) => files.clone(),
        None => example_plugin_files(out, &style)?,
    };

    let data = tempfile::Builder::new()
        .prefix("offstage-demo-")
        .tempdir()?;
    // The plugin dir the host scans; the host keeps its private copies of
    // loaded libraries under the data dir.
    let plugin_dir = data.path().join("plugin-files");
    std::fs::create_dir_all(&plugin_dir)?;
    for file in &plugin_files {
        let name = file
            .file_name()
            .ok_or_else(|| fail(format!("{} is not a file", file.display())))?;
        std::fs::copy(file, plugin_dir.join(name))
            .map_err(|e| fail(format!("cannot copy plugin {}: {e}", file.display())))?;
    }
    let audit_path = data.path().join("audit.jsonl");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        match tokio::time::timeout(
            options.deadline,
            scenario(options, &style, out, data.path(), &plugin_dir, &audit_path),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(fail(format!(
                "the scenario did not finish within {:?}; the host may be stuck",
                options.deadline
            ))),
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

/// The example plugins' libraries in this workspace's target dir, built
/// with cargo first if any is missing.
fn example_plugin_files(out: &mut dyn Write, style: &Style) -> Result<Vec<PathBuf>, DemoError> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| fail("cannot find the workspace"))?
        .to_path_buf();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_relative() {
                workspace.join(dir)
            } else {
                dir
            }
        })
        .unwrap_or_else(|| workspace.join("target"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let files: Vec<PathBuf> = EXAMPLE_PLUGINS
        .iter()
        .map(|(package, _)| target.join(profile).join(library_file_name(package)))
        .collect();
    if files.iter().all(|f| f.exists()) {
        return Ok(files);
    }
    if !workspace.join("Cargo.toml").exists() {
        return Err(fail(format!(
            "the example plugins are not built and the workspace to build them ({}) is gone; \
             run the demo from a checkout: cargo run -p offstage -- demo",
            workspace.display()
        )));
    }
    writeln!(
        out,
        "{}",
        style.dim("Building the example plugins first (once): cargo build -p offstage-auto-background ...")
    )?;
    out.flush()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(&cargo);
    // The host is named too: with it among the packages, cargo resolves the
    // plugins' dependencies with the features the host's build gave them
    // and reuses those compiled units, instead of compiling every
    // dependency again for the plugins alone.
    command
        .current_dir(&workspace)
        .args(["build", "-p", "offstage"]);
    for (package, _) in EXAMPLE_PLUGINS {
        command.args(["-p", package]);
    }
    if profile == "release" {
        command.arg("--release");
    }
    command.arg("--target-dir").arg(&target);
    let status = command.status().map_err(|e| {
        fail(format!(
            "cannot run cargo ({}): {e}",
            Path::new(&cargo).display()
        ))
    })?;
    if !status.success() {
        return Err(fail(format!(
            "building the example plugins failed ({status}); see cargo's output above"
        )));
    }
    match files.iter().find(|f| !f.exists()) {
        Some(missing) => Err(fail(format!(
            "{} is missing after the build",
            missing.display()
        ))),
        None => Ok(files),
    }
}

/// File name of the cdylib cargo builds for `package` on this platform.
fn library_file_name(package: &str) -> String {
    format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        package.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    )
}

async fn scenario(
    options: &DemoOptions,
    style: &Style,
    out: &mut dyn Write,
    data_dir: &Path,
    plugin_dir: &Path,
    audit_path: &Path,
) -> Result<(), DemoError> {
    let after_ms = u64::try_from(options.after.as_millis()).unwrap_or(u64::MAX);
    writeln!(
        out,
        "{}",
        style.bold("Offstage demo: moving a slow shell call to the background")
    )?;
    writeln!(
        out,
        "A session's agent runs a command that takes about 3 s. The auto-background plugin\n\
         moves it to the background after {after_ms} ms: the agent gets the output so far and\n\
         its turn ends; when the command finishes, a notice with the rest of the output\n\
         wakes the session.\n"
    )?;

    let service = SessionService::new(ServiceConfig {
        data_dir: data_dir.join("data"),
        permissions: vec![],
    });
    let mut settings = BTreeMap::new();
    let setting = |options: Value| PluginSettings {
        enabled: true,
        grant: None,
        options,
    };
    settings.insert(
        "auto-background".to_string(),
        setting(json!({ "after_ms": after_ms })),
    );
    settings.insert(
        "audit-log".to_string(),
        setting(json!({ "path": audit_path.display().to_string() })),
    );
    settings.insert("check-agent".to_string(), setting(json!({})));
    let host = PluginHost::new(
        service.clone(),
        PluginHostConfig {
            dirs: vec![plugin_dir.to_path_buf()],
            data_dir: data_dir.join("data"),
            allow_insecure_permissions: false,
            settings,
        },
    );
    let loaded = host.load_all();
    let result = match show_plugins(&loaded, style, out) {
        Ok(()) => play(&service, style, out, audit_path).await,
        Err(error) => Err(error),
    };
    host.shutdown();
    service.shutdown().await;
    result
}

/// Lists the loaded plugins; fails unless every example plugin loaded.
fn show_plugins(
    loaded: &[PluginInfo],
    style: &Style,
    out: &mut dyn Write,
) -> Result<(), DemoError> {
    let mut failed = Vec::new();
    for plugin in loaded {
        if plugin.status == PluginStatus::Loaded {
            writeln!(
                out,
                "{} {} {} {}",
                style.label("plugin"),
                plugin.name,
                style.dim(&plugin.version),
                style.dim(&format!("— {}", plugin.description))
            )?;
        } else {
            let why = plugin.error.as_deref().unwrap_or("not loaded");
            failed.push(format!("{}: {why}", plugin.name));
        }
    }
    if !failed.is_empty() {
        return Err(fail(format!(
            "plugins failed to load:\n  {}",
            failed.join("\n  ")
        )));
    }
    for (_, name) in EXAMPLE_PLUGINS {
        if !loaded
            .iter()
            .any(|p| p.name == *name && p.status == PluginStatus::Loaded)
        {
            return Err(fail(format!(
                "the example plugin {name} was not loaded; the scenario needs it"
            )));
        }
    }
    Ok(())
}

/// The scenario proper, once the plugins are loaded.
async fn play(
    service: &SessionService,
    style: &Style,
    out: &mut dyn Write,
    audit_path: &Path,
) -> Result<(), DemoError> {
    let mut events = service.events().subscribe();
    let session = service
        .create(NewSession {
            title: Some("demo".into()),
            agent: Some("script".into()),
            parent_id: None,
        })
        .await?;
    writeln!(
        out,
        "{} {} with the built-in `script` agent (it runs each line of a prompt as a shell command)\n",
        style.label("session"),
        session.id
    )?;
    out.flush()?;

    let started = Instant::now();
    let prompt = {
        let service = service.clone();
        let id = session.id.clone();
        tokio::spawn(async move { service.prompt(&id, DEMO_COMMAND, None).await })
    };

    // Print what happens in the session until the agent has answered the
    // notice of the backgrounded job.
    let mut seen = Seen::default();
    // The agent's answer to the notice can be published a moment before the
    // `session.wake` event that started its turn; it is held back and
    // printed after the wake-up, in the order things happened.
    let mut held_reply: Option<(Duration, String)> = None;
    while !(seen.woken && seen.notice_reply) {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
            Err(error) => return Err(fail(format!("the event stream ended: {error}"))),
        };
        if event_session(&event) != Some(session.id.as_str()) {
            continue;
        }
        let at = started.elapsed();
        let woken_before = seen.woken;
        let replied_before = seen.notice_reply;
        if let Some(text) = describe(&event, &mut seen, style) {
            if seen.notice_reply && !replied_before && !seen.woken {
                held_reply = Some((at, text));
            } else {
                print_line(out, style, at, &text)?;
            }
        }
        if seen.woken && !woken_before {
            if let Some((at, text)) = held_reply.take() {
                print_line(out, style, at.max(started.elapsed()), &text)?;
            }
        }
        if event.kind == "job.finished" && !seen.moved {
            return Err(fail(
                "the command finished in the foreground, without being moved to the background: \
                 is auto-background loaded, with after_ms below 3 s?",
            ));
        }
    }

    let first_turn = prompt
        .await
        .map_err(|e| fail(format!("the prompt task failed: {e}")))??;
    let backgrounded = first_turn
        .iter()
        .any(|m| m.role == Role::Tool && m.metadata["status"] == json!(ToolStatus::Backgrounded));
    if !backgrounded {
        return Err(fail(
            "the command was not moved to the background: is auto-background loaded and its after_ms below 3 s?",
        ));
    }
    if !seen.notice {
        return Err(fail("no notice arrived for the background job"));
    }
    service.wait_idle(&session.id).await?;

    // Part two: an agent from a plugin, used through `subagent`.
    writeln!(
        out,
        "\n{}",
        style.bold("An agent from a plugin: check-agent's `check`, called through `subagent`")
    )?;
    let checks = "test -d /\ntest -f /no/such/file";
    writeln!(
        out,
        "{} subagent check, prompt: {}",
        style.label("call"),
        checks.replace('\n', " | ")
    )?;
    let result = service
        .call_tool(
            &session.id,
            ToolRequest::new(
                "subagent",
                json!({ "agent": "check", "prompt": checks, "description": "run two checks" }),
            ),
        )
        .await?;
    writeln!(
        out,
        "{} {}",
        style.label("result"),
        indent_after_first(result.output.trim_end(), 8)
    )?;
    if !result.output.contains("1 of 2 checks passed") {
        return Err(fail(format!(
            "the check agent answered something unexpected: {}",
            result.output
        )));
    }

    // Part three: the audit log, written by a plugin that only listens.
    // Its lines follow the jobs' ends by a moment: wait for the subagent's,
    // the last job to end (the scenario's deadline bounds the wait).
    let audit = loop {
        let audit = std::fs::read_to_string(audit_path).unwrap_or_default();
        if audit.contains(&result.job_id) {
            break audit;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    writeln!(
        out,
        "\n{}",
        style.bold(&format!(
            "audit-log appended {} lines (one per finished job):",
            audit.lines().count()
        ))
    )?;
    for line in audit.lines() {
        let record: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        writeln!(
            out,
            "  {} {} {} {}",
            record["job_id"].as_str().unwrap_or("?"),
            record["tool"].as_str().unwrap_or("?"),
            record["status"].as_str().unwrap_or("?"),
            style.dim(record["title"].as_str().unwrap_or(""))
        )?;
    }
    if !audit.contains(&seen.job_id.clone().unwrap_or_default()) {
        return Err(fail("audit-log did not record the background job"));
    }
    writeln!(out, "\n{}", style.bold("Done: every step happened."))?;
    Ok(())
}

/// One transcript line: time since the prompt, then the text, whose
/// continuation lines line up under the text after the label.
fn print_line(
    out: &mut dyn Write,
    style: &Style,
    at: Duration,
    text: &str,
) -> Result<(), DemoError> {
    let stamp = style.dim(&format!("{:>5.2}s", at.as_secs_f64()));
    writeln!(out, "{stamp}  {}", indent_after_first(text, 18))?;
    out.flush()?;
    Ok(())
}

/// What the transcript has shown so far.
#[derive(Default)]
struct Seen {
    job_id: Option<String>,
    moved: bool,
    notice: bool,
    woken: bool,
    /// The agent has replied since the notice arrived.
    notice_reply: bool,
}

fn event_session(event: &Event) -> Option<&str> {
    let p = &event.properties;
    p["session_id"].as_str()
}

/// One transcript line for `event`, or nothing for events the demo skips.
fn describe(event: &Event, seen: &mut Seen, style: &Style) -> Option<String> {
    let p = &event.properties;
    let job = p["id"].as_str().unwrap_or("?");
    match event.kind.as_str() {
        "message.added" => {
            let message: Message = serde_json::from_value(p.clone()).ok()?;
            describe_message(&message, seen, style)
        }
        "job.started" => {
            seen.job_id.get_or_insert_with(|| job.to_string());
            Some(format!(
                "{} {job} started: {} `{}`",
                style.paint("33", "job      "),
                p["type"].as_str().unwrap_or("?"),
                p["title"].as_str().unwrap_or("")
            ))
        }
        "job.backgrounded" => {
            seen.moved = true;
            Some(format!(
                "{} {job} moved to the background (by auto-background); it keeps running",
                style.paint("33;1", "moved    ")
            ))
        }
        "job.finished" => {
            let exit = p["exit_code"]
                .as_i64()
                .map(|c| format!(", exit code {c}"))
                .unwrap_or_default();
            Some(format!(
                "{} {job} finished: {}{exit}",
                style.paint("33", "job      "),
                p["status"].as_str().unwrap_or("?")
            ))
        }
        "session.wake" => {
            seen.woken = true;
            Some(format!(
                "{} the session wakes up: its agent runs a turn to read the notice",
                style.paint("35;1", "wake     ")
            ))
        }
        _ => None,
    }
}

fn describe_message(message: &Message, seen: &mut Seen, style: &Style) -> Option<String> {
    let text = message.text.trim_end();
    Some(match message.role {
        Role::User => format!("{} {text}", style.paint("36;1", "user     ")),
        Role::Tool if message.metadata.get("backgrounded").is_some() => {
            // The `background` call's own record; the job.backgrounded
            // event already said it.
            return None;
        }
        Role::Tool => {
            let status = message.metadata["status"].as_str().unwrap_or("done");
            let what = if status == "backgrounded" {
                "the agent's call returns now, with the output so far:"
            } else {
                "the call returns:"
            };
            format!("{} {what}\n{}", style.paint("34", "tool     "), quote(text))
        }
        Role::Assistant => {
            if seen.notice {
                seen.notice_reply = true;
            }
            format!("{} {text}", style.paint("32;1", "assistant"))
        }
        Role::Notice => {
            seen.notice = true;
            format!("{} {}", style.paint("35;1", "notice   "), text)
        }
    })
}

/// Command output, marked as such.
fn quote(text: &str) -> String {
    let text = if text.is_empty() {
        "(no output yet)"
    } else {
        text
    };
    text.lines()
        .map(|l| format!("| {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Indents every line but the first by `width` spaces.
fn indent_after_first(text: &str, width: usize) -> String {
    let pad = format!("\n{}", " ".repeat(width));
    text.lines().collect::<Vec<_>>().join(&pad)
}

/// ANSI styling, or none.
struct Style {
    colour: bool,
}

impl Style {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }

    fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }

    fn label(&self, text: &str) -> String {
        self.paint("1", &format!("{text:<7}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn style_is_plain_without_colour() {
        let plain = Style { colour: false };
        assert_eq!(plain.paint("32", "x"), "x");
        let coloured = Style { colour: true };
        assert_eq!(coloured.paint("32", "x"), "\x1b[32mx\x1b[0m");
    }

    #[test]
    fn library_names() {
        let name = library_file_name("offstage-audit-log");
        assert!(name.contains("offstage_audit_log"));
    }
}
