//! offstage-plugin-test against real plugins: the template, as `offstage
//! plugin new` makes it, driven through every part of the harness in
//! process and isolated; a plugin that does not load, and a wait that
//! gives up, each saying what the host saw; and a subscription to an
//! unknown event type, refused at `init` and by `offstage plugin check`.
//!
//! The harness runs its own runtime and blocks, so these are plain
//! `#[test]`s.

use std::{
    panic::AssertUnwindSafe,
    process::Command,
    sync::{Mutex, MutexGuard},
};

use offstage_plugin_test::{
    event::{JobBackgrounded, JobFinished},
    Isolation, JobStatus, PluginStatus, TestHost, ToolStatus,
};
use offstage_tests::{fixtures, plugin_library};
use serde_json::json;

/// Held by each test here that loads the template: the harness captures
/// a plugin's log lines by its name, process-wide (plugin-test's
/// `logs.rs`), so two of them at once would each see the other's lines and
/// the isolated test could pass on lines its child never sent.
static ONE_TEMPLATE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_template_at_a_time() -> MutexGuard<'static, ()> {
    ONE_TEMPLATE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Every part of the harness on the template, loaded as `builder` says.
fn drive_the_template(builder: offstage_plugin_test::Builder, isolation: Isolation) {
    let _alone = one_template_at_a_time();
    let host = builder
        .options(json!({ "slow_ms": 50 }))
        .grant(["tool.add", "tool.wrap", "events"])
        .load(fixtures::template_library());
    let info = host.info();
    assert_eq!(
        (info.status, info.generation, info.isolation),
        (PluginStatus::Loaded, 1, isolation),
        "{info:?}"
    );
    host.wait_log("my-plugin ready");

    // A call, answered.
    let session = host.session();
    let result = host.call(&session, "my_tool", json!({ "text": "hi" }));
    assert_eq!(
        (result.status, result.output.as_str()),
        (ToolStatus::Completed, "hi")
    );
    // Input that breaks the tool's schema is refused by the host before
    // the tool sees it (the template's tool does not check `text`).
    let refused = host
        .try_call(&session, "my_tool", json!({ "text": 5 }))
        .expect_err("refused by the schema");
    assert!(
        matches!(&refused, offstage_plugin_test::ServiceError::InvalidInput(m)
            if m.contains("`text` must be of type string")),
        "{refused:?}"
    );

    // A call started, moved to the background while it runs, and its end:
    // the caller's answer, the job, the notice and the wake that follow.
    // Held on a file, so that it is still running when it is moved.
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    let command = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; echo late",
        go.display()
    );
    let call = host.start(&session, "shell", json!({ "command": command }));
    let job_id = call.job_id().to_string();
    call.wait_running();
    let moved = host.background(&session, &job_id);
    assert_eq!(moved.len(), 1, "{moved:?}");
    let answered = call.wait();
    assert_eq!(answered.status, ToolStatus::Backgrounded, "{answered:?}");
    // The plugin's wrapper saw it outlive `slow_ms`; then it may end.
    host.wait_log("slow shell call");
    std::fs::write(&go, "").unwrap();
    let job = host.wait_job(&job_id);
    assert_eq!((job.status, job.exit_code), (JobStatus::Completed, Some(0)));
    let notices = host.wait_notices(&session, 1);
    assert!(notices[0].text.contains(&job_id), "{notices:?}");
    host.wait("the session to wake", || {
        (host.wakes(&session) > 0).then_some(())
    });

    // Events by type, and the plugin's own lines about them.
    let finished = host.wait_event(|job: &JobFinished| job.id == job_id);
    assert_eq!(finished.exit_code, Some(0));
    assert_eq!(host.events_of::<JobBackgrounded>().len(), 1);
    assert_eq!(host.events("job.backgrounded").len(), 1);
    host.wait_log("job finished");

    // A reload: the next generation, handed what the last one counted.
    let reloaded = host.reload();
    assert_eq!(reloaded.generation, 2, "{reloaded:?}");
    assert_eq!(host.handed_state(), Some(json!({ "echoed": 1 })));
    let again = host.call(&session, "my_tool", json!({ "text": "still here" }));
    assert_eq!(again.output, "still here");
}

#[test]
fn the_harness_drives_the_template_in_process() {
    drive_the_template(TestHost::builder(), Isolation::None);
}

#[test]
fn the_harness_drives_the_template_isolated() {
    let builder = TestHost::builder()
        .isolated()
        .offstage_binary(fixtures::offstage_binary());
    drive_the_template(builder, Isolation::Process);
}

/// A plugin whose `init` fails does not load, and the failure says why in
/// the host's words: here a grant withheld, and a subscription to a type
/// the host never publishes, which lists the types it does.
#[test]
fn a_plugin_that_does_not_load_says_why() {
    let _alone = one_template_at_a_time();
    let withheld = TestHost::builder()
        .grant(["tool.add", "events"])
        .try_load(fixtures::template_library())
        .err()
        .expect("refused without tool.wrap");
    assert!(withheld.error.contains("tool.wrap"), "{withheld}");

    let reloadable = plugin_library("offstage-test-reloadable");
    let typo = TestHost::builder()
        .name("reloadable")
        .options(json!({ "also_subscribe": ["job.finish"] }))
        .try_load(&reloadable)
        .err()
        .expect("refused: job.finish is no event type");
    assert!(
        typo.error.contains("unknown event type job.finish;"),
        "{typo}"
    );
    assert!(typo.error.contains("job.finished"), "{typo}");

    // The same file without the typo loads (the name given, as the file
    // declares none).
    let host = TestHost::builder()
        .name("reloadable")
        .options(json!({ "also_subscribe": ["job.finished", "session.wake"] }))
        .load(&reloadable);
    assert_eq!(host.info().status, PluginStatus::Loaded);
}

/// `offstage plugin check` runs `init` as a host would: the unknown type
/// is refused there too, with the list.
#[test]
fn plugin_check_refuses_a_subscription_to_an_unknown_type() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("offstage.toml");
    std::fs::write(
        &config,
        "[plugin.reloadable]\nalso_subscribe = [\"job.finish\"]\n",
    )
    .unwrap();
    let library = plugin_library("offstage-test-reloadable");
    let output = Command::new(fixtures::offstage_binary())
        .args(["plugin", "check", "--config"])
        .arg(&config)
        .arg(&library)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("unknown event type job.finish;"),
        "{stderr}"
    );
    assert!(stderr.contains("session.created"), "{stderr}");
}

/// A wait that gives up fails the test with what the host saw: the
/// plugin's status, the last events and the plugin's log.
#[test]
fn a_failed_wait_shows_what_the_host_saw() {
    let _alone = one_template_at_a_time();
    let host = TestHost::builder()
        .patience(std::time::Duration::from_millis(200))
        .load(fixtures::template_library());
    let session = host.session();
    host.call(&session, "my_tool", json!({ "text": "seen" }));
    let panic = std::panic::catch_unwind(AssertUnwindSafe(|| host.wait_job("job_never")))
        .expect_err("the wait gives up");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    for part in [
        "gave up waiting for job job_never to end",
        "plugin my-plugin (generation 1): Loaded",
        "plugin.loaded",
        "job.finished",
        "my-plugin ready",
    ] {
        assert!(message.contains(part), "{part:?} missing from:\n{message}");
    }
}
