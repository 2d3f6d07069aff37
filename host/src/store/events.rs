//! The event history kept across a restart (schema 5): written whole at a
//! clean shutdown, read back at the next start (`event.rs`, "What is kept
//! across a restart").

use rusqlite::{params, Connection};

use super::StoreError;

/// One kept event: its id, type and JSON as it was served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredEvent {
    /// The event's id.
    pub id: u64,
    /// Its type, e.g. `job.finished`.
    pub kind: String,
    /// `{"id", "type", "properties"}`.
    pub json: String,
}

/// Replaces the kept events with `events`.
pub(super) fn save(conn: &Connection, events: &[StoredEvent]) -> Result<(), StoreError> {
    conn.execute("DELETE FROM events", [])?;
    let mut insert =
        conn.prepare_cached("INSERT INTO events (id, type, body) VALUES (?1, ?2, ?3)")?;
    for event in events {
        let id = i64::try_from(event.id).map_err(|_| {
            StoreError::unsaved(format!("event id {} does not fit the store", event.id))
        })?;
        insert.execute(params![id, event.kind, event.json])?;
    }
    Ok(())
}

/// The kept events, oldest first.
pub(super) fn load(conn: &Connection) -> Result<Vec<StoredEvent>, StoreError> {
    let mut select = conn.prepare("SELECT id, type, body FROM events ORDER BY id")?;
    let rows = select.query_map([], |row| {
        Ok(StoredEvent {
            id: u64::try_from(row.get::<_, i64>(0)?).unwrap_or(0),
            kind: row.get(1)?,
            json: row.get(2)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
