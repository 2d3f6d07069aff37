//! What an isolated plugin writes to stderr cannot cost the host memory or
//! stop the plugin: 1 GiB in one line and 1 GiB in many leave the host's
//! memory flat, a byte that is not UTF-8 changes nothing, and the cause of
//! a death, its log line and its `plugin.failed` event stay small.

use offstage_tests::{hostile::HostileServer, proc::rss_bytes};
use serde_json::json;

const MIB: u64 = 1 << 20;

#[test]
fn a_gibibyte_on_stderr_leaves_the_host_flat_and_the_plugin_going() {
    let host = HostileServer::start("", &[]);
    let pid = host.pid();
    let server_pid = host.server.pid().to_string();
    // A small flood first, so buffers that stay are counted in the base.
    host.attempt(json!({ "what": "stderr", "mib": 8, "line": 4096 }))
        .unwrap();
    let base = rss_bytes(&server_pid);
    let started = std::time::Instant::now();
    // One line of 1 GiB (written 1 MiB at a time), then 1 GiB in lines
    // of 4 KiB.
    for line in [0, 4096] {
        let wrote = host
            .attempt(json!({ "what": "stderr", "mib": 1024, "line": line }))
            .unwrap();
        assert_eq!(wrote, "ok: wrote 1024 MiB");
        let grown = rss_bytes(&server_pid).saturating_sub(base);
        assert!(
            grown < 32 * MIB,
            "the host grew by {} MiB while the plugin wrote 1 GiB (lines of {line})",
            grown / MIB
        );
    }
    eprintln!(
        "2 GiB of stderr in {:?}; host RSS {} MiB → {} MiB",
        started.elapsed(),
        base / MIB,
        rss_bytes(&server_pid) / MIB
    );
    // Not UTF-8: logged lossily; the plugin goes on in the same process
    // and can still write to stderr.
    host.attempt(json!({ "what": "stderr", "mib": 0, "invalid": true }))
        .unwrap();
    host.attempt(json!({ "what": "stderr", "mib": 1, "line": 80 }))
        .unwrap();
    assert_eq!(host.pid(), pid, "the plugin's process was replaced");
}

/// A death right after a 64 MiB line: the cause keeps only the last few
/// KiB of output, the line cut and marked, and the `plugin.failed` event
/// and the plugin's error stay under a few KiB.
#[test]
fn the_cause_of_a_death_after_a_huge_line_stays_small() {
    let host = HostileServer::start("", &[]);
    let pid = host.pid();
    host.attempt(json!({ "what": "stderr", "mib": 64, "line": 0 }))
        .unwrap();
    let mut events = host.server.events();
    // SAFETY: a plain system call on the plugin's pid.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let failed = events.until("plugin.failed", |p| p["name"] == "hostile");
    let event = failed.last().unwrap().to_string();
    assert!(
        event.len() < 16 * 1024,
        "a {} byte plugin.failed event",
        event.len()
    );
    assert!(event.contains("SIGKILL"), "{event}");
    assert!(event.contains("bytes cut"), "{event}");
    assert!(event.contains("end of flood"), "{event}");
    host.restarted(pid);
}
