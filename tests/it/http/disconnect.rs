//! A client that disconnects while its `POST /api/session/:id/tool` waits
//! on a foreground job: the job goes on in the background and its end
//! reaches the session as the usual notice (nothing is lost), against the
//! real `offstage serve`.

use std::{
    io::Write,
    net::{Shutdown, TcpStream},
};

use offstage_tests::{server::Server, wait::eventually};
use serde_json::{json, Value};

#[test]
fn a_disconnected_tool_call_moves_its_job_to_the_background() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("flag");
    let session = server.expect("POST", "/api/session", Some(&json!({})), 201);
    let id = session["id"].as_str().unwrap();

    // The call, on a connection this test then closes.
    let body = json!({
        "tool": "shell",
        "call_id": "job_disconnected",
        "input": { "command": format!("while [ ! -e '{}' ]; do sleep 0.02; done; echo finished", flag.display()) },
    })
    .to_string();
    let mut stream = TcpStream::connect(server.addr).unwrap();
    write!(
        stream,
        "POST /api/session/{id}/tool HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr,
        server.bearer(),
        body.len()
    )
    .unwrap();
    eventually("the job to run in the foreground", || {
        let job = server.request("GET", "/api/job/job_disconnected", None);
        (job.status == 200 && job.json()["status"] == "running").then_some(())
    });
    let session_now = server.expect("GET", &format!("/api/session/{id}"), None, 200);
    assert_eq!(session_now["status"], "busy", "a caller is blocked");
    stream.shutdown(Shutdown::Both).unwrap();
    drop(stream);

    let job = eventually("the move to the background", || {
        let job = server.expect("GET", "/api/job/job_disconnected", None, 200);
        (job["backgrounded"] == true).then_some(job)
    });
    assert_eq!(job["status"], "running", "the job goes on");
    std::fs::write(&flag, "").unwrap();
    let notice: Value = eventually("the job's notice", || {
        let messages = server.expect("GET", &format!("/api/session/{id}/message"), None, 200);
        messages
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "notice" && m["metadata"]["job_id"] == "job_disconnected")
            .cloned()
    });
    assert_eq!(notice["metadata"]["state"], "completed");
    assert!(
        notice["text"].as_str().unwrap().contains("finished"),
        "{notice}"
    );
    let job = server.expect("GET", "/api/job/job_disconnected", None, 200);
    assert_eq!(job["status"], "completed");
}
