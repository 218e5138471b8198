//! Stores written by layout 1 (everything in sled, up to commit 4e45748) and by layout 2
//! (history in SQLite, commits as sled transactions, up to commit a5718e8) open in this build
//! with everything intact, and a backup made by either version restores.
//!
//! `tests/fixtures/layout2/` was made the same way with the layout-2 binary
//! (`IRIS_FIXTURE_LAYOUT=2 IRIS_GATEWAY_BIN=... cargo test --test layout1 -- --ignored
//! make_layout1_fixture`).
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
use std::path::Path;
use std::time::Duration;

use common::fixtures::{expected, fixture_dir, unpack_fixture};
use common::{frame_type, pstr, Client, Gateway};
use serde_json::{json, Value};

/// Words the searches look for, each in a known set of messages.
const SEARCHES: &[&str] = &[
    "zucchini",
    "tomat",
    "Grün",
    "compost heap",
    "nothing-matches",
];

/// The image the fixture uploads: deterministic bytes, so the test can check them.
fn image() -> Vec<u8> {
    (0..5000u32).map(|i| (i * 31 % 251) as u8).collect()
}

/// What a device can see: directory, every lane's history, search hits, the outbox replay.
async fn look(c: &mut Client) -> Value {
    c.collect_quiet(Duration::from_millis(500)).await;
    let channels = common::channel_list(c).await;
    let history: BTreeMap<String, Value> = common::lane_histories(c, &channels)
        .await
        .into_iter()
        .map(|(chat, messages)| (chat, Value::Array(messages)))
        .collect();
    let mut searches = BTreeMap::new();
    for q in SEARCHES {
        let id = c
            .request("search", None, None, json!({ "query": q, "limit": 100 }))
            .await;
        let r = c.recv_reply(id).await;
        assert_eq!(frame_type(&r), "search.results", "{r}");
        searches.insert(q.to_string(), r["payload"]["hits"].clone());
    }
    let (outbox, head) = common::sync_from(c, 0).await;
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
    let (c, _) = common::hello_paired_with(&gw, &away, json!({ "ntfy_topic": "away-1" })).await;
    c.close().await;
    let (mut c, _) = common::hello_paired(&gw, &phone).await;
    let garden = common::create_channel(&mut c, "Garden").await;
    let kitchen = common::create_channel(&mut c, "Kitchen").await;
    let beds = common::create_thread(&mut c, &garden, "Raised beds").await;
    common::send_until_stop(
        &mut c,
        None,
        None,
        "Good morning, what should I plant this week?",
    )
    .await;
    common::send_until_stop(
        &mut c,
        Some(&garden),
        None,
        "The zucchini plants are flowering",
    )
    .await;
    common::send_until_stop(&mut c, Some(&garden), None, "Tomatoes need staking soon").await;
    common::send_until_stop(
        &mut c,
        Some(&garden),
        Some(&beds),
        "Raised bed two gets the tomato seedlings",
    )
    .await;
    common::send_until_stop(
        &mut c,
        Some(&garden),
        Some(&beds),
        "Is the compost heap warm enough?",
    )
    .await;
    common::send_until_stop(&mut c, Some(&kitchen), None, "Grüner Tee oder Kaffee?").await;
    let doomed = common::send_until_stop(
        &mut c,
        Some(&kitchen),
        None,
        "zucchini bread recipe, secret one",
    )
    .await;
    common::send_until_stop(&mut c, None, None, "Remind me about the zucchini harvest").await;

    // An image upload used by a message.
    let data_bytes = image();
    common::upload_png(&mut c, "garden-photo", &data_bytes).await;
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

    let (mut t, tablet_ack) = common::hello_paired(&gw, &tablet).await;
    let view = look(&mut t).await;
    t.close().await;
    c.close().await;
    let mut gw = gw;
    gw.stop_ok();

    // A turn still running when the gateway stops: the demo agent at a slow pace.
    let gw = Gateway::start(&data, &["--config", cfg, "--demo-pace-ms", "60000"]);
    let (mut c, away_ack) = common::hello_paired(&gw, &away).await;
    let id = c
        .send_text(Some(&kitchen), None, "What is for dinner tonight?")
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "read.receipt", "{r}");
    let pending = pstr(&r, "message_id").to_owned();
    c.recv_type("message.start").await;
    let mut gw = gw;
    gw.sigterm();

    let layout: u64 = std::env::var("IRIS_FIXTURE_LAYOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let out = fixture_dir(layout);
    std::fs::create_dir_all(&out).unwrap();
    let backup = out.join("backup.igb");
    let _ = std::fs::remove_file(&backup);
    let (ok, o, e) = common::cli_backup(&backup, &data);
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
        "media": { "media_id": media_id, "message_id": photo_msg, "sha256": common::sha_hex(&data_bytes) },
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

/// Every tree of a backup file: name → (key → value).
type Trees = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

fn backup_trees(file: &Path) -> (iris_gateway::store::backup::Header, Trees) {
    let mut trees: Trees = BTreeMap::new();
    let mut current = String::new();
    let header = iris_gateway::store::backup::read_backup(
        &file.display().to_string(),
        std::fs::File::open(file).unwrap(),
        |_, item| {
            match item {
                iris_gateway::store::backup::Item::Tree(name) => {
                    current = String::from_utf8_lossy(&name).into_owned();
                    trees.entry(current.clone()).or_default();
                }
                iris_gateway::store::backup::Item::Entry(k, v) => {
                    trees.get_mut(&current).unwrap().insert(k, v);
                }
                iris_gateway::store::backup::Item::Media(..) => {}
            }
            Ok(())
        },
    )
    .expect("a readable backup");
    (header, trees)
}

/// A gateway on a store made from the fixture (migrated, or restored from its backup) shows
/// devices everything the layout-1 gateway showed, plus the answer to the pending turn.
async fn check_against_fixture(data: &Path, layout: u64) {
    let e = expected(layout);
    let view = &e["view"];
    let mut gw = Gateway::start(data, &[]);
    let dev = |name: &str| {
        (
            e["devices"][name]["token"].as_str().unwrap().to_owned(),
            e["devices"][name]["device_id"].as_str().unwrap().to_owned(),
        )
    };
    // Every device's token still works; the away phone's push position survived.
    let (tok, id) = dev("phone");
    let (c, _) = Client::hello(&gw.url, &tok, &id).await;
    c.close().await;
    let (tok, id) = dev("away");
    let (c, ack) = Client::hello(&gw.url, &tok, &id).await;
    c.close().await;
    let before = &e["away_ack_before_pending"]["payload"];
    assert!(
        before["last_pushed_cursor"].as_u64().unwrap() > 0,
        "the fixture has a pushed cursor"
    );
    assert_eq!(
        ack["payload"]["last_pushed_cursor"], before["last_pushed_cursor"],
        "{ack}"
    );
    let (tok, id) = dev("tablet");
    let (mut t, ack) = Client::hello(&gw.url, &tok, &id).await;
    let head = view["head"].as_u64().unwrap();
    // The pending user message (head + 1) and the restart notice that answered it.
    assert!(
        ack["payload"]["sync_cursor"].as_u64().unwrap() > head + 1,
        "{ack}"
    );
    let now = look(&mut t).await;
    assert_eq!(now["channels"], view["channels"]);
    assert_eq!(now["searches"], view["searches"]);
    let kitchen = e["chats"]["kitchen"].as_str().unwrap();
    for (chat, old) in view["history"].as_object().unwrap() {
        let new = now["history"][chat].as_array().unwrap();
        let old = old.as_array().unwrap();
        if chat == kitchen {
            assert_eq!(&new[..old.len()], &old[..], "{chat}");
            let rest = &new[old.len()..];
            assert_eq!(rest.len(), 2, "{rest:?}");
            assert_eq!(rest[0]["message_id"], e["pending"], "{rest:?}");
            assert_eq!(rest[0]["text"], "What is for dinner tonight?");
            assert_eq!(rest[1]["role"], "assistant", "{rest:?}");
            assert!(
                rest[1]["text"].as_str().unwrap().contains("restart"),
                "the pending turn is answered with the restart notice: {rest:?}"
            );
        } else {
            assert_eq!(new, old, "{chat}");
        }
    }
    // The deleted message stays deleted everywhere.
    let deleted = e["deleted"].as_str().unwrap();
    // (The demo's answer quotes it and stays: only the user's message was deleted.)
    for messages in now["history"].as_object().unwrap().values() {
        assert!(
            messages
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m["message_id"] != deleted),
            "the deleted message came back"
        );
    }
    assert!(now["outbox"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| frame_type(f) == "message.deleted" && f["payload"]["message_ids"][0] == deleted));
    let old_outbox = view["outbox"].as_array().unwrap();
    let new_outbox = now["outbox"].as_array().unwrap();
    assert_eq!(&new_outbox[..old_outbox.len()], &old_outbox[..]);
    // History paging by `before` works on migrated positions.
    let garden = e["chats"]["garden"].as_str().unwrap();
    let oldest_two = &view["history"][garden].as_array().unwrap()[..2];
    let before = view["history"][garden].as_array().unwrap()[2]["message_id"].clone();
    let id = t
        .request(
            "history",
            Some(garden),
            None,
            json!({ "limit": 10, "before_message_id": before }),
        )
        .await;
    let r = t.recv_reply(id).await;
    assert_eq!(
        r["payload"]["messages"].as_array().unwrap(),
        oldest_two,
        "{r}"
    );
    // The uploaded image still pulls, byte for byte.
    let media_id = e["media"]["media_id"].as_str().unwrap();
    assert_eq!(
        common::sha_hex(&common::pull_media(&mut t, media_id).await),
        e["media"]["sha256"]
    );
    // New messages land after the old ones and are found.
    common::send_until_stop(
        &mut t,
        Some(garden),
        None,
        "zucchini soup after the migration",
    )
    .await;
    let id = t
        .request(
            "search",
            None,
            None,
            json!({ "query": "zucchini", "limit": 100 }),
        )
        .await;
    let r = t.recv_reply(id).await;
    let hits = r["payload"]["hits"].as_array().unwrap();
    // The message and the demo's answer quoting it, newest first, before the old hits.
    let old_hits = view["searches"]["zucchini"].as_array().unwrap();
    assert_eq!(hits.len(), old_hits.len() + 2, "{r}");
    assert_eq!(&hits[2..], &old_hits[..]);
    assert!(hits[..2].iter().all(|h| h["snippet"]
        .as_str()
        .unwrap()
        .contains("after the migration")));
    t.close().await;

    // What sled kept, compared entry by entry: a backup of the new store against the
    // layout-1 backup of the same data dir.
    let file = data.join("after.igb");
    let (ok, o, err) = common::cli_backup(&file, data);
    assert!(ok, "backup: {o}\n{err}");
    gw.stop_ok();
    let (old_header, mut old) = backup_trees(&fixture_dir(layout).join("backup.igb"));
    let (new_header, new) = backup_trees(&file);
    assert_eq!(old_header.layout_version, layout);
    assert_eq!(new_header.layout_version, 3);
    // An unused set-up device (the one whose token `run` printed) goes at the first start after
    // a phone connected (docs/pairing.md): the fixture's never connected, so only it may be gone.
    let gone: Vec<Vec<u8>> = old["devices"]
        .iter()
        .filter(|(k, _)| !new["devices"].contains_key(*k))
        .map(|(k, v)| {
            let d: Value = serde_json::from_slice(v).unwrap();
            assert!(
                d["origin"] == "startup" && d["last_seen_ms"].is_null(),
                "a device other than an unused set-up device went: {d}"
            );
            k.clone()
        })
        .collect();
    for id in &gone {
        old.get_mut("devices").unwrap().remove(id);
        old.get_mut("tokens").unwrap().retain(|_, v| v != id);
    }
    for tree in [
        "sessions",
        "tokens",
        "channels",
        "media",
        "media_refs",
        "blobs",
    ] {
        assert!(
            !old[tree].is_empty() || tree == "media_refs",
            "{tree} empty in the fixture"
        );
        assert_eq!(new[tree], old[tree], "tree {tree}");
    }
    assert_eq!(
        new["devices"].keys().collect::<Vec<_>>(),
        old["devices"].keys().collect::<Vec<_>>()
    );
    assert_eq!(old["turns"].len(), 1, "the fixture has a pending turn");
    assert!(new["turns"].is_empty(), "the pending turn was settled");
    // Every old message is there under the same position and with the same content.
    for (k, v) in &old["messages"] {
        let nv = new["messages"].get(k).unwrap_or_else(|| {
            panic!("message {} lost", String::from_utf8_lossy(v));
        });
        let (a, b): (Value, Value) = (
            serde_json::from_slice(v).unwrap(),
            serde_json::from_slice(nv).unwrap(),
        );
        assert_eq!(a, b);
    }
    assert_eq!(new["media_uses"], old["media_uses"]);
    assert!(!new.contains_key("search") && !new.contains_key("message_ids"));
}

