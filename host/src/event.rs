//! The host's event bus: one history of published events that the HTTP
//! event stream, plugin subscriptions and in-process readers all read.
//!
//! Why a history and not a channel per reader: a reader that stops reading
//! must not cost memory (docs/contract.md, "Events"). Every event is
//! serialised once, when it is published, into the bytes of its SSE frame
//! (`id: N\ndata: {json}\n\n`), and kept in one bounded history; a reader is
//! only a cursor (the id of the next event it wants). Readers share the
//! bytes (`Bytes` clones are reference counts), so a thousand readers cost
//! one serialisation per event, and a stuck reader holds nothing but its
//! cursor. The history is bounded in events *and* in bytes
//! ([`HistoryLimits`]); the oldest events go first. A reader whose next
//! event was dropped is told how many it missed (`stream.lagged`) and goes
//! on from the oldest event still held.
//!
//! The same history serves replay: every event has an id, and a client that
//! reconnects with the id of the last event it saw (`Last-Event-ID`) gets
//! what it missed, as far as the history reaches. Events published before
//! anyone could connect — restart recovery's notices and wakes — are in it
//! too.
//!
//! **What is kept across a restart.** At a clean shutdown the history's
//! events are written to the store ([`EventBus::kept`]), and the next run
//! starts with them in its history ([`EventBus::restore`]), so a client
//! that reconnects after the restart with `Last-Event-ID` gets what it
//! missed, as far as the history's bounds reach: the shutdown's own events
//! (questions withdrawn, jobs finished) included. Live-only types
//! ([`LIVE_ONLY`], e.g. a model's text deltas) are never kept, nor
//! replayed to a reader that resumes with `Last-Event-ID`: they mean
//! nothing once their moment is gone, and they would crowd out the events
//! that do. For readers that are only behind, the newest [`LIVE_HELD`]
//! are held, outside the history's limits. A host killed with SIGKILL keeps nothing; its clients get
//! `stream.lagged` with an unknown count, as before.
//!
//! **Start-up.** Until [`EventBus::started`] (after the plugins loaded),
//! a plugin's subscription starts at this run's first event instead of
//! now, so plugins see restart recovery's events (its `job.finished` of
//! the jobs it cancelled, its notices) although those are published
//! before any plugin could subscribe.
//!
//! Ids are increasing integers. A run of the host starts its ids at its
//! start time in microseconds since the Unix epoch, so that the ids of one
//! run are above those of the runs before it (a run would have to publish
//! more than one event per microsecond on average to overtake the next
//! run's start) and stay below 2^53, exact in JavaScript.

use std::{
    borrow::Cow,
    collections::VecDeque,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, RwLock,
    },
    time::{SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{
    broadcast::error::{RecvError, TryRecvError},
    watch,
};

pub use offstage_plugin_api::types::Event;

use crate::{store::StoredEvent, util::RwLockExt};

/// Event types that are never kept across a restart (module docs): they
/// only mean something live. `message.delta` is reserved for a model's
/// text as it streams.
pub(crate) const LIVE_ONLY: &[&str] = &["message.delta"];

/// At most this many [`LIVE_ONLY`] events are held for readers that are
/// behind; older ones leave the history first (a reader further behind
/// misses those deltas without a `stream.lagged`: the finished message,
/// `message.added`, carries the whole text).
const LIVE_HELD: usize = 256;

/// Refuses a subscription that names a type the host never publishes (a
/// typo would otherwise subscribe to nothing, silently): one error naming
/// the unknown types and listing the known ones. The known ones are
/// plugin-api's `event::ALL`, which a test below checks against
/// docs/contract.md's events table. An empty list (every event) passes.
pub(crate) fn check_subscription(types: &[String]) -> crate::error::Result<()> {
    let unknown: Vec<&str> = types
        .iter()
        .map(String::as_str)
        .filter(|kind| !offstage_plugin_api::event::ALL.contains(kind))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(crate::error::ServiceError::InvalidInput(format!(
        "subscribe: unknown event type {}; the host publishes {}",
        unknown.join(", "),
        offstage_plugin_api::event::ALL.join(", ")
    )))
}

/// How much of the past the bus keeps, for slow readers and for replay.
/// Whichever limit is reached first drops the oldest events; the newest
/// event is always kept, however large.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// At most this many events (`[events] history`).
    pub events: usize,
    /// At most this many bytes of serialised events (`[events]
    /// history_bytes`).
    pub bytes: usize,
}

