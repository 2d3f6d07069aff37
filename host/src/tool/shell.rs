//! The built-in `shell` tool: a real process in its own process group.
//!
//! stdout and stderr share one pipe, so the output file holds them in the
//! order the process wrote them. Dropping the running future (cancel,
//! interrupt, session removal, foreground timeout with `kill`) kills the
//! whole group, grandchildren included; so does the end of the main process,
//! after a short grace for output in flight. Processes that left the group
//! (`setsid`, double forks, daemons) are part of the job too and die with
//! it (see `process::tree`). A host killed outright runs none of this;
//! the job's processes carry a marker, and a group still running after
//! [`RECORD_GROUP_AFTER`] is recorded in the store, so that the next
//! start-up ends them (`session::jobs::process`, `process::tree`).

use std::{
    ffi::{OsStr, OsString},
    fs::File,
    os::fd::OwnedFd,
    path::PathBuf,
    sync::OnceLock,
    time::Duration,
};

use offstage_plugin_api::types::JobStatus;
use serde::Deserialize;
use serde_json::Value;

use super::{BoxFuture, ForegroundPolicy, JobContext, OnTimeout, Tool, ToolOutcome};
use crate::{
    error::{Result, ServiceError},
    process::{
        output::OutputSink,
        sandbox::{
            launch::{launcher_args, SandboxMode},
            Sandbox,
        },
        spawn::{self, GroupGuard, Launch},
        tree::{JobTree, MARKER_VAR},
    },
};

/// Foreground timeout when the input names none.
pub(crate) const DEFAULT_TIMEOUT_MS: u64 = 120_000;

/// How long output may keep arriving after the main process exits, from
/// children that still hold the pipe, before the group is killed.
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// How long a command runs before its process group is recorded in the
/// store (see `run_command`).
const RECORD_GROUP_AFTER: Duration = Duration::from_millis(100);

/// Kill rounds while something still holds the output pipe after the main
/// process exited, before the pipe is abandoned.
const KILL_ROUNDS: usize = 10;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellInput {
    command: String,
    #[serde(default)]
    workdir: Option<PathBuf>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    on_timeout: Option<String>,
    #[serde(default)]
    background_after_ms: Option<u64>,
}

/// What `shell` does, for humans and models.
const DESCRIPTION: &str = "Runs a command line with /bin/sh -c in its own process group and \
returns its output (stdout and stderr together) and exit code. A call that runs longer than \
`background_after_ms` moves to the background: the caller gets the output so far at once, and \
a notice when the command ends.";

/// The JSON Schema of `shell`'s input: [`ShellInput`], for models and
/// `GET /api/tool`. A test checks that it accepts what `parse` accepts.
pub(crate) fn input_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "The command line, run with /bin/sh -c."
            },
            "workdir": {
                "type": "string",
                "description": "The working directory; the host's when absent."
            },
            "timeout_ms": {
                "type": "integer",
                "minimum": 0,
                "description": "How long the caller waits before `on_timeout` applies (default 120000)."
            },
            "on_timeout": {
                "type": "string",
                "enum": ["kill", "background"],
                "description": "What a timeout does: kill the command (default) or move it to the background."
            },
            "background": {
                "type": "boolean",
                "description": "Start in the background: the call returns at once with the job's id."
            },
            "background_after_ms": {
                "type": "integer",
                "minimum": 0,
                "description": "Move the call to the background once it has run this long; the output so far is returned then, and a notice follows when it ends. Instead of timeout_ms and on_timeout."
            }
        },
        "required": ["command"],
        "additionalProperties": false
    })
}

fn parse(input: &Value) -> Result<ShellInput> {
    let parsed = ShellInput::deserialize(input)
        .map_err(|e| ServiceError::InvalidInput(format!("shell input: {e}")))?;
    if parsed.command.trim().is_empty() {
        return Err(ServiceError::InvalidInput(
            "shell input: empty command".into(),
        ));
    }
    Ok(parsed)
}

/// The `shell` tool.
#[derive(Debug, Default)]
pub(crate) struct Shell;

impl Tool for Shell {
    fn description(&self) -> String {
        DESCRIPTION.to_string()
    }

    fn input_schema(&self) -> Option<Value> {
        Some(input_schema())
    }

