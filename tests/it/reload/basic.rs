//! Hot reload with real rebuilt cdylibs: the `reloadable` test plugin,
//! built as variant a, b and broken, replaced under a running host.
//!
//! The suite runs with the plugin in process here and in a child process
//! in `isolation::reload` (`reload_suite!`); fifty reloads in a row run in
//! process only (the isolation bench measures isolated reloads' memory).

use offstage::{Isolation, LoadError, PluginStatus, ServiceError};
use offstage_plugin_api::types::{NewSession, ToolStatus};
use offstage_tests::loader::{lib_name, PATIENCE};
use offstage_tests::reload::*;
use offstage_tests::wait::poll_showing;
use serde_json::json;

pub(crate) async fn calls_in_flight_finish_on_the_old_generation_and_new_calls_reach_the_new(
    mode: Isolation,
) {
    let host = ReloadHost::start_as(mode, Variant::A);
    assert_eq!(host.whoami().await, stamp(Variant::A, 1));
    let gate = gate(host.host.fixture.dir.path(), "gate");

    // Five calls that hold generation 1 until the test opens the gate: a
    // plugin tool awaiting the host's timer, and `shell` calls going
    // through the plugin's wrapper.
    let mut tool_calls = Vec::new();
    for _ in 0..3 {
        tool_calls.push(
            host.spawn_call("reloadable_whoami", json!({ "wait_for": gate }))
                .await,
        );
    }
    let command = format!(
        "until [ -e {} ]; do sleep 0.02; done; echo old",
        gate.display()
    );
    let mut shell_calls = Vec::new();
    for _ in 0..2 {
        shell_calls.push(
            host.spawn_call("shell", json!({ "command": command }))
                .await,
        );
    }
    host.wait_for_running_jobs(5).await;

    let info = host.reload_to(Variant::B).await.unwrap();
    assert_eq!(info.generation, 2);
    assert_eq!(info.status, PluginStatus::Loaded);
    assert_eq!(info.error, None);
    assert_eq!(host.host.plugins.get("reloadable").unwrap(), info);

    // New calls reach generation 2 while generation 1 still has calls.
    assert_eq!(host.whoami().await, stamp(Variant::B, 2));
    assert_eq!(host.echo("new").await, wrapped("new\n", Variant::B, 2));
    assert!(tool_calls
        .iter()
        .chain(&shell_calls)
        .all(|c| !c.is_finished()));
    // Generation 1 is not shut down while its calls run.
    assert!(
        !host.log_lines().iter().any(|l| l.starts_with("shutdown")),
        "{:#?}",
        host.log_lines()
    );

    std::fs::write(&gate, "").unwrap();
    for call in tool_calls {
        let result = call.await.unwrap().unwrap();
        assert_eq!(result.status, ToolStatus::Completed, "{result:#?}");
        assert_eq!(result.output, stamp(Variant::A, 1));
    }
    for call in shell_calls {
        let result = call.await.unwrap().unwrap();
        assert_eq!(result.status, ToolStatus::Completed, "{result:#?}");
        assert_eq!(result.output, wrapped("old\n", Variant::A, 1));
    }
    // Then generation 1 shuts down, with none of its hooks running.
    host.wait_for_log("shutdown a 1 in_flight=0").await;
    assert_eq!(host.whoami().await, stamp(Variant::B, 2));
}

