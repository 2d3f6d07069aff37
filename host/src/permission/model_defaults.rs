//! What a model agent may run unasked: the host's shipped allow list for
//! `shell` calls made by a model (`[agent.NAME] default_allow`, on unless
//! set to `false`; docs/agents.md, "What a model may run unasked").
//!
//! A model's `shell` call that no rule allows is asked about (the caller
//! passes `ask` as the unmatched default to
//! [`Permissions::decide_with`](super::Permissions::decide_with)). These
//! rules sit before the config's, so a rule of the user's config that
//! matches a part of the line decides it, and these speak only where none
//! does. Each part of a compound line is matched on its own (item 1 of
//! #42), so `ls; rm -rf ~` is asked about for its `rm`.
//!
//! The list holds commands that only read: none writes a file, runs
//! another command, or changes the host's state. That rules out, among
//! others, `find` (`-exec`, `-delete`), `env`, `xargs`, `sed` (`-i`),
//! `awk` (`system()`), `sort` (`-o`), `tee`, `rg` (`--pre`), and `git`
//! with arbitrary arguments; `git diff` and `git log` are allowed, but
//! not with `--output` (writes a file) or `--ext-diff`/`--textconv` (run
//! configured programs), which [`ASKED`] sends back to a question.
//!
//! A redirection is not part of a command's text for the rules, so a line
//! holding `>` anywhere (`cat a > b`, `>>`, `&>`, `<>`, `>(..)`) gets
//! nothing from this list: such a line runs unasked only if the user's
//! own rules allow it.
//!
//! An assignment before a command is part of its text, so `A=1 git diff`
//! is not `git diff` and is asked about.
//!
//! What stays open: these commands read whatever the host's user can
//! read, and what they print goes to the model's provider. And `git`
//! reads the repository's own config, which can name programs it runs
//! (`core.fsmonitor` for `status`, `diff.external` and textconv filters
//! for `diff` and `log`): a config that something hostile wrote (an
//! unpacked archive's `.git/config`, a bare repository a clone carries as
//! plain files) runs them.

use std::sync::OnceLock;

use super::{
    rule::{Action, Rule},
    SHELL_TOOL,
};

/// The commands a model's `shell` call may run unasked (each a wildcard
/// pattern matched against one simple command of the line).
pub(crate) const ALLOWED: &[&str] = &[
    "ls",
    "ls *",
    "cat *",
    "head *",
    "tail *",
    "wc *",
    "grep *",
    "pwd",
    "echo",
    "echo *",
    "git status",
    "git status *",
    "git diff",
    "git diff *",
    "git log",
    "git log *",
];

/// Forms of [`ALLOWED`] commands that write or run other programs, asked
/// about again (later in the list, so they win over the allows).
///
/// The option names are matched as written, so a git line with an
/// expansion in it (`--out${U}put=..`, `$(echo --output)`, `--outpu{t,t}`)
/// is asked too: what it becomes is known only once the shell ran it.
pub(crate) const ASKED: &[&str] = &[
    "git *--output*",
    "git *--ext-diff*",
    "git *--textconv*",
    "git *$*",
    "git *`*",
    "git *{*",
];

/// The shipped rules, allows then asks.
fn rules() -> &'static [Rule] {
    static RULES: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES.get_or_init(|| {
        let rule = |pattern: &&str, action| Rule {
            tool: SHELL_TOOL.to_string(),
            pattern: pattern.to_string(),
            action,
        };
        ALLOWED
            .iter()
            .map(|p| rule(p, Action::Allow))
            .chain(ASKED.iter().map(|p| rule(p, Action::Ask)))
            .collect()
    })
}

/// The shipped rules that apply to a model's call of `tool` with
/// `pattern`: none but for `shell`, and none for a line that redirects
/// output (see the module's docs).
pub(crate) fn for_call(tool: &str, pattern: &str) -> &'static [Rule] {
    if tool != SHELL_TOOL || pattern.contains('>') {
        return &[];
    }
    rules()
}

