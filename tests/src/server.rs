//! A real `offstage` process for end-to-end tests of the HTTP API and the
//! CLI, and a deliberately small HTTP/1.1 client over `std::net` to talk to
//! it: raw enough to send malformed bodies and wrong headers, and to read
//! a Server-Sent Events stream chunk by chunk.
//!
//! The binary is built once per test process ([`offstage_binary`]).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::Duration,
};

use serde_json::Value;

pub use crate::fixtures::offstage_binary;
use crate::wait::eventually;

/// How long a test read may block before the test fails instead of
/// hanging. A safety net, never an assertion about speed.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `offstage serve` on a free loopback port with its own data
/// dir. Killed when dropped; [`Server::stop`] asks it to shut down.
pub struct Server {
    child: Option<Child>,
    /// The address it listens on.
    pub addr: SocketAddr,
    /// `http://ADDR`.
    pub url: String,
    /// The token it requires: the one it was started with, else the one
    /// it made in its data dir's token file (none with `--no-token`).
    pub token: Option<String>,
    /// Its data dir.
    pub data_dir: PathBuf,
    /// The data dir made for it (none when the test chose one).
    _data: Option<tempfile::TempDir>,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Server {
    /// `offstage serve --addr 127.0.0.1:0 --data-dir TEMP` plus `args`
    /// (`--addr` in `args` takes the place of the default's).
    pub fn start(args: &[&str]) -> Server {
        Self::start_with("serve", args, None)
    }

    /// As [`Server::start`], with `--token TOKEN`.
    pub fn start_with_token(args: &[&str], token: &str) -> Server {
        Self::start_with("serve", args, Some(token))
    }

    /// `offstage dev` (serve with hot reload) with the same defaults.
    pub fn start_dev(args: &[&str]) -> Server {
        Self::start_with("dev", args, None)
    }

    /// As [`Server::start`], with `OFFSTAGE_LOG=filter` instead of `info`.
    pub fn start_with_log(args: &[&str], filter: &str) -> Server {
        Self::spawn("serve", args, None, filter, None)
    }

    /// As [`Server::start`], in a process whose open-file limit (soft and
    /// hard) is `open_files`: a host near its descriptor limit.
    #[cfg(unix)]
    pub fn start_with_open_files(args: &[&str], open_files: u64) -> Server {
        Self::spawn("serve", args, None, "info", Some(open_files))
    }

    /// As [`Server::start_on`], with `env` added to its environment.
    pub fn start_on_with_env(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::launch_with("serve", data_dir, None, args, None, "info", None, &env)
    }

    /// `offstage serve` on the data dir `data_dir`, which outlives it: to
    /// start a host again on the same store.
    pub fn start_on(data_dir: &Path, args: &[&str]) -> Server {
        Self::launch("serve", data_dir, None, args, None, "info", None)
    }

    fn start_with(command_name: &str, args: &[&str], token: Option<&str>) -> Server {
        Self::spawn(command_name, args, token, "info", None)
    }

    fn spawn(
        command_name: &str,
        args: &[&str],
        token: Option<&str>,
        log: &str,
        open_files: Option<u64>,
    ) -> Server {
        let data = tempfile::tempdir().unwrap();
        let dir = data.path().join("data");
        Self::launch(command_name, &dir, Some(data), args, token, log, open_files)
    }

    fn launch(
        command_name: &str,
        data_dir: &Path,
        data: Option<tempfile::TempDir>,
        args: &[&str],
        token: Option<&str>,
        log: &str,
        open_files: Option<u64>,
    ) -> Server {
        Self::launch_with(
            command_name,
            data_dir,
            data,
            args,
            token,
            log,
            open_files,
            &[],
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_with(
        command_name: &str,
        data_dir: &Path,
        data: Option<tempfile::TempDir>,
        args: &[&str],
        token: Option<&str>,
        log: &str,
        open_files: Option<u64>,
        env: &[(String, String)],
    ) -> Server {
        let mut command = Command::new(offstage_binary());
        // A process group of its own, as a shell gives a foreground job:
        // [`Server::interrupt_group`] is a terminal's Ctrl+C.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command.envs(env.iter().map(|(k, v)| (k, v)));
        // A free port unless the test names an address (a host started
        // again where its clients expect it).
        let addr: &[&str] = if args.contains(&"--addr") {
            &[]
        } else {
            &["--addr", "127.0.0.1:0"]
        };
        command
            .arg(command_name)
            .args(addr)
            .arg("--data-dir")
            .arg(data_dir)
            .args(args)
            .env_remove("OFFSTAGE_TOKEN")
            .env("OFFSTAGE_LOG", log)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(token) = token {
            command.args(["--token", token]);
        }
        #[cfg(unix)]
        if let Some(open_files) = open_files {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit {
                rlim_cur: open_files as libc::rlim_t,
                rlim_max: open_files as libc::rlim_t,
            };
            // SAFETY: between fork and exec only `setrlimit`, which is
            // async-signal-safe, runs; `limit` is a valid `rlimit`.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        #[cfg(not(unix))]
        let _ = open_files;
        let mut child = command.spawn().expect("start offstage serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut stderr = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let Some(url) = line
            .trim()
            .strip_prefix("listening on ")
            .map(str::to_string)
        else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "offstage serve did not start: stdout {line:?}, stderr:\n{}",
                stderr.join().unwrap_or_default()
            );
        };
        // Keep reading stdout so the child never blocks on a full pipe;
        // `stop` checks that nothing followed the one line.
        let stdout = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stdout.read_to_string(&mut rest);
            rest
        });
        let addr: SocketAddr = url.strip_prefix("http://").unwrap().parse().unwrap();
        // A host started without a token uses its token file, made before
        // it prints the line; `--no-token` turns that off.
        let token = match token {
            Some(token) => Some(token.to_string()),
            None if args.contains(&"--no-token") => None,
            None => Some(token_in(data_dir)),
        };
        Server {
            child: Some(child),
            addr,
            url,
            token,
            data_dir: data_dir.to_path_buf(),
            _data: data,
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    /// `Bearer TOKEN` with the server's token, for requests a test writes
    /// itself (`http`, threads). Panics for a host with `--no-token`.
    pub fn bearer(&self) -> String {
        format!(
            "Bearer {}",
            self.token.as_deref().expect("a host with a token")
        )
    }

    /// A request with the server's token (if any).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Response {
        let mut headers = Vec::new();
        let auth;
        if let Some(token) = &self.token {
            auth = format!("Bearer {token}");
            headers.push(("Authorization", auth.as_str()));
        }
        let body = body.map(|b| b.to_string());
        if body.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        http(
            self.addr,
            method,
            path,
            &headers,
            body.as_deref().unwrap_or("").as_bytes(),
        )
    }

    /// A request that must answer `status`; returns the JSON body.
    pub fn expect(&self, method: &str, path: &str, body: Option<&Value>, status: u16) -> Value {
        let response = self.request(method, path, body);
        assert_eq!(
            response.status, status,
            "{method} {path} answered {}: {}",
            response.status, response.body
        );
        response.json()
    }

    /// Polls `GET /api/plugin` until `matches` holds for the list; returns
    /// it. Fails naming `what` after [`crate::wait::PATIENCE`].
    pub fn plugins_until(&self, what: &str, matches: impl Fn(&Value) -> bool) -> Value {
        eventually(what, || {
            let list = self.expect("GET", "/api/plugin", None, 200);
            matches(&list).then_some(list)
        })
    }

    /// Opens `GET /api/event` with the server's token.
    pub fn events(&self) -> EventStream {
        self.events_at("/api/event", &[])
    }

    /// Opens the event stream at `path` (e.g. `/api/event?since=0`) with
    /// the server's token and `headers` (e.g. `Last-Event-ID`).
    pub fn events_at(&self, path: &str, headers: &[(&str, &str)]) -> EventStream {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut all: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        all.extend_from_slice(headers);
        EventStream::open_at(self.addr, path, &all)
    }

    /// The host's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Kills the host with SIGKILL (no shutdown at all) and waits for it.
    pub fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits for the exit; returns the status and stderr.
    /// Asserts that stdout held nothing but the `listening on` line.
    pub fn stop(mut self) -> (ExitStatus, String) {
        let child = self.child.as_ref().unwrap();
        terminate(child);
        self.wait()
    }

    /// A terminal's Ctrl+C: SIGINT to the server's whole process group
    /// (every process in it that has not moved to a group of its own);
    /// then waits for the server as [`Server::stop`] does.
    #[cfg(unix)]
    pub fn interrupt_group(mut self) -> (ExitStatus, String) {
        let group = self.pid();
        let sent = Command::new("kill")
            .args(["-INT", "--", &format!("-{group}")])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -INT -{group} failed");
        self.wait()
    }

    fn wait(&mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        let status = child.wait().unwrap();
        let stderr = self.stderr.take().unwrap().join().unwrap_or_default();
        let rest = self.stdout.take().unwrap().join().unwrap_or_default();
        assert!(
            rest.is_empty(),
            "offstage serve printed more than one line: {rest}"
        );
        (status, stderr)
    }
}

/// Asks `child` to shut down (SIGTERM), as a supervisor would.
fn terminate(child: &Child) {
    #[cfg(unix)]
    {
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
    }
    #[cfg(not(unix))]
    let _ = child;
}

impl Drop for Server {
    /// Shuts the host down gracefully, so its jobs' process groups are
    /// killed too; kills it if it has not exited after a while.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if !std::thread::panicking() {
                terminate(&child);
                for _ in 0..200 {
                    if let Ok(Some(_)) = child.try_wait() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Response {
    /// The body as JSON (`null` when empty).
    pub fn json(&self) -> Value {
        if self.body.trim().is_empty() {
            return Value::Null;
        }
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// A header's value, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Asserts this is an error answer with `status` and `code`.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "body: {}", self.body);
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "body: {}", self.body);
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "no message: {}",
            self.body
        );
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect to offstage");
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    stream
}

fn write_request(
    stream: &mut TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) and close before reading a large body.
    let _ = stream.write_all(body);
}

fn read_head(reader: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    (status, headers)
}

/// One request on a fresh connection (`Connection: close`); any headers,
/// any bytes as the body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut stream = connect(addr);
    write_request(&mut stream, addr, method, path, headers, body);
    read_response(BufReader::new(stream))
}

/// As [`http`], over the unix socket at `socket` (a host's `api.sock`):
/// one request, `Connection: close`.
pub fn unix_http(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
    stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    read_response(BufReader::new(stream))
}

/// The answer to a `Connection: close` request: its head, then a chunked
/// body or one that ends with the connection.
fn read_response(mut reader: impl BufRead) -> Response {
    let (status, headers) = read_head(&mut reader);
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let mut raw = Vec::new();
    if chunked {
        while let Some(chunk) = read_chunk(&mut reader) {
            raw.extend(chunk);
        }
    } else {
        let _ = reader.read_to_end(&mut raw);
    }
    Response {
        status,
        headers,
        body: String::from_utf8_lossy(&raw).into_owned(),
    }
}

/// One keep-alive connection for many requests in a row, as HTTP client
/// libraries use them: each request is written in full, each answer read to
/// the end of its body (by `Content-Length` or chunks), and the connection
/// stays open unless the server said `Connection: close`.
pub struct KeepAlive {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
}

impl KeepAlive {
    /// Connects to `addr`.
    pub fn connect(addr: SocketAddr) -> KeepAlive {
        KeepAlive {
            addr,
            reader: BufReader::new(connect(addr)),
        }
    }

