//! Automation: webhooks (`POST /hooks/<name>`) and cron jobs post into automation channels, and
//! the HTTP front that shares the WebSocket port. The real binary, a real WebSocket client (every
//! server frame schema-checked) and a raw HTTP/1.1 client on loopback; every wait is bounded.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "door-token-0123456789";
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Writes `config.toml` into the data dir and returns its path, for `--config`.
fn write_config(dir: &Path, toml: &str) -> String {
    let path = dir.join("config.toml");
    std::fs::write(&path, toml).expect("write config");
    path.to_str().expect("utf-8 path").to_owned()
}

fn hook_config(extra: &str) -> String {
    format!("{extra}\n[[webhook]]\nname = \"door\"\nchannel = \"Alerts\"\ntoken = \"{TOKEN}\"\n")
}

#[derive(Debug)]
struct HttpReply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl HttpReply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("reply body is not JSON ({e}): {self:?}"))
    }
}

/// Sends raw bytes and reads the reply until the server closes the connection. Write errors
/// are ignored: a server refusing a body may close before all of it is sent.
async fn http_raw(addr: SocketAddr, request: &[u8]) -> HttpReply {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let _ = s.write_all(request).await;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf
    };
    let raw = tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .expect("HTTP reply within 10 s");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete HTTP reply: {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    HttpReply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A `POST` with a Content-Length body and optional bearer token and content type.
fn post_request(
    path: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(ct) = content_type {
        head.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

async fn post(
    gw: &Gateway,
    path: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> HttpReply {
    http_raw(gw.addr, &post_request(path, token, content_type, body)).await
}

/// The good-token plain-text post that must succeed; returns the message id.
async fn post_ok(gw: &Gateway, text: &str) -> String {
    let reply = post(
        gw,
        "/hooks/door",
        Some(TOKEN),
        Some("text/plain"),
        text.as_bytes(),
    )
    .await;
    assert_eq!(reply.status, 202, "{reply:?}\n{}", gw.output_tail());
    reply.json()["message_id"]
        .as_str()
        .unwrap_or_else(|| panic!("202 without message_id: {reply:?}"))
        .to_owned()
}

/// The root channel named `name` in `channel.list`.
async fn channel_named(c: &mut Client, name: &str) -> Value {
    channel_list(c)
        .await
        .into_iter()
        .find(|ch| ch["name"] == json!(name) && ch.get("parent_chat_id").is_none_or(Value::is_null))
        .unwrap_or_else(|| panic!("no channel `{name}` in channel.list\n{}", c.recent()))
}

async fn history_of(c: &mut Client, chat_id: &str) -> Vec<Value> {
    let id = c
        .request("history", Some(chat_id), None, json!({ "limit": 200 }))
        .await;
    let page = c.recv_reply(id).await;
    assert_eq!(frame_type(&page), "history", "{page}");
    page["payload"]["messages"]
        .as_array()
        .expect("messages")
        .clone()
}

/// The stored role of each message matching `query` in `chat_id`, by message id. `history`
/// pages in v1 know only `user` and `assistant` (automation posts page in as `assistant`);
/// search hits carry the stored role.
async fn searched_roles(c: &mut Client, chat_id: &str, query: &str) -> Vec<(String, String)> {
    let id = c
        .request(
            "search",
            None,
            None,
            json!({ "query": query, "scope": "chat", "chat_id": chat_id, "limit": 100 }),
        )
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "search.results", "{r}");
    r["payload"]["hits"]
        .as_array()
        .expect("hits")
        .iter()
        .map(|h| {
            (
                h["message_id"].as_str().unwrap_or("").to_owned(),
                h["role"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn is_message(f: &Value, message_id: &str) -> bool {
    frame_type(f) == "message" && pstr(f, "message_id") == message_id
}

fn is_cron_notification(f: &Value) -> bool {
    frame_type(f) == "notification" && pstr(f, "kind") == "cron"
}

// ---------------------------------------------------------------------------------------------
// Webhooks
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn webhook_posts_a_cron_message_and_notification_that_survive_a_restart() {
    let dir = temp_data_dir();
    let config = write_config(dir.path(), &hook_config(""));
    let mut gw = Gateway::start(dir.path(), &["--config", &config]);
    let p = pair(dir.path(), "watcher");
    let (mut c, _) = connect(&gw, &p).await;

    let alerts = channel_named(&mut c, "Alerts").await;
    assert_eq!(alerts["automation"], json!(true), "{alerts}");
    let chat = alerts["chat_id"].as_str().expect("chat_id").to_owned();

    let text = "Someone is at the front door";
    let message_id = post_ok(&gw, text).await;

    let m = c.recv_until(|f| is_message(f, &message_id)).await;
    assert_eq!(m["chat_id"], json!(chat), "{m}");
    assert_eq!(pstr(&m, "role"), "cron", "{m}");
    assert_eq!(pstr(&m, "text"), text, "{m}");
    let n = c.recv_until(is_cron_notification).await;
    assert_eq!(pstr(&n, "title"), "Alerts", "{n}");
    assert_eq!(pstr(&n, "body"), text, "{n}");
    assert_eq!(n["chat_id"], json!(chat), "{n}");

    // JSON with a title: the title names the notification.
    let reply = post(
        &gw,
        "/hooks/door",
        Some(TOKEN),
        Some("application/json"),
        json!({ "text": "Parcel delivered", "title": "Doorbell" })
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(reply.status, 202, "{reply:?}");
    let second = reply.json()["message_id"].as_str().expect("id").to_owned();
    let m2 = c.recv_until(|f| is_message(f, &second)).await;
    assert_eq!(pstr(&m2, "text"), "Parcel delivered", "{m2}");
    let n2 = c.recv_until(is_cron_notification).await;
    assert_eq!(pstr(&n2, "title"), "Doorbell", "{n2}");
    assert_eq!(pstr(&n2, "body"), "Parcel delivered", "{n2}");

    let history = history_of(&mut c, &chat).await;
    let ids: Vec<&str> = history
        .iter()
        .map(|m| m["message_id"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(ids, [message_id.as_str(), second.as_str()], "{history:?}");
    assert_eq!(
        searched_roles(&mut c, &chat, "parcel").await,
        [(second.clone(), "cron".to_owned())]
    );

    // The channel only receives gateway output.
    let id = c.send_text(Some(&chat), None, "can I write here?").await;
    let err = c.recv_reply(id).await;
    assert_eq!(frame_type(&err), "error", "{err}");
    assert_eq!(pstr(&err, "code"), "unsupported", "{err}");
    c.close().await;

    // After a restart: still in history, and a sync from 0 replays both frames.
    gw.stop_ok();
    let gw = Gateway::start(dir.path(), &["--config", &config]);
    let (mut c, _) = connect(&gw, &p).await;
    let again = channel_named(&mut c, "Alerts").await;
    assert_eq!(
        again["chat_id"],
        json!(chat),
        "the channel is not created twice"
    );
    let history = history_of(&mut c, &chat).await;
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!(history[0]["message_id"], json!(message_id));

    let id = c.request("sync", None, None, json!({ "cursor": 0 })).await;
    let mut replay = Vec::new();
    loop {
        let f = c.recv().await;
        if frame_type(&f) == "sync.done" && id_of(&f) == Some(id) {
            break;
        }
        replay.push(f);
    }
    let pos = |pred: &dyn Fn(&Value) -> bool| {
        replay
            .iter()
            .position(pred)
            .unwrap_or_else(|| panic!("not replayed:\n{}", dump(&replay)))
    };
    let at_message = pos(&|f| is_message(f, &message_id));
    let at_note = pos(&|f| is_cron_notification(f) && pstr(f, "body") == text);
    assert!(at_message < at_note, "{}", dump(&replay));
    assert!(cursor_of(&replay[at_message]).is_some() && cursor_of(&replay[at_note]).is_some());
    assert_eq!(pstr(&replay[at_message], "role"), "cron");
}

#[tokio::test]
async fn refused_webhooks_post_nothing() {
    let dir = temp_data_dir();
    let config = write_config(dir.path(), &hook_config(""));
    let gw = Gateway::start(dir.path(), &["--config", &config]);
    let p = pair(dir.path(), "watcher");
    let (mut c, _) = connect(&gw, &p).await;
    let chat = channel_named(&mut c, "Alerts").await["chat_id"]
        .as_str()
        .expect("chat_id")
        .to_owned();

    let text = Some("text/plain");
    let r = post(
        &gw,
        "/hooks/door",
        Some("wrong-token-0123456789"),
        text,
        b"hi",
    )
    .await;
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(r.header("WWW-Authenticate"), Some("Bearer"), "{r:?}");
    let r = post(&gw, "/hooks/door", None, text, b"hi").await;
    assert_eq!(r.status, 401, "{r:?}");
    let r = http_raw(
        gw.addr,
        b"POST /hooks/door HTTP/1.1\r\nHost: g\r\nAuthorization: Basic Zm9vOmJhcg==\r\nContent-Length: 2\r\n\r\nhi",
    )
    .await;
    assert_eq!(r.status, 401, "{r:?}");
    let r = post(&gw, "/hooks/nope", Some(TOKEN), text, b"hi").await;
    assert_eq!(r.status, 404, "{r:?}");

    // Content-Length over limits.max_webhook_bytes (64 KiB): refused before any body is sent.
    let r = http_raw(
        gw.addr,
        format!(
            "POST /hooks/door HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 70000\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(r.status, 413, "{r:?}");
    // A chunked body that turns out too long.
    let mut chunked = format!(
        "POST /hooks/door HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..9 {
        chunked.extend_from_slice(format!("{:x}\r\n", 8192).as_bytes());
        chunked.extend_from_slice(&[b'a'; 8192]);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let r = http_raw(gw.addr, &chunked).await;
    assert_eq!(r.status, 413, "{r:?}");

    // Bodies that are not usable text.
    let r = post(&gw, "/hooks/door", Some(TOKEN), text, b"   \n").await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = post(&gw, "/hooks/door", Some(TOKEN), text, &[0xff, 0xfe, 0x00]).await;
    assert_eq!(r.status, 400, "{r:?}");
    let json_ct = Some("application/json");
    let r = post(
        &gw,
        "/hooks/door",
        Some(TOKEN),
        json_ct,
        b"{\"title\":\"x\"}",
    )
    .await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = post(&gw, "/hooks/door", Some(TOKEN), json_ct, b"not json").await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.json()["error"].is_string(), "{r:?}");

    // Nothing reached the device or the channel's history.
    let frames = c.collect_quiet(Duration::from_millis(300)).await;
    assert!(
        !frames
            .iter()
            .any(|f| matches!(frame_type(f), "message" | "notification")),
        "{}",
        dump(&frames)
    );
    assert!(history_of(&mut c, &chat).await.is_empty());

    // A chunked body within the limit is fine.
    let body = b"chunked but small";
    let mut ok = format!(
        "POST /hooks/door HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        body.len()
    )
    .into_bytes();
    ok.extend_from_slice(body);
    ok.extend_from_slice(b"\r\n0\r\n\r\n");
    let r = http_raw(gw.addr, &ok).await;
    assert_eq!(r.status, 202, "{r:?}");
    let history = history_of(&mut c, &chat).await;
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0]["text"], json!("chunked but small"));
}

#[tokio::test]
async fn webhooks_over_the_rate_get_429_with_retry_after() {
    let dir = temp_data_dir();
    let config = write_config(
        dir.path(),
        &hook_config("[limits]\nwebhooks_per_minute = 2\n"),
    );
    let gw = Gateway::start(dir.path(), &["--config", &config]);
    post_ok(&gw, "one").await;
    post_ok(&gw, "two").await;
    let r = post(&gw, "/hooks/door", Some(TOKEN), None, b"three").await;
    assert_eq!(r.status, 429, "{r:?}");
    let retry: u64 = r
        .header("Retry-After")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("429 without a numeric Retry-After: {r:?}"));
    assert!((1..=60).contains(&retry), "{r:?}");
    // Refused requests do not count: a wrong token is still told 401, not 429.
    let r = post(
        &gw,
        "/hooks/door",
        Some("wrong-token-0123456789"),
        None,
        b"x",
    )
    .await;
    assert_eq!(r.status, 401, "{r:?}");
}

#[tokio::test]
async fn token_file_is_read_and_an_existing_channel_becomes_automation() {
    let dir = temp_data_dir();
    let gw_first = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "owner");
    let (mut c, _) = connect(&gw_first, &p).await;
    let ops = create_channel(&mut c, "Ops").await;
    c.close().await;
    let mut gw_first = gw_first;
    gw_first.stop_ok();

    let token_file = dir.path().join("ops-token");
    std::fs::write(
        &token_file,
        "ops-secret-token-from-file\nignored second line\n",
    )
    .expect("write token");
    let config = write_config(
        dir.path(),
        &format!(
            "[[webhook]]\nname = \"ops\"\nchannel = \"Ops\"\ntoken_file = \"{}\"\n",
            token_file.display()
        ),
    );
    let gw = Gateway::start(dir.path(), &["--config", &config]);
    let (mut c, _) = connect(&gw, &p).await;
    let entry = channel_named(&mut c, "Ops").await;
    assert_eq!(entry["chat_id"], json!(ops), "{entry}");
    assert_eq!(entry["automation"], json!(true), "{entry}");

    let r = post(
        &gw,
        "/hooks/ops",
        Some("ops-secret-token-from-file"),
        None,
        b"deployed",
    )
    .await;
    assert_eq!(r.status, 202, "{r:?}");
    let history = history_of(&mut c, &ops).await;
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0]["text"], json!("deployed"));
    let roles = searched_roles(&mut c, &ops, "deployed").await;
    assert_eq!(roles.len(), 1, "{roles:?}");
    assert_eq!(roles[0].1, "cron");
}

/// Starts the gateway on `dir` with a `[[webhook]] door` posting into `channel`, expecting it to
/// refuse to start; returns its stderr, which must name the entry and `why`, and no token.
fn start_refused_for(dir: &Path, channel: &str, why: &str) -> String {
    let config = write_config(
        dir,
        &format!("[[webhook]]\nname = \"door\"\nchannel = \"{channel}\"\ntoken = \"{TOKEN}\"\n"),
    );
    let data = dir.to_str().expect("utf-8");
    let out = cli(&[
        "run",
        "--data-dir",
        data,
        "--config",
        &config,
        "--listen",
        "127.0.0.1:0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started anyway:\n{stderr}");
    assert!(
        stderr.contains("[[webhook]] `door`") && stderr.contains(why),
        "the error must name the entry and why:\n{stderr}"
    );
    assert!(
        !stderr.contains(TOKEN),
        "the token leaked into the log:\n{stderr}"
    );
    stderr
}

#[test]
fn the_default_channel_cannot_receive_automation() {
    let dir = temp_data_dir();
    start_refused_for(dir.path(), "General", "default channel");
}

/// A config entry that names an existing channel with threads is refused at start like a
/// `channel.set_automation` on it: an automation channel has none.
#[tokio::test]
async fn a_channel_with_threads_cannot_become_an_automation_channel() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = common::connect(&gw, &p).await;
    let ops = common::create_channel(&mut c, "Ops").await;
    common::create_thread(&mut c, &ops, "Incident").await;
    c.close().await;
    gw.stop_ok();
    start_refused_for(dir.path(), "Ops", "has threads");
}

// ---------------------------------------------------------------------------------------------
// Cron
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn cron_job_asks_the_agent_and_posts_the_answer_into_its_channel() {
    let dir = temp_data_dir();
    let config = write_config(
        dir.path(),
        "[[cron]]\nchannel = \"Reports\"\nschedule = \"* * * * * *\"\nprompt = \"status report\"\n",
    );
    let gw = Gateway::start(dir.path(), &["--config", &config]);
    let p = pair(dir.path(), "reader");
    let (mut c, _) = connect(&gw, &p).await;
    let reports = channel_named(&mut c, "Reports").await;
    assert_eq!(reports["automation"], json!(true), "{reports}");
    let chat = reports["chat_id"].as_str().expect("chat_id").to_owned();
    let in_chat = |f: &Value| f["chat_id"] == json!(chat);

    let start = c
        .recv_until(|f| frame_type(f) == "message.start" && in_chat(f))
        .await;
    let id = pstr(&start, "message_id").to_owned();
    c.recv_until(|f| frame_type(f) == "message.update" && pstr(f, "message_id") == id)
        .await;
    let stop = c
        .recv_until(|f| frame_type(f) == "message.stop" && pstr(f, "message_id") == id)
        .await;
    assert_eq!(stop["chat_id"], json!(chat), "{stop}");
    assert!(
        pstr(&stop, "final_text").contains("status report"),
        "the demo agent echoes the prompt: {stop}"
    );
    let note = c
        .recv_until(|f| is_cron_notification(f) && in_chat(f))
        .await;
    assert!(!pstr(&note, "title").is_empty(), "{note}");

    let history = history_of(&mut c, &chat).await;
    assert!(
        history.iter().any(|m| m["message_id"] == json!(id)),
        "the answer is not in history: {history:?}"
    );
    // Stored with role `cron` (search hits carry the stored role; v1 history says assistant).
    let roles = searched_roles(&mut c, &chat, "demo").await;
    let role = roles
        .iter()
        .find(|(m, _)| *m == id)
        .map(|(_, r)| r.as_str())
        .unwrap_or_else(|| panic!("the answer is not found by search: {roles:?}"));
    assert_eq!(role, "cron", "{roles:?}");
}

// ---------------------------------------------------------------------------------------------
// The HTTP front
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn plain_http_gets_short_answers_and_websockets_still_work() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);

    let r = http_raw(gw.addr, b"GET / HTTP/1.1\r\nHost: g\r\n\r\n").await;
    assert_eq!(r.status, 426, "{r:?}");
    assert!(r.body.contains("WebSocket"), "{r:?}");
    assert_eq!(r.header("Upgrade"), Some("websocket"), "{r:?}");

    let r = http_raw(
        gw.addr,
        b"POST /nope HTTP/1.1\r\nHost: g\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 404, "{r:?}");
    let r = http_raw(gw.addr, b"GET /hooks/door HTTP/1.1\r\nHost: g\r\n\r\n").await;
    assert_eq!(r.status, 405, "{r:?}");
    // No hooks configured: any hook name is unknown.
    let r = post(&gw, "/hooks/door", Some(TOKEN), None, b"hi").await;
    assert_eq!(r.status, 404, "{r:?}");

    // A broken upgrade request.
    let r = http_raw(
        gw.addr,
        b"GET / HTTP/1.1\r\nHost: g\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.body.contains("Sec-WebSocket-Key"), "{r:?}");

    // A request head over the bound is refused, not buffered.
    let big = format!(
        "GET / HTTP/1.1\r\nHost: g\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(32 << 10)
    );
    let r = http_raw(gw.addr, big.as_bytes()).await;
    assert_eq!(r.status, 431, "{r:?}");

    // The WebSocket on the same port still pairs and talks.
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect(&gw, &p).await;
    let id = c.request("ping", None, None, json!({ "ts": 7 })).await;
    let pong = c.recv_reply(id).await;
    assert_eq!(frame_type(&pong), "pong", "{pong}");
}
