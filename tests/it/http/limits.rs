//! Clients that stall cannot hold the host: a request head, a request body
//! and an idle keep-alive connection each have a timeout, open connections
//! are capped, and past the cap a client is told so (503) instead of
//! waiting unanswered (docs/contract.md, "Connections"; README,
//! "Operations"). Against a real `offstage serve`.

use std::{
    io::{ErrorKind, Read, Write},
    net::TcpStream,
    thread,
    time::Duration,
};

use offstage_tests::{
    server::{http, write_file, Server, READ_TIMEOUT},
    wait::{eventually, PATIENCE},
};

/// Reads until the server closes `stream`; returns what it sent. Fails
/// the test if the server keeps it open for [`READ_TIMEOUT`].
fn read_until_closed(stream: &mut TcpStream, what: &str) -> String {
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            // Closed with our unread bytes in its buffer: a reset.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{what}: the server kept the connection open ({e})"),
        }
    }
    String::from_utf8_lossy(&received).into_owned()
}

fn connect(server: &Server, first_bytes: &str) -> TcpStream {
    let mut stream = TcpStream::connect(server.addr).unwrap();
    if !first_bytes.is_empty() {
        stream.write_all(first_bytes.as_bytes()).unwrap();
    }
    stream
}

#[test]
fn stalled_clients_are_closed_and_others_still_get_answers() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[http]\nfirst_byte_timeout = \"1s\"\nheader_timeout = \"1s\"\nbody_timeout = \"1s\"\nidle_timeout = \"2s\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let host = server.addr.to_string();
    let auth = server.bearer();

    let half_heads: Vec<TcpStream> = (0..300)
        .map(|_| {
            connect(
                &server,
                &format!("GET /api/health HTTP/1.1\r\nHost: {host}\r\nX-Slow: "),
            )
        })
        .collect();
    let half_bodies: Vec<TcpStream> = (0..50)
        .map(|_| {
            connect(
                &server,
                &format!(
                    "POST /api/session HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"title\": "
                ),
            )
        })
        .collect();
    let idle: Vec<TcpStream> = (0..50).map(|_| connect(&server, "")).collect();
    // A head trickled a byte at a time never goes quiet, so only a bound
    // from its first byte ends it.
    let mut trickle = connect(
        &server,
        &format!("GET /api/health HTTP/1.1\r\nHost: {host}\r\nX-Trickle: "),
    );
    let mut trickling = trickle.try_clone().unwrap();
    let writer = thread::spawn(move || {
        let deadline = std::time::Instant::now() + PATIENCE;
        while std::time::Instant::now() < deadline {
            if trickling.write_all(b"a").is_err() {
                return true;
            }
            thread::sleep(Duration::from_millis(50));
        }
        false
    });

    // Meanwhile the host answers everyone else.
    server.expect("GET", "/api/session", None, 200);

    for mut stream in half_heads {
        let sent = read_until_closed(&mut stream, "a half-sent head");
        assert!(sent.is_empty() || sent.starts_with("HTTP/1.1 4"), "{sent}");
    }
    for mut stream in half_bodies {
        let sent = read_until_closed(&mut stream, "a half-sent body");
        assert!(sent.starts_with("HTTP/1.1 408"), "{sent}");
        assert!(sent.contains("request_timeout"), "{sent}");
        assert!(
            sent.to_ascii_lowercase().contains("connection: close"),
            "{sent}"
        );
    }
    for mut stream in idle {
        read_until_closed(&mut stream, "an idle connection");
    }
    read_until_closed(&mut trickle, "a trickled head");
    assert!(
        writer.join().unwrap(),
        "the trickled head was never cut off"
    );

    // And after all of that, a new client is served.
    server.expect("GET", "/api/health", None, 200);
    server.expect("POST", "/api/session", Some(&serde_json::json!({})), 201);
}

#[test]
fn past_the_connection_cap_clients_get_503_until_a_slot_frees() {
    let dir = tempfile::tempdir().unwrap();
    // Timeouts far longer than the test: only the cap is at work here.
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[http]\nmax_connections = 8\nheader_timeout = \"10m\"\nidle_timeout = \"10m\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let held: Vec<TcpStream> = (0..8)
        .map(|_| connect(&server, "GET /api/health HTTP/1.1\r\n"))
        .collect();

    let refused = http(server.addr, "GET", "/api/health", &[], b"");
    refused.assert_error(503, "too_many_connections");
    assert_eq!(refused.header("connection"), Some("close"));
    assert!(refused.header("retry-after").is_some());

    // A held client leaves: its slot serves the next one.
    drop(held);
    eventually("a connection slot to free up", || {
        let response = http(server.addr, "GET", "/api/health", &[], b"");
        (response.status == 200).then_some(())
    });

    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("open-file limit"), "{log}");
    assert!(log.contains("connection cap reached"), "{log}");
}

