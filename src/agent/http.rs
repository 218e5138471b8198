//! HTTP plumbing shared by the network backends: one `ureq` client per backend, blocking calls
//! run on a worker thread (`off_loop`), Server-Sent Events read line by line, and HTTP failures
//! sorted into `AgentError`s by whether the agent can have seen the message.
//!
//! Why blocking `ureq` on threads rather than an async client: the design keeps one small
//! dependency for all outgoing HTTP (push uses it too), and a Pi runs a handful of turns at
//! once at most (`limits.max_running_turns` threads). The price is that a stopped turn's thread
//! notices only at the stream's next line (a chunk, or Hermes' keep-alive every 30 s); the
//! gateway does not wait for it: the turn is over for the user at once.

use std::io::{BufRead, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::AgentError;
use crate::config::{AgentConfig, Secret};

/// Longest single SSE line kept; a longer one is cut (a runaway server cannot fill memory).
const MAX_SSE_LINE: usize = 1 << 20;
/// Largest plain JSON response read (model lists, transcripts).
const MAX_JSON_BYTES: u64 = 8 << 20;
/// Largest answer read by [`Endpoint::get_json_lean`] (a transcript whose images are skipped
/// as they stream past); what it keeps is still bounded by `MAX_JSON_BYTES`.
const MAX_LEAN_JSON_BYTES: u64 = 512 << 20;
/// A `data:` URL longer than this is left out of a lean read.
const LEAN_DATA_URL_CHARS: usize = 1024;
/// Plain JSON calls (probes, transcripts) must answer within this.
const JSON_CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// One agent server: its base URL, key and HTTP client.
#[derive(Clone)]
pub struct Endpoint {
    http: ureq::Agent,
    base: String,
    key: Secret,
}

/// One Server-Sent Event: its `event:` name (empty for plain `data:` events) and its data.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

/// Assembles SSE events from lines (the `text/event-stream` format: `event:`, `data:`
/// (joined by newlines), comments starting with `:`, a blank line ends an event).
#[derive(Default)]
pub struct SseParser {
    current: SseEvent,
    has_data: bool,
}

impl SseParser {
    /// Feeds one line (without its line ending); returns an event when the line completes one.
    pub fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let done = std::mem::take(&mut self.current);
            return std::mem::take(&mut self.has_data).then_some(done);
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.current.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

/// Set when the turn that started a worker is over (stopped, timed out, abandoned): the worker
/// stops reading, which closes the connection, which tells the agent to stop.
#[derive(Clone, Default)]
pub struct StopFlag(Arc<AtomicBool>);

impl StopFlag {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Sets the flag when dropped: dropping a turn's future stops its worker.
struct StopOnDrop(StopFlag);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0 .0.store(true, Ordering::Relaxed);
    }
}

/// Runs blocking work on a thread of its own and awaits its result without blocking the event
/// loop. Dropping the returned future sets the work's `StopFlag`.
pub async fn off_loop<T: Send + 'static>(
    name: &str,
    work: impl FnOnce(StopFlag) -> T + Send + 'static,
) -> Result<T, AgentError> {
    let stop = StopFlag::default();
    let _guard = StopOnDrop(stop.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.to_owned())
        .stack_size(256 << 10)
        .spawn(move || {
            let _ = tx.send(work(stop));
        })
        .map_err(|e| AgentError::Failed(format!("cannot start a worker thread: {e}")))?;
    rx.await
        .map_err(|_| AgentError::Failed("the agent worker thread died".into()))
}

