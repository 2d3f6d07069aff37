//! A shell command line split into the simple commands it would run, so
//! that `shell` rules see every part: `ls; rm -rf ~` is two commands, and
//! a rule that allows `ls *` allows only the first.
//!
//! The line is parsed by `brush-parser` (the parser of the brush shell, a
//! bash-compatible parser written in Rust), never by hand. Every simple
//! command is collected wherever it sits: in pipelines, lists (`;`, `&`,
//! `&&`, `||`), subshells and brace groups, `if`/`while`/`for`/`case`
//! bodies, function bodies, command substitutions (`$(..)` and backquotes,
//! inside double quotes and in redirections and assignments too), process
//! substitutions, here-documents that expand, and the literal script of
//! `eval ..` and `sh -c '..'` (`bash`, `dash`, `zsh`, `ksh` and `ash`
//! too). The command a simple wrapper runs (`exec`, `command`, `builtin`,
//! `nohup`, `setsid`, `time`, `env`) is a part of its own as well.
//!
//! What cannot be read for certain is [`Unreadable`]: a line the parser
//! refuses, an `eval` or `sh -c` whose script is not literal (`eval
//! "$X"`), a substitution hidden inside a parameter or arithmetic
//! expansion (`${X:-$(..)}`), or nesting deeper than [`MAX_DEPTH`]. The
//! caller asks about such a line rather than guessing (`Permissions`).
//!
//! Each command's text is its words joined by one space, with the quoting
//! of literal words removed (`'rm' -rf ~` is `rm -rf ~`, so quoting does
//! not slip past a rule); a word that expands (`$HOME`, `$(..)`, `*.rs`
//! globs stay as written) keeps its source text. Assignments before the
//! command are part of its text (`A=1 git diff` is not `git diff`: the
//! environment can make a command run another); redirections are not.

use brush_parser::{
    ast::{
        Command, CommandPrefixOrSuffixItem, CompoundCommand, CompoundList, ExtendedTestExpr,
        IoFileRedirectTarget, IoRedirect, Pipeline, SimpleCommand, Word,
    },
    word::{WordPiece, WordPieceWithSource},
    ParserOptions,
};

/// How deep substitutions and `eval`/`sh -c` scripts may nest before the
/// line counts as unreadable.
pub(crate) const MAX_DEPTH: usize = 16;

/// Shells whose `-c SCRIPT` is read as a script of its own.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "ash", "mksh"];

/// Why a command line could not be split for certain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the command line cannot be read for certain: {0}")]
pub(crate) struct Unreadable(pub(crate) String);

/// The simple commands `line` would run, in the order written.
pub(crate) fn simple_commands(line: &str) -> Result<Vec<String>, Unreadable> {
    let mut walker = Walker {
        options: ParserOptions::default(),
        found: Vec::new(),
    };
    walker.script(line, 0)?;
    Ok(walker.found)
}

struct Walker {
    options: ParserOptions,
    found: Vec<String>,
}

type Walked = Result<(), Unreadable>;

/// A word rendered for matching: its text, and whether it is literal
/// (expands to exactly that text).
struct Rendered {
    text: String,
    literal: bool,
}

