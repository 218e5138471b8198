//! End-to-end benchmarks of the real binary on loopback, each beside a baseline measured in the
//! same run (these machines are noisy; ratios travel, seconds do not):
//!
//! - turn fan-out to 1, 10 and 50 devices, with a scripted agent that streams as fast as it can
//!   (an OpenAI-compatible SSE server in this process stamping every chunk with its send time):
//!   frames per second delivered and p50/p99 latency from the agent emitting a chunk to a device
//!   receiving the update that carries it; baseline: a bare tokio-tungstenite broadcast of the
//!   same frames to the same number of clients (the stack's limit);
//! - a stalled device among 10: the gateway's peak RSS beside the same run without it, and how
//!   many `message.update` frames were coalesced for it;
//! - `sync` replay of 10,000 frames, against the bare stack sending the same frames;
//! - the store at scale (`--scale N` history messages, CI-sized by default, 1,000,000 by flag)
//!   against 1,000 messages with an equally full outbox: idle RSS after a clean stop and after a
//!   SIGKILL, process start to `hello.ack`, `history` and `search` over the socket, data dir
//!   bytes per message;
//! - queries beside other devices: another device's ping while one device sends the costliest
//!   searches every 50 ms over 20,000 messages, against an idle ping;
//! - a start after a burst: process start to `hello.ack` after a SIGKILL that follows
//!   `IRIS_BENCH_BURST` history messages written through the protocol as fast as it takes them
//!   (CI-sized by default), against the same after a burst of 1,000, and in a debug build
//!   against the same burst with the journal applied at each sync, as before batching
//!   (`IRIS_GATEWAY_APPLY_EVERY=turn`);
//! - writes per demo turn: 4 KiB blocks dirtied between syncs and sync calls (under strace),
//!   against a plain file with the same frames and fdatasyncs; and over a long run on a new
//!   store (`IRIS_BENCH_TURNS`, CI-sized by default), sled's reopens included, against the
//!   same run with each turn applied to the history database on its own, as before batching
//!   (side by side; a debug build selects it: `IRIS_GATEWAY_APPLY_EVERY=turn`);
//! - idle RSS, and RSS per connected idle device at 100 and 500 devices; VmRSS on an empty
//!   store and 10 s after the owner's work on the admin page (claim, sign-ins, passphrase
//!   change, strength checks, a backup, a restore tried, an update check), against the previous
//!   build when `IRIS_BENCH_PREVIOUS` names one (`benches/regenerate --previous REF`);
//! - against the previous build (`IRIS_BENCH_PREVIOUS`, `benches/regenerate --previous REF`):
//!   the hot paths through this build's release binary and the previous one, interleaved in the
//!   same run (every path through both builds each round, the order swapped every round; 5
//!   rounds, 3 with `--quick`, `--rounds N` for more): a demo turn end to end, fan-out to 10
//!   devices, a `sync` replay of a stored history, the admin's Status page signed in; each the
//!   median and spread of its rounds, the ratio this ÷ previous and whether it is within the
//!   previous build's round-to-round spread (the memory rows above hold idle and after-work
//!   VmRSS against the same build);
//! - stripped release binary sizes against issue 37's goals (and the previous build's:
//!   `IRIS_BENCH_PREVIOUS`, `IRIS_BENCH_PREVIOUS_AARCH64`, `IRIS_BENCH_PREVIOUS_ARMV7`), and the
//!   10-device fan-out of the aarch64 binary under qemu-user when `IRIS_BENCH_AARCH64` names one
//!   (benches/regenerate builds it);
//! - streamed answers paced at 100 tokens/s and at full speed: bytes a device receives in
//!   updates ÷ the answer's bytes (whole text and append, 1 and 10 devices); gateway CPU per
//!   1,000 tokens against a bare relay (this binary run with `--bare-relay`: the agent's SSE
//!   stream written chunk by chunk to the same number of WebSocket clients) and against the
//!   unpaced gateway; time to the first update; and with `IRIS_BENCH_AARCH64`, the aarch64
//!   release binary under qemu-user against the native release binary (this build's in a
//!   release bench build, else `IRIS_BENCH_NATIVE`): CPU per 1,000 tokens and bytes.
//!
//! `cargo bench --bench gateway` (Markdown on stdout; `benches/regenerate` writes
//! docs/benchmarks.md). `-- --quick` for a smoke run, `-- --only catchup` for one section
//! (`-- --only previous` for the hot paths against the previous build).

use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use iris_gateway::hub::new_device;
use iris_gateway::protocol::{Frame, HistoryMessage, Lane, Role};
use iris_gateway::store::{Change, DeviceOrigin, Record, Store};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<TcpStream>;

// The tests' browser without a browser (tests/common/web.rs), for the admin page's work.
#[allow(unused)]
#[path = "../tests/common/mod.rs"]
mod common;

/// Chunks one scripted turn streams.
const CHUNKS_PER_TURN: usize = 200;

struct Opts {
    quick: bool,
    /// `--only NAME`: run one section (fanout, stalled, catchup, scale, queries, burst, turns, memory, previous, sizes, stream), for measuring one
    /// figure without waiting for the others.
    only: Option<String>,
    /// `--rounds N`: rounds of each hot path through each build in the section against the
    /// previous build (3 with `--quick`, else 5; at least 2).
    rounds: Option<usize>,
    /// `--scale N`: history messages for the store-at-scale section (CI-sized by default).
    scale: usize,
}

impl Opts {
    fn wants(&self, section: &str) -> bool {
        self.only.as_deref().is_none_or(|o| o == section)
    }
}

/// One row of the report.
struct Row {
    what: String,
    value: String,
    baseline: String,
    ratio: String,
}

