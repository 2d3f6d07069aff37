//! Compatibility across plugin-api releases, with real builds (ARCHITECTURE.md §ABI-2, §ABI-3).
//!
//! `tests/compat/api-*` compile plugin-api's own source as other releases of
//! the crate, same package name, another version: 1.0.0 (without 1.1's
//! `wait_idle`), 1.4.0 (with a `fork` method today's host lacks), 1.1.0 with
//! one vtable field's type changed, and 2.0.0. `tests/compat/plugin-*` are
//! plugins built against each, in workspaces of their own, into
//! `target/fixtures` (`offstage_tests::fixtures::compat`). Today's host (1.3.0) must:
//!
//! - run the 1.0 plugin as if it were current;
//! - load the 1.4 plugin, whose `fork` comes back `Unsupported` (both faces)
//!   while its other calls work;
//! - refuse the changed-field plugin with a layout error naming both types;
//! - refuse the 2.0 plugin as another major version.
//!
//! The same in process (here) and with each plugin in a child process
//! (`isolation::compat`, `compat_suite!`).

use std::path::PathBuf;

use offstage::{Isolation, PluginStatus};
use offstage_plugin_api::types::ToolStatus;
use offstage_tests::loader::*;
use serde_json::{json, Value};

/// A host with `hello` and the compat plugin of `variant`, loaded as
/// `mode` says.
fn host_with(variant: &str, mode: Isolation) -> (Host, PathBuf) {
    let library = offstage_tests::fixtures::compat(variant);
    let fixture = Fixture::with_mode(mode);
    fixture.install("offstage-test-hello");
    let path = fixture.install_file(&library, library.file_name().unwrap().to_str().unwrap());
    (fixture.start(), path)
}

fn report(output: &str) -> Value {
    serde_json::from_str(output).unwrap_or_else(|e| panic!("{e}: {output}"))
}

pub(crate) async fn a_plugin_built_against_an_older_minor_works(mode: Isolation) {
    let (host, _) = host_with("older", mode);
    let info = host.plugins.get("compat-older").expect("listed");
    assert_eq!(info.status, PluginStatus::Loaded, "{info:#?}");
    assert_eq!(info.api_version, "1.0.0");

    let result = host.call("compat-older", json!({})).await.unwrap();
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    let report = report(&result.output);
    assert_eq!(report["renamed"], "renamed by compat-older");
    assert_eq!(report["listed"], true);
    let session = host
        .service
        .get(report["created"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(session.title, "renamed by compat-older");
    host.assert_hello_works().await;
}

pub(crate) async fn a_plugin_built_against_a_newer_minor_gets_unsupported_for_what_the_host_lacks(
    mode: Isolation,
) {
    let (host, _) = host_with("newer", mode);
    let info = host.plugins.get("compat-newer").expect("listed");
    assert_eq!(info.status, PluginStatus::Loaded, "{info:#?}");
    assert_eq!(info.api_version, "1.4.0");

    let result = host.call("compat-newer", json!({})).await.unwrap();
    assert_eq!(result.status, ToolStatus::Completed, "{result:?}");
    let report = report(&result.output);
    assert_eq!(report["fork"], "Unsupported", "{report}");
    assert_eq!(report["fork_blocking"], "Unsupported", "{report}");
    assert!(
        report["fork_message"].as_str().unwrap().contains("`fork`"),
        "{report}"
    );
    // What both know works: 1.1's wait_idle, and get's blocking face.
    assert_eq!(report["idle_status"], "idle");
    assert_eq!(report["got_title"], "made by compat-newer");
    // Not a failure: the plugin is still loaded and the host still serves.
    assert_eq!(
        host.plugins.get("compat-newer").unwrap().status,
        PluginStatus::Loaded
    );
    host.assert_hello_works().await;
}

pub(crate) async fn a_changed_field_type_is_refused_naming_both_types(mode: Isolation) {
    let (host, path) = host_with("changed", mode);
    let error = host.error(path.file_name().unwrap().to_str().unwrap());
    // `get_blocking` returns `u64` in the fixture, `RResult<RString, AbiError>` here.
    assert_one_line(
        &error,
        &path,
        &[
            "layout mismatch: mismatched type in field session.get_blocking (return type)",
            "expected u64, found RResult",
        ],
    );
    assert!(
        host.service
            .tools()
            .names()
            .iter()
            .all(|t| !t.starts_with("compat")),
        "refused plugins register nothing"
    );
    host.assert_hello_works().await;
}

pub(crate) async fn a_plugin_built_against_the_next_major_is_refused(mode: Isolation) {
    let (host, path) = host_with("next-major", mode);
    assert_one_line(
        &host.error(path.file_name().unwrap().to_str().unwrap()),
        &path,
        &[
            "incompatible API major version",
            "built against offstage-plugin-api 2.0.0, this host uses 1.3.0",
        ],
    );
    host.assert_hello_works().await;
}

/// The suite, for plugins run as `$mode` says: in process here, in a
/// child process in `isolation::compat`.
macro_rules! compat_suite {
    ($mode:expr) => {
        tests_in_mode!(
            $mode,
            loader::compat {
                a_plugin_built_against_an_older_minor_works,
                a_plugin_built_against_a_newer_minor_gets_unsupported_for_what_the_host_lacks,
                a_changed_field_type_is_refused_naming_both_types,
                a_plugin_built_against_the_next_major_is_refused,
            }
        );
    };
}
pub(crate) use compat_suite;

/// The suite in process (isolated: `isolation::compat`).
mod in_process {
    compat_suite!(offstage::Isolation::None);
}
