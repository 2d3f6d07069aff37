//! What an isolated plugin's process gives up: in every mode the host's
//! environment and every capability; with `filesystem = "read-only"`
//! also every way around the Landlock rules this kernel has — metadata
//! calls, device nodes, sockets, `io_uring`, signals to other processes.
//!
//! Each attempt is made twice: by the plugin isolated without the
//! setting, where it works (so the attempt is real), and with it, where
//! it is refused. The attempts that need root to work skip, saying so,
//! when the tests do not run as root.

use std::path::Path;

use offstage_tests::hostile::{is_root, HostileServer};
use serde_json::{json, Value};

/// A file outside the plugin's data dir, the host's user's.
fn victim(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("victim.txt");
    std::fs::write(&path, "the host's").unwrap();
    path
}

/// The attempts on files and devices, by name, with their target.
fn file_attempts(
    host: &HostileServer,
    outside: &Path,
) -> Vec<(&'static str, Result<String, String>)> {
    let node = |name: &str| host.plugin_data().join(name);
    let attempts = vec![
        ("chmod", host.on("chmod", outside)),
        ("fchmod", host.on("fchmod", outside)),
        ("chown", host.on("chown", outside)),
        ("setxattr", host.on("setxattr", outside)),
        ("utimes", host.on("utimes", outside)),
        ("mknod-block", host.on("mknod-block", &node("disk"))),
        ("mknod-char", host.on("mknod-char", &node("null"))),
    ];
    let _ = std::fs::remove_file(node("disk"));
    let _ = std::fs::remove_file(node("null"));
    attempts
}

fn other_attempts(host: &HostileServer) -> Vec<(&'static str, Result<String, String>)> {
    let host_pid = host.server.pid();
    vec![
        (
            "socket-inet",
            host.attempt(json!({ "what": "socket-inet" })),
        ),
        (
            "socket-unix",
            host.attempt(json!({ "what": "socket-unix" })),
        ),
        (
            "socket-netlink",
            host.attempt(json!({ "what": "socket-netlink" })),
        ),
        ("io-uring", host.attempt(json!({ "what": "io-uring" }))),
        (
            "kill",
            host.attempt(json!({ "what": "kill", "pid": host_pid })),
        ),
    ]
}

/// The environment and capabilities the plugin's process has.
fn environment(host: &HostileServer) -> (Value, String) {
    let env = host.attempt(json!({ "what": "env" })).unwrap();
    let env: Value = serde_json::from_str(env.strip_prefix("ok: ").unwrap()).unwrap();
    let caps = host.attempt(json!({ "what": "caps" })).unwrap();
    (env, caps)
}

/// In any mode: only the documented variables, and no capability in any
/// set, the bounding set included.
fn assert_given_up(host: &HostileServer) {
    let (env, caps) = environment(host);
    let names: Vec<&String> = env.as_object().unwrap().keys().collect();
    for name in &names {
        assert!(
            [
                "PATH",
                "HOME",
                "USER",
                "LOGNAME",
                "LANG",
                "LC_ALL",
                "LC_CTYPE",
                "LC_MESSAGES",
                "TZ",
                "TMPDIR",
                "RUST_BACKTRACE"
            ]
            .contains(&name.as_str()),
            "the plugin's process has {name} in its environment: {env}"
        );
    }
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let line = caps.lines().find(|l| l.contains(set)).unwrap_or_default();
        assert!(line.ends_with("0000000000000000"), "{set}: {caps}");
    }
}

const SECRETS: &[(&str, &str)] = &[
    ("OFFSTAGE_TOKEN", "the-hosts-token"),
    ("AWS_SECRET_ACCESS_KEY", "a-secret"),
];

#[test]
fn read_only_refuses_every_way_around_it() {
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = victim(elsewhere.path());
    let host = HostileServer::start("filesystem = \"read-only\"", SECRETS);
    assert_eq!(host.plugin()["filesystem"], "read-only");
    assert_given_up(&host);
    for (what, outcome) in file_attempts(&host, &outside)
        .into_iter()
        .chain(other_attempts(&host))
    {
        let refused = outcome.expect_err(what);
        assert!(
            refused.contains("Operation not permitted") || refused.contains("Permission denied"),
            "{what}: {refused}"
        );
    }
    assert!(!host.plugin_data().join("disk").exists());
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "the host's");
    // The plugin still works in its own dir, and the host is untouched.
    let own = host.plugin_data().join("mine.txt");
    std::fs::write(&own, "x").unwrap();
    assert!(host.on("utimes", &own).is_err(), "times are metadata too");
    host.server.expect("GET", "/api/plugin", None, 200);
}

/// The same attempts without the setting: they work, so the refusals
/// above are the confinement's, and not a plugin that cannot do them.
#[test]
fn without_read_only_the_same_attempts_work_but_the_environment_and_capabilities_are_gone() {
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = victim(elsewhere.path());
    let host = HostileServer::start("", SECRETS);
    assert_eq!(host.plugin()["filesystem"], "unrestricted");
    assert_given_up(&host);
    for (what, outcome) in other_attempts(&host) {
        if what == "io-uring"
            && outcome
                .as_ref()
                .is_err_and(|e| e.contains("not implemented"))
        {
            continue; // a kernel without io_uring
        }
        outcome.unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    for (what, outcome) in file_attempts(&host, &outside) {
        match (what, outcome) {
            (_, Ok(_)) => {}
            // Capabilities are gone in every mode: root's powers over
            // other users' files and device nodes need them.
            ("mknod-block" | "mknod-char", Err(e)) => {
                assert!(e.contains("Operation not permitted"), "{what}: {e}")
            }
            ("setxattr", Err(e)) if e.contains("not supported") => {}
            (what, Err(e)) => panic!("{what}: {e}"),
        }
    }
    if !is_root() {
        eprintln!("not root: the host's capabilities were none to begin with");
    }
}

/// `network = "allow"`: sockets open, but abstract unix sockets outside
/// the process and signals stay confined (Landlock's scopes).
#[test]
fn network_allow_opens_sockets_but_not_abstract_unix_sockets_elsewhere() {
    let name = format!("offstage-test-{}", std::process::id());
    let address =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            &name,
        )
        .unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
    let host = HostileServer::start("filesystem = \"read-only\"\nnetwork = \"allow\"", &[]);
    host.attempt(json!({ "what": "socket-inet" })).unwrap();
    host.attempt(json!({ "what": "socket-unix" })).unwrap();
    let refused = host
        .attempt(json!({ "what": "connect-abstract", "name": name }))
        .unwrap_err();
    assert!(refused.contains("not permitted"), "{refused}");
    let kill = host.attempt(json!({ "what": "kill", "pid": host.server.pid() }));
    assert!(kill.is_err(), "{kill:?}");
    // Unrestricted, the same connect works.
    let open = HostileServer::start("", &[]);
    open.attempt(json!({ "what": "connect-abstract", "name": name }))
        .unwrap();
}