impl HistoryLimits {
    /// 4,096 events or 16 MiB, whichever is reached first.
    pub const DEFAULT: HistoryLimits = HistoryLimits {
        events: 4096,
        bytes: 16 << 20,
    };
}

impl Default for HistoryLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One published event, serialised once and shared by every reader: a
/// clone shares its bytes (a reference count), so the history holds each
/// event by value and hands readers clones.
#[derive(Debug, Clone)]
pub struct Published {
    id: u64,
    /// The host's own name; owned only for events restored from the store.
    kind: Cow<'static, str>,
    /// `id: N\ndata: {json}\n\n`.
    frame: Bytes,
    /// Where the JSON starts in `frame`; it ends two bytes before the end.
    json_start: usize,
    /// The bytes the frame holds on to: its buffer's whole capacity.
    held: usize,
}

impl Published {
    /// The event's id: increasing in publication order.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The event's type, e.g. `job.finished`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The event as one SSE frame with its `id:` line (shared, not copied).
    pub fn sse_frame(&self) -> Bytes {
        self.frame.clone()
    }

    /// The event's JSON, `{"id", "type", "properties"}`.
    pub fn json(&self) -> &str {
        let json = &self.frame[self.json_start..self.frame.len() - 2];
        // The frame was built from a `String` and this range lies on ASCII
        // boundaries (the prefix is ASCII, the suffix is "\n\n").
        std::str::from_utf8(json).unwrap_or_default()
    }

    /// The event decoded into its `{type, properties}` record (a parse:
    /// for readers that want values, not bytes).
    pub fn event(&self) -> Event {
        serde_json::from_str(self.json()).unwrap_or_else(|_| Event {
            kind: self.kind.to_string(),
            properties: Value::Null,
        })
    }

    /// Bytes this event counts against [`HistoryLimits::bytes`].
    fn cost(&self) -> usize {
        self.held + std::mem::size_of::<Self>()
    }
}

/// What a reader gets next.
#[derive(Debug, Clone)]
pub enum Delivery {
    /// The next event.
    Event(Published),
    /// Events this reader wanted are no longer held. `missed` is how many,
    /// or `None` when unknown (the reader's last id is from an earlier run
    /// of the host). The reader goes on from the oldest event held.
    Lagged {
        /// How many events were lost, when known.
        missed: Option<u64>,
    },
}

/// Publishes host events and keeps the bounded history readers read.
#[derive(Clone, Debug)]
pub struct EventBus {
    inner: Arc<BusInner>,
}

#[derive(Debug)]
struct BusInner {
    history: RwLock<History>,
    /// The id the next event will get; readers wait for it to pass theirs.
    next_id: watch::Sender<u64>,
    /// The first id of this run.
    first_id: u64,
    limits: HistoryLimits,
    /// Until the host has started (see the module docs).
    starting: AtomicBool,
}

#[derive(Debug, Default)]
struct History {
    events: VecDeque<Published>,
    /// Bytes of the held events that count against the limits (all but
    /// the [`LIVE_ONLY`] ones).
    bytes: usize,
    /// How many [`LIVE_ONLY`] events are held: they count against
    /// [`LIVE_HELD`] only, never against the limits, so a long streamed
    /// answer cannot push a `job.finished` out of what replay reaches.
    live: usize,
    /// The first and last ids restored from the last run, if any.
    restored: Option<(u64, u64)>,
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus::new(HistoryLimits::DEFAULT)
    }
}

/// The shape each event is serialised as (its `id` is put in front when
/// it is numbered).
#[derive(Serialize)]
struct Wire<'a, P: ?Sized> {
    #[serde(rename = "type")]
    kind: &'a str,
    properties: &'a P,
}

/// An event serialised but not published yet: the expensive half of a
/// publication, done ahead (outside any lock) so that publishing is only
/// numbering and a push ([`EventBus::publish_all`]).
#[derive(Debug)]
pub struct PreparedEvent {
    kind: &'static str,
    /// [`FRAME_HEADROOM`] bytes left free for the frame's `id:` lines,
    /// then `{"type":...,"properties":...}`.
    buf: Vec<u8>,
}

