//! Stores written by layout 1 (everything in sled, up to commit 4e45748) open in this build with
//! everything intact, and a backup made by that version restores.
//!
//! The fixture in `tests/fixtures/layout1/` was made with the layout-1 release binary by
//! `make_layout1_fixture` below (run it with `IRIS_GATEWAY_BIN=PATH-TO-OLD-BINARY cargo test
//! --test layout1 -- --ignored make_layout1_fixture`), through the real protocol:
//! - `data.tar.gz`: the data dir, after a clean stop: three paired devices (one with an ntfy
//!   topic whose answers were pushed, so its `last_pushed_cursor` is set), the default channel,
//!   two more channels and a thread, history with searchable words, one deleted message, an
//!   uploaded image used by a message, the agent sessions the turns started, and one user
//!   message whose turn was still running when the gateway stopped (a pending turn);
//! - `backup.igb`: `iris-gateway backup` of that data dir, made by the same binary;
//! - `expected.json`: the tokens, and what the old binary showed over the socket (channels,
//!   every lane's history, search hits, the whole `sync` replay, `hello.ack`) before the
//!   pending-turn message was sent.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cli_os, frame_type, id_of, pstr, Client, Gateway};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/layout1")
}

/// Words the searches look for, each in a known set of messages.
const SEARCHES: &[&str] = &[
    "zucchini",
    "tomat",
    "Grün",
    "compost heap",
    "nothing-matches",
];

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The image the fixture uploads: deterministic bytes, so the test can check them.
fn image() -> Vec<u8> {
    (0..5000u32).map(|i| (i * 31 % 251) as u8).collect()
}

fn run_cli(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = cli_os(args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Sends a message and waits for its receipt and the end of its demo turn; returns the user
/// message id.
async fn say(c: &mut Client, chat: Option<&str>, thread: Option<&str>, text: &str) -> String {
    loop {
        let id = c
            .request("message.send", chat, thread, json!({ "text": text }))
            .await;
        let r = c.recv_reply(id).await;
        if pstr(&r, "code") == "rate_limited" {
            tokio::time::sleep(Duration::from_millis(150)).await;
            continue;
        }
        assert_eq!(frame_type(&r), "read.receipt", "{r}");
        c.recv_type("message.stop").await;
        return pstr(&r, "message_id").to_owned();
    }
}

async fn hello(url: &str, token: &str, device_id: &str, extra: Value) -> (Client, Value) {
    let mut c = Client::connect(url).await;
    let id = c.next_id();
    let mut payload = json!({ "token": token, "device_id": device_id, "device_name": "iris-test" });
    if let Value::Object(fields) = extra {
        for (k, v) in fields {
            payload[k] = v;
        }
    }
    c.send(json!({ "v": 1, "type": "hello", "id": id, "payload": payload }))
        .await;
    let ack = c
        .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
        .await;
    assert_eq!(frame_type(&ack), "hello.ack", "hello refused: {ack}");
    (c, ack)
}

/// What a device can see: directory, every lane's history, search hits, the outbox replay.
async fn look(c: &mut Client) -> Value {
    c.collect_quiet(Duration::from_millis(500)).await;
    let channels = common::channel_list(c).await;
    let mut history = BTreeMap::new();
    for ch in &channels {
        let chat = ch["chat_id"].as_str().unwrap().to_owned();
        let (lane_chat, lane_thread) = match ch["parent_chat_id"].as_str() {
            Some(parent) => (parent.to_owned(), Some(chat.clone())),
            None => (chat.clone(), None),
        };
        let id = c
            .request(
                "history",
                Some(&lane_chat),
                lane_thread.as_deref(),
                json!({ "limit": 200 }),
            )
            .await;
        let r = c.recv_reply(id).await;
        assert_eq!(frame_type(&r), "history", "{r}");
        history.insert(chat, r["payload"]["messages"].clone());
    }
    let mut searches = BTreeMap::new();
    for q in SEARCHES {
        let id = c
            .request("search", None, None, json!({ "query": q, "limit": 100 }))
            .await;
        let r = c.recv_reply(id).await;
        assert_eq!(frame_type(&r), "search.results", "{r}");
        searches.insert(q.to_string(), r["payload"]["hits"].clone());
    }
    let id = c.request("sync", None, None, json!({ "cursor": 0 })).await;
    let mut outbox = Vec::new();
    let head = loop {
        let f = c.recv().await;
        if id_of(&f) == Some(id) {
            break f["payload"]["cursor"].as_u64().expect("sync.done cursor");
        }
        if f.get("cursor").is_some() {
            outbox.push(f);
        }
    };
    json!({ "channels": channels, "history": history, "searches": searches, "outbox": outbox, "head": head })
}

/// A stand-in ntfy server: answers every request 200 and counts them.
fn fake_ntfy() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then the body by Content-Length.
                loop {
                    let Ok(n) = s.read(&mut chunk) else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                let l = l.to_ascii_lowercase();
                                l.strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                );
            });
        }
    });
    (url, count)
}

