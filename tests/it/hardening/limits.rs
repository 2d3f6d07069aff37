//! Bounded resources and small failures against a real `offstage serve`:
//! a job's output file stops at `[jobs] max_output` while the job goes on;
//! a job whose output file is gone answers 410, not 500.

use offstage_tests::{
    server::{write_file, Server},
    wait::eventually,
};
use serde_json::{json, Value};

const CAP: u64 = 64 * 1024;
/// Far more than [`CAP`], then a last line that only a job that went on
/// past the cap can print.
const FLOOD: &str = "yes offstage-flood | head -c 5000000; echo END-OF-FLOOD";

fn capped_server() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[jobs]\nmax_output = \"64KiB\"\n",
    );
    (Server::start(&["--config", config.to_str().unwrap()]), dir)
}

fn session(server: &Server) -> String {
    server.expect("POST", "/api/session", Some(&json!({})), 201)["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The marker line the tail starts with when output went past the cap.
fn says_cut(text: &str) {
    assert!(
        text.contains("output cut") && text.contains("max_output"),
        "the text does not say the output was cut: {}",
        &text[..text.len().min(400)]
    );
}

#[test]
fn output_past_max_output_is_not_saved_and_the_job_goes_on() {
    let (server, _dir) = capped_server();
    let session = session(&server);

    let result = server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": FLOOD }, "call_id": "job_flood" })),
        200,
    );
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["exit_code"], 0);
    let output = result["output"].as_str().unwrap();
    says_cut(output);
    assert!(output.ends_with("END-OF-FLOOD\n"), "the job went on");

    let path = result["output_path"].as_str().unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().len(), CAP);
    // Paging the file ends at the cap.
    let page = server.expect(
        "GET",
        "/api/job/job_flood/output?offset=0&limit=4194304",
        None,
        200,
    );
    assert_eq!(page["next_offset"], CAP);
    assert_eq!(page["eof"], true);
    assert!(page["data"]
        .as_str()
        .unwrap()
        .starts_with("offstage-flood\n"));

    // In the background, the notice says so too.
    let started = server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({
            "tool": "shell",
            "input": { "command": FLOOD, "background": true },
            "call_id": "job_flood_bg",
        })),
        200,
    );
    assert_eq!(started["status"], "backgrounded");
    let notice: Value = eventually("the notice", || {
        let messages = server.expect("GET", &format!("/api/session/{session}/message"), None, 200);
        messages
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "notice" && m["metadata"]["job_id"] == "job_flood_bg")
            .cloned()
    });
    assert_eq!(notice["metadata"]["state"], "completed");
    says_cut(notice["text"].as_str().unwrap());
    let job = server.expect("GET", "/api/job/job_flood_bg", None, 200);
    let path = job["output_path"].as_str().unwrap();
    assert_eq!(std::fs::metadata(path).unwrap().len(), CAP);
}

#[test]
fn max_output_that_is_not_a_size_stops_the_start_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[jobs]\nmax_output = \"lots\"\n",
    );
    let (code, _out, err) = offstage_tests::server::cli(
        &[
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("max_output") && err.contains("64MiB"), "{err}");
}

/// An output file deleted (or replaced by a directory) behind the host's
/// back is a 404 naming the job, not a 500; the host keeps serving.
#[test]
fn a_job_whose_output_file_is_gone_answers_404() {
    let server = Server::start(&[]);
    let session = session(&server);
    let result = server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(
            &json!({ "tool": "shell", "input": { "command": "echo gone" }, "call_id": "job_gone" }),
        ),
        200,
    );
    let path = std::path::PathBuf::from(result["output_path"].as_str().unwrap());
    assert_eq!(
        server.expect("GET", "/api/job/job_gone/output", None, 200)["data"],
        "gone\n"
    );

    std::fs::remove_file(&path).unwrap();
    let answer = server.request("GET", "/api/job/job_gone/output", None);
    answer.assert_error(404, "not_found");
    assert!(answer.body.contains("job_gone"), "{}", answer.body);

    std::fs::create_dir(&path).unwrap();
    server
        .request("GET", "/api/job/job_gone/output", None)
        .assert_error(404, "not_found");

    // The job itself is still there, and the host still serves.
    assert_eq!(
        server.expect("GET", "/api/job/job_gone", None, 200)["status"],
        "completed"
    );
}
