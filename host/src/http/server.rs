//! The accept loop `offstage serve` runs: a cap on open connections, each
//! connection served by `connection.rs` with its timeouts, and a graceful
//! stop. Also the process's open-file limit, which bounds how many
//! connections (and job pipes, and plugin files) the host can hold.
//!
//! Why a loop of our own rather than `axum::serve`: that one has no
//! timeouts and no cap, so a thousand clients that send half a request and
//! wait hold a thousand descriptors forever, and once the process runs out
//! of descriptors nobody gets an answer. Here a connection at the cap
//! takes the slot of one that is waiting for a request (`admission.rs`),
//! else it is answered `503` and closed (bounded work, one descriptor for
//! moments), and every connection is closed when its client stalls.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::Router;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, UnixListener},
    sync::{watch, OwnedSemaphorePermit, Semaphore},
};

use super::{admission::Admission, connection};
use crate::config::HttpTable;

/// The bounds every connection is held to (`[http]` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Time to send the first byte of the first request, from the accept.
    pub first_byte_timeout: Duration,
    /// Time to send a request's head, from its first byte.
    pub header_timeout: Duration,
    /// Time to send a request's body, from the end of its head.
    pub body_timeout: Duration,
    /// Time a keep-alive connection may wait for its next request, and a
    /// client may leave an answer unread.
    pub idle_timeout: Duration,
    /// Connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            first_byte_timeout: Duration::from_secs(5),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
        }
    }
}

impl Limits {
    /// The config's values over the defaults, with the connection cap
    /// kept to half of `open_files` (the process's descriptor limit), so
    /// that connections alone cannot exhaust it. The second value says so
    /// when the cap had to be lowered.
    pub(crate) fn resolve(table: &HttpTable, open_files: Option<u64>) -> (Limits, Option<String>) {
        let default = Limits::default();
        let mut limits = Limits {
            first_byte_timeout: table
                .first_byte_timeout
                .unwrap_or(default.first_byte_timeout),
            header_timeout: table.header_timeout.unwrap_or(default.header_timeout),
            body_timeout: table.body_timeout.unwrap_or(default.body_timeout),
            idle_timeout: table.idle_timeout.unwrap_or(default.idle_timeout),
            max_connections: table.max_connections.unwrap_or(default.max_connections),
        };
        let mut note = None;
        if let Some(open_files) = open_files {
            let room = usize::try_from(open_files / 2).unwrap_or(usize::MAX).max(1);
            if limits.max_connections > room {
                note = Some(format!(
                    "[http] max_connections lowered from {} to {room}: half of the open-file limit ({open_files})",
                    limits.max_connections
                ));
                limits.max_connections = room;
            }
        }
        (limits, note)
    }
}

/// Who is at the other end of a connection, as its socket tells: put on
/// every request of the connection as an extension, for the checks that
/// depend on it (a permission answer must not come from inside a job,
/// `http/permissions.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peer {
    /// A TCP client: its address, and the host's address it reached.
    Tcp {
        client: SocketAddr,
        server: SocketAddr,
    },
    /// A client of the host's unix socket, with the pid the kernel took
    /// when it connected (`SO_PEERCRED`). Its user is the host's (the
    /// socket is 0600).
    Unix { pid: Option<i32> },
}

/// A listening socket the accept loop serves: TCP, or the data dir's unix
/// socket.
pub(crate) trait Listener: Send + 'static {
    /// An accepted connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + std::os::fd::AsRawFd + 'static;
    /// The next connection and who is at its other end.
    fn accept_peer(&self) -> impl Future<Output = io::Result<(Self::Stream, Peer)>> + Send;
}

impl Listener for TcpListener {
    type Stream = tokio::net::TcpStream;

    async fn accept_peer(&self) -> io::Result<(Self::Stream, Peer)> {
        let (stream, client) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        let server = stream.local_addr()?;
        Ok((stream, Peer::Tcp { client, server }))
    }
}

