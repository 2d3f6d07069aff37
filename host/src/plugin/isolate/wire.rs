//! The channel between the host and an isolated plugin's process: one
//! generic request/reply peer, the same on both ends.
//!
//! Why one peer and no per-method code: every record already crosses the
//! ABI as JSON text (ARCHITECTURE.md §ABI-4), so a request is an operation
//! name plus that text, and a reply is that text or an error. Frames are
//! length-delimited (tokio-util's codec) and carry JSON; each request has
//! an id, either side may have any number in flight, and a caller that
//! drops its future sends `cancel`, which aborts the handler on the other
//! side (dropping the plugin's or the host's future there).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::{
    net::UnixStream,
    runtime::Handle,
    sync::{mpsc, oneshot},
    task::AbortHandle,
};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use crate::{
    error::Result,
    error::ServiceError,
    plugin::abi::{error_from_wire, error_to_wire},
    util::BoxFuture,
    util::LockExt,
};

/// Largest frame either side accepts (a tool's whole output may cross).
const MAX_FRAME: usize = 256 * 1024 * 1024;

/// What kind of hook a plugin registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(in crate::plugin) enum HookKind {
    /// `add_tool`: `name` is the tool's spec (JSON).
    Tool,
    /// `wrap_tool`: `name` is the wrapped tool's name.
    Wrapper,
    /// `register_agent`: `name` is the agent's name.
    Agent,
    /// `subscribe`: `name` is the event types (JSON list).
    Subscription,
}

/// A request; each names the side that sends it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(in crate::plugin) enum Request {
    /// Host → child: run the loader checks and read the manifest (reply:
    /// the manifest as JSON).
    Open,
    /// Host → child: `init` the plugin as this generation.
    Init {
        /// The plugin's name.
        name: String,
        /// The generation number the host gave it.
        generation: u64,
        /// Its options, a JSON object.
        options: String,
        /// What the previous generation exported.
        previous_state: Option<String>,
        /// `RLIMIT_AS` to set before `init`, in bytes.
        memory_limit: Option<u64>,
        /// `RLIMIT_CPU` to set before `init`, in seconds.
        cpu_limit: Option<u64>,
    },
    /// Host → child: call a tool, agent or event hook.
    Invoke {
        /// The hook's id (from `Register`).
        hook: u64,
        /// The JSON the hook takes.
        input: String,
    },
    /// Host → child: call a tool wrapper; its `next` stays in the host.
    Wrap {
        /// The wrapper's id.
        hook: u64,
        /// The tool call (JSON).
        input: String,
        /// The host's id for the `next` the wrapper may call.
        next: u64,
    },
    /// Host → child: the plugin's `export_state` (reply: JSON `null` or string).
    Export,
    /// Host → child: the plugin's `shutdown`.
    Shutdown,
    /// Host → child: are you there? Answered by the child's runtime, not
    /// by plugin code.
    Ping,
    /// Child → host: a session-domain method, by its name in the table.
    Session {
        /// The method's name (`get`, `call_tool`, ...).
        method: String,
        /// Its arguments (JSON).
        args: String,
    },
    /// Child → host: the plugin registered a hook.
    Register {
        /// What kind.
        kind: HookKind,
        /// The tool spec, tool name, agent name or event types.
        name: String,
        /// The child's id for it.
        hook: u64,
    },
    /// Child → host: a wrapper calls the `next` it was given.
    Next {
        /// The host's id of the `next`.
        next: u64,
        /// The tool call (JSON).
        input: String,
    },
}

/// A one-way message.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "note", rename_all = "snake_case")]
pub(in crate::plugin) enum Note {
    /// Child → host: a log record of the plugin.
    Log {
        /// 1 error … 5 trace.
        level: u8,
        /// Its target.
        target: String,
        /// The message.
        message: String,
    },
    /// Host → child: the host let go of a hook; free it.
    DropHook {
        /// The hook's id.
        hook: u64,
    },
    /// Child → host: the wrapper dropped a `next` without calling it.
    DropNext {
        /// The host's id of the `next`.
        next: u64,
    },
}

/// An error as it crosses: the ABI's kind number and message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(in crate::plugin) struct WireError {
    kind: u32,
    message: String,
}

impl From<ServiceError> for WireError {
    fn from(error: ServiceError) -> Self {
        let (kind, message) = error_to_wire(error);
        WireError { kind, message }
    }
}

