//! A permission rule, as written in the config and kept in the store.
//!
//! Its own file because the store persists `always` answers as rules:
//! the store imports this, and nothing here imports the store (see the
//! layer order in `host/src/lib.rs`).

use serde::{Deserialize, Serialize};

/// What a rule does to a matching call. Ordered by weight: where the
/// parts of one call get different answers, the heaviest wins (`deny`
/// over `ask` over `allow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Run without asking.
    Allow,
    /// Ask over the API and wait for the reply.
    Ask,
    /// Refuse.
    Deny,
}

/// One permission rule, as written in the config's `[[permission]]` tables.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The tool name, or a wildcard pattern of names.
    pub tool: String,
    #[serde(default = "any")]
    /// The pattern the call is matched against (for `shell`, the command).
    pub pattern: String,
    /// What a match does.
    pub action: Action,
}

fn any() -> String {
    "*".to_string()
}