fn row(what: impl Into<String>, value: String, baseline: String, ratio: f64) -> Row {
    Row {
        what: what.into(),
        value,
        baseline,
        ratio: format!("{ratio:.3}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The gateway process
// ---------------------------------------------------------------------------------------------

/// The binary under test: `IRIS_GATEWAY_BIN` (with `IRIS_GATEWAY_RUNNER`, e.g. qemu) or this
/// build's release binary.
fn gateway_command(bin: Option<(&Path, &[&str])>) -> Command {
    match bin {
        Some((path, runner)) if !runner.is_empty() => {
            let mut c = Command::new(runner[0]);
            c.args(&runner[1..]).arg(path);
            c
        }
        Some((path, _)) => Command::new(path),
        None => Command::new(env!("CARGO_BIN_EXE_iris-gateway")),
    }
}

struct Gateway {
    child: Child,
    url: String,
    stderr: Arc<Mutex<String>>,
}

impl Gateway {
    fn start(dir: &Path, config: &str, bin: Option<(&Path, &[&str])>) -> (Gateway, Duration) {
        Gateway::start_env(dir, config, bin, &[])
    }

    /// As `start`, with variables set in the gateway's environment (its debug-build hooks).
    fn start_env(
        dir: &Path,
        config: &str,
        bin: Option<(&Path, &[&str])>,
        env: &[(&str, &str)],
    ) -> (Gateway, Duration) {
        let config_path = dir.join("bench.toml");
        std::fs::write(&config_path, config).unwrap();
        let t = Instant::now();
        let mut child = gateway_command(bin)
            .envs(env.iter().copied())
            .args(["run", "--data-dir"])
            .arg(dir.join("data"))
            .arg("--config")
            .arg(&config_path)
            .args(["--listen", "127.0.0.1:0", "--log-level", "info"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the gateway");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let url = loop {
            line.clear();
            if out.read_line(&mut line).unwrap_or(0) == 0 {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                panic!("the gateway exited before listening ({status}):\n{err}\nconfig:\n{config}");
            }
            if let Some(u) = line.trim().strip_prefix("listening on ") {
                if u.starts_with("ws://") {
                    break u.to_owned();
                }
            }
        };
        let started = t.elapsed();
        std::thread::spawn(move || for _ in out.lines() {});
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if l.contains("coalesced=") || l.contains("sled reopened") {
                    sink.lock().unwrap().push_str(&l);
                    sink.lock().unwrap().push('\n');
                }
            }
        });
        (Gateway { child, url, stderr }, started)
    }

    fn status_kb(&self, key: &str) -> u64 {
        status_kb(self.child.id(), key)
    }

    fn stop(mut self) {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }

    /// SIGKILL: a crash or a power cut, as far as the store can tell.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `/proc/PID/status` figure in kB (`VmRSS`, `VmHWM`). Under qemu-user the process is qemu.
fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| {
            v.trim_start_matches(':')
                .trim()
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The config every run uses: room for 500 devices, no rate limits in the way.
fn config(agent_url: Option<&str>) -> String {
    let template = Command::new(env!("CARGO_BIN_EXE_iris-gateway"))
        .arg("config")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut limits = String::from(
        "[limits]\nmax_connections = 1000\nframes_per_second = 100000\nframe_burst = 100000\nlane_queue_depth = 64\n",
    );
    // Keys other work may add; set them only when this build knows them.
    if template.contains("#max_connections_per_ip") {
        limits.push_str("max_connections_per_ip = 1000\n");
    }
    // The fan-out and latency figures measure every chunk through the gateway, as before
    // pacing; the streaming section sets its own.
    if template.contains("#stream_update_ms") {
        limits.push_str("stream_update_ms = 0\n");
    }
    let agent = match agent_url {
        Some(url) => format!("[agent]\nbackend = \"openai\"\nurl = \"{url}\"\nmodel = \"bench\"\n"),
        None => "[demo]\npace_ms = 0\n".to_owned(),
    };
    format!("{agent}{limits}")
}

/// Pairs `n` devices straight in the store (before the gateway opens it): (device_id, token).
fn pair_devices(dir: &Path, n: usize) -> Vec<(String, String)> {
    let store = Store::open(&dir.join("data"), 1 << 20, Duration::from_secs(5)).unwrap();
    let out = (0..n)
        .map(|i| {
            let (device, token) = new_device(&format!("bench-{i}"), DeviceOrigin::Pair);
            store
                .commit(&[Change::Record(Record::PutDevice(device.clone()))])
                .unwrap();
            (device.device_id, token)
        })
        .collect();
    store.sync_blocking().unwrap();
    out
}

/// Stores `n` messages in the default channel (and their outbox frames), 500 per fsync.
fn prefill(dir: &Path, n: usize) {
    let store = Store::open(&dir.join("data"), 1 << 20, Duration::from_secs(5)).unwrap();
    let lane = Lane::new("default", None);
    for i in 0..n {
        let role = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        let text = format!(
            "stored message {i}: the tomatoes want water at eight, and the forecast says rain"
        );
        let m = HistoryMessage::text_only(
            format!("msg_{i:016x}"),
            role,
            text,
            1_760_000_000_000 + i as i64,
        );
        let frame = Frame::message(&m).in_lane("default", None).outboxed();
        store
            .commit(&[Change::PutMessage(lane.clone(), m), Change::Outbox(frame)])
            .unwrap();
        if i % 500 == 499 {
            store.sync_blocking().unwrap();
        }
    }
    store.sync_blocking().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------------

async fn connect(url: &str, recv_buffer: Option<u32>) -> Ws {
    let addr: std::net::SocketAddr = url.trim_start_matches("ws://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    if let Some(b) = recv_buffer {
        socket.set_recv_buffer_size(b).unwrap();
    }
    let tcp = socket.connect(addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(url, tcp).await.unwrap();
    ws
}

async fn recv_json(ws: &mut Ws) -> Value {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(&t).unwrap(),
            Some(Ok(_)) => continue,
            other => panic!("connection ended: {other:?}"),
        }
    }
}

async fn hello(url: &str, device: &(String, String), recv_buffer: Option<u32>) -> Ws {
    let mut ws = connect(url, recv_buffer).await;
    let hello = json!({"v": 1, "type": "hello", "id": 1, "payload": {
        "token": device.1, "device_id": device.0, "device_name": "bench" }});
    ws.send(Message::text(hello.to_string())).await.unwrap();
    loop {
        let f = recv_json(&mut ws).await;
        match f["type"].as_str() {
            Some("hello.ack") => return ws,
            Some("error") => panic!("hello refused: {f}"),
            _ => {}
        }
    }
}

/// Microseconds since the bench started: the stamp both sides of a latency read.
fn now_us(epoch: Instant) -> u64 {
    epoch.elapsed().as_micros() as u64
}

/// Latencies of every stamped update a device sees, until it has seen `stops` message.stops.
async fn watch_turns(mut ws: Ws, stops: usize, epoch: Instant) -> (Vec<u64>, usize) {
    let mut lat = Vec::new();
    let mut frames = 0;
    let mut seen = 0;
    while seen < stops {
        let f = recv_json(&mut ws).await;
        frames += 1;
        match f["type"].as_str() {
            Some("message.update") => {
                let text = f["payload"]["text"].as_str().unwrap_or("");
                if let Some(stamp) = text.rsplit(' ').next().and_then(|s| s.parse::<u64>().ok()) {
                    lat.push(now_us(epoch).saturating_sub(stamp));
                }
            }
            Some("message.stop") => seen += 1,
            _ => {}
        }
    }
    (lat, frames)
}

fn percentile(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

// ---------------------------------------------------------------------------------------------
// The scripted agent: an OpenAI-compatible server streaming stamped chunks as fast as it can
// ---------------------------------------------------------------------------------------------

/// Reads one request of the agent (its head, then as much body as Content-Length says).
/// `GET /v1/models` is answered here and `false` returned; a chat completion gets the
/// event-stream head and `true`: the caller streams its chunks, then `end_stream`.
async fn open_stream(tcp: &mut tokio::net::TcpStream) -> bool {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    let (head_end, len) = loop {
        let n = tcp.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            return false;
        }
        req.extend_from_slice(&buf[..n]);
        if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&req[..i]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (i + 4, len);
        }
    };
    while req.len() < head_end + len {
        let n = tcp.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    if req.starts_with(b"GET") {
        let body = r#"{"data":[{"id":"bench"}]}"#;
        let reply = format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        let _ = tcp.write_all(reply.as_bytes()).await;
        return false;
    }
    tcp.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
    )
    .await
    .is_ok()
}

/// The stream's last chunk (its usage) and its end.
async fn end_stream(tcp: &mut tokio::net::TcpStream, tokens: usize) {
    let end = json!({"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"total_tokens": tokens}});
    let _ = tcp
        .write_all(format!("data: {end}\n\ndata: [DONE]\n\n").as_bytes())
        .await;
}

async fn scripted_agent(epoch: Instant) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::task::spawn_local(async move {
        loop {
            let Ok((mut tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::task::spawn_local(async move {
                if !open_stream(&mut tcp).await {
                    return;
                }
                for _ in 0..CHUNKS_PER_TURN {
                    let chunk =
                        json!({"choices": [{"delta": {"content": format!(" {}", now_us(epoch))}}]});
                    if tcp
                        .write_all(format!("data: {chunk}\n\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
                end_stream(&mut tcp, CHUNKS_PER_TURN).await;
            });
        }
    });
    format!("http://{addr}/v1")
}

// ---------------------------------------------------------------------------------------------
// Fan-out
// ---------------------------------------------------------------------------------------------

struct FanOut {
    frames_per_sec: f64,
    p50_us: u64,
    p99_us: u64,
}

/// `turns` turns sent by device 0, watched by `devices` devices (the sender included).
async fn gateway_fan_out(
    devices: usize,
    turns: usize,
    bin: Option<(&Path, &[&str])>,
    epoch: Instant,
) -> FanOut {
    let tmp = tempfile::tempdir().unwrap();
    let ids = pair_devices(tmp.path(), devices);
    let agent = scripted_agent(epoch).await;
    let (gw, _) = Gateway::start(tmp.path(), &config(Some(&agent)), bin);
    let mut watchers = Vec::new();
    let mut sender = None;
    for (i, d) in ids.iter().enumerate() {
        let ws = hello(&gw.url, d, None).await;
        if i == 0 {
            sender = Some(ws);
        } else {
            watchers.push(ws);
        }
    }
    let (mut tx, rx) = sender.unwrap().split();
    let t = Instant::now();
    let mut tasks = Vec::new();
    for ws in watchers {
        tasks.push(tokio::task::spawn_local(watch_turns(ws, turns, epoch)));
    }
    // The sender sends its turns back to back (they queue in the lane) and watches too.
    for i in 0..turns {
        let m = json!({"v":1,"type":"message.send","id": 10 + i,"chat_id":"default","payload":{"text": format!("turn {i}")}});
        tx.send(Message::text(m.to_string())).await.unwrap();
    }
    let own = tx.reunite(rx).unwrap();
    tasks.push(tokio::task::spawn_local(watch_turns(own, turns, epoch)));
    let mut lat = Vec::new();
    let mut frames = 0;
    for task in tasks {
        let (l, f) = task.await.unwrap();
        lat.extend(l);
        frames += f;
    }
    let elapsed = t.elapsed().as_secs_f64();
    gw.stop();
    FanOut {
        frames_per_sec: frames as f64 / elapsed,
        p50_us: percentile(&mut lat, 0.5),
        p99_us: percentile(&mut lat, 0.99),
    }
}

/// The same frames through a bare tokio-tungstenite broadcast server on its own thread.
async fn bare_fan_out(devices: usize, turns: usize, epoch: Instant) -> FanOut {
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let mut clients = Vec::new();
            for _ in 0..devices {
                let (tcp, _) = listener.accept().await.unwrap();
                let _ = tcp.set_nodelay(true);
                clients.push(tokio_tungstenite::accept_async(tcp).await.unwrap());
            }
            for turn in 0..turns {
                let mut text = String::new();
                for _ in 0..CHUNKS_PER_TURN {
                    text.push_str(&format!(" {}", now_us(epoch)));
                    let f = json!({"v":1,"type":"message.update","chat_id":"default","payload":{"message_id": format!("msg_{turn}"),"text": text}}).to_string();
                    for c in clients.iter_mut() {
                        c.send(Message::text(f.clone())).await.unwrap();
                    }
                }
                let stop = json!({"v":1,"type":"message.stop","payload":{"message_id": format!("msg_{turn}"),"final_text": text}}).to_string();
                for c in clients.iter_mut() {
                    c.send(Message::text(stop.clone())).await.unwrap();
                }
            }
            for c in clients.iter_mut() {
                let _ = c.close(None).await;
            }
        });
    });
    let addr = addr_rx.recv().unwrap();
    let url = format!("ws://{addr}");
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..devices {
        let ws = connect(&url, None).await;
        tasks.push(tokio::task::spawn_local(watch_turns(ws, turns, epoch)));
    }
    let mut lat = Vec::new();
    let mut frames = 0;
    for task in tasks {
        let (l, f) = task.await.unwrap();
        lat.extend(l);
        frames += f;
    }
    let elapsed = t.elapsed().as_secs_f64();
    server.join().unwrap();
    FanOut {
        frames_per_sec: frames as f64 / elapsed,
        p50_us: percentile(&mut lat, 0.5),
        p99_us: percentile(&mut lat, 0.99),
    }
}

// ---------------------------------------------------------------------------------------------
// The other figures
// ---------------------------------------------------------------------------------------------

/// Peak RSS with 10 devices watching `turns` turns, one of which (when `stalled`) never reads;
/// and the coalesced count the gateway logs for it.
async fn stalled_run(stalled: bool, turns: usize, epoch: Instant) -> (u64, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let ids = pair_devices(tmp.path(), 10);
    let agent = scripted_agent(epoch).await;
    let (gw, _) = Gateway::start(tmp.path(), &config(Some(&agent)), None);
    let mut watchers = Vec::new();
    let mut stuck = None;
    for (i, d) in ids.iter().enumerate() {
        if stalled && i == 9 {
            // A 4 KiB receive buffer it never drains: the gateway's queue for it fills.
            stuck = Some(hello(&gw.url, d, Some(4096)).await);
        } else {
            watchers.push(hello(&gw.url, d, None).await);
        }
    }
    let mut sender = watchers.remove(0);
    for i in 0..turns {
        let m = json!({"v":1,"type":"message.send","id": 10 + i,"chat_id":"default","payload":{"text": format!("turn {i}")}});
        sender.send(Message::text(m.to_string())).await.unwrap();
    }
    let mut tasks = vec![tokio::task::spawn_local(watch_turns(sender, turns, epoch))];
    for ws in watchers {
        tasks.push(tokio::task::spawn_local(watch_turns(ws, turns, epoch)));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let peak = gw.status_kb("VmHWM");
    drop(stuck);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let coalesced = gw
        .stderr
        .lock()
        .unwrap()
        .lines()
        .filter_map(|l| {
            l.split("coalesced=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    gw.stop();
    (peak, coalesced)
}

/// Time to replay `n` stored frames with `sync{cursor:0}`, through the gateway (this build's,
/// or `bin`).
async fn gateway_sync(n: usize, bin: Option<&Path>) -> Duration {
    let tmp = tempfile::tempdir().unwrap();
    prefill(tmp.path(), n);
    let ids = pair_devices(tmp.path(), 1);
    let (gw, _) = Gateway::start(tmp.path(), &config(None), bin.map(|b| (b, &[][..])));
    let mut ws = hello(&gw.url, &ids[0], None).await;
    let t = Instant::now();
    ws.send(Message::text(
        json!({"v":1,"type":"sync","id":2,"payload":{"cursor":0}}).to_string(),
    ))
    .await
    .unwrap();
    let mut replayed = 0;
    loop {
        let f = recv_json(&mut ws).await;
        if f["type"] == "sync.done" {
            break;
        }
        if f.get("cursor").is_some() {
            replayed += 1;
        }
    }
    let d = t.elapsed();
    assert!(replayed >= n, "replayed {replayed} of {n}");
    gw.stop();
    d
}

/// The same number of frames of the same size through the bare stack.
async fn bare_sync(n: usize) -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::from_std(listener.into_std().unwrap()).unwrap();
            let (tcp, _) = listener.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
            let _ = ws.next().await;
            for i in 0..n {
                let f = json!({"v":1,"type":"message","chat_id":"default","cursor": i + 1,"payload":{"message_id": format!("msg_{i:016x}"),"role":"user","text": format!("stored message {i}: the tomatoes want water at eight, and the forecast says rain"),"ts": 1_760_000_000_000u64 + i as u64,"media":[]}});
                ws.send(Message::text(f.to_string())).await.unwrap();
            }
            ws.send(Message::text(json!({"v":1,"type":"sync.done","id":2,"payload":{"cursor": n}}).to_string())).await.unwrap();
            let _ = ws.close(None).await;
        });
    });
    let mut ws = connect(&url, None).await;
    let t = Instant::now();
    ws.send(Message::text("{}")).await.unwrap();
    loop {
        if recv_json(&mut ws).await["type"] == "sync.done" {
            break;
        }
    }
    let d = t.elapsed();
    server.join().unwrap();
    d
}

/// About 300 bytes of text, different for every message, with words search can find.
fn scale_text(i: usize) -> String {
    const WORDS: [&str; 16] = [
        "garden", "tomato", "zucchini", "forecast", "water", "reminder", "kitchen", "recipe",
        "battery", "invoice", "holiday", "train", "meeting", "birthday", "printer", "router",
    ];
    let mut t = format!("note {i}: ");
    let mut k = i;
    while t.len() < 290 {
        t.push_str(WORDS[k % 16]);
        t.push(' ');
        k = k / 3 + 7 * (t.len() % 5);
    }
    if i % 1000 == 7 {
        t.push_str("aubergine");
    }
    t
}

/// Frames the outbox keeps, as the gateway's default `store.outbox_retain_frames`.
const RETAIN: u64 = 20_000;

/// Fills `n` history messages (~300 B of text each, alternating user and assistant, over three
/// lanes) with their outbox frames through the store's intent API, 1,000 per fsync, pruning
/// the outbox as the gateway does; then tops the outbox up to `RETAIN` frames, so every store
/// compared has a full outbox.
fn fill(dir: &Path, n: usize) {
    let store = Store::open(&dir.join("data"), 1 << 20, Duration::from_secs(5)).unwrap();
    let lanes = [
        Lane::new("default", None),
        Lane::new("default", Some("thr_garden")),
        Lane::new("default", Some("thr_house")),
    ];
    let mut batch = Vec::new();
    for i in 0..n {
        let lane = &lanes[i % 3];
        let role = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        let m = HistoryMessage::text_only(
            format!("msg_{i:016x}"),
            role,
            scale_text(i),
            1_760_000_000_000 + i as i64,
        );
        let frame = Frame::message(&m)
            .in_lane(&lane.chat_id, lane.thread())
            .outboxed();
        batch.push(Change::OutboxOf {
            message_id: m.message_id.clone(),
            frame,
        });
        batch.push(Change::PutMessage(lane.clone(), m));
        if batch.len() >= 2000 {
            store.commit(&batch).unwrap();
            batch.clear();
            store.sync_blocking().unwrap();
            store.prune_outbox(RETAIN).unwrap();
            // The gateway checkpoints every 5 minutes, which bounds the journal (and with it
            // how many pages sled ever holds) to a few dozen entries in a household; a fill
            // this fast does it every batch of 2,000 messages, still far more between two.
            store.checkpoint_blocking().unwrap();
        }
    }
    store.commit(&batch).unwrap();
    let head = store.cursor_head().unwrap();
    // Frames of the same size as the messages', not in history: the outbox is as full, and
    // holds as many bytes, whatever the history.
    let mut filler = Vec::new();
    for k in head..RETAIN {
        let m = HistoryMessage::text_only(
            format!("msg_filler_{k:016x}"),
            Role::Assistant,
            scale_text(k as usize),
            1_760_000_000_000,
        );
        filler.push(Change::Outbox(
            Frame::message(&m).in_lane("default", None).outboxed(),
        ));
    }
    for chunk in filler.chunks(1000) {
        store.commit(chunk).unwrap();
    }
    store.sync_blocking().unwrap();
    store.prune_outbox(RETAIN).unwrap();
    store.close_cleanly().unwrap();
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                total += dir_bytes(&e.path());
            } else {
                total += m.len();
            }
        }
    }
    total
}

