//! A release `offstage serve` as a child of the bench, for the groups
//! that measure the whole server over HTTP (`http`, `idle`, `writer`),
//! and where the workspace keeps its build output.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use offstage_bench::http::Conn;

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// A release `offstage serve` on a free loopback port with its own data dir.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    _data: tempfile::TempDir,
}

impl Server {
    pub(crate) fn start(args: &[&str]) -> Server {
        Self::start_in(None, args)
    }

    /// With its data dir under `base` (e.g. tmpfs, where fsync is free).
    pub(crate) fn start_in(base: Option<&Path>, args: &[&str]) -> Server {
        let binary = std::env::var_os("OFFSTAGE_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("release").join("offstage"));
        assert!(
            binary.exists(),
            "{} missing: run `cargo build --release -p offstage --bin offstage` (scripts/bench does)",
            binary.display()
        );
        let data = match base {
            Some(base) => tempfile::tempdir_in(base).unwrap(),
            None => tempfile::tempdir().unwrap(),
        };
        let mut child = Command::new(&binary)
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data.path().join("data"))
            // The benches' raw connections send no token: what they
            // measure is the server, not one header's comparison.
            .arg("--no-token")
            .args(args)
            .env_remove("OFFSTAGE_TOKEN")
            .env("OFFSTAGE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start offstage serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("offstage serve did not start: {line:?}"))
            .to_string();
        std::thread::spawn(move || {
            let mut sink = String::new();
            while stdout.read_line(&mut sink).unwrap_or(0) > 0 {
                sink.clear();
            }
        });
        Server {
            child,
            addr: url.parse().unwrap(),
            _data: data,
        }
    }

    pub(crate) fn pid(&self) -> String {
        self.child.id().to_string()
    }

    pub(crate) fn session(&self, conn: &mut Conn) -> String {
        let answer = conn.request("POST", "/api/session", Some("{}"));
        assert_eq!(answer.status, 201, "{answer:?}");
        answer.json()["id"].as_str().unwrap().to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