impl Walker {
    fn script(&mut self, source: &str, depth: usize) -> Walked {
        if depth > MAX_DEPTH {
            return Err(Unreadable(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let mut parser = brush_parser::Parser::new(std::io::Cursor::new(source), &self.options);
        let program = parser
            .parse_program()
            .map_err(|e| Unreadable(format!("{e}")))?;
        for list in &program.complete_commands {
            self.list(list, depth)?;
        }
        Ok(())
    }

    fn list(&mut self, list: &CompoundList, depth: usize) -> Walked {
        for item in &list.0 {
            let and_or = &item.0;
            self.pipeline(&and_or.first, depth)?;
            for next in &and_or.additional {
                let (brush_parser::ast::AndOr::And(pipeline)
                | brush_parser::ast::AndOr::Or(pipeline)) = next;
                self.pipeline(pipeline, depth)?;
            }
        }
        Ok(())
    }

    fn pipeline(&mut self, pipeline: &Pipeline, depth: usize) -> Walked {
        for command in &pipeline.seq {
            self.command(command, depth)?;
        }
        Ok(())
    }

    fn command(&mut self, command: &Command, depth: usize) -> Walked {
        match command {
            Command::Simple(simple) => self.simple(simple, depth),
            Command::Compound(compound, redirects) => {
                self.compound(compound, depth)?;
                for redirect in redirects.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect, depth)?;
                }
                Ok(())
            }
            Command::Function(function) => {
                self.compound(&function.body.0, depth)?;
                for redirect in function.body.1.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect, depth)?;
                }
                Ok(())
            }
            Command::ExtendedTest(test, redirects) => {
                self.test(&test.expr, depth)?;
                for redirect in redirects.iter().flat_map(|r| &r.0) {
                    self.redirect(redirect, depth)?;
                }
                Ok(())
            }
        }
    }

    fn compound(&mut self, compound: &CompoundCommand, depth: usize) -> Walked {
        match compound {
            CompoundCommand::Arithmetic(arithmetic) => self.opaque(&arithmetic.expr.value),
            CompoundCommand::ArithmeticForClause(clause) => {
                for expr in [&clause.initializer, &clause.condition, &clause.updater]
                    .into_iter()
                    .flatten()
                {
                    self.opaque(&expr.value)?;
                }
                self.list(&clause.body.list, depth)
            }
            CompoundCommand::BraceGroup(group) => self.list(&group.list, depth),
            CompoundCommand::Subshell(subshell) => self.list(&subshell.list, depth),
            CompoundCommand::ForClause(clause) => {
                for value in clause.values.iter().flatten() {
                    self.word(value, depth)?;
                }
                self.list(&clause.body.list, depth)
            }
            CompoundCommand::CaseClause(clause) => {
                self.word(&clause.value, depth)?;
                for case in &clause.cases {
                    for pattern in &case.patterns {
                        self.word(pattern, depth)?;
                    }
                    if let Some(body) = &case.cmd {
                        self.list(body, depth)?;
                    }
                }
                Ok(())
            }
            CompoundCommand::IfClause(clause) => {
                self.list(&clause.condition, depth)?;
                self.list(&clause.then, depth)?;
                for other in clause.elses.iter().flatten() {
                    if let Some(condition) = &other.condition {
                        self.list(condition, depth)?;
                    }
                    self.list(&other.body, depth)?;
                }
                Ok(())
            }
            CompoundCommand::WhileClause(clause) | CompoundCommand::UntilClause(clause) => {
                self.list(&clause.0, depth)?;
                self.list(&clause.1.list, depth)
            }
            CompoundCommand::Coprocess(coprocess) => self.command(&coprocess.body, depth),
        }
    }

    fn test(&mut self, expr: &ExtendedTestExpr, depth: usize) -> Walked {
        match expr {
            ExtendedTestExpr::And(a, b) | ExtendedTestExpr::Or(a, b) => {
                self.test(a, depth)?;
                self.test(b, depth)
            }
            ExtendedTestExpr::Not(a) | ExtendedTestExpr::Parenthesized(a) => self.test(a, depth),
            ExtendedTestExpr::UnaryTest(_, word) => self.word(word, depth).map(drop),
            ExtendedTestExpr::BinaryTest(_, a, b) => {
                self.word(a, depth)?;
                self.word(b, depth).map(drop)
            }
        }
    }

    fn redirect(&mut self, redirect: &IoRedirect, depth: usize) -> Walked {
        match redirect {
            IoRedirect::File(_, _, target) => match target {
                IoFileRedirectTarget::Filename(word) | IoFileRedirectTarget::Duplicate(word) => {
                    self.word(word, depth).map(drop)
                }
                IoFileRedirectTarget::Fd(_) => Ok(()),
                IoFileRedirectTarget::ProcessSubstitution(_, subshell) => {
                    self.list(&subshell.list, depth + 1)
                }
            },
            IoRedirect::HereDocument(_, doc) => {
                if !doc.requires_expansion {
                    return Ok(());
                }
                let pieces = brush_parser::word::parse_heredoc(&doc.doc.value, &self.options)
                    .map_err(|e| Unreadable(format!("{e}")))?;
                self.pieces(&doc.doc.value, &pieces, depth).map(drop)
            }
            IoRedirect::HereString(_, word) | IoRedirect::OutputAndError(word, _) => {
                self.word(word, depth).map(drop)
            }
        }
    }

    fn simple(&mut self, simple: &SimpleCommand, depth: usize) -> Walked {
        let mut words: Vec<Rendered> = Vec::new();
        // Before the name: assignments, part of a command's text
        // (`GIT_EXTERNAL_DIFF=.. git diff` runs another program, so it must
        // not match `git diff*`), and redirections. Assignments without a
        // command are a part of their own: `PATH=./bin:$PATH; ls` or
        // `HOME=evil; git status` change what later parts run.
        for item in simple.prefix.iter().flat_map(|p| &p.0) {
            self.item(item, depth, Some(&mut words))?;
        }
        if let Some(name) = &simple.word_or_name {
            words.push(self.word(name, depth)?);
        }
        // After it: its arguments, `NAME=VALUE` ones included (`env A=1
        // rm x`), and redirections.
        for item in simple.suffix.iter().flat_map(|s| &s.0) {
            self.item(item, depth, Some(&mut words))?;
        }
        if words.is_empty() {
            return Ok(());
        }
        let text = words
            .iter()
            .map(|w| w.text.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        self.found.push(text);
        self.inner_script(&words, depth)?;
        self.wrapped(&words, depth)
    }

    /// The command a wrapper runs (`exec rm x`, `nohup rm x`, `env X=1 rm
    /// x`) is a part of its own too, so that a rule about `rm *` sees it.
    fn wrapped(&mut self, words: &[Rendered], depth: usize) -> Walked {
        let name = words[0].text.rsplit('/').next().unwrap_or_default();
        let rest = match name {
            "exec" | "command" | "builtin" | "nohup" | "setsid" | "time" => {
                // Their own options (`command -p`, `exec -a NAME` aside).
                let skip = words[1..]
                    .iter()
                    .take_while(|w| w.text.starts_with('-') && w.text != "-a")
                    .count();
                &words[1 + skip..]
            }
            "env" => {
                let skip = words[1..]
                    .iter()
                    .take_while(|w| w.text.contains('=') || w.text == "-i" || w.text == "-")
                    .count();
                &words[1 + skip..]
            }
            _ => return Ok(()),
        };
        if rest.is_empty() || rest[0].text.starts_with('-') {
            return Ok(());
        }
        if depth > MAX_DEPTH {
            return Err(Unreadable(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        let text = rest
            .iter()
            .map(|w| w.text.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        self.found.push(text);
        self.inner_script(rest, depth + 1)?;
        self.wrapped(rest, depth + 1)
    }

    /// One prefix or suffix item: its substitutions walked, and a word's
    /// rendering added to `words` when given (a suffix).
    fn item(
        &mut self,
        item: &CommandPrefixOrSuffixItem,
        depth: usize,
        words: Option<&mut Vec<Rendered>>,
    ) -> Walked {
        match item {
            CommandPrefixOrSuffixItem::IoRedirect(redirect) => self.redirect(redirect, depth),
            CommandPrefixOrSuffixItem::Word(word)
            | CommandPrefixOrSuffixItem::AssignmentWord(_, word) => {
                // A whole `NAME=VALUE` word: its value may hold a
                // substitution.
                let rendered = self.word(word, depth)?;
                if let Some(words) = words {
                    words.push(rendered);
                }
                Ok(())
            }
            CommandPrefixOrSuffixItem::ProcessSubstitution(_, subshell) => {
                self.list(&subshell.list, depth + 1)
            }
        }
    }

    /// The script of `eval ARGS` and `sh -c SCRIPT`, read as a line of its
    /// own: it runs as surely as the command does.
    fn inner_script(&mut self, words: &[Rendered], depth: usize) -> Walked {
        let name = words[0].text.rsplit('/').next().unwrap_or_default();
        if name == "eval" {
            let args = &words[1..];
            if args.iter().any(|w| !w.literal) {
                return Err(Unreadable("`eval` of a script that is not literal".into()));
            }
            let script: Vec<&str> = args.iter().map(|w| w.text.as_str()).collect();
            return self.script(&script.join(" "), depth + 1);
        }
        if !SHELLS.contains(&name) {
            return Ok(());
        }
        // `sh -c SCRIPT`, `bash -ec SCRIPT`, `sh -x -c SCRIPT`: the first
        // operand after an option cluster holding `c` is the script.
        let mut command_mode = false;
        for word in &words[1..] {
            if command_mode {
                if !word.literal {
                    return Err(Unreadable(format!(
                        "`{name} -c` of a script that is not literal"
                    )));
                }
                return self.script(&word.text, depth + 1);
            }
            let text = word.text.as_str();
            if !word.literal {
                return Ok(());
            }
            if text == "--" || !text.starts_with('-') && !text.starts_with('+') {
                // An operand: a script file, not a `-c` string.
                return Ok(());
            }
            if text.starts_with('-') && !text.starts_with("--") && text.contains('c') {
                command_mode = true;
            }
        }
        if command_mode {
            return Err(Unreadable(format!("`{name} -c` without a script")));
        }
        Ok(())
    }

    /// Renders `word` and collects the commands its substitutions run.
    fn word(&mut self, word: &Word, depth: usize) -> Result<Rendered, Unreadable> {
        let pieces = brush_parser::word::parse(&word.value, &self.options)
            .map_err(|e| Unreadable(format!("{e}")))?;
        let mut rendered = self.pieces(&word.value, &pieces, depth)?;
        // A glob is not literal: `rm *` removes whatever `*` expands to.
        if rendered.literal
            && pieces
                .iter()
                .any(|p| matches!(&p.piece, WordPiece::Text(t) if t.contains(['*', '?', '['])))
        {
            rendered.literal = false;
        }
        Ok(rendered)
    }

    fn pieces(
        &mut self,
        source: &str,
        pieces: &[WordPieceWithSource],
        depth: usize,
    ) -> Result<Rendered, Unreadable> {
        let mut text = String::new();
        let mut literal = true;
        for piece in pieces {
            let raw = source
                .get(piece.start_index..piece.end_index)
                .unwrap_or_default();
            match &piece.piece {
                WordPiece::Text(s) | WordPiece::SingleQuotedText(s) => text.push_str(s),
                WordPiece::AnsiCQuotedText(_) => {
                    // Its escapes are not decoded here: kept as written.
                    text.push_str(raw);
                    literal = false;
                }
                WordPiece::EscapeSequence(s) => {
                    text.push_str(s.strip_prefix('\\').unwrap_or(s));
                }
                WordPiece::DoubleQuotedSequence(inner)
                | WordPiece::GettextDoubleQuotedSequence(inner) => {
                    // Indices of inner pieces are relative to the same
                    // source string.
                    let inner = self.pieces(source, inner, depth)?;
                    text.push_str(&inner.text);
                    literal &= inner.literal;
                }
                WordPiece::TildeExpansion(_) => {
                    text.push_str(raw);
                    literal = false;
                }
                WordPiece::ParameterExpansion(_) => {
                    self.opaque(raw)?;
                    text.push_str(raw);
                    literal = false;
                }
                WordPiece::ArithmeticExpression(expr) => {
                    // Its own `$((` is no substitution: the inside is
                    // what must hold none.
                    self.opaque(&expr.value)?;
                    text.push_str(raw);
                    literal = false;
                }
                WordPiece::CommandSubstitution(script)
                | WordPiece::BackquotedCommandSubstitution(script) => {
                    self.script(script, depth + 1)?;
                    text.push_str(raw);
                    literal = false;
                }
            }
        }
        Ok(Rendered { text, literal })
    }

    /// An expansion whose inside is not walked: it must hold no command
    /// substitution, or the line is unreadable.
    fn opaque(&self, text: &str) -> Walked {
        if text.contains("$(") || text.contains('`') || text.contains("<(") || text.contains(">(") {
            return Err(Unreadable(format!(
                "a command substitution inside an expansion: {text}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(line: &str) -> Vec<String> {
        simple_commands(line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn lists_and_pipelines_are_split() {
        assert_eq!(parts("ls; rm -rf ~"), ["ls", "rm -rf ~"]);
        assert_eq!(parts("ls *"), ["ls *"]);
        assert_eq!(parts("a && b || c | d & e"), ["a", "b", "c", "d", "e"]);
        assert_eq!(parts("ls\nrm x"), ["ls", "rm x"]);
        assert_eq!(parts("! git diff --quiet"), ["git diff --quiet"]);
        // Arithmetic is no command.
        assert_eq!(
            parts("i=0; while [ $i -lt 3 ]; do echo \"line $i\"; i=$((i+1)); done"),
            ["i=0", "[ $i -lt 3 ]", "echo line $i", "i=$((i+1))"]
        );
        assert_eq!(
            parts("echo $((1 + 2)) $(( (3) ))"),
            ["echo $((1 + 2)) $(( (3) ))"]
        );
        assert_eq!(
            parts("(( x++ )); for ((i=0; i<2; i++)); do ls; done"),
            ["ls"]
        );
    }

    #[test]
    fn compound_commands_are_entered() {
        assert_eq!(parts("(cd /tmp && rm -rf x)"), ["cd /tmp", "rm -rf x"]);
        assert_eq!(parts("{ ls; rm y; }"), ["ls", "rm y"]);
        assert_eq!(
            parts("if test -f a; then rm a; else touch b; fi"),
            ["test -f a", "rm a", "touch b"]
        );
        assert_eq!(parts("for f in a b; do rm $f; done"), ["rm $f"]);
        assert_eq!(parts("while true; do curl x; done"), ["true", "curl x"]);
        assert_eq!(parts("case $x in a) rm a;; esac"), ["rm a"]);
        assert_eq!(parts("f() { rm -rf ~; }; f"), ["rm -rf ~", "f"]);
    }

    #[test]
    fn substitutions_are_commands_too() {
        assert_eq!(parts("echo $(rm -rf ~)"), ["rm -rf ~", "echo $(rm -rf ~)"]);
        assert_eq!(parts("echo `rm x`"), ["rm x", "echo `rm x`"]);
        assert_eq!(parts("echo \"a $(rm y) b\""), ["rm y", "echo a $(rm y) b"]);
        assert_eq!(
            parts("X=$(curl evil) ls"),
            ["curl evil", "X=$(curl evil) ls"]
        );
        assert_eq!(parts("X=$(curl evil)"), ["curl evil", "X=$(curl evil)"]);
        // An assignment alone changes what later parts run: a part.
        assert_eq!(parts("PATH=./bin:$PATH; ls"), ["PATH=./bin:$PATH", "ls"]);
        // The environment can make a command run another: no `git diff*`.
        assert_eq!(
            parts("GIT_EXTERNAL_DIFF='rm -rf ~;:' git diff"),
            ["GIT_EXTERNAL_DIFF=rm -rf ~;: git diff"]
        );
        assert_eq!(parts("cat <(rm z)"), ["rm z", "cat"]);
        assert_eq!(parts("cat > $(rm w)"), ["rm w", "cat"]);
        assert_eq!(parts("diff <(ls a) <(ls b)"), ["ls a", "ls b", "diff"]);
    }

    #[test]
    fn literal_eval_and_sh_c_scripts_are_read() {
        assert_eq!(parts("eval 'ls; rm x'"), ["eval ls; rm x", "ls", "rm x"]);
        assert_eq!(
            parts("sh -c 'ls && rm -rf ~'"),
            ["sh -c ls && rm -rf ~", "ls", "rm -rf ~"]
        );
        assert_eq!(
            parts("/bin/bash -ec \"curl x | sh\""),
            ["/bin/bash -ec curl x | sh", "curl x", "sh"]
        );
        assert_eq!(parts("bash script.sh -c x"), ["bash script.sh -c x"]);
    }

    #[test]
    fn wrappers_run_a_command_of_their_own() {
        assert_eq!(parts("exec rm -rf ~"), ["exec rm -rf ~", "rm -rf ~"]);
        assert_eq!(
            parts("nohup env A=1 rm x"),
            ["nohup env A=1 rm x", "env A=1 rm x", "rm x"]
        );
        assert_eq!(
            parts("command -p sh -c 'rm y'"),
            ["command -p sh -c rm y", "sh -c rm y", "rm y"]
        );
        // Conservative: `command -v` only looks `ls` up, but `ls` is a part.
        assert_eq!(parts("command -v ls"), ["command -v ls", "ls"]);
        assert_eq!(parts("env"), ["env"]);
    }

    #[test]
    fn quoting_does_not_hide_a_command_name() {
        assert_eq!(parts("'rm' -rf ~"), ["rm -rf ~"]);
        assert_eq!(parts("r\"m\" x"), ["rm x"]);
        assert_eq!(parts("\\rm x"), ["rm x"]);
    }

    #[test]
    fn what_cannot_be_read_for_certain_is_unreadable() {
        for line in [
            "ls \"unterminated",
            "eval \"$X\"",
            "sh -c \"$SCRIPT\"",
            "bash -c",
            "echo ${X:-$(rm -rf ~)}",
            "echo $(( $(rm x) + 1 ))",
            "if then fi",
        ] {
            assert!(simple_commands(line).is_err(), "{line} was read");
        }
        let deep = format!(
            "{}rm x{}",
            "$(echo ".repeat(MAX_DEPTH + 2),
            ")".repeat(MAX_DEPTH + 2)
        );
        assert!(simple_commands(&deep).is_err());
    }
}