/// What `at_scale` measures on a store of a given size.
struct AtScale {
    /// Idle `VmRSS` (kB), 1 s after a start following a clean stop, and following a SIGKILL.
    idle_clean: u64,
    idle_crash: u64,
    /// Process start to `hello.ack`, after a clean stop and after a SIGKILL.
    hello_clean: Duration,
    hello_crash: Duration,
    /// Medians over the socket: a `history` page of 50, and a `search` (limit 20).
    history: Duration,
    search: Duration,
    /// The data dir's bytes (store, history database, witness), all files counted.
    data_dir: u64,
}

/// Starts the gateway and times process start to `hello.ack`.
async fn start_to_hello(dir: &Path, device: &(String, String)) -> (Gateway, Ws, Duration) {
    let t = Instant::now();
    let (gw, _) = Gateway::start(dir, &config(None), None);
    let ws = hello(&gw.url, device, None).await;
    let d = t.elapsed();
    (gw, ws, d)
}

async fn median_request(
    ws: &mut Ws,
    reps: usize,
    frame: impl Fn(usize) -> Value,
    reply: &str,
) -> Duration {
    let mut times = Vec::new();
    for i in 0..reps {
        let t = Instant::now();
        ws.send(Message::text(frame(i).to_string())).await.unwrap();
        loop {
            if recv_json(ws).await["type"] == reply {
                break;
            }
        }
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

async fn at_scale(stored: usize) -> AtScale {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fill(tmp.path(), stored);
    let ids = pair_devices(tmp.path(), 1);
    // One start to settle what the fill left (its witness), then the measured ones.
    let (gw, _) = Gateway::start(tmp.path(), &config(None), None);
    gw.stop();
    let (gw, mut ws, hello_clean) = start_to_hello(tmp.path(), &ids[0]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_clean = gw.status_kb("VmRSS");
    let history = median_request(
        &mut ws,
        21,
        |i| json!({"v":1,"type":"history","id": 100 + i,"chat_id":"default","payload":{"limit":50}}),
        "history",
    )
    .await;
    let search = median_request(
        &mut ws,
        21,
        |i| json!({"v":1,"type":"search","id": 200 + i,"payload":{"query": if i % 2 == 0 { "aubergine" } else { "zucchini tomato" }, "limit": 20}}),
        "search.results",
    )
    .await;
    drop(ws);
    gw.kill();
    let data_dir = dir_bytes(&tmp.path().join("data"));
    let (gw, ws, hello_crash) = start_to_hello(tmp.path(), &ids[0]).await;
    drop(ws);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_crash = gw.status_kb("VmRSS");
    gw.stop();
    AtScale {
        idle_clean,
        idle_crash,
        hello_clean,
        hello_crash,
        history,
        search,
        data_dir,
    }
}

/// Lanes a burst writes into at once, one device and one channel each.
const BURST_LANES: usize = 4;
/// Messages each burst device keeps in flight in its lane.
const BURST_WINDOW: usize = 16;

/// Writes about `n` history messages through the protocol as fast as it takes them (a restore,
/// an automation storm): `BURST_LANES` devices each send into a channel of their own, keeping
/// `BURST_WINDOW` messages in flight; every message and the demo's answer to it are history.
/// Returns once every answer arrived, with how long the burst took.
async fn burst(url: &str, devices: &[(String, String)], n: usize) -> Duration {
    let t = Instant::now();
    let per_lane = n.div_ceil(2 * devices.len());
    let mut tasks = Vec::new();
    for (k, device) in devices.iter().enumerate() {
        let mut ws = hello(url, device, None).await;
        let create = json!({"v":1,"type":"channel.create","id":2,"payload":{"name": format!("burst {k}"),"kind":"channel"}});
        ws.send(Message::text(create.to_string())).await.unwrap();
        let chat = loop {
            let f = recv_json(&mut ws).await;
            if f["type"] == "channel.created" && f["id"] == 2 {
                break f["payload"]["chat_id"].as_str().unwrap().to_owned();
            }
        };
        tasks.push(tokio::task::spawn_local(async move {
            let (mut sent, mut answered) = (0, 0);
            while answered < per_lane {
                while sent < per_lane && sent - answered < BURST_WINDOW {
                    let f = json!({"v":1,"type":"message.send","id": 100 + sent,"chat_id": chat,
                        "payload":{"text": format!("burst {k}/{sent}: {}", scale_text(sent))}});
                    ws.send(Message::text(f.to_string())).await.unwrap();
                    sent += 1;
                }
                let f = recv_json(&mut ws).await;
                match f["type"].as_str() {
                    Some("message.stop") if f["chat_id"] == chat.as_str() => answered += 1,
                    Some("error") => panic!("the burst was refused: {f}"),
                    _ => {}
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    t.elapsed()
}

/// Process start to `hello.ack` after a SIGKILL that follows a burst of `n` history messages
/// written by a gateway with `env` (a debug build's apply policy); how long the burst took, and
/// how many times sled was reopened for its snapshot in it.
async fn crash_after_burst(n: usize, env: &[(&str, &str)]) -> (Duration, Duration, usize) {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ids = pair_devices(tmp.path(), BURST_LANES);
    let (gw, _) = Gateway::start_env(tmp.path(), &config(None), None, env);
    let took = burst(&gw.url, &ids, n).await;
    let log = gw.stderr.clone();
    gw.kill();
    let reopens = log.lock().unwrap().matches("sled reopened").count();
    let (gw, ws, hello_crash) = start_to_hello(tmp.path(), &ids[0]).await;
    drop(ws);
    gw.stop();
    (hello_crash, took, reopens)
}

/// A start after a SIGKILL that follows a burst of writes through the protocol (scale:
/// `IRIS_BENCH_BURST` history messages, CI-sized by default), against one after a burst of 1,000.
async fn burst_section(opts: &Opts) {
    let big = std::env::var("IRIS_BENCH_BURST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if opts.quick { 4_000 } else { 20_000 });
    let small = 1000;
    let (b, took, reopens) = crash_after_burst(big, &[]).await;
    let (s, _, _) = crash_after_burst(small, &[]).await;
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
    let mut rows = vec![row(
        format!(
            "process start to hello.ack after a SIGKILL that follows {big} history messages written in {:.0} s ({BURST_LANES} lanes; sled reopened {reopens} times)",
            took.as_secs_f64()
        ),
        ms(b),
        format!("{} (after a burst of {small})", ms(s)),
        b.as_secs_f64() / s.as_secs_f64(),
    )];
    // Each turn's history applied on its own, as before the journal was applied a few
    // entries at a time, where this build can select it (a debug build).
    if cfg!(debug_assertions) {
        let (old, took, reopens) =
            crash_after_burst(big, &[("IRIS_GATEWAY_APPLY_EVERY", "turn")]).await;
        rows.push(row(
            "the same, against the journal applied at each sync (the burst's gateway with IRIS_GATEWAY_APPLY_EVERY=turn)",
            ms(b),
            format!(
                "{} (applied at each sync: written in {:.0} s, sled reopened {reopens} times)",
                ms(old),
                took.as_secs_f64()
            ),
            b.as_secs_f64() / old.as_secs_f64(),
        ));
    }
    print(
        &format!("A start after a burst ({big} history messages through the protocol)"),
        &rows,
    );
}

/// The store at scale: `big` history messages against 1,000, both with a full outbox.
async fn scale_section(opts: &Opts) {
    let big = opts.scale;
    let small = 1000;
    let b = at_scale(big).await;
    let s = at_scale(small).await;
    let mib = |kb: u64| format!("{:.1} MiB", kb as f64 / 1024.0);
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let mut rows = vec![
        row(
            format!("idle RSS, {big} history messages, after a clean stop"),
            mib(b.idle_clean),
            format!("{} ({small} messages, full outbox)", mib(s.idle_clean)),
            b.idle_clean as f64 / s.idle_clean.max(1) as f64,
        ),
        row(
            format!("idle RSS, {big} history messages, after a SIGKILL"),
            mib(b.idle_crash),
            format!("{} ({small} messages, after a SIGKILL)", mib(s.idle_crash)),
            b.idle_crash as f64 / s.idle_crash.max(1) as f64,
        ),
        row(
            format!("process start to hello.ack, {big} messages, after a SIGKILL"),
            ms(b.hello_crash),
            format!("{} ({small} messages)", ms(s.hello_crash)),
            b.hello_crash.as_secs_f64() / s.hello_crash.as_secs_f64(),
        ),
        row(
            format!("process start to hello.ack, {big} messages, after a clean stop"),
            ms(b.hello_clean),
            format!("{} ({small} messages)", ms(s.hello_clean)),
            b.hello_clean.as_secs_f64() / s.hello_clean.as_secs_f64(),
        ),
        row(
            format!("history page of 50 over the socket, {big} messages (median of 21)"),
            ms(b.history),
            format!("{} ({small} messages)", ms(s.history)),
            b.history.as_secs_f64() / s.history.as_secs_f64(),
        ),
        row(
            format!("search over the socket, {big} messages (median of 21, rare word / two common words)"),
            ms(b.search),
            format!("{} ({small} messages)", ms(s.search)),
            b.search.as_secs_f64() / s.search.as_secs_f64(),
        ),
    ];
    let text: usize = (0..1000).map(|i| scale_text(i).len()).sum::<usize>() / 1000;
    let per = b.data_dir.saturating_sub(s.data_dir) as f64 / (big - small).max(1) as f64;
    rows.push(row(
        format!("data dir per history message (~{text} B of text), {big} against {small} messages"),
        format!("{per:.0} B"),
        format!("{text} B of text"),
        per / text as f64,
    ));
    print(
        &format!("The store at scale ({big} history messages)"),
        &rows,
    );
}

/// Pings from one device every `every` until `stop`; the round trips.
async fn pings_until(ws: &mut Ws, every: Duration, stop: &std::cell::Cell<bool>) -> Vec<Duration> {
    let mut times = Vec::new();
    let mut id = 10_000;
    while !stop.get() {
        let t = Instant::now();
        id += 1;
        ws.send(Message::text(
            json!({"v":1,"type":"ping","id": id,"payload":{}}).to_string(),
        ))
        .await
        .unwrap();
        while recv_json(ws).await["id"] != json!(id) {}
        times.push(t.elapsed());
        tokio::time::sleep_until((t + every).into()).await;
    }
    times
}

/// Another device's ping while one device sends the costliest searches (the query with a
/// character no index term has, `n ᦰ`, and the 36 one-character prefixes) every 50 ms for
/// 6 s without waiting for the answers, against the same device's ping with nobody
/// searching, at `stored` history messages (`--scale`). Before the query thread: 8–19 s.
async fn query_section() {
    let stored = 20_000;
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fill(tmp.path(), stored);
    let ids = pair_devices(tmp.path(), 2);
    let (gw, _) = Gateway::start(tmp.path(), &config(None), None);
    let mut searcher = hello(&gw.url, &ids[0], None).await;
    let mut pinger = hello(&gw.url, &ids[1], None).await;
    let stop = std::cell::Cell::new(false);
    let idle = {
        let quiet = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            stop.set(true);
        };
        tokio::join!(
            quiet,
            pings_until(&mut pinger, Duration::from_millis(100), &stop)
        )
        .1
    };
    stop.set(false);
    let alphabet: String = ('a'..='z')
        .chain('0'..='9')
        .map(|c| format!("{c} "))
        .collect();
    let queries = ["n \u{19b0}".to_owned(), alphabet.trim().to_owned()];
    let (busy, answered) = {
        let search = async {
            let end = Instant::now() + Duration::from_secs(6);
            let (mut sent, mut answered) = (0usize, 0usize);
            let mut next = Instant::now();
            while Instant::now() < end || answered < sent {
                if Instant::now() >= next && Instant::now() < end {
                    let q = &queries[sent % 2];
                    let f = json!({"v":1,"type":"search","id": 100 + sent,"payload":{"query": q, "limit": 20}});
                    searcher.send(Message::text(f.to_string())).await.unwrap();
                    sent += 1;
                    next += Duration::from_millis(50);
                }
                let until = if Instant::now() < end {
                    next
                } else {
                    Instant::now() + Duration::from_secs(30)
                };
                if let Ok(Some(Ok(Message::Text(t)))) =
                    tokio::time::timeout_at(until.into(), searcher.next()).await
                {
                    let v: Value = serde_json::from_str(&t).unwrap();
                    if v["type"] == "search.results" || v["type"] == "error" {
                        answered += 1;
                    }
                }
            }
            stop.set(true);
            answered
        };
        let (answered, busy) = tokio::join!(
            search,
            pings_until(&mut pinger, Duration::from_millis(100), &stop)
        );
        (busy, answered)
    };
    drop((searcher, pinger));
    gw.stop();
    let pct = |v: &[Duration], p: usize| {
        let mut v = v.to_vec();
        v.sort();
        v[(v.len() * p / 100).min(v.len() - 1)]
    };
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let rows = vec![
        row(
            format!(
                "ping of another device while one searches every 50 ms, {stored} messages, p50"
            ),
            ms(pct(&busy, 50)),
            format!("{} (idle ping, p50)", ms(pct(&idle, 50))),
            pct(&busy, 50).as_secs_f64() / pct(&idle, 50).as_secs_f64(),
        ),
        row(
            format!(
                "the same, slowest of {} pings ({answered} searches answered or refused)",
                busy.len()
            ),
            ms(pct(&busy, 100)),
            format!("{} (idle ping, slowest)", ms(pct(&idle, 100))),
            pct(&busy, 100).as_secs_f64() / pct(&idle, 100).as_secs_f64(),
        ),
    ];
    print("Queries beside other devices", &rows);
}

/// Bytes the process `pid` caused to be written to the block device (`/proc/PID/io`).
fn write_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `n` demo turns one after another; returns the frames the device saw that are outboxed.
async fn demo_turns(ws: &mut Ws, n: usize, from: usize) -> usize {
    let mut outboxed = 0;
    for i in 0..n {
        let text = format!(
            "turn {} {}",
            from + i,
            scale_text(from + i).chars().take(60).collect::<String>()
        );
        ws.send(Message::text(
            json!({"v":1,"type":"message.send","id": 1000 + from + i,"chat_id":"default","payload":{"text": text}}).to_string(),
        ))
        .await
        .unwrap();
        loop {
            let f = tokio::time::timeout(Duration::from_secs(20), recv_json(ws))
                .await
                .expect("a demo turn did not end within 20 s");
            assert_ne!(f["type"], "error", "a demo turn was refused: {f}");
            if matches!(
                f["type"].as_str(),
                Some("message" | "tool.end" | "message.stop")
            ) {
                outboxed += 1;
            }
            if f["type"] == "message.stop" {
                break;
            }
        }
    }
    outboxed
}

/// 4 KiB blocks the kernel has to write for the `pwrite64` calls in strace lines: per file, the
/// distinct blocks dirtied between two syncs of it (fsync, fdatasync, sync_file_range), plus
/// those still dirty at the end (written back later). `/proc/PID/io` cannot say this on a
/// kernel with large folios (ext4 since 6.16), where it counts a whole folio each time one is
/// dirtied again after a sync: it reported megabytes per turn here for a few dozen KB written.
fn dirty_blocks(lines: &[&str]) -> u64 {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    let mut dirty: HashMap<String, BTreeSet<u64>> = HashMap::new();
    let mut total = 0u64;
    // Per file, for the breakdown printed to stderr: which file the blocks went to.
    let mut by_file: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for l in lines {
        let Some(call) = l.split_once(' ').map(|(_, c)| c.trim_start()) else {
            continue;
        };
        let path = || {
            call.split_once('<')
                .and_then(|(_, r)| r.split_once('>'))
                .map(|(p, _)| p.to_owned())
        };
        if let Some((p, len, off)) = pwrite_of(call) {
            let set = dirty.entry(p).or_default();
            for b in off / 4096..=(off + len - 1) / 4096 {
                set.insert(b);
            }
        } else if call.starts_with("fsync(")
            || call.starts_with("fdatasync(")
            || call.starts_with("sync_file_range(")
        {
            if let Some(p) = path() {
                let e = by_file.entry(p.clone()).or_default();
                e.1 += 1;
                if let Some(set) = dirty.remove(&p) {
                    total += set.len() as u64;
                    e.0 += set.len() as u64;
                }
            }
        }
    }
    for (p, set) in &dirty {
        by_file.entry(p.clone()).or_default().0 += set.len() as u64;
    }
    for (p, (blocks, syncs)) in &by_file {
        eprintln!("  dirtied {blocks:>6} blocks, {syncs:>5} syncs: {p}");
    }
    total + dirty.values().map(|s| s.len() as u64).sum::<u64>()
}

/// The file, length and offset of a `pwrite64` call in an strace line (after its pid):
/// `pwrite64(fd<path>, "...", LEN, OFFSET) = N` (or `<unfinished ...>`); `None` for another
/// call or an empty write.
fn pwrite_of(call: &str) -> Option<(String, u64, u64)> {
    if !call.starts_with("pwrite64(") {
        return None;
    }
    let path = call.split_once('<')?.1.split_once('>')?.0.to_owned();
    let args = call.split(" <unfinished").next().unwrap_or(call);
    let args = args.rsplit_once(')').map_or(args, |(a, _)| a);
    let mut nums = args.rsplitn(3, ", ");
    let off: u64 = nums.next()?.trim().parse().ok()?;
    let len: u64 = nums.next()?.trim().parse().ok()?;
    (len > 0).then_some((path, len, off))
}

/// sled's segment size (its default, which the store keeps): what its open zeroes at a time.
const SLED_SEGMENT: u64 = 512 * 1024;

/// What sled's opens wrote, from strace lines: the free segments of its log zeroed whole (a
/// segment-sized `pwrite64` at a segment boundary, `initialize_from_snapshot` in its
/// `pagecache/segment.rs`), and the zeros from the recovered tip to the end of its segment,
/// less a byte (`advance_snapshot` in `pagecache/snapshot.rs`). sled's own log writes are
/// neither: they never end one byte short of a segment. Returns (segments zeroed, bytes of
/// tip zeroing).
fn open_writes(lines: &[&str]) -> (u64, u64) {
    let (mut segments, mut tail) = (0, 0);
    for l in lines {
        let Some(call) = l.split_once(' ').map(|(_, c)| c.trim_start()) else {
            continue;
        };
        let Some((path, len, off)) = pwrite_of(call) else {
            continue;
        };
        if !path.ends_with("/db/db") {
            continue;
        }
        if len == SLED_SEGMENT && off % SLED_SEGMENT == 0 {
            segments += 1;
        } else if (off + len + 1) % SLED_SEGMENT == 0 {
            tail += len;
        }
    }
    (segments, tail)
}

/// strace as the gateway's runner: its sync and write calls, with file names, into `trace`.
fn strace_runner(trace: &str) -> Vec<&str> {
    vec![
        "strace",
        "-f",
        "-qq",
        "-e",
        "trace=fsync,fdatasync,sync_file_range,pwrite64",
        "-y",
        "-o",
        trace,
    ]
}

/// The gateway's own pid when it runs under a wrapper (strace): the wrapper's child.
fn traced_pid(wrapper: u32) -> u32 {
    for _ in 0..100 {
        let kids = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
            .unwrap_or_default();
        if let Some(pid) = kids.split_whitespace().next().and_then(|p| p.parse().ok()) {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    wrapper
}

/// What a long run of demo turns wrote, sled's reopens included (`long_turns`).
struct LongRun {
    /// 4 KiB blocks dirtied per sync over the whole run, per turn, in bytes.
    per_turn: f64,
    ms_per_turn: f64,
    /// The reopens that bound a crash start's replay ("sled reopened" in the log): records
    /// written before each, ms each took, and the bytes of the snapshot each wrote.
    reopens: Vec<(u64, u64, u64)>,
    /// What sled's opens zeroed (`open_writes`): whole free segments, and bytes at the tip.
    zeroed_segments: u64,
    tail_bytes: u64,
    /// The log file's size at the end.
    log_bytes: u64,
}

/// A `key=value` number in a log line.
fn log_field(line: &str, key: &str) -> Option<u64> {
    let (_, rest) = line.split_once(&format!(" {key}="))?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// `n` demo turns through the protocol on a new store, under strace, the gateway's environment
/// set to `env` (a debug build's apply policy): every block written, reopens included.
async fn long_turns(n: usize, env: &[(&str, &str)]) -> LongRun {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ids = pair_devices(tmp.path(), 1);
    let trace = tmp.path().join("long.txt");
    let trace_s = trace.to_string_lossy().into_owned();
    let runner = strace_runner(&trace_s);
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_iris-gateway"));
    let (gw, _) = Gateway::start_env(tmp.path(), &config(None), Some((&bin, &runner)), env);
    let pid = traced_pid(gw.child.id());
    let mut ws = hello(&gw.url, &ids[0], None).await;
    let lines0 = std::fs::read_to_string(&trace)
        .unwrap_or_default()
        .lines()
        .count();
    let t = Instant::now();
    // In parts, each followed by the figure so far on stderr: a run cut short (the long runs
    // take hours under strace) still says what it measured.
    const PART: usize = 5_000;
    let mut done = 0;
    while done < n {
        let part = PART.min(n - done);
        demo_turns(&mut ws, part, done).await;
        done += part;
        if done < n {
            let text = std::fs::read_to_string(&trace).unwrap_or_default();
            let window: Vec<&str> = text.lines().skip(lines0).collect();
            eprintln!("{done} of {n} turns, environment {env:?}:");
            let blocks = dirty_blocks(&window);
            eprintln!(
                "  so far {:.0} B a turn, {:.1} ms a turn",
                (blocks * 4096) as f64 / done as f64,
                t.elapsed().as_secs_f64() * 1e3 / done as f64
            );
        }
    }
    let elapsed = t.elapsed();
    drop(ws);
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    let log = gw.stderr.clone();
    gw.stop();
    let text = std::fs::read_to_string(&trace).unwrap_or_default();
    let window: Vec<&str> = text.lines().skip(lines0).collect();
    if let Some(keep) = std::env::var_os("IRIS_BENCH_KEEP_LONG_TRACE") {
        // For reading what each reopen wrote, and when.
        let keep = PathBuf::from(keep).join(format!("long-{}.txt", env.len()));
        std::fs::write(&keep, window.join("\n")).unwrap();
        std::fs::write(keep.with_extension("log"), log.lock().unwrap().as_bytes()).unwrap();
    }
    eprintln!("{n} turns, environment {env:?}:");
    let blocks = dirty_blocks(&window);
    let (zeroed_segments, tail_bytes) = open_writes(&window);
    let reopens = log
        .lock()
        .unwrap()
        .lines()
        .filter(|l| l.contains("sled reopened"))
        .map(|l| {
            let f = |k| log_field(l, k).unwrap_or(0);
            (f("records"), f("ms"), f("snapshot_bytes"))
        })
        .collect();
    let log_bytes = std::fs::metadata(tmp.path().join("data/db/db")).map_or(0, |m| m.len());
    LongRun {
        per_turn: (blocks * 4096) as f64 / n as f64,
        ms_per_turn: elapsed.as_secs_f64() * 1e3 / n as f64,
        reopens,
        zeroed_segments,
        tail_bytes,
        log_bytes,
    }
}

/// The long run's rows: this build's journal applied a few turns at a time against each turn
/// applied on its own (selected in the same debug build by `IRIS_GATEWAY_APPLY_EVERY=turn`),
/// run side by side; and this build's bytes per turn over the run, when it ran.
async fn long_turns_rows(opts: &Opts) -> (Vec<Row>, Option<f64>) {
    let n = std::env::var("IRIS_BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if opts.quick { 300 } else { 2_000 });
    let old_policy = [("IRIS_GATEWAY_APPLY_EVERY", "turn")];
    // `IRIS_BENCH_LONG_POLICY=turn|batched`: one of them alone (the 50,000-turn runs take a
    // while; two side by side share the cores).
    let (now, old) = match std::env::var("IRIS_BENCH_LONG_POLICY").as_deref() {
        Ok("turn") => (None, Some(long_turns(n, &old_policy).await)),
        Ok(_) => (Some(long_turns(n, &[]).await), None),
        Err(_) => {
            let (now, old) = tokio::join!(long_turns(n, &[]), long_turns(n, &old_policy));
            (Some(now), Some(old))
        }
    };
    let describe = |r: &LongRun| {
        let snap: u64 = r.reopens.iter().map(|x| x.2).sum();
        let ms: u64 = r.reopens.iter().map(|x| x.1).sum();
        let records: u64 = r.reopens.iter().map(|x| x.0).sum();
        let k = r.reopens.len().max(1) as u64;
        format!(
            "{} reopens (each after ~{} records, ~{} ms, a {} KB snapshot); sled's opens zeroed {} free segments ({} MB) and {} KB at its tip; its log {:.1} MB at the end; {:.1} ms a turn",
            r.reopens.len(),
            records / k,
            ms / k,
            snap / k / 1000,
            r.zeroed_segments,
            r.zeroed_segments * SLED_SEGMENT / 1_000_000,
            r.tail_bytes / 1000,
            r.log_bytes as f64 / 1e6,
            r.ms_per_turn,
        )
    };
    let what = |r: &LongRun| {
        format!("bytes written per demo turn over {n} turns on a new store, reopens included (4 KiB blocks dirtied per sync, from strace): {}", describe(r))
    };
    let baseline = |r: &LongRun| {
        format!(
            "{:.0} B (each turn applied on its own, as before: {})",
            r.per_turn,
            describe(r)
        )
    };
    let per_turn = now.as_ref().map(|r| r.per_turn);
    let rows = match (now, old) {
        (Some(now), Some(old)) => vec![row(
            what(&now),
            format!("{:.0} B", now.per_turn),
            baseline(&old),
            now.per_turn / old.per_turn.max(1.0),
        )],
        (Some(r), None) => vec![Row {
            what: what(&r),
            value: format!("{:.0} B", r.per_turn),
            baseline: "— (run alone)".into(),
            ratio: "—".into(),
        }],
        (None, Some(r)) => vec![Row {
            what: "the same with each turn applied on its own, as before".into(),
            value: baseline(&r),
            baseline: "— (run alone)".into(),
            ratio: "—".into(),
        }],
        (None, None) => Vec::new(),
    };
    (rows, per_turn)
}

/// Bytes written to the block device per demo turn, against a plain file doing the same
/// number of durable commits with the same frames; and the sync calls per turn (strace).
async fn turns_section(opts: &Opts) {
    let n = if opts.quick { 10 } else { 100 };
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fill(tmp.path(), 1000);
    let ids = pair_devices(tmp.path(), 1);
    let have_strace = std::env::var_os("IRIS_BENCH_NO_STRACE").is_none()
        && Command::new("strace").arg("-V").output().is_ok();
    let trace = tmp.path().join("sync-calls.txt");
    let trace_s = trace.to_string_lossy().into_owned();
    let runner = strace_runner(&trace_s);
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_iris-gateway"));
    let (gw, _) = if have_strace {
        Gateway::start(tmp.path(), &config(None), Some((&bin, &runner)))
    } else {
        Gateway::start(tmp.path(), &config(None), None)
    };
    let pid = if have_strace {
        traced_pid(gw.child.id())
    } else {
        gw.child.id()
    };
    let mut ws = hello(&gw.url, &ids[0], None).await;
    demo_turns(&mut ws, 5, 0).await;
    let wa = write_bytes(pid);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let count = |what: &str| -> usize {
        std::fs::read_to_string(&trace)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&format!("{what}(")))
            .count()
    };
    let (f0, d0, r0) = (count("fsync"), count("fdatasync"), count("sync_file_range"));
    let lines0 = std::fs::read_to_string(&trace)
        .unwrap_or_default()
        .lines()
        .count();
    let w0 = write_bytes(pid);
    eprintln!("written during the 1.5 s pause: {}", w0 - wa);
    let t = Instant::now();
    let outboxed = demo_turns(&mut ws, n, 5).await;
    let elapsed = t.elapsed();
    let w1 = write_bytes(pid);
    let (f1, d1, r1) = (count("fsync"), count("fdatasync"), count("sync_file_range"));
    let trace_text = std::fs::read_to_string(&trace).unwrap_or_default();
    let window: Vec<&str> = trace_text.lines().skip(lines0).collect();
    let blocks = dirty_blocks(&window);
    if let Some(keep) = std::env::var_os("IRIS_BENCH_KEEP_TRACE") {
        // For reading what each sync wrote (docs/storage.md "SD-card wear").
        std::fs::write(keep, window.join("\n")).unwrap();
    }
    drop(ws);
    // strace ignores SIGTERM while it runs a command: stop the gateway itself; strace exits
    // with it.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    gw.stop();
    // What the graceful stop wrote after them: the journal applied, the history database
    // checkpointed (its pages written into the database file once, and fsynced), sled's last
    // flush. The running gateway does the same every `CHECKPOINT_EVERY` (5 minutes) while
    // history changes, so this is the checkpoint those turns cost.
    let settle_blocks = if have_strace {
        let all = std::fs::read_to_string(&trace).unwrap_or_default();
        let tail: Vec<&str> = all.lines().skip(lines0 + window.len()).collect();
        eprintln!("the stop and its checkpoint:");
        dirty_blocks(&tail)
    } else {
        0
    };
    // With strace: the 4 KiB blocks its writes dirtied (see `dirty_blocks`); without it,
    // `/proc/PID/io`, which overstates on kernels with large folios.
    let per_turn = if have_strace {
        (blocks * 4096) as f64 / n as f64
    } else {
        (w1 - w0) as f64 / n as f64
    };
    let fsyncs = (f1 - f0) + (d1 - d0);
    // The plain file: the turn's outboxed frames (their encoded size, as the store keeps them)
    // appended, with one fsync per durable commit the gateway made.
    let frame_bytes = 400 * outboxed / n;
    let commits_per_turn = if have_strace {
        (fsyncs as f64 / n as f64).round().max(1.0) as usize
    } else {
        3
    };
    let plain = {
        use std::io::Write;
        let path = tmp.path().join("plain.log");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let me = std::process::id();
        let w0 = write_bytes(me);
        let chunk = vec![b'x'; (frame_bytes / commits_per_turn).max(1)];
        // The same accounting as the gateway's: distinct 4 KiB blocks dirtied per sync.
        let mut blocks = 0u64;
        let mut at = 0u64;
        for _ in 0..n {
            for _ in 0..commits_per_turn {
                f.write_all(&chunk).unwrap();
                f.sync_data().unwrap();
                blocks += (at + chunk.len() as u64 - 1) / 4096 - at / 4096 + 1;
                at += chunk.len() as u64;
            }
        }
        if have_strace {
            (blocks * 4096) as f64 / n as f64
        } else {
            (write_bytes(me) - w0) as f64 / n as f64
        }
    };
    let mut rows = vec![row(
        format!(
            "bytes written to the block device per demo turn ({n} turns, {:.1} ms each; 4 KiB blocks dirtied per sync, from strace; /proc/PID/io said {:.0} B)",
            elapsed.as_secs_f64() * 1e3 / n as f64,
            (w1 - w0) as f64 / n as f64
        ),
        format!("{per_turn:.0} B"),
        format!(
            "{plain:.0} B (plain file: the turn's frames, {commits_per_turn} append+fdatasync)"
        ),
        per_turn / plain.max(1.0),
    )];
    if have_strace {
        let with_settle = ((blocks + settle_blocks) * 4096) as f64 / n as f64;
        rows.push(row(
            format!("the same, with the history checkpoint that follows them ({n} turns, then a graceful stop: journal applied, SQLite checkpointed, sled flushed)"),
            format!("{with_settle:.0} B"),
            format!("{plain:.0} B (plain file, as above)"),
            with_settle / plain.max(1.0),
        ));
        rows.push(Row {
            what: "sync calls per demo turn (strace: fsync + fdatasync / sync_file_range)".into(),
            value: format!(
                "{:.1} / {:.1}",
                fsyncs as f64 / n as f64,
                (r1 - r0) as f64 / n as f64
            ),
            baseline: "—".into(),
            ratio: "—".into(),
        });
    }
    // SD-card writes per day at a heavy household load: 500 turns and 300 automation posts
    // (one commit each, counted here as a turn: an over-estimate).
    // A quiet household's checkpoint: three turns, then the stop (its checkpoint covers
    // only them), on the same data dir. Every 5 minutes with activity costs one such.
    let quiet_checkpoint = if have_strace {
        let trace2 = tmp.path().join("quiet.txt");
        let trace2_s = trace2.to_string_lossy().into_owned();
        let mut runner2 = runner.clone();
        *runner2.last_mut().unwrap() = &trace2_s;
        let (gw, _) = Gateway::start(tmp.path(), &config(None), Some((&bin, &runner2)));
        let pid = traced_pid(gw.child.id());
        let mut ws = hello(&gw.url, &ids[0], None).await;
        demo_turns(&mut ws, 3, 10_000).await;
        let turns_end = std::fs::read_to_string(&trace2)
            .unwrap_or_default()
            .lines()
            .count();
        drop(ws);
        unsafe {
            libc::kill(pid as i32, libc::SIGTERM);
        }
        gw.stop();
        let all = std::fs::read_to_string(&trace2).unwrap_or_default();
        let tail: Vec<&str> = all.lines().skip(turns_end).collect();
        eprintln!("a checkpoint after three turns:");
        dirty_blocks(&tail) * 4096
    } else {
        0
    };
    if have_strace {
        rows.push(Row {
            what: "a history checkpoint after three turns (a quiet household's 5 minutes: the journal applied, SQLite checkpointed, sled flushed)".into(),
            value: format!("{quiet_checkpoint} B"),
            baseline: "—".into(),
            ratio: "—".into(),
        });
    }
    // 800 turns and posts a day over 16 waking hours: activity in every 5 minutes of them,
    // so 192 checkpoints a day, each like the quiet one above.
    let per_day_row = |what: &str, per_turn: f64| {
        let per_day = per_turn * 800.0 + quiet_checkpoint as f64 * 192.0;
        Row {
            what: what.into(),
            value: format!("{:.0} MB", per_day / 1e6),
            baseline: format!("{:.0} MB (plain file, 800 turns)", plain * 800.0 / 1e6),
            ratio: format!("{:.2}", per_day / (plain * 800.0).max(1.0)),
        }
    };
    rows.push(per_day_row(
        "SD writes per day at 500 turns + 300 automation posts (800 × the per-turn figure + 192 quiet checkpoints)",
        per_turn,
    ));
    if have_strace {
        let (long_rows, long_per_turn) = long_turns_rows(opts).await;
        rows.extend(long_rows);
        // A store months old: the long run's figure (its own checkpoints included, so this
        // counts them twice, an over-estimate of ~1.5 KB a turn).
        if let Some(long) = long_per_turn {
            rows.push(per_day_row(
                "the same at the long run's per-turn figure (a store whose outbox is full)",
                long,
            ));
        }
    }
    print("Writes per turn", &rows);
}

/// Idle RSS, and RSS with `n` idle devices connected (kB).
async fn rss_with_devices(counts: &[usize]) -> (u64, Vec<(usize, u64)>) {
    let max = counts.iter().copied().max().unwrap_or(0);
    let tmp = tempfile::tempdir().unwrap();
    let ids = pair_devices(tmp.path(), max);
    let (gw, _) = Gateway::start(tmp.path(), &config(None), None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = gw.status_kb("VmRSS");
    let mut open = Vec::new();
    let mut out = Vec::new();
    for &n in counts {
        while open.len() < n {
            open.push(hello(&gw.url, &ids[open.len()], None).await);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        out.push((n, gw.status_kb("VmRSS")));
    }
    drop(open);
    gw.stop();
    (idle, out)
}

/// Each target's stripped release binary that is named, with the previous build's of it.
fn binary_sizes() -> Vec<BinarySize> {
    let arm = |var: &str| std::env::var_os(var).map(PathBuf::from);
    let previous = previous_build();
    let commit = previous
        .as_ref()
        .map(|(_, c)| c.clone())
        .unwrap_or_default();
    let len = |p: Option<PathBuf>| p.and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len());
    [
        (
            std::env::consts::ARCH,
            native_release(),
            previous.map(|(bin, _)| bin),
        ),
        (
            "aarch64",
            arm("IRIS_BENCH_AARCH64"),
            arm("IRIS_BENCH_PREVIOUS_AARCH64"),
        ),
        (
            "armv7",
            arm("IRIS_BENCH_ARMV7"),
            arm("IRIS_BENCH_PREVIOUS_ARMV7"),
        ),
    ]
    .into_iter()
    .filter_map(|(target, this, before)| {
        Some(BinarySize {
            target,
            bytes: len(this)?,
            previous: len(before).map(|b| (b, commit.clone())),
        })
    })
    .collect()
}

/// One target's stripped release binary, and the previous build's when one is named.
struct BinarySize {
    target: &'static str,
    bytes: u64,
    previous: Option<(u64, String)>,
}

/// Issue 37's goals for the stripped binaries (bytes); armv7 has none.
fn size_goal(target: &str) -> Option<u64> {
    match target {
        "x86_64" => Some(10_000_000),
        "aarch64" => Some(9_000_000),
        _ => None,
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{} ({}), {cores} cores", std::env::consts::ARCH, cpu)
}

fn print(title: &str, rows: &[Row]) {
    println!("\n### {title}\n");
    println!("| figure | value | baseline (same run) | ratio |");
    println!("|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} |",
            r.what, r.value, r.baseline, r.ratio
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--bare-relay") {
        let number =
            |j: usize| -> usize { args[i + j].parse().expect("--bare-relay AGENT_URL N K") };
        bare_relay_main(&args[i + 1], number(2), number(3));
        return;
    }
    let opts = Opts {
        quick: args.iter().any(|a| a == "--quick"),
        only: args
            .iter()
            .position(|a| a == "--only")
            .and_then(|i| args.get(i + 1).cloned()),
        scale: args
            .iter()
            .position(|a| a == "--scale")
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(if args.iter().any(|a| a == "--quick") {
                5_000
            } else {
                50_000
            }),
        rounds: args
            .iter()
            .position(|a| a == "--rounds")
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .filter(|&n| n > 0),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, run(opts));
}

async fn run(opts: Opts) {
    let epoch = Instant::now();
    let turns = if opts.quick { 2 } else { 10 };
    println!("## Gateway end to end ({})", machine());

    if opts.wants("fanout") {
        fan_out_section(&opts, turns, epoch).await;
    }
    if opts.wants("stalled") {
        stalled_section(turns, epoch).await;
    }
    if opts.wants("catchup") {
        catch_up_section(&opts).await;
    }
    if opts.wants("scale") {
        scale_section(&opts).await;
    }
    if opts.wants("queries") {
        query_section().await;
    }
    if opts.wants("burst") {
        burst_section(&opts).await;
    }
    if opts.wants("turns") {
        turns_section(&opts).await;
    }
    if opts.wants("memory") {
        memory_section(&opts).await;
    }
    if opts.wants("previous") {
        previous_section(&opts, epoch).await;
    }
    if opts.wants("sizes") {
        sizes_section();
    }
    if opts.wants("stream") {
        stream_section(&opts).await;
    }
}

/// Turn fan-out against the bare broadcast, and the aarch64 build's under qemu-user.
async fn fan_out_section(opts: &Opts, turns: usize, epoch: Instant) {
    let mut rows = Vec::new();
    let fanouts: &[usize] = if opts.quick { &[1, 10] } else { &[1, 10, 50] };
    for &n in fanouts {
        let g = gateway_fan_out(n, turns, None, epoch).await;
        let b = bare_fan_out(n, turns, epoch).await;
        rows.push(row(
            format!("fan-out to {n} device(s): frames/s delivered"),
            format!("{:.0}", g.frames_per_sec),
            format!("{:.0} (bare tokio-tungstenite broadcast)", b.frames_per_sec),
            g.frames_per_sec / b.frames_per_sec,
        ));
        rows.push(row(
            format!("fan-out to {n} device(s): latency p50 / p99, agent chunk → device"),
            format!(
                "{:.2} / {:.2} ms",
                g.p50_us as f64 / 1e3,
                g.p99_us as f64 / 1e3
            ),
            format!(
                "{:.2} / {:.2} ms",
                b.p50_us as f64 / 1e3,
                b.p99_us as f64 / 1e3
            ),
            g.p99_us as f64 / b.p99_us.max(1) as f64,
        ));
    }
    // The aarch64 figure needs a build of this very source: benches/regenerate makes one with
    // .ci/cross's toolchain and names it here (a binary lying around may be stale).
    if let Some(aarch64) = std::env::var_os("IRIS_BENCH_AARCH64").map(PathBuf::from) {
        let runner: &[&str] = &["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"];
        let g = gateway_fan_out(10, turns, Some((&aarch64, runner)), epoch).await;
        let b = bare_fan_out(10, turns, epoch).await;
        rows.push(row(
            "fan-out to 10 devices, aarch64 binary under qemu-user: frames/s",
            format!("{:.0}", g.frames_per_sec),
            format!("{:.0} (bare broadcast, native)", b.frames_per_sec),
            g.frames_per_sec / b.frames_per_sec,
        ));
    }
    print(
        "Turn fan-out (scripted agent streaming as fast as it can, 200 chunks a turn)",
        &rows,
    );
}

/// Peak memory and coalescing with one device that never reads.
async fn stalled_section(turns: usize, epoch: Instant) {
    let mut rows = Vec::new();
    let (calm_peak, _) = stalled_run(false, turns, epoch).await;
    let (stalled_peak, coalesced) = stalled_run(true, turns, epoch).await;
    rows.push(row(
        "peak RSS, 10 devices, one stalled (4 KiB receive buffer, never read)",
        format!("{:.1} MiB", stalled_peak as f64 / 1024.0),
        format!(
            "{:.1} MiB (10 devices, none stalled)",
            calm_peak as f64 / 1024.0
        ),
        stalled_peak as f64 / calm_peak.max(1) as f64,
    ));
    rows.push(Row {
        what: "message.update frames coalesced for the stalled device".into(),
        value: coalesced.to_string(),
        baseline: format!("{} streamed per device", turns * CHUNKS_PER_TURN),
        ratio: format!("{:.3}", coalesced as f64 / (turns * CHUNKS_PER_TURN) as f64),
    });
    print("A stalled device", &rows);
}

/// Sync replay, history paging and cold start at scale.
async fn catch_up_section(opts: &Opts) {
    let mut rows = Vec::new();
    let n = if opts.quick { 1000 } else { 10_000 };
    let g = gateway_sync(n, None).await;
    let b = bare_sync(n).await;
    rows.push(row(
        format!("sync replay of {n} frames"),
        format!("{:.0} ms", g.as_secs_f64() * 1e3),
        format!("{:.0} ms (bare stack, same frames)", b.as_secs_f64() * 1e3),
        g.as_secs_f64() / b.as_secs_f64(),
    ));
    print("Catching up", &rows);
}

/// Idle RSS and RSS per connected idle device; idle RSS on an empty store and after the owner's
/// work, this build's release binary (the bench's own in a release bench build, else
/// `IRIS_BENCH_NATIVE`) against the previous build (`IRIS_BENCH_PREVIOUS`) when
/// benches/regenerate names one.
async fn memory_section(opts: &Opts) {
    let mut rows = Vec::new();
    let counts: &[usize] = if opts.quick { &[20] } else { &[100, 500] };
    let (idle, with) = rss_with_devices(counts).await;
    rows.push(Row {
        what: "idle RSS (no device)".into(),
        value: format!("{:.1} MiB", idle as f64 / 1024.0),
        baseline: "—".into(),
        ratio: "—".into(),
    });
    for (n, rss) in with {
        let per = rss.saturating_sub(idle) as f64 / n as f64;
        rows.push(row(
            format!("RSS per connected idle device, {n} devices"),
            format!("{per:.1} KiB"),
            format!("{:.1} MiB idle RSS", idle as f64 / 1024.0),
            per / idle.max(1) as f64,
        ));
    }
    let settle = if opts.quick {
        Duration::from_secs(2)
    } else {
        ADMIN_SETTLE
    };
    // A release build's figures, also from a `--profile dev` run that names one.
    let this = owner_work_memory(native_release().as_deref(), settle).await;
    let previous = match previous_build() {
        Some((bin, commit)) => Some((owner_work_memory(Some(&bin), settle).await, commit)),
        None => None,
    };
    let mib = |kb: u64| format!("{:.1} MiB", kb as f64 / 1024.0);
    let against = |what: &str, value: u64, before: Option<(u64, &str)>| match before {
        Some((b, commit)) => row(
            what,
            mib(value),
            format!("{} (previous build, {commit})", mib(b)),
            value as f64 / b.max(1) as f64,
        ),
        None => Row {
            what: what.into(),
            value: mib(value),
            baseline: "— (no previous build named)".into(),
            ratio: "—".into(),
        },
    };
    let prev = |pick: fn(&OwnerWorkMemory) -> u64| {
        previous
            .as_ref()
            .map(|(m, commit)| (pick(m), commit.as_str()))
    };
    rows.push(against(
        "VmRSS idle on an empty store (1 s after start)",
        this.idle_kb,
        prev(|m| m.idle_kb),
    ));
    rows.push(against(
        &format!(
            "VmRSS {} s after the owner's work (claim, 3 sign-ins, passphrase change, 3 strength \
             checks, Back up now, a restore tried, an update check)",
            settle.as_secs()
        ),
        this.after_kb,
        prev(|m| m.after_kb),
    ));
    rows.push(against(
        "RssAnon after the owner's work (the heap's share of the row above)",
        this.after_anon_kb,
        prev(|m| m.after_anon_kb),
    ));
    rows.push(against(
        "VmHWM during the owner's work (its peak)",
        this.peak_kb,
        prev(|m| m.peak_kb),
    ));
    print("Memory", &rows);
}

/// How long the gateway idles after the owner's work before its memory is read: the issue's
/// goal is set 10 s after (tokio's blocking threads outlive their work by 10 s).
const ADMIN_SETTLE: Duration = Duration::from_secs(10);

/// The previous build benches/regenerate made (`--previous REF`): its binary and commit.
fn previous_build() -> Option<(PathBuf, String)> {
    let bin = PathBuf::from(std::env::var_os("IRIS_BENCH_PREVIOUS")?);
    let commit = std::env::var("IRIS_BENCH_PREVIOUS_COMMIT").unwrap_or_else(|_| "?".into());
    Some((bin, commit))
}

struct OwnerWorkMemory {
    idle_kb: u64,
    after_kb: u64,
    after_anon_kb: u64,
    peak_kb: u64,
}

/// One gateway (this build's, or `bin`) on an empty store: VmRSS at idle, then the owner's work
/// on the admin page over HTTP, then VmRSS and RssAnon `settle` later and the peak.
async fn owner_work_memory(bin: Option<&Path>, settle: Duration) -> OwnerWorkMemory {
    const OWNER: &str = "violet tractor harbour 42";
    const NEW_OWNER: &str = "a much better passphrase";
    const BACKUP: &str = "otter lantern meadow 1987";
    let tmp = tempfile::tempdir().unwrap();
    let folder = tempfile::tempdir().unwrap();
    let (gw, _) = Gateway::start(tmp.path(), &config(None), bin.map(|b| (b, &[][..])));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_kb = gw.status_kb("VmRSS");
    let addr = gw.url.trim_start_matches("ws://").parse().unwrap();
    let mut web = common::web::Web::at(addr, "127.0.0.1");
    assert_eq!(web.claim(OWNER).await.status, 200, "the claim");
    for _ in 0..3 {
        assert_eq!(web.sign_in(OWNER).await.status, 303, "a sign-in");
    }
    let csrf = web.csrf().await;
    for guess in ["password123456", "correct horse battery staple", NEW_OWNER] {
        let (status, _) = web.strength(&csrf, guess).await;
        assert_eq!(status, 200, "a strength check");
    }
    web.post(
        "/admin/passphrase",
        &[
            ("csrf", &csrf),
            ("current", OWNER),
            ("passphrase", NEW_OWNER),
            ("confirm", NEW_OWNER),
        ],
    )
    .await;
    assert_eq!(
        web.sign_in(NEW_OWNER).await.status,
        303,
        "the new passphrase"
    );
    let form = |r: common::web::Reply| assert_eq!(r.status, 303, "{r:?}");
    form(
        web.post_csrf(
            "/admin/backup/passphrase",
            &[("passphrase", BACKUP), ("confirm", BACKUP)],
        )
        .await,
    );
    let f = folder.path().to_str().unwrap();
    form(
        web.post_csrf(
            "/admin/backup/schedule",
            &[("schedule", "off"), ("folder", f), ("keep", "7")],
        )
        .await,
    );
    form(web.post_csrf("/admin/backup/now", &[]).await);
    web.job_outcome("backup").await;
    let made = std::fs::read_dir(folder.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".age"))
        .expect("the backup Back up now wrote");
    // The restore's work (the backup's key derived, the file read) without the restart a right
    // passphrase ends in: a restarted process would say nothing of what the work kept.
    form(
        web.post_csrf(
            "/admin/backup/restore-scheduled",
            &[("file", &made), ("passphrase", "not the passphrase 000")],
        )
        .await,
    );
    web.job_outcome("restore").await;
    // An update check that finds no server (nothing listens on port 9): the HTTPS client's set-up.
    form(
        web.post_csrf(
            "/admin/update/source",
            &[("url", "https://127.0.0.1:9/index.json")],
        )
        .await,
    );
    form(web.post_csrf("/admin/update/check", &[]).await);
    web.job_outcome("update-check").await;
    tokio::time::sleep(settle).await;
    let out = OwnerWorkMemory {
        idle_kb,
        after_kb: gw.status_kb("VmRSS"),
        after_anon_kb: gw.status_kb("RssAnon"),
        peak_kb: gw.status_kb("VmHWM"),
    };
    gw.stop();
    out
}

// ---------------------------------------------------------------------------------------------
// Against the previous build: the hot paths through both binaries, interleaved in one run
// ---------------------------------------------------------------------------------------------

/// The hot paths a refactor must not slow, each measured through the real binary and the
/// real protocol.
#[derive(Clone, Copy)]
enum HotPath {
    /// `message.send` to the demo answer's `message.stop`, turns back to back: ms a turn.
    DemoTurn,
    /// The scripted agent's turns watched by 10 devices: frames/s delivered.
    FanOut,
    /// `sync{cursor:0}` over a stored history: ms for the whole replay.
    SyncReplay,
    /// GET of the admin's Status page (`/admin/`) signed in: ms a request.
    StatusPage,
}

const HOT_PATHS: [HotPath; 4] = [
    HotPath::DemoTurn,
    HotPath::FanOut,
    HotPath::SyncReplay,
    HotPath::StatusPage,
];

/// How much of each hot path one round measures, and how many rounds each build runs.
struct HotPathSizes {
    rounds: usize,
    demo_turns: usize,
    fan_out_turns: usize,
    sync_frames: usize,
    page_gets: usize,
}

impl HotPathSizes {
    fn for_run(opts: &Opts) -> HotPathSizes {
        let quick = opts.quick;
        HotPathSizes {
            // One round has no spread to judge a ratio by.
            rounds: opts.rounds.unwrap_or(if quick { 3 } else { 5 }).max(2),
            demo_turns: if quick { 20 } else { 50 },
            fan_out_turns: if quick { 2 } else { 5 },
            sync_frames: if quick { 1_000 } else { 5_000 },
            page_gets: if quick { 20 } else { 50 },
        }
    }
}

impl HotPath {
    fn what(self, sizes: &HotPathSizes) -> String {
        match self {
            HotPath::DemoTurn => format!(
                "demo turn, `message.send` → `message.stop` ({} turns back to back): ms a turn",
                sizes.demo_turns
            ),
            HotPath::FanOut => format!(
                "fan-out to 10 devices ({} scripted turns of {CHUNKS_PER_TURN} chunks): frames/s",
                sizes.fan_out_turns
            ),
            HotPath::SyncReplay => {
                format!("`sync` replay of {} stored frames: ms", sizes.sync_frames)
            }
            HotPath::StatusPage => format!(
                "admin Status page, GET `/admin/` signed in ({} requests): ms a request (median)",
                sizes.page_gets
            ),
        }
    }

    /// One measurement through the binary `bin`, on a new store, in the path's unit.
    async fn measure(self, bin: &Path, sizes: &HotPathSizes, epoch: Instant) -> f64 {
        match self {
            HotPath::DemoTurn => demo_turn_ms(bin, sizes.demo_turns).await,
            HotPath::FanOut => {
                gateway_fan_out(10, sizes.fan_out_turns, Some((bin, &[][..])), epoch)
                    .await
                    .frames_per_sec
            }
            HotPath::SyncReplay => {
                gateway_sync(sizes.sync_frames, Some(bin))
                    .await
                    .as_secs_f64()
                    * 1e3
            }
            HotPath::StatusPage => status_page_ms(bin, sizes.page_gets).await,
        }
    }
}

/// Demo turns (`pace_ms = 0`) one after another on one device, after two that warm it up.
async fn demo_turn_ms(bin: &Path, turns: usize) -> f64 {
    const WARM_UP: usize = 2;
    let tmp = tempfile::tempdir().unwrap();
    let ids = pair_devices(tmp.path(), 1);
    let (gw, _) = Gateway::start(tmp.path(), &config(None), Some((bin, &[][..])));
    let mut ws = hello(&gw.url, &ids[0], None).await;
    demo_turns(&mut ws, WARM_UP, 0).await;
    let t = Instant::now();
    demo_turns(&mut ws, turns, WARM_UP).await;
    let ms = t.elapsed().as_secs_f64() * 1e3 / turns as f64;
    gw.stop();
    ms
}

/// The median of `gets` GETs of the Status page in a session the claim opened (one request a
/// connection, as the tests' browser sends them), after one that warms it up.
async fn status_page_ms(bin: &Path, gets: usize) -> f64 {
    let tmp = tempfile::tempdir().unwrap();
    let (gw, _) = Gateway::start(tmp.path(), &config(None), Some((bin, &[][..])));
    let addr = gw.url.trim_start_matches("ws://").parse().unwrap();
    let mut web = common::web::Web::at(addr, "127.0.0.1");
    assert_eq!(
        web.claim("violet tractor harbour 42").await.status,
        200,
        "the claim"
    );
    let mut took = Vec::with_capacity(gets);
    for i in 0..=gets {
        let t = Instant::now();
        let page = web.get("/admin/").await;
        let us = t.elapsed().as_micros() as u64;
        assert_eq!(page.status, 200, "the Status page: {page:?}");
        if i > 0 {
            took.push(us);
        }
    }
    gw.stop();
    percentile(&mut took, 0.5) as f64 / 1e3
}

/// One figure's rounds through one build.
struct Rounds(Vec<f64>);

impl Rounds {
    fn median(&self) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        if v.len().is_multiple_of(2) {
            (v[mid - 1] + v[mid]) / 2.0
        } else {
            v[mid]
        }
    }

    /// Round-to-round spread: (max − min) ÷ median.
    fn spread(&self) -> f64 {
        let min = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (max - min) / self.median()
    }

    fn describe(&self) -> String {
        let min = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!(
            "{} ({} – {})",
            figure(self.median()),
            figure(min),
            figure(max)
        )
    }
}

/// A figure with as many decimals as its size deserves.
fn figure(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The hot paths through this build's release binary and the previous build's, interleaved
/// (each round runs every path through both, first one build then the other, the order
/// swapped every round, so the machine's drift falls on both), each figure reported as its
/// median over the rounds with its spread, the ratio this ÷ previous, and whether that ratio
/// is within the run's own noise: the previous build's round-to-round spread.
async fn previous_section(opts: &Opts, epoch: Instant) {
    const TITLE: &str = "Hot paths against the previous build (interleaved, same run)";
    let Some((previous, commit)) = previous_build() else {
        println!(
            "\n### {TITLE}\n\nNot run: no previous build named (`benches/regenerate --previous \
             REF`, or `IRIS_BENCH_PREVIOUS`)."
        );
        return;
    };
    // A debug binary beside a release one would measure the profile, not the change.
    let Some(this) = native_release() else {
        println!(
            "\n### {TITLE}\n\nNot run: this is a debug bench build; name this build's release \
             binary in `IRIS_BENCH_NATIVE`."
        );
        return;
    };
    let sizes = HotPathSizes::for_run(opts);
    let mut this_rounds: Vec<Rounds> = HOT_PATHS.iter().map(|_| Rounds(Vec::new())).collect();
    let mut previous_rounds: Vec<Rounds> = HOT_PATHS.iter().map(|_| Rounds(Vec::new())).collect();
    for round in 0..sizes.rounds {
        for (i, path) in HOT_PATHS.iter().enumerate() {
            let this_first = round.is_multiple_of(2);
            for on_this in [this_first, !this_first] {
                if on_this {
                    this_rounds[i]
                        .0
                        .push(path.measure(&this, &sizes, epoch).await);
                } else {
                    previous_rounds[i]
                        .0
                        .push(path.measure(&previous, &sizes, epoch).await);
                }
            }
        }
    }
    println!("\n### {TITLE}\n");
    println!(
        "{} rounds; each cell is the median (min – max) of its rounds; within noise: \
         |ratio − 1| ≤ the previous build's (max − min) ÷ median.\n",
        sizes.rounds
    );
    println!(
        "| figure | this build | previous build ({commit}) | ratio this ÷ previous | noise (previous's spread) | within noise |"
    );
    println!("|---|---|---|---|---|---|");
    for (i, path) in HOT_PATHS.iter().enumerate() {
        let (now, before) = (&this_rounds[i], &previous_rounds[i]);
        let ratio = now.median() / before.median();
        let noise = before.spread();
        let verdict = if (ratio - 1.0).abs() <= noise {
            "yes"
        } else if ratio > 1.0 {
            "no: higher"
        } else {
            "no: lower"
        };
        println!(
            "| {} | {} | {} | {ratio:.3} | ±{:.1}% | {verdict} |",
            path.what(&sizes),
            now.describe(),
            before.describe(),
            noise * 100.0
        );
    }
}

/// Stripped binary sizes: this build's release binaries (the bench's own in a release bench
/// build, else `IRIS_BENCH_NATIVE`; the ARM ones from `IRIS_BENCH_AARCH64` / `IRIS_BENCH_ARMV7`)
/// beside the previous build's when named (`IRIS_BENCH_PREVIOUS`, and for ARM
/// `IRIS_BENCH_PREVIOUS_AARCH64` / `IRIS_BENCH_PREVIOUS_ARMV7`), each against its goal.
fn sizes_section() {
    let rows: Vec<Row> = binary_sizes()
        .into_iter()
        .map(|b| {
            let goal = match size_goal(b.target) {
                Some(g) => format!(
                    " (goal ≤ {g} B: {})",
                    if b.bytes <= g { "met" } else { "missed" }
                ),
                None => String::new(),
            };
            let what = format!("stripped release binary, {}{goal}", b.target);
            match b.previous {
                Some((before, commit)) => row(
                    what,
                    format!("{} B", b.bytes),
                    format!("{before} B (previous build, {commit})"),
                    b.bytes as f64 / before.max(1) as f64,
                ),
                None => Row {
                    what,
                    value: format!("{} B", b.bytes),
                    baseline: "— (no previous build named)".into(),
                    ratio: "—".into(),
                },
            }
        })
        .collect();
    print("Release binaries (stripped)", &rows);
}

// ---------------------------------------------------------------------------------------------
// Streamed answers: what a device receives for one answer
// ---------------------------------------------------------------------------------------------

/// An OpenAI-compatible server that streams `tokens` tokens (" w1", " w2", ...: ~5.3 bytes
/// each, like the 8.5 KB of a 1,500-token answer) at `rate` tokens a second (0: as fast as it
/// can), and notes when it sent the first one.
async fn paced_agent(tokens: usize, rate: u32, first: Rc<Cell<Option<Instant>>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::task::spawn_local(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let first = first.clone();
            tokio::task::spawn_local(async move {
                if !open_stream(&mut tcp).await {
                    return;
                }
                let start = tokio::time::Instant::now();
                for i in 1..=tokens {
                    if rate > 0 {
                        let at = start + Duration::from_secs_f64(i as f64 / rate as f64);
                        tokio::time::sleep_until(at).await;
                    }
                    let chunk = json!({"choices": [{"delta": {"content": format!(" w{i}")}}]});
                    if first.get().is_none() {
                        first.set(Some(Instant::now()));
                    }
                    if tcp
                        .write_all(format!("data: {chunk}\n\n").as_bytes())
                        .await
                        .is_err()
                    {
                        return;
                    }
                    if rate == 0 {
                        tokio::task::yield_now().await;
                    }
                }
                end_stream(&mut tcp, tokens).await;
            });
        }
    });
    format!("http://{addr}/v1")
}

/// What one device received of one streamed answer.
#[derive(Default, Clone)]
struct StreamSeen {
    update_bytes: usize,
    updates: usize,
    answer_bytes: usize,
    answers: usize,
    first_update: Option<Instant>,
}

/// Reads `answers` answers: every `message.update` (reassembled when in the append form, and
/// checked against `message.stop`'s text), until the last `message.stop`.
async fn watch_stream(mut ws: Ws, answers: usize) -> StreamSeen {
    let mut seen = StreamSeen::default();
    let mut text = String::new();
    loop {
        let f = recv_json(&mut ws).await;
        let p = &f["payload"];
        match f["type"].as_str() {
            Some("message.update") => {
                seen.first_update.get_or_insert_with(Instant::now);
                seen.updates += 1;
                seen.update_bytes += f.to_string().len();
                let part = p["text"].as_str().unwrap_or("");
                text = match p["append_at"].as_u64() {
                    Some(at) => text.chars().take(at as usize).collect::<String>() + part,
                    None => part.to_owned(),
                };
            }
            Some("message.stop") => {
                let fin = p["final_text"].as_str().unwrap_or("");
                assert!(
                    fin.starts_with(&text),
                    "updates are not a prefix of the final text"
                );
                seen.answer_bytes += fin.len();
                seen.answers += 1;
                text.clear();
                if seen.answers == answers {
                    return seen;
                }
            }
            _ => {}
        }
    }
}

/// CPU seconds a process has used (user + system), from `/proc/PID/stat`.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat (utime, stime) are 12 and 13 after the `)`.
    (ticks(11) + ticks(12)) / 100.0
}

/// One streamed answer as `n` whole-text and `n` append devices in one lane saw it.
struct StreamRun {
    whole: Vec<StreamSeen>,
    append: Vec<StreamSeen>,
    /// The agent's first token → device 0's first update.
    first_update: Duration,
    /// Gateway CPU seconds (user + system) from the `message.send` to the last `message.stop`.
    cpu: f64,
}

/// `answers` streamed answers (sent at once, so they queue in the lane) to `n` whole-text and
/// `n` append devices in one lane, through `bin` (this build's binary when `None`).
async fn stream_run(
    n: usize,
    tokens: usize,
    rate: u32,
    update_ms: Option<u64>,
    bin: Option<(&Path, &[&str])>,
    answers: usize,
) -> StreamRun {
    let tmp = tempfile::tempdir().unwrap();
    let ids = pair_devices(tmp.path(), 2 * n);
    let first = Rc::new(Cell::new(None));
    let agent = paced_agent(tokens, rate, first.clone()).await;
    let mut cfg = config(Some(&agent));
    if let Some(ms) = update_ms {
        cfg = cfg.replace(
            "stream_update_ms = 0\n",
            &format!("stream_update_ms = {ms}\n"),
        );
    } else {
        cfg = cfg.replace("stream_update_ms = 0\n", "");
    }
    let (gw, _) = Gateway::start(tmp.path(), &cfg, bin);
    let mut whole = Vec::new();
    let mut append = Vec::new();
    for (i, d) in ids.iter().enumerate() {
        let mut ws = connect(&gw.url, None).await;
        let mut payload = json!({"token": d.1, "device_id": d.0, "device_name": "bench"});
        if i >= n {
            payload["caps"] = json!({"extensions": ["update_append"]});
        }
        let hello = json!({"v": 1, "type": "hello", "id": 1, "payload": payload});
        ws.send(Message::text(hello.to_string())).await.unwrap();
        while recv_json(&mut ws).await["type"] != "hello.ack" {}
        if i < n {
            whole.push(ws);
        } else {
            append.push(ws);
        }
    }
    for i in 0..answers {
        let m = json!({"v":1,"type":"message.send","id": 10 + i,"chat_id":"default","payload":{"text": "stream"}});
        whole[0].send(Message::text(m.to_string())).await.unwrap();
    }
    let cpu0 = cpu_secs(gw.child.id());
    let w: Vec<_> = whole
        .into_iter()
        .map(|ws| tokio::task::spawn_local(watch_stream(ws, answers)))
        .collect();
    let a: Vec<_> = append
        .into_iter()
        .map(|ws| tokio::task::spawn_local(watch_stream(ws, answers)))
        .collect();
    let mut ws_seen = Vec::new();
    for t in w {
        ws_seen.push(t.await.unwrap());
    }
    let mut a_seen = Vec::new();
    for t in a {
        a_seen.push(t.await.unwrap());
    }
    let cpu = cpu_secs(gw.child.id()) - cpu0;
    gw.stop();
    let first_update = ws_seen[0]
        .first_update
        .zip(first.get())
        .map(|(u, f)| u.saturating_duration_since(f))
        .unwrap_or_default();
    StreamRun {
        whole: ws_seen,
        append: a_seen,
        first_update,
        cpu,
    }
}

// The bare relay: the baseline for the gateway's CPU on a streamed answer.

/// `--bare-relay AGENT_URL N K`: the smallest program that does the gateway's streaming job
/// without the gateway. It takes N WebSocket clients, and when the first sends anything (as a
/// turn starts at `message.send`) asks the agent for K streamed completions over HTTP, one
/// after the other, writing each chunk's text to every client as a text frame; then it closes
/// them and waits for stdin to end, so its CPU can be read after the answers. No envelope, pacing, store, lanes or
/// auth: what is left is what any relay of this stream pays (SSE parsing, JSON, WebSocket
/// frames). A process of its own on a current_thread runtime, as the gateway is, and measured
/// the same way (`cpu_secs`).
fn bare_relay_main(agent: &str, n: usize, answers: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("ws://{}", listener.local_addr().unwrap());
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            let (tcp, _) = listener.accept().await.unwrap();
            let _ = tcp.set_nodelay(true);
            clients.push(tokio_tungstenite::accept_async(tcp).await.unwrap());
        }
        loop {
            match clients[0].next().await {
                Some(Ok(Message::Text(_))) => break,
                Some(Ok(_)) => continue,
                _ => return,
            }
        }
        let authority = agent
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        for _ in 0..answers {
            relay_answer(&authority, &mut clients).await;
        }
        for c in clients.iter_mut() {
            let _ = c.close(None).await;
        }
    });
    let _ = std::io::Read::read(&mut std::io::stdin(), &mut [0u8; 1]);
}

/// One streamed completion from the agent, chunk by chunk to every client.
async fn relay_answer(
    authority: &str,
    clients: &mut [tokio_tungstenite::WebSocketStream<TcpStream>],
) {
    let mut tcp = TcpStream::connect(&authority).await.unwrap();
    let body = r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"stream"}]}"#;
    let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut buf: Vec<u8> = Vec::new();
    let mut read = vec![0u8; 16 * 1024];
    let mut in_body = false;
    'stream: loop {
        let got = tcp.read(&mut read).await.unwrap_or(0);
        if got == 0 {
            break;
        }
        buf.extend_from_slice(&read[..got]);
        if !in_body {
            let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            buf.drain(..i + 4);
            in_body = true;
        }
        while let Some(i) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..i + 2).collect();
            let Some(data) = event[..i].strip_prefix(b"data: ") else {
                continue;
            };
            if data == b"[DONE]" {
                break 'stream;
            }
            let chunk: Value = serde_json::from_slice(data).unwrap();
            if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str() {
                let frame = Message::text(text);
                for c in clients.iter_mut() {
                    c.send(frame.clone()).await.unwrap();
                }
            }
        }
    }
}