#[test]
fn near_its_open_file_limit_the_host_keeps_answering() {
    // 128 descriptors in all: the cap comes down to 64 connections, and
    // what is left serves the store, the runtime and the refusals.
    let dir = tempfile::tempdir().unwrap();
    // Timeouts far longer than the test: the held clients stay.
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[http]\nheader_timeout = \"10m\"\nidle_timeout = \"10m\"\n",
    );
    let server = Server::start_with_open_files(&["--config", config.to_str().unwrap()], 128);
    let host = server.addr.to_string();
    let held: Vec<TcpStream> = (0..64)
        .map(|_| {
            connect(
                &server,
                &format!("GET /api/health HTTP/1.1\r\nHost: {host}\r\n"),
            )
        })
        .collect();
    // Far more clients than descriptors: each is answered, none hangs.
    for _ in 0..200 {
        let response = http(server.addr, "GET", "/api/health", &[], b"");
        assert!(
            response.status == 503 || response.status == 200,
            "{}: {}",
            response.status,
            response.body
        );
    }
    let refused = http(server.addr, "GET", "/api/health", &[], b"");
    refused.assert_error(503, "too_many_connections");
    // The held ones were served all along: each completes its request.
    for mut stream in held {
        stream.write_all(b"Connection: close\r\n\r\n").unwrap();
        let answer = read_until_closed(&mut stream, "a held connection");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    eventually("a slot to free up", || {
        (http(server.addr, "GET", "/api/health", &[], b"").status == 200).then_some(())
    });
    server.expect("POST", "/api/session", Some(&serde_json::json!({})), 201);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("max_connections lowered from 1024 to 64"),
        "{log}"
    );
}

/// Raises this test process's soft open-file limit to its hard limit, so
/// that it can hold thousands of sockets; the hard limit, which must
/// allow `needed`.
fn allow_open_files(needed: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid `rlimit` to fill and then to read.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    assert!(
        limit.rlim_max >= needed,
        "this test needs {needed} open files; the hard limit is {}",
        limit.rlim_max
    );
}

