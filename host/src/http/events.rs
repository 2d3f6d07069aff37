//! `GET /api/event`: the host's event bus as Server-Sent Events.
//!
//! Each SSE `data:` line is one JSON `Event {type, properties}`. The stream
//! opens with a `server.connected` event, so a client knows from when on it
//! sees everything; comments keep idle connections alive through proxies.
//! The bus never waits for a reader: a client that falls more than the
//! bus's capacity behind gets a `stream.lagged` event saying how many events
//! it missed, then carries on with the next one.

use std::{convert::Infallible, time::Duration};

use axum::{
    extract::State,
    response::sse::{Event as SseEvent, KeepAlive, Sse},
};
use futures_util::{stream, Stream, StreamExt};
use offstage_plugin_api::types::Event;
use serde_json::json;
use tokio::sync::{
    broadcast::{self, error::RecvError},
    watch,
};

use super::AppState;
use utoipa_axum::{router::OpenApiRouter, routes};

/// Registers this file's route with its OpenAPI entry.
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(events))
}

/// How often an idle stream sends a keep-alive comment.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

#[utoipa::path(get, path = "/api/event", tag = "event",
    responses((status = 200, description = "Server-Sent Events; each `data:` is one Event",
        content_type = "text/event-stream", body = Event)))]
pub(crate) async fn events(
    State(state): State<AppState>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let events = event_stream(state.service.events().subscribe(), state.shutdown.clone())
        .map(|event| Ok(to_sse(&event)));
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

/// `server.connected`, then every event from `receiver` — with a
/// `stream.lagged` event in place of those a slow reader lost — until the
/// bus closes or `shutdown` turns true.
pub(crate) fn event_stream(
    receiver: broadcast::Receiver<Event>,
    shutdown: watch::Receiver<bool>,
) -> impl Stream<Item = Event> {
    let hello = Event {
        kind: "server.connected".into(),
        properties: json!({ "version": env!("CARGO_PKG_VERSION") }),
    };
    let rest = stream::unfold(receiver, move |mut receiver| {
        let mut shutdown = shutdown.clone();
        async move {
            // Shutdown ends the stream even when no event comes.
            let event = tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => return None,
                received = receiver.recv() => match received {
                    Ok(event) => event,
                    Err(RecvError::Lagged(missed)) => Event {
                        kind: "stream.lagged".into(),
                        properties: json!({ "missed": missed }),
                    },
                    Err(RecvError::Closed) => return None,
                },
            };
            Some((event, receiver))
        }
    });
    stream::iter([hello]).chain(rest)
}

fn to_sse(event: &Event) -> SseEvent {
    SseEvent::default().json_data(event).unwrap_or_else(|_| {
        SseEvent::default().data("{\"type\":\"stream.unserializable\",\"properties\":{}}")
    })
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use serde_json::json;

    use super::*;
    use crate::event::EventBus;

    #[tokio::test]
    async fn a_lagging_reader_is_told_how_many_events_it_lost() {
        let bus = EventBus::default();
        let (_stop, shutdown) = watch::channel(false);
        let mut events = Box::pin(event_stream(bus.subscribe(), shutdown));
        assert_eq!(events.next().await.unwrap().kind, "server.connected");
        // Far more than the bus holds for one reader.
        let sent = 10_000;
        for n in 0..sent {
            bus.publish("test.tick", json!({ "n": n }));
        }
        let lagged = events.next().await.unwrap();
        assert_eq!(lagged.kind, "stream.lagged");
        let missed = lagged.properties["missed"].as_u64().unwrap();
        assert!(missed > 0);
        // It carries on with the oldest event still held, in order, to the last.
        let next = events.next().await.unwrap();
        assert_eq!(next.kind, "test.tick");
        assert_eq!(next.properties["n"].as_u64().unwrap(), missed);
        let mut last = next;
        for _ in missed + 1..sent {
            last = events.next().await.unwrap();
        }
        assert_eq!(last.properties["n"], sent - 1);
    }

    #[tokio::test]
    async fn shutdown_ends_the_stream() {
        let bus = EventBus::default();
        let (stop, shutdown) = watch::channel(false);
        let mut events = Box::pin(event_stream(bus.subscribe(), shutdown));
        events.next().await.unwrap();
        stop.send(true).unwrap();
        assert!(events.next().await.is_none());
    }
}
