//! A full disk, simulated honestly with SQLite's `max_page_count`: once
//! the database may not grow, every write that needs room fails inside
//! SQLite with `SQLITE_FULL`, the same error a full file system gives.
//! And a real full file system: a small tmpfs, mounted by the test (it
//! needs root, and says so and skips without), filled by a job's own
//! output.
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

/// A tmpfs of `size` mounted on a new temporary directory, unmounted (and
/// the directory removed) when dropped, the test failing or not.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None`, said on stderr, when it cannot be mounted.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status();
        match status {
            Ok(status) if status.success() => Some(Tmpfs { dir }),
            other => {
                eprintln!("SKIPPED: cannot mount a tmpfs: {other:?}");
                None
            }
        }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let path = std::ffi::CString::new(self.dir.path().as_os_str().as_encoded_bytes()).unwrap();
        // Detached: a process still holding a file there cannot keep it.
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!(
                "cannot unmount {}: {}",
                self.dir.path().display(),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// A job whose own output fills a real (small) file system: its output
/// file stops at the full disk and says it was cut, the job goes on, its
/// end is recorded from the store's reserved room, so its caller is
/// answered; the next call works too, and the room is made again once
/// space is back.
#[test]
fn a_job_that_fills_the_disk_ends_and_its_caller_is_answered() {
    use offstage_tests::server::Server;
    use std::time::{Duration, Instant};

    // SAFETY: `geteuid` takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: a_job_that_fills_the_disk_ends_and_its_caller_is_answered needs root to mount a tmpfs");
        return;
    }
    let Some(disk) = Tmpfs::mount("6m") else {
        return;
    };
    let data = disk.path().join("data");
    // Declared after the mount: stopped before it is unmounted.
    let server = Server::start_on(&data, &[]);
    let reserve = data.join("reserve");
    assert!(reserve.exists(), "the store keeps its room from the start");
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string();
    let call = |id: &str, command: &str| {
        server.expect(
            "POST",
            &format!("/api/session/{session}/tool"),
            Some(&json!({ "tool": "shell", "input": { "command": command }, "call_id": id })),
            200,
        )
    };

    let started = Instant::now();
    let result = call(
        "job_fill",
        "yes offstage-fill | head -c 20000000; echo END-OF-FILL",
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "answered in {:?}",
        started.elapsed()
    );
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["exit_code"], 0, "{result}");
    let output = result["output"].as_str().unwrap();
    assert!(
        output.starts_with("[... output cut:") && output.contains("disk is full"),
        "the output is marked cut: {}",
        &output[..output.len().min(400)]
    );
    assert!(output.ends_with("END-OF-FILL\n"), "the job went on");
    let path = result["output_path"].as_str().unwrap().to_string();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(
        size > 0 && size < 6 << 20,
        "the file stopped at the full disk: {size}"
    );
    assert!(!reserve.exists(), "the reserved room was used");

    // The job's record says it ended.
    let job = server.expect("GET", "/api/job/job_fill", None, 200);
    assert_eq!(job["status"], "completed", "{job}");
    assert_eq!(job["exit_code"], 0, "{job}");
    assert!(job["completed_at"].is_string(), "{job}");

    // The disk is still full of that output, and the host still works.
    let result = call("job_after", "echo ok");
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["output"], "ok\n");
    let job = server.expect("GET", "/api/job/job_after", None, 200);
    assert_eq!(job["status"], "completed", "{job}");

    // Space is back: a later job's end makes the room again.
    std::fs::remove_file(&path).unwrap();
    let mut n = 0;
    while !reserve.exists() {
        n += 1;
        assert!(n < 20, "the reserve is made again once there is room");
        std::thread::sleep(Duration::from_millis(300));
        call(&format!("job_room_{n}"), "true");
    }

    let (_, log) = server.stop();
    assert!(
        log.contains("disk full: the job's output file stops growing"),
        "the log says the output was cut"
    );
    assert!(
        log.contains("released the store's reserved room"),
        "the log says the reserve was used"
    );
    drop(disk);
}
