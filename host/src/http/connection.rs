//! One client connection: HTTP/1.1 over a socket whose every wait is
//! bounded, and requests whose bodies are always settled.
//!
//! **Timeouts.** A connection is in one of three states, and each has its
//! own bound (`[http]` in the config, [`Limits`]):
//!
//! - *new*: no byte yet since the connection was accepted. Closed after
//!   `first_byte_timeout` (a few seconds): a client that connects means to
//!   send, and a socket that never does only holds a slot.
//! - *idle*: the last answer sent and nothing new arrived. Closed after
//!   `idle_timeout`.
//! - *reading a head*: the first byte of a request arrived, the head is not
//!   complete. Closed `header_timeout` after that first byte. This is what
//!   stops a client that trickles a header a byte at a time (slowloris).
//! - *handling*: the head is parsed. The body must arrive within
//!   `body_timeout` of the head ([`RequestBody`]); after that the handler
//!   may take as long as its work does (a tool call holds its request until
//!   the job ends), and a response may stream for as long as it has data
//!   (the event stream).
//!
//! Writing is bounded too: a client that reads nothing of an answer for
//! `idle_timeout` is disconnected, so an unread answer cannot hold a
//! connection slot forever. hyper's own header timer is not used: it runs
//! from the moment a connection goes idle, so it cannot tell an idle
//! keep-alive connection from a slow head.
//!
//! **Bodies.** hyper closes a keep-alive connection when an answer goes out
//! while its request's body is still unread — without saying so in the
//! answer, so a client that sends its next request on that connection sees
//! it fail. That happens whenever a request is refused before its body is
//! read (401, 403, 404, 405, 413) or a handler ignores a body it does not
//! need. So every request's body is settled before its answer leaves: what
//! the handler did not read is read and dropped here (up to
//! [`BODY_LIMIT`] bytes, within the body timeout), and when that is not
//! possible the answer says `Connection: close`.

use std::{
    convert::Infallible,
    future::Future,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    http::{header, HeaderValue, Request, Response},
    Router,
};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::watch,
    time::{sleep_until, Instant, Sleep},
};
use tower::ServiceExt;

use super::{
    admission::Ticket,
    extract::BODY_LIMIT,
    server::{Limits, Peer},
};
use crate::util::LockExt;

/// Serves HTTP/1.1 on `stream` until the client leaves, a timeout closes
/// it, it is evicted while waiting for a request (`ticket.close`), or
/// `stopping` turns true (then the request in progress finishes and the
/// connection closes). Every request carries `peer` as an extension: who
/// is at the other end (`server.rs`).
pub(super) async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    peer: Peer,
    router: Router,
    limits: Limits,
    mut stopping: watch::Receiver<bool>,
    ticket: Ticket,
) {
    let clock = ticket.clock.clone();
    let io = TokioIo::new(TimedIo::new(stream, clock.clone(), limits));
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(peer);
        handle(router.clone(), clock.clone(), limits, request)
    });
    let connection = hyper::server::conn::http1::Builder::new()
        // The timeouts are [`TimedIo`]'s (see the module docs).
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(connection);
    tokio::select! {
        ended = connection.as_mut() => {
            log_end(ended);
            return;
        }
        // Evicted while it waited for a request: no request is lost.
        () = ticket.close.notified() => {
            tracing::debug!("connection closed to make room for another");
            return;
        }
        _ = stopping.wait_for(|stop| *stop) => {}
    }
    connection.as_mut().graceful_shutdown();
    log_end(connection.await);
}

fn log_end(ended: Result<(), hyper::Error>) {
    if let Err(error) = ended {
        // A client that leaves or times out is not the host's problem.
        tracing::debug!("connection closed: {error}");
    }
}

