//! A sandboxed job's launcher, and the `[jobs] sandbox` settings it
//! carries out.
//!
//! The host starts its own binary under a hidden subcommand in place of
//! the command: `offstage job-sandbox [--write DIR].. [--network]
//! [--metadata] -- PROGRAM ARGS..`. The launcher confines itself
//! ([`restrict_self`](super::restrict_self), while it runs one thread,
//! before anything else) and then `exec`s the command, which keeps the
//! confinement, the environment, the descriptors and the process group;
//! everything the command starts inherits it.
//!
//! Why a launcher rather than restricting the child between `fork` and
//! `exec` (`pre_exec`): building a Landlock ruleset opens directories and
//! allocates, which is not async-signal-safe in a child forked from the
//! host's many threads, and would need `unsafe`. The launcher is an
//! ordinary process of one thread that calls the same safe code the
//! isolated plugin's process does. It costs one more `exec` per sandboxed
//! command.
//!
//! If the sandbox cannot be set up the command never runs: the launcher
//! writes one line saying why to the job's output and exits
//! [`CANNOT_SANDBOX`].

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use super::{restrict_self, Sandbox};

/// The hidden subcommand of the `offstage` binary that launches a
/// sandboxed command.
pub(crate) const SUBCOMMAND: &str = "job-sandbox";

/// The launcher's exit status when the sandbox could not be set up (the
/// command never ran).
pub(crate) const CANNOT_SANDBOX: u8 = 125;

/// `[jobs] sandbox`: what a job's commands may write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// No sandbox: the command has the host's rights.
    #[default]
    None,
    /// Writes nowhere (but `/dev/null`).
    ReadOnly,
    /// Writes beneath its working directory and its own temp dir only.
    WorkspaceWrite,
}

/// How a job's commands are confined: the `[jobs]` settings (and, with a
/// model agent, that agent's own, which replace them for its calls).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobSandbox {
    /// What the command may write.
    pub mode: SandboxMode,
    /// Sockets may be opened (`network = "allow"`, the default).
    pub network: bool,
    /// A call the sandbox refused may be run again without it, once a
    /// permission question says so (`escalate = "ask"`).
    pub escalate: bool,
    /// The `offstage` binary that launches sandboxed commands; the
    /// running one when unset.
    pub launcher: Option<PathBuf>,
    /// `workspace = "DIR"`: where `workspace-write` lets commands write,
    /// whatever working directory a call names. Unset, a call's own
    /// working directory is its workspace, which suits a caller the user
    /// trusts to name it; a model agent's calls always have one
    /// ([`SandboxOverride::over`]), so a model cannot pick `/` as the
    /// place it may write.
    pub workspace: Option<PathBuf>,
}

impl JobSandbox {
    /// The [`Sandbox`] of a command run in `workdir` with its own temp dir
    /// `tmp`, or `None` for [`SandboxMode::None`].
    pub(crate) fn sandbox(&self, workdir: PathBuf, tmp: PathBuf) -> Option<Sandbox> {
        let writable = match self.mode {
            SandboxMode::None => return None,
            SandboxMode::ReadOnly => Vec::new(),
            SandboxMode::WorkspaceWrite => vec![self.workspace.clone().unwrap_or(workdir), tmp],
        };
        Some(Sandbox {
            metadata: !writable.is_empty(),
            writable,
            network: self.network,
            strict: false,
        })
    }
}

/// `[agent.NAME] sandbox`, `network`, `escalate` and `workspace`: what a
/// model agent sets over the `[jobs]` settings for its own calls. A key it
/// leaves unset keeps the `[jobs]` value, so an agent that sets none
/// confines its calls like every other caller's, except that its
/// workspace is never the call's own choice (see [`Self::over`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SandboxOverride {
    /// `sandbox`: what the agent's commands may write.
    pub(crate) mode: Option<SandboxMode>,
    /// `network`: whether they may open sockets.
    pub(crate) network: Option<bool>,
    /// `escalate`: whether a refused call may ask to run unsandboxed.
    pub(crate) escalate: Option<bool>,
    /// `workspace`: where `workspace-write` lets its commands write.
    pub(crate) workspace: Option<PathBuf>,
}

