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
