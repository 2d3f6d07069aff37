//! Whole-system benchmarks (HTTP, plugin load and reload, output capture, idle memory, mass background); see
//! BENCHMARKS.md. Run everything with `scripts/bench`, which builds the
//! release `offstage` binary first; one group:
//!
//! ```text
//! cargo build --release -p offstage --bin offstage
//! cargo bench -p offstage-bench --bench system -- http
//! ```
//!
//! Groups (every figure against a baseline measured in the same run):
//!
//! - `http`: a `POST /tool` held on one connection, released by
//!   `POST /background` from a second (baseline: `GET /api/health` round
//!   trip on the same server); requests/s on `GET /api/session/:id`
//!   (baseline: `GET /api/health`).
//! - `load`: `load_all` of 1, 10 and 100 distinct plugins in one dir
//!   (copies of `offstage-test-many`, name patched per copy); baseline:
//!   copying the same files and `dlopen`ing them bare.
//! - `reload`: `PluginHost::reload` latency and resident memory per
//!   reload; baselines: the first load of the same plugin, and its file
//!   size.
//! - `capture`: shell output capture throughput through the `shell` tool
//!   vs `sh -c '... > file'` of the same bytes.
//! - `idle`: resident memory per idle session with 10 000 sessions in a
//!   real `offstage serve` (baseline: the same server, empty).
//! - `mass`: 1 000 running `sleep 30` jobs in one session moved by one
//!   `background` call: time until every caller has returned (baseline:
//!   1 000 tasks released by one `watch` send); then all cancelled and
//!   no process left.
//!
//! - `model`: a model agent's time to the first `message.delta` (prompt
//!   over HTTP to the event stream) and a 2,000-delta answer end to end,
//!   vs the same request sent straight to the same local scripted Chat
//!   Completions server.
//! - `writer`: the group-commit store writer, data dir on disk (a temp dir
//!   on the same disk as the build): background → held answer vs a
//!   `GET /api/health` round trip sent after the same idle pause, once the
//!   job's process has started (it sleeps), for both durability levels,
//!   idle and
//!   with 8 sessions running shell calls; 1 000 jobs moved by one call
//!   (commits counted; five rounds, each on a fresh data dir, median and
//!   worst); shell calls/s of 8 sessions vs bare
//!   `tokio::process` with 8 concurrent, in alternating one-second rounds
//!   (the bare ones in a child process of the bench, which has no
//!   session service), median of the rounds' ratios. Its parts run alone as
//!   `writer_http`, `writer_mass` and `writer_throughput`.
//!
//! - `mcp`: a `shell true` call through `/mcp` (rmcp's client) vs the same
//!   call through `POST /api/session/:id/tool`; a held `tools/call` moved
//!   by the client's `background` call vs a `tools/list` round trip; five
//!   runs each, median and spread of the ratios.
//!
//! Each table row: figure, baseline, ratio, target, and whether it is met.
//!
//! One module per group (`http.rs`, `load.rs`, `reload.rs`, `capture.rs`,
//! `idle.rs`, `mass.rs`, `mcp.rs`, `model.rs`, `writer.rs`); what several share is in
//! `report.rs` (the tables), `server.rs` (a release `offstage serve`) and
//! `plugins.rs` (plugin files to load).

mod capture;
mod http;
mod idle;
mod load;
mod mass;
mod mcp;
mod model;
mod plugins;
mod reload;
mod report;
mod server;
mod writer;

use std::{path::Path, time::Duration};

use offstage_bench::{CpuTime, MachineCpu};

use capture::capture;
use http::{http_background, http_rate};
use idle::idle;
use load::load;
use mass::mass;
use mcp::mcp;
use model::model;
use reload::reload;
use server::Server;
use writer::{bare_round, writer_http, writer_mass, writer_throughput, BARE_ROUND_VAR};

fn main() {
    if let Some(ms) = std::env::var_os(BARE_ROUND_VAR) {
        let time = Duration::from_millis(ms.to_str().and_then(|m| m.parse().ok()).unwrap());
        let runtime = offstage_bench::runtime();
        let (before, machine_before) = (CpuTime::now(), MachineCpu::now());
        let calls = runtime.block_on(bare_round(time));
        let used = CpuTime::now().since(before);
        let machine = MachineCpu::now().since(machine_before);
        println!(
            "{calls} {} {} {} {} {}",
            used.own.as_micros(),
            used.children.as_micros(),
            machine.idle,
            machine.steal,
            machine.total
        );
        return;
    }
    let wanted = offstage_bench::group_filter();
    let runtime = offstage_bench::runtime();
    println!(
        "# offstage system benchmarks ({} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if wanted("http") {
        let server = Server::start(&[]);
        let shm = Path::new("/dev/shm");
        let tmpfs = shm.is_dir().then(|| Server::start_in(Some(shm), &[]));
        http_background(&server, tmpfs.as_ref());
        http_rate(&server);
    }
    if wanted("writer_http") {
        writer_http();
    }
    if wanted("model") {
        model();
    }
    if wanted("idle") {
        idle();
    }
    runtime.block_on(async {
        if wanted("load") {
            load().await;
        }
        if wanted("reload") {
            reload().await;
        }
        if wanted("capture") {
            capture().await;
        }
        if wanted("mass") {
            mass().await;
        }
        if wanted("writer_mass") {
            writer_mass().await;
        }
        if wanted("writer_throughput") {
            writer_throughput().await;
        }
        if wanted("mcp") {
            mcp().await;
        }
    });
}
