//! A full disk, simulated honestly with SQLite's `max_page_count`: once
//! the database may not grow, every write that needs room fails inside
//! SQLite with `SQLITE_FULL`, the same error a full file system gives.
//! (A full tmpfs or loop file system is not exercised: mounting one needs
//! root, which a test cannot assume; that check is still to do.)
//!
//! - a write that cannot be saved is shown to nobody: the call fails with
//!   `StorageFull` (HTTP 507, code `storage_full`), no event is published,
//!   memory does not have it;
//! - removing a session still works, so space can be freed through the
//!   API;
//! - everything resumes once there is room again.

use offstage::{
    testing::{status_of, StoreError, StoreTestExt},
    ServiceConfig, ServiceError, SessionService,
};
use offstage_plugin_api::types::{NewSession, Role};
use serde_json::json;

fn limit_pages(service: &SessionService, extra: Option<i64>) {
    // The limit is the connection's, set even if the group it commits in
    // fails: a write grouped with it that needs a page fails the group
    // with `Full`. The next try commits alone.
    for _ in 0..10 {
        match try_limit_pages(service, extra) {
            Err(StoreError::Full(_)) => continue,
            result => return result.unwrap(),
        }
    }
    panic!("the page limit could not be set");
}

fn try_limit_pages(service: &SessionService, extra: Option<i64>) -> Result<(), StoreError> {
    service
        .store()
        .submit(
            move |conn| {
                let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
                let limit = extra.map_or(1_000_000_000, |extra| pages + extra);
                conn.query_row(&format!("PRAGMA max_page_count = {limit}"), [], |r| {
                    r.get::<_, i64>(0)
                })?;
                Ok::<_, StoreError>(())
            },
            |_| {},
        )
        .wait_blocking()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_writes_with_507_shows_nothing_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let service = SessionService::open(ServiceConfig {
        data_dir: dir.path().to_path_buf(),
        permissions: Vec::new(),
    })
    .unwrap();
    let keep = service.create(NewSession::default()).await.unwrap();
    let doomed = service.create(NewSession::default()).await.unwrap();
    for n in 0..20 {
        service
            .notice(&doomed.id, &"x".repeat(4000), json!({ "n": n }))
            .await
            .unwrap();
    }
    service.wait_idle(&doomed.id).await.unwrap();
    let before = service.messages(&keep.id).await.unwrap().len();

    // The disk is full: the database may not grow by a single page.
    limit_pages(&service, Some(0));
    let mut events = service.events().subscribe();
    let error = service
        .notice(&keep.id, &"y".repeat(64 * 1024), json!({}))
        .await
        .unwrap_err();
    assert!(matches!(error, ServiceError::StorageFull(_)), "{error:?}");
    assert_eq!(error.code(), "storage_full");
    assert_eq!(status_of(&error).as_u16(), 507);
    assert!(error.to_string().contains("full"), "{error}");
    assert_eq!(
        service.messages(&keep.id).await.unwrap().len(),
        before,
        "nothing unsaved in memory"
    );
    // (Turns of the other session, woken by its notices, may still add
    // their replies: only this session's message must not be announced.)
    while let Ok(event) = events.try_recv() {
        let here = event.properties["session_id"] == keep.id.as_str();
        assert!(
            !(event.kind == "message.added" && here),
            "nothing unsaved announced: {event:?}"
        );
    }
    let stored = service.store().messages(&keep.id).unwrap();
    assert_eq!(stored.len(), before, "nothing in the store either");

    // Removing a session works on the full disk: that is how space is
    // freed through the API.
    service.remove(&doomed.id).await.unwrap();
    assert!(service.get(&doomed.id).await.is_err());

    // Room again: writes resume.
    limit_pages(&service, None);
    let message = service
        .notice(&keep.id, &"z".repeat(64 * 1024), json!({}))
        .await
        .unwrap();
    assert_eq!(message.role, Role::Notice);
    assert!(service
        .store()
        .messages(&keep.id)
        .unwrap()
        .iter()
        .any(|m| m.id == message.id));
}
