//! # check-agent
//!
//! Registers an agent, `check`, that treats each line of its prompt as a
//! check — a shell command that passes when it exits 0 — runs them one by
//! one in its session, and replies with a verdict:
//!
//! ```text
//! 2 of 3 checks passed
//! [pass] test -f Cargo.toml
//! [FAIL] grep -q 'version = "1' Cargo.toml (exit code 1)
//! [pass] cargo fmt --check
//! ```
//!
//! A parent session uses it through the `subagent` tool:
//! `{"agent": "check", "prompt": "cargo fmt --check\ncargo clippy"}`; the
//! subagent's output is that verdict. A check moved to the background (by
//! auto-background, say) is reported as pending, and its result follows in
//! the next turn, when its notice wakes the session.
//!
//! ```toml
//! [plugin.check-agent]
//! timeout_ms = 60000       # per check; the host's default when absent
//! stop_on_failure = false  # skip the remaining checks after a failure
//! ```

use offstage_plugin_api::prelude::*;
use serde::Deserialize;

/// The plugin's options: the keys of its `[plugin.check-agent]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// Foreground timeout of each check, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Skip the remaining checks after the first failure.
    pub stop_on_failure: bool,
}

/// How one check came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The command exited 0.
    Pass,
    /// It failed; why.
    Fail(String),
    /// It was moved to the background; its job id.
    Pending(String),
    /// It did not run.
    Skipped,
}

/// The checks in a prompt: its non-empty lines that are not `#` comments.
pub fn checks(prompt: &str) -> Vec<&str> {
    prompt
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

/// The verdict for a finished (or backgrounded) shell call.
pub fn verdict(result: &ToolResult) -> Verdict {
    let last_line = result
        .output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let detail = |what: String| {
        if last_line.is_empty() {
            what
        } else {
            format!("{what}: {last_line}")
        }
    };
    match (result.status, result.exit_code) {
        (ToolStatus::Completed, Some(0)) => Verdict::Pass,
        (ToolStatus::Backgrounded, _) => {
            Verdict::Pending(format!("running in the background as {}", result.job_id))
        }
        (ToolStatus::Cancelled, _) => Verdict::Fail(detail("cancelled".into())),
        (_, Some(code)) => Verdict::Fail(detail(format!("exit code {code}"))),
        (_, None) => Verdict::Fail(detail("error".into())),
    }
}

/// The reply for a list of checks and their verdicts.
pub fn report(results: &[(String, Verdict)]) -> String {
    let passed = results.iter().filter(|(_, v)| *v == Verdict::Pass).count();
    let mut lines = vec![format!("{passed} of {} checks passed", results.len())];
    for (check, verdict) in results {
        lines.push(match verdict {
            Verdict::Pass => format!("[pass] {check}"),
            Verdict::Fail(why) => format!("[FAIL] {check} ({why})"),
            Verdict::Pending(why) => format!("[....] {check} ({why})"),
            Verdict::Skipped => format!("[skip] {check}"),
        });
    }
    lines.join("\n")
}

/// The plugin; the agent itself is a closure registered at `init`.
pub struct CheckAgent;

impl Plugin for CheckAgent {
    fn manifest() -> Manifest {
        Manifest::new("check-agent", env!("CARGO_PKG_VERSION"))
            .description("adds the `check` agent: runs each prompt line as a check and reports")
            .capabilities([
                capability::AGENTS,
                capability::TOOL_CALL,
                capability::SESSION_READ,
            ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let options: Options = ctx.options()?;
        let host = ctx.clone();
        ctx.agents().register("check", move |turn: AgentTurn| {
            let (ctx, options) = (host.clone(), options.clone());
            async move { run_turn(&ctx, &options, turn).await }
        })?;
        Ok(CheckAgent)
    }
}

async fn run_turn(ctx: &Context, options: &Options, turn: AgentTurn) -> Result<String> {
    let mut replies = Vec::new();
    for message in &turn.messages {
        match message.role {
            Role::User => {
                let mut results = Vec::new();
                let mut failed = false;
                for check in checks(&message.text) {
                    if failed && options.stop_on_failure {
                        results.push((check.to_string(), Verdict::Skipped));
                        continue;
                    }
                    let mut input = json!({ "command": check });
                    if let Some(timeout) = options.timeout_ms {
                        input["timeout_ms"] = timeout.into();
                    }
                    let verdict = match ctx
                        .session()
                        .call_tool(&turn.session_id, ToolRequest::new("shell", input))
                        .await
                    {
                        Ok(result) => verdict(&result),
                        Err(error) => Verdict::Fail(format!("refused: {error}")),
                    };
                    failed |= matches!(verdict, Verdict::Fail(_));
                    results.push((check.to_string(), verdict));
                }
                if results.is_empty() {
                    replies.push("no checks: send one shell command per line".to_string());
                } else {
                    replies.push(report(&results));
                }
            }
            Role::Notice => {
                // A check that was moved to the background has ended.
                let Some(job_id) = message.metadata["job_id"].as_str() else {
                    continue;
                };
                let jobs = ctx.session().jobs(Some(&turn.session_id)).await?;
                let Some(job) = jobs.into_iter().find(|j| j.id == job_id) else {
                    continue;
                };
                let passed = job.status == JobStatus::Completed && job.exit_code == Some(0);
                let exit = job
                    .exit_code
                    .map(|c| format!(", exit code {c}"))
                    .unwrap_or_default();
                replies.push(format!(
                    "[{}] {} (finished in the background{exit})",
                    if passed { "pass" } else { "FAIL" },
                    job.title
                ));
            }
            Role::Assistant | Role::Tool => {}
        }
    }
    Ok(replies.join("\n"))
}

export_plugin!(CheckAgent, name = "check-agent");

#[cfg(test)]
mod tests {
    use super::*;

    fn result(status: ToolStatus, exit_code: Option<i32>, output: &str) -> ToolResult {
        ToolResult {
            call_id: "job_1".into(),
            job_id: "job_1".into(),
            status,
            output: output.into(),
            exit_code,
            output_path: None,
        }
    }

    #[test]
    fn prompt_lines_are_checks() {
        assert_eq!(
            checks("  true\n\n# a comment\nfalse  \n"),
            vec!["true", "false"]
        );
    }

    #[test]
    fn verdicts_and_report() {
        assert_eq!(
            verdict(&result(ToolStatus::Completed, Some(0), "ok\n")),
            Verdict::Pass
        );
        assert_eq!(
            verdict(&result(
                ToolStatus::Completed,
                Some(2),
                "one\nno such file\n\n"
            )),
            Verdict::Fail("exit code 2: no such file".into())
        );
        assert!(matches!(
            verdict(&result(ToolStatus::Backgrounded, None, "")),
            Verdict::Pending(_)
        ));
        let text = report(&[
            ("true".into(), Verdict::Pass),
            ("false".into(), Verdict::Fail("exit code 1".into())),
        ]);
        assert_eq!(
            text,
            "1 of 2 checks passed\n[pass] true\n[FAIL] false (exit code 1)"
        );
    }

    #[test]
    fn options() {
        let options: Options = serde_json::from_value(json!({})).unwrap();
        assert_eq!(options, Options::default());
        assert!(serde_json::from_value::<Options>(json!({"stop": true})).is_err());
    }
}
