//! The audit-log example plugin, loaded by the real host: one JSON line per
//! finished job, filtered by tool when asked, and with no options at all
//! into its own data dir (`Context::data_dir`). In process here, and in a
//! child process in `isolation::example_plugins` (`audit_log_suite!`).

use offstage::Isolation;
use offstage_plugin_api::types::ToolRequest;
use offstage_tests::example_plugins::*;
use serde_json::{json, Value};

const PACKAGE: &str = "offstage-audit-log";

fn read_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("bad line {line:?}: {e}")))
        .collect()
}

async fn wait_lines(path: &std::path::Path, count: usize) -> Vec<Value> {
    poll(
        &format!("{count} audit lines in {}", path.display()),
        || async {
            let lines = read_lines(path);
            (lines.len() >= count).then_some(lines)
        },
    )
    .await
}

pub(crate) async fn one_line_per_finished_job(mode: Isolation) {
    let dir = tempfile::tempdir().unwrap();
    // A folder that does not exist yet: the plugin creates it.
    let log = dir.path().join("logs").join("jobs.jsonl");
    let host = Host::start_as(
        mode,
        &[Load {
            package: PACKAGE,
            name: "audit-log",
            options: json!({ "path": log }),
        }],
    );
    let session = host.session().await;

    let ok = host
        .service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({"command": "echo hi"})),
        )
        .await
        .unwrap();
    let failed = host
        .service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({"command": "exit 4"})),
        )
        .await
        .unwrap();

    let lines = wait_lines(&log, 2).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    let by_id = |id: &str| lines.iter().find(|l| l["job_id"] == id).cloned().expect(id);
    let first = by_id(&ok.job_id);
    assert_eq!(first["session_id"], session.as_str());
    assert_eq!(first["tool"], "shell");
    assert_eq!(first["title"], "echo hi");
    assert_eq!(first["status"], "completed");
    assert_eq!(first["exit_code"], 0);
    assert_eq!(first["backgrounded"], false);
    assert!(first["completed_at"].is_string());
    let second = by_id(&failed.job_id);
    assert_eq!(second["status"], "error");
    assert_eq!(second["exit_code"], 4);

    // Lines are appended, never rewritten.
    host.service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({"command": "true"})),
        )
        .await
        .unwrap();
    let lines = wait_lines(&log, 3).await;
    assert_eq!(lines[..2], [first, second]);
}

pub(crate) async fn tools_option_filters_by_job_type(mode: Isolation) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("shell-only.jsonl");
    let host = Host::start_as(
        mode,
        &[Load {
            package: PACKAGE,
            name: "audit-log",
            options: json!({ "path": log, "tools": ["shell"] }),
        }],
    );
    let session = host.session().await;

    // A subagent job whose child session runs one shell job.
    let sub = host
        .service
        .call_tool(
            &session,
            ToolRequest::new(
                "subagent",
                json!({"agent": "script", "prompt": "echo from-child"}),
            ),
        )
        .await
        .unwrap();
    let child = host
        .service
        .job(&sub.job_id)
        .await
        .unwrap()
        .child_session_id
        .unwrap();
    let child_jobs = host.service.jobs(Some(&child)).await.unwrap();
    assert_eq!(child_jobs.len(), 1);

    // A later shell job marks the point by which the subagent's line would
    // have been written: a subscription's events arrive in order.
    let marker = host
        .service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({"command": "true"})),
        )
        .await
        .unwrap();
    let lines = wait_lines(&log, 2).await;
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["job_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![child_jobs[0].id.as_str(), marker.job_id.as_str()]);
    assert!(lines.iter().all(|l| l["tool"] == "shell"));
}

pub(crate) async fn with_no_options_it_writes_into_its_data_dir(mode: Isolation) {
    // Every example plugin, none configured: all load.
    let mut host = Host::start_as(
        mode,
        &[
            Load {
                package: PACKAGE,
                name: "audit-log",
                options: json!({}),
            },
            Load {
                package: "offstage-auto-background",
                name: "auto-background",
                options: json!({}),
            },
            Load {
                package: "offstage-check-agent",
                name: "check-agent",
                options: json!({}),
            },
        ],
    );
    let log = host
        .path("data")
        .join("plugin-data")
        .join("audit-log")
        .join("jobs.jsonl");
    let session = host.session().await;
    let result = host
        .service
        .call_tool(
            &session,
            ToolRequest::new("shell", json!({ "command": "echo default" })),
        )
        .await
        .unwrap();
    let _ = host
        .wait_event("the job to finish", |e| e.kind == "job.finished")
        .await;
    let lines = wait_lines(&log, 1).await;
    assert_eq!(lines[0]["job_id"], result.job_id.as_str());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(log.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "the data dir is the plugin's alone");
    }
}

/// The suite, for the plugin run as `$mode` says: in process here, in a
/// child process in `isolation::example_plugins`.
macro_rules! audit_log_suite {
    ($mode:expr) => {
        tests_in_mode!(
            $mode,
            example_plugins::audit_log {
                one_line_per_finished_job,
                tools_option_filters_by_job_type,
                with_no_options_it_writes_into_its_data_dir,
            }
        );
    };
}
pub(crate) use audit_log_suite;

/// The suite in process (isolated: `isolation::example_plugins`).
mod in_process {
    audit_log_suite!(offstage::Isolation::None);
}
