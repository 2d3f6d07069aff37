//! A minimal HTTP/1.1 keep-alive client over `std::net`, enough to drive
//! `offstage serve` in the benchmarks without adding a client stack whose
//! own cost would blur the figures. JSON bodies, `Content-Length` or
//! chunked answers.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// One keep-alive connection.
pub struct Conn {
    addr: SocketAddr,
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

/// An answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The body, as text.
    pub body: String,
}

impl Answer {
    /// The body parsed as JSON; panics if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl Conn {
    /// Opens a keep-alive connection to `addr`.
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        Conn {
            addr,
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
        }
    }

    /// Writes a request without waiting for its answer.
    pub fn send(&mut self, method: &str, path: &str, body: Option<&str>) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        if let Some(body) = body {
            head.push_str("Content-Type: application/json\r\n");
            head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        } else if matches!(method, "POST" | "PUT" | "PATCH") {
            head.push_str("Content-Length: 0\r\n\r\n");
        } else {
            head.push_str("\r\n");
        }
        self.writer
            .write_all(head.as_bytes())
            .expect("write request");
    }

    /// Reads the next answer.
    pub fn recv(&mut self) -> Answer {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("read status line");
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut length = None;
        let mut chunked = false;
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("read header");
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            if let Some((name, value)) = trimmed.split_once(':') {
                let value = value.trim();
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.parse::<usize>().ok();
                } else if name.eq_ignore_ascii_case("transfer-encoding")
                    && value.eq_ignore_ascii_case("chunked")
                {
                    chunked = true;
                }
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line).expect("chunk size");
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap(), 16)
                    .expect("chunk size");
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).expect("chunk");
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(length) = length {
            body.resize(length, 0);
            self.reader.read_exact(&mut body).expect("body");
        }
        Answer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// A request and its answer.
    pub fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> Answer {
        self.send(method, path, body);
        self.recv()
    }
}
