//! `reload`: `PluginHost::reload` latency and resident memory per reload,
//! against the first load of the same plugin and its file size.

use std::time::Instant;

use offstage::PluginStatus;
use offstage_bench::{proc::rss_bytes, service, summarize};
use offstage_plugin_api::types::{NewSession, ToolRequest};
use serde_json::json;

use crate::{
    plugins::{build_plugin, many_copies, plugin_host},
    report::{header, kib, mib, ms, row},
};

pub(crate) async fn reload() {
    const RELOADS: usize = 40;
    let library = std::fs::read(build_plugin("offstage-test-many")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    let files = many_copies(&library, &plugins, "r", 1);
    let name = "many-r0000";
    let service = service(dir.path());
    let host = plugin_host(&service, &plugins, &dir.path().join("data"));
    let start = Instant::now();
    let loaded = host.load_all();
    let first = start.elapsed();
    assert_eq!(loaded[0].status, PluginStatus::Loaded, "{loaded:#?}");
    let session = service.create(NewSession::default()).await.unwrap().id;
    // Warm-up reloads, then measure latency and memory.
    for _ in 0..5 {
        host.reload(name).expect("reload");
    }
    let rss_before = rss_bytes("self");
    let mut times = Vec::with_capacity(RELOADS);
    for _ in 0..RELOADS {
        let start = Instant::now();
        let info = host.reload(name).expect("reload");
        times.push(start.elapsed());
        assert_eq!(info.status, PluginStatus::Loaded);
        // The new generation serves.
        let result = service
            .call_tool(&session, ToolRequest::new(name, json!({})))
            .await
            .unwrap();
        assert_eq!(result.output, "ok");
    }
    let rss_after = rss_bytes("self");
    let times = summarize(&mut times);
    let per_reload = rss_after.saturating_sub(rss_before) as f64 / RELOADS as f64;
    println!(
        "\n## reload: `PluginHost::reload` of one plugin ({} file), {RELOADS} reloads after 5 warm-up ones\n",
        mib(library.len() as f64)
    );
    header();
    let ratio = times.median.as_secs_f64() / first.as_secs_f64();
    row(
        "reload latency, median",
        ms(times.median),
        format!("{} (first load of the same plugin)", ms(first)),
        ratio,
        "≤ 2× the first load",
        ratio <= 2.0,
    );
    let ratio = per_reload / library.len() as f64;
    row(
        "resident memory per reload (VmRSS delta / reloads)",
        kib(per_reload),
        format!("{} (the plugin file)", kib(library.len() as f64)),
        ratio,
        "≤ 1.5× the file size (the old image stays mapped, by design)",
        ratio <= 1.5,
    );
    println!(
        "\n(p99 reload {}; generation after the run: {}.)",
        ms(times.p99),
        host.get(name).unwrap().generation
    );
    drop(files);
    host.shutdown();
}
