//! Media against the real binary: uploads over binary frames (streamed, checksummed,
//! content-addressed), every refusal leaving nothing behind, idle and dropped uploads,
//! attachments in `message.send`, the demo agent reading the files and answering with a file
//! (`media.offer`), pulls, collection when the last referencing message is deleted, the quota
//! degrading the gateway and recovering, survival across SIGTERM and kill -9 (acknowledged
//! uploads stay, collected media stays collected), channel deletion, and offline sync.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{
    connect_online, connect_with_status, cursor_of, dump, frame_type, id_of, pair, pstr,
    temp_data_dir, typing_off, Client, Gateway, Incoming, Paired,
};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------------------------

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
/// Bytes per binary frame of a pull (the contract's 64 KiB chunks).
const PULL_CHUNK: usize = 64 * KIB;
/// Bound on every poll of the media directory.
const FS_DEADLINE: Duration = Duration::from_secs(5);

/// Deterministic pseudo-random bytes (xorshift64*), different for each seed.
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A data dir, an optional config file (in its own dir) and the gateway running on them.
struct Env {
    dir: tempfile::TempDir,
    /// Holds the config file for as long as the gateway runs.
    _cfg_dir: tempfile::TempDir,
    gw: Gateway,
}

impl Env {
    /// Starts a gateway; `limits` (TOML lines) go under `[limits]` of a config file.
    fn start(limits: Option<&str>) -> Env {
        let dir = temp_data_dir();
        let cfg_dir = temp_data_dir();
        let gw = match limits {
            None => Gateway::start(dir.path(), &[]),
            Some(lines) => {
                let path = config_file(cfg_dir.path(), lines);
                let path = path.to_str().expect("config path is UTF-8").to_owned();
                Gateway::start(dir.path(), &["--config", &path])
            }
        };
        Env {
            dir,
            _cfg_dir: cfg_dir,
            gw,
        }
    }

    fn data(&self) -> &Path {
        self.dir.path()
    }

    fn pair(&self, name: &str) -> Paired {
        pair(self.dir.path(), name)
    }
}

fn config_file(dir: &Path, limits: &str) -> PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, format!("[limits]\n{limits}\n")).expect("write config file");
    path
}

/// A ping round trip: the socket is usable and every frame sent before has been handled
/// (the gateway reads and handles one connection's frames in order).
async fn ping(c: &mut Client) {
    let id = c.request("ping", None, None, json!({ "ts": 4242 })).await;
    let pong = c.recv_reply(id).await;
    assert_eq!(frame_type(&pong), "pong", "ping answered with {pong}");
    assert_eq!(pong["payload"]["ts"], 4242, "{pong}");
}

/// An upload that is started, sent `pieces` and ended with `sha256`, and must fail at its end;
/// `waited` and `stored` name it in the failure messages.
struct FailingUpload<'a> {
    media_ref: &'a str,
    kind: &'a str,
    mime: &'a str,
    size: i64,
    filename: &'a str,
    pieces: Vec<&'a [u8]>,
    sha256: String,
    waited: &'a str,
    stored: &'a str,
}

async fn start_upload(
    c: &mut Client,
    media_ref: &str,
    kind: &str,
    mime: &str,
    size: i64,
    filename: &str,
) -> i64 {
    c.request(
        "media.upload.start",
        None,
        None,
        json!({ "media_ref": media_ref, "kind": kind, "mime": mime, "size": size, "filename": filename }),
    )
    .await
}

/// Sends `media.upload.end` and returns the reply carrying its id.
async fn end_upload(c: &mut Client, media_ref: &str, sha256: &str) -> Value {
    let id = c
        .request(
            "media.upload.end",
            None,
            None,
            json!({ "media_ref": media_ref, "sha256": sha256 }),
        )
        .await;
    c.recv_reply(id).await
}

fn assert_ack(reply: &Value, ok: bool, media_ref: &str) {
    assert_eq!(
        frame_type(reply),
        "media.upload.ack",
        "expected media.upload.ack, got {reply}"
    );
    assert_eq!(reply["payload"]["ok"], json!(ok), "ack: {reply}");
    assert_eq!(pstr(reply, "media_ref"), media_ref, "ack: {reply}");
}

/// The error frame answering request `id` (already received or still to come).
async fn error_for(c: &mut Client, id: i64) -> Value {
    if let Some(f) = c
        .seen
        .iter()
        .find(|f| id_of(f) == Some(id) && frame_type(f) == "error")
    {
        return f.clone();
    }
    let f = c.recv_reply(id).await;
    assert_eq!(
        frame_type(&f),
        "error",
        "expected an error for id {id}: {f}"
    );
    f
}

fn assert_code(err: &Value, code: &str) {
    assert_eq!(frame_type(err), "error", "{err}");
    assert_eq!(pstr(err, "code"), code, "error: {err}");
}

/// Uploads `data` in `chunk`-byte binary frames and asserts the gateway acknowledged it.
async fn upload(
    c: &mut Client,
    media_ref: &str,
    kind: &str,
    mime: &str,
    filename: &str,
    data: &[u8],
    chunk: usize,
) {
    let start = start_upload(c, media_ref, kind, mime, data.len() as i64, filename).await;
    for piece in data.chunks(chunk) {
        c.send_raw_binary(piece.to_vec()).await;
    }
    let ack = end_upload(c, media_ref, &common::sha_hex(data)).await;
    if let Some(err) = c.seen.iter().find(|f| id_of(f) == Some(start)) {
        panic!(
            "media.upload.start `{media_ref}` was refused: {err}\n{}",
            c.recent()
        );
    }
    assert_ack(&ack, true, media_ref);
}

/// Pulls a file: `Ok((chunks, end))` when the gateway answered with binary frames and a
/// `media.pull.end` (ok or not), `Err(reply)` when it answered with an error.
async fn pull_chunks(c: &mut Client, media_id: &str) -> Result<(Vec<Vec<u8>>, Value), Value> {
    let rid = c
        .request("media.pull", None, None, json!({ "media_id": media_id }))
        .await;
    let mut chunks = Vec::new();
    loop {
        match c.recv_any().await {
            Incoming::Binary(b) => chunks.push(b),
            Incoming::Text(f) if id_of(&f) == Some(rid) => {
                if frame_type(&f) == "media.pull.end" {
                    return Ok((chunks, f));
                }
                assert!(
                    chunks.is_empty(),
                    "binary frames before the error answering a pull: {f}"
                );
                return Err(f);
            }
            Incoming::Text(_) => {}
            Incoming::Closed(info) => {
                panic!("connection closed ({info:?}) during a pull\n{}", c.recent())
            }
        }
    }
}

async fn pull(c: &mut Client, media_id: &str) -> Vec<u8> {
    match pull_chunks(c, media_id).await {
        Ok((chunks, end)) => {
            assert_eq!(
                end["payload"]["ok"],
                json!(true),
                "pull of {media_id}: {end}"
            );
            chunks.concat()
        }
        Err(e) => panic!("pull of {media_id} refused: {e}"),
    }
}

async fn pull_not_found(c: &mut Client, media_id: &str) {
    match pull_chunks(c, media_id).await {
        Ok((chunks, end)) => panic!(
            "pull of {media_id} should be answered error{{not_found}}, got {} bytes and {end}",
            chunks.concat().len()
        ),
        Err(e) => assert_code(&e, "not_found"),
    }
}