/// One request: its body wrapped with the body timeout, the router's
/// answer, then whatever body is left settled (module docs).
async fn handle(
    router: Router,
    clock: Arc<Clock>,
    limits: Limits,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let in_flight = clock.request_started();
    let deadline = Instant::now() + limits.body_timeout;
    let (parts, incoming) = request.into_parts();
    let rest = Arc::new(Mutex::new(Rest::Held));
    let body = RequestBody {
        inner: Some(incoming),
        broken: false,
        timer: Box::pin(sleep_until(deadline)),
        timeout: limits.body_timeout,
        rest: rest.clone(),
    };
    let mut response = router
        .oneshot(Request::from_parts(parts, Body::new(body)))
        .await?;
    let rest = std::mem::replace(&mut *rest.lock_unpoisoned(), Rest::Done);
    let settled = match rest {
        Rest::Done => true,
        Rest::Returned(body) => drain(body, deadline).await,
        // Still held by something the handler started, or unreadable:
        // hyper will not keep the connection, so the answer says so.
        Rest::Held | Rest::Broken => false,
    };
    if !settled {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    // The request counts as in flight until its answer's body is done.
    Ok(response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _ = &in_flight;
            frame
        }))
    }))
}

/// Reads and drops the rest of a request body the handler did not read:
/// at most [`BODY_LIMIT`] bytes, until `deadline`. Whether it got to the
/// end.
async fn drain(mut body: Incoming, deadline: Instant) -> bool {
    let limit = BODY_LIMIT as u64;
    if body.size_hint().lower() > limit {
        return false;
    }
    let reading = async move {
        let mut read = 0u64;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            if let Some(data) = frame.data_ref() {
                read += data.len() as u64;
                if read > limit {
                    return false;
                }
            }
        }
        true
    };
    tokio::time::timeout_at(deadline, reading)
        .await
        .unwrap_or(false)
}

/// Where a request body is once the handler is done with it.
enum Rest {
    /// Not dropped yet: something still holds it.
    Held,
    /// Dropped before its end: the unread rest, to drain.
    Returned(Incoming),
    /// Read to its end.
    Done,
    /// Reading failed or timed out: the rest can never be read.
    Broken,
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestBodyError {
    /// The client did not send the whole body in time.
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    /// The connection failed while reading.
    #[error("cannot read the request body: {0}")]
    Read(#[from] hyper::Error),
}

/// A request body with a deadline, which hands its unread rest back when
/// dropped (see [`Rest`]).
struct RequestBody {
    inner: Option<Incoming>,
    /// Reading failed or timed out.
    broken: bool,
    timer: Pin<Box<Sleep>>,
    timeout: Duration,
    rest: Arc<Mutex<Rest>>,
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = RequestBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RequestBodyError>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(error))) => {
                this.inner = None;
                this.broken = true;
                Poll::Ready(Some(Err(error.into())))
            }
            Poll::Ready(None) => {
                this.inner = None;
                Poll::Ready(None)
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.inner = None;
                    this.broken = true;
                    Poll::Ready(Some(Err(RequestBodyError::TimedOut(this.timeout))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), HttpBody::size_hint)
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        let rest = match self.inner.take() {
            Some(body) if !body.is_end_stream() => Rest::Returned(body),
            _ if self.broken => Rest::Broken,
            _ => Rest::Done,
        };
        *self.rest.lock_unpoisoned() = rest;
    }
}

/// Which of the connection's states (module docs) it is in, and since
/// when; shared by the socket, the requests and the admission.
pub(super) struct Clock(Mutex<ClockState>);

struct ClockState {
    /// Requests whose answer is not completely sent.
    in_flight: usize,
    /// When the last answer ended (or the connection opened).
    idle_since: Instant,
    /// When the first byte of the next request arrived.
    head_started: Option<Instant>,
    /// Whether any byte arrived yet.
    used: bool,
    /// Evicted: closing, never to start a request.
    closing: bool,
}

impl Clock {
    pub(super) fn new() -> Self {
        Clock(Mutex::new(ClockState {
            in_flight: 0,
            idle_since: Instant::now(),
            head_started: None,
            used: false,
            closing: false,
        }))
    }

