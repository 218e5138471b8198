//! Media benchmark: a large upload and pull through the real gateway over a real WebSocket on
//! loopback, against a plain file copy of the same bytes in the same run, with the gateway's
//! peak memory beside its idle memory (uploads stream to disk: memory must not follow size).
//!
//! `cargo bench --bench media` (default 100 MiB; `-- --mib N` for another size).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite::Message;

const BIN: &str = env!("CARGO_BIN_EXE_iris-gateway");
const CHUNK: usize = 256 << 10;

fn mib_arg() -> usize {
    let argv: Vec<String> = std::env::args().collect();
    argv.windows(2)
        .find(|w| w[0] == "--mib")
        .map(|w| w[1].parse().expect("--mib N"))
        .unwrap_or(100)
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text frame, skipping binary ones; bounded so a broken run cannot hang.
async fn next_text(ws: &mut Ws) -> Value {
    let fut = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    return serde_json::from_str::<Value>(t.as_str()).unwrap()
                }
                Some(Ok(_)) => continue,
                other => panic!("socket ended: {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(600), fut)
        .await
        .expect("the gateway answered in time")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let mib = mib_arg();
    let size = mib << 20;
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data_dir = tmp.path().join("gw");
    let config = tmp.path().join("config.toml");
    std::fs::write(
        &config,
        // The per-connection byte rate (8 MiB/s by default) would measure itself, not the path.
        format!(
            "[limits]\nmax_media_bytes = {}\nbytes_per_second = {}\nbyte_burst = {}\n",
            size + (1 << 20),
            1u64 << 40,
            1u64 << 40
        ),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--listen", "127.0.0.1:0", "--demo-pace-ms", "0"])
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the gateway");
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("gateway output").unwrap();
        if let Some(rest) = line.strip_prefix("listening on ") {
            break rest.to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let pair = Command::new(BIN)
        .args(["pair", "--json", "--name", "bench"])
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .unwrap();
    let paired: Value = serde_json::from_slice(&pair.stdout).unwrap();
    let token = paired["token"].as_str().unwrap().to_owned();

    // The file: pseudo-random so nothing compresses or dedupes by accident.
    let mut bytes = vec![0u8; size];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in bytes.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let sha = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();

    // Baselines in this run: write + fsync the bytes to a plain file, then read them back.
    let plain = tmp.path().join("plain.bin");
    let t = Instant::now();
    {
        let mut f = std::fs::File::create(&plain).unwrap();
        for c in bytes.chunks(CHUNK) {
            f.write_all(c).unwrap();
        }
        f.sync_all().unwrap();
    }
    let write_base = t.elapsed();
    let t = Instant::now();
    let read_back = std::fs::read(&plain).unwrap();
    let read_base = t.elapsed();
    assert_eq!(read_back.len(), size);
    drop(read_back);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let idle_kib = status_kib(pid, "VmRSS:");
    let (upload, pull, media_id) = rt.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.unwrap();
        let hello = json!({"v":1,"type":"hello","id":1,"payload":{"token":token}});
        ws.send(Message::text(hello.to_string())).await.unwrap();
        loop {
            let f = next_text(&mut ws).await;
            if f["type"] == "status" {
                break;
            }
        }
        let t = Instant::now();
        let start = json!({"v":1,"type":"media.upload.start","id":2,"payload":{"media_ref":"bench","kind":"document","mime":"application/octet-stream","size":size,"filename":"bench.bin"}});
        ws.send(Message::text(start.to_string())).await.unwrap();
        for c in bytes.chunks(CHUNK) {
            ws.send(Message::binary(c.to_vec())).await.unwrap();
        }
        let end = json!({"v":1,"type":"media.upload.end","id":3,"payload":{"media_ref":"bench","sha256":sha}});
        ws.send(Message::text(end.to_string())).await.unwrap();
        let ack = next_text(&mut ws).await;
        assert_eq!(ack["payload"]["ok"], true, "{ack}");
        let upload = t.elapsed();
        // Use it in a message to learn its media_id.
        let send = json!({"v":1,"type":"message.send","id":4,"payload":{"text":"bench","media_refs":["bench"]}});
        ws.send(Message::text(send.to_string())).await.unwrap();
        let media_id = loop {
            let f = next_text(&mut ws).await;
            if f["type"] == "message" && f["payload"]["role"] == "user" {
                break f["payload"]["media"][0]["media_id"].as_str().unwrap().to_owned();
            }
        };
        // Let the demo turn finish so the pull is measured alone.
        loop {
            let f = next_text(&mut ws).await;
            if f["type"] == "typing" && f["payload"]["on"] == false {
                break;
            }
        }
        let t = Instant::now();
        let pull = json!({"v":1,"type":"media.pull","id":5,"payload":{"media_id":media_id}});
        ws.send(Message::text(pull.to_string())).await.unwrap();
        let mut got = 0usize;
        let mut hasher = Sha256::new();
        loop {
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => {
                    got += b.len();
                    hasher.update(&b);
                }
                Some(Ok(Message::Text(t))) => {
                    let f: Value = serde_json::from_str(t.as_str()).unwrap();
                    if f["type"] == "media.pull.end" {
                        assert_eq!(f["payload"]["ok"], true);
                        break;
                    }
                }
                other => panic!("pull ended early: {other:?}"),
            }
        }
        let pull = t.elapsed();
        assert_eq!(got, size);
        let pulled: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(pulled, sha);
        (upload, pull, media_id)
    });
    let peak_kib = status_kib(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();

    let rate = |d: Duration| size as f64 / d.as_secs_f64() / (1 << 20) as f64;
    println!(
        "machine: {} cores, {}; file {mib} MiB ({media_id})",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::env::consts::ARCH
    );
    println!("| figure | value | baseline (same run) | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| upload {mib} MiB over WebSocket (stored, fsynced, checksummed) | {:.0} MiB/s | {:.0} MiB/s (plain file write + fsync) | {:.2} |",
        rate(upload),
        rate(write_base),
        rate(upload) / rate(write_base)
    );
    println!(
        "| pull {mib} MiB over WebSocket | {:.0} MiB/s | {:.0} MiB/s (plain file read) | {:.2} |",
        rate(pull),
        rate(read_base),
        rate(pull) / rate(read_base)
    );
    println!(
        "| gateway peak RSS through upload and pull | {} KiB | {} KiB idle before | {:.2} |",
        peak_kib,
        idle_kib,
        peak_kib as f64 / idle_kib.max(1) as f64
    );
}
