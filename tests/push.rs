//! Push notifications for away devices, against the real binary and fake push servers: what is
//! pushed and to whom, the exact ntfy and FCM request shapes, `last_pushed_cursor`, exactly-once
//! across graceful and hard restarts, retries with `status` degraded/online, a dead push server
//! never slowing live traffic, revoked devices, authentication and the `content` setting.
//!
//! The fake servers are plain HTTP/1.1 on 127.0.0.1 ephemeral ports, one thread per connection,
//! recording every request; each test decides per request what to answer (a status, drop the
//! connection, or never answer).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;
use common::{
    connect, connect_with, demo_reply, frame_type, pair, typing_off, Client, Gateway, Paired,
};
use serde_json::{json, Value};

/// How long a push may take to arrive (retries included).
const PUSH_WAIT: Duration = Duration::from_secs(15);
/// How long to watch for a push that must not come.
const QUIET: Duration = Duration::from_millis(1500);
/// Long enough for a retry with `max_backoff_secs = 1` (+25 % jitter) to happen.
const RETRY_QUIET: Duration = Duration::from_millis(2500);
/// The FCM fake's access token.
const ACCESS_TOKEN: &str = "ya29.fake-access-token";
const FIXTURE_KEY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/fcm-service-account.json"
);

// ---------------------------------------------------------------------------------------------
// Fake HTTP server
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct HttpReq {
    method: String,
    path: String,
    /// Names lower-cased.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// What the fake answered; `None` when it dropped the connection or never answered.
    status: Option<u16>,
}

impl HttpReq {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "request body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn form(&self) -> BTreeMap<String, String> {
        String::from_utf8_lossy(&self.body)
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (url_decode(k), url_decode(v)))
            .collect()
    }

    fn delivered(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

fn url_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Clone)]
enum Reply {
    Json(u16, Value),
    /// Close the connection without answering (a server going down mid-request).
    Drop,
    /// Keep the connection open and never answer.
    Hang,
}

type Policy = Arc<dyn Fn(&HttpReq) -> Reply + Send + Sync>;

struct FakeHttp {
    port: u16,
    log: Arc<Mutex<Vec<HttpReq>>>,
    stop: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: Option<JoinHandle<()>>,
}