/// Names in `DATA_DIR/media/tmp` (none when the directory does not exist).
fn tmp_entries(data: &Path) -> Vec<String> {
    match std::fs::read_dir(data.join("media").join("tmp")) {
        Ok(rd) => rd
            .map(|e| {
                e.expect("tmp entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Regular files directly in `DATA_DIR/media` (the stored blobs; the tmp dir excluded).
fn blobs(data: &Path) -> BTreeSet<String> {
    std::fs::read_dir(data.join("media"))
        .expect("DATA_DIR/media exists")
        .map(|e| e.expect("media entry"))
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Polls (bounded) until `DATA_DIR/media/tmp` is empty.
async fn wait_tmp_empty(data: &Path, what: &str) {
    let deadline = tokio::time::Instant::now() + FS_DEADLINE;
    loop {
        let left = tmp_entries(data);
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: media/tmp still holds {left:?} after {FS_DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls (bounded) until the blob `sha` is gone from `DATA_DIR/media`.
async fn wait_blob_gone(data: &Path, sha: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + FS_DEADLINE;
    while data.join("media").join(sha).exists() {
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "{what}: media/{sha} still exists after {FS_DEADLINE:?}; media holds {:?}",
                blobs(data)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The demo agent's received.txt: one `filename\tmime\tsize` line per attachment.
fn listing(files: &[(&str, &str, usize)]) -> Vec<u8> {
    files
        .iter()
        .map(|(name, mime, size)| format!("{name}\t{mime}\t{size}\n"))
        .collect::<String>()
        .into_bytes()
}

/// One message and its finished demo turn, as the sender saw it.
#[derive(Debug, Clone)]
struct Turn {
    user: String,
    assistant: String,
    echo: Value,
    stop: Value,
    offers: Vec<Value>,
}

/// Sends `message.send{text, media_refs}` and returns the reply to it (receipt or error).
async fn send_message(c: &mut Client, text: &str, refs: &[&str]) -> Value {
    send_message_in(c, None, None, text, refs).await
}

async fn send_message_in(
    c: &mut Client,
    chat: Option<&str>,
    thread: Option<&str>,
    text: &str,
    refs: &[&str],
) -> Value {
    let id = c
        .request(
            "message.send",
            chat,
            thread,
            json!({ "text": text, "media_refs": refs }),
        )
        .await;
    c.recv_reply(id).await
}

/// Sends a message and waits for its whole turn (through `typing{on:false}`).
async fn turn(c: &mut Client, text: &str, refs: &[&str]) -> Turn {
    turn_in(c, None, None, text, refs).await
}

async fn turn_in(
    c: &mut Client,
    chat: Option<&str>,
    thread: Option<&str>,
    text: &str,
    refs: &[&str],
) -> Turn {
    let receipt = send_message_in(c, chat, thread, text, refs).await;
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    let user = pstr(&receipt, "message_id").to_owned();
    assert!(
        !user.is_empty(),
        "read.receipt without message_id: {receipt}"
    );
    let mut frames = Vec::new();
    loop {
        let f = c.recv().await;
        let done = typing_off(&f);
        frames.push(f);
        if done {
            break;
        }
    }
    let echo = frames
        .iter()
        .find(|f| frame_type(f) == "message" && pstr(f, "message_id") == user)
        .cloned()
        .unwrap_or_else(|| panic!("no echo of {user} in the turn:\n{}", dump(&frames)));
    let stop = frames
        .iter()
        .find(|f| frame_type(f) == "message.stop")
        .cloned()
        .unwrap_or_else(|| panic!("no message.stop in the turn:\n{}", dump(&frames)));
    let assistant = pstr(&stop, "message_id").to_owned();
    let offers = frames
        .iter()
        .filter(|f| frame_type(f) == "media.offer")
        .cloned()
        .collect();
    Turn {
        user,
        assistant,
        echo,
        stop,
        offers,
    }
}

async fn create(c: &mut Client, payload: Value) -> String {
    let id = c.request("channel.create", None, None, payload).await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "channel.created", "{r}");
    pstr(&r, "chat_id").to_owned()
}

/// The single `media` entry of a message frame (or history entry).
fn only_media(msg: &Value) -> Value {
    let media = msg
        .pointer("/payload/media")
        .or_else(|| msg.get("media"))
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no media array in {msg}"));
    assert_eq!(media.len(), 1, "expected exactly one media entry: {msg}");
    media[0].clone()
}

fn assert_media_entry(entry: &Value, kind: &str, mime: &str, size: usize, filename: &str) {
    assert!(
        entry["media_id"].as_str().is_some_and(|s| !s.is_empty()),
        "media entry without media_id: {entry}"
    );
    assert_eq!(entry["kind"], kind, "{entry}");
    assert_eq!(entry["mime"], mime, "{entry}");
    assert_eq!(entry["size"], json!(size), "{entry}");
    assert_eq!(entry["filename"], filename, "{entry}");
}

/// The default lane's history (newest page).
async fn history(c: &mut Client) -> Vec<Value> {
    history_in(c, None, None).await
}

async fn history_in(c: &mut Client, chat: Option<&str>, thread: Option<&str>) -> Vec<Value> {
    let id = c.request("history", chat, thread, json!({})).await;
    let page = c.recv_reply(id).await;
    assert_eq!(frame_type(&page), "history", "{page}");
    page["payload"]["messages"]
        .as_array()
        .expect("history messages")
        .clone()
}

fn history_entry<'a>(messages: &'a [Value], message_id: &str) -> &'a Value {
    messages
        .iter()
        .find(|m| m["message_id"] == message_id)
        .unwrap_or_else(|| panic!("message {message_id} not in history:\n{}", dump(messages)))
}

/// `message.delete` and its reply; a ping afterwards makes sure the handling (including media
/// collection) has finished.
async fn delete(c: &mut Client, ids: &[&str]) {
    let id = c
        .request("message.delete", None, None, json!({ "message_ids": ids }))
        .await;
    let reply = c.recv_reply(id).await;
    assert_eq!(frame_type(&reply), "message.deleted", "{reply}");
    ping(c).await;
}

/// The next `status` frame at or after `from` in `c.seen`, waiting for it if needed.
async fn status_since(c: &mut Client, from: usize) -> String {
    if let Some(f) = c.seen[from..].iter().find(|f| frame_type(f) == "status") {
        return pstr(f, "state").to_owned();
    }
    let f = c.recv_type("status").await;
    pstr(&f, "state").to_owned()
}

// ---------------------------------------------------------------------------------------------
// 1. Round trip
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn upload_send_pull_round_trip() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let pb = env.pair("device-b");
    let (mut a, ack) = connect_online(&env.gw, &pa).await;
    assert_eq!(
        ack.pointer("/payload/server_caps/media"),
        Some(&json!(true)),
        "hello.ack must advertise media: {ack}"
    );
    let (mut b, _) = connect_online(&env.gw, &pb).await;

    let data = pseudo_random(3 * MIB, 1);
    let sha = common::sha_hex(&data);
    upload(
        &mut a,
        "photo-1",
        "image",
        "image/png",
        "holiday.png",
        &data,
        256 * KIB,
    )
    .await;
    wait_tmp_empty(env.data(), "after a good upload").await;
    let path = env.data().join("media").join(&sha);
    assert!(path.is_file(), "media/{sha} missing after the ack");
    assert_eq!(std::fs::read(&path).expect("read blob"), data);

    let t = turn(&mut a, "look at this", &["photo-1"]).await;
    assert_eq!(t.echo["payload"]["role"], "user", "{}", t.echo);
    assert_eq!(t.echo["payload"]["text"], "look at this", "{}", t.echo);
    let entry = only_media(&t.echo);
    assert_media_entry(&entry, "image", "image/png", data.len(), "holiday.png");
    assert!(
        entry.get("message_id").is_none(),
        "a user attachment carries no message_id: {entry}"
    );
    let media_id = entry["media_id"].as_str().unwrap().to_owned();

    // The other device sees the same echo.
    let echo_b = b
        .recv_until(|f| frame_type(f) == "message" && pstr(f, "message_id") == t.user)
        .await;
    assert_eq!(only_media(&echo_b), entry, "device B's echo");

    // History carries the same entry.
    let hist = history(&mut a).await;
    let user = history_entry(&hist, &t.user);
    assert_eq!(only_media(user), entry, "history entry of the user message");

    // Pull it back: 64 KiB chunks, identical bytes, media.pull.end with the request's id.
    let rid_before = a.next_id();
    let (chunks, end) = pull_chunks(&mut a, &media_id).await.expect("pull");
    assert_eq!(end["payload"]["ok"], json!(true), "{end}");
    assert_eq!(id_of(&end), Some(rid_before + 1), "pull.end id: {end}");
    let (last, full) = chunks.split_last().expect("at least one chunk");
    assert!(
        full.iter().all(|c| c.len() == PULL_CHUNK) && last.len() <= PULL_CHUNK && !last.is_empty(),
        "pull chunks must be 64 KiB (last may be shorter): {:?}",
        chunks.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let got = chunks.concat();
    assert_eq!(got.len(), data.len(), "pulled length");
    assert_eq!(
        common::sha_hex(&got),
        sha,
        "pulled bytes differ from the upload"
    );

    // Device B (not the uploader) can pull it too.
    assert_eq!(common::sha_hex(&pull(&mut b, &media_id).await), sha);
    // media/ holds the upload and the demo's received.txt, each named by its sha256.
    let received = listing(&[("holiday.png", "image/png", data.len())]);
    assert_eq!(
        blobs(env.data()),
        BTreeSet::from([sha, common::sha_hex(&received)])
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Several uploads on one connection; pulls served in order
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn several_uploads_on_one_connection() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    let files: Vec<(String, Vec<u8>)> = [(200 * KIB + 17, 11), (1, 12), (MIB + 3, 13)]
        .iter()
        .enumerate()
        .map(|(i, (len, seed))| (format!("multi-{i}"), pseudo_random(*len, *seed)))
        .collect();
    for (r, data) in &files {
        upload(
            &mut a,
            r,
            "document",
            "application/octet-stream",
            &format!("{r}.bin"),
            data,
            100 * KIB,
        )
        .await;
    }
    wait_tmp_empty(env.data(), "after three uploads").await;
    let mut want: BTreeSet<String> = files.iter().map(|(_, d)| common::sha_hex(d)).collect();
    assert_eq!(blobs(env.data()), want, "one blob per upload");

    // Upload chunks are exempt from the frame rate limit: 300 binary frames at once (far over
    // the burst of 60) are all taken.
    let many = pseudo_random(300 * KIB, 14);
    upload(
        &mut a,
        "many-chunks",
        "document",
        "application/octet-stream",
        "many.bin",
        &many,
        KIB,
    )
    .await;
    let limited: Vec<&Value> = a.seen.iter().filter(|f| frame_type(f) == "error").collect();
    assert!(limited.is_empty(), "errors during uploads: {limited:?}");
    want.insert(common::sha_hex(&many));
    assert_eq!(blobs(env.data()), want, "one blob per upload");
    assert_eq!(
        std::fs::read(env.data().join("media").join(common::sha_hex(&many))).expect("read blob"),
        many
    );

    // Chunks of exactly max_frame_bytes (1 MiB) are accepted.
    let big = pseudo_random(2 * MIB + 1, 15);
    upload(
        &mut a,
        "full-frames",
        "video",
        "video/mp4",
        "big.mp4",
        &big,
        MIB,
    )
    .await;
    want.insert(common::sha_hex(&big));
    assert_eq!(blobs(env.data()), want, "one blob per upload");
    wait_tmp_empty(env.data(), "after the 1 MiB-chunk upload").await;

    let refs: Vec<&str> = files.iter().map(|(r, _)| r.as_str()).collect();
    let t = turn(&mut a, "three files", &refs).await;
    let media = t.echo["payload"]["media"]
        .as_array()
        .expect("media")
        .clone();
    assert_eq!(media.len(), 3, "{}", t.echo);
    for ((r, data), entry) in files.iter().zip(&media) {
        assert_media_entry(
            entry,
            "document",
            "application/octet-stream",
            data.len(),
            &format!("{r}.bin"),
        );
    }

    // Three pulls sent back to back are answered in request order, each file's bytes between
    // its request and its media.pull.end.
    let mut ids = Vec::new();
    for entry in &media {
        let id = a
            .request(
                "media.pull",
                None,
                None,
                json!({ "media_id": entry["media_id"] }),
            )
            .await;
        ids.push(id);
    }
    let mut got: Vec<Vec<u8>> = vec![Vec::new()];
    let mut ended = Vec::new();
    while ended.len() < ids.len() {
        match a.recv_any().await {
            Incoming::Binary(b) => got.last_mut().expect("segment").extend(b),
            Incoming::Text(f) if frame_type(&f) == "media.pull.end" => {
                assert_eq!(f["payload"]["ok"], json!(true), "{f}");
                ended.push(id_of(&f).expect("pull.end carries the id"));
                got.push(Vec::new());
            }
            Incoming::Text(f) if frame_type(&f) == "error" => panic!("pull refused: {f}"),
            Incoming::Text(_) => {}
            Incoming::Closed(info) => panic!("closed during pulls: {info:?}"),
        }
    }
    assert_eq!(ended, ids, "pulls must be answered in request order");
    for (i, (_, data)) in files.iter().enumerate() {
        assert_eq!(got[i].len(), data.len(), "pull #{i} length");
        assert_eq!(
            common::sha_hex(&got[i]),
            common::sha_hex(data),
            "pull #{i} bytes"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Refusals and failed uploads leave nothing behind
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn failed_uploads_leave_nothing_behind() {
    let env = Env::start(Some("max_media_bytes = 1048576"));
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;
    let data = env.data();
    let before = blobs(data);
    assert!(before.is_empty(), "fresh media dir: {before:?}");

    // Too large: refused at the start, with the start's id; nothing kept.
    let id = start_upload(
        &mut a,
        "big",
        "video",
        "video/mp4",
        2 * MIB as i64,
        "big.mp4",
    )
    .await;
    let err = error_for(&mut a, id).await;
    assert_code(&err, "media_too_large");
    ping(&mut a).await;
    wait_tmp_empty(data, "too large").await;
    assert_eq!(blobs(data), before, "too large: nothing stored");
    // The refused upload is not active: its end is answered ok:false.
    let ack = end_upload(&mut a, "big", &common::sha_hex(b"")).await;
    assert_ack(&ack, false, "big");

    // Uploads that reach their end and fail there: each is answered ok:false and leaves
    // nothing behind.
    let badsum = pseudo_random(40 * KIB, 21);
    let short = pseudo_random(100 * KIB, 22);
    let long = pseudo_random(100 * KIB, 23);
    let failing = [
        // Bad checksum.
        FailingUpload {
            media_ref: "badsum",
            kind: "document",
            mime: "text/plain",
            size: badsum.len() as i64,
            filename: "a.txt",
            pieces: vec![&badsum[..]],
            sha256: common::sha_hex(b"something else"),
            waited: "bad checksum",
            stored: "bad checksum",
        },
        // Fewer bytes than announced (the checksum is of the announced bytes).
        FailingUpload {
            media_ref: "short",
            kind: "audio",
            mime: "audio/ogg",
            size: short.len() as i64,
            filename: "a.ogg",
            pieces: vec![&short[..50 * KIB]],
            sha256: common::sha_hex(&short),
            waited: "truncated",
            stored: "truncated",
        },
        // Fewer bytes than announced, checksum of what was sent.
        FailingUpload {
            media_ref: "short2",
            kind: "audio",
            mime: "audio/ogg",
            size: short.len() as i64,
            filename: "a.ogg",
            pieces: vec![&short[..50 * KIB]],
            sha256: common::sha_hex(&short[..50 * KIB]),
            waited: "truncated (checksum of sent bytes)",
            stored: "truncated",
        },
        // More bytes than announced, split so the excess arrives in a later frame.
        FailingUpload {
            media_ref: "long",
            kind: "voice",
            mime: "audio/ogg",
            size: 60 * KIB as i64,
            filename: "v.ogg",
            pieces: vec![&long[..40 * KIB], &long[40 * KIB..]],
            sha256: common::sha_hex(&long),
            waited: "too many bytes",
            stored: "too many bytes",
        },
    ];
    for u in failing {
        start_upload(&mut a, u.media_ref, u.kind, u.mime, u.size, u.filename).await;
        for piece in u.pieces {
            a.send_raw_binary(piece.to_vec()).await;
        }
        let ack = end_upload(&mut a, u.media_ref, &u.sha256).await;
        assert_ack(&ack, false, u.media_ref);
        ping(&mut a).await;
        wait_tmp_empty(data, u.waited).await;
        assert_eq!(blobs(data), before, "{}: nothing stored", u.stored);
    }

    // End with a ref that was never started.
    let ack = end_upload(&mut a, "never-started", &common::sha_hex(b"x")).await;
    assert_ack(&ack, false, "never-started");
    ping(&mut a).await;
    wait_tmp_empty(data, "unknown ref at end").await;
    assert_eq!(blobs(data), before, "unknown ref: nothing stored");

    // A second start while one is active is refused; the first upload carries on.
    let first = pseudo_random(30 * KIB, 24);
    start_upload(
        &mut a,
        "first",
        "image",
        "image/jpeg",
        first.len() as i64,
        "f.jpg",
    )
    .await;
    a.send_raw_binary(first[..10 * KIB].to_vec()).await;
    let id = start_upload(&mut a, "second", "image", "image/jpeg", 10, "s.jpg").await;
    let err = error_for(&mut a, id).await;
    assert_code(&err, "unsupported");
    a.send_raw_binary(first[10 * KIB..].to_vec()).await;
    let ack = end_upload(&mut a, "first", &common::sha_hex(&first)).await;
    assert_ack(&ack, true, "first");
    let ack = end_upload(&mut a, "second", &common::sha_hex(b"")).await;
    assert_ack(&ack, false, "second");
    ping(&mut a).await;
    wait_tmp_empty(data, "second start while active").await;
    let mut expected = before.clone();
    expected.insert(common::sha_hex(&first));
    assert_eq!(blobs(data), expected, "only the first upload is stored");
    let mut before = expected;

    // A binary frame with no upload in progress.
    let seen = a.seen.len();
    a.send_raw_binary(vec![1, 2, 3]).await;
    let err = a.recv_type("error").await;
    assert_code(&err, "unsupported");
    assert_eq!(id_of(&err), None, "{err}");
    assert!(a.seen[seen..].iter().all(|f| frame_type(f) == "error"));
    ping(&mut a).await;
    wait_tmp_empty(data, "binary without upload").await;
    assert_eq!(blobs(data), before, "binary without upload: nothing stored");

    // Bad kind (outside the schema's enum, so sent raw), bad media_ref, negative size.
    let id = a.next_id();
    a.send_raw_text(
        &json!({
            "v": 1, "type": "media.upload.start", "id": id,
            "payload": { "media_ref": "kind1", "kind": "sticker", "mime": "image/webp", "size": 3, "filename": "s.webp" },
        })
        .to_string(),
    )
    .await;
    let err = error_for(&mut a, id).await;
    assert_code(&err, "unsupported");
    let ack = end_upload(&mut a, "kind1", &common::sha_hex(b"")).await;
    assert_ack(&ack, false, "kind1");

    for (bad_ref, size) in [("bad ref/..", 3i64), (&"r".repeat(65), 3), ("neg", -1)] {
        let id = start_upload(&mut a, bad_ref, "image", "image/png", size, "x.png").await;
        let err = error_for(&mut a, id).await;
        assert_code(&err, "unsupported");
        // Nothing is active afterwards: a binary frame is refused.
        a.send_raw_binary(vec![0; 3]).await;
        let err = a.recv_type("error").await;
        assert_code(&err, "unsupported");
        ping(&mut a).await;
        wait_tmp_empty(data, &format!("start with ref {bad_ref:?} size {size}")).await;
    }
    assert_eq!(blobs(data), before, "refused starts: nothing stored");

    // Exactly max_media_bytes is within the limit.
    let limit = pseudo_random(MIB, 26);
    upload(
        &mut a,
        "at-limit",
        "video",
        "video/mp4",
        "limit.mp4",
        &limit,
        256 * KIB,
    )
    .await;
    before.insert(common::sha_hex(&limit));
    assert_eq!(blobs(data), before, "the upload at the limit is stored");

    // After all that the connection still uploads.
    let good = pseudo_random(5 * KIB, 25);
    upload(
        &mut a,
        "after",
        "image",
        "image/png",
        "ok.png",
        &good,
        4 * KIB,
    )
    .await;
    wait_tmp_empty(data, "final upload").await;
    assert!(blobs(data).contains(&common::sha_hex(&good)));
    assert!(
        a.closed.is_none(),
        "the connection must stay open: {:?}",
        a.closed
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Idle and dropped uploads
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn idle_upload_is_abandoned() {
    let env = Env::start(Some("media_idle_timeout_secs = 1"));
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    let bytes = pseudo_random(64 * KIB, 31);
    start_upload(
        &mut a,
        "idle-1",
        "video",
        "video/mp4",
        2 * bytes.len() as i64,
        "v.mp4",
    )
    .await;
    a.send_raw_binary(bytes.clone()).await;
    // The unsolicited ack (no id) arrives once the upload has been quiet past the timeout.
    let ack = a.recv_type("media.upload.ack").await;
    assert_ack(&ack, false, "idle-1");
    assert_eq!(
        id_of(&ack),
        None,
        "the abandonment ack is unsolicited: {ack}"
    );
    wait_tmp_empty(env.data(), "idle upload").await;
    assert!(blobs(env.data()).is_empty(), "{:?}", blobs(env.data()));

    // The upload is gone: more bytes are refused, and its end is answered ok:false.
    a.send_raw_binary(bytes.clone()).await;
    let err = a.recv_type("error").await;
    assert_code(&err, "unsupported");
    let ack = end_upload(
        &mut a,
        "idle-1",
        &common::sha_hex(&[bytes.clone(), bytes].concat()),
    )
    .await;
    assert_ack(&ack, false, "idle-1");
    ping(&mut a).await;

    // A fresh upload on the same socket still works.
    let good = pseudo_random(10 * KIB, 32);
    upload(
        &mut a,
        "idle-2",
        "image",
        "image/png",
        "p.png",
        &good,
        10 * KIB,
    )
    .await;
    assert_eq!(blobs(env.data()), BTreeSet::from([common::sha_hex(&good)]));
}

#[tokio::test(flavor = "current_thread")]
async fn socket_closed_mid_upload_leaves_no_temp_file() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    let bytes = pseudo_random(300 * KIB, 41);
    start_upload(&mut a, "drop-1", "video", "video/mp4", MIB as i64, "v.mp4").await;
    a.send_raw_binary(bytes.clone()).await;
    ping(&mut a).await;
    assert_eq!(
        tmp_entries(env.data()).len(),
        1,
        "an upload in progress streams to one temp file"
    );
    a.close().await;
    wait_tmp_empty(env.data(), "socket closed mid-upload").await;
    assert!(blobs(env.data()).is_empty(), "{:?}", blobs(env.data()));

    // An abrupt drop (no close handshake) as well.
    let (mut b, _) = connect_online(&env.gw, &pa).await;
    start_upload(&mut b, "drop-2", "video", "video/mp4", MIB as i64, "v.mp4").await;
    b.send_raw_binary(bytes).await;
    ping(&mut b).await;
    assert_eq!(tmp_entries(env.data()).len(), 1);
    drop(b);
    wait_tmp_empty(env.data(), "socket dropped mid-upload").await;
    assert!(blobs(env.data()).is_empty(), "{:?}", blobs(env.data()));

    // The ref of an unfinished upload names nothing.
    let (mut c, _) = connect_online(&env.gw, &pa).await;
    let reply = send_message(&mut c, "attach the dropped one", &["drop-1"]).await;
    assert_code(&reply, "not_found");
}

// ---------------------------------------------------------------------------------------------
// 5. Dedupe and path safety
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn same_bytes_stored_once_and_filenames_cannot_escape() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    let bytes = pseudo_random(123_457, 51);
    let sha = common::sha_hex(&bytes);
    upload(
        &mut a,
        "dup-1",
        "image",
        "image/png",
        "one.png",
        &bytes,
        64 * KIB,
    )
    .await;
    upload(
        &mut a,
        "dup-2",
        "document",
        "application/octet-stream",
        "two.bin",
        &bytes,
        50 * KIB,
    )
    .await;
    wait_tmp_empty(env.data(), "dedupe").await;
    assert_eq!(
        blobs(env.data()),
        BTreeSet::from([sha.clone()]),
        "the same bytes are stored once, named by their sha256"
    );

    let t = turn(&mut a, "both", &["dup-1", "dup-2"]).await;
    let media = t.echo["payload"]["media"]
        .as_array()
        .expect("media")
        .clone();
    assert_eq!(media.len(), 2, "{}", t.echo);
    assert_media_entry(&media[0], "image", "image/png", bytes.len(), "one.png");
    assert_media_entry(
        &media[1],
        "document",
        "application/octet-stream",
        bytes.len(),
        "two.bin",
    );
    for m in &media {
        let got = pull(&mut a, m["media_id"].as_str().unwrap()).await;
        assert_eq!(common::sha_hex(&got), sha);
    }

    // A name with directories: stored by hash, recorded as its last component.
    let evil = pseudo_random(2000, 52);
    upload(
        &mut a,
        "evil",
        "document",
        "text/plain",
        "../../etc/passwd",
        &evil,
        2000,
    )
    .await;
    let t = turn(&mut a, "", &["evil"]).await;
    let entry = only_media(&t.echo);
    assert_media_entry(&entry, "document", "text/plain", evil.len(), "passwd");
    // Besides the two uploads, media/ holds exactly the demo's two received.txt listings.
    let want = BTreeSet::from([
        sha.clone(),
        common::sha_hex(&evil),
        common::sha_hex(&listing(&[
            ("one.png", "image/png", bytes.len()),
            ("two.bin", "application/octet-stream", bytes.len()),
        ])),
        common::sha_hex(&listing(&[("passwd", "text/plain", evil.len())])),
    ]);
    assert_eq!(blobs(env.data()), want);
    for name in blobs(env.data()) {
        assert!(
            name.len() == 64 && name.chars().all(|c| c.is_ascii_hexdigit()),
            "every stored file is named by a sha256: {name}"
        );
    }
    assert!(!env.data().join("etc").exists(), "DATA_DIR/etc created");
    assert!(
        !env.data().join("media").join("etc").exists(),
        "DATA_DIR/media/etc created"
    );
    let mut stack = vec![env.data().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("walk data dir") {
            let e = e.expect("entry");
            assert_ne!(
                e.file_name(),
                "passwd",
                "a file named passwd at {:?}",
                e.path()
            );
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(e.path());
            }
        }
    }
    assert_eq!(
        common::sha_hex(&pull(&mut a, entry["media_id"].as_str().unwrap()).await),
        common::sha_hex(&evil)
    );
}

// ---------------------------------------------------------------------------------------------
// 6. The demo agent reads the files and answers with one
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn demo_agent_reads_attachments_and_offers_a_file() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let pb = env.pair("device-b");
    let (mut a, _) = connect_online(&env.gw, &pa).await;
    let (mut b, _) = connect_online(&env.gw, &pb).await;

    let notes = pseudo_random(4321, 61);
    let picture = pseudo_random(70_001, 62);
    upload(
        &mut a,
        "att-1",
        "document",
        "text/plain",
        "notes.txt",
        &notes,
        1000,
    )
    .await;
    upload(
        &mut a,
        "att-2",
        "image",
        "image/png",
        "cat.png",
        &picture,
        32 * KIB,
    )
    .await;

    let t = turn(&mut a, "please read these", &["att-1", "att-2"]).await;
    let final_text = pstr(&t.stop, "final_text");
    for (name, kind, mime, size) in [
        ("notes.txt", "document", "text/plain", notes.len()),
        ("cat.png", "image", "image/png", picture.len()),
    ] {
        let line =
            format!("You attached {name} ({kind}, {mime}, {size} bytes; {size} bytes received).");
        assert!(
            final_text.lines().any(|l| l == line),
            "final_text lacks the line {line:?}:\n{final_text}"
        );
    }

    let want = listing(&[
        ("notes.txt", "text/plain", notes.len()),
        ("cat.png", "image/png", picture.len()),
    ]);
    assert_eq!(
        t.offers.len(),
        1,
        "one media.offer per turn with files: {:?}",
        t.offers
    );
    let offer = t.offers[0].clone();
    let p = &offer["payload"];
    assert_eq!(p["kind"], "document", "{offer}");
    assert_eq!(p["mime"], "text/plain", "{offer}");
    assert_eq!(p["filename"], "received.txt", "{offer}");
    assert_eq!(p["size"], json!(want.len()), "{offer}");
    assert_eq!(
        p["message_id"], t.assistant,
        "the offer names the assistant message: {offer}"
    );
    assert_eq!(
        offer["chat_id"], "default",
        "offers are scoped to the lane: {offer}"
    );
    assert!(offer.get("thread_id").is_none(), "{offer}");
    assert!(offer.get("id").is_none(), "an offer is an event: {offer}");
    assert!(
        offer.get("cursor").is_none(),
        "live frames carry no cursor: {offer}"
    );
    let offer_id = p["media_id"].as_str().expect("offer media_id").to_owned();

    // Every device is offered the file.
    let offer_b = b.recv_type("media.offer").await;
    assert_eq!(offer_b["payload"], offer["payload"], "device B's offer");

    // The file is the demo's listing of what it received.
    let got = pull(&mut b, &offer_id).await;
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want),
        "received.txt content"
    );
    assert!(env
        .data()
        .join("media")
        .join(common::sha_hex(&want))
        .is_file());

    // History: the user message with its files, the assistant message with the offered file.
    let hist = history(&mut a).await;
    let user = history_entry(&hist, &t.user);
    assert_eq!(
        user["media"], t.echo["payload"]["media"],
        "user history entry"
    );
    let reply = history_entry(&hist, &t.assistant);
    assert_eq!(reply["role"], "assistant", "{reply}");
    assert_eq!(reply["text"], json!(final_text), "{reply}");
    let m = only_media(reply);
    assert_eq!(
        m["media_id"],
        json!(offer_id),
        "assistant history media: {reply}"
    );
    assert_media_entry(&m, "document", "text/plain", want.len(), "received.txt");

    // In a thread, the echo and the offer are scoped to the thread's lane.
    let chan = create(&mut a, json!({ "name": "Files", "kind": "channel" })).await;
    let thr = create(
        &mut a,
        json!({ "name": "Scans", "kind": "thread", "parent_chat_id": chan }),
    )
    .await;
    let t = turn_in(&mut a, Some(&chan), Some(&thr), "in a thread", &["att-1"]).await;
    assert_eq!(t.echo["chat_id"], json!(chan), "{}", t.echo);
    assert_eq!(t.echo["thread_id"], json!(thr), "{}", t.echo);
    assert_eq!(t.offers.len(), 1, "{:?}", t.offers);
    let offer = &t.offers[0];
    assert_eq!(offer["chat_id"], json!(chan), "thread offer scope: {offer}");
    assert_eq!(
        offer["thread_id"],
        json!(thr),
        "thread offer scope: {offer}"
    );
    assert_eq!(pstr(offer, "message_id"), t.assistant, "{offer}");
    let want = listing(&[("notes.txt", "text/plain", notes.len())]);
    assert_eq!(pull(&mut a, pstr(offer, "media_id")).await, want);
    let hist = history_in(&mut a, Some(&chan), Some(&thr)).await;
    assert_eq!(
        only_media(history_entry(&hist, &t.assistant))["media_id"],
        offer["payload"]["media_id"]
    );
}

// ---------------------------------------------------------------------------------------------
// 7. Deleting the messages collects their files
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn deleting_messages_collects_their_files() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    let bytes = pseudo_random(77_777, 71);
    let sha = common::sha_hex(&bytes);
    upload(
        &mut a,
        "shared",
        "image",
        "image/jpeg",
        "shared.jpg",
        &bytes,
        20 * KIB,
    )
    .await;
    let t1 = turn(&mut a, "first", &["shared"]).await;
    let t2 = turn(&mut a, "second", &["shared"]).await;
    let media_id = only_media(&t1.echo)["media_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        only_media(&t2.echo)["media_id"],
        json!(media_id),
        "the same media_ref names the same upload"
    );
    assert_eq!(t1.offers.len(), 1, "{:?}", t1.offers);
    assert_eq!(t2.offers.len(), 1, "{:?}", t2.offers);
    let offer1 = pstr(&t1.offers[0], "media_id").to_owned();
    let offer2 = pstr(&t2.offers[0], "media_id").to_owned();
    let rec_sha = common::sha_hex(&listing(&[("shared.jpg", "image/jpeg", bytes.len())]));
    assert_eq!(
        blobs(env.data()),
        BTreeSet::from([sha.clone(), rec_sha.clone()])
    );

    // The second message still references the upload: it stays.
    delete(&mut a, &[&t1.user]).await;
    assert!(
        env.data().join("media").join(&sha).is_file(),
        "media/{sha} removed while message {} still references it",
        t2.user
    );
    assert_eq!(common::sha_hex(&pull(&mut a, &media_id).await), sha);

    // The second reply's file has the same bytes: the blob stays.
    delete(&mut a, &[&t1.assistant]).await;
    assert!(
        env.data().join("media").join(&rec_sha).is_file(),
        "media/{rec_sha} removed while {}'s offer still uses those bytes",
        t2.assistant
    );
    assert_eq!(
        pull(&mut a, &offer2).await,
        listing(&[("shared.jpg", "image/jpeg", bytes.len())])
    );

    // Last reference to the upload gone: its file goes.
    delete(&mut a, &[&t2.user]).await;
    wait_blob_gone(env.data(), &sha, "after deleting both user messages").await;
    pull_not_found(&mut a, &media_id).await;
    assert!(env.data().join("media").join(&rec_sha).is_file());

    delete(&mut a, &[&t2.assistant]).await;
    wait_blob_gone(env.data(), &rec_sha, "after deleting both replies").await;
    pull_not_found(&mut a, &offer1).await;
    pull_not_found(&mut a, &offer2).await;
    assert!(blobs(env.data()).is_empty(), "{:?}", blobs(env.data()));
    wait_tmp_empty(env.data(), "deletion").await;

    // History no longer lists them.
    let hist = history(&mut a).await;
    assert!(
        hist.is_empty(),
        "history after deleting everything:\n{}",
        dump(&hist)
    );

    // Nor does a full replay offer the collected files (the offers went with their replies).
    let sid = a.request("sync", None, None, json!({ "cursor": 0 })).await;
    let mut replay = Vec::new();
    loop {
        let f = a.recv().await;
        if id_of(&f) == Some(sid) {
            break;
        }
        replay.push(f);
    }
    let dangling: Vec<&Value> = replay
        .iter()
        .filter(|f| {
            let text = f.to_string();
            [&media_id, &offer1, &offer2]
                .iter()
                .any(|m| text.contains(m.as_str()))
        })
        .collect();
    assert!(
        dangling.is_empty(),
        "sync still replays frames naming collected media: {dangling:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Quota: degraded while full, online after space is freed and an upload succeeds
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn full_quota_degrades_until_space_is_freed() {
    let env = Env::start(Some("media_quota_bytes = 200000"));
    let pa = env.pair("device-a");
    let pb = env.pair("device-b");
    let pc = env.pair("device-c");
    let (mut a, _) = connect_online(&env.gw, &pa).await;
    let (mut b, _) = connect_online(&env.gw, &pb).await;

    let first = pseudo_random(150_000, 81);
    upload(
        &mut a,
        "q1",
        "image",
        "image/png",
        "q1.png",
        &first,
        64 * KIB,
    )
    .await;
    let t = turn(&mut a, "quota", &["q1"]).await;
    let stored = blobs(env.data());
    assert!(stored.contains(&common::sha_hex(&first)), "{stored:?}");

    let (mark_a, mark_b) = (a.seen.len(), b.seen.len());
    let id = start_upload(&mut a, "q2", "image", "image/png", 100_000, "q2.png").await;
    let err = error_for(&mut a, id).await;
    assert_code(&err, "media_too_large");
    assert_eq!(status_since(&mut a, mark_a).await, "degraded", "device A");
    assert_eq!(status_since(&mut b, mark_b).await, "degraded", "device B");
    ping(&mut a).await;
    wait_tmp_empty(env.data(), "quota refusal").await;
    assert_eq!(blobs(env.data()), stored, "quota refusal: nothing stored");

    // A device connecting now is greeted with the degraded state.
    let (mut c, _, status) = connect_with_status(&env.gw, &pc).await;
    assert_eq!(
        pstr(&status, "state"),
        "degraded",
        "greeting while the quota is full"
    );

    // Free the space: the message with the file and its reply.
    delete(&mut a, &[&t.user, &t.assistant]).await;
    for sha in &stored {
        wait_blob_gone(env.data(), sha, "after deleting the quota's messages").await;
    }

    let (mark_a, mark_b, mark_c) = (a.seen.len(), b.seen.len(), c.seen.len());
    let next = pseudo_random(100_000, 82);
    upload(
        &mut a,
        "q3",
        "image",
        "image/png",
        "q3.png",
        &next,
        64 * KIB,
    )
    .await;
    assert_eq!(status_since(&mut a, mark_a).await, "online", "device A");
    assert_eq!(status_since(&mut b, mark_b).await, "online", "device B");
    assert_eq!(status_since(&mut c, mark_c).await, "online", "device C");
    assert_eq!(blobs(env.data()), BTreeSet::from([common::sha_hex(&next)]));
}

// ---------------------------------------------------------------------------------------------
// 9. Unknown media; media survives a restart
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn unknown_media_is_not_found_and_media_survives_restart() {
    let mut env = Env::start(None);
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    let rid = a.next_id() + 1;
    match pull_chunks(&mut a, "med_does_not_exist").await {
        Ok(_) => panic!("an unknown media_id was served"),
        Err(e) => {
            assert_code(&e, "not_found");
            assert_eq!(id_of(&e), Some(rid), "{e}");
        }
    }
    ping(&mut a).await;

    let bytes = pseudo_random(700 * KIB + 5, 91);
    let sha = common::sha_hex(&bytes);
    upload(
        &mut a,
        "keep",
        "video",
        "video/webm",
        "clip.webm",
        &bytes,
        128 * KIB,
    )
    .await;
    let t = turn(&mut a, "keep this", &["keep"]).await;
    let entry = only_media(&t.echo);
    let media_id = entry["media_id"].as_str().unwrap().to_owned();
    let offer_id = pstr(&t.offers[0], "media_id").to_owned();
    let stored = blobs(env.data());

    let status = env.gw.sigterm();
    assert!(
        status.success(),
        "SIGTERM exit: {status:?}\n{}",
        env.gw.output_tail()
    );
    drop(a);
    env.gw = Gateway::start(env.dir.path(), &[]);

    let (mut a, _) = connect_online(&env.gw, &pa).await;
    assert_eq!(
        common::sha_hex(&pull(&mut a, &media_id).await),
        sha,
        "after restart"
    );
    assert_eq!(
        pull(&mut a, &offer_id).await,
        listing(&[("clip.webm", "video/webm", bytes.len())])
    );
    let hist = history(&mut a).await;
    assert_eq!(only_media(history_entry(&hist, &t.user)), entry);
    assert_eq!(
        only_media(history_entry(&hist, &t.assistant))["media_id"],
        json!(offer_id)
    );
    assert_eq!(blobs(env.data()), stored, "blobs after restart");
    wait_tmp_empty(env.data(), "after restart").await;
    pull_not_found(&mut a, "med_does_not_exist").await;

    // kill -9: an acknowledged upload survives, a half-sent one leaves no temp file.
    let acked = pseudo_random(90_000, 92);
    upload(
        &mut a,
        "crash-1",
        "image",
        "image/png",
        "acked.png",
        &acked,
        30 * KIB,
    )
    .await;
    start_upload(
        &mut a,
        "crash-2",
        "video",
        "video/mp4",
        MIB as i64,
        "half.mp4",
    )
    .await;
    a.send_raw_binary(pseudo_random(100 * KIB, 93)).await;
    ping(&mut a).await;
    assert!(
        !tmp_entries(env.data()).is_empty(),
        "an upload in progress streams to a temp file"
    );
    env.gw.kill9();
    drop(a);
    env.gw = Gateway::start(env.dir.path(), &[]);
    wait_tmp_empty(env.data(), "restart after kill -9 mid-upload").await;
    assert!(env
        .data()
        .join("media")
        .join(common::sha_hex(&acked))
        .is_file());
    let (mut a, _) = connect_online(&env.gw, &pa).await;
    let t = turn(&mut a, "after the crash", &["crash-1"]).await;
    let entry = only_media(&t.echo);
    assert_media_entry(&entry, "image", "image/png", acked.len(), "acked.png");
    assert_eq!(
        pull(&mut a, entry["media_id"].as_str().unwrap()).await,
        acked
    );
    let reply = send_message(&mut a, "the half one", &["crash-2"]).await;
    assert_code(&reply, "not_found");
}

// ---------------------------------------------------------------------------------------------
// 10. A device that was away syncs the message with media and the offer
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn offline_device_syncs_media_message_and_offer() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let pc = env.pair("device-c");
    let (c, ack) = connect_online(&env.gw, &pc).await;
    let cursor = ack
        .pointer("/payload/sync_cursor")
        .and_then(Value::as_u64)
        .expect("sync_cursor");
    c.close().await;

    let (mut a, _) = connect_online(&env.gw, &pa).await;
    let bytes = pseudo_random(50_000, 101);
    upload(
        &mut a,
        "sync-1",
        "voice",
        "audio/ogg",
        "memo.ogg",
        &bytes,
        16 * KIB,
    )
    .await;
    let t = turn(&mut a, "hear this", &["sync-1"]).await;
    assert_eq!(t.offers.len(), 1, "{:?}", t.offers);

    let (mut c, _) = connect_online(&env.gw, &pc).await;
    let sid = c
        .request("sync", None, None, json!({ "cursor": cursor }))
        .await;
    let mut replay = Vec::new();
    loop {
        let f = c.recv().await;
        if id_of(&f) == Some(sid) {
            assert_eq!(frame_type(&f), "sync.done", "{f}");
            break;
        }
        if cursor_of(&f).is_some() {
            replay.push(f);
        }
    }
    let cursors: Vec<u64> = replay.iter().filter_map(cursor_of).collect();
    assert!(
        cursors.windows(2).all(|w| w[0] < w[1]) && cursors.iter().all(|c| *c > cursor),
        "replayed cursors must increase past {cursor}: {cursors:?}"
    );
    let find = |pred: &dyn Fn(&Value) -> bool, what: &str| -> Value {
        replay
            .iter()
            .find(|f| pred(f))
            .cloned()
            .unwrap_or_else(|| panic!("sync replay lacks {what}:\n{}", dump(&replay)))
    };
    let echo = find(
        &|f| frame_type(f) == "message" && pstr(f, "message_id") == t.user,
        "the user message",
    );
    assert_eq!(
        echo["payload"]["media"], t.echo["payload"]["media"],
        "{echo}"
    );
    assert_media_entry(
        &only_media(&echo),
        "voice",
        "audio/ogg",
        bytes.len(),
        "memo.ogg",
    );
    let offer = find(&|f| frame_type(f) == "media.offer", "the media.offer");
    assert_eq!(offer["payload"], t.offers[0]["payload"], "{offer}");
    assert_eq!(pstr(&offer, "message_id"), t.assistant, "{offer}");
    assert_eq!(pstr(&offer, "filename"), "received.txt", "{offer}");
    assert_eq!(offer["chat_id"], "default", "{offer}");
    let stop = find(
        &|f| frame_type(f) == "message.stop" && pstr(f, "message_id") == t.assistant,
        "the message.stop",
    );
    assert!(
        cursor_of(&echo) < cursor_of(&offer),
        "the offer comes after the message it answers: {echo} / {offer}"
    );
    assert!(cursor_of(&stop).is_some());

    // The device that was away can fetch both files.
    let media_id = only_media(&echo)["media_id"].as_str().unwrap().to_owned();
    assert_eq!(
        common::sha_hex(&pull(&mut c, &media_id).await),
        common::sha_hex(&bytes)
    );
    assert_eq!(
        pull(&mut c, pstr(&offer, "media_id")).await,
        listing(&[("memo.ogg", "audio/ogg", bytes.len())])
    );
}

// ---------------------------------------------------------------------------------------------
// 11. Attachment rules of message.send
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn message_send_attachment_rules() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let pb = env.pair("device-b");
    let (mut a, _) = connect_online(&env.gw, &pa).await;
    let (mut b, _) = connect_online(&env.gw, &pb).await;

    let refs: Vec<String> = (0..11).map(|i| format!("r{i}")).collect();
    for (i, r) in refs.iter().enumerate() {
        let bytes = pseudo_random(100 + i, 110 + i as u64);
        upload(
            &mut a,
            r,
            "image",
            "image/png",
            &format!("{r}.png"),
            &bytes,
            64,
        )
        .await;
    }
    let all: Vec<&str> = refs.iter().map(String::as_str).collect();

    let reply = send_message(&mut a, "eleven", &all).await;
    assert_code(&reply, "unsupported");

    let t = turn(&mut a, "ten", &all[..10]).await;
    let media = t.echo["payload"]["media"].as_array().expect("media");
    assert_eq!(media.len(), 10, "{}", t.echo);
    for (i, m) in media.iter().enumerate() {
        assert_media_entry(m, "image", "image/png", 100 + i, &format!("r{i}.png"));
    }

    let reply = send_message(&mut a, "unknown", &["nope"]).await;
    assert_code(&reply, "not_found");
    let reply = send_message(&mut a, "one unknown", &["r0", "nope"]).await;
    assert_code(&reply, "not_found");

    // Refs belong to the uploading device.
    let reply = send_message(&mut b, "not mine", &["r0"]).await;
    assert_code(&reply, "not_found");

    // Empty text with media is a message; empty text without is not.
    let t = turn(&mut a, "", &["r10"]).await;
    assert_eq!(t.echo["payload"]["text"], "", "{}", t.echo);
    assert_media_entry(&only_media(&t.echo), "image", "image/png", 110, "r10.png");
    let reply = send_message(&mut a, "", &[]).await;
    assert_code(&reply, "unsupported");

    // None of the refused sends left a message behind.
    let hist = history(&mut a).await;
    let texts: Vec<&str> = hist.iter().filter_map(|m| m["text"].as_str()).collect();
    assert!(
        !texts
            .iter()
            .any(|t| ["eleven", "unknown", "one unknown", "not mine"].contains(t)),
        "a refused message was stored:\n{}",
        dump(&hist)
    );
}

// ---------------------------------------------------------------------------------------------
// 12. Deleting a channel collects the files of its messages
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn deleting_a_channel_collects_its_files() {
    let env = Env::start(None);
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    let kept = pseudo_random(20_000, 121);
    let in_chan = pseudo_random(30_000, 122);
    let in_thread = pseudo_random(40_000, 123);
    upload(
        &mut a,
        "kept",
        "image",
        "image/png",
        "kept.png",
        &kept,
        8 * KIB,
    )
    .await;
    upload(
        &mut a,
        "chan",
        "image",
        "image/png",
        "chan.png",
        &in_chan,
        8 * KIB,
    )
    .await;
    upload(
        &mut a,
        "thr",
        "image",
        "image/png",
        "thr.png",
        &in_thread,
        8 * KIB,
    )
    .await;

    let chan = create(&mut a, json!({ "name": "Doomed", "kind": "channel" })).await;
    let thr = create(
        &mut a,
        json!({ "name": "Doomed thread", "kind": "thread", "parent_chat_id": chan }),
    )
    .await;
    let tk = turn(&mut a, "stays", &["kept"]).await;
    let tc = turn_in(&mut a, Some(&chan), None, "goes", &["chan"]).await;
    let tt = turn_in(&mut a, Some(&chan), Some(&thr), "goes too", &["thr"]).await;
    let kept_listing = common::sha_hex(&listing(&[("kept.png", "image/png", kept.len())]));
    let doomed = [
        common::sha_hex(&in_chan),
        common::sha_hex(&in_thread),
        common::sha_hex(&listing(&[("chan.png", "image/png", in_chan.len())])),
        common::sha_hex(&listing(&[("thr.png", "image/png", in_thread.len())])),
    ];
    let mut all = BTreeSet::from([common::sha_hex(&kept), kept_listing.clone()]);
    all.extend(doomed.iter().cloned());
    assert_eq!(blobs(env.data()), all);

    let id = a
        .request("channel.delete", Some(&chan), None, json!({}))
        .await;
    let reply = a.recv_reply(id).await;
    assert_eq!(frame_type(&reply), "channel.deleted", "{reply}");
    ping(&mut a).await;
    for sha in &doomed {
        wait_blob_gone(env.data(), sha, "after deleting the channel").await;
    }
    assert_eq!(
        blobs(env.data()),
        BTreeSet::from([common::sha_hex(&kept), kept_listing]),
        "the default channel's files stay"
    );
    for t in [&tc, &tt] {
        pull_not_found(&mut a, only_media(&t.echo)["media_id"].as_str().unwrap()).await;
        pull_not_found(&mut a, pstr(&t.offers[0], "media_id")).await;
    }
    let kept_id = only_media(&tk.echo)["media_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(pull(&mut a, &kept_id).await, kept);
}

// ---------------------------------------------------------------------------------------------
// 13. Collection is as durable as the deletion that caused it
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "current_thread")]
async fn collected_media_stays_collected_after_kill9() {
    let mut env = Env::start(None);
    let pa = env.pair("device-a");
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    let bytes = pseudo_random(33_333, 131);
    let sha = common::sha_hex(&bytes);
    upload(
        &mut a,
        "gone",
        "image",
        "image/png",
        "gone.png",
        &bytes,
        8 * KIB,
    )
    .await;
    let t = turn(&mut a, "short-lived", &["gone"]).await;
    let media_id = only_media(&t.echo)["media_id"].as_str().unwrap().to_owned();
    let offer_id = pstr(&t.offers[0], "media_id").to_owned();
    let rec_sha = common::sha_hex(&listing(&[("gone.png", "image/png", bytes.len())]));

    // The device is told the messages are deleted and the files are gone from disk ...
    delete(&mut a, &[&t.user, &t.assistant]).await;
    wait_blob_gone(env.data(), &sha, "after the delete").await;
    wait_blob_gone(env.data(), &rec_sha, "after the delete").await;
    pull_not_found(&mut a, &media_id).await;
    // ... and then the power goes.
    env.gw.kill9();
    drop(a);
    env.gw = Gateway::start(env.dir.path(), &[]);
    let (mut a, _) = connect_online(&env.gw, &pa).await;

    // The collected media must not come back as records whose files are missing.
    pull_not_found(&mut a, &media_id).await;
    pull_not_found(&mut a, &offer_id).await;
    let reply = send_message(&mut a, "the collected one", &["gone"]).await;
    assert_code(&reply, "not_found");
}