    /// Sends one request with `headers` and `body` (a `Content-Length` is
    /// added) and reads its answer. An I/O failure — the server closed the
    /// connection — is an `Err` naming it, for the test to report.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, String> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let stream = self.reader.get_mut();
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body))
            .map_err(|e| format!("writing the request: {e}"))?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => return Err("the server closed the connection".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("reading the answer: {e}")),
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line {line:?}"))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader
                .read_line(&mut line)
                .map_err(|e| format!("reading the head: {e}"))?;
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            if let Some((name, value)) = trimmed.split_once(':') {
                headers.push((name.trim().to_string(), value.trim().to_string()));
            }
        }
        let mut response = Response {
            status,
            headers,
            body: String::new(),
        };
        let mut raw = Vec::new();
        if let Some(length) = response.header("content-length") {
            let length: usize = length.parse().map_err(|_| "bad content-length")?;
            raw.resize(length, 0);
            self.reader
                .read_exact(&mut raw)
                .map_err(|e| format!("reading the body: {e}"))?;
        } else if response
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            while let Some(chunk) = read_chunk(&mut self.reader) {
                raw.extend(chunk);
            }
        }
        response.body = String::from_utf8_lossy(&raw).into_owned();
        Ok(response)
    }
}

/// Reads one chunk of a chunked body; `None` at the last one.
fn read_chunk(reader: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(line.trim().split(';').next()?, 16).ok()?;
    if size == 0 {
        return None;
    }
    let mut chunk = vec![0; size];
    reader.read_exact(&mut chunk).ok()?;
    let mut crlf = [0; 2];
    reader.read_exact(&mut crlf).ok()?;
    Some(chunk)
}

