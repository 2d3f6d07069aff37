//! The host's event bus: one broadcast channel that the HTTP event stream
//! and plugin subscriptions both read.
//!
//! Publishing never waits for a reader. Each reader has a bounded queue; a
//! reader that falls behind loses the oldest events and is told how many.

use serde_json::Value;
use tokio::sync::broadcast;

pub use offstage_plugin_api::types::Event;

/// How many events a slow reader may fall behind before it loses some.
const CAPACITY: usize = 4096;

/// Publishes host events to every subscriber.
#[derive(Clone, Debug)]
pub struct EventBus {
    sender: broadcast::Sender<Event>,
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus {
            sender: broadcast::channel(CAPACITY).0,
        }
    }
}

impl EventBus {
    /// Sends an event of `kind` to every current subscriber.
    pub fn publish(&self, kind: &str, properties: Value) {
        let _ = self.sender.send(Event {
            kind: kind.to_string(),
            properties,
        });
    }

    /// A new reader that sees events published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.sender.subscribe()
    }
}

#[cfg(test)]
mod tests {
    //! The events table of docs/contract.md against the code: every type
    //! the host publishes is in the table, every type in the table is
    //! published (or, marked "stream only", written by the event stream),
    //! and where a payload is written out in place (`json!({ "a": .. })`)
    //! the table lists exactly its fields.

    use std::{
        collections::{BTreeMap, BTreeSet},
        path::{Path, PathBuf},
    };

    /// One row of the table: its types, and the `{fields}` it lists (`None`
    /// when the payload is a record).
    struct Documented {
        fields: Option<BTreeSet<String>>,
        stream_only: bool,
    }

    fn manifest_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn documented() -> BTreeMap<String, Documented> {
        let contract = std::fs::read_to_string(manifest_dir().join("../docs/contract.md"))
            .expect("docs/contract.md");
        let section = contract
            .split("\n### Events\n")
            .nth(1)
            .expect("an Events section in docs/contract.md");
        let section = section.split("\n## ").next().unwrap();
        let mut rows = BTreeMap::new();
        for line in section.lines().filter(|l| l.starts_with("| `")) {
            let mut cells = line.trim_matches('|').split('|');
            let (types, payload) = (cells.next().unwrap(), cells.next().unwrap_or(""));
            let payload = payload.trim();
            let fields = payload.strip_prefix("`{").and_then(|rest| {
                let inner = &rest[..rest.find('}')?];
                Some(
                    inner
                        .split(',')
                        .map(|f| f.split(':').next().unwrap().trim().to_string())
                        .filter(|f| !f.is_empty())
                        .collect(),
                )
            });
            for kind in types.split('`').skip(1).step_by(2) {
                rows.insert(
                    kind.to_string(),
                    Documented {
                        fields: fields.clone(),
                        stream_only: payload.contains("stream only"),
                    },
                );
            }
        }
        rows
    }

    fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, into);
            } else if path.extension().is_some_and(|e| e == "rs") {
                into.push(path);
            }
        }
    }

    /// `publish("type", json!({ "a": .., "b": .. }))` in the host's source:
    /// each type with the fields of its in-place payloads (`None` for a
    /// payload that is a variable, i.e. a record).
    fn published() -> BTreeMap<String, Vec<Option<BTreeSet<String>>>> {
        let mut files = Vec::new();
        rust_files(&manifest_dir().join("src"), &mut files);
        let mut found: BTreeMap<String, Vec<Option<BTreeSet<String>>>> = BTreeMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for (at, _) in text.match_indices(".publish(") {
                let rest = text[at + ".publish(".len()..].trim_start();
                let Some(rest) = rest.strip_prefix('"') else {
                    continue; // `publish(kind, ..)`: the bus itself
                };
                let kind = &rest[..rest.find('"').unwrap()];
                let is_type = kind.contains('.')
                    && kind
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c == '.' || c == '_');
                if !is_type || kind.starts_with("test.") {
                    continue; // not a type name (this scanner), or a test's own
                }
                let after = rest[kind.len() + 1..].trim_start_matches([',', ' ', '\n']);
                let fields = after.strip_prefix("json!({").map(|body| {
                    let mut depth = 1;
                    let end = body
                        .char_indices()
                        .find(|&(_, c)| {
                            match c {
                                '{' | '[' | '(' => depth += 1,
                                '}' | ']' | ')' => depth -= 1,
                                _ => {}
                            }
                            depth == 0
                        })
                        .map(|(i, _)| i)
                        .unwrap();
                    body[..end]
                        .split(',')
                        .filter_map(|part| {
                            let key = part.trim().strip_prefix('"')?;
                            Some(key[..key.find('"')?].to_string())
                        })
                        .collect()
                });
                found.entry(kind.to_string()).or_default().push(fields);
            }
        }
        found
    }

    #[test]
    fn the_events_table_matches_what_the_host_publishes() {
        let documented = documented();
        let published = published();
        assert!(
            published.len() >= 10,
            "the scan found too few events: {:?}",
            published.keys()
        );
        for (kind, payloads) in &published {
            let row = documented.get(kind).unwrap_or_else(|| {
                panic!("`{kind}` is published but not in docs/contract.md's events table")
            });
            for fields in payloads.iter().flatten() {
                assert_eq!(
                    row.fields.as_ref(),
                    Some(fields),
                    "`{kind}`: docs/contract.md lists other fields than the code publishes"
                );
            }
        }
        let stream = std::fs::read_to_string(manifest_dir().join("src/http/events.rs")).unwrap();
        for (kind, row) in &documented {
            if row.stream_only {
                assert!(
                    stream.contains(&format!("\"{kind}\"")),
                    "`{kind}` is documented as a stream event but http/events.rs never writes it"
                );
            } else {
                assert!(
                    published.contains_key(kind),
                    "docs/contract.md documents `{kind}`, which the host never publishes"
                );
            }
        }
    }
}
