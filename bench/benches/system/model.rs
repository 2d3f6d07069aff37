//! `model`: a model agent's streaming through Offstage against the same
//! request sent straight to the same local scripted Chat Completions
//! server (`offstage_tests::model`), five runs each after a warm-up:
//!
//! - time to the first delta: a prompt over HTTP until the first
//!   `message.delta` arrives on `GET /api/event`, vs the request sent
//!   straight to the server until its first content chunk arrives. The
//!   server waits 20 ms before its first chunk, a fast local model's time
//!   to its first token, so the ratio says what Offstage adds to a
//!   realistic wait (the absolute figures say it without one);
//! - a 2,000-delta answer end to end (1 ms between deltas, faster than any
//!   model streams): the prompt until its finished `message.added` on the
//!   event stream, every delta read on the way, vs the stream read
//!   straight to its `[DONE]`.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use offstage_bench::http::Conn;
use offstage_tests::{
    model::{ModelServer, Reply, Step},
    server::EventStream,
};
use serde_json::Value;

use crate::{report, server::Server};

const RUNS: usize = 5;
const FIRST_TOKEN: Duration = Duration::from_millis(20);
const LONG: usize = 2000;
const PACE: Duration = Duration::from_millis(1);

/// An answer of `deltas`, its first after `first`, the others `pace` apart.
fn answer(deltas: &[String], first: Duration, pace: Duration) -> Reply {
    let words: Vec<&str> = deltas.iter().map(String::as_str).collect();
    let Reply::Stream(steps) = Reply::text(&words) else {
        unreachable!("text is a stream")
    };
    let mut timed = vec![Step::Sleep(first)];
    let mut content = 0;
    for step in steps {
        if matches!(&step, Step::Chunk(c) if c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()))
        {
            if content > 0 && !pace.is_zero() {
                timed.push(Step::Sleep(pace));
            }
            content += 1;
        }
        timed.push(step);
    }
    Reply::Stream(timed)
}

/// Sends `body` straight to the model server; returns the time to the
/// first content chunk and to the end of the stream.
fn direct(model: &ModelServer, body: &Value) -> (Duration, Duration) {
    let body = body.to_string();
    let start = Instant::now();
    let mut stream = TcpStream::connect(model.addr).unwrap();
    stream.set_nodelay(true).unwrap();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        model.addr,
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0; 16384];
    let mut first = None;
    loop {
        let n = stream.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if first.is_none() && memfind(&seen, br#""content":"w"#) {
            first = Some(start.elapsed());
        }
    }
    let end = start.elapsed();
    assert!(memfind(&seen, b"[DONE]"), "the stream ended early");
    (first.expect("a content chunk"), end)
}

fn memfind(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Through Offstage: the prompt until the first delta and until the
/// finished message, both on the event stream.
fn through(conn: &mut Conn, events: &mut EventStream, session: &str) -> (Duration, Duration) {
    let start = Instant::now();
    conn.send(
        "POST",
        &format!("/api/session/{session}/prompt"),
        Some(r#"{"text":"go"}"#),
    );
    events.until("message.delta", |d| d["session_id"] == session);
    let first = start.elapsed();
    events.until("message.added", |m| {
        m["role"] == "assistant" && m["session_id"] == session
    });
    let end = start.elapsed();
    let answer = conn.recv();
    assert_eq!(answer.status, 200, "{}", answer.body);
    (first, end)
}

fn stats(mut runs: Vec<Duration>) -> (Duration, Duration, Duration) {
    runs.sort();
    (runs[runs.len() / 2], runs[0], runs[runs.len() - 1])
}

fn spread(runs: &[Duration]) -> String {
    let (median, low, high) = stats(runs.to_vec());
    format!(
        "{} ({}–{})",
        report::ms(median),
        report::ms(low),
        report::ms(high)
    )
}

pub(crate) fn model() {
    let model = ModelServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("offstage.toml");
    std::fs::write(
        &config,
        format!(
            "[sessions]\ndefault_agent = \"m\"\n[agent.m]\nprovider = \"openai\"\n\
             base_url = \"{}\"\nmodel = \"bench\"\n",
            model.base_url()
        ),
    )
    .unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let mut conn = Conn::open(server.addr);
    let session = conn.request("POST", "/api/session", Some("{}")).json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut events = EventStream::open(server.addr, &[]);

    println!(
        "\n## model: a model agent's stream through Offstage vs straight to the same scripted \
         Chat Completions server (median (min–max) of {RUNS} runs after a warm-up; first token \
         after {} ms; long answer 1 ms between deltas)\n",
        FIRST_TOKEN.as_millis()
    );
    report::header();
    for (name, deltas, first_token, pace) in [
        ("first delta", 2, FIRST_TOKEN, Duration::ZERO),
        (
            "first delta, no model wait",
            2,
            Duration::ZERO,
            Duration::ZERO,
        ),
        ("2,000-delta answer end to end", LONG, Duration::ZERO, PACE),
    ] {
        let words: Vec<String> = (0..deltas).map(|i| format!("w{i} ")).collect();
        let (mut via, mut straight) = (Vec::new(), Vec::new());
        for run in 0..=RUNS {
            model.script([answer(&words, first_token, pace)]);
            let (first, end) = through(&mut conn, &mut events, &session);
            let sent = model.requests().last().unwrap().body.clone();
            model.script([answer(&words, first_token, pace)]);
            let (direct_first, direct_end) = direct(&model, &sent);
            if run == 0 {
                continue;
            }
            if deltas == LONG {
                via.push(end);
                straight.push(direct_end);
            } else {
                via.push(first);
                straight.push(direct_first);
            }
        }
        let ratio = stats(via.clone()).0.as_secs_f64() / stats(straight.clone()).0.as_secs_f64();
        // The issue's first-delta target holds for both first-delta rows:
        // with a model that answers at once it measures Offstage alone.
        let (target, met) = if deltas == LONG {
            ("≤ 1.2×", ratio <= 1.2)
        } else {
            ("≤ 1.5×", ratio <= 1.5)
        };
        report::row(name, spread(&via), spread(&straight), ratio, target, met);
    }
    drop(server);
}
