//! The processes of an isolated plugin: what it starts ends with it, the
//! host reaps what it adopts, Ctrl+C reaches only the host (which then
//! shuts the plugin down in order), and a start that fails is retried.

use offstage::{Isolation, IsolationSettings, PluginStatus};
use offstage_tests::{
    hostile::HostileServer,
    loader::*,
    plugin_library,
    wait::{eventually, poll},
};
use serde_json::json;

/// `(pid, parent, process group, zombie)` of every process.
fn processes() -> Vec<(u32, u32, u32, bool)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let number = |i: usize| fields.get(i).and_then(|f| f.parse().ok()).unwrap_or(0);
        all.push((pid, number(1), number(2), fields.first() == Some(&"Z")));
    }
    all
}

/// A plugin forks a thousand children it never waits for and a few that
/// sleep for an hour, then is reloaded: its old process's group is
/// killed, and the host reaps every one it adopted: none is left, dead or
/// alive.
#[test]
fn what_a_plugin_started_ends_and_is_reaped_with_its_process() {
    let host = HostileServer::start("", &[]);
    let old = host.pid();
    let forked = host
        .attempt(json!({ "what": "fork", "zombies": 1000, "sleepers": 20 }))
        .unwrap();
    let pids: Vec<u32> = serde_json::from_str(forked.strip_prefix("ok: ").unwrap()).unwrap();
    assert_eq!(pids.len(), 1020);
    host.server
        .expect("POST", "/api/plugin/hostile/reload", None, 200);
    host.restarted(old);
    let server = host.server.pid();
    let left = eventually("the old plugin's processes gone", || {
        let left: Vec<_> = processes()
            .into_iter()
            .filter(|&(pid, parent, group, zombie)| {
                group == old || pids.contains(&pid) || (parent == server && zombie)
            })
            .collect();
        left.is_empty().then_some(left)
    });
    assert!(left.is_empty());
    host.attempt(json!({ "what": "env" })).unwrap();
}

/// Ctrl+C in the terminal (SIGINT to the foreground process group): the
/// plugin's process is in a group of its own, so it is not killed by the
/// signal; the host shuts it down, and its `shutdown` runs.
#[test]
fn ctrl_c_reaches_the_host_which_shuts_the_plugin_down() {
    let host = HostileServer::start("", &[]);
    let pid = host.pid();
    let marker = host.plugin_data().join("shutdown.txt");
    assert!(!marker.exists());
    let (server, _dir) = host.into_parts();
    let (status, stderr) = server.interrupt_group();
    assert!(status.success(), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "shutdown ran",
        "the plugin's shutdown did not run; host log:\n{stderr}"
    );
    assert!(!offstage_tests::proc::pid_alive(pid));
}

/// A start whose process fails (here: its constructor exits, once) is
/// tried again by the restart policy, and the plugin comes up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_that_fails_is_retried_by_the_restart_policy() {
    let mut fixture = Fixture::new();
    fixture.isolation.child_exe = Some(offstage_tests::fixtures::offstage_binary());
    fixture.isolation.plugins.insert(
        "hostile".into(),
        IsolationSettings {
            mode: Some(Isolation::Process),
            ..Default::default()
        },
    );
    let path = fixture.install_file(
        &plugin_library("offstage-test-hostile"),
        "liboffstage_test_hostile.so",
    );
    let mut marker = path.clone().into_os_string();
    marker.push(".fail-once");
    std::fs::write(&marker, "").unwrap();
    let host = fixture.start();
    let first = host.outcome("liboffstage_test_hostile.so").clone();
    assert_eq!(first.status, PluginStatus::Failed, "{first:?}");
    assert!(
        first
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("exited with status 9"),
        "{first:?}"
    );
    poll("hostile started on a retry", async || {
        host.plugins
            .get("hostile")
            .filter(|i| i.status == PluginStatus::Loaded)
    })
    .await;
    host.plugins.shutdown();
}
