//! # audit-log
//!
//! Appends one JSON line per finished job — shell commands, subagents,
//! plugin tools — to a file, for a record of what the sessions on a host
//! actually ran. It uses nothing but an event subscription.
//!
//! It needs no config: by default it appends to `jobs.jsonl` in its own
//! data dir, `<host data dir>/plugin-data/audit-log/` (`Context::data_dir`).
//!
//! ```toml
//! [plugin.audit-log]
//! path = "/var/log/offstage/jobs.jsonl"   # optional: another file
//! tools = ["shell"]                        # optional: only these job types
//! ```
//!
//! Each line is an object with `job_id`, `session_id`, `tool`, `title`,
//! `status`, `exit_code`, `backgrounded`, `started_at`, `completed_at` and
//! `output_path`.

use std::{
    fs::OpenOptions,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use offstage_plugin_api::prelude::*;
use serde::{Deserialize, Serialize};

/// The plugin's options: the keys of its `[plugin.audit-log]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// The file to append to; created (with its folder) when missing. A
    /// relative path is relative to the host's working directory. By
    /// default `jobs.jsonl` in the plugin's data dir.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Job types (tool names) to record; every type when empty.
    #[serde(default)]
    pub tools: Vec<String>,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The job's id.
    pub job_id: String,
    /// Its session.
    pub session_id: String,
    /// The tool it ran.
    pub tool: String,
    /// Its title (for `shell`, the command).
    pub title: String,
    /// How it ended.
    pub status: JobStatus,
    /// Its exit code, where there is one.
    pub exit_code: Option<i32>,
    /// Whether it was moved to the background.
    pub backgrounded: bool,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it ended (RFC 3339).
    pub completed_at: Option<String>,
    /// Where its whole output is.
    pub output_path: Option<String>,
}

impl From<Job> for Record {
    fn from(job: Job) -> Self {
        Record {
            job_id: job.id,
            session_id: job.session_id,
            tool: job.kind,
            title: job.title,
            status: job.status,
            exit_code: job.exit_code,
            backgrounded: job.backgrounded,
            started_at: job.started_at,
            completed_at: job.completed_at,
            output_path: job.output_path,
        }
    }
}

/// Appends `record` as one line to `path`. The file is opened for each line
/// so that log rotation (moving the file away) just works.
pub fn append_record(path: &Path, record: &Record) -> Result<()> {
    let mut line = serde_json::to_string(record)?;
    line.push('\n');
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    // One `write_all` of a whole line: lines from several hosts appending
    // to one file do not interleave.
    file.write_all(line.as_bytes())?;
    Ok(())
}

/// The plugin. The host delivers a subscription's events one at a time;
/// `WRITE_LOCK` keeps lines whole even if that ever changes.
pub struct AuditLog {
    options: Options,
    path: PathBuf,
}

impl AuditLog {
    /// The options the plugin runs with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The file it appends to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The file name used in the plugin's data dir when no `path` is given.
pub const DEFAULT_FILE: &str = "jobs.jsonl";

/// Serialises appends.
static WRITE_LOCK: Mutex<()> = Mutex::new(());

impl Plugin for AuditLog {
    fn manifest() -> Manifest {
        Manifest::new("audit-log", env!("CARGO_PKG_VERSION"))
            .description("appends one JSON line per finished job to a file")
            .capabilities([capability::EVENTS])
    }

    fn init(ctx: Context) -> Result<Self> {
        let options: Options = ctx.options()?;
        let path = match &options.path {
            Some(path) if path.as_os_str().is_empty() => {
                return Err(Error::invalid_input(
                    "audit-log: option `path` must not be empty (leave it out for the default)",
                ))
            }
            Some(path) => path.clone(),
            None => ctx.data_dir()?.join(DEFAULT_FILE),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        // Fail at load, with the reason, rather than at the first job.
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| {
                Error::invalid_input(format!("audit-log: cannot open {}: {e}", path.display()))
            })?;

        let (handler_options, handler_path) = (options.clone(), path.clone());
        ctx.events().subscribe(&["job.finished"], move |event: Event| {
            let (options, path) = (handler_options.clone(), handler_path.clone());
            async move {
                let job: Job = serde_json::from_value(event.properties)?;
                if !options.tools.is_empty() && !options.tools.contains(&job.kind) {
                    return Ok(());
                }
                let _lock = WRITE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(error) = append_record(&path, &Record::from(job)) {
                    tracing::warn!(path = %path.display(), %error, "cannot append to the audit log");
                    return Err(error);
                }
                Ok(())
            }
        })?;
        tracing::info!(path = %path.display(), "audit-log ready");
        Ok(AuditLog { options, path })
    }
}

export_plugin!(AuditLog, name = "audit-log");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_all_optional() {
        let options: Options = serde_json::from_value(json!({})).unwrap();
        assert_eq!(options.path, None);
        let options: Options = serde_json::from_value(json!({"path": "a.jsonl"})).unwrap();
        assert_eq!(options.path, Some(PathBuf::from("a.jsonl")));
        assert!(options.tools.is_empty());
    }

    #[test]
    fn records_are_lines() {
        let dir = std::env::temp_dir().join(format!("audit-log-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.jsonl");
        let record = Record {
            job_id: "job_1".into(),
            session_id: "ses_1".into(),
            tool: "shell".into(),
            title: "echo hi".into(),
            status: JobStatus::Completed,
            exit_code: Some(0),
            backgrounded: false,
            started_at: "t0".into(),
            completed_at: Some("t1".into()),
            output_path: None,
        };
        append_record(&path, &record).unwrap();
        append_record(&path, &record).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Record> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines, vec![record.clone(), record]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
