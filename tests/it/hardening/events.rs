//! Event stream readers that stop reading, against a real `offstage
//! serve` (docs/contract.md, "Events"): while they sit on open connections
//! and large events keep coming, the host's memory stays bounded by the
//! event history (in bytes), not by what the stuck readers have not read;
//! and a reader that comes back is told it lagged, then carries on.

use offstage_tests::{
    proc::rss_bytes,
    server::{write_file, EventStream, Server},
};
use serde_json::json;

/// One event of about this size: a session title.
const BIG: usize = 256 * 1024;

/// The history the host is given: `[events] history_bytes`.
const HISTORY_BYTES: usize = 1 << 20;

#[test]
fn readers_that_stop_reading_cost_bounded_memory_and_are_told_they_lagged() {
    let config = tempfile::tempdir().unwrap();
    let config = write_file(
        config.path(),
        "offstage.toml",
        // The stuck readers must stay connected for the whole test: on a
        // loaded machine the renames can take longer than the default
        // `idle_timeout` (60 s), after which the host rightly drops a
        // reader that reads nothing.
        &format!("[events]\nhistory_bytes = {HISTORY_BYTES}\n[http]\nidle_timeout = \"1h\"\n"),
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let pid = server.pid().to_string();
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201);
    let path = format!("/api/session/{}", session["id"].as_str().unwrap());
    let rename = |n: usize| {
        let title = format!("{n:08}{}", "x".repeat(BIG));
        server.expect("PATCH", &path, Some(&json!({ "title": title })), 200);
    };

    // Three readers that open the stream and never read from it.
    let mut stuck: Vec<EventStream> = (0..3).map(|_| server.events()).collect();
    assert!(stuck.iter().all(|s| s.status == 200));
    // Enough to fill the history and the stuck sockets' buffers, so that
    // the baseline holds everything the bounds allow.
    let warm_up = 30;
    for n in 0..warm_up {
        rename(n);
    }
    let before = rss_bytes(&pid);
    // 24 times the history more, none of it read by the stuck readers.
    let more = 24 * HISTORY_BYTES / BIG;
    for n in warm_up..warm_up + more {
        rename(n);
    }
    let after = rss_bytes(&pid);
    let grown = after.saturating_sub(before);
    eprintln!(
        "rss before {} KiB, after {} KiB, {} MiB of events",
        before >> 10,
        after >> 10,
        (more * BIG) >> 20
    );
    assert!(
        grown < (more * BIG) as u64 / 4,
        "host memory grew by {} MiB while {} MiB of events went past 3 stuck readers \
         ({} MiB before, {} MiB after)",
        grown >> 20,
        (more * BIG) >> 20,
        before >> 20,
        after >> 20
    );

    // A stuck reader that reads again: what its socket held, then a
    // `stream.lagged` for what the history no longer has, then the rest.
    server.expect("PATCH", &path, Some(&json!({ "title": "the end" })), 200);
    let reader = &mut stuck[0];
    let seen = reader.until("session.updated", |p| p["title"] == "the end");
    let lagged = seen
        .iter()
        .find(|e| e["type"] == "stream.lagged")
        .unwrap_or_else(|| panic!("no stream.lagged among {} events", seen.len()));
    let missed = lagged["properties"]["missed"].as_u64().unwrap();
    assert!(missed > 0);
    // Every event it got is accounted for: received + missed = published.
    let renamed = seen
        .iter()
        .filter(|e| e["type"] == "session.updated")
        .count() as u64;
    assert_eq!(renamed + missed, (warm_up + more) as u64 + 1);
    // The host keeps serving everyone.
    server.expect("GET", "/api/health", None, 200);
}
