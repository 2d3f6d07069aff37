//! A store damaged past its first page opens (its header is sound) and
//! fails while restart recovery reads it: the message that stops the start
//! names the database file, as one for a file that does not open does.

use offstage::{
    testing::Store, testing::StoreTestExt, testing::DB_FILE, ServiceConfig, SessionService,
};
use offstage_plugin_api::types::{Message, Role, Session, SessionStatus};
use serde_json::json;

/// A store with enough rows to span many pages, then every page but the
/// first (the header and the schema) overwritten with garbage.
fn damaged_data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        for i in 0..200 {
            let id = format!("ses_{i:04}");
            store
                .put_session(&Session {
                    id: id.clone(),
                    title: "t".repeat(200),
                    parent_id: None,
                    agent: "script".into(),
                    status: SessionStatus::Idle,
                    created_at: "2026-03-01T10:00:00.000Z".into(),
                    updated_at: "2026-03-01T10:00:00.000Z".into(),
                })
                .unwrap();
            store
                .append_message(&Message {
                    id: format!("msg_{i:04}"),
                    session_id: id,
                    role: Role::User,
                    text: "x".repeat(500),
                    metadata: json!({}),
                    created_at: "2026-03-01T10:00:00.000Z".into(),
                })
                .unwrap();
        }
    }
    let db = dir.path().join(DB_FILE);
    let mut bytes = std::fs::read(&db).unwrap();
    let page = usize::from(u16::from_be_bytes([bytes[16], bytes[17]]));
    assert!(bytes.len() > 8 * page, "the store spans pages");
    for (i, byte) in bytes.iter_mut().enumerate().skip(page) {
        *byte = (i.wrapping_mul(2_654_435_761) >> 7) as u8;
    }
    std::fs::write(&db, bytes).unwrap();
    dir
}

#[test]
fn damage_found_by_recovery_names_the_database_file() {
    let dir = damaged_data_dir();
    let db = dir.path().join(DB_FILE);

    let error = SessionService::open(ServiceConfig {
        data_dir: dir.path().to_path_buf(),
        permissions: Vec::new(),
    })
    .err()
    .expect("a damaged store is refused");
    let text = error.to_string();
    assert!(text.contains(&db.display().to_string()), "{text}");
    assert!(text.contains("untouched"), "says what became of it: {text}");

    let (code, stdout, stderr) = offstage_tests::server::cli(
        &[
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0, "{stdout}");
    assert!(stderr.contains(&db.display().to_string()), "{stderr}");
}
