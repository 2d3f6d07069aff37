//! Wildcard patterns, as the host's permission config uses them.
//!
//! A pattern matches the *whole* text: `*` stands for any run of characters
//! (none included) and `?` for exactly one character; every other character
//! stands for itself. There is no escaping and no character class. Plugins
//! that take patterns in their options (`auto-background`'s `ignore`) use
//! [`wildcard_match`] so that their patterns mean what a `[[permission]]`
//! rule's `tool` and `pattern` mean.

/// Whether `text` matches the wildcard `pattern` (`*` any run of
/// characters, `?` exactly one; the whole text must match).
///
/// ```
/// use offstage_plugin_api::pattern::wildcard_match;
///
/// assert!(wildcard_match("rm *", "rm -rf /tmp/x"));
/// assert!(wildcard_match("git ?tatus", "git status"));
/// assert!(!wildcard_match("sleep *", "echo; sleep 10"));
/// ```
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    // Greedy match with backtracking to the last `*`: linear in practice,
    // never exponential.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == '?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == '*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases the host's permission rules relied on.
    #[test]
    fn permission_wildcards() {
        assert!(wildcard_match("*", "anything at all"));
        assert!(wildcard_match("rm *", "rm -rf /tmp/x"));
        assert!(!wildcard_match("rm *", "ls"));
        assert!(wildcard_match("git ?tatus", "git status"));
        assert!(wildcard_match("*sleep*", "echo a; sleep 3"));
    }

    /// The cases `auto-background`'s `ignore` patterns relied on.
    #[test]
    fn ignore_wildcards() {
        assert!(wildcard_match("sleep *", "sleep 10"));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("*watch*", "cargo watch -x test"));
        assert!(wildcard_match("ca?go *", "cargo build"));
        assert!(wildcard_match("a*b*c", "aXXbYYc"));
        assert!(wildcard_match("a*b", "abab"));
        assert!(!wildcard_match("sleep *", "echo; sleep 10"));
        assert!(!wildcard_match("a*b", "abac"));
        assert!(!wildcard_match("?", ""));
        assert!(!wildcard_match("exact", "exactly"));
    }
}