    pub(super) fn request_started(self: &Arc<Self>) -> InFlight {
        let mut state = self.0.lock_unpoisoned();
        state.in_flight += 1;
        state.head_started = None;
        InFlight(self.clone())
    }

    pub(super) fn bytes_read(&self) {
        let mut state = self.0.lock_unpoisoned();
        state.used = true;
        if state.in_flight == 0 && state.head_started.is_none() {
            state.head_started = Some(Instant::now());
        }
    }

    /// Since when the connection waits for a request head, having none
    /// of it yet (new or idle); `None` while it reads a head or handles a
    /// request.
    pub(super) fn waiting_since(&self) -> Option<Instant> {
        let state = self.0.lock_unpoisoned();
        (state.in_flight == 0 && state.head_started.is_none() && !state.closing)
            .then_some(state.idle_since)
    }

    /// Marks the connection closing if it still waits for a request head;
    /// whether it did.
    pub(super) fn try_close(&self) -> bool {
        let mut state = self.0.lock_unpoisoned();
        let waiting = state.in_flight == 0 && state.head_started.is_none() && !state.closing;
        if waiting {
            state.closing = true;
        }
        waiting
    }

    /// Until when a read may wait, and what it is waiting for; `None` while
    /// a request is being handled.
    fn read_deadline(&self, limits: &Limits) -> Option<(Instant, &'static str)> {
        let state = self.0.lock_unpoisoned();
        if state.in_flight > 0 {
            return None;
        }
        Some(match state.head_started {
            Some(started) => (started + limits.header_timeout, "a request head"),
            None if !state.used => (
                state.idle_since + limits.first_byte_timeout,
                "first request byte",
            ),
            None => (state.idle_since + limits.idle_timeout, "a request"),
        })
    }
}

/// A request whose answer is not completely sent; dropped with the
/// answer's body.
pub(super) struct InFlight(Arc<Clock>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.0 .0.lock_unpoisoned();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            state.idle_since = Instant::now();
            state.head_started = None;
        }
    }
}

/// The socket, with reads bounded by the [`Clock`]'s deadline and writes
/// by `idle_timeout` without progress. A wait past its bound fails with
/// `TimedOut`, which ends the connection.
struct TimedIo<S> {
    stream: S,
    clock: Arc<Clock>,
    limits: Limits,
    read_timer: Pin<Box<Sleep>>,
    write_timer: Pin<Box<Sleep>>,
    /// Since when writes have made no progress.
    write_stalled_since: Option<Instant>,
}

impl<S: AsyncWrite + Unpin> TimedIo<S> {
    fn new(stream: S, clock: Arc<Clock>, limits: Limits) -> Self {
        let now = Instant::now();
        TimedIo {
            stream,
            clock,
            limits,
            read_timer: Box::pin(sleep_until(now)),
            write_timer: Box::pin(sleep_until(now)),
            write_stalled_since: None,
        }
    }

    /// After a write that could not proceed: fails once writes have been
    /// stuck for `idle_timeout`.
    fn write_pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let since = *self.write_stalled_since.get_or_insert_with(Instant::now);
        self.write_timer
            .as_mut()
            .reset(since + self.limits.idle_timeout);
        match self.write_timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client read nothing of the answer for {:?}",
                    self.limits.idle_timeout
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn wrote<T>(
        &mut self,
        written: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match written {
            Poll::Pending => self.write_pending(cx),
            done => {
                self.write_stalled_since = None;
                done
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.clock.bytes_read();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                let Some((deadline, waiting_for)) = this.clock.read_deadline(&this.limits) else {
                    return Poll::Pending;
                };
                this.read_timer.as_mut().reset(deadline);
                match this.read_timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no {waiting_for} in time; closing the connection"),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write(cx, data);
        this.wrote(written, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, data);
        this.wrote(written, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.stream).poll_flush(cx);
        this.wrote(flushed, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
