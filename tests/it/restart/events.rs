//! Events across a restart of the real `offstage serve` (docs/contract.md,
//! "Events"): what restart recovery publishes before anyone can connect —
//! the "host restarted" notice, the wake — is in the event history, so a
//! client that connects after start with `?since=0` gets it; a client that
//! comes back with an id from the killed run is told it lagged (by how
//! much is unknown) and then gets the new run's events; the new run's ids
//! are above the old run's.

use offstage_tests::{server::Server, wait::eventually};
use serde_json::{json, Value};

#[test]
fn recovery_notices_and_wakes_reach_a_client_that_connects_after_start() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("data");
    let first = Server::start_on(&dir, &[]);
    let session = first.expect("POST", "/api/session", Some(&json!({})), 201);
    let session = session["id"].as_str().unwrap().to_string();
    let mut events = first.events();
    let started = first.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "sleep 300", "background": true } })),
        200,
    );
    let job_id = started["job_id"].as_str().unwrap().to_string();
    let seen = events.until("job.started", |p| p["id"] == job_id);
    let old_id = seen.last().unwrap()["id"].as_u64().unwrap();
    drop(events);
    first.kill();

    let second = Server::start_on(&dir, &[]);
    // Wait until the woken turn is over, so everything is published.
    eventually("the session idle after its wake", || {
        let s = second.expect("GET", &format!("/api/session/{session}"), None, 200);
        (s["status"] == "idle").then_some(())
    });

    let is_notice = |e: &Value| {
        e["type"] == "message.added"
            && e["properties"]["role"] == "notice"
            && e["properties"]["metadata"]["job_id"] == job_id
    };
    let mut replay = second.events_at("/api/event?since=0", &[]);
    let hello = replay.next_event().unwrap();
    assert_eq!(hello["type"], "server.connected");
    let held = replay.until("session.wake", |p| p["session_id"] == session);
    let notice = held
        .iter()
        .find(|e| is_notice(e))
        .unwrap_or_else(|| panic!("no notice in {held:#?}"));
    assert_eq!(notice["properties"]["metadata"]["reason"], "host_restarted");
    let notice_id = notice["id"].as_u64().unwrap();
    assert!(
        notice_id > old_id,
        "{notice_id} is not above the old run's {old_id}"
    );
    assert!(
        held.iter().filter(|e| is_notice(e)).count() == 1,
        "one notice: {held:#?}"
    );

    // Back with the id the killed run gave it.
    let old = old_id.to_string();
    let mut resumed = second.events_at("/api/event", &[("Last-Event-ID", &old)]);
    assert_eq!(resumed.next_event().unwrap()["type"], "server.connected");
    let lagged = resumed.next_event().unwrap();
    assert_eq!(lagged["type"], "stream.lagged", "{lagged}");
    assert!(lagged["properties"]["missed"].is_null(), "{lagged}");
    let after = resumed.until("session.wake", |p| p["session_id"] == session);
    assert!(after.iter().any(is_notice), "{after:#?}");
}

#[test]
fn shutdown_events_reach_clients_and_the_next_run_replays_them() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("data");
    let config = offstage_tests::server::write_file(
        data.path(),
        "offstage.toml",
        "[[permission]]\ntool = \"shell\"\npattern = \"touch *\"\naction = \"ask\"\n",
    );
    let config = config.to_str().unwrap();
    let first = Server::start_on(&dir, &["--config", config]);
    let session = first.expect("POST", "/api/session", Some(&json!({})), 201);
    let session = session["id"].as_str().unwrap().to_string();
    let mut events = first.events();
    let sleeper = first.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "sleep 300", "background": true } })),
        200,
    );
    let sleeper = sleeper["job_id"].as_str().unwrap().to_string();
    // A call waiting for its question, in the background.
    let asking = first.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "touch /dev/null", "background": true } })),
        200,
    );
    let asking = asking["job_id"].as_str().unwrap().to_string();
    let asked = events.until("permission.asked", |p| p["job_id"] == asking);
    let asked_id = asked.last().unwrap()["id"].as_u64().unwrap();

    let (status, log) = first.stop();
    assert!(status.success(), "{log}");
    // What the stream carried before it ended, after the question.
    let mut rest = Vec::new();
    while let Some(event) = events.next_event() {
        rest.push(event);
    }
    let withdrawn = |e: &Value| {
        e["type"] == "permission.withdrawn"
            && e["properties"]["job_id"] == asking
            && e["properties"]["reason"] == "shutdown"
    };
    let finished = |id: &str| {
        let id = id.to_string();
        move |e: &Value| {
            e["type"] == "job.finished"
                && e["properties"]["id"] == id
                && e["properties"]["status"] == "cancelled"
        }
    };
    assert!(rest.iter().any(withdrawn), "{rest:#?}");
    assert!(rest.iter().any(finished(&sleeper)), "{rest:#?}");
    assert!(rest.iter().any(finished(&asking)), "{rest:#?}");

    // After the restart, a client that comes back with the id of the
    // question gets what followed it, without a gap.
    let second = Server::start_on(&dir, &["--config", config]);
    let after = asked_id.to_string();
    let mut resumed = second.events_at("/api/event", &[("Last-Event-ID", &after)]);
    assert_eq!(resumed.next_event().unwrap()["type"], "server.connected");
    let first_after = resumed.next_event().unwrap();
    assert_ne!(first_after["type"], "stream.lagged", "{first_after}");
    assert!(first_after["id"].as_u64().unwrap() > asked_id);
    let mut replayed = vec![first_after];
    while !replayed.iter().any(finished(&sleeper)) || !replayed.iter().any(withdrawn) {
        replayed.push(resumed.next_event().expect("the replay goes on"));
    }
}

#[test]
fn plugins_see_the_job_ends_of_restart_recovery() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join("data");
    let plugins = data.path().join("plugins");
    offstage_tests::install_plugin("offstage-audit-log", &plugins);
    let plugin_dir = plugins.to_str().unwrap();
    let first = Server::start_on(&dir, &["--plugin-dir", plugin_dir]);
    let session = first.expect("POST", "/api/session", Some(&json!({})), 201);
    let session = session["id"].as_str().unwrap().to_string();
    let started = first.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "sleep 300", "background": true } })),
        200,
    );
    let job_id = started["job_id"].as_str().unwrap().to_string();
    first.kill();

    // Recovery cancels the job before the plugin loads; the plugin still
    // gets its `job.finished`, and writes its line.
    let second = Server::start_on(&dir, &["--plugin-dir", plugin_dir]);
    let log = dir.join("plugin-data/audit-log/jobs.jsonl");
    let line = eventually("the audit line of the recovered job", || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .find(|line| line["job_id"] == job_id)
    });
    assert_eq!(line["status"], "cancelled", "{line}");
    drop(second);
}