impl Listener for UnixListener {
    type Stream = tokio::net::UnixStream;

    async fn accept_peer(&self) -> io::Result<(Self::Stream, Peer)> {
        let (stream, _) = self.accept().await?;
        let credentials = stream.peer_cred()?;
        Ok((
            stream,
            Peer::Unix {
                pid: credentials.pid(),
            },
        ))
    }
}

/// The unix socket's name in the data dir.
pub(crate) const SOCKET_NAME: &str = "api.sock";

/// Where the host with data dir `data_dir` serves its unix socket.
pub(crate) fn socket_path(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join(SOCKET_NAME)
}

/// Listens on the unix socket at `path`, readable and writable by the
/// host's user only (mode 0600). A socket file left by a host that did
/// not stop cleanly is replaced (the data dir's lock says no other host
/// runs on it); any other file there is an error.
pub(crate) fn bind_unix(path: &std::path::Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            ))
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Refusals (503 past the cap) being written at once, at most; more wait
/// for one of these to end (the kernel's backlog holds them meanwhile).
/// Also at most a quarter of the cap, so that refusals fit in the
/// descriptors the cap leaves free.
const REFUSALS_AT_ONCE: usize = 64;

/// How long a refusal may take to write its answer, and then to read what
/// its client sent until the client closes (so that closing does not reset
/// the connection before the client read the answer).
const REFUSAL_TIME: Duration = Duration::from_secs(1);

/// Pause after an accept that failed for want of resources (descriptors,
/// memory), before trying again. Open connections are served meanwhile.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// At most one warning per this interval for a repeated condition (the
/// cap reached, accept failing).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` within `limits` until `shutdown`
/// resolves; then stops accepting, lets each connection finish its
/// request in progress, and returns when all are closed. Event streams
/// end by themselves when the state's shutdown flag is raised.
///
/// At the cap a new connection takes the slot of one that waits for a
/// request (`admission.rs`); only when none does is it refused, with a
/// 503 that is really sent ([`refuse`]).
pub(crate) async fn serve<L: Listener>(
    listener: L,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let admission = Admission::new(limits.max_connections);
    let refusals = Arc::new(Semaphore::new(
        REFUSALS_AT_ONCE.min(limits.max_connections / 4).max(1),
    ));
    let (stop, stopping) = watch::channel(false);
    let mut cap_warned = Warned::default();
    let mut accept_warned = Warned::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept_peer() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            // The client gave up before we took it: nothing to do.
            Err(error) if is_client_gone(&error) => continue,
            Err(error) => {
                if accept_warned.due() {
                    tracing::warn!("cannot accept a connection: {error}; retrying");
                }
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        if let Some(ticket) = admission.admit(fd) {
            let (router, stopping) = (router.clone(), stopping.clone());
            tokio::spawn(connection::serve(
                stream, peer, router, limits, stopping, ticket,
            ));
            continue;
        }
        if cap_warned.due() {
            tracing::warn!(
                max_connections = limits.max_connections,
                "connection cap reached with every connection in a request; new connections are answered 503"
            );
        }
        // Never dropped unanswered: past the refusals at once, the loop
        // waits (bounded by [`REFUSAL_TIME`] per refusal).
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = refusals.clone().acquire_owned() => permit,
        };
        if let Ok(permit) = permit {
            tokio::spawn(refuse(stream, limits.max_connections, permit));
        }
    }
    drop(listener);
    stop.send_replace(true);
    // Every slot back means every connection closed.
    admission.all_closed(limits.max_connections).await;
    Ok(())
}

