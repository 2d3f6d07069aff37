//! Where a plugin runs is decided by its name before any of its code runs
//! in the host, and a plugin cannot dodge `[plugin.NAME] isolation =
//! "process"` by giving another name where it is looked at: `hostile`,
//! from a file whose name contains `dodge`, says it is `sneaky` in a
//! plugin process and `hostile` everywhere else.

use offstage::{Isolation, IsolationSettings, PluginStatus};
use offstage_tests::{loader::*, plugin_library};

/// A host that isolates `hostile` by name, and runs the rest in process.
fn isolating_hostile() -> Fixture {
    let mut fixture = Fixture::new();
    fixture.isolation.child_exe = Some(offstage_tests::fixtures::offstage_binary());
    fixture.isolation.plugins.insert(
        "hostile".into(),
        IsolationSettings {
            mode: Some(Isolation::Process),
            ..Default::default()
        },
    );
    fixture
}

const DODGER: &str = "liboffstage_test_hostile_dodge.so";

/// The library with its name section renamed: a file that declares no
/// name (as one built with `export_plugin!(P)`).
fn without_name_section() -> Vec<u8> {
    let mut bytes = std::fs::read(plugin_library("offstage-test-hostile")).unwrap();
    let section = b".offstage.plugin\0";
    let at = bytes
        .windows(section.len())
        .position(|w| w == section)
        .expect("the library has a name section");
    bytes[at..at + section.len()].copy_from_slice(b".offstage.nothin\0");
    bytes
}

/// With the name in its file, the host goes by it: `hostile` is isolated,
/// and its process says `sneaky`: refused, in one line, and never loaded
/// in the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_names_itself_otherwise_in_its_process_is_refused() {
    let fixture = isolating_hostile();
    let path = fixture.install_file(&plugin_library("offstage-test-hostile"), DODGER);
    fixture.install("offstage-test-hello");
    let host = fixture.start();
    let error = host.error(DODGER);
    assert_one_line(
        &error,
        &path,
        &[
            "refused",
            "`hostile` by its file",
            "`sneaky` by its manifest in its process",
        ],
    );
    assert!(host
        .plugins
        .get("hostile")
        .is_none_or(|i| i.status != PluginStatus::Loaded));
    assert!(host.plugins.get("sneaky").is_none());
    host.assert_hello_works().await;
    host.plugins.shutdown();
}

/// A file without the name: the host looks in a child process, which
/// hears `sneaky` (not isolated); the load in the host then hears
/// `hostile`, and refuses it rather than run an isolated plugin here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_name_in_its_file_the_look_and_the_load_must_agree() {
    let fixture = isolating_hostile();
    let path = fixture.write_file(DODGER, &without_name_section());
    let host = fixture.start();
    let error = host.error(DODGER);
    assert_one_line(
        &error,
        &path,
        &[
            "`sneaky` by a look in a child process",
            "`hostile` by its manifest in the host",
        ],
    );
    assert!(host
        .plugins
        .get("hostile")
        .is_none_or(|i| i.status != PluginStatus::Loaded));
    host.plugins.shutdown();
}