impl SandboxOverride {
    /// `base` (the `[jobs]` settings) with this override's keys replaced.
    ///
    /// The workspace is the agent's (which `offstage serve` sets at start
    /// to `[jobs]`'s, else the host's working directory), else `[jobs]`'s:
    /// a model names its calls' working directories itself, so under
    /// `workspace-write` the call's own would let it write wherever it
    /// liked. With none at all the workspace is a path that cannot be
    /// opened, and a `workspace-write` launch refuses to run the command.
    pub(crate) fn over(&self, base: &JobSandbox) -> JobSandbox {
        let workspace = self
            .workspace
            .clone()
            .or_else(|| base.workspace.clone())
            .or_else(|| Some(PathBuf::from("/nonexistent/offstage-no-workspace")));
        JobSandbox {
            mode: self.mode.unwrap_or(base.mode),
            network: self.network.unwrap_or(base.network),
            escalate: self.escalate.unwrap_or(base.escalate),
            launcher: base.launcher.clone(),
            workspace,
        }
    }
}

/// The launcher's arguments for running `command` (a program and its
/// arguments) in `sandbox`.
pub(crate) fn launcher_args(sandbox: &Sandbox, command: &[OsString]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![SUBCOMMAND.into()];
    for dir in &sandbox.writable {
        args.push("--write".into());
        args.push(dir.into());
    }
    if sandbox.network {
        args.push("--network".into());
    }
    if sandbox.metadata {
        args.push("--metadata".into());
    }
    args.push("--".into());
    args.extend(command.iter().cloned());
    args
}

/// A mode as the config writes it.
pub(crate) fn mode_word(mode: SandboxMode) -> &'static str {
    match mode {
        SandboxMode::None => "none",
        SandboxMode::ReadOnly => "read-only",
        SandboxMode::WorkspaceWrite => "workspace-write",
    }
}

/// The launcher's arguments, as parsed by the CLI.
#[derive(Debug)]
pub(crate) struct LaunchArgs {
    /// Dirs the command may write beneath.
    pub(crate) write: Vec<PathBuf>,
    /// Sockets may be opened.
    pub(crate) network: bool,
    /// Changes of mode, owner, times and extended attributes are allowed.
    pub(crate) metadata: bool,
    /// The program and its arguments.
    pub(crate) command: Vec<OsString>,
}

/// Runs the launcher: confines this process, then becomes the command.
/// Returns only when either failed.
pub(crate) fn run(args: LaunchArgs) -> ExitCode {
    let sandbox = Sandbox {
        writable: args.write,
        network: args.network,
        strict: false,
        metadata: args.metadata,
    };
    if let Err(error) = restrict_self(&sandbox) {
        eprintln!(
            "offstage: the job's sandbox cannot be set up, so the command did not run: {error}"
        );
        return ExitCode::from(CANNOT_SANDBOX);
    }
    let Some((program, rest)) = args.command.split_first() else {
        eprintln!("offstage: no command to run in the sandbox");
        return ExitCode::from(CANNOT_SANDBOX);
    };
    let error =
        std::os::unix::process::CommandExt::exec(std::process::Command::new(program).args(rest));
    eprintln!(
        "offstage: cannot run {}: {error}",
        program.to_string_lossy()
    );
    ExitCode::from(127)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_writes_where_it_says() {
        let policy = |mode| JobSandbox {
            mode,
            network: false,
            ..JobSandbox::default()
        };
        let (work, tmp) = (PathBuf::from("/w"), PathBuf::from("/t"));
        assert_eq!(
            policy(SandboxMode::None).sandbox(work.clone(), tmp.clone()),
            None
        );
        let read_only = policy(SandboxMode::ReadOnly)
            .sandbox(work.clone(), tmp.clone())
            .unwrap();
        assert!(read_only.writable.is_empty() && !read_only.metadata && !read_only.network);
        let write = policy(SandboxMode::WorkspaceWrite)
            .sandbox(work.clone(), tmp.clone())
            .unwrap();
        assert_eq!(write.writable, [work, tmp]);
        assert!(write.metadata && !write.strict);
        let shell: Vec<OsString> = ["/bin/sh", "-c", "true"].map(Into::into).into();
        let args = launcher_args(&write, &shell);
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                SUBCOMMAND,
                "--write",
                "/w",
                "--write",
                "/t",
                "--metadata",
                "--",
                "/bin/sh",
                "-c",
                "true"
            ]
        );
    }
}
