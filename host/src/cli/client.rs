//! A small blocking client of the host's HTTP API, for the CLI commands.
//!
//! Blocking is the right shape here: each command makes one or two calls
//! and prints. A tool call may hold its request for as long as the job
//! runs, so there is no overall timeout, only one for connecting.

use std::{
    io::{BufRead, BufReader, Read},
    time::Duration,
};

use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;
use ureq::{
    http::{Method, Request},
    Agent,
};

/// What can go wrong talking to the host.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The host could not be reached at all.
    #[error("cannot reach the host at {server}: {message} (is `offstage serve` running?)")]
    Unreachable { server: String, message: String },
    /// The host answered with an error.
    #[error("{code}: {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The host's answer made no sense.
    #[error("unexpected answer from the host: {0}")]
    Protocol(String),
}

/// A client of one host.
#[derive(Clone)]
pub(crate) struct Client {
    agent: Agent,
    server: String,
    token: Option<String>,
}

impl Client {
    /// A client of the host at `server` (`http://HOST:PORT`), sending
    /// `token` as a bearer token when given.
    pub(crate) fn new(server: &str, token: Option<String>) -> Result<Self, ClientError> {
        let server = server.trim_end_matches('/').to_string();
        if !server.starts_with("http://") {
            return Err(ClientError::Unreachable {
                server,
                message: "the server URL must start with http://".into(),
            });
        }
        let agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(5)))
            .max_redirects(0)
            .build()
            .new_agent();
        Ok(Client {
            agent,
            server,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// `GET path`, parsed as `T`.
    pub(crate) fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.call(Method::GET, path, None::<&()>)
    }

    /// `method path` with an optional JSON body, parsed as `T` (a 204 parses
    /// as JSON `null`).
    pub(crate) fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        self.call_inner(method, path, body, None)
    }

    /// [`call`](Self::call) with one more header (a prompt's
    /// `Idempotency-Key`).
    pub(crate) fn call_with_header<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        header: (&str, String),
    ) -> Result<T, ClientError> {
        self.call_inner(method, path, body, Some(header))
    }

    fn call_inner<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
        header: Option<(&str, String)>,
    ) -> Result<T, ClientError> {
        let bytes = match body {
            Some(body) => {
                serde_json::to_vec(body).map_err(|e| ClientError::Protocol(e.to_string()))?
            }
            None => Vec::new(),
        };
        let mut response = self.send_with(method, path, bytes, header)?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(64 * 1024 * 1024)
            .read_to_string()
            .map_err(|e| self.unreachable(e))?;
        if !(200..300).contains(&status) {
            return Err(api_error(status, &text));
        }
        let text = if text.trim().is_empty() {
            "null"
        } else {
            &text
        };
        serde_json::from_str(text).map_err(|e| ClientError::Protocol(format!("{e} in {text:.200}")))
    }

    /// Sends one request, with one more header when given.
    fn send_with(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
        header: Option<(&str, String)>,
    ) -> Result<ureq::http::Response<ureq::Body>, ClientError> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.server))
            .header("Accept", "application/json");
        if !body.is_empty() {
            request = request.header("Content-Type", "application/json");
        }
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let request = request
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.agent.run(request).map_err(|e| self.unreachable(e))
    }

    fn unreachable(&self, error: ureq::Error) -> ClientError {
        ClientError::Unreachable {
            server: self.server.clone(),
            message: error.to_string(),
        }
    }

    /// Opens `GET /api/event` and returns its events, each a JSON event
    /// `{id, type, properties}`, as they arrive. With `last_event_id`, the
    /// host first replays the held events after that one (`Last-Event-ID`).
    /// The iterator ends when the host closes the stream.
    pub(crate) fn events(&self, last_event_id: Option<u64>) -> Result<Events, ClientError> {
        let header = last_event_id.map(|id| ("Last-Event-ID", id.to_string()));
        let mut response = self.send_with(Method::GET, "/api/event", Vec::new(), header)?;
        let status = response.status().as_u16();
        if status != 200 {
            let text = response.body_mut().read_to_string().unwrap_or_default();
            return Err(api_error(status, &text));
        }
        Ok(Events {
            reader: BufReader::new(Box::new(response.into_body().into_reader())),
            server: self.server.clone(),
        })
    }
}

fn api_error(status: u16, text: &str) -> ClientError {
    let body: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let error = &body["error"];
    ClientError::Api {
        status,
        code: error["code"].as_str().unwrap_or("http_error").to_string(),
        message: error["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("HTTP {status}: {}", text.trim())),
    }
}

/// The events of an open event stream.
pub(crate) struct Events {
    reader: BufReader<Box<dyn Read + Send>>,
    server: String,
}

impl Iterator for Events {
    type Item = Result<Value, ClientError>;

    /// Reads SSE lines up to the next event that carries data. Comments
    /// (keep-alives) and other fields are skipped.
    fn next(&mut self) -> Option<Self::Item> {
        let mut data = String::new();
        let mut line = String::new();
        loop {
            line.clear();
            match self.reader.read_line(&mut line) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(error) => {
                    return Some(Err(ClientError::Unreachable {
                        server: self.server.clone(),
                        message: error.to_string(),
                    }))
                }
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if data.is_empty() {
                    continue;
                }
                return Some(
                    serde_json::from_str(&data).map_err(|e| ClientError::Protocol(e.to_string())),
                );
            }
            if let Some(value) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value.strip_prefix(' ').unwrap_or(value));
            }
        }
    }
}