/// Bytes kept free in front of a prepared event's JSON, where [`frame`]
/// writes `id: N\ndata: {"id":N,` once the event is numbered: the longest
/// such prefix (a 20-digit id, twice), less the JSON's `{` it replaces.
/// The frame is then the prepared buffer itself, not a copy of it.
const FRAME_HEADROOM: usize = 57;

/// The buffer a prepared event starts with: the frame's headroom and
/// room for a job's or a message's record, so that the common event is
/// serialised without growing its buffer on the way.
const PREPARED_CAPACITY: usize = 512;

impl PreparedEvent {
    /// Serialises an event of `kind` whose properties are `properties`'
    /// JSON (a record is serialised as it is, without going through a
    /// `Value`). Event types are the host's own names.
    pub fn prepare<P: Serialize + ?Sized>(kind: &'static str, properties: &P) -> PreparedEvent {
        let mut buf = Vec::with_capacity(PREPARED_CAPACITY);
        buf.resize(FRAME_HEADROOM, 0);
        if serde_json::to_writer(&mut buf, &Wire { kind, properties }).is_err() {
            // Records and `Value`s serialise (their keys are strings).
            buf.truncate(FRAME_HEADROOM);
            buf.extend_from_slice(br#"{"type":"event.unserializable","properties":null}"#);
        }
        // A large event grew its buffer by doubling: the history holds on
        // to exactly its frame instead (its `\n\n` included).
        if buf.capacity() > PREPARED_CAPACITY {
            buf.reserve_exact(2);
            buf.shrink_to(buf.len() + 2);
        }
        PreparedEvent { kind, buf }
    }

    /// The event as it will be sent.
    #[cfg(test)]
    pub(crate) fn body(&self) -> &str {
        std::str::from_utf8(&self.buf[FRAME_HEADROOM..]).expect("serialised JSON is UTF-8")
    }
}

impl EventBus {
    /// A bus keeping at most `limits` of history.
    pub fn new(limits: HistoryLimits) -> Self {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let first_id = micros.max(1);
        EventBus {
            inner: Arc::new(BusInner {
                history: RwLock::new(History::default()),
                next_id: watch::channel(first_id).0,
                first_id,
                limits: HistoryLimits {
                    events: limits.events.max(1),
                    bytes: limits.bytes,
                },
                starting: AtomicBool::new(true),
            }),
        }
    }

    /// The history's limits.
    pub fn limits(&self) -> HistoryLimits {
        self.inner.limits
    }

    /// Sends an event of `kind` to every reader: serialises it once, gives
    /// it the next id and adds it to the history, dropping the oldest
    /// events past the limits. Never waits for a reader.
    /// `properties` is serialised as it is: a record goes straight to its
    /// JSON, with no `Value` built on the way.
    pub fn publish<P: Serialize + ?Sized>(&self, kind: &'static str, properties: &P) {
        self.publish_all([PreparedEvent::prepare(kind, properties)]);
    }

    /// Publishes events serialised ahead, in order, with consecutive ids:
    /// one lock of the history and one wake-up of the readers for all of
    /// them (a move of a thousand jobs publishes thousands of events).
    pub fn publish_all(&self, events: impl IntoIterator<Item = PreparedEvent>) {
        let inner = &*self.inner;
        let mut history = inner.history.write_unpoisoned();
        // Ids are taken under the history lock: ids follow history order.
        let first = *inner.next_id.borrow();
        let mut id = first;
        for PreparedEvent { kind, buf } in events {
            let published = frame(id, Cow::Borrowed(kind), buf);
            if LIVE_ONLY.contains(&kind) {
                history.live += 1;
            } else {
                history.bytes += published.cost();
            }
            history.events.push_back(published);
            id += 1;
        }
        if id == first {
            return;
        }
        history.trim(inner.limits);
        inner.next_id.send_replace(id);
    }

    /// The held events worth keeping across a restart (not
    /// [`LIVE_ONLY`]), oldest first, for the store.
    pub(crate) fn kept(&self) -> Vec<StoredEvent> {
        let history = self.inner.history.read_unpoisoned();
        history
            .events
            .iter()
            .filter(|event| !LIVE_ONLY.contains(&event.kind()))
            .map(|event| StoredEvent {
                id: event.id,
                kind: event.kind().to_string(),
                json: event.json().to_string(),
            })
            .collect()
    }