impl Endpoint {
    pub fn new(config: &AgentConfig, key: Secret) -> Endpoint {
        let http: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(config.connect_timeout_secs)))
            // Silence longer than this ends a stream: the agent or the network is gone.
            .timeout_per_read(Some(Duration::from_secs(config.idle_timeout_secs)))
            // A backstop: the hub stops a turn at `turn_timeout_secs` on its own.
            .timeout_global(Some(Duration::from_secs(config.turn_timeout_secs + 30)))
            .max_idle_connections(4)
            .tls_config(crate::http_client::system_tls())
            .user_agent(concat!("iris-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Endpoint {
            http,
            base: config.base_url(),
            key,
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn auth(&self) -> Option<String> {
        (!self.key.is_empty()).then(|| format!("Bearer {}", self.key.expose()))
    }

    /// A GET with the key, bounded by `JSON_CALL_TIMEOUT`, up to its answer's head.
    fn get_now(&self, path: &str) -> Result<ureq::http::Response<ureq::Body>, AgentError> {
        self.json_request(self.http.get(self.url(path)), &[])
            .call()
            .map_err(|e| before_answer(&e))
    }

    /// GET returning JSON. Blocking: call it inside `off_loop`.
    pub fn get_json(&self, path: &str) -> Result<Value, AgentError> {
        let resp = self.get_now(path)?;
        json_body(resp)
    }

    /// POSTs a JSON body and reads the answer as Server-Sent Events, calling `on_event` for
    /// each until it returns `false`, the stream ends, or `stop` is set. Blocking: call it
    /// inside `off_loop`. Errors before the first byte of the answer mean the agent did not
    /// take the message (retryable ones are `Unreachable`/`Busy`); errors after it are
    /// `Interrupted`.
    pub fn post_sse(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
        stop: &StopFlag,
        on_event: impl FnMut(SseEvent) -> bool,
    ) -> Result<(), AgentError> {
        let mut req = self
            .http
            .post(self.url(path))
            .header("Accept", "text/event-stream");
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send_json(body).map_err(|e| before_answer(&e))?;
        read_sse(resp, stop, on_event)
    }

    /// GETs a Server-Sent Events stream (Hermes' run events), like [`Endpoint::post_sse`].
    pub fn get_sse(
        &self,
        path: &str,
        stop: &StopFlag,
        on_event: impl FnMut(SseEvent) -> bool,
    ) -> Result<(), AgentError> {
        let mut req = self
            .http
            .get(self.url(path))
            .header("Accept", "text/event-stream");
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        let resp = req.call().map_err(|e| before_answer(&e))?;
        read_sse(resp, stop, on_event)
    }

    /// `req` bounded by [`JSON_CALL_TIMEOUT`], with the agent's key and `headers`.
    fn json_request<B>(
        &self,
        req: ureq::RequestBuilder<B>,
        headers: &[(&str, &str)],
    ) -> ureq::RequestBuilder<B> {
        let mut req = req.config().timeout_global(Some(JSON_CALL_TIMEOUT)).build();
        if let Some(a) = self.auth() {
            req = req.header("Authorization", a);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req
    }

    /// A JSON call whose non-2xx answers the caller sorts itself (a 409 from Hermes' approval
    /// endpoint means "no longer open", not a failure): the status and the body (`null` when
    /// it is not JSON). Transport failures are `AgentError`s. Blocking: call it in `off_loop`.
    pub fn call_json(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), AgentError> {
        self.call_json_with(method, path, &[], body)
    }

    /// [`Endpoint::call_json`] with extra request headers (Hermes' `Idempotency-Key`).
    pub fn call_json_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<(u16, Value), AgentError> {
        let url = self.url(path);
        let resp = match method {
            "GET" => self.json_request(self.http.get(url), headers).call(),
            "DELETE" => self.json_request(self.http.delete(url), headers).call(),
            "POST" => self
                .json_request(self.http.post(url), headers)
                .send_json(body.cloned().unwrap_or(Value::Null)),
            // Sent as another would reach the wrong route (a DELETE once went out as a POST).
            other => return Err(AgentError::Failed(format!("no JSON call by {other}"))),
        }
        .map_err(|e| before_answer(&e))?;
        let status = resp.status().as_u16();
        if matches!(status, 401 | 403 | 429 | 503) {
            return Err(status_error(status, resp));
        }
        let text = resp
            .into_body()
            .with_config()
            .limit(MAX_JSON_BYTES)
            .read_to_string()
            .map_err(|e| AgentError::Interrupted(format!("unreadable answer: {e}")))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }
}

impl Endpoint {
    /// GET returning the status and JSON, with every long `data:` URL in it cut to its header
    /// (`data:image/png;base64,…`) as it streams past. Hermes saves a turn's images as
    /// `[screenshot]`, but a compression that moves the conversation to a new session writes
    /// the messages as they were sent, images included (agent/conversation_compression.py,
    /// `replace_messages`): a few photos would then put the transcript over `MAX_JSON_BYTES`,
    /// and every later turn of the lane with it. Blocking: call it in `off_loop`.
    pub fn get_json_lean(&self, path: &str) -> Result<(u16, Value), AgentError> {
        let resp = self.get_now(path)?;
        let status = resp.status().as_u16();
        if matches!(status, 401 | 403 | 429 | 503) {
            return Err(status_error(status, resp));
        }
        let reader = resp
            .into_body()
            .into_with_config()
            .limit(MAX_LEAN_JSON_BYTES)
            .reader();
        let reader = std::io::BufReader::with_capacity(8 << 10, reader);
        Ok((status, lean_json(reader).unwrap_or(Value::Null)))
    }
}

/// Parses JSON from `reader` with long `data:` URLs cut (see [`Endpoint::get_json_lean`]);
/// `None` when it is not JSON or what it keeps is over `MAX_JSON_BYTES`.
pub(super) fn lean_json(reader: impl Read) -> Option<Value> {
    use serde::de::DeserializeSeed;
    let budget = std::cell::Cell::new(MAX_JSON_BYTES as usize);
    let mut de = serde_json::Deserializer::from_reader(reader);
    let v = Lean(&budget).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(v)
}

/// Builds a `Value` like serde_json's own, cutting long data URLs and charging what it keeps
/// to a budget.
#[derive(Clone, Copy)]
struct Lean<'a>(&'a std::cell::Cell<usize>);

impl Lean<'_> {
    fn charge<E: serde::de::Error>(&self, n: usize) -> Result<(), E> {
        let left = self
            .0
            .get()
            .checked_sub(n)
            .ok_or_else(|| E::custom("over the JSON budget"))?;
        self.0.set(left);
        Ok(())
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Lean<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Lean<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        let kept = match v.split_once(',') {
            Some((header, _)) if v.starts_with("data:") && v.len() > LEAN_DATA_URL_CHARS => {
                let header: String = header.chars().take(100).collect();
                format!("{header},\u{2026}")
            }
            _ => v.to_owned(),
        };
        self.charge(kept.len())?;
        Ok(Value::String(kept))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            self.charge(8)?;
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.charge(key.len() + 8)?;
            let value = map.next_value_seed(self)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// Reads an SSE answer line by line (see [`Endpoint::post_sse`]).
fn read_sse(
    resp: ureq::http::Response<ureq::Body>,
    stop: &StopFlag,
    mut on_event: impl FnMut(SseEvent) -> bool,
) -> Result<(), AgentError> {
    let status = resp.status().as_u16();
    if status != 200 {
        return Err(status_error(status, resp));
    }
    let reader = resp.into_body().into_reader();
    let mut reader = std::io::BufReader::with_capacity(8 << 10, reader);
    let mut parser = SseParser::default();
    let mut line = Vec::new();
    loop {
        if stop.is_set() {
            return Ok(());
        }
        line.clear();
        let n = (&mut reader)
            .take(MAX_SSE_LINE as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| AgentError::Interrupted(io_reason(&e)))?;
        if n == 0 {
            // The end of the stream: a last event without its blank line still counts.
            if let Some(ev) = parser.line("") {
                on_event(ev);
            }
            return Ok(());
        }
        if line.len() >= MAX_SSE_LINE && !line.ends_with(b"\n") {
            // An over-long line: skip the rest of it.
            let mut sink = Vec::new();
            let _ = reader.read_until(b'\n', &mut sink);
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if let Some(ev) = parser.line(text) {
            if !on_event(ev) {
                return Ok(());
            }
        }
    }
}

/// A non-2xx answer, sorted by what the gateway should do about it.
fn status_error(status: u16, resp: ureq::http::Response<ureq::Body>) -> AgentError {
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let detail = error_detail(resp);
    let why = if detail.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {detail}")
    };
    match status {
        401 | 403 => AgentError::Unauthorized(why),
        429 | 503 => AgentError::Busy { retry_after, why },
        _ => AgentError::Failed(why),
    }
}

/// The `error.message` of an OpenAI-style error body, or the start of the body.
fn error_detail(resp: ureq::http::Response<ureq::Body>) -> String {
    let text = resp
        .into_body()
        .with_config()
        .limit(64 << 10)
        .read_to_string()
        .unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text).ok().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let detail = message.unwrap_or(text);
    detail.trim().chars().take(300).collect()
}

fn json_body(resp: ureq::http::Response<ureq::Body>) -> Result<Value, AgentError> {
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        return Err(status_error(status, resp));
    }
    resp.into_body()
        .with_config()
        .limit(MAX_JSON_BYTES)
        .read_json()
        .map_err(|e| AgentError::Failed(format!("unreadable answer: {e}")))
}