impl From<WireError> for ServiceError {
    fn from(error: WireError) -> Self {
        error_from_wire(error.kind, error.message)
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum Frame {
    Call {
        id: u64,
        request: Request,
    },
    Reply {
        id: u64,
        result: std::result::Result<String, WireError>,
    },
    Cancel {
        id: u64,
    },
    Note {
        note: Note,
    },
}

/// What a peer does with what the other side sends.
pub(in crate::plugin) trait Handler: Send + Sync + 'static {
    /// Answers a request.
    fn call(self: Arc<Self>, request: Request) -> BoxFuture<Result<String>>;
    /// Takes a note.
    fn note(&self, note: Note);
}

/// One end of the channel.
pub(in crate::plugin) struct Peer {
    out: mpsc::UnboundedSender<Frame>,
    pending: Mutex<Pending>,
    incoming: Mutex<HashMap<u64, AbortHandle>>,
    ids: AtomicU64,
}

#[derive(Default)]
struct Pending {
    waiting: HashMap<u64, oneshot::Sender<Result<String>>>,
    /// Set once the channel is gone: every call fails with it.
    closed: Option<WireError>,
}

impl Peer {
    /// Starts a peer over `stream`: its reading and writing run on `io`
    /// (whose reactor `stream` is registered with), the handlers of the
    /// other side's requests on `work`. `handler` gets the peer before the
    /// first frame is read, so a handler that calls back through the peer
    /// has it from the first request on. The returned future completes when
    /// the other side has closed the channel (or broken it); calls still
    /// waiting then wait for [`Peer::close`].
    ///
    /// Why two runtimes: in a plugin's process, plugin code can hold a
    /// worker forever (a synchronous loop); the channel must not sit behind
    /// it, so the child gives it a thread of its own.
    pub(in crate::plugin) fn start(
        stream: UnixStream,
        handler: impl FnOnce(&Arc<Peer>) -> Arc<dyn Handler>,
        io: &Handle,
        work: &Handle,
    ) -> (Arc<Peer>, tokio::task::JoinHandle<()>) {
        let runtime = io;
        let (read, write) = stream.into_split();
        let (out, mut queue) = mpsc::unbounded_channel::<Frame>();
        let peer = Arc::new(Peer {
            out,
            pending: Mutex::new(Pending::default()),
            incoming: Mutex::new(HashMap::new()),
            ids: AtomicU64::new(1),
        });
        let codec = || {
            LengthDelimitedCodec::builder()
                .max_frame_length(MAX_FRAME)
                .new_codec()
        };
        let mut sink = FramedWrite::new(write, codec());
        runtime.spawn(async move {
            while let Some(frame) = queue.recv().await {
                let bytes = match serde_json::to_vec(&frame) {
                    Ok(bytes) => bytes,
                    Err(error) => {
                        tracing::error!(%error, "cannot encode a frame for a plugin process");
                        continue;
                    }
                };
                if sink.send(bytes.as_slice()).await.is_err() {
                    break;
                }
            }
        });
        let handler = handler(&peer);
        let mut frames = FramedRead::new(read, codec());
        let reader = Arc::clone(&peer);
        let handle = work.clone();
        let done = runtime.spawn(async move {
            while let Some(Ok(bytes)) = frames.next().await {
                let frame: Frame = match serde_json::from_slice(&bytes) {
                    Ok(frame) => frame,
                    Err(error) => {
                        tracing::error!(%error, "a plugin process sent a bad frame; channel closed");
                        break;
                    }
                };
                reader.receive(frame, &handler, &handle);
            }
        });
        (peer, done)
    }

    fn receive(self: &Arc<Self>, frame: Frame, handler: &Arc<dyn Handler>, runtime: &Handle) {
        match frame {
            Frame::Reply { id, result } => {
                let waiter = self.pending.lock_unpoisoned().waiting.remove(&id);
                if let Some(waiter) = waiter {
                    let _ = waiter.send(result.map_err(ServiceError::from));
                }
            }
            Frame::Call { id, request } => {
                let (peer, handler) = (Arc::clone(self), Arc::clone(handler));
                // Held while spawning, so the task's own removal comes after
                // the insert.
                let mut incoming = self.incoming.lock_unpoisoned();
                let task = runtime.spawn(async move {
                    let result = handler.call(request).await.map_err(WireError::from);
                    peer.incoming.lock_unpoisoned().remove(&id);
                    let _ = peer.out.send(Frame::Reply { id, result });
                });
                incoming.insert(id, task.abort_handle());
            }
            Frame::Cancel { id } => {
                if let Some(task) = self.incoming.lock_unpoisoned().remove(&id) {
                    task.abort();
                }
            }
            Frame::Note { note } => handler.note(note),
        }
    }

    /// Sends `request` and waits for the reply. Dropping the future
    /// cancels the request on the other side.
    pub(in crate::plugin) fn call(self: &Arc<Self>, request: Request) -> BoxFuture<Result<String>> {
        let peer = Arc::clone(self);
        Box::pin(async move {
            let id = peer.ids.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            {
                let mut pending = peer.pending.lock_unpoisoned();
                if let Some(closed) = &pending.closed {
                    return Err(closed.clone().into());
                }
                pending.waiting.insert(id, tx);
            }
            let mut guard = CancelOnDrop {
                peer: &peer,
                id,
                armed: true,
            };
            let _ = peer.out.send(Frame::Call { id, request });
            let result = rx
                .await
                .unwrap_or_else(|_| Err(ServiceError::Plugin("the plugin process is gone".into())));
            guard.armed = false;
            result
        })
    }

    /// Sends a one-way note.
    pub(in crate::plugin) fn note(&self, note: Note) {
        let _ = self.out.send(Frame::Note { note });
    }

    /// Fails every call waiting and every later one with `error`, and
    /// aborts the handlers of the other side's requests.
    pub(in crate::plugin) fn close(&self, error: ServiceError) {
        let error = WireError::from(error);
        let waiting = {
            let mut pending = self.pending.lock_unpoisoned();
            pending.closed.get_or_insert(error.clone());
            std::mem::take(&mut pending.waiting)
        };
        for (_, waiter) in waiting {
            let _ = waiter.send(Err(error.clone().into()));
        }
        for (_, task) in self.incoming.lock_unpoisoned().drain() {
            task.abort();
        }
    }

    /// Whether [`close`](Self::close) ran.
    pub(in crate::plugin) fn is_closed(&self) -> bool {
        self.pending.lock_unpoisoned().closed.is_some()
    }
}

struct CancelOnDrop<'a> {
    peer: &'a Peer,
    id: u64,
    armed: bool,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.peer.pending.lock_unpoisoned().waiting.remove(&self.id);
            let _ = self.peer.out.send(Frame::Cancel { id: self.id });
        }
    }
}