    /// Puts the last run's kept events (from the store, oldest first) in
    /// front of this run's history, within its limits. Call it before
    /// anything is published; events with ids of this run are skipped.
    pub(crate) fn restore(&self, events: Vec<StoredEvent>) {
        let inner = &*self.inner;
        let mut history = inner.history.write_unpoisoned();
        let mut restored: VecDeque<Published> = events
            .into_iter()
            .filter(|event| event.id > 0 && event.id < inner.first_id)
            .map(|event| {
                let prefix = format!("id: {}\ndata: ", event.id);
                let frame = format!("{prefix}{}\n\n", event.json).into_bytes();
                Published {
                    id: event.id,
                    kind: Cow::Owned(event.kind),
                    held: frame.capacity(),
                    frame: Bytes::from(frame),
                    json_start: prefix.len(),
                }
            })
            .collect();
        // Increasing ids, as the history needs.
        restored.make_contiguous().sort_by_key(|event| event.id);
        let (Some(first), Some(last)) = (restored.front(), restored.back()) else {
            return;
        };
        history.restored = Some((first.id, last.id));
        history.bytes += restored.iter().map(Published::cost).sum::<usize>();
        restored.append(&mut history.events);
        history.events = restored;
        history.trim(inner.limits);
    }

    /// The host has started: from now on a plugin's subscription starts
    /// with the next event published (see the module docs).
    pub fn started(&self) {
        self.inner.starting.store(false, Ordering::Release);
    }

    /// A reader for a plugin's subscription: while the host starts, from
    /// this run's first event (restart recovery's included); after, as
    /// [`subscribe`](Self::subscribe).
    pub fn subscribe_plugin(&self) -> Subscriber {
        if self.inner.starting.load(Ordering::Acquire) {
            self.reader_from(self.inner.first_id)
        } else {
            self.subscribe()
        }
    }

    /// A new reader that sees events published from now on.
    pub fn subscribe(&self) -> Subscriber {
        let next = *self.inner.next_id.borrow();
        self.reader_from(next)
    }

    /// A reader that starts after the event with id `last_seen`
    /// (`Last-Event-ID`): it gets every later event still held, then what
    /// is published. `0` means "everything held". An id the history no
    /// longer reaches starts with a [`Delivery::Lagged`].
    pub fn subscribe_after(&self, last_seen: u64) -> Subscriber {
        let next_id = *self.inner.next_id.borrow();
        let restored = self.inner.history.read_unpoisoned().restored;
        // The oldest id this run can account for: the last run's kept
        // events, else this run's first.
        let floor = restored.map_or(self.inner.first_id, |(first, _)| first);
        if last_seen == 0 {
            let mut reader = self.reader_from(floor);
            reader.live_from = next_id;
            return reader;
        }
        let of_last_run = restored.is_some_and(|(first, last)| (first..=last).contains(&last_seen));
        if !of_last_run && (last_seen < self.inner.first_id || last_seen >= next_id) {
            // An id of another run: what came after it there is unknown.
            let mut reader = self.reader_from(floor);
            reader.unknown_gap = true;
            reader.live_from = next_id;
            return reader;
        }
        let mut reader = self.reader_from(last_seen + 1);
        reader.live_from = next_id;
        reader
    }

    fn reader_from(&self, next: u64) -> Subscriber {
        Subscriber {
            bus: self.inner.clone(),
            next,
            unknown_gap: false,
            live_from: 0,
            published: self.inner.next_id.subscribe(),
        }
    }

    /// The id of the newest event published, if any.
    pub fn last_id(&self) -> Option<u64> {
        let next = *self.inner.next_id.borrow();
        if next > self.inner.first_id {
            return Some(next - 1);
        }
        let restored = self.inner.history.read_unpoisoned().restored;
        restored.map(|(_, last)| last)
    }