    fn policy(&self, input: &Value) -> Result<ForegroundPolicy> {
        let input = parse(input)?;
        if let Some(after) = input.background_after_ms {
            // Sugar for a timeout that moves, so it cannot be combined
            // with another timeout or another outcome.
            if input.timeout_ms.is_some() || input.on_timeout.is_some() {
                return Err(ServiceError::InvalidInput(
                    "shell input: background_after_ms replaces timeout_ms and on_timeout; give one or the other".into(),
                ));
            }
            return Ok(ForegroundPolicy {
                background: input.background,
                timeout: Some(Duration::from_millis(after)),
                on_timeout: OnTimeout::Background,
            });
        }
        let on_timeout = match input.on_timeout.as_deref() {
            None | Some("kill") => OnTimeout::Kill,
            Some("background") => OnTimeout::Background,
            Some(other) => {
                return Err(ServiceError::InvalidInput(format!(
                    "shell input: on_timeout must be \"kill\" or \"background\", not {other:?}"
                )))
            }
        };
        Ok(ForegroundPolicy {
            background: input.background,
            timeout: Some(Duration::from_millis(
                input.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
            )),
            on_timeout,
        })
    }

    fn title(&self, input: &Value) -> String {
        input["command"].as_str().unwrap_or_default().to_string()
    }

    fn run(
        self: std::sync::Arc<Self>,
        ctx: JobContext,
        input: Value,
    ) -> BoxFuture<Result<ToolOutcome>> {
        Box::pin(async move {
            let input = parse(&input)?;
            run_command(ctx, input).await
        })
    }
}

pub(crate) use crate::permission::UNSANDBOXED_TOOL;

/// What a command that the sandbox refused says, in the words of the C
/// library: Landlock refuses with `EACCES`, seccomp with `EPERM`.
const REFUSALS: &[&str] = &["Permission denied", "Operation not permitted"];

/// Runs the command, in the job's sandbox if it has one (`[jobs]
/// sandbox`); a sandboxed run that failed the way a refusal does says so
/// in its output, and with `escalate = "ask"` runs again without the
/// sandbox once a question allows it.
async fn run_command(ctx: JobContext, input: ShellInput) -> Result<ToolOutcome> {
    let policy = ctx.sandbox.clone();
    if policy.mode == SandboxMode::None {
        return run_once(&ctx, &input, None).await;
    }
    // Its own temp dir, writable in `workspace-write`, gone with the job.
    let tmp = tempfile::Builder::new()
        .prefix("offstage-job-")
        .tempdir()
        .map_err(|e| {
            cannot_start(std::io::Error::other(format!(
                "no temp dir for the job: {e}"
            )))
        })?;
    let workdir = match &input.workdir {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().map_err(cannot_start)?,
    };
    let sandbox = policy
        .sandbox(workdir.clone(), tmp.path().to_path_buf())
        .expect("a mode other than none has a sandbox");
    let launcher = match &policy.launcher {
        Some(path) => path.clone(),
        None => std::env::current_exe().map_err(cannot_start)?,
    };
    let confined = Confined {
        launcher: &launcher,
        sandbox: &sandbox,
        tmp: tmp.path(),
    };
    let before = ctx.output.len();
    let outcome = run_once(&ctx, &input, Some(confined)).await?;
    if outcome.status == JobStatus::Completed
        || ctx.output.len() == before
        || !REFUSALS.iter().any(|r| ctx.output.tail_text().contains(r))
    {
        return Ok(outcome);
    }
    let writes = if sandbox.writable.is_empty() {
        "writes nowhere".to_string()
    } else {
        format!(
            "writes only beneath {} and its own $TMPDIR",
            sandbox.writable[0].display()
        )
    };
    let network = if sandbox.network {
        ""
    } else {
        " and opens no socket"
    };
    ctx.output.write(
        format!(
            "\n[offstage] the sandbox refused this command, it seems: it runs with \
             sandbox = {:?}, which {writes}{network}; \"Permission denied\" or \
             \"Operation not permitted\" above is the sandbox's refusal.\n",
            crate::process::sandbox::launch::mode_word(policy.mode),
        )
        .as_bytes(),
    );
    if !policy.escalate {
        return Ok(outcome);
    }
    if !ctx
        .processes
        .escalate(UNSANDBOXED_TOOL, &input.command)
        .await
    {
        ctx.output
            .write(b"[offstage] running it again without the sandbox was refused.\n");
        return Ok(outcome);
    }
    ctx.output
        .write(b"[offstage] running it again without the sandbox, as allowed:\n");
    run_once(&ctx, &input, None).await
}