/// Whatever `stream` has received so far, without waiting.
fn received(stream: &TcpStream) -> String {
    stream.set_nonblocking(true).unwrap();
    let mut text = Vec::new();
    let mut buffer = [0u8; 4096];
    let mut reader = stream;
    while let Ok(n) = reader.read(&mut buffer) {
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8_lossy(&text).into_owned()
}

#[test]
fn idle_sockets_cannot_lock_a_real_client_out() {
    allow_open_files(2_200);
    // The default config: 1,024 connections, and a first byte within 5 s.
    let server = Server::start(&[]);
    // 2,000 sockets that never send a byte, from the client's own address.
    let idle: Vec<TcpStream> = (0..2_000)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    let asked = std::time::Instant::now();
    let response = server.request("GET", "/api/session", None);
    let took = asked.elapsed();
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(took < Duration::from_secs(1), "served after {took:?}");
    // The idle sockets were closed to make room, never refused: no 503
    // reached any of them.
    let refused = idle
        .iter()
        .filter(|stream| received(stream).starts_with("HTTP/1.1 503"))
        .count();
    assert_eq!(refused, 0);
    drop(idle);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn a_refusal_is_a_503_every_client_reads() {
    let dir = tempfile::tempdir().unwrap();
    // Every slot busy reading a head, for longer than the test.
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[http]\nmax_connections = 8\nheader_timeout = \"10m\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let _busy: Vec<TcpStream> = (0..8)
        .map(|_| connect(&server, "GET /api/health HTTP/1.1\r\n"))
        .collect();
    // Many at once, each sending a whole request: every one reads its
    // 503, none gets a reset or a bare close.
    let clients: Vec<_> = (0..300)
        .map(|_| {
            let addr = server.addr;
            thread::spawn(move || {
                let mut stream = TcpStream::connect(addr).unwrap();
                let _ = stream.write_all(
                    format!("GET /api/health HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
                );
                read_until_closed(&mut stream, "a refused client")
            })
        })
        .collect();
    let answers: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let read_503 = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 503") && a.contains("too_many_connections"))
        .count();
    assert_eq!(
        read_503,
        300,
        "{:?}",
        answers.iter().find(|a| !a.starts_with("HTTP/1.1 503"))
    );
}

#[test]
fn a_connection_must_send_its_first_byte_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_file(
        dir.path(),
        "offstage.toml",
        "[http]\nfirst_byte_timeout = \"300ms\"\nidle_timeout = \"10m\"\n",
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let opened = std::time::Instant::now();
    let mut silent = connect(&server, "");
    read_until_closed(&mut silent, "a silent connection");
    assert!(
        opened.elapsed() < Duration::from_secs(5),
        "{:?}",
        opened.elapsed()
    );
    // Once a connection sent a request, keep-alive waits are idle_timeout's.
    let mut used = offstage_tests::server::KeepAlive::connect(server.addr);
    used.send("GET", "/api/health", &[], b"").unwrap();
    thread::sleep(Duration::from_millis(600));
    let again = used.send("GET", "/api/health", &[], b"").unwrap();
    assert_eq!(again.status, 200);
}

/// A host whose open-file limit (soft and hard) is 1024 caps its running
/// tool calls (`[jobs] max_running`, worked out from the limit): past the
/// cap a call is refused `503 busy` with `Retry-After` before it is a job,
/// no job fails for want of descriptors, and once jobs end calls are
/// taken again.
#[cfg(unix)]
#[test]
fn at_the_job_cap_tool_calls_get_503_busy_not_failed_jobs() {
    let server = Server::start_with_open_files(&[], 1024);
    let session = server.expect("POST", "/api/session", Some(&serde_json::json!({})), 201);
    let session = session["id"].as_str().unwrap().to_string();
    let path = format!("/api/session/{session}/tool");
    // Each job writes (so its output file is open) and then waits.
    let call = |id: &str| {
        server.request(
            "POST",
            &path,
            Some(&serde_json::json!({
                "tool": "shell",
                "call_id": id,
                "input": { "command": "echo up; sleep 60", "background": true },
            })),
        )
    };
    let assert_busy = |response: &offstage_tests::server::Response| {
        response.assert_error(503, "busy");
        assert_eq!(
            response.header("retry-after"),
            Some("1"),
            "{:?}",
            response.headers
        );
    };
    // Callers at once, each calling until it is refused.
    let (started, refused): (Vec<Vec<String>>, Vec<_>) = thread::scope(|scope| {
        let callers: Vec<_> = (0..8)
            .map(|caller| {
                let call = &call;
                scope.spawn(move || {
                    let mut started = Vec::new();
                    for n in 0..400 {
                        let id = format!("cap_{caller}_{n}");
                        let response = call(&id);
                        if response.status != 200 {
                            return (started, response);
                        }
                        started.push(id);
                    }
                    panic!("400 calls of caller {caller} and never a refusal");
                })
            })
            .collect();
        callers.into_iter().map(|c| c.join().unwrap()).unzip()
    });
    for response in &refused {
        assert_busy(response);
    }
    let started: Vec<String> = started.into_iter().flatten().collect();
    assert!(started.len() >= 8, "only {} calls taken", started.len());
    // At the cap, every call is refused, and is no job.
    for n in 0..20 {
        assert_busy(&call(&format!("over_{n}")));
    }
    let jobs = server.expect("GET", &format!("/api/job?session_id={session}"), None, 200);
    let jobs = jobs.as_array().unwrap();
    assert_eq!(jobs.len(), started.len(), "a refused call left a job");
    assert!(
        jobs.iter().all(|job| job["status"] == "running"),
        "{:?}",
        jobs.iter()
            .filter(|job| job["status"] != "running")
            .collect::<Vec<_>>()
    );
    // One job cancelled: its place is free once it has ended.
    server.expect("DELETE", &format!("/api/job/{}", started[0]), None, 200);
    let again = eventually("a call taken after a job ended", || {
        let response = call("after_cancel");
        (response.status != 503).then_some(response)
    });
    assert_eq!(again.status, 200, "{}", again.body);
    assert_busy(&call("over_again"));
    // None of them ended as an error: each is cancelled by its caller.
    for id in started
        .iter()
        .skip(1)
        .chain(["after_cancel".to_string()].iter())
    {
        server.expect("DELETE", &format!("/api/job/{id}"), None, 200);
    }
    let jobs = server.expect("GET", &format!("/api/job?session_id={session}"), None, 200);
    let errors: Vec<_> = jobs
        .as_array()
        .unwrap()
        .iter()
        .filter(|job| job["status"] == "error")
        .collect();
    assert!(errors.is_empty(), "jobs ended as errors: {errors:?}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(
        log.contains(&format!("max_running={}", started.len())),
        "{} calls taken; {log}",
        started.len()
    );
}
