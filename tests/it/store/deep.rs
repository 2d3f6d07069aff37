//! A session chain thousands deep is deleted whole: through the store's
//! public API on a real SQLite file (and it stays deleted after a reopen),
//! and through `DELETE /api/session/:id` of a real host.

use offstage::testing::{Store, StoreTestExt};
use offstage_plugin_api::types::{Job, JobStatus, Message, Role, Session, SessionStatus};
use offstage_tests::server::Server;
use serde_json::json;

/// Deeper than SQLite's trigger depth limit (1000), which a cascade down
/// the chain would nest one frame per generation into.
const DEPTH: usize = 1_500;

fn session(id: &str, parent: Option<&str>) -> Session {
    Session {
        id: id.into(),
        title: format!("Session {id}"),
        parent_id: parent.map(Into::into),
        agent: "script".into(),
        status: SessionStatus::Idle,
        created_at: "2026-03-01T10:00:00.000Z".into(),
        updated_at: "2026-03-01T10:00:00.000Z".into(),
    }
}

#[test]
fn a_chain_deeper_than_the_trigger_limit_is_deleted_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.put_session(&session("ses_other", None)).unwrap();
    let ids: Vec<String> = (0..DEPTH).map(|i| format!("ses_{i:05}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| ids[p].as_str());
        store.put_session(&session(id, parent)).unwrap();
        if i % 100 == 0 {
            store
                .append_message(&Message {
                    id: format!("msg_{i:05}"),
                    session_id: id.clone(),
                    role: Role::User,
                    text: "hi".into(),
                    metadata: json!({}),
                    created_at: "2026-03-01T10:00:00.000Z".into(),
                })
                .unwrap();
            store
                .put_job(&Job {
                    id: format!("job_{i:05}"),
                    session_id: id.clone(),
                    kind: "shell".into(),
                    title: "true".into(),
                    status: JobStatus::Completed,
                    backgrounded: false,
                    started_at: "2026-03-01T10:00:00.000Z".into(),
                    completed_at: Some("2026-03-01T10:00:01.000Z".into()),
                    exit_code: Some(0),
                    output_path: None,
                    child_session_id: None,
                    output_bytes: None,
                })
                .unwrap();
        }
    }

    assert!(store.delete_session(&ids[0]).unwrap());
    let left: Vec<String> = store
        .sessions()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(left, ["ses_other"]);
    assert!(store.jobs().unwrap().is_empty());
    assert!(store.messages(&ids[DEPTH - 1]).unwrap().is_empty());
    assert!(!store.delete_session(&ids[0]).unwrap(), "gone already");

    drop(store);
    let store = Store::open(dir.path()).unwrap();
    let left: Vec<String> = store
        .sessions()
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(left, ["ses_other"]);
}

#[test]
fn over_http_a_chain_over_a_thousand_deep_is_deleted() {
    let server = Server::start(&[]);
    let mut parent: Option<String> = None;
    let mut root = None;
    for _ in 0..1_100 {
        let created = server.expect(
            "POST",
            "/api/session",
            Some(&json!({ "parent_id": parent })),
            201,
        );
        let id = created["id"].as_str().unwrap().to_string();
        root.get_or_insert_with(|| id.clone());
        parent = Some(id);
    }
    let kept = server.expect("POST", "/api/session", Some(&json!({})), 201);

    server.expect(
        "DELETE",
        &format!("/api/session/{}", root.unwrap()),
        None,
        204,
    );
    let left = server.expect("GET", "/api/session", None, 200);
    assert_eq!(left, json!([kept]));
    server
        .request("GET", &format!("/api/session/{}", parent.unwrap()), None)
        .assert_error(404, "not_found");
}
