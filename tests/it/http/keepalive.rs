//! A refused request must not break its keep-alive connection: whatever the
//! server did not read of a body is read (bounded) before the answer goes
//! out, or the answer says `Connection: close`. Client libraries reuse
//! connections and do not retry a POST, so a silent close shows up as a
//! failed request (docs/contract.md, "Connections").

use std::{
    io::{BufReader, Read, Write},
    net::TcpStream,
};

use offstage_tests::server::{KeepAlive, Server, READ_TIMEOUT};
use serde_json::json;

const TOKEN: &str = "keepalive-token";

#[test]
fn a_thousand_refused_and_valid_requests_share_one_connection() {
    let server = Server::start_with_token(&[], TOKEN);
    let auth = format!("Bearer {TOKEN}");
    let auth = auth.as_str();
    let json = ("Content-Type", "application/json");
    // Large enough that the server cannot have read it by accident before
    // answering: the unread rest is what used to break the connection.
    let padding = "x".repeat(48 * 1024);
    let big = json!({ "title": padding }).to_string();
    let big = big.as_bytes();

    // (what, method, path, headers, body, expected status)
    type Case<'a> = (
        &'a str,
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        &'a [u8],
        u16,
    );
    let refused: Vec<Case<'_>> = vec![
        ("no token", "POST", "/api/session", vec![json], big, 401),
        (
            "foreign origin",
            "POST",
            "/api/session",
            vec![
                json,
                ("Authorization", auth),
                ("Origin", "http://evil.example"),
            ],
            big,
            403,
        ),
        (
            "unknown path",
            "POST",
            "/api/nothing",
            vec![json, ("Authorization", auth)],
            big,
            404,
        ),
        (
            "wrong method",
            "PUT",
            "/api/health",
            vec![json, ("Authorization", auth)],
            big,
            405,
        ),
        (
            "body the route ignores",
            "GET",
            "/api/plugin",
            vec![json, ("Authorization", auth)],
            big,
            200,
        ),
        (
            "interrupt with a body it does not read",
            "POST",
            "/api/session/ses_missing/interrupt",
            vec![json, ("Authorization", auth)],
            big,
            404,
        ),
        (
            "wrong content type",
            "POST",
            "/api/session",
            vec![("Content-Type", "text/plain"), ("Authorization", auth)],
            big,
            415,
        ),
    ];
    let small = br#"{"title":"kept alive"}"#;
    let valid: Vec<Case<'_>> = vec![
        (
            "create",
            "POST",
            "/api/session",
            vec![json, ("Authorization", auth)],
            small,
            201,
        ),
        ("health", "GET", "/api/health", vec![], b"", 200),
        (
            "list plugins",
            "GET",
            "/api/plugin",
            vec![("Authorization", auth)],
            b"",
            200,
        ),
    ];

    let mut connection = KeepAlive::connect(server.addr);
    let mut failures = Vec::new();
    for n in 0..1000 {
        let (what, method, path, headers, body, status) = if n % 2 == 0 {
            &refused[(n / 2) % refused.len()]
        } else {
            &valid[(n / 2) % valid.len()]
        };
        match connection.send(method, path, headers, body) {
            Err(error) => {
                failures.push(format!("#{n} {what}: {error}"));
                // Go on, on a new connection, to count every failure.
                connection = KeepAlive::connect(server.addr);
            }
            Ok(response) => {
                if response.status != *status {
                    failures.push(format!(
                        "#{n} {what}: status {} (expected {status}): {}",
                        response.status, response.body
                    ));
                }
                if let Some(close) = response.header("connection") {
                    failures.push(format!("#{n} {what}: Connection: {close}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 1000 requests failed on a keep-alive connection:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn a_body_too_large_to_drain_is_answered_with_connection_close() {
    let server = Server::start(&[]);
    // The head announces 3 MiB; only the start is sent before the answer
    // is read, as a client that waits to be told would.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let head = format!(
        "POST /api/session HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        server.addr,
        server.bearer(),
        3 * 1024 * 1024
    );
    stream.write_all(head.as_bytes()).unwrap();
    let _ = stream.write_all(&[b' '; 64 * 1024]);
    let mut answer = String::new();
    let _ = BufReader::new(&stream).read_to_string(&mut answer);
    let (head, body) = answer.split_once("\r\n\r\n").expect("an answer");
    assert!(head.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        head.to_ascii_lowercase().contains("\r\nconnection: close"),
        "{answer}"
    );
    assert!(body.contains("payload_too_large"), "{body}");
    // A new connection is served as usual.
    let mut connection = KeepAlive::connect(server.addr);
    let health = connection.send("GET", "/api/health", &[], b"").unwrap();
    assert_eq!(health.status, 200);
}