/// `answers` streamed answers through the bare relay to `n` clients: (relay CPU seconds from
/// the first client's request to the last client's close, text frames per client and answer).
/// Every client must end with the agent's text exactly.
async fn relay_run(n: usize, tokens: usize, rate: u32, answers: usize) -> (f64, usize) {
    let agent = paced_agent(tokens, rate, Rc::new(Cell::new(None))).await;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--bare-relay", &agent, &n.to_string(), &answers.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the bare relay");
    let mut url = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(connect(url.trim(), None).await);
    }
    clients[0].send(Message::text("go")).await.unwrap();
    let cpu0 = cpu_secs(child.id());
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut ws| {
            tokio::task::spawn_local(async move {
                let (mut text, mut frames) = (String::new(), 0);
                while let Some(Ok(m)) = ws.next().await {
                    if let Message::Text(t) = m {
                        text.push_str(&t);
                        frames += 1;
                    }
                }
                (text, frames)
            })
        })
        .collect();
    let want: String = (1..=tokens)
        .map(|i| format!(" w{i}"))
        .collect::<String>()
        .repeat(answers);
    let mut frames = 0;
    for t in tasks {
        let (text, f) = t.await.unwrap();
        assert!(text == want, "the bare relay lost text");
        frames = f / answers;
    }
    let cpu = cpu_secs(child.id()) - cpu0;
    drop(child.stdin.take());
    let _ = child.wait();
    (cpu, frames)
}