/// An open `GET /api/event` stream.
pub struct EventStream {
    reader: BufReader<TcpStream>,
    buffer: String,
    /// The status code the stream was answered with.
    pub status: u16,
}

impl EventStream {
    /// Opens the stream with `headers`.
    pub fn open(addr: SocketAddr, headers: &[(&str, &str)]) -> EventStream {
        Self::open_at(addr, "/api/event", headers)
    }

    /// Opens the stream at `path` (a query may follow) with `headers`.
    pub fn open_at(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> EventStream {
        let mut stream = connect(addr);
        write_request(&mut stream, addr, "GET", path, headers, b"");
        let mut reader = BufReader::new(stream);
        let (status, _) = read_head(&mut reader);
        EventStream {
            reader,
            buffer: String::new(),
            status,
        }
    }

    /// The next event (the JSON of its `data:`), skipping keep-alive
    /// comments; `None` when the stream ends.
    pub fn next_event(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return Some(serde_json::from_str(&data.join("\n")).expect("event data is JSON"));
            }
            let chunk = read_chunk(&mut self.reader)?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Events until one of type `kind` for which `matches` holds; returns
    /// every event seen, that one last.
    pub fn until(&mut self, kind: &str, matches: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let event = self
                .next_event()
                .unwrap_or_else(|| panic!("stream ended waiting for {kind}; saw {seen:#?}"));
            let done = event["type"] == kind && matches(&event["properties"]);
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

/// Runs the `offstage` CLI with `args` and `env`; returns (exit code,
/// stdout, stderr).
pub fn cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = Command::new(offstage_binary());
    command
        .args(args)
        .env_remove("OFFSTAGE_TOKEN")
        .env_remove("OFFSTAGE_SERVER")
        .env_remove("OFFSTAGE_LOG")
        .env_remove("RUST_LOG");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.stdin(Stdio::null()).output().expect("run offstage");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The token a host made in its data dir `data_dir` (`<data_dir>/token`).
pub fn token_in(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join("token"))
        .expect("the host's token file")
        .trim()
        .to_string()
}

/// Where a path names a file in a temp dir; for tests that write configs.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}