/// A transport failure before any answer: was the agent reachable at all?
fn before_answer(e: &ureq::Error) -> AgentError {
    use ureq::Error as E;
    match e {
        E::HostNotFound | E::ConnectionFailed => AgentError::Unreachable(e.to_string()),
        E::Timeout(t) => match t {
            ureq::Timeout::Resolve | ureq::Timeout::Connect => {
                AgentError::Unreachable(format!("no connection within the timeout ({t:?})"))
            }
            _ => AgentError::Failed(format!("no answer in time ({t:?})")),
        },
        E::Io(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::HostUnreachable
            | std::io::ErrorKind::NetworkUnreachable
            | std::io::ErrorKind::AddrNotAvailable
            | std::io::ErrorKind::NotFound => AgentError::Unreachable(io_reason(io)),
            // Reset or closed while sending: the agent may have read the request.
            _ => AgentError::Interrupted(io_reason(io)),
        },
        other => AgentError::Failed(other.to_string()),
    }
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            "the stream went silent past agent.idle_timeout_secs".into()
        }
        std::io::ErrorKind::UnexpectedEof => "the connection closed mid-stream".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        text.lines().filter_map(|l| p.line(l)).collect()
    }

    #[test]
    fn sse_events_are_assembled_from_lines() {
        let evs = parse(
            "data: {\"a\":1}\n\n: keepalive\n\nevent: hermes.tool.progress\ndata: {\"b\":2}\n\ndata: x\ndata: y\n\n",
        );
        assert_eq!(
            evs,
            vec![
                SseEvent {
                    event: String::new(),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: "hermes.tool.progress".into(),
                    data: "{\"b\":2}".into()
                },
                SseEvent {
                    event: String::new(),
                    data: "x\ny".into()
                },
            ]
        );
    }

    #[test]
    fn a_lean_read_cuts_long_data_urls_and_keeps_the_rest() {
        let url = format!("data:image/png;base64,{}", "A".repeat(5000));
        let text = serde_json::to_string(&serde_json::json!({"data": [
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": url}}]},
            {"role": "assistant", "content": "data:short,ok", "n": 1.5, "t": true, "z": null}
        ]}))
        .unwrap();
        let v = lean_json(text.as_bytes()).unwrap();
        assert_eq!(
            v.pointer("/data/0/content/1/image_url/url").unwrap(),
            "data:image/png;base64,\u{2026}"
        );
        assert_eq!(v.pointer("/data/0/content/0/text").unwrap(), "hi");
        assert_eq!(v["data"][1]["content"], "data:short,ok");
        assert_eq!(
            (v["data"][1]["n"].as_f64(), v["data"][1]["t"].as_bool()),
            (Some(1.5), Some(true))
        );
        assert!(lean_json(&b"not json"[..]).is_none());
    }

    #[test]
    fn comments_and_empty_events_yield_nothing() {
        assert!(parse(": ping\n\n\n\nevent: only-a-name\n\n").is_empty());
    }
}
