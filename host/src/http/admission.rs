//! Who holds one of the `max_connections` slots, and who gives one up
//! when the cap is reached.
//!
//! Why eviction: a socket that never sends a byte costs its client
//! nothing and needs no token, so a cap that only counts sockets lets
//! anyone on the machine (or behind the same proxy, where every client has
//! one address and a per-address cap cannot help) fill it and lock every
//! real client out until a timeout ends the idle ones. So at the cap, a
//! new connection takes the slot of the connection that has waited
//! longest for a request head — one that never sent a byte, or a
//! keep-alive connection between requests, which HTTP lets a server close
//! at any time — and that one is closed. Only when every open connection
//! is in the middle of a request (reading its head, or handling it) is the
//! new one refused with a 503 (`server.rs`).
//!
//! "Waiting" is judged by the connection's state *and* by its socket: a
//! request whose first bytes are in the kernel's buffer, not read yet,
//! counts as sent (`FIONREAD`), so a client is never cut off because the
//! host was slow to read what it had already sent.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::connection::Clock;
use crate::util::LockExt;

/// The open connections and their slots.
pub(super) struct Admission {
    slots: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Open>>,
    next_id: AtomicU64,
}

/// One open connection as the admission sees it.
struct Open {
    clock: Arc<Clock>,
    /// The socket's descriptor, to ask whether bytes wait unread. Closed
    /// just before this entry goes, so it may briefly name a newer socket:
    /// then at worst a connection that is ending anyway is skipped or
    /// gives up its slot early.
    fd: Fd,
    close: Arc<Notify>,
    /// Its slot, handed to a newcomer when it is evicted.
    slot: OwnedSemaphorePermit,
}

/// A connection's claim on its slot; gives the slot back when dropped.
pub(super) struct Ticket {
    id: u64,
    admission: Arc<Admission>,
    /// The connection's state, which tells whether it can be evicted.
    pub clock: Arc<Clock>,
    /// Notified when the connection was evicted: close it now.
    pub close: Arc<Notify>,
}

impl Admission {
    pub(super) fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Admission {
            slots: Arc::new(Semaphore::new(max_connections)),
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        })
    }

    /// A slot for a new connection: a free one, else the one of the
    /// connection that has waited longest for a request head (which is
    /// told to close). `None` when every connection is busy with a request.
    pub(super) fn admit(self: &Arc<Self>, fd: Fd) -> Option<Ticket> {
        let slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => self.evict()?,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (clock, close) = (Arc::new(Clock::new()), Arc::new(Notify::new()));
        self.open.lock_unpoisoned().insert(
            id,
            Open {
                clock: clock.clone(),
                fd,
                close: close.clone(),
                slot,
            },
        );
        Some(Ticket {
            id,
            admission: self.clone(),
            clock,
            close,
        })
    }

    /// Takes the slot of the connection waiting longest for a request
    /// head, and tells it to close.
    fn evict(&self) -> Option<OwnedSemaphorePermit> {
        let mut open = self.open.lock_unpoisoned();
        let mut waiting: Vec<_> = open
            .iter()
            .filter_map(|(id, entry)| entry.clock.waiting_since().map(|since| (since, *id)))
            .collect();
        waiting.sort_unstable();
        // Its state may have changed since it was looked at: the first one
        // still waiting when asked goes.
        let id = waiting.into_iter().map(|(_, id)| id).find(|id| {
            let entry = &open[id];
            unread_bytes(entry.fd) == 0 && entry.clock.try_close()
        })?;
        let evicted = open.remove(&id)?;
        evicted.close.notify_one();
        Some(evicted.slot)
    }

    /// Waits until every slot is back: every connection closed.
    pub(super) async fn all_closed(&self, max_connections: usize) {
        let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
        let _ = self.slots.acquire_many(all).await;
    }
}

/// A socket's descriptor, as the admission keeps it.
#[cfg(unix)]
pub(super) type Fd = std::os::fd::RawFd;
/// No descriptors to ask here.
#[cfg(not(unix))]
pub(super) type Fd = ();

/// Bytes received on `fd` and not read yet (0 when it cannot tell).
#[cfg(unix)]
fn unread_bytes(fd: Fd) -> u64 {
    // SAFETY: `fd` is the socket of an open connection (see `Open::fd`);
    // `FIONREAD` only reads a count, whatever the descriptor is.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::io::ioctl_fionread(fd).unwrap_or(0)
}

#[cfg(not(unix))]
fn unread_bytes(_: Fd) -> u64 {
    0
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Absent when evicted: its slot went to the newcomer.
        let slot = self.admission.open.lock_unpoisoned().remove(&self.id);
        drop(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_longest_waiting_idle_connection_makes_room_and_busy_ones_never_do() {
        // Descriptors with nothing to read.
        let (quiet, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&quiet);
        let admission = Admission::new(2);
        let first = admission.admit(fd).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let second = admission.admit(fd).unwrap();
        // Both idle: the first, waiting longest, goes.
        let third = admission.admit(fd).unwrap();
        assert!(first.close.notified().now_or_never_is_ready());
        assert!(!second.close.notified().now_or_never_is_ready());
        drop(first);
        // Busy connections are never evicted: with both busy, no room.
        let _busy_second = second.clock.request_started();
        let _busy_third = third.clock.request_started();
        assert!(admission.admit(fd).is_none());
        // A connection reading a request head is busy too.
        drop(_busy_third);
        third.clock.bytes_read();
        assert!(admission.admit(fd).is_none());
        drop((second, third, _busy_second));
        assert!(admission.admit(fd).is_some());
    }

    #[tokio::test]
    async fn a_connection_whose_request_waits_unread_is_not_evicted() {
        use std::io::Write;
        let (sent, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
        peer.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sent);
        let admission = Admission::new(1);
        let _first = admission.admit(fd).unwrap();
        assert!(admission.admit(fd).is_none());
    }

    /// Whether a `Notified` future is ready at once.
    trait NowOrNever {
        fn now_or_never_is_ready(self) -> bool;
    }

    impl<F: std::future::Future> NowOrNever for F {
        fn now_or_never_is_ready(self) -> bool {
            let waker = std::task::Waker::noop();
            let mut cx = std::task::Context::from_waker(waker);
            let mut future = std::pin::pin!(self);
            future.as_mut().poll(&mut cx).is_ready()
        }
    }
}
