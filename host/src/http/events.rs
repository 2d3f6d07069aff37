//! `GET /api/event`: the host's event bus as Server-Sent Events.
//!
//! Each event is one SSE frame, `id: N` and one `data:` line holding the
//! JSON `{id, type, properties}`. The frame's bytes are made once, when the
//! event is published (`event.rs`), and every stream writes the same
//! buffer: the cost of an event does not grow with the number of readers,
//! and a reader that stops reading holds no events (the bus keeps one
//! bounded history; a reader is a cursor into it).
//!
//! The stream opens with a `server.connected` event (no id), so a client
//! knows from when on it sees everything; comments keep idle connections
//! alive through proxies. A client that reconnects with `Last-Event-ID`
//! (or asks with `?since=ID`; `0` is everything held) first gets the held
//! events after that id. A reader that falls behind what the history holds,
//! or asks for more than it holds, gets a `stream.lagged` event saying how
//! many events it missed, then carries on with the oldest event held.

use std::{convert::Infallible, time::Duration};

use axum::{
    body::{Body, Bytes},
    extract::State,
    http::{header, HeaderMap, HeaderValue},
    response::{IntoResponse, Response},
};
use futures_util::{stream, Stream};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;

use super::{
    error::{ApiError, ApiResult, ErrorBody},
    extract::QueryParams,
    AppState,
};
use crate::event::{Delivery, Subscriber};
use utoipa_axum::{router::OpenApiRouter, routes};

/// Registers this file's route with its OpenAPI entry.
pub(super) fn routes(api: OpenApiRouter<AppState>) -> OpenApiRouter<AppState> {
    api.routes(routes!(events))
}

/// How often an idle stream sends a keep-alive comment.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Query of `GET /api/event`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Replay the held events after this id first (`0`: every event held).
    /// A `Last-Event-ID` header wins over it, so an `EventSource` that
    /// reconnects resumes where it was.
    pub since: Option<u64>,
}

#[utoipa::path(get, path = "/api/event", tag = "event",
    params(
        EventsQuery,
        ("Last-Event-ID" = Option<String>, Header,
            description = "Resume after this event id (the `id:` of an SSE frame, digits): the held \
                events after it come first. Sent as the header's text, as `EventSource` does."),
    ),
    responses(
        (status = 200, description = "Server-Sent Events. Each frame is `id: N` and one \
            `data:` line holding one `StreamEvent`; `server.connected` and `stream.lagged` \
            have no id.", content_type = "text/event-stream", body = super::event_schema::StreamEvent),
        (status = 400, description = "`since` or `Last-Event-ID` is not an event id (digits)", body = ErrorBody),
    ))]
pub(crate) async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    QueryParams(query): QueryParams<EventsQuery>,
) -> ApiResult<Response> {
    let bus = state.service.events();
    let resume = match headers.get("last-event-id") {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request("Last-Event-ID must be an event id (a number)")
                })?,
        ),
        None => query.since,
    };
    let reader = match resume {
        Some(last_seen) => bus.subscribe_after(last_seen),
        None => bus.subscribe(),
    };
    let hello = json!({
        "type": "server.connected",
        "properties": {
            "version": env!("CARGO_PKG_VERSION"),
            "last_event_id": bus.last_id(),
            "history": { "events": bus.limits().events, "bytes": bus.limits().bytes },
        },
    });
    let body = Body::from_stream(frames(hello_frame(&hello), reader, state.shutdown.clone()));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response())
}

fn hello_frame(hello: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {hello}\n\n"))
}

/// The frame of a `stream.lagged` event (made per reader: it is rare).
fn lagged_frame(missed: Option<u64>) -> Bytes {
    let event = json!({ "type": "stream.lagged", "properties": { "missed": missed } });
    Bytes::from(format!("data: {event}\n\n"))
}

/// A keep-alive comment.
const KEEP_ALIVE_FRAME: &[u8] = b":\n\n";

