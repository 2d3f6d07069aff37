//! A scripted Chat Completions server: a real HTTP server on loopback that
//! speaks OpenAI's wire format (`POST /v1/chat/completions`, streamed as
//! server-sent events), as the model agent's tests and benchmark need.
//!
//! Each test scripts the answers, in order ([`Reply`]: text deltas, tool
//! calls whole or in fragments, refusals with a status, delays, a stream
//! that stops or hangs), and the server records every request
//! ([`ModelServer::requests`]) so the test asserts what the agent sent:
//! messages, tools and schemas, headers. It can send the shapes the real
//! servers send: ids only on a call's first fragment, arguments whole or
//! in pieces, usage only when `stream_options.include_usage` asks for it,
//! chunks with empty `choices`, `finish_reason` variants, no `index`.
//!
//! The server is plain std: a thread per connection, `Connection: close`
//! after each answer. It is the server side of the wire, written out so
//! that what is sent is exactly what the test says.

use std::{
    collections::VecDeque,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex,
    },
    time::Duration,
};

use serde_json::{json, Value};

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The JSON body.
    pub body: Value,
    /// The `Authorization` header, if sent.
    pub authorization: Option<String>,
}

impl Recorded {
    /// The request's messages.
    pub fn messages(&self) -> &Vec<Value> {
        self.body["messages"].as_array().expect("messages")
    }

    /// The names of the tools offered.
    pub fn tool_names(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
            .collect()
    }
}

/// One step of a streamed answer.
#[derive(Debug, Clone)]
pub enum Step {
    /// A `data:` line with this JSON chunk.
    Chunk(Value),
    /// `data: [DONE]`.
    Done,
    /// Waits this long before the next step.
    Sleep(Duration),
    /// Closes the connection here (a stream cut mid-answer).
    Cut,
    /// Holds the connection open until the client goes (an interrupt).
    Hang,
    /// Waits until [`ModelServer::release`] is called.
    Gate,
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with an event stream of these steps.
    Stream(Vec<Step>),
    /// A refusal: status, extra headers, JSON body.
    Status(u16, Vec<(String, String)>, Value),
    /// The connection closed without an answer (a dropped connection).
    Hangup,
}

fn chunk(delta: Value, finish: Option<&str>) -> Step {
    Step::Chunk(json!({
        "id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": "test-model",
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
    }))
}

impl Reply {
    /// An answer streamed as `deltas`, then `stop`, usage and `[DONE]`.
    pub fn text(deltas: &[&str]) -> Reply {
        let mut steps = vec![chunk(json!({ "role": "assistant", "content": "" }), None)];
        steps.extend(deltas.iter().map(|d| chunk(json!({ "content": d }), None)));
        steps.push(chunk(json!({}), Some("stop")));
        steps.push(Self::usage_step());
        steps.push(Step::Done);
        Reply::Stream(steps)
    }

    /// Tool calls `(id, name, arguments)`: each call's id and name on its
    /// first fragment only, the arguments in two fragments, then
    /// `tool_calls`, usage and `[DONE]`.
    pub fn tool_calls(calls: &[(&str, &str, &str)]) -> Reply {
        Self::answer(&[], calls)
    }

    /// Text `deltas`, then tool `calls` as [`Reply::tool_calls`] sends them.
    pub fn answer(deltas: &[&str], calls: &[(&str, &str, &str)]) -> Reply {
        let mut steps = vec![chunk(json!({ "role": "assistant", "content": null }), None)];
        steps.extend(deltas.iter().map(|d| chunk(json!({ "content": d }), None)));
        for (index, (id, name, arguments)) in calls.iter().enumerate() {
            let mut cut = arguments.len() / 2;
            while !arguments.is_char_boundary(cut) {
                cut -= 1;
            }
            steps.push(chunk(
                json!({ "tool_calls": [{ "index": index, "id": id, "type": "function",
                    "function": { "name": name, "arguments": &arguments[..cut] } }] }),
                None,
            ));
            steps.push(chunk(
                json!({ "tool_calls": [{ "index": index, "function": { "arguments": &arguments[cut..] } }] }),
                None,
            ));
        }
        steps.push(chunk(json!({}), Some("tool_calls")));
        steps.push(Self::usage_step());
        steps.push(Step::Done);
        Reply::Stream(steps)
    }

    /// A refusal with `status` and an API error body saying `message`.
    pub fn status(status: u16, message: &str) -> Reply {
        Reply::Status(
            status,
            Vec::new(),
            json!({ "error": { "message": message, "type": "test", "code": null } }),
        )
    }

    /// A 429 asking for a retry after `seconds`.
    pub fn rate_limited(seconds: u64) -> Reply {
        Reply::Status(
            429,
            vec![("Retry-After".into(), seconds.to_string())],
            json!({ "error": { "message": "Rate limit reached", "type": "requests" } }),
        )
    }