/// Answers a connection over the cap with `503 too_many_connections`:
/// writes it, half-closes, and reads what the client sent until it closes,
/// so that the close does not reset the connection under the unread
/// answer; at most [`REFUSAL_TIME`] for each step.
async fn refuse(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    cap: usize,
    _permit: OwnedSemaphorePermit,
) {
    let body = format!(
        "{{\"error\":{{\"code\":\"too_many_connections\",\"message\":\"the host has {cap} connections open, its limit, each in a request; try again\"}}}}"
    );
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let written = tokio::time::timeout(REFUSAL_TIME, stream.write_all(answer.as_bytes())).await;
    if !matches!(written, Ok(Ok(()))) {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(REFUSAL_TIME, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

fn is_client_gone(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Rate limit for a repeated warning.
#[derive(Default)]
struct Warned(Option<Instant>);

impl Warned {
    /// Whether to warn now; if so, the next one waits [`WARN_EVERY`].
    fn due(&mut self) -> bool {
        let now = Instant::now();
        if self
            .0
            .is_some_and(|last| now.duration_since(last) < WARN_EVERY)
        {
            return false;
        }
        self.0 = Some(now);
        true
    }
}

/// The process's open-file limit before and after
/// [`raise_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OpenFileLimit {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
    /// The hard limit: as far as an unprivileged process may go.
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, so that the host
/// can hold as many connections, job pipes and files as the system lets
/// it; many systems start processes at 1024 though far more is allowed.
/// Returns the limits, or why they could not be read or raised.
#[cfg(unix)]
pub(crate) fn raise_open_file_limit() -> Result<OpenFileLimit, (Option<OpenFileLimit>, io::Error)> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    // `None` is "unlimited".
    let before = limit.current.unwrap_or(u64::MAX);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let mut found = OpenFileLimit {
        before,
        now: before,
        hard,
    };
    if before >= hard {
        return Ok(found);
    }
    // Raising the soft limit up to the hard one is allowed to any process.
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if let Err(error) = setrlimit(Resource::Nofile, raised) {
        return Err((Some(found), error.into()));
    }
    found.now = hard;
    Ok(found)
}

/// Not on this platform: nothing to raise.
#[cfg(not(unix))]
pub(crate) fn raise_open_file_limit() -> Result<OpenFileLimit, (Option<OpenFileLimit>, io::Error)> {
    Err((
        None,
        io::Error::new(io::ErrorKind::Unsupported, "no RLIMIT_NOFILE here"),
    ))
}

/// Raises the open-file limit and logs one line saying what it is; the
/// limit the host runs with (`None` when unknown).
pub(crate) fn raise_open_file_limit_and_log() -> Option<u64> {
    match raise_open_file_limit() {
        Ok(limit) if limit.now > limit.before => {
            tracing::info!(
                "open-file limit raised from {} to {} (the hard limit)",
                limit.before,
                limit.now
            );
            Some(limit.now)
        }
        Ok(limit) => {
            tracing::info!("open-file limit {} (the hard limit already)", limit.now);
            Some(limit.now)
        }
        Err((limit, error)) => {
            tracing::warn!(
                "cannot raise the open-file limit{}: {error}; keeping it",
                limit.map_or(String::new(), |l| format!(
                    " from {} to {}",
                    l.before, l.hard
                ))
            );
            limit.map(|l| l.now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_half_the_descriptors_free() {
        let table = HttpTable::default();
        let (limits, note) = Limits::resolve(&table, Some(1_048_576));
        assert_eq!(limits, Limits::default());
        assert!(note.is_none());
        let (limits, note) = Limits::resolve(&table, Some(1024));
        assert_eq!(limits.max_connections, 512);
        assert!(note.unwrap().contains("512"));
        let table = HttpTable {
            header_timeout: Some(Duration::from_secs(1)),
            max_connections: Some(7),
            ..HttpTable::default()
        };
        let (limits, note) = Limits::resolve(&table, None);
        assert_eq!(limits.header_timeout, Duration::from_secs(1));
        assert_eq!(limits.max_connections, 7);
        assert_eq!(limits.idle_timeout, Limits::default().idle_timeout);
        assert!(note.is_none());
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let limit = raise_open_file_limit().map_err(|(_, e)| e).unwrap();
        assert_eq!(limit.now, limit.hard);
        assert!(limit.now >= limit.before);
    }
}