/// How a sandboxed run is launched.
#[derive(Clone, Copy)]
struct Confined<'a> {
    /// The `offstage` binary that confines itself, then runs the command.
    launcher: &'a std::path::Path,
    sandbox: &'a Sandbox,
    /// The job's own temp dir, its `TMPDIR`.
    tmp: &'a std::path::Path,
}

async fn run_once(
    ctx: &JobContext,
    input: &ShellInput,
    confined: Option<Confined<'_>>,
) -> Result<ToolOutcome> {
    let (reader, writer) = std::io::pipe()?;
    // Registered before the spawn, so no process of the job is ever
    // unknown; every descendant inherits the marker.
    let tree = JobTree::new(ctx.processes.marker());
    let shell: [OsString; 3] = ["/bin/sh".into(), "-c".into(), input.command.clone().into()];
    let (program, args): (&OsStr, Vec<OsString>) = match confined {
        None => (shell[0].as_os_str(), shell[1..].to_vec()),
        Some(confined) => (
            confined.launcher.as_os_str(),
            launcher_args(confined.sandbox, &shell),
        ),
    };
    let mut env: Vec<(&str, &OsStr)> = vec![(MARKER_VAR, tree.marker().as_ref())];
    if let Some(confined) = confined.filter(|c| !c.sandbox.writable.is_empty()) {
        env.push(("TMPDIR", confined.tmp.as_os_str()));
    }
    let mut child = spawn::spawn(Launch {
        program,
        args: &args,
        env: &env,
        cwd: input.workdir.as_deref(),
        // The command's copies of the write end; ours must be gone for
        // EOF to arrive, and are (the launch takes them).
        stdio: [null_stdin()?, writer.try_clone()?.into(), writer.into()],
    })
    .map_err(cannot_start)?;
    if let Some(pid) = child.id() {
        tree.set_main(pid as i32);
    }
    let mut group = GroupGuard::new(child.id());
    let output = ctx.output.clone();
    let mut pump = tokio::spawn(pump(OwnedFd::from(reader), output));

    // The group is recorded in the store, so that a restart can end it if
    // the host is killed — but only once the command has run for
    // `RECORD_GROUP_AFTER`: most commands end before, and a record written
    // for them is one more commit per call (a third of a short call's
    // commits) for a record their end deletes at once. What a kill -9 in
    // that first moment leaves is still ended at restart: every process
    // of the job carries the data dir's marker (`tree::kill_marked`); the
    // record adds only members of the group that cleared their
    // environment, and a process that does that is already out of reach
    // when it also detaches before the tree's next look (the same order
    // of time).
    let pid = child.id();
    let wait = child.wait();
    tokio::pin!(wait);
    let waited = tokio::select! {
        waited = &mut wait => waited,
        () = tokio::time::sleep(RECORD_GROUP_AFTER) => {
            if let Some(pid) = pid {
                ctx.processes.record(pid);
            }
            wait.await
        }
    };
    let status = waited?;
    tree.main_reaped();
    // Give output still in flight a moment; then whatever still holds the
    // pipe (in the group or detached from it) is killed, so the job ends
    // now with its command's status.
    if tokio::time::timeout(DRAIN_GRACE, &mut pump).await.is_err() {
        group.kill();
        let mut drained = false;
        for _ in 0..KILL_ROUNDS {
            tree.kill_round();
            if tokio::time::timeout(DRAIN_GRACE, &mut pump).await.is_ok() {
                drained = true;
                break;
            }
        }
        if !drained {
            tracing::warn!(
                job_id = ctx.job_id,
                "a process outside the job's known tree holds its output pipe; output stops here"
            );
            pump.abort();
        }
    }
    group.kill();
    // The job is its whole tree: nothing it started outlives it.
    tree.finish().await;

    use std::os::unix::process::ExitStatusExt;
    let exit_code = status.code().or_else(|| status.signal().map(|s| 128 + s));
    Ok(ToolOutcome {
        status: if status.success() {
            JobStatus::Completed
        } else {
            JobStatus::Error
        },
        exit_code,
    })
}

/// A command that never ran: its working directory or `/bin/sh` could not
/// be used.
fn cannot_start(error: std::io::Error) -> ServiceError {
    ServiceError::InvalidInput(format!("cannot start shell: {error}"))
}