    /// The usage chunk (empty `choices`), sent only when the request asked.
    fn usage_step() -> Step {
        Step::Chunk(json!({
            "id": "chatcmpl-test", "object": "chat.completion.chunk", "choices": [],
            "usage": { "prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18 },
        }))
    }

    /// The same answer without its usage chunk, as a server that never
    /// reports usage sends it.
    pub fn without_usage(self) -> Reply {
        match self {
            Reply::Stream(steps) => Reply::Stream(
                steps
                    .into_iter()
                    .filter(|step| !matches!(step, Step::Chunk(c) if c.get("usage").is_some()))
                    .collect(),
            ),
            other => other,
        }
    }

    /// The same answer with `pause` before each of its steps.
    pub fn paced(self, pause: Duration) -> Reply {
        match self {
            Reply::Stream(steps) => Reply::Stream(
                steps
                    .into_iter()
                    .flat_map(|step| [Step::Sleep(pause), step])
                    .collect(),
            ),
            other => other,
        }
    }

    /// The same answer, held before its first step until
    /// [`ModelServer::release`].
    pub fn gated(self) -> Reply {
        match self {
            Reply::Stream(mut steps) => {
                steps.insert(0, Step::Gate);
                Reply::Stream(steps)
            }
            other => other,
        }
    }

    /// The same answer, held after its `after`-th content chunk until
    /// [`ModelServer::release`]: text on the client's screen mid-answer.
    pub fn held_after(self, after: usize) -> Reply {
        match self {
            Reply::Stream(steps) => {
                let mut held = Vec::new();
                let mut content = 0;
                for step in steps {
                    let is_content = is_content(&step);
                    held.push(step);
                    if is_content {
                        content += 1;
                        if content == after {
                            held.push(Step::Gate);
                        }
                    }
                }
                Reply::Stream(held)
            }
            other => other,
        }
    }

    /// The answer's steps up to `keep` content chunks, then `end`.
    pub fn stopping_after(self, keep: usize, end: Step) -> Reply {
        match self {
            Reply::Stream(steps) => {
                let mut kept = Vec::new();
                let mut content = 0;
                for step in steps {
                    let is_content = is_content(&step);
                    kept.push(step);
                    if is_content {
                        content += 1;
                        if content == keep {
                            break;
                        }
                    }
                }
                kept.push(end);
                Reply::Stream(kept)
            }
            other => other,
        }
    }
}

/// Whether `step` carries text.
fn is_content(step: &Step) -> bool {
    matches!(step, Step::Chunk(c)
        if c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty()))
}

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    requests: Vec<Recorded>,
    released: bool,
}

/// The running server. Stops when dropped (its threads end with their
/// connections).
pub struct ModelServer {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<(Mutex<Script>, Condvar)>,
    stop: Arc<AtomicBool>,
}

impl ModelServer {
    /// Starts a server on a free loopback port.
    pub fn start() -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().unwrap();
        let state: Arc<(Mutex<Script>, Condvar)> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        {
            let state = state.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let state = state.clone();
                    std::thread::spawn(move || serve(stream, &state));
                }
            });
        }
        ModelServer { addr, state, stop }
    }

    /// `http://ADDR/v1`: an agent's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Adds answers to the script, in order.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        let (lock, _) = &*self.state;
        lock.lock().unwrap().replies.extend(replies);
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.0.lock().unwrap().requests.clone()
    }

    /// Waits (bounded) until `count` requests have arrived; returns them.
    pub fn wait_requests(&self, count: usize) -> Vec<Recorded> {
        crate::wait::eventually("the model server's requests", || {
            let requests = self.requests();
            (requests.len() >= count).then_some(requests)
        })
    }

    /// Lets every answer waiting at a [`Step::Gate`] go on.
    pub fn release(&self) {
        let (lock, ready) = &*self.state;
        lock.lock().unwrap().released = true;
        ready.notify_all();
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.release();
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Answers one connection's one request.
fn serve(stream: TcpStream, state: &(Mutex<Script>, Condvar)) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut length = 0;
    let mut authorization = None;
    let mut line = String::new();
    let Ok(_) = reader.read_line(&mut line) else {
        return;
    };
    if line.is_empty() {
        return;
    }
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "authorization" => authorization = Some(value.trim().to_string()),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let include_usage = body["stream_options"]["include_usage"] == true;
    let reply = {
        let mut script = state.0.lock().unwrap();
        script.requests.push(Recorded {
            body,
            authorization,
        });
        script.replies.pop_front()
    };
    let mut stream = stream;
    let reply = reply.unwrap_or_else(|| Reply::status(500, "the test scripted no more answers"));
    match reply {
        Reply::Hangup => {}
        Reply::Status(status, headers, body) => {
            let body = body.to_string();
            let mut head = format!(
                "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            let _ = stream.write_all(format!("{head}\r\n{body}").as_bytes());
        }
        Reply::Stream(steps) => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
            if stream.write_all(head.as_bytes()).is_err() {
                return;
            }
            for step in steps {
                let sent = match step {
                    Step::Chunk(chunk) => {
                        if chunk.get("usage").is_some() && !include_usage {
                            continue;
                        }
                        stream.write_all(format!("data: {chunk}\n\n").as_bytes())
                    }
                    Step::Done => stream.write_all(b"data: [DONE]\n\n"),
                    Step::Sleep(pause) => {
                        std::thread::sleep(pause);
                        Ok(())
                    }
                    Step::Cut => return,
                    Step::Hang => {
                        // Until the client closes: a read returns 0 then.
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
                        let mut byte = [0; 1];
                        let _ = reader.read(&mut byte);
                        return;
                    }
                    Step::Gate => {
                        let (lock, ready) = state;
                        let mut script = lock.lock().unwrap();
                        while !script.released {
                            script = ready.wait(script).unwrap();
                        }
                        Ok(())
                    }
                };
                if sent.and_then(|()| stream.flush()).is_err() {
                    return;
                }
            }
        }
    }
}