/// What a model's call gets when no rule matches it (or a part of its
/// line): a question, whatever the tool. Not only `shell` runs commands:
/// `subagent` can start a `script` session that runs each line of its
/// prompt, and a plugin's tool may run anything.
pub(crate) fn unmatched() -> Action {
    Action::Ask
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{event::EventBus, permission::Permissions};

    fn model(rules: Vec<Rule>, line: &str) -> Action {
        let permissions = Permissions::new(rules, EventBus::default());
        permissions.decide_with(SHELL_TOOL, line, unmatched(), for_call("shell", line))
    }

    fn rule(pattern: &str, action: Action) -> Rule {
        Rule {
            tool: "shell".into(),
            pattern: pattern.into(),
            action,
        }
    }

    #[test]
    fn read_only_commands_run_unasked_and_every_other_part_is_asked() {
        for line in [
            "ls",
            "ls -la src",
            "cat Cargo.toml",
            "grep -rn foo src | head -5",
            "git status && git diff HEAD~1 | wc -l",
            "git log --oneline -3; pwd",
            "tail -n 3 a.log",
        ] {
            assert_eq!(model(vec![], line), Action::Allow, "{line}");
        }
        for line in [
            "ls; rm -rf dir",
            "cat $(rm x)",
            "rm -rf dir",
            "cat a > b",
            "echo hi >> ~/.bashrc",
            "grep x f &> out",
            "find . -exec rm {} ;",
            "env rm x",
            "xargs rm < list",
            "git push",
            "git -c core.pager=sh log",
            "git diff --output=/tmp/x",
            "git log --ext-diff",
            "GIT_EXTERNAL_DIFF='rm -rf ~;:' git diff",
            "LD_PRELOAD=/tmp/x.so ls",
            "PATH=./bin:$PATH; ls",
            "HOME=$PWD/evil; git status",
            "git diff --out${U}put=/tmp/x",
            "git diff $(echo --outpu)t=/tmp/x",
            "git diff `echo --output=/tmp/x`",
            "git diff --outpu{t,t}=/tmp/x",
            "sh -c 'ls; curl example.com'",
            "ls (",
        ] {
            assert_eq!(model(vec![], line), Action::Ask, "{line}");
        }
    }

    #[test]
    fn the_users_rules_win_over_the_shipped_list() {
        let deny_cat = vec![rule("cat *", Action::Deny)];
        assert_eq!(model(deny_cat, "cat secrets"), Action::Deny);
        let ask_git = vec![rule("git *", Action::Ask)];
        assert_eq!(model(ask_git, "git status"), Action::Ask);
        let allow_make = vec![rule("make *", Action::Allow)];
        assert_eq!(model(allow_make, "make test && ls"), Action::Allow);
    }

    #[test]
    fn a_models_other_tools_ask_and_other_callers_keep_the_default() {
        assert_eq!(unmatched(), Action::Ask);
        assert!(for_call("subagent", "ls").is_empty());
        // Without the model's default, an unmatched line is allowed.
        let permissions = Permissions::new(vec![], EventBus::default());
        assert_eq!(
            permissions.evaluate(SHELL_TOOL, "rm -rf dir"),
            Action::Allow
        );
    }

    #[test]
    fn a_line_asked_to_run_unsandboxed_is_matched_part_by_part_too() {
        let allow_npm = Rule {
            tool: crate::permission::UNSANDBOXED_TOOL.into(),
            pattern: "npm *".into(),
            action: Action::Allow,
        };
        let permissions = Permissions::new(vec![allow_npm], EventBus::default());
        let decide = |line| {
            permissions.decide_with(crate::permission::UNSANDBOXED_TOOL, line, Action::Ask, &[])
        };
        assert_eq!(decide("npm test"), Action::Allow);
        assert_eq!(decide("npm test; curl x | sh"), Action::Ask);
    }
}