/// Makes the fixture with the binary `IRIS_GATEWAY_BIN` names (the layout-1 release).
#[tokio::test]
#[ignore = "makes tests/fixtures/layout1 with the layout-1 binary; run by hand"]
async fn make_layout1_fixture() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let (ntfy, pushes) = fake_ntfy();
    let config = work.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!("[push]\nbackend = \"ntfy\"\nntfy_server = \"{ntfy}\"\nbackoff_ms = 100\nmax_backoff_secs = 1\ngive_up_secs = 600\n"),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let phone = common::pair(&data, "phone");
    let tablet = common::pair(&data, "tablet");
    let away = common::pair(&data, "away-phone");

    let gw = Gateway::start(&data, &["--config", cfg]);
    // The away phone registers its topic and leaves: answers from now on are pushed to it.
    let (c, _) = hello(
        &gw.url,
        &away.token,
        &away.device_id,
        json!({ "ntfy_topic": "away-1" }),
    )
    .await;
    c.close().await;
    let (mut c, _) = hello(&gw.url, &phone.token, &phone.device_id, json!({})).await;
    let garden = common::create_channel(&mut c, "Garden").await;
    let kitchen = common::create_channel(&mut c, "Kitchen").await;
    let beds = common::create_thread(&mut c, &garden, "Raised beds").await;
    say(
        &mut c,
        None,
        None,
        "Good morning, what should I plant this week?",
    )
    .await;
    say(
        &mut c,
        Some(&garden),
        None,
        "The zucchini plants are flowering",
    )
    .await;
    say(&mut c, Some(&garden), None, "Tomatoes need staking soon").await;
    say(
        &mut c,
        Some(&garden),
        Some(&beds),
        "Raised bed two gets the tomato seedlings",
    )
    .await;
    say(
        &mut c,
        Some(&garden),
        Some(&beds),
        "Is the compost heap warm enough?",
    )
    .await;
    say(&mut c, Some(&kitchen), None, "Grüner Tee oder Kaffee?").await;
    let doomed = say(
        &mut c,
        Some(&kitchen),
        None,
        "zucchini bread recipe, secret one",
    )
    .await;
    say(&mut c, None, None, "Remind me about the zucchini harvest").await;

    // An image upload used by a message.
    let data_bytes = image();
    let start = c
        .request(
            "media.upload.start",
            None,
            None,
            json!({ "media_ref": "garden-photo", "kind": "image", "mime": "image/png", "size": data_bytes.len(), "filename": "garden.png" }),
        )
        .await;
    for piece in data_bytes.chunks(64 * 1024) {
        c.send_raw_binary(piece.to_vec()).await;
    }
    let end = c
        .request(
            "media.upload.end",
            None,
            None,
            json!({ "media_ref": "garden-photo", "sha256": sha_hex(&data_bytes) }),
        )
        .await;
    let ack = c.recv_reply(end).await;
    assert!(
        c.seen.iter().all(|f| id_of(f) != Some(start)),
        "{}",
        c.recent()
    );
    assert_eq!(ack["payload"]["ok"], json!(true), "{ack}");
    let id = c
        .request(
            "message.send",
            Some(&garden),
            None,
            json!({ "text": "a photo of the garden", "media_refs": ["garden-photo"] }),
        )
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "read.receipt", "{r}");
    let photo_msg = pstr(&r, "message_id").to_owned();
    let echo = c
        .recv_until(|f| frame_type(f) == "message" && pstr(f, "message_id") == photo_msg)
        .await;
    c.recv_type("message.stop").await;
    let media_id = echo["payload"]["media"][0]["media_id"]
        .as_str()
        .expect("media id")
        .to_owned();

    // One message deleted: gone from history, search and the replay (tombstone).
    let id = c
        .request(
            "message.delete",
            None,
            None,
            json!({ "message_ids": [doomed] }),
        )
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "message.deleted", "{r}");

    // Wait for the pushes to the away phone to be acknowledged (last_pushed_cursor stored).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while pushes.load(std::sync::atomic::Ordering::SeqCst) < 5 {
        assert!(std::time::Instant::now() < deadline, "pushes not seen");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let (mut t, tablet_ack) = hello(&gw.url, &tablet.token, &tablet.device_id, json!({})).await;
    let view = look(&mut t).await;
    t.close().await;
    c.close().await;
    let mut gw = gw;
    gw.stop_ok();

    // A turn still running when the gateway stops: the demo agent at a slow pace.
    let gw = Gateway::start(&data, &["--config", cfg, "--demo-pace-ms", "60000"]);
    let (mut c, away_ack) = hello(&gw.url, &away.token, &away.device_id, json!({})).await;
    let id = c
        .request(
            "message.send",
            Some(&kitchen),
            None,
            json!({ "text": "What is for dinner tonight?" }),
        )
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "read.receipt", "{r}");
    let pending = pstr(&r, "message_id").to_owned();
    c.recv_type("message.start").await;
    let mut gw = gw;
    gw.sigterm();

    let out = fixture_dir();
    std::fs::create_dir_all(&out).unwrap();
    let backup = out.join("backup.igb");
    let _ = std::fs::remove_file(&backup);
    let (ok, o, e) = run_cli(&[
        "backup".as_ref(),
        backup.as_os_str(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ]);
    assert!(ok, "backup: {o}\n{e}");
    // The backup command opens the store itself: pack the data dir after it, as it is left.
    let status = std::process::Command::new("tar")
        .arg("czf")
        .arg(out.join("data.tar.gz"))
        .arg("-C")
        .arg(&data)
        .args(["--exclude", "control.sock", "."])
        .status()
        .unwrap();
    assert!(status.success());
    let expected = json!({
        "made_by": common::bin_display(),
        "devices": {
            "phone": { "token": phone.token, "device_id": phone.device_id },
            "tablet": { "token": tablet.token, "device_id": tablet.device_id },
            "away": { "token": away.token, "device_id": away.device_id },
        },
        "chats": { "garden": garden, "kitchen": kitchen, "beds": beds },
        "deleted": doomed,
        "media": { "media_id": media_id, "message_id": photo_msg, "sha256": sha_hex(&data_bytes) },
        "pending": pending,
        "tablet_ack": tablet_ack,
        "away_ack_before_pending": away_ack,
        "view": view,
    });
    std::fs::write(
        out.join("expected.json"),
        serde_json::to_string_pretty(&expected).unwrap(),
    )
    .unwrap();
}
