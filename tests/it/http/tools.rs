//! `GET /api/tool` and `offstage tool list` on a real host: every tool
//! with its owner and input schema, a plugin's own schema in process and
//! isolated; and `shell`'s `background_after_ms`, a call that moves
//! itself to the background.

use offstage_tests::{
    install_plugin,
    server::{cli, write_file, Server},
};
use serde_json::{json, Value};

fn tool<'a>(tools: &'a Value, name: &str) -> &'a Value {
    tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {tools}"))
}

/// The tools of a host with the `hello` plugin, isolated or not.
fn tools_with_hello(isolated: bool) -> (Server, Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    install_plugin("offstage-test-hello", &plugins);
    let config = write_file(
        dir.path(),
        "offstage.toml",
        if isolated {
            "[plugins]\nisolation = \"process\"\n"
        } else {
            ""
        },
    );
    let server = Server::start(&[
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ]);
    let tools = server.expect("GET", "/api/tool", None, 200);
    (server, tools, dir)
}

#[test]
fn every_tool_is_listed_with_its_owner_and_input_schema() {
    for isolated in [false, true] {
        let (server, tools, _dir) = tools_with_hello(isolated);
        let names: Vec<&str> = tools
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["hello", "shell", "subagent"], "{tools}");

        let shell = tool(&tools, "shell");
        assert_eq!(shell["owner"], "host");
        assert_eq!(shell["input_schema"]["required"], json!(["command"]));
        assert_eq!(
            shell["input_schema"]["properties"]["background_after_ms"]["type"],
            "integer"
        );
        let subagent = tool(&tools, "subagent");
        assert_eq!(
            subagent["input_schema"]["required"],
            json!(["agent", "prompt"])
        );

        // The plugin's schema crossed the ABI (and, isolated, the channel).
        let hello = tool(&tools, "hello");
        assert_eq!(hello["owner"], "hello", "isolated: {isolated}");
        assert_eq!(hello["description"], "greets");
        assert_eq!(
            hello["input_schema"]["properties"]["name"]["type"], "string",
            "isolated: {isolated}"
        );

        // The document describes the route and its record.
        let document = server.expect("GET", "/api/openapi.json", None, 200);
        assert!(document["paths"]["/api/tool"]["get"].is_object());
        assert!(document["components"]["schemas"]["ToolInfo"].is_object());

        // The CLI lists the same, one line a tool and one for its input.
        let url = format!("http://{}", server.addr);
        // The CLI reads the host's token from its data dir, as a user's would.
        let data_dir = server.data_dir.to_str().unwrap().to_string();
        let (code, stdout, stderr) = cli(
            &["tool", "list", "--server", &url, "--data-dir", &data_dir],
            &[],
        );
        assert_eq!(code, 0, "{stderr}");
        assert!(
            stdout.contains("input: command*: string"),
            "command is shell's one required field: {stdout}"
        );
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("hello") && l.contains("greets")),
            "{stdout}"
        );
    }
}

#[test]
fn background_after_ms_moves_a_slow_call_and_leaves_a_quick_one() {
    let server = Server::start(&[]);
    let session = server.expect("POST", "/api/session", None, 201);
    let path = format!("/api/session/{}/tool", session["id"].as_str().unwrap());

    let quick = server.expect(
        "POST",
        &path,
        Some(&json!({ "tool": "shell", "input": { "command": "echo quick", "background_after_ms": 5000 } })),
        200,
    );
    assert_eq!(quick["status"], "completed", "{quick}");
    assert_eq!(quick["output"], "quick\n");

    let slow = server.expect(
        "POST",
        &path,
        Some(&json!({
            "tool": "shell",
            "input": { "command": "echo started; sleep 2; echo done", "background_after_ms": 300 },
        })),
        200,
    );
    assert_eq!(slow["status"], "backgrounded", "{slow}");
    assert!(
        slow["output"].as_str().unwrap().contains("started"),
        "{slow}"
    );
    // It runs on, and ends with its own exit code.
    let job = format!("/api/job/{}", slow["job_id"].as_str().unwrap());
    offstage_tests::wait::eventually("the moved job's end", || {
        let job = server.expect("GET", &job, None, 200);
        (job["status"] == "completed").then_some(job)
    });

    let clash = server.request(
        "POST",
        &path,
        Some(&json!({
            "tool": "shell",
            "input": { "command": "true", "background_after_ms": 1, "timeout_ms": 5 },
        })),
    );
    clash.assert_error(400, "bad_request");
}
