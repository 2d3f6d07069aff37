//! `offstage demo`: runs the demo function with the example plugins built
//! by cargo and checks that the transcript shows every step of the
//! background scenario, in order, without colour codes when not on a
//! terminal.

use std::time::Duration;

use offstage::{run_demo, DemoOptions, EXAMPLE_PLUGINS};

fn options(after: Duration, colour: bool) -> DemoOptions {
    let plugin_files = EXAMPLE_PLUGINS
        .iter()
        .map(|(package, _)| offstage_tests::plugin_library(package))
        .collect();
    DemoOptions {
        plugin_files: Some(plugin_files),
        colour,
        after,
        deadline: Duration::from_secs(60),
    }
}

fn transcript() -> String {
    let options = options(Duration::from_millis(1500), false);
    let mut out = Vec::new();
    let result = run_demo(&options, &mut out);
    let text = String::from_utf8(out).unwrap();
    if let Err(error) = result {
        panic!("the demo failed: {error}\ntranscript so far:\n{text}");
    }
    text
}

/// Position of the first line after `from` that contains every one of
/// `needles`; fails the test if there is none.
fn find_line(text: &str, from: usize, needles: &[&str]) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    (from..lines.len())
        .find(|&i| needles.iter().all(|n| lines[i].contains(n)))
        .unwrap_or_else(|| panic!("no line after line {from} with {needles:?} in:\n{text}"))
}

#[test]
fn the_demo_shows_every_step_in_order() {
    let text = transcript();
    println!("{text}");
    assert!(!text.contains('\x1b'), "colour codes in a piped transcript");

    for (_, name) in EXAMPLE_PLUGINS {
        find_line(&text, 0, &["plugin", name]);
    }
    let user = find_line(&text, 0, &["user", "sleep 3"]);
    let started = find_line(&text, user, &["job", "started"]);
    let moved = find_line(&text, started, &["moved", "to the background"]);
    let returned = find_line(&text, moved, &["tool", "output so far"]);
    let so_far = find_line(&text, returned, &["| step 1: fetching sources"]);
    let replied = find_line(
        &text,
        so_far,
        &["assistant", "moved to the background as job_"],
    );
    let finished = find_line(&text, replied, &["job", "finished: completed, exit code 0"]);
    let notice = find_line(&text, finished, &["notice", "completed with exit code 0"]);
    let rest = find_line(&text, notice, &["step 2: build finished"]);
    let wake = find_line(&text, rest, &["wake", "the session wakes up"]);
    let answer = find_line(
        &text,
        wake,
        &["assistant", "noticed: job", "completed, exit code 0"],
    );

    // The output so far came before the rest existed.
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        !lines[returned..replied]
            .iter()
            .any(|l| l.contains("step 2")),
        "{text}"
    );

    let check = find_line(&text, answer, &["result", "1 of 2 checks passed"]);
    find_line(&text, check, &["[FAIL] test -f /no/such/file"]);
    let audit = find_line(&text, check, &["audit-log appended"]);
    find_line(&text, audit, &["shell", "completed", "sleep 3"]);
    find_line(&text, audit, &["Done"]);
}

#[test]
fn the_demo_fails_clearly_when_nothing_is_moved() {
    // A timer longer than the command: auto-background never fires, and
    // the demo must say so rather than hang or claim success. Colour on, as
    // on a terminal.
    let mut out = Vec::new();
    let error = run_demo(&options(Duration::from_secs(20), true), &mut out)
        .expect_err("the demo must fail");
    let text = String::from_utf8(out).unwrap();
    assert!(
        error.to_string().contains("finished in the foreground"),
        "{error}"
    );
    assert!(
        text.contains("\x1b[36;1muser"),
        "colour codes expected:\n{text}"
    );
    assert!(!text.contains("moved to the background (by"), "{text}");
}