impl FakeHttp {
    fn start(policy: impl Fn(&HttpReq) -> Reply + Send + Sync + 'static) -> FakeHttp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake HTTP server");
        let port = listener.local_addr().expect("local addr").port();
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let log: Arc<Mutex<Vec<HttpReq>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let policy: Policy = Arc::new(policy);
        let accept = {
            let (log, stop, threads) = (log.clone(), stop.clone(), threads.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (log, stop, policy) = (log.clone(), stop.clone(), policy.clone());
                            let h =
                                std::thread::spawn(move || serve_conn(stream, log, stop, policy));
                            threads.lock().unwrap_or_else(|p| p.into_inner()).push(h);
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        FakeHttp {
            port,
            log,
            stop,
            threads,
            accept: Some(accept),
        }
    }

    /// A server that answers every request `200 {}`.
    fn ok() -> FakeHttp {
        FakeHttp::start(|_| Reply::Json(200, json!({})))
    }

    /// A server that answers `200 {}` while `up` holds and `down` otherwise: a push server the
    /// test takes down and brings back.
    fn switchable(up: &Arc<AtomicBool>, down: Reply) -> FakeHttp {
        let up = up.clone();
        FakeHttp::start(move |_| {
            if up.load(Ordering::SeqCst) {
                Reply::Json(200, json!({}))
            } else {
                down.clone()
            }
        })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn requests(&self) -> Vec<HttpReq> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Polls the request log until `done` holds; panics (with the gateway's output) after `timeout`.
    async fn wait_for(
        &self,
        gw: &Gateway,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[HttpReq]) -> bool,
    ) -> Vec<HttpReq> {
        let deadline = Instant::now() + timeout;
        loop {
            let reqs = self.requests();
            if done(&reqs) {
                return reqs;
            }
            if Instant::now() >= deadline {
                panic!(
                    "fake push server: {what} not seen within {timeout:?}\nrequests so far:\n{}\n{}",
                    dump_reqs(&reqs),
                    gw.output_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for FakeHttp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let threads: Vec<_> = self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for h in threads {
            let _ = h.join();
        }
    }
}

fn serve_conn(
    mut stream: TcpStream,
    log: Arc<Mutex<Vec<HttpReq>>>,
    stop: Arc<AtomicBool>,
    policy: Policy,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        if let Some((mut req, used)) = parse_request(&buf) {
            buf.drain(..used);
            let reply = policy(&req);
            if let Reply::Json(code, _) = &reply {
                req.status = Some(*code);
            }
            log.lock().unwrap_or_else(|p| p.into_inner()).push(req);
            match reply {
                Reply::Json(code, body) => {
                    let body = body.to_string();
                    let reason = match code {
                        200 => "OK",
                        401 => "Unauthorized",
                        429 => "Too Many Requests",
                        503 => "Service Unavailable",
                        _ => "Status",
                    };
                    let head = format!(
                        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    if stream.write_all(head.as_bytes()).is_err()
                        || stream.write_all(body.as_bytes()).is_err()
                        || stream.flush().is_err()
                    {
                        return;
                    }
                }
                Reply::Drop => {
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                    return;
                }
                Reply::Hang => {
                    while !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    return;
                }
            }
            continue;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// One complete request at the start of `buf` (Content-Length bodies only: all the gateway sends).
fn parse_request(buf: &[u8]) -> Option<(HttpReq, usize)> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_owned();
    let path = request_line.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let total = end + 4 + len;
    if buf.len() < total {
        return None;
    }
    Some((
        HttpReq {
            method,
            path,
            headers,
            body: buf[end + 4..total].to_vec(),
            status: None,
        },
        total,
    ))
}

fn dump_reqs(reqs: &[HttpReq]) -> String {
    reqs.iter()
        .map(|r| {
            format!(
                "  {} {} -> {:?} auth={:?} {}",
                r.method,
                r.path,
                r.status,
                r.header("authorization"),
                String::from_utf8_lossy(&r.body)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// ntfy publishes for `topic`, in arrival order.
fn to_topic(reqs: &[HttpReq], topic: &str) -> Vec<HttpReq> {
    reqs.iter()
        .filter(|r| r.json()["topic"] == topic)
        .cloned()
        .collect()
}

/// The query of an ntfy `click` URL, asserting its `iris://chat?` shape.
fn click_params(push: &Value) -> BTreeMap<String, String> {
    let click = push["click"]
        .as_str()
        .unwrap_or_else(|| panic!("push without click URL: {push}"));
    let query = click
        .strip_prefix("iris://chat?")
        .unwrap_or_else(|| panic!("click URL is not iris://chat?…: {click}"));
    let mut params = BTreeMap::new();
    for kv in query.split('&') {
        let (k, v) = kv
            .split_once('=')
            .unwrap_or_else(|| panic!("click URL part without `=`: {click}"));
        assert!(
            params.insert(k.to_owned(), v.to_owned()).is_none(),
            "click URL repeats `{k}`: {click}"
        );
    }
    params
}

fn click_cursor(push: &Value) -> u64 {
    click_params(push)
        .get("cursor")
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("click URL without numeric cursor: {push}"))
}

// ---------------------------------------------------------------------------------------------
// Gateway helpers
// ---------------------------------------------------------------------------------------------

/// The first `n` characters, plus "…" when something was cut.
fn cut(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().count() > n {
        out.push('\u{2026}');
    }
    out
}

/// A data dir plus a scratch dir for config, key and token files.
struct Env {
    dir: tempfile::TempDir,
    aux: tempfile::TempDir,
    config: Option<PathBuf>,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: common::temp_data_dir(),
            aux: tempfile::tempdir().expect("aux dir"),
            config: None,
        }
    }

    /// An ntfy config with fast retries; `extra` goes inside `[push]`.
    fn ntfy(server: &str, extra: &str) -> Env {
        let mut env = Env::new();
        env.write_config(&format!(
            "[push]\nbackend = \"ntfy\"\nntfy_server = \"{server}\"\nbackoff_ms = 100\nmax_backoff_secs = 1\ngive_up_secs = 600\n{extra}\n"
        ));
        env
    }

    fn write_config(&mut self, text: &str) {
        self.config = Some(self.write("gateway.toml", text));
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.aux.path().join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    fn data(&self) -> &Path {
        self.dir.path()
    }

    fn start(&self, extra: &[&str]) -> Gateway {
        let mut args: Vec<&str> = Vec::new();
        if let Some(c) = &self.config {
            args.push("--config");
            args.push(c.to_str().expect("UTF-8 path"));
        }
        args.extend_from_slice(extra);
        Gateway::start(self.data(), &args)
    }
}

/// Pairs `name`, which registers `topic` and leaves: away from now on, so it is pushed to.
async fn away_device(env: &Env, gw: &Gateway, name: &str, topic: &str) -> Paired {
    let p = pair(env.data(), name);
    visit_with_topic(gw, &p, topic).await;
    p
}

/// The usual cast: `device-a`, which talks, and `phone`, away with topic `phone-1`.
async fn sender_and_away_phone(env: &Env, gw: &Gateway) -> (Paired, Paired) {
    let pa = pair(env.data(), "device-a");
    (pa, away_device(env, gw, "phone", "phone-1").await)
}

/// Connects with `topic`, then goes away again: from now on the device is "away".
async fn visit_with_topic(gw: &Gateway, p: &Paired, topic: &str) -> Value {
    let (c, ack) = connect_with(gw, p, json!({ "ntfy_topic": topic })).await;
    c.close().await;
    ack
}

struct Turn {
    user_id: String,
    reply_id: String,
    final_text: String,
    receipt_after: Duration,
    stop_after: Duration,
}

/// One message.send and its whole demo turn, as the sender sees it.
async fn send_turn(c: &mut Client, chat: Option<&str>, thread: Option<&str>, text: &str) -> Turn {
    let t0 = Instant::now();
    let rid = c.send_text(chat, thread, &text).await;
    let receipt = c.recv_reply(rid).await;
    let receipt_after = t0.elapsed();
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    let stop = c.recv_type("message.stop").await;
    let stop_after = t0.elapsed();
    c.recv_until(typing_off).await;
    Turn {
        user_id: receipt["payload"]["message_id"]
            .as_str()
            .expect("receipt id")
            .to_owned(),
        reply_id: stop["payload"]["message_id"]
            .as_str()
            .expect("stop id")
            .to_owned(),
        final_text: stop["payload"]["final_text"]
            .as_str()
            .expect("final_text")
            .to_owned(),
        receipt_after,
        stop_after,
    }
}

/// `sync{cursor: from}`: the replayed frames (each with `cursor`) and `sync.done`'s cursor.
async fn replay(c: &mut Client, from: u64) -> (Vec<Value>, u64) {
    let id = c
        .request("sync", None, None, json!({ "cursor": from }))
        .await;
    let mut frames = Vec::new();
    loop {
        let f = c.recv().await;
        if f["id"].as_i64() == Some(id) {
            assert_eq!(frame_type(&f), "sync.done", "{f}");
            return (frames, f["payload"]["cursor"].as_u64().expect("head"));
        }
        if f.get("cursor").is_some() {
            frames.push(f);
        }
    }
}

/// The outbox cursor of the frame carrying `message_id` (not the user's echo).
fn cursor_of(frames: &[Value], message_id: &str) -> u64 {
    frames
        .iter()
        .find(|f| {
            f["payload"]["message_id"] == message_id
                && matches!(frame_type(f), "message.stop" | "message")
                && f["payload"]["role"] != "user"
        })
        .and_then(|f| f["cursor"].as_u64())
        .unwrap_or_else(|| panic!("no replayed frame for {message_id} in {frames:#?}"))
}

fn is_pushable(f: &Value) -> bool {
    match frame_type(f) {
        "message.stop" | "notification" => true,
        "message" => f["payload"]["role"] != "user",
        _ => false,
    }
}

/// Reads until a `status` with `state`; the frames before it are validated as usual.
async fn expect_status(c: &mut Client, state: &str) {
    c.recv_until(|f| frame_type(f) == "status" && f["payload"]["state"] == state)
        .await;
}

fn fcm_key_file(env: &Env, token_port: u16) -> PathBuf {
    let text = std::fs::read_to_string(FIXTURE_KEY).expect("read fixture key");
    assert!(text.contains("TOKEN_PORT"), "fixture lacks TOKEN_PORT");
    env.write(
        "fcm.json",
        &text.replace("TOKEN_PORT", &token_port.to_string()),
    )
}

/// A fake that is both the OAuth token endpoint (`/token`) and FCM (`/v1/…:send`).
fn fake_fcm() -> FakeHttp {
    FakeHttp::start(|r| match r.path.as_str() {
        "/token" => Reply::Json(
            200,
            json!({ "access_token": ACCESS_TOKEN, "expires_in": 3600, "token_type": "Bearer" }),
        ),
        p if p.ends_with(":send") => {
            Reply::Json(200, json!({ "name": "projects/iris-test/messages/1" }))
        }
        _ => Reply::Json(404, json!({ "error": "not found" })),
    })
}

fn is_send(r: &HttpReq) -> bool {
    r.path.ends_with(":send")
}

fn b64url(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap_or_else(|e| panic!("not base64url ({e}): {s}"))
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn push_only_when_away() {
    let ntfy = FakeHttp::ok();
    let env = Env::ntfy(&ntfy.url(), "");
    let gw = env.start(&[]);
    let pa = pair(env.data(), "device-a");
    let pp = pair(env.data(), "phone");

    visit_with_topic(&gw, &pp, "phone-1").await;
    let (mut a, ack_a) = connect(&gw, &pa).await;
    let start = common::sync_cursor(&ack_a);

    let text = "water the tomatoes";
    let t = send_turn(&mut a, Some("default"), None, text).await;
    assert_eq!(t.final_text, demo_reply(text));
    ntfy.wait_for(&gw, "a push for the away phone", PUSH_WAIT, |r| {
        !r.is_empty()
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let reqs = ntfy.requests();
    assert_eq!(
        reqs.len(),
        1,
        "exactly one push expected for one answer (none for the user echo):\n{}",
        dump_reqs(&reqs)
    );
    let r = &reqs[0];
    assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "/"), "{r:?}");
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "{r:?}"
    );
    assert_eq!(r.header("authorization"), None, "no auth configured: {r:?}");
    let push = r.json();
    let mut keys: Vec<&str> = push
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["click", "message", "tags", "title", "topic"],
        "{push}"
    );
    assert_eq!(push["topic"], "phone-1", "{push}");
    assert_eq!(push["title"], "General", "{push}");
    assert_eq!(push["tags"], json!(["speech_balloon"]), "{push}");
    assert_eq!(
        push["message"].as_str(),
        Some(cut(&demo_reply(text), 60).as_str()),
        "default content is a 60-character preview: {push}"
    );

    let (frames, _) = replay(&mut a, start).await;
    let stop_cursor = cursor_of(&frames, &t.reply_id);
    let click = click_params(&push);
    let want: BTreeMap<String, String> = [
        ("chat_id", "default".to_owned()),
        ("message_id", t.reply_id.clone()),
        ("cursor", stop_cursor.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(click, want, "{push}");
    assert_ne!(
        click["message_id"], t.user_id,
        "the user echo is never pushed"
    );

    // Second round: P is connected, so A's next answer is not pushed to it.
    let (mut p, _) = connect_with(&gw, &pp, json!({ "ntfy_topic": "phone-1" })).await;
    let t2 = send_turn(&mut a, None, None, "second round").await;
    let seen = p.recv_type("message.stop").await;
    assert_eq!(
        seen["payload"]["message_id"].as_str(),
        Some(t2.reply_id.as_str())
    );
    tokio::time::sleep(QUIET).await;
    let after = ntfy.requests();
    assert_eq!(
        after.len(),
        1,
        "no push while the phone is connected:\n{}",
        dump_reqs(&after)
    );
}

#[tokio::test]
async fn last_pushed_cursor_in_hello_ack() {
    let ntfy = FakeHttp::ok();
    let env = Env::ntfy(&ntfy.url(), "");
    let mut gw = env.start(&[]);
    let pa = pair(env.data(), "device-a");
    let pp = pair(env.data(), "phone");

    let ack_p = visit_with_topic(&gw, &pp, "phone-1").await;
    assert_eq!(ack_p["payload"]["last_pushed_cursor"], 0, "{ack_p}");
    let old_cursor = ack_p["payload"]["sync_cursor"]
        .as_u64()
        .expect("sync_cursor");

    let (mut a, _) = connect(&gw, &pa).await;
    let t = send_turn(&mut a, None, None, "remind me at six").await;
    let reqs = ntfy
        .wait_for(&gw, "the push", PUSH_WAIT, |r| {
            r.iter().any(HttpReq::delivered)
        })
        .await;
    let pushed = click_cursor(&reqs[0].json());

    // The delivery is recorded shortly after the 2xx; reconnect until hello.ack reports it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut p, ack) = loop {
        let (p, ack) = connect_with(&gw, &pp, json!({ "ntfy_topic": "phone-1" })).await;
        if ack["payload"]["last_pushed_cursor"].as_u64() == Some(pushed)
            || Instant::now() >= deadline
        {
            break (p, ack);
        }
        p.close().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        ack["payload"]["last_pushed_cursor"].as_u64(),
        Some(pushed),
        "hello.ack.last_pushed_cursor must be the delivered push's cursor: {ack}"
    );

    // Sync from where P was: the pushed answer is replayed at exactly that cursor, so the app
    // skips notifying it (and everything at or below it).
    let (frames, head) = replay(&mut p, old_cursor).await;
    assert!(head >= pushed, "sync.done {head} < pushed {pushed}");
    assert_eq!(cursor_of(&frames, &t.reply_id), pushed);
    for f in frames.iter().filter(|f| is_pushable(f)) {
        assert!(
            f["cursor"].as_u64().expect("cursor") <= pushed,
            "a replayed pushable frame above last_pushed_cursor would notify twice: {f}"
        );
    }
    p.close().await;
    a.close().await;

    // Durable: survives a hard crash.
    gw.kill9();
    let gw = env.start(&[]);
    let (_p, ack) = connect_with(&gw, &pp, json!({ "ntfy_topic": "phone-1" })).await;
    assert_eq!(
        ack["payload"]["last_pushed_cursor"].as_u64(),
        Some(pushed),
        "last_pushed_cursor lost by kill -9: {ack}"
    );
}

#[tokio::test]
async fn exactly_once_across_restarts() {
    let up = Arc::new(AtomicBool::new(true));
    let ntfy = FakeHttp::switchable(&up, Reply::Drop);
    let env = Env::ntfy(&ntfy.url(), "");
    let mut gw = env.start(&[]);
    let (pa, _) = sender_and_away_phone(&env, &gw).await;

    // Round 1: two answers, delivered (2 pushes, or 1 collapsed), then a graceful restart.
    let (mut a, ack_a) = connect(&gw, &pa).await;
    let start = common::sync_cursor(&ack_a);
    let t1 = send_turn(&mut a, None, None, "first thing").await;
    let t2 = send_turn(&mut a, None, None, "second thing").await;
    let (frames, _) = replay(&mut a, start).await;
    let (c1, c2) = (
        cursor_of(&frames, &t1.reply_id),
        cursor_of(&frames, &t2.reply_id),
    );
    let reqs = ntfy
        .wait_for(&gw, "the push of the second answer", PUSH_WAIT, |r| {
            r.iter()
                .any(|q| q.delivered() && click_cursor(&q.json()) == c2)
        })
        .await;
    match reqs.len() {
        1 => {
            let push = reqs[0].json();
            assert_eq!(push["message"], "2 new messages", "collapsed push: {push}");
            assert_eq!(click_params(&push)["message_id"], t2.reply_id, "{push}");
        }
        2 => {
            let (p1, p2) = (reqs[0].json(), reqs[1].json());
            assert_eq!(click_params(&p1)["message_id"], t1.reply_id, "{p1}");
            assert_eq!(click_cursor(&p1), c1, "{p1}");
            assert_eq!(click_params(&p2)["message_id"], t2.reply_id, "{p2}");
        }
        n => panic!("{n} pushes for two answers:\n{}", dump_reqs(&reqs)),
    }
    // Let the gateway record the delivery (it has no observable signal for it).
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(a);
    let status = gw.sigterm();
    assert!(status.success(), "SIGTERM exit: {status:?}");
    let before_restart = ntfy.requests().len();

    let mut gw = env.start(&[]);
    tokio::time::sleep(QUIET).await;
    let after = ntfy.requests();
    assert_eq!(
        after.len(),
        before_restart,
        "a graceful restart pushed again what was already delivered:\n{}\n{}",
        dump_reqs(&after),
        gw.output_tail()
    );

    // Round 2: the push server is down; the push fails; kill -9; server up; restart.
    up.store(false, Ordering::SeqCst);
    let (mut a, ack_a) = connect(&gw, &pa).await;
    let start = common::sync_cursor(&ack_a);
    let t3 = send_turn(&mut a, None, None, "third thing").await;
    expect_status(&mut a, "degraded").await;
    gw.kill9();
    // A request the dead gateway had fully sent is recorded within moments.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let failed = ntfy.requests().len();
    assert!(
        failed > before_restart,
        "the failing push was never attempted"
    );
    up.store(true, Ordering::SeqCst);

    let gw = env.start(&[]);
    ntfy.wait_for(&gw, "the owed push after kill -9", PUSH_WAIT, |r| {
        r[failed..].iter().any(HttpReq::delivered)
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let reqs_after = ntfy.requests();
    let since: Vec<HttpReq> = reqs_after[failed..].to_vec();
    assert_eq!(
        since.len(),
        1,
        "the owed push must arrive exactly once:\n{}",
        dump_reqs(&since)
    );
    let push = since[0].json();
    let (mut a, _) = connect(&gw, &pa).await;
    let (frames, _) = replay(&mut a, start).await;
    assert_eq!(click_params(&push)["message_id"], t3.reply_id, "{push}");
    assert_eq!(
        click_cursor(&push),
        cursor_of(&frames, &t3.reply_id),
        "{push}"
    );
    assert_eq!(
        push["message"].as_str(),
        Some(cut(&t3.final_text, 60).as_str())
    );
}

#[tokio::test]
async fn retries_after_server_comes_back() {
    let calls = Arc::new(AtomicUsize::new(0));
    let ntfy = {
        let calls = calls.clone();
        FakeHttp::start(move |_| {
            if calls.fetch_add(1, Ordering::SeqCst) < 3 {
                Reply::Json(503, json!({ "error": "busy" }))
            } else {
                Reply::Json(200, json!({}))
            }
        })
    };
    let env = Env::ntfy(&ntfy.url(), "");
    let gw = env.start(&[]);
    let pa = pair(env.data(), "device-a");
    let pb = pair(env.data(), "device-b");
    let pp = pair(env.data(), "phone");
    visit_with_topic(&gw, &pp, "phone-1").await;
    let (mut a, _) = connect(&gw, &pa).await;
    let (mut b, _) = connect(&gw, &pb).await;

    send_turn(&mut a, None, None, "retry me").await;
    let reqs = ntfy
        .wait_for(&gw, "a delivered push after three 503s", PUSH_WAIT, |r| {
            r.iter().any(HttpReq::delivered)
        })
        .await;
    assert_eq!(
        reqs.iter().map(|r| r.status).collect::<Vec<_>>(),
        [Some(503), Some(503), Some(503), Some(200)],
        "{}",
        dump_reqs(&reqs)
    );
    let first = reqs[0].json();
    for r in &reqs {
        assert_eq!(r.json(), first, "a retry must resend the same push");
    }
    for (who, c) in [("A", &mut a), ("B", &mut b)] {
        expect_status(c, "degraded").await;
        expect_status(c, "online").await;
        let states: Vec<String> = c
            .seen
            .iter()
            .filter(|f| frame_type(f) == "status")
            .map(|f| f["payload"]["state"].as_str().unwrap_or("").to_owned())
            .collect();
        assert_eq!(
            states,
            ["online", "degraded", "online"],
            "{who}: status frames"
        );
    }
    tokio::time::sleep(QUIET).await;
    assert_eq!(ntfy.requests().len(), 4, "{}", dump_reqs(&ntfy.requests()));
}

#[tokio::test]
async fn unreachable_server_does_not_slow_live_delivery() {
    let ntfy = FakeHttp::start(|_| Reply::Hang);
    let env = Env::ntfy(&ntfy.url(), "");
    let gw = env.start(&[]);
    let (pa, _) = sender_and_away_phone(&env, &gw).await;
    let (mut a, _) = connect(&gw, &pa).await;

    // The worker is now stuck on a request the server never answers.
    send_turn(&mut a, None, None, "warm up").await;
    ntfy.wait_for(&gw, "the hanging push", PUSH_WAIT, |r| !r.is_empty())
        .await;

    let bound = Duration::from_secs(2);
    for i in 0..5 {
        let t = send_turn(&mut a, None, None, &format!("live message {i}")).await;
        assert!(
            t.receipt_after < bound && t.stop_after < bound,
            "message {i}: read.receipt after {:?}, message.stop after {:?} (bound {bound:?}) while the push server hangs",
            t.receipt_after,
            t.stop_after
        );
    }
}

#[tokio::test]
async fn no_push_for_revoked() {
    let ntfy = FakeHttp::ok();
    let env = Env::ntfy(&ntfy.url(), "");
    let gw = env.start(&[]);
    let (pa, pp) = sender_and_away_phone(&env, &gw).await;
    away_device(&env, &gw, "tablet", "tablet-1").await;
    common::revoke(env.data(), &pp.device_id);

    let (mut a, _) = connect(&gw, &pa).await;
    send_turn(&mut a, None, None, "anyone there").await;
    ntfy.wait_for(&gw, "the push to the tablet (control)", PUSH_WAIT, |r| {
        !to_topic(r, "tablet-1").is_empty()
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let reqs = ntfy.requests();
    assert!(
        to_topic(&reqs, "phone-1").is_empty(),
        "a revoked device was pushed:\n{}",
        dump_reqs(&reqs)
    );
}

/// A push already waiting (retrying) for a device when it is revoked must not be delivered.
#[tokio::test]
async fn revoked_device_loses_pushes_already_queued() {
    let up = Arc::new(AtomicBool::new(false));
    let ntfy = FakeHttp::switchable(&up, Reply::Json(503, json!({})));
    let env = Env::ntfy(&ntfy.url(), "");
    let gw = env.start(&[]);
    let (pa, pp) = sender_and_away_phone(&env, &gw).await;
    away_device(&env, &gw, "tablet", "tablet-1").await;

    let (mut a, _) = connect(&gw, &pa).await;
    send_turn(&mut a, None, None, "queued for the phone").await;
    ntfy.wait_for(&gw, "a failing push for the phone", PUSH_WAIT, |r| {
        !to_topic(r, "phone-1").is_empty()
    })
    .await;
    common::revoke(env.data(), &pp.device_id);
    tokio::time::sleep(Duration::from_millis(300)).await;
    up.store(true, Ordering::SeqCst);

    ntfy.wait_for(&gw, "the push to the tablet (control)", PUSH_WAIT, |r| {
        to_topic(r, "tablet-1").iter().any(HttpReq::delivered)
    })
    .await;
    tokio::time::sleep(RETRY_QUIET).await;
    let reqs = ntfy.requests();
    assert!(
        !to_topic(&reqs, "phone-1").iter().any(HttpReq::delivered),
        "a push queued before the revocation was delivered to the revoked device:\n{}",
        dump_reqs(&reqs)
    );
}

/// `--ntfy-token-file` (and `--ntfy-token`) → `Authorization: Bearer TOKEN`; the token never
/// appears in the gateway's output, even at debug level and on the failure path.
#[tokio::test]
async fn ntfy_token_is_sent_and_never_logged() {
    for by_file in [true, false] {
        let ntfy = {
            let calls = AtomicUsize::new(0);
            // The first answer is a 401 so the failure path logs too.
            FakeHttp::start(move |_| {
                if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    Reply::Json(401, json!({ "error": "unauthorized" }))
                } else {
                    Reply::Json(200, json!({}))
                }
            })
        };
        let env = Env::new();
        let secret = "tk_SecretPushToken_7f3a9c";
        let token_file = env.write("ntfy-token", &format!("{secret}\n"));
        let server = ntfy.url();
        let mut args = vec![
            "--push",
            "ntfy",
            "--ntfy-server",
            &server,
            "--log-level",
            "debug",
        ];
        if by_file {
            args.extend(["--ntfy-token-file", token_file.to_str().expect("UTF-8")]);
        } else {
            args.extend(["--ntfy-token", secret]);
        }
        let gw = env.start(&args);
        let (pa, _) = sender_and_away_phone(&env, &gw).await;
        let (mut a, _) = connect(&gw, &pa).await;
        send_turn(&mut a, None, None, "secret handshake").await;
        // Default backoff is 1 s: the retry after the 401 comes within a few seconds.
        let reqs = ntfy
            .wait_for(&gw, "the retried push", PUSH_WAIT, |r| {
                r.iter().any(HttpReq::delivered)
            })
            .await;
        assert_eq!(reqs.len(), 2, "{}", dump_reqs(&reqs));
        for r in &reqs {
            assert_eq!(
                r.header("authorization"),
                Some(format!("Bearer {secret}").as_str()),
                "by_file={by_file}: {r:?}"
            );
        }
        let (out, err) = (gw.stdout_tail(), gw.stderr_tail());
        assert!(
            err.lines().count() < 200,
            "the stderr tail is truncated; the check would be incomplete"
        );
        assert!(
            err.contains("push failed"),
            "the failed attempt should be logged:\n{err}"
        );
        assert!(
            !out.contains("SecretPushToken") && !err.contains("SecretPushToken"),
            "by_file={by_file}: the ntfy token appears in the gateway's output:\n{}",
            gw.output_tail()
        );
    }
}

#[tokio::test]
async fn ntfy_basic_auth_from_config() {
    let ntfy = FakeHttp::ok();
    let env = Env::ntfy(
        &ntfy.url(),
        "ntfy_user = \"iris\"\nntfy_password = \"pw-Hunter2-secret\"",
    );
    let gw = env.start(&["--log-level", "debug"]);
    let (pa, _) = sender_and_away_phone(&env, &gw).await;
    let (mut a, _) = connect(&gw, &pa).await;
    send_turn(&mut a, None, None, "basic").await;
    let reqs = ntfy
        .wait_for(&gw, "the push", PUSH_WAIT, |r| !r.is_empty())
        .await;
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("iris:pw-Hunter2-secret")
    );
    assert_eq!(reqs[0].header("authorization"), Some(want.as_str()));
    let out = gw.output_tail();
    assert!(
        !out.contains("pw-Hunter2-secret") && !out.contains(&want[6..]),
        "the ntfy password appears in the gateway's output:\n{out}"
    );
}

#[tokio::test]
async fn content_setting_shapes_the_push() {
    let text = "tell me a very long story about the garden, the tomatoes, the beans and the squash";
    let reply = demo_reply(text);
    assert!(
        reply.chars().count() > 140,
        "the reply must exceed 140 chars"
    );
    for (content, title, message) in [
        ("full", "General".to_owned(), cut(&reply, 140)),
        ("title", "General".to_owned(), "New message".to_owned()),
        ("none", "Iris".to_owned(), "New activity".to_owned()),
    ] {
        let ntfy = FakeHttp::ok();
        let env = Env::ntfy(&ntfy.url(), &format!("content = \"{content}\""));
        let gw = env.start(&[]);
        let (pa, _) = sender_and_away_phone(&env, &gw).await;
        let (mut a, _) = connect(&gw, &pa).await;
        let t = send_turn(&mut a, None, None, text).await;
        let reqs = ntfy
            .wait_for(&gw, "the push", PUSH_WAIT, |r| !r.is_empty())
            .await;
        let push = reqs[0].json();
        assert_eq!(
            push["title"].as_str(),
            Some(title.as_str()),
            "{content}: {push}"
        );
        assert_eq!(
            push["message"].as_str(),
            Some(message.as_str()),
            "{content}: {push}"
        );
        // Whatever the content, the ids are there for the app.
        assert_eq!(
            click_params(&push)["message_id"],
            t.reply_id,
            "{content}: {push}"
        );
        assert!(
            content == "full" || !push.to_string().contains("tomatoes"),
            "{content}: the push leaks the text: {push}"
        );
    }
}

#[tokio::test]
async fn thread_push_has_thread_title_and_click() {
    let ntfy = FakeHttp::ok();
    let env = Env::ntfy(&ntfy.url(), "");
    let gw = env.start(&[]);
    let (pa, _) = sender_and_away_phone(&env, &gw).await;
    let (mut a, ack) = connect(&gw, &pa).await;
    let start = common::sync_cursor(&ack);

    let id = a
        .request(
            "channel.create",
            None,
            None,
            json!({ "name": "Garden", "kind": "channel" }),
        )
        .await;
    let chan = a.recv_reply(id).await["payload"]["chat_id"]
        .as_str()
        .expect("chat_id")
        .to_owned();
    let id = a
        .request(
            "channel.create",
            None,
            None,
            json!({ "name": "Tomatoes", "kind": "thread", "parent_chat_id": chan }),
        )
        .await;
    let thread = a.recv_reply(id).await["payload"]["chat_id"]
        .as_str()
        .expect("thread id")
        .to_owned();

    let t = send_turn(&mut a, Some(&chan), Some(&thread), "stake them").await;
    let reqs = ntfy
        .wait_for(&gw, "the thread push", PUSH_WAIT, |r| !r.is_empty())
        .await;
    let push = reqs[0].json();
    assert_eq!(push["title"], "Garden \u{203a} Tomatoes", "{push}");
    let (frames, _) = replay(&mut a, start).await;
    let want: BTreeMap<String, String> = [
        ("chat_id", chan.clone()),
        ("thread_id", thread.clone()),
        ("message_id", t.reply_id.clone()),
        ("cursor", cursor_of(&frames, &t.reply_id).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(click_params(&push), want, "{push}");
    assert!(
        push["click"]
            .as_str()
            .unwrap_or("")
            .starts_with(&format!("iris://chat?chat_id={chan}&thread_id={thread}&")),
        "{push}"
    );
}

/// Pushes waiting behind a busy worker for the same device and chat become one.
#[tokio::test]
async fn queued_pushes_collapse_into_one() {
    let up = Arc::new(AtomicBool::new(false));
    let ntfy = FakeHttp::switchable(&up, Reply::Json(503, json!({})));
    let env = Env::ntfy(&ntfy.url(), "");
    let gw = env.start(&[]);
    let (pa, _) = sender_and_away_phone(&env, &gw).await;
    let (mut a, ack) = connect(&gw, &pa).await;
    let start = common::sync_cursor(&ack);

    let t1 = send_turn(&mut a, None, None, "one").await;
    ntfy.wait_for(&gw, "the first (failing) push", PUSH_WAIT, |r| {
        !r.is_empty()
    })
    .await;
    let t2 = send_turn(&mut a, None, None, "two").await;
    let t3 = send_turn(&mut a, None, None, "three").await;
    up.store(true, Ordering::SeqCst);
    let (frames, _) = replay(&mut a, start).await;
    let c3 = cursor_of(&frames, &t3.reply_id);
    ntfy.wait_for(&gw, "the collapsed push", PUSH_WAIT, |r| {
        r.iter()
            .any(|q| q.delivered() && click_cursor(&q.json()) == c3)
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let delivered: Vec<Value> = ntfy
        .requests()
        .iter()
        .filter(|r| r.delivered())
        .map(HttpReq::json)
        .collect();
    assert_eq!(delivered.len(), 2, "{delivered:#?}");
    assert_eq!(click_params(&delivered[0])["message_id"], t1.reply_id);
    assert_eq!(
        delivered[0]["message"].as_str(),
        Some(cut(&t1.final_text, 60).as_str())
    );
    assert_eq!(
        delivered[1]["message"], "2 new messages",
        "{}",
        delivered[1]
    );
    assert_eq!(click_params(&delivered[1])["message_id"], t3.reply_id);
    assert_eq!(click_cursor(&delivered[1]), c3);
    assert_ne!(click_params(&delivered[1])["message_id"], t2.reply_id);
}

/// A device that comes back gets nothing of what was still waiting for it.
#[tokio::test]
async fn pending_push_dropped_when_device_reconnects() {
    let up = Arc::new(AtomicBool::new(false));
    let ntfy = FakeHttp::switchable(&up, Reply::Json(503, json!({})));
    let env = Env::ntfy(&ntfy.url(), "");
    let gw = env.start(&[]);
    let (pa, pp) = sender_and_away_phone(&env, &gw).await;
    let (mut a, _) = connect(&gw, &pa).await;
    send_turn(&mut a, None, None, "while you were out").await;
    ntfy.wait_for(&gw, "a failing push", PUSH_WAIT, |r| !r.is_empty())
        .await;
    let (_p, _) = connect_with(&gw, &pp, json!({ "ntfy_topic": "phone-1" })).await;
    // An attempt already on the wire when the phone came back is still answered 503.
    tokio::time::sleep(Duration::from_millis(200)).await;
    up.store(true, Ordering::SeqCst);
    tokio::time::sleep(RETRY_QUIET).await;
    let reqs = ntfy.requests();
    assert!(
        !reqs.iter().any(HttpReq::delivered),
        "a push was delivered after the device came back:\n{}",
        dump_reqs(&reqs)
    );
}

/// Two away devices, a push owed to both when the gateway crashes: after the restart each gets
/// exactly one push for the one answer.
#[tokio::test]
async fn restart_catch_up_pushes_each_device_once() {
    let up = Arc::new(AtomicBool::new(false));
    let ntfy = FakeHttp::switchable(&up, Reply::Drop);
    let env = Env::ntfy(&ntfy.url(), "");
    let mut gw = env.start(&[]);
    let (pa, _) = sender_and_away_phone(&env, &gw).await;
    away_device(&env, &gw, "tablet", "tablet-1").await;
    let (mut a, _) = connect(&gw, &pa).await;
    let t = send_turn(&mut a, None, None, "for both of you").await;
    expect_status(&mut a, "degraded").await;
    gw.kill9();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let failed = ntfy.requests().len();
    up.store(true, Ordering::SeqCst);

    let gw = env.start(&[]);
    ntfy.wait_for(&gw, "one push to each device", PUSH_WAIT, |r| {
        let since = &r[failed..];
        !to_topic(since, "phone-1").is_empty() && !to_topic(since, "tablet-1").is_empty()
    })
    .await;
    tokio::time::sleep(QUIET).await;
    let since = ntfy.requests()[failed..].to_vec();
    for topic in ["phone-1", "tablet-1"] {
        let pushes = to_topic(&since, topic);
        assert_eq!(
            pushes.len(),
            1,
            "{topic}: the owed push must arrive exactly once:\n{}",
            dump_reqs(&since)
        );
        let push = pushes[0].json();
        assert_eq!(click_params(&push)["message_id"], t.reply_id, "{push}");
        assert_eq!(
            push["message"].as_str(),
            Some(cut(&t.final_text, 60).as_str()),
            "{topic}: one answer is not several messages: {push}"
        );
    }
}

/// The "restarted before answering" notice is a non-user message: pushed to away devices.
#[tokio::test]
async fn interrupted_turn_notice_is_pushed() {
    let ntfy = FakeHttp::ok();
    let env = Env::ntfy(&ntfy.url(), "");
    let mut gw = env.start(&["--demo-pace-ms", "3000"]);
    let (pa, _) = sender_and_away_phone(&env, &gw).await;
    let (mut a, ack) = connect(&gw, &pa).await;
    let start = common::sync_cursor(&ack);
    let rid = a.send_text(None, None, "slow one").await;
    let receipt = a.recv_reply(rid).await;
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    gw.kill9();
    assert!(
        ntfy.requests().is_empty(),
        "{}",
        dump_reqs(&ntfy.requests())
    );

    let gw = env.start(&[]);
    let reqs = ntfy
        .wait_for(&gw, "the notice push", PUSH_WAIT, |r| !r.is_empty())
        .await;
    tokio::time::sleep(QUIET).await;
    let all = ntfy.requests();
    assert_eq!(all.len(), 1, "{}", dump_reqs(&all));
    let push = reqs[0].json();
    let (mut a, _) = connect(&gw, &pa).await;
    let (frames, _) = replay(&mut a, start).await;
    let notice = frames
        .iter()
        .find(|f| frame_type(f) == "message" && f["payload"]["role"] != "user")
        .unwrap_or_else(|| panic!("no notice replayed: {frames:#?}"));
    let notice_id = notice["payload"]["message_id"].as_str().expect("id");
    assert_eq!(click_params(&push)["message_id"], notice_id, "{push}");
    assert_eq!(click_cursor(&push), cursor_of(&frames, notice_id), "{push}");
    assert_eq!(
        push["message"].as_str(),
        Some(cut(notice["payload"]["text"].as_str().expect("text"), 60).as_str()),
        "{push}"
    );
}

#[tokio::test]
async fn fcm_register_then_fcm_push() {
    let fcm = fake_fcm();
    let mut env = Env::new();
    let key_path = fcm_key_file(&env, fcm.port);
    env.write_config(&format!(
        "[push]\nbackend = \"fcm\"\nfcm_credentials = '{}'\nfcm_endpoint = \"{}\"\nbackoff_ms = 100\nmax_backoff_secs = 1\n",
        key_path.display(),
        fcm.url()
    ));
    let mut gw = env.start(&[]);
    let pa = pair(env.data(), "device-a");
    let pp = pair(env.data(), "phone");

    // Registered after hello, not in it; fcm.register has no reply frame.
    let (mut p, ack) = connect(&gw, &pp).await;
    assert_eq!(ack["payload"]["server_caps"]["push"], "fcm", "{ack}");
    let reg = p
        .request("fcm.register", None, None, json!({ "fcm_token": "tok-1" }))
        .await;
    let ping = p.request("ping", None, None, json!({ "ts": 7 })).await;
    p.recv_reply(ping).await;
    assert!(
        !p.seen
            .iter()
            .any(|f| f["id"].as_i64() == Some(reg) || frame_type(f) == "error"),
        "fcm.register must be silent: {}",
        p.recent()
    );
    p.close().await;

    let (mut a, ack) = connect(&gw, &pa).await;
    let start = common::sync_cursor(&ack);
    let t1 = send_turn(&mut a, None, None, "first fcm").await;
    fcm.wait_for(&gw, "the first FCM send", PUSH_WAIT, |r| {
        r.iter().filter(|q| is_send(q)).count() >= 1
    })
    .await;
    let t2 = send_turn(&mut a, None, None, "second fcm").await;
    let reqs = fcm
        .wait_for(&gw, "the second FCM send", PUSH_WAIT, |r| {
            r.iter().filter(|q| is_send(q)).count() >= 2
        })
        .await;
    let (frames, _) = replay(&mut a, start).await;

    let tokens: Vec<&HttpReq> = reqs.iter().filter(|r| r.path == "/token").collect();
    assert_eq!(
        tokens.len(),
        1,
        "the access token must be cached across sends:\n{}",
        dump_reqs(&reqs)
    );
    let token_req = tokens[0];
    assert_eq!(token_req.method, "POST");
    assert!(
        token_req
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/x-www-form-urlencoded")),
        "{token_req:?}"
    );
    let form = token_req.form();
    assert_eq!(
        form.get("grant_type").map(String::as_str),
        Some("urn:ietf:params:oauth:grant-type:jwt-bearer"),
        "{form:?}"
    );
    let jwt = form.get("assertion").expect("assertion");
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3, "JWT must have three parts: {jwt}");
    let header: Value = serde_json::from_slice(&b64url(parts[0])).expect("JWT header JSON");
    assert_eq!(header["alg"], "RS256", "{header}");
    let claims: Value = serde_json::from_slice(&b64url(parts[1])).expect("JWT claims JSON");
    let key: Value =
        serde_json::from_str(&std::fs::read_to_string(&key_path).expect("key")).expect("key JSON");
    assert_eq!(claims["iss"], key["client_email"], "{claims}");
    assert_eq!(claims["aud"], key["token_uri"], "{claims}");
    assert_eq!(
        claims["scope"], "https://www.googleapis.com/auth/firebase.messaging",
        "{claims}"
    );
    // The signature verifies with the service account's public key.
    let pem = key["private_key"].as_str().expect("private_key");
    let der = base64::engine::general_purpose::STANDARD
        .decode(
            pem.lines()
                .filter(|l| !l.starts_with("-----"))
                .collect::<String>(),
        )
        .expect("PEM body");
    let pair_key = ring::signature::RsaKeyPair::from_pkcs8(&der).expect("PKCS#8 RSA key");
    use ring::signature::KeyPair;
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        pair_key.public_key().as_ref(),
    )
    .verify(
        format!("{}.{}", parts[0], parts[1]).as_bytes(),
        &b64url(parts[2]),
    )
    .expect("JWT signature must verify with the key's public half");

    let sends: Vec<&HttpReq> = reqs.iter().filter(|r| is_send(r)).collect();
    assert_eq!(sends.len(), 2, "{}", dump_reqs(&reqs));
    for (send, t) in sends.iter().zip([&t1, &t2]) {
        assert_eq!(send.method, "POST");
        assert_eq!(send.path, "/v1/projects/iris-test/messages:send");
        assert_eq!(
            send.header("authorization"),
            Some(format!("Bearer {ACCESS_TOKEN}").as_str()),
            "{send:?}"
        );
        let body = send.json();
        let want = json!({
            "message": {
                "token": "tok-1",
                "notification": { "title": "General", "body": cut(&t.final_text, 60) },
                "data": {
                    "chat_id": "default",
                    "thread_id": "",
                    "message_id": t.reply_id,
                    "cursor": cursor_of(&frames, &t.reply_id).to_string(),
                },
            }
        });
        assert_eq!(body, want);
    }
    assert_eq!(
        reqs.len(),
        3,
        "one token request and two sends:\n{}",
        dump_reqs(&reqs)
    );

    // The registration is stored with the device: it survives a restart.
    a.close().await;
    let status = gw.sigterm();
    assert!(status.success(), "{status:?}");
    let gw = env.start(&[]);
    let (mut a, _) = connect(&gw, &pa).await;
    let before = fcm.requests().len();
    let t3 = send_turn(&mut a, None, None, "after restart").await;
    let reqs = fcm
        .wait_for(&gw, "a send after the restart", PUSH_WAIT, |r| {
            r[before..].iter().any(is_send)
        })
        .await;
    let send = reqs[before..]
        .iter()
        .find(|q| is_send(q))
        .expect("send")
        .json();
    assert_eq!(send["message"]["token"], "tok-1", "{send}");
    assert_eq!(send["message"]["data"]["message_id"], t3.reply_id, "{send}");
}

/// What `hello.ack` says of push for a gateway started in `env` with `args`.
async fn push_caps(env: &Env, args: &[&str]) -> Value {
    let gw = env.start(args);
    let p = pair(env.data(), "device-a");
    let (_c, ack) = connect(&gw, &p).await;
    ack["payload"]["server_caps"].clone()
}

#[tokio::test]
async fn caps_report_the_backend() {
    let ntfy = FakeHttp::ok();
    // ntfy by flags, and by config file; the trailing slash is trimmed.
    let server = format!("{}/", ntfy.url());
    let by_flags = push_caps(&Env::new(), &["--push", "ntfy", "--ntfy-server", &server]).await;
    let by_file = push_caps(&Env::ntfy(&server, ""), &[]).await;
    for (how, caps) in [("flags", by_flags), ("config file", by_file)] {
        assert_eq!(caps["push"], "ntfy", "{how}: {caps}");
        assert_eq!(
            caps["push_ntfy_server"].as_str(),
            Some(ntfy.url().as_str()),
            "{how}: {caps}"
        );
    }
    // none: the default, and explicitly.
    for args in [&[][..], &["--push", "none"][..]] {
        let caps = push_caps(&Env::new(), args).await;
        assert_eq!(caps["push"], "none", "{args:?}: {caps}");
        assert_eq!(caps["push_ntfy_server"], "", "{args:?}: {caps}");
    }
    // fcm: no ntfy server to report.
    let env = Env::new();
    let key = fcm_key_file(&env, 9);
    let caps = push_caps(
        &env,
        &[
            "--push",
            "fcm",
            "--fcm-credentials",
            key.to_str().expect("UTF-8"),
        ],
    )
    .await;
    assert_eq!(caps["push"], "fcm", "{caps}");
    assert_eq!(caps["push_ntfy_server"], "", "{caps}");
}