/// `hello`, then the frame of every delivery from `reader` — shared bytes
/// for events, a `stream.lagged` frame where events were lost — with a
/// keep-alive comment after [`KEEP_ALIVE`] without one, until the bus goes
/// or `shutdown` turns true. The host raises `shutdown` once its own
/// shutdown's events (jobs cancelled, questions withdrawn) are published,
/// so a stream ends after writing every event published before then.
pub(crate) fn frames(
    hello: Bytes,
    reader: Subscriber,
    shutdown: watch::Receiver<bool>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let rest = stream::unfold(
        (reader, shutdown, false),
        |(mut reader, mut shutdown, mut draining)| async move {
            if !draining {
                let frame = tokio::select! {
                    biased;
                    // Shutdown ends the stream even when no event comes,
                    // after what is already published.
                    _ = shutdown.wait_for(|stop| *stop) => None,
                    delivery = reader.next() => Some(delivery_frame(delivery?)),
                    _ = tokio::time::sleep(KEEP_ALIVE) => Some(Bytes::from_static(KEEP_ALIVE_FRAME)),
                };
                match frame {
                    Some(frame) => return Some((Ok(frame), (reader, shutdown, false))),
                    None => draining = true,
                }
            }
            let frame = delivery_frame(reader.try_next()?);
            Some((Ok(frame), (reader, shutdown, draining)))
        },
    );
    futures_util::StreamExt::chain(stream::iter([Ok(hello)]), rest)
}

fn delivery_frame(delivery: Delivery) -> Bytes {
    match delivery {
        Delivery::Event(event) => event.sse_frame(),
        Delivery::Lagged { missed } => lagged_frame(missed),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use serde_json::{json, Value};

    use super::*;
    use crate::event::{EventBus, HistoryLimits};

    /// The JSON of one `data:` frame.
    fn data(frame: &Bytes) -> Value {
        let text = std::str::from_utf8(frame).unwrap();
        let data = text
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .unwrap_or_else(|| panic!("no data in {text:?}"));
        serde_json::from_str(data).unwrap()
    }

    /// The frames of `reader` after a minimal hello, and the switch that
    /// shuts the stream down.
    fn stream_of(
        reader: Subscriber,
    ) -> (
        watch::Sender<bool>,
        impl Stream<Item = Result<Bytes, Infallible>>,
    ) {
        let (stop, shutdown) = watch::channel(false);
        let hello = hello_frame(&json!({ "type": "server.connected", "properties": {} }));
        (stop, frames(hello, reader, shutdown))
    }

    #[tokio::test]
    async fn a_lagging_reader_is_told_how_many_events_it_lost() {
        let bus = EventBus::new(HistoryLimits {
            events: 4096,
            bytes: usize::MAX,
        });
        let (_stop, events) = stream_of(bus.subscribe());
        let mut events = Box::pin(events);
        let hello = events.next().await.unwrap().unwrap();
        assert_eq!(data(&hello)["type"], "server.connected");
        // Far more than the bus holds.
        let sent = 10_000;
        for n in 0..sent {
            bus.publish("test.tick", &json!({ "n": n }));
        }
        let lagged = data(&events.next().await.unwrap().unwrap());
        assert_eq!(lagged["type"], "stream.lagged");
        let missed = lagged["properties"]["missed"].as_u64().unwrap();
        assert_eq!(missed, sent - 4096);
        // It carries on with the oldest event still held, in order, to the last.
        let next = data(&events.next().await.unwrap().unwrap());
        assert_eq!(next["type"], "test.tick");
        assert_eq!(next["properties"]["n"].as_u64().unwrap(), missed);
        let mut last = next;
        for _ in missed + 1..sent {
            last = data(&events.next().await.unwrap().unwrap());
        }
        assert_eq!(last["properties"]["n"], sent - 1);
    }

    #[tokio::test]
    async fn each_event_frame_is_the_shared_buffer_with_its_id() {
        let bus = EventBus::default();
        let (_stop, events) = stream_of(bus.subscribe());
        let mut events = Box::pin(events);
        events.next().await.unwrap().unwrap();
        bus.publish("test.tick", &json!({ "n": 1 }));
        let frame = events.next().await.unwrap().unwrap();
        let mut again = bus.subscribe_after(0);
        let Some(Delivery::Event(held)) = again.try_next() else {
            panic!("not held")
        };
        // The same allocation, not a copy.
        assert_eq!(frame.as_ptr(), held.sse_frame().as_ptr());
        assert!(std::str::from_utf8(&frame)
            .unwrap()
            .starts_with(&format!("id: {}\n", held.id())));
    }

    #[tokio::test]
    async fn shutdown_ends_the_stream_after_what_was_published_before_it() {
        let bus = EventBus::default();
        let (stop, events) = stream_of(bus.subscribe());
        let mut events = Box::pin(events);
        events.next().await.unwrap().unwrap();
        bus.publish("test.one", &json!({}));
        bus.publish("test.two", &json!({}));
        stop.send(true).unwrap();
        let one = data(&events.next().await.unwrap().unwrap());
        let two = data(&events.next().await.unwrap().unwrap());
        assert_eq!(
            (one["type"].as_str(), two["type"].as_str()),
            (Some("test.one"), Some("test.two"))
        );
        assert!(events.next().await.is_none());
    }
}
