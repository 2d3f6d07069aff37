//! my-plugin in a real host, as `cargo test` runs it: offstage-plugin-test
//! loads the library cargo built into a host embedded in the test (its
//! own temporary data dir, the real session service, jobs and tools).

use offstage_plugin_test::{event::JobFinished, plugin_library, TestHost, ToolStatus};
use serde_json::json;

#[test]
fn my_tool_echoes_its_input() {
    let host = TestHost::load(plugin_library!());
    let session = host.session();
    let result = host.call(&session, "my_tool", json!({ "text": "hello" }));
    assert_eq!(result.status, ToolStatus::Completed);
    assert_eq!(result.output, "hello");
}

#[test]
fn a_slow_shell_call_is_logged_and_its_end_seen() {
    let host = TestHost::builder()
        .options(json!({ "slow_ms": 50 }))
        .load(plugin_library!());
    let session = host.session();
    let result = host.call(&session, "shell", json!({ "command": "sleep 0.3; echo done" }));
    assert_eq!(result.output.trim(), "done");
    host.wait_log("slow shell call");
    let finished = host.wait_event(|job: &JobFinished| job.id == result.job_id);
    assert_eq!(finished.exit_code, Some(0));
    host.wait_log("job finished");
}

#[test]
fn a_reload_hands_the_count_to_the_next_generation() {
    let host = TestHost::load(plugin_library!());
    let session = host.session();
    host.call(&session, "my_tool", json!({ "text": "once" }));
    let info = host.reload();
    assert_eq!(info.generation, 2);
    assert_eq!(host.handed_state(), Some(json!({ "echoed": 1 })));
}