pub(crate) async fn a_broken_build_keeps_the_old_generation_serving(mode: Isolation) {
    let host = ReloadHost::start_as(mode, Variant::A);
    assert_eq!(
        host.output("reloadable_count", json!({})).await,
        format!("{} count=1", stamp(Variant::A, 1))
    );
    let mut events = host.host.service.events().subscribe();

    // A build whose `init` registers a tool, a wrapper, an agent and a
    // subscription and then fails.
    let error = host.reload_to(Variant::Broken).await.unwrap_err();
    assert!(matches!(error, LoadError::InitError { .. }), "{error}");
    assert!(error.to_string().contains("broken on purpose"), "{error}");
    let info = host.host.plugins.get("reloadable").unwrap();
    assert_eq!(info.status, PluginStatus::Loaded);
    assert_eq!(info.generation, 1);
    assert_eq!(info.error.as_deref(), Some(error.to_string().as_str()));
    assert_eq!(
        host.host.plugins.list().len(),
        1,
        "{:#?}",
        host.host.plugins.list()
    );
    let event = tokio::time::timeout(PATIENCE, async {
        loop {
            let event = events.recv().await.unwrap();
            if event.kind == "plugin.failed" {
                return event;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(event.properties["name"], "reloadable");
    assert_eq!(event.properties["generation"], 1);
    assert_eq!(event.properties["status"], "loaded");
    assert_eq!(event.properties["failed_generation"], 2);

    // Nothing the broken build registered took effect: generation 1's
    // tool, wrapper and agent answer, its state goes on.
    assert_eq!(host.whoami().await, stamp(Variant::A, 1));
    assert_eq!(host.echo("hi").await, wrapped("hi\n", Variant::A, 1));
    assert!(matches!(
        host.call("reloadable_only_broken", json!({})).await,
        Err(ServiceError::NotFound(_))
    ));
    assert_eq!(host.output("reloadable_only_a", json!({})).await, "a");
    assert_eq!(
        host.output("reloadable_count", json!({})).await,
        format!("{} count=2", stamp(Variant::A, 1))
    );
    let session = host
        .host
        .service
        .create(NewSession {
            agent: Some("reloadable".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let reply = host
        .host
        .service
        .prompt(&session.id, "hi", None)
        .await
        .unwrap();
    assert!(
        reply.iter().any(|m| m.text == stamp(Variant::A, 1)),
        "{reply:#?}"
    );

    // A truncated file is refused before anything runs.
    let bytes = std::fs::read(Variant::B.library()).unwrap();
    host.install_bytes(&bytes[..bytes.len() / 2]);
    let error = host.reload().await.unwrap_err();
    assert!(matches!(error, LoadError::Truncated { .. }), "{error}");
    let info = host.host.plugins.get("reloadable").unwrap();
    assert_eq!((info.status, info.generation), (PluginStatus::Loaded, 1));
    assert!(info.error.unwrap().contains("truncated file"));
    assert_eq!(host.whoami().await, stamp(Variant::A, 1));

    // A good build then replaces generation 1 and clears the error. The
    // broken attempt used generation 2 and never loaded; the plugin counts
    // its own loads through the state it hands over.
    let info = host.reload_to(Variant::B).await.unwrap();
    assert_eq!(
        (info.status, info.generation, info.error),
        (PluginStatus::Loaded, 3, None)
    );
    assert_eq!(
        host.output("reloadable_count", json!({})).await,
        format!("{} count=3", stamp(Variant::B, 2))
    );
    // Old generation's leftovers are gone, the new one's are there.
    assert!(matches!(
        host.call("reloadable_only_a", json!({})).await,
        Err(ServiceError::NotFound(_))
    ));
    assert_eq!(host.output("reloadable_only_b", json!({})).await, "b");
    host.wait_for_log("shutdown a 1 in_flight=0").await;
    assert!(
        !host.log_lines().iter().any(|l| l.contains("broken")),
        "{:#?}",
        host.log_lines()
    );
}

pub(crate) async fn state_survives_reloads(mode: Isolation) {
    let host = ReloadHost::start_as(mode, Variant::A);
    for n in 1..=3 {
        assert_eq!(
            host.output("reloadable_count", json!({})).await,
            format!("{} count={n}", stamp(Variant::A, 1))
        );
    }
    host.reload_to(Variant::B).await.unwrap();
    assert_eq!(
        host.output("reloadable_count", json!({})).await,
        format!("{} count=4", stamp(Variant::B, 2))
    );
    // The agent was replaced by name: a session using it reaches the new
    // generation.
    let session = host
        .host
        .service
        .create(NewSession {
            agent: Some("reloadable".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let reply = host
        .host
        .service
        .prompt(&session.id, "hi", None)
        .await
        .unwrap();
    assert!(
        reply.iter().any(|m| m.text == stamp(Variant::B, 2)),
        "{reply:#?}"
    );
    host.reload_to(Variant::A).await.unwrap();
    let reply = host
        .host
        .service
        .prompt(&session.id, "hi", None)
        .await
        .unwrap();
    assert!(
        reply.iter().any(|m| m.text == stamp(Variant::A, 3)),
        "{reply:#?}"
    );
    assert_eq!(
        host.output("reloadable_count", json!({})).await,
        format!("{} count=5", stamp(Variant::A, 3))
    );
    // Reloading the same file again is a new generation too.
    let info = host.reload().await.unwrap();
    assert_eq!(info.generation, 4);
    assert_eq!(
        host.output("reloadable_count", json!({})).await,
        format!("{} count=6", stamp(Variant::A, 4))
    );
}

pub(crate) async fn a_wrapper_is_replaced_without_a_gap(mode: Isolation) {
    let host = std::sync::Arc::new(ReloadHost::start_as(mode, Variant::A));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two loops of `shell` calls run while the plugin is reloaded ten
    // times; every call must be wrapped exactly once, by one generation.
    let loops: Vec<_> = (0..2)
        .map(|i| {
            let (host, stop) = (host.clone(), stop.clone());
            tokio::spawn(async move {
                let mut outputs = Vec::new();
                loop {
                    // The call after `stop` starts after the last reload.
                    let stopping = stop.load(std::sync::atomic::Ordering::SeqCst);
                    outputs.push(host.echo(&format!("loop{i}")).await);
                    if stopping && outputs.len() >= 3 {
                        break;
                    }
                }
                outputs
            })
        })
        .collect();
    for n in 0..10 {
        let variant = if n % 2 == 0 { Variant::B } else { Variant::A };
        let info = host.reload_to(variant).await.unwrap();
        assert_eq!(info.generation, n + 2);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    for (i, handle) in loops.into_iter().enumerate() {
        let outputs = handle.await.unwrap();
        total += outputs.len();
        for output in &outputs {
            assert!(
                output.starts_with("[wrapped by variant="),
                "not wrapped: {output:?}"
            );
            assert!(output.ends_with(&format!("]\nloop{i}\n")), "{output:?}");
            assert_eq!(
                output.matches("[wrapped by").count(),
                1,
                "wrapped twice: {output:?}"
            );
        }
        // The last calls started after the last reload.
        assert_eq!(
            outputs.last().unwrap(),
            &wrapped(&format!("loop{i}\n"), Variant::A, 11)
        );
    }
    assert!(total >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_reloads_keep_the_host_healthy() {
    let host = ReloadHost::start(Variant::A);
    host.output("reloadable_count", json!({})).await;
    let tools_before = host.host.service.tools().names();
    for n in 0..50u64 {
        let variant = if n % 2 == 0 { Variant::B } else { Variant::A };
        let info = host.reload_to(variant).await.unwrap();
        assert_eq!(info.generation, n + 2);
    }
    let info = host.host.plugins.get("reloadable").unwrap();
    assert_eq!(
        (info.status, info.generation, info.error),
        (PluginStatus::Loaded, 51, None)
    );
    assert_eq!(host.host.plugins.list().len(), 1);
    // 50 reloads, b then a in turn: the last is a's build, loaded 51 times.
    assert_eq!(host.whoami().await, stamp(Variant::A, 51));
    assert_eq!(
        host.output("reloadable_count", json!({})).await,
        format!("{} count=2", stamp(Variant::A, 51))
    );
    assert_eq!(host.echo("x").await, wrapped("x\n", Variant::A, 51));
    assert_eq!(host.host.service.tools().names(), tools_before);
    // Every replaced generation shut down after draining.
    for loads in 1..=50u64 {
        let variant = if loads % 2 == 1 { "a" } else { "b" };
        host.wait_for_log(&format!("shutdown {variant} {loads} in_flight=0"))
            .await;
    }
    // Only the newest generation's subscription still runs.
    let session = host.host.session().await;
    host.wait_for_log(&format!("event a 51 {session}")).await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let seen: Vec<_> = host
        .log_lines()
        .into_iter()
        .filter(|l| l.ends_with(&session))
        .collect();
    assert_eq!(seen, vec![format!("event a 51 {session}")]);
}

pub(crate) async fn reload_refuses_unknown_plugins_and_files_that_changed_plugin(mode: Isolation) {
    let host = ReloadHost::start_as(mode, Variant::A);
    let error = host.host.plugins.reload("nobody").unwrap_err();
    assert!(matches!(error, LoadError::Unknown { .. }), "{error}");
    assert_eq!(error.to_string(), "no plugin named `nobody`");

    // The file now holds another plugin.
    let hello = offstage_tests::plugin_library("offstage-test-hello");
    host.install_bytes(&std::fs::read(hello).unwrap());
    let error = host.reload().await.unwrap_err();
    assert!(matches!(error, LoadError::NameChanged { .. }), "{error}");
    assert!(
        error
            .to_string()
            .contains("the file now holds plugin `hello`"),
        "{error}"
    );
    assert!(error
        .to_string()
        .starts_with(&host.path.display().to_string()));
    assert_eq!(host.whoami().await, stamp(Variant::A, 1));
    assert!(matches!(
        host.call("hello", json!({})).await,
        Err(ServiceError::NotFound(_))
    ));
}

pub(crate) async fn a_plugin_that_failed_to_start_is_loaded_afresh(mode: Isolation) {
    // A broken build in the plugin dir at start-up: the load fails; a
    // reload by name then loads the fixed file.
    let fixture = offstage_tests::loader::Fixture::with_mode(mode);
    let path = fixture.install_file(&Variant::Broken.library(), &lib_name(PACKAGE));
    let host = fixture.start();
    let info = host.plugins.get("reloadable").unwrap();
    assert_eq!(info.status, PluginStatus::Failed);
    assert!(matches!(
        host.call("reloadable_whoami", json!({})).await,
        Err(ServiceError::Plugin(message)) if message.contains("its plugin reloadable failed to start")
    ));
    std::fs::copy(Variant::A.library(), &path).unwrap();
    let plugins = host.plugins.clone();
    let info = tokio::task::spawn_blocking(move || plugins.reload("reloadable"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((info.status, info.generation), (PluginStatus::Loaded, 2));
    assert_eq!(
        host.call("reloadable_whoami", json!({}))
            .await
            .unwrap()
            .output,
        stamp(Variant::A, 1)
    );
    assert_eq!(host.plugins.list().len(), 1, "{:#?}", host.plugins.list());
}

pub(crate) async fn events_published_during_reloads_are_handled_once_each(mode: Isolation) {
    // The handler takes 5 ms per event, so events queue up behind it.
    let host = std::sync::Arc::new(ReloadHost::start_with(
        mode,
        Variant::A,
        json!({ "event_delay_ms": 5 }),
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Sessions are created (each publishing `session.created`) while the
    // plugin is reloaded ten times. Its subscription hands its queue, with
    // the events still waiting in it, to the next generation: no event is
    // lost or handled twice.
    let creator = {
        let (host, stop) = (host.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sessions = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                sessions.push(host.host.session().await);
                // Paced, so the handler never falls behind by more than
                // the event bus keeps (a lag loses events by design): on
                // a loaded machine reloads take longer and the queue grows
                // while they run, so the pace also waits for the handler
                // whenever it is a quarter of the bus's history behind.
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                if sessions.len() % 64 == 0 {
                    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                        let handled = host
                            .log_lines()
                            .iter()
                            .filter(|l| l.starts_with("event"))
                            .count();
                        if sessions.len().saturating_sub(handled) < 1024 {
                            break;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                }
            }
            sessions
        })
    };
    for n in 0..10 {
        let variant = if n % 2 == 0 { Variant::B } else { Variant::A };
        host.reload_to(variant).await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sessions = creator.await.unwrap();
    assert!(!sessions.is_empty());
    // One more, after the last reload: generation 11 handles it, after
    // everything before it.
    let last = host.host.session().await;
    host.wait_for_log(&format!("event a 11 {last}")).await;
    let lines = host.log_lines();
    for session in &sessions {
        let handled: Vec<_> = lines
            .iter()
            .filter(|l| l.ends_with(session.as_str()))
            .collect();
        assert_eq!(
            handled.len(),
            1,
            "{session} of {}: {handled:#?}",
            sessions.len()
        );
    }
    // Every generation stopped reading before the next one started, in order.
    let order: Vec<u64> = lines
        .iter()
        .filter(|l| l.starts_with("event"))
        .map(|l| l.split(' ').nth(2).unwrap().parse().unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "{order:?}");
}

pub(crate) async fn state_handed_over_counts_every_event_around_a_slow_init(mode: Isolation) {
    // The plugin counts finished `shell` jobs from `job.finished` and hands
    // the count across reloads. Generation 2's `init` waits on a gate, and
    // jobs finish while it waits: generation 1 must not count them after
    // it exported its state, and generation 2 must count them from the
    // queue it takes over.
    let dir = tempfile::tempdir().unwrap();
    let gate = gate(dir.path(), "init-gate");
    let host = std::sync::Arc::new(ReloadHost::start_with(
        mode,
        Variant::A,
        json!({ "reload_gate": gate }),
    ));
    let wait_for_count = |want: u64| {
        let host = host.clone();
        async move {
            let what = format!("the plugin to count {want} finished jobs");
            poll_showing(&what, async || {
                let count: u64 = host
                    .output("reloadable_finished", json!({}))
                    .await
                    .parse()
                    .unwrap();
                if count >= want {
                    Ok(count)
                } else {
                    Err(count)
                }
            })
            .await
        }
    };

    for n in 0..3 {
        host.echo(&format!("before-{n}")).await;
    }
    assert_eq!(wait_for_count(3).await, 3);

    // The reload runs until the gate opens; its `init` says when it waits
    // (by then the old generation's state is exported).
    host.install(Variant::B);
    let reload = {
        let plugins = host.host.plugins.clone();
        tokio::task::spawn_blocking(move || plugins.reload("reloadable"))
    };
    host.wait_for_log("init b 2 waiting").await;
    for n in 0..4 {
        // Through generation 1's wrapper: it still serves calls.
        assert_eq!(
            host.echo(&format!("during-{n}")).await,
            wrapped(&format!("during-{n}\n"), Variant::A, 1)
        );
    }
    std::fs::write(&gate, "").unwrap();
    let info = tokio::time::timeout(PATIENCE, reload)
        .await
        .expect("the reload ends once the gate opens")
        .unwrap()
        .unwrap();
    assert_eq!(info.generation, 2);

    for n in 0..2 {
        assert_eq!(
            host.echo(&format!("after-{n}")).await,
            wrapped(&format!("after-{n}\n"), Variant::B, 2)
        );
    }
    // 3 before, 4 during the slow init, 2 after: each counted once.
    assert_eq!(wait_for_count(9).await, 9);
    assert_eq!(host.output("reloadable_finished", json!({})).await, "9");

    // A reload that fails hands the paused queues back: generation 2
    // goes on counting.
    host.reload_to(Variant::Broken).await.unwrap_err();
    for n in 0..2 {
        assert_eq!(
            host.echo(&format!("after-failure-{n}")).await,
            wrapped(&format!("after-failure-{n}\n"), Variant::B, 2)
        );
    }
    assert_eq!(wait_for_count(11).await, 11);
}

/// The suite, for the plugin run as `$mode` says: in process here, in a
/// child process in `isolation::reload`.
macro_rules! reload_suite {
    ($mode:expr) => {
        tests_in_mode!(
            $mode,
            reload::basic {
                calls_in_flight_finish_on_the_old_generation_and_new_calls_reach_the_new,
                a_broken_build_keeps_the_old_generation_serving,
                state_survives_reloads,
                a_wrapper_is_replaced_without_a_gap,
                reload_refuses_unknown_plugins_and_files_that_changed_plugin,
                a_plugin_that_failed_to_start_is_loaded_afresh,
                events_published_during_reloads_are_handled_once_each,
                state_handed_over_counts_every_event_around_a_slow_init,
            }
        );
    };
}
pub(crate) use reload_suite;

/// The suite in process (isolated: `isolation::reload`).
mod in_process {
    reload_suite!(offstage::Isolation::None);
}
