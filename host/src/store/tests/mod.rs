//! Unit tests of the store against real SQLite files in temporary dirs.
//! Restart scenarios through the public API are in
//! `tests/tests/store_restart.rs`; these need raw SQLite access.
//!
//! One file per concern: opening and refusing files, the records,
//! restart recovery, migrations, a move's writes, the writer and
//! checkpoints. Each starts with `use super::*`: the imports and the
//! helpers that make records are here, once.

mod checkpoint;
mod migration;
mod moves;
mod open;
mod records;
mod recovery;
mod writer;

use std::{path::Path, sync::atomic::Ordering};

use offstage_plugin_api::types::{Job, JobStatus, Message, Role, Session, SessionStatus};
use rusqlite::Connection;
use serde_json::json;

use super::checkpoint::COMMITS_PER_CHECKPOINT;
use super::recover::LeftoverProcess;
use super::rows::{role_word, status_word, word, PendingNotice};
use super::sql::MESSAGES_PER_INSERT;
use super::testing::StoreTestExt;
use super::*;
use crate::{
    error::ServiceError,
    permission::{Action, Rule},
};

fn session(id: &str, parent: Option<&str>) -> Session {
    Session {
        id: id.into(),
        title: format!("title of {id}"),
        parent_id: parent.map(Into::into),
        agent: "script".into(),
        status: SessionStatus::Idle,
        created_at: "2026-01-01T00:00:00.000Z".into(),
        updated_at: "2026-01-01T00:00:00.000Z".into(),
    }
}

fn message(id: &str, session_id: &str, role: Role) -> Message {
    Message {
        id: id.into(),
        session_id: session_id.into(),
        role,
        text: format!("text of {id}"),
        metadata: json!({ "k": [1, 2, { "n": null }] }),
        created_at: format!("2026-01-01T00:00:01.{:0>3}Z", id.len()),
    }
}

fn job(id: &str, session_id: &str, status: JobStatus) -> Job {
    Job {
        id: id.into(),
        session_id: session_id.into(),
        kind: "shell".into(),
        title: "sleep 5".into(),
        status,
        backgrounded: true,
        started_at: format!("2026-01-01T00:00:02.000Z{id}"),
        completed_at: None,
        exit_code: None,
        output_path: Some(format!("/data/output/{session_id}/{id}.log")),
        child_session_id: None,
        output_bytes: None,
    }
}

/// Every file in `dir` with its length and a hash of its
/// bytes, to show that nothing changed.
fn snapshot(dir: &Path) -> Vec<(String, usize, u64)> {
    use std::hash::{Hash, Hasher};
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut hasher);
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                bytes.len(),
                hasher.finish(),
            )
        })
        .collect();
    files.sort();
    files
}
