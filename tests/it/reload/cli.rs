//! Hot reload through `offstage serve`: `POST /api/plugin/NAME/reload`
//! with a call in flight, and `offstage plugin reload NAME`.

use offstage_tests::loader::lib_name;
use offstage_tests::reload::{stamp, Variant, PACKAGE};
use offstage_tests::server::{cli, Server};
use offstage_tests::wait::eventually;
use serde_json::{json, Value};

fn install(variant: Variant, dest: &std::path::Path) {
    let temp = dest.with_extension("partial");
    std::fs::copy(variant.library(), &temp).unwrap();
    std::fs::rename(&temp, dest).unwrap();
}

fn whoami(server: &Server, input: Value) -> Value {
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201);
    let tool = format!("/api/session/{}/tool", session["id"].as_str().unwrap());
    server.expect(
        "POST",
        &tool,
        Some(&json!({ "tool": "reloadable_whoami", "input": input })),
        200,
    )
}

#[test]
fn reload_over_the_api_and_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let dest = plugins.join(lib_name(PACKAGE));
    install(Variant::A, &dest);
    let server = std::sync::Arc::new(Server::start(&["--plugin-dir", plugins.to_str().unwrap()]));
    assert_eq!(whoami(&server, json!({}))["output"], stamp(Variant::A, 1));

    // A call holds generation 1 over HTTP while the API reloads.
    let gate = dir.path().join("gate");
    let held = {
        let (server, gate) = (server.clone(), gate.clone());
        std::thread::spawn(move || whoami(&server, json!({ "wait_for": gate })))
    };
    eventually("the held call to start", || {
        let jobs = server.expect("GET", "/api/job", None, 200);
        jobs.as_array()
            .unwrap()
            .iter()
            .any(|j| j["status"] == "running")
            .then_some(())
    });
    install(Variant::B, &dest);
    let mut events = server.events();
    let reloaded = server.expect("POST", "/api/plugin/reloadable/reload", None, 200);
    assert_eq!(reloaded["generation"], 2);
    assert_eq!(reloaded["status"], "loaded");
    let event = events.until("plugin.reloaded", |_| true);
    assert_eq!(event.last().unwrap()["properties"]["generation"], 2);
    assert_eq!(whoami(&server, json!({}))["output"], stamp(Variant::B, 2));
    std::fs::write(&gate, "").unwrap();
    let old = held.join().unwrap();
    assert_eq!(old["status"], "completed");
    assert_eq!(old["output"], stamp(Variant::A, 1));
    let listed = server.expect("GET", "/api/plugin", None, 200);
    assert_eq!(listed[0]["generation"], 2);

    // The CLI, with the token from the host's data dir: a broken build is refused and generation 2 keeps serving.
    let data = server.data_dir.to_str().unwrap();
    install(Variant::Broken, &dest);
    let (code, stdout, stderr) = cli(
        &[
            "plugin",
            "reload",
            "reloadable",
            "--server",
            &server.url,
            "--data-dir",
            data,
        ],
        &[],
    );
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(stderr.contains("broken on purpose"), "{stderr}");
    let listed = server.expect("GET", "/api/plugin", None, 200);
    assert_eq!(listed[0]["generation"], 2);
    assert_eq!(listed[0]["status"], "loaded");
    assert!(listed[0]["error"]
        .as_str()
        .unwrap()
        .contains("broken on purpose"));
    assert_eq!(whoami(&server, json!({}))["output"], stamp(Variant::B, 2));

    // Fixed: the broken attempt used generation 3.
    install(Variant::A, &dest);
    let (code, stdout, stderr) = cli(
        &[
            "plugin",
            "reload",
            "reloadable",
            "--server",
            &server.url,
            "--data-dir",
            data,
        ],
        &[],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("reloadable") && stdout.contains("generation 4"),
        "{stdout}"
    );
    let (code, stdout, stderr) = cli(
        &[
            "plugin",
            "reload",
            "reloadable",
            "--json",
            "--server",
            &server.url,
            "--data-dir",
            data,
        ],
        &[],
    );
    assert_eq!(code, 0, "{stdout}{stderr}");
    let info: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (info["generation"].clone(), info["error"].clone()),
        (json!(5), Value::Null)
    );
    assert_eq!(whoami(&server, json!({}))["output"], stamp(Variant::A, 4));

    let (code, _, stderr) = cli(
        &[
            "plugin",
            "reload",
            "nobody",
            "--server",
            &server.url,
            "--data-dir",
            data,
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("not_found") && stderr.contains("no plugin named `nobody`"),
        "{stderr}"
    );

    let server = std::sync::Arc::try_unwrap(server).ok().unwrap();
    let (status, stderr) = server.stop();
    assert!(status.success(), "{stderr}");
}