    /// How many events and bytes the history holds now.
    pub fn held(&self) -> (usize, usize) {
        let history = self.inner.history.read_unpoisoned();
        (history.events.len(), history.bytes)
    }
}

impl History {
    /// Drops the oldest events past `limits`, keeping the newest.
    /// Live-only events past [`LIVE_HELD`] go first, oldest first, and
    /// count for neither limit.
    fn trim(&mut self, limits: HistoryLimits) {
        while self.live > LIVE_HELD {
            match self
                .events
                .iter()
                .position(|event| LIVE_ONLY.contains(&event.kind()))
            {
                Some(index) => {
                    self.events.remove(index);
                    self.live -= 1;
                }
                None => self.live = 0,
            }
        }
        while self.events.len() > 1
            && (self.events.len() - self.live > limits.events || self.bytes > limits.bytes)
        {
            if let Some(dropped) = self.events.pop_front() {
                if LIVE_ONLY.contains(&dropped.kind()) {
                    self.live -= 1;
                } else {
                    self.bytes -= dropped.cost();
                }
            }
        }
    }
}

/// Event `id`'s SSE frame, `id: N\ndata: {"id":N,...}\n\n`, made in
/// place in its prepared buffer (see [`FRAME_HEADROOM`]).
fn frame(id: u64, kind: Cow<'static, str>, mut buf: Vec<u8>) -> Published {
    use std::io::Write;
    // `id: N\ndata: ` then the JSON's own start, `{"id":N,`: at most 58
    // bytes, written just before the prepared JSON less its `{`.
    let mut prefix = [0u8; FRAME_HEADROOM + 1];
    let mut free = &mut prefix[..];
    let _ = write!(free, "id: {id}\ndata: ");
    let json_from = FRAME_HEADROOM + 1 - free.len();
    let _ = write!(free, "{{\"id\":{id},");
    let len = FRAME_HEADROOM + 1 - free.len();
    let start = FRAME_HEADROOM + 1 - len;
    buf[start..=FRAME_HEADROOM].copy_from_slice(&prefix[..len]);
    buf.extend_from_slice(b"\n\n");
    let held = buf.capacity();
    Published {
        id,
        kind,
        frame: Bytes::from(buf).slice(start..),
        json_start: json_from,
        held,
    }
}

/// One reader of the bus: a cursor into its history. Holds no events of its
/// own, so a reader that stops reading costs nothing but itself.
#[derive(Debug)]
pub struct Subscriber {
    bus: Arc<BusInner>,
    /// The id of the next event this reader wants.
    next: u64,
    /// Set when the reader resumed from an id of another run: its first
    /// delivery is a `Lagged` with an unknown count.
    unknown_gap: bool,
    /// A replay ([`EventBus::subscribe_after`]) skips the [`LIVE_ONLY`]
    /// events published before it was made: those are not replayed.
    live_from: u64,
    published: watch::Receiver<u64>,
}

impl Subscriber {
    /// The next delivery without waiting: `None` when this reader has seen
    /// every event published so far.
    pub fn try_next(&mut self) -> Option<Delivery> {
        if std::mem::take(&mut self.unknown_gap) {
            return Some(Delivery::Lagged { missed: None });
        }
        let history = self.bus.history.read_unpoisoned();
        let oldest = history.events.front()?.id;
        if self.next < oldest {
            let missed = oldest - self.next;
            self.next = oldest;
            return Some(Delivery::Lagged {
                missed: Some(missed),
            });
        }
        // Ids are consecutive within a run, so the index is a subtraction;
        // across the restored events of the last run it is a search.
        let guess = usize::try_from(self.next - oldest).unwrap_or(usize::MAX);
        let mut index = match history.events.get(guess) {
            Some(event) if event.id == self.next => guess,
            _ => history.events.partition_point(|event| event.id < self.next),
        };
        // What a replay skips: deltas of answers that streamed before it.
        while let Some(event) = history.events.get(index) {
            if event.id >= self.live_from || !LIVE_ONLY.contains(&event.kind()) {
                break;
            }
            index += 1;
        }
        let Some(event) = history.events.get(index).cloned() else {
            // Only skipped events were left: wait past them.
            if let Some(last) = history.events.back() {
                self.next = self.next.max(last.id + 1);
            }
            return None;
        };
        self.next = event.id + 1;
        Some(Delivery::Event(event))
    }