#[tokio::test]
async fn a_layout1_data_dir_is_migrated_with_everything_intact() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    unpack_fixture(&data, 1);
    assert!(!data.join(iris_gateway::store::HISTORY_DIR).exists());
    check_against_fixture(&data, 1).await;
    assert!(data
        .join(iris_gateway::store::HISTORY_DIR)
        .join("history.sqlite3")
        .is_file());
}

#[tokio::test]
async fn a_layout1_backup_restores() {
    backup_restores(1).await;
}

async fn backup_restores(layout: u64) {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let file = fixture_dir(layout).join("backup.igb");
    let (ok, o, e) = common::cli_restore(&file, &data);
    assert!(ok, "restore: {o}\n{e}");
    check_against_fixture(&data, layout).await;
}

/// A data dir of the layout-2 release (history in SQLite, commits as sled transactions, sled
/// uncompressed) is upgraded to layout 3 and its sled files rebuilt compressed, with
/// everything intact.
#[tokio::test]
async fn a_layout2_data_dir_is_upgraded_with_everything_intact() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    unpack_fixture(&data, 2);
    check_against_fixture(&data, 2).await;
    let conf = std::fs::read(data.join("db/conf")).unwrap();
    assert!(
        String::from_utf8_lossy(&conf).contains("use_compression: true"),
        "sled was not rebuilt compressed"
    );
}

