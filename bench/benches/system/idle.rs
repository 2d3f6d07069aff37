//! `idle`: resident memory per idle session, 10 000 sessions in a real
//! `offstage serve`, against the same server empty.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use offstage_bench::{http::Conn, proc::rss_bytes};

use crate::{
    report::{header, kib, mib, ms, row},
    server::Server,
};

pub(crate) fn idle() {
    const SESSIONS: usize = 10_000;
    const CLIENTS: usize = 8;
    // Data dir on tmpfs where there is one: 10 000 durable commits on disk
    // take long and change nothing in the process's memory.
    let shm = Path::new("/dev/shm");
    let server = Server::start_in(shm.is_dir().then_some(shm), &[]);
    // Settle, then the empty server's resident memory.
    let mut conn = Conn::open(server.addr);
    for _ in 0..50 {
        conn.request("GET", "/api/health", None);
    }
    let sid = server.session(&mut conn);
    conn.request("GET", &format!("/api/session/{sid}"), None);
    std::thread::sleep(Duration::from_millis(300));
    let empty = rss_bytes(&server.pid());
    let start = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let addr = server.addr;
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                for _ in 0..SESSIONS / CLIENTS {
                    let answer = conn.request("POST", "/api/session", Some("{\"title\":\"idle\"}"));
                    assert_eq!(answer.status, 201, "{answer:?}");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let took = start.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    let full = rss_bytes(&server.pid());
    let listed = conn.request("GET", "/api/session", None).json();
    assert_eq!(listed.as_array().map(Vec::len), Some(SESSIONS + 1));
    let per = full.saturating_sub(empty) as f64 / SESSIONS as f64;
    println!(
        "\n## idle: resident memory of `offstage serve` with {SESSIONS} idle sessions (created over HTTP in {})\n",
        ms(took)
    );
    header();
    row(
        "VmRSS with 10 000 sessions",
        mib(full as f64),
        format!("{} (the same server, empty)", mib(empty as f64)),
        full as f64 / empty as f64,
        "≤ 4 KiB per idle session",
        per <= 4096.0,
    );
    println!(
        "\nPer idle session: {} (VmRSS delta / {SESSIONS}).",
        kib(per)
    );
}