    /// The next delivery, waiting for an event to be published when the
    /// reader is up to date. `None` when the bus is gone. Cancel-safe: an
    /// event is either returned or left for the next call.
    pub async fn next(&mut self) -> Option<Delivery> {
        loop {
            if let Some(delivery) = self.try_next() {
                return Some(delivery);
            }
            let wanted = self.next;
            self.published
                .wait_for(|&next_id| next_id > wanted)
                .await
                .ok()?;
        }
    }

    /// The next event as a record, like `tokio::sync::broadcast::Receiver::recv`:
    /// `Err(Lagged(n))` when events were lost (`n` is 0 when the count is
    /// unknown).
    pub async fn recv(&mut self) -> Result<Event, RecvError> {
        match self.next().await {
            Some(Delivery::Event(event)) => Ok(event.event()),
            Some(Delivery::Lagged { missed }) => Err(RecvError::Lagged(missed.unwrap_or(0))),
            None => Err(RecvError::Closed),
        }
    }

    /// [`recv`](Self::recv) without waiting.
    pub fn try_recv(&mut self) -> Result<Event, TryRecvError> {
        match self.try_next() {
            Some(Delivery::Event(event)) => Ok(event.event()),
            Some(Delivery::Lagged { missed }) => Err(TryRecvError::Lagged(missed.unwrap_or(0))),
            None => Err(TryRecvError::Empty),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ids(reader: &mut Subscriber) -> Vec<u64> {
        let mut ids = Vec::new();
        while let Some(delivery) = reader.try_next() {
            if let Delivery::Event(event) = delivery {
                ids.push(event.id());
            }
        }
        ids
    }

    #[test]
    fn events_get_increasing_ids_and_their_json_carries_the_id() {
        let bus = EventBus::default();
        let mut reader = bus.subscribe();
        bus.publish("a.one", &json!({ "n": 1 }));
        bus.publish("a.two", &json!({ "text": "line\nbreak" }));
        let Some(Delivery::Event(first)) = reader.try_next() else {
            panic!("no event")
        };
        let Some(Delivery::Event(second)) = reader.try_next() else {
            panic!("no event")
        };
        assert_eq!(second.id(), first.id() + 1);
        let json: Value = serde_json::from_str(second.json()).unwrap();
        assert_eq!(
            json,
            json!({ "id": second.id(), "type": "a.two", "properties": { "text": "line\nbreak" } })
        );
        let frame = second.sse_frame();
        let text = std::str::from_utf8(&frame).unwrap();
        assert!(text.starts_with(&format!("id: {}\ndata: {{", second.id())));
        assert!(text.ends_with("}\n\n"));
        assert_eq!(text.matches('\n').count(), 3, "one id line, one data line");
        assert_eq!(second.event().kind, "a.two");
        assert!(reader.try_next().is_none());
    }

    #[test]
    fn a_frame_is_made_in_its_prepared_buffer_whatever_the_id() {
        let big = "x".repeat(2000);
        for id in [1, 1_733_000_000_000_000, u64::MAX] {
            for properties in [json!({ "n": 1 }), json!({ "big": big })] {
                let prepared = PreparedEvent::prepare("test.tick", &properties);
                let published = frame(id, Cow::Borrowed(prepared.kind), prepared.buf);
                let json = format!(r#"{{"id":{id},"type":"test.tick","properties":{properties}}}"#);
                assert_eq!(published.sse_frame(), format!("id: {id}\ndata: {json}\n\n"));
                assert_eq!(published.json(), json);
                assert_eq!(published.kind(), "test.tick");
            }
        }
    }

    #[test]
    fn the_history_is_bounded_in_bytes_and_keeps_the_newest_event() {
        let bus = EventBus::new(HistoryLimits {
            events: 1000,
            bytes: 64 * 1024,
        });
        let big = "x".repeat(10 * 1024);
        for n in 0..100 {
            bus.publish("test.big", &json!({ "n": n, "big": big }));
        }
        let (events, bytes) = bus.held();
        assert!(bytes <= 64 * 1024, "{bytes} bytes held");
        assert!((5..=6).contains(&events), "{events} events held");
        // One event larger than the whole limit is still kept (alone).
        bus.publish("test.huge", &json!({ "big": "y".repeat(100 * 1024) }));
        assert_eq!(bus.held().0, 1);
    }

    #[test]
    fn a_reader_behind_the_history_is_told_how_many_it_missed_then_goes_on() {
        let bus = EventBus::new(HistoryLimits {
            events: 10,
            bytes: usize::MAX,
        });
        let mut reader = bus.subscribe();
        for n in 0..25 {
            bus.publish("test.tick", &json!({ "n": n }));
        }
        match reader.try_next() {
            Some(Delivery::Lagged { missed }) => assert_eq!(missed, Some(15)),
            other => panic!("expected a lag, got {other:?}"),
        }
        let rest: Vec<u64> = std::iter::from_fn(|| match reader.try_next() {
            Some(Delivery::Event(e)) => Some(e.event().properties["n"].as_u64().unwrap()),
            _ => None,
        })
        .collect();
        assert_eq!(rest, (15..25).collect::<Vec<_>>());
    }

    #[test]
    fn deltas_never_push_other_events_out_of_replay() {
        let bus = EventBus::new(HistoryLimits {
            events: 4,
            bytes: 1 << 20,
        });
        bus.publish("job.finished", &json!({ "id": "job_1" }));
        for n in 0..(LIVE_HELD * 3) {
            bus.publish("message.delta", &json!({ "delta": n.to_string() }));
        }
        let mut reader = bus.subscribe_after(0);
        let mut kinds = Vec::new();
        while let Some(Delivery::Event(event)) = reader.try_next() {
            kinds.push(event.kind().to_string());
        }
        assert_eq!(
            kinds,
            ["job.finished"],
            "replay reaches it; no delta is replayed"
        );
        assert_eq!(
            bus.held().0,
            1 + LIVE_HELD,
            "only the newest deltas are held"
        );
        assert!(bus.kept().iter().all(|e| e.kind != "message.delta"));
        // Readers get the deltas published after they came.
        let mut live = bus.subscribe();
        let mut replay = bus.subscribe_after(0);
        assert!(
            matches!(replay.try_next(), Some(Delivery::Event(e)) if e.kind() == "job.finished")
        );
        assert!(replay.try_next().is_none());
        bus.publish("message.delta", &json!({ "delta": "new" }));
        for reader in [&mut live, &mut replay] {
            match reader.try_next() {
                Some(Delivery::Event(event)) => assert_eq!(event.kind(), "message.delta"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn replay_starts_after_the_last_seen_id_and_zero_means_everything_held() {
        let bus = EventBus::default();
        for n in 0..5 {
            bus.publish("test.tick", &json!({ "n": n }));
        }
        let all = ids(&mut bus.subscribe_after(0));
        assert_eq!(all.len(), 5);
        assert_eq!(ids(&mut bus.subscribe_after(all[2])), all[3..].to_vec());
        assert!(ids(&mut bus.subscribe_after(all[4])).is_empty());
        assert!(ids(&mut bus.subscribe()).is_empty());
        assert_eq!(bus.last_id(), Some(all[4]));
    }

    #[test]
    fn an_id_of_another_run_gets_an_unknown_lag_then_everything_held() {
        let bus = EventBus::default();
        bus.publish("test.tick", &json!({}));
        let mut reader = bus.subscribe_after(17);
        assert!(matches!(
            reader.try_next(),
            Some(Delivery::Lagged { missed: None })
        ));
        assert_eq!(ids(&mut reader).len(), 1);
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_for_the_next_event() {
        let bus = EventBus::default();
        let mut reader = bus.subscribe();
        let publisher = bus.clone();
        let task = tokio::spawn(async move { reader.recv().await.unwrap() });
        tokio::task::yield_now().await;
        publisher.publish("test.later", &json!({ "ok": true }));
        let event = task.await.unwrap();
        assert_eq!(event.kind, "test.later");
        assert_eq!(event.properties["ok"], true);
    }
}

#[cfg(test)]
mod contract_table {
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

    /// `publish("type", &json!({ "a": .., "b": .. }))` (or
    /// `PreparedEvent::prepare("type", ..)`) in the host's source:
    /// each type with the fields of its in-place payloads (`None` for a
    /// payload that is a variable, i.e. a record).
    fn published() -> BTreeMap<String, Vec<Option<BTreeSet<String>>>> {
        let mut files = Vec::new();
        rust_files(&manifest_dir().join("src"), &mut files);
        let mut found: BTreeMap<String, Vec<Option<BTreeSet<String>>>> = BTreeMap::new();
        for file in files {
            if file.file_name().is_some_and(|name| name == "tests.rs") {
                continue; // a test module of its own
            }
            let text = std::fs::read_to_string(&file).unwrap();
            // What a file's own tests publish is theirs, not the host's.
            let text = match text.find("#[cfg(test)]\nmod ") {
                Some(tests) => &text[..tests],
                None => &text[..],
            };
            // Published at once, or serialised ahead and published later.
            let calls = [".publish(", "PreparedEvent::prepare("]
                .into_iter()
                .flat_map(|call| text.match_indices(call));
            for (at, call) in calls {
                let rest = text[at + call.len()..].trim_start();
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
                let after = rest[kind.len() + 1..].trim_start_matches([',', ' ', '\n', '&']);
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
            // Each payload written in place has only documented fields; when
            // every payload is, together they have every documented field
            // (a field may be present in some payloads only, e.g. `errors`).
            let in_place: Vec<_> = payloads.iter().flatten().collect();
            for fields in &in_place {
                let documented = row.fields.as_ref().unwrap_or_else(|| {
                    panic!(
                        "`{kind}`: docs/contract.md lists no fields; the code publishes {fields:?}"
                    )
                });
                assert!(
                    fields.is_subset(documented),
                    "`{kind}`: the code publishes {fields:?}, docs/contract.md lists {documented:?}"
                );
            }
            if !in_place.is_empty() && in_place.len() == payloads.len() {
                let all: BTreeSet<String> = in_place.into_iter().flatten().cloned().collect();
                assert_eq!(
                    row.fields.as_ref(),
                    Some(&all),
                    "`{kind}`: docs/contract.md lists fields the code never publishes"
                );
            }
        }
        // The stream-only types are the HTTP server's to write.
        #[cfg(feature = "server")]
        let stream = std::fs::read_to_string(manifest_dir().join("src/http/events.rs")).unwrap();
        #[cfg(not(feature = "server"))]
        let stream = String::new();
        for (kind, row) in &documented {
            if row.stream_only {
                assert!(
                    cfg!(not(feature = "server")) || stream.contains(&format!("\"{kind}\"")),
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

    /// plugin-api's event names and payload types against the table: every
    /// documented type a plugin can get (all but the stream's own) has a
    /// constant in `offstage_plugin_api::event::ALL`, every constant is
    /// documented, and a payload written out in the table (`{a, b}`) is
    /// read by a payload struct with exactly those fields.
    #[test]
    fn plugin_api_names_every_documented_event() {
        use offstage_plugin_api::event;
        let documented = documented();
        let subscribable: BTreeSet<&str> = documented
            .iter()
            .filter(|(_, row)| !row.stream_only)
            .map(|(kind, _)| kind.as_str())
            .collect();
        let named: BTreeSet<&str> = event::ALL.iter().copied().collect();
        let missing: Vec<&&str> = subscribable.difference(&named).collect();
        assert!(
            missing.is_empty(),
            "docs/contract.md documents {missing:?}, which have no constant (and payload \
             type) in plugin-api/src/event.rs"
        );
        let undocumented: Vec<&&str> = named.difference(&subscribable).collect();
        assert!(
            undocumented.is_empty(),
            "plugin-api/src/event.rs names {undocumented:?}, which docs/contract.md's \
             events table does not document"
        );
        for kind in event::ALL {
            let row = &documented[*kind];
            let fields: Option<BTreeSet<String>> =
                event::payload_fields(kind).map(|f| f.into_iter().collect());
            assert_eq!(
                fields.as_ref(),
                row.fields.as_ref(),
                "`{kind}`: the payload struct's fields and docs/contract.md's differ"
            );
        }
    }

    #[test]
    fn a_subscription_to_an_unknown_type_is_refused_with_the_known_ones() {
        super::check_subscription(&["job.finished".into()]).unwrap();
        super::check_subscription(&[]).unwrap();
        let error = super::check_subscription(&["job.finish".into(), "session.created".into()])
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown event type job.finish;"), "{error}");
        assert!(error.contains("job.finished"), "{error}");
        assert!(!error.contains("server.connected"), "{error}");
    }
}