#[tokio::test]
async fn a_layout2_backup_restores() {
    backup_restores(2).await;
}

/// A backup of a migrated (layout-2) store restores to the same thing, history and all.
#[tokio::test]
async fn a_layout2_backup_restores_both_engines() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    unpack_fixture(&data, 1);
    let mut gw = Gateway::start(&data, &[]);
    let e = expected(1);
    let tok = e["devices"]["tablet"]["token"].as_str().unwrap();
    let id = e["devices"]["tablet"]["device_id"].as_str().unwrap();
    let (mut t, _) = Client::hello(&gw.url, tok, id).await;
    common::send_until_stop(&mut t, None, None, "one more zucchini before the backup").await;
    let before = look(&mut t).await;
    t.close().await;
    gw.stop_ok();
    let file = work.path().join("l2.igb");
    let (ok, o, err) = common::cli_backup(&file, &data);
    assert!(ok, "backup: {o}\n{err}");
    let restored = work.path().join("restored");
    std::fs::create_dir_all(&restored).unwrap();
    let (ok, o, err) = common::cli_restore(&file, &restored);
    assert!(ok, "restore: {o}\n{err}");
    let gw = Gateway::start(&restored, &[]);
    let (mut t, _) = Client::hello(&gw.url, tok, id).await;
    let after = look(&mut t).await;
    assert_eq!(after, before);
}
