//! Plugin files for the `load` and `reload` groups: the `many` test
//! plugin built in release, copied under distinct names, and a plugin host
//! over the dir they are in.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use offstage::{PluginHost, PluginHostConfig, PluginSettings, SessionService};

use crate::server::{target_dir, workspace_root};

pub(crate) fn build_plugin(package: &str) -> PathBuf {
    let target = target_dir().join("bench-plugins");
    let status = Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            package,
            "--target-dir",
        ])
        .arg(&target)
        .status()
        .expect("run cargo");
    assert!(status.success(), "building {package} failed");
    target.join("release").join(format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        package.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    ))
}

const PLACEHOLDER: &[u8; 32] = b"many-###########################";

/// Copies of the `many` plugin into `dir` named `many-{prefix}{i}`, mode 0755.
pub(crate) fn many_copies(library: &[u8], dir: &Path, prefix: &str, n: usize) -> Vec<PathBuf> {
    let at = library
        .windows(PLACEHOLDER.len())
        .position(|w| w == PLACEHOLDER)
        .expect("the name placeholder is in the library");
    std::fs::create_dir_all(dir).unwrap();
    (0..n)
        .map(|i| {
            let name = format!("many-{prefix}{i:04}");
            let mut bytes = library.to_vec();
            let mut field = [b'#'; 32];
            field[..name.len()].copy_from_slice(name.as_bytes());
            bytes[at..at + 32].copy_from_slice(&field);
            let path = dir.join(format!("{name}{}", std::env::consts::DLL_SUFFIX));
            std::fs::write(&path, bytes).unwrap();
            set_mode(&path, 0o755);
            path
        })
        .collect()
}

pub(crate) fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub(crate) fn plugin_host(service: &SessionService, dir: &Path, data: &Path) -> PluginHost {
    set_mode(dir, 0o755);
    PluginHost::new(
        service.clone(),
        PluginHostConfig {
            dirs: vec![dir.to_path_buf()],
            data_dir: data.to_path_buf(),
            allow_insecure_permissions: false,
            settings: BTreeMap::<String, PluginSettings>::new(),
        },
    )
}
