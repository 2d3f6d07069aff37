//! `capture`: shell output capture throughput through the `shell` tool,
//! against `sh -c '... > file'` (and `| cat > file`) of the same bytes.

use std::{process::Command, time::Instant};

use offstage_bench::{median, service};
use offstage_plugin_api::types::{NewSession, ToolRequest, ToolStatus};
use serde_json::json;

use crate::report::{header, row};

pub(crate) async fn capture() {
    const MB: u64 = 200;
    const ROUNDS: usize = 3;
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path());
    let session = service.create(NewSession::default()).await.unwrap().id;
    let out = dir.path().join("direct.out");
    let command = format!("head -c {MB}M /dev/zero");
    let (mut direct, mut piped, mut tool) = (Vec::new(), Vec::new(), Vec::new());
    // MB/s of one shell command line that writes the bytes to `out`.
    let through_shell = |line: String| {
        let start = Instant::now();
        let status = Command::new("/bin/sh")
            .arg("-c")
            .arg(line)
            .status()
            .unwrap();
        assert!(status.success());
        let rate = MB as f64 / start.elapsed().as_secs_f64();
        assert_eq!(std::fs::metadata(&out).unwrap().len(), MB << 20);
        std::fs::remove_file(&out).unwrap();
        rate
    };
    for _ in 0..ROUNDS {
        direct.push(through_shell(format!("{command} > '{}'", out.display())));
        piped.push(through_shell(format!(
            "{command} | cat > '{}'",
            out.display()
        )));

        let start = Instant::now();
        let result = service
            .call_tool(
                &session,
                ToolRequest::new("shell", json!({ "command": command })),
            )
            .await
            .unwrap();
        tool.push(MB as f64 / start.elapsed().as_secs_f64());
        assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
        let path = result.output_path.unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            MB << 20,
            "all bytes captured"
        );
        std::fs::remove_file(path).unwrap();
    }
    let (direct, piped, tool) = (median(&mut direct), median(&mut piped), median(&mut tool));
    println!("\n## capture: `head -c {MB}M /dev/zero`, {ROUNDS} interleaved rounds, median\n");
    header();
    let ratio = tool / direct;
    row(
        "through the `shell` tool (output file + tail)",
        format!("{tool:.0} MB/s"),
        format!("{direct:.0} MB/s (`sh -c '... > file'`)"),
        ratio,
        "≥ 0.5× the shell redirect",
        ratio >= 0.5,
    );
    let ratio = tool / piped;
    row(
        "the same",
        format!("{tool:.0} MB/s"),
        format!("{piped:.0} MB/s (`sh -c '... \\| cat > file'`: a pipe, then a file)"),
        ratio,
        "≥ 0.7× a pipe into `cat`",
        ratio >= 0.7,
    );
}
