//! `load`: `PluginHost::load_all` of 1, 10 and 100 distinct plugins in one
//! dir, against copying the same files and `dlopen`ing them bare.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use offstage::PluginStatus;
use offstage_bench::service;

use crate::{
    plugins::{build_plugin, many_copies, plugin_host},
    report::{header, mib, ms, row},
};

/// The bare cost: copy each file to a private path (with `fsync` if
/// asked, as the loader does) and `dlopen` it.
fn bare_dlopen(files: &[PathBuf], scratch: &Path, fsync: bool) -> Duration {
    std::fs::create_dir_all(scratch).unwrap();
    let start = Instant::now();
    for file in files {
        let copy = scratch.join(file.file_name().unwrap());
        std::fs::copy(file, &copy).unwrap();
        if fsync {
            std::fs::File::open(&copy).unwrap().sync_all().unwrap();
        }
        let path = std::ffi::CString::new(copy.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; the handle is deliberately leaked, as
        // abi_stable leaks every library it opens.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen {}", copy.display());
    }
    start.elapsed()
}

pub(crate) async fn load() {
    let library = std::fs::read(build_plugin("offstage-test-many")).unwrap();
    println!(
        "\n## load: `PluginHost::load_all` of N distinct plugins in one dir (copies of `offstage-test-many`, {} each, name patched per copy)\n",
        mib(library.len() as f64)
    );
    header();
    {
        // Warm-up: the first load in a process pays one-time costs (the
        // runtime's first plugin, abi_stable's first layout checks).
        let dir = tempfile::tempdir().unwrap();
        many_copies(&library, &dir.path().join("plugins"), "w", 1);
        let service = service(dir.path());
        let host = plugin_host(
            &service,
            &dir.path().join("plugins"),
            &dir.path().join("data"),
        );
        assert_eq!(host.load_all()[0].status, PluginStatus::Loaded);
        host.shutdown();
    }
    for (round, n) in [1usize, 10, 100].into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let files = many_copies(
            &library,
            &dir.path().join("plugins"),
            &format!("{round}l"),
            n,
        );
        let bare_files = many_copies(&library, &dir.path().join("bare"), &format!("{round}b"), n);
        let bare = bare_dlopen(&bare_files, &dir.path().join("bare-copies"), false);
        let synced = bare_dlopen(&bare_files, &dir.path().join("synced-copies"), true);
        let service = service(dir.path());
        let host = plugin_host(
            &service,
            &dir.path().join("plugins"),
            &dir.path().join("data"),
        );
        let start = Instant::now();
        let loaded = host.load_all();
        let took = start.elapsed();
        assert_eq!(loaded.len(), n);
        assert!(
            loaded.iter().all(|i| i.status == PluginStatus::Loaded),
            "{:#?}",
            loaded.iter().find(|i| i.status != PluginStatus::Loaded)
        );
        assert_eq!(files.len(), n);
        let ratio = took.as_secs_f64() / bare.as_secs_f64();
        row(
            &format!("{n} plugin(s), total (per plugin {})", ms(took / n as u32)),
            ms(took),
            format!("{} (copy + bare `dlopen`)", ms(bare)),
            ratio,
            "≤ 3× bare, and ≤ 10 ms per plugin",
            ratio <= 3.0 && took / (n as u32) <= Duration::from_millis(10),
        );
        // Reference, no target: how much of the load is the file work the
        // loader does (it `fsync`s each private copy).
        println!(
            "| {n} plugin(s), the same load | {} | {} (copy + `fsync` + bare `dlopen`) | {:.2} | — (reference) | — |",
            ms(took),
            ms(synced),
            took.as_secs_f64() / synced.as_secs_f64()
        );
        host.shutdown();
    }
}