/// `/dev/null` for a command's stdin: a duplicate of one descriptor
/// opened once, where `Stdio::null()` opens the file again for every
/// command.
fn null_stdin() -> std::io::Result<OwnedFd> {
    static DEV_NULL: OnceLock<File> = OnceLock::new();
    let file = match DEV_NULL.get() {
        Some(file) => file,
        None => {
            let opened = File::open("/dev/null")?;
            DEV_NULL.get_or_init(|| opened)
        }
    };
    Ok(file.try_clone()?.into())
}

/// Bytes the pump reads from a command's pipe at once.
const PUMP_CHUNK: usize = 64 * 1024;

thread_local! {
    /// The pump's read buffer, one per thread, borrowed only while a read
    /// that cannot wait is copied to the job's output: a buffer of its own
    /// per call cost a zeroed 64 KiB allocation and, on its free, a
    /// consolidation of the allocator's free lists (3% of a `true` call's
    /// CPU on the runtime's threads), for commands most of which print
    /// nothing.
    static PUMP_BUFFER: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; PUMP_CHUNK].into_boxed_slice());
}

async fn pump(reader: OwnedFd, output: std::sync::Arc<OutputSink>) {
    let receiver = match tokio::net::unix::pipe::Receiver::from_owned_fd(reader) {
        Ok(receiver) => receiver,
        Err(error) => {
            tracing::error!(%error, "cannot read command output");
            return;
        }
    };
    loop {
        if let Err(error) = receiver.readable().await {
            tracing::warn!(%error, "reading command output failed");
            return;
        }
        let done = PUMP_BUFFER.with_borrow_mut(|buffer| match receiver.try_read(buffer) {
            Ok(0) => true,
            Ok(n) => {
                output.write(&buffer[..n]);
                false
            }
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                false
            }
            Err(error) => {
                tracing::warn!(%error, "reading command output failed");
                true
            }
        });
        if done {
            return;
        }
        // A read that cannot wait takes nothing from the task's budget, as
        // an awaited one does: without this, a command that floods its
        // output would keep this thread from its other tasks.
        tokio::task::coop::consume_budget().await;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A value of the schema's type for `property`, as an input would
    /// carry it.
    fn sample(property: &Value) -> Value {
        match property["type"].as_str() {
            Some("string") => match property["enum"].as_array() {
                Some(values) => values[0].clone(),
                None => json!("/"),
            },
            Some("integer") => json!(10),
            Some("boolean") => json!(true),
            other => panic!("no sample for {other:?}"),
        }
    }

    #[test]
    fn the_schema_names_exactly_what_the_input_accepts() {
        let schema = input_schema();
        let properties = schema["properties"].as_object().unwrap();
        assert_eq!(schema["required"], json!(["command"]));
        for (name, property) in properties {
            let mut input = json!({ "command": "true" });
            input[name] = sample(property);
            parse(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        // A field the schema leaves out is refused by the tool too, as
        // `additionalProperties: false` says.
        assert_eq!(schema["additionalProperties"], json!(false));
        assert!(parse(&json!({ "command": "true", "cwd": "/" })).is_err());
        // Every field the input type has is in the schema: one that is not
        // would be refused by a model's strict client before it got here.
        let every: Vec<&str> = [
            "command",
            "workdir",
            "timeout_ms",
            "background",
            "on_timeout",
            "background_after_ms",
        ]
        .into();
        let mut named: Vec<&str> = properties.keys().map(String::as_str).collect();
        named.sort_unstable();
        let mut every = every;
        every.sort_unstable();
        assert_eq!(named, every);
    }

    #[test]
    fn background_after_ms_is_a_timeout_that_moves_and_stands_alone() {
        let policy = Shell
            .policy(&json!({ "command": "sleep 1", "background_after_ms": 250 }))
            .unwrap();
        assert_eq!(policy.timeout, Some(Duration::from_millis(250)));
        assert_eq!(policy.on_timeout, OnTimeout::Background);
        assert!(!policy.background);
        for clash in [
            json!({ "command": "true", "background_after_ms": 1, "timeout_ms": 5 }),
            json!({ "command": "true", "background_after_ms": 1, "on_timeout": "kill" }),
        ] {
            let error = Shell.policy(&clash).unwrap_err().to_string();
            assert!(error.contains("background_after_ms"), "{error}");
        }
    }
}