/// Per device and answer, averaged over both: (bytes in updates, updates, the answer's bytes).
fn update_ratio(seen: &[StreamSeen]) -> (f64, f64, f64) {
    let n = (seen.len() * seen[0].answers) as f64;
    let bytes = seen.iter().map(|s| s.update_bytes).sum::<usize>() as f64 / n;
    let updates = seen.iter().map(|s| s.updates).sum::<usize>() as f64 / n;
    let answer = seen[0].answer_bytes as f64 / seen[0].answers as f64;
    (bytes, updates, answer)
}

/// The release binary of this machine's architecture to set beside the aarch64 one:
/// `IRIS_BENCH_NATIVE`, else this build's binary when it is a release build (a debug binary
/// beside a release one would measure the profile, not the architecture).
fn native_release() -> Option<PathBuf> {
    std::env::var_os("IRIS_BENCH_NATIVE")
        .map(PathBuf::from)
        .or_else(|| (!cfg!(debug_assertions)).then(|| env!("CARGO_BIN_EXE_iris-gateway").into()))
}

/// Bytes a device receives per streamed answer, whole-text and append, at a fast provider's
/// pace and as fast as the agent can stream; gateway CPU against a bare relay of the same
/// stream (and the unpaced gateway, `stream_update_ms = 0`, how every token was sent before
/// pacing); time to the first update against the unpaced gateway; and, when
/// `IRIS_BENCH_AARCH64` names an aarch64 build, its CPU and bytes under qemu-user against the
/// native release binary in the same run.
async fn stream_section(opts: &Opts) {
    let tokens = if opts.quick { 300 } else { 1500 };
    // CPU is read in clock ticks (10 ms), and a full-speed answer costs a few: the CPU rows
    // stream this many answers back to back, so each figure is some 30 ticks or more.
    let answers_at = |rate: u32| if rate == 0 { 30 } else { 3 };
    let per_1000 = |cpu: f64, answers: usize| cpu * 1000.0 / (tokens * answers) as f64;
    let mut rows = Vec::new();
    for (rate, pace) in [(100, "100 tokens/s"), (0, "full speed")] {
        for n in [1, 10] {
            let run = stream_run(n, tokens, rate, None, None, 1).await;
            for (form, seen) in [("whole text", &run.whole), ("append", &run.append)] {
                let (bytes, updates, answer) = update_ratio(seen);
                rows.push(row(
                    format!("{pace}, {n} device(s) per form: update bytes per device ({form})"),
                    format!("{:.1} KB in {updates:.0} updates", bytes / 1e3),
                    format!("{:.1} KB (the answer)", answer / 1e3),
                    bytes / answer,
                ));
            }
            if n < 10 {
                continue;
            }
            let k = answers_at(rate);
            let run = if k == 1 {
                run
            } else {
                stream_run(n, tokens, rate, None, None, k).await
            };
            let (relay, frames) = relay_run(2 * n, tokens, rate, k).await;
            rows.push(row(
                format!("{pace}, {n}+{n} devices: gateway CPU s per 1000 tokens"),
                format!("{:.3}", per_1000(run.cpu, k)),
                format!(
                    "{:.3} (bare relay to {} clients, {frames} frames each an answer)",
                    per_1000(relay, k),
                    2 * n
                ),
                run.cpu / relay.max(0.01),
            ));
            if rate == 0 {
                let unpaced = stream_run(n, tokens, rate, Some(0), None, k).await;
                rows.push(row(
                    format!(
                        "{pace}, {n}+{n} devices: gateway CPU s per 1000 tokens, paced ÷ unpaced"
                    ),
                    format!("{:.3}", per_1000(run.cpu, k)),
                    format!(
                        "{:.3} (unpaced, stream_update_ms = 0)",
                        per_1000(unpaced.cpu, k)
                    ),
                    run.cpu / unpaced.cpu.max(0.01),
                ));
            }
        }
    }
    // Time to the first update: a short answer at 100 tokens/s, paced and unpaced, median of 5.
    let mut paced = Vec::new();
    let mut unpaced = Vec::new();
    for _ in 0..5 {
        let p = stream_run(1, 20, 100, None, None, 1).await;
        paced.push(p.first_update.as_micros() as u64);
        let u = stream_run(1, 20, 100, Some(0), None, 1).await;
        unpaced.push(u.first_update.as_micros() as u64);
    }
    let (p, u) = (percentile(&mut paced, 0.5), percentile(&mut unpaced, 0.5));
    rows.push(row(
        "agent's first token → device's first update (median of 5)",
        format!("{:.2} ms", p as f64 / 1e3),
        format!("{:.2} ms (unpaced)", u as f64 / 1e3),
        p as f64 / u.max(1) as f64,
    ));
    // The aarch64 figures need a build of this very source (benches/regenerate makes one with
    // .ci/cross's toolchain), beside a release build for the native side.
    let aarch64 = std::env::var_os("IRIS_BENCH_AARCH64").map(PathBuf::from);
    match (aarch64, native_release()) {
        (Some(arm), Some(native)) => {
            let runner: &[&str] = &["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"];
            let arch = std::env::consts::ARCH;
            for (rate, pace) in [(100, "100 tokens/s"), (0, "full speed")] {
                let k = answers_at(rate);
                let x = stream_run(10, tokens, rate, None, Some((&native, &[])), k).await;
                let a = stream_run(10, tokens, rate, None, Some((&arm, runner)), k).await;
                rows.push(row(
                    format!("{pace}, 10+10 devices, aarch64 release under qemu-user: gateway CPU s per 1000 tokens"),
                    format!("{:.3}", per_1000(a.cpu, k)),
                    format!("{:.3} ({arch} release, native)", per_1000(x.cpu, k)),
                    a.cpu / x.cpu.max(0.01),
                ));
                for (form, xs, arms) in [
                    ("whole text", &x.whole, &a.whole),
                    ("append", &x.append, &a.append),
                ] {
                    let (xb, xu, xa) = update_ratio(xs);
                    let (ab, au, aa) = update_ratio(arms);
                    assert_eq!(xa, aa, "the two builds ended on different answers");
                    rows.push(row(
                        format!("{pace}, aarch64 under qemu-user: update bytes per device and answer ({form})"),
                        format!("{ab:.0} B in {au:.1} updates"),
                        format!("{xb:.0} B in {xu:.1} updates ({arch})"),
                        ab / xb,
                    ));
                }
            }
        }
        (Some(_), None) => eprintln!(
            "stream: IRIS_BENCH_AARCH64 without a native release binary (IRIS_BENCH_NATIVE, or a release bench build): no aarch64 rows"
        ),
        _ => {}
    }
    print(
        &format!("Streamed answers ({tokens} tokens; updates paced at the default interval)"),
        &rows,
    );
}
