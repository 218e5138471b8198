//! Restores that cannot go wrong quietly, end to end with the real binary: after a restore no
//! cursor is handed out twice and a phone that was away is told to reload instead of missing
//! what came after (over real WebSockets, every frame checked against the schema); an upload
//! on the admin page is accepted only once it is checked and built in full (a bad entry, a
//! disk without room for it, a second upload at the same time are refused, and nothing of the
//! accepted one is lost); a restore that still fails at the restart is reported, not left
//! behind; a history database damaged while the gateway runs is named by `backup` and shown by
//! `status`.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::mounts::{free_bytes, mount_tmpfs};
use common::{
    frame_type, hello_paired, nth_listening, owner_set, pair, pstr, sync_from, Client, Gateway,
    Paired,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PASSPHRASE: &str = "amber kettle lighthouse 7";

fn backup(file: &Path, data: &Path) {
    let (ok, out, err) = common::cli_backup(file, data);
    assert!(ok, "backup failed:\n{out}\n{err}");
}

fn status_text(data: &Path) -> String {
    let out = common::cli_os(&["status".as_ref(), "--data-dir".as_ref(), data.as_os_str()]);
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Sends `n` messages and returns their ids.
async fn say(c: &mut Client, what: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(common::send_until_stop(c, None, None, &format!("{what} {i}")).await);
    }
    ids
}

/// The message ids the default lane's history holds.
async fn history_ids(c: &mut Client) -> Vec<String> {
    let id = c
        .request("history", None, None, json!({ "limit": 200 }))
        .await;
    let h = c.recv_reply(id).await;
    assert_eq!(frame_type(&h), "history", "{h}");
    h["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["message_id"].as_str().unwrap().to_owned())
        .collect()
}

/// What a phone that synced to `held` gets after the restore: told to reload (a `sync.done`
/// below its cursor, nothing replayed), then everything said since, by history and by a sync
/// from where it was told to continue, under cursors above any it held.
async fn away_phone_catches_up(gw_url: &str, phone: &Paired, held: u64, said: &[String]) {
    let (mut c, _) = Client::hello(gw_url, &phone.token, &phone.device_id).await;
    let (replayed, done) = sync_from(&mut c, held).await;
    assert!(
        done < held && replayed.is_empty(),
        "a phone at cursor {held} was served {} frame(s) and sync.done {done}: it was not told \
         to reload, and misses what it lacks",
        replayed.len()
    );
    let history = history_ids(&mut c).await;
    for id in said {
        assert!(
            history.contains(id),
            "{id} missing from the reloaded history"
        );
    }
    let (frames, head) = sync_from(&mut c, done).await;
    for id in said {
        let f = frames
            .iter()
            .find(|f| frame_type(f) == "message" && pstr(f, "message_id") == id)
            .unwrap_or_else(|| panic!("{id} not replayed from {done}"));
        let cursor = common::cursor_of(f).unwrap();
        assert!(
            cursor > held,
            "{id} got cursor {cursor}, one the phone already held (<= {held})"
        );
    }
    assert!(head > held);
    c.close().await;
}

#[tokio::test]
async fn after_a_restore_an_away_phone_is_told_to_reload_and_misses_nothing() {
    let data = common::temp_data_dir();
    let mut gw = Gateway::start(data.path(), &[]);
    let phone = pair(data.path(), "phone");
    let tablet = pair(data.path(), "tablet");
    let (mut t, _) = hello_paired(&gw, &tablet).await;
    say(&mut t, "before the backup", 1).await;
    t.close().await;
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("iris.backup");
    backup(&file, data.path());
    // The phone stays on, syncing well past the backup, then goes away.
    let (mut p, _) = hello_paired(&gw, &phone).await;
    say(&mut p, "after the backup", 3).await;
    let (_, held) = sync_from(&mut p, 0).await;
    p.close().await;
    gw.stop_ok();
    drop(gw);

    let (ok, o, e) = common::cli_restore(&file, data.path());
    assert!(ok, "restore failed:\n{o}\n{e}");
    let gw = Gateway::start(data.path(), &[]);
    // Before anything new: the phone is ahead of the restored store.
    let (mut t, _) = hello_paired(&gw, &tablet).await;
    let said = say(&mut t, "after the restore", 4).await;
    t.close().await;
    away_phone_catches_up(&gw.url, &phone, held, &said).await;
}

// ---------------------------------------------------------------------------------------------
// The admin page's restore
// ---------------------------------------------------------------------------------------------

/// One answer: status and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

/// A signed-in admin session, over raw HTTP/1.1.
struct Web {
    addr: SocketAddr,
    jar: HashMap<String, String>,
}

fn head(
    method: &str,
    path: &str,
    addr: SocketAddr,
    jar: &HashMap<String, String>,
    extra: &str,
    len: usize,
) -> String {
    let cookies: Vec<String> = jar
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/html\r\nCookie: {}\r\n{extra}\
         Content-Length: {len}\r\nConnection: close\r\n\r\n",
        cookies.join("; ")
    )
}

async fn read_answer(mut tcp: tokio::net::TcpStream) -> Answer {
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), tcp.read_to_end(&mut raw))
        .await
        .expect("an answer in time")
        .ok();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (top, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = top.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn field(body: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = body
        .find(&marker)
        .unwrap_or_else(|| panic!("no field {name} in:\n{body}"))
        + marker.len();
    body[start..].split('"').next().unwrap_or("").to_owned()
}

impl Web {
    async fn send(&mut self, method: &str, path: &str, extra: &str, body: &[u8]) -> Answer {
        let mut tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let h = head(method, path, self.addr, &self.jar, extra, body.len());
        tcp.write_all(h.as_bytes()).await.unwrap();
        tcp.write_all(body).await.unwrap();
        let a = read_answer(tcp).await;
        for (k, v) in &a.headers {
            if k == "set-cookie" {
                if let Some((name, value)) = v.split(';').next().and_then(|c| c.split_once('=')) {
                    self.jar.insert(name.to_owned(), value.to_owned());
                }
            }
        }
        a
    }

    async fn sign_in(addr: SocketAddr) -> (Web, String) {
        let mut web = Web {
            addr,
            jar: HashMap::new(),
        };
        let page = web.send("GET", "/admin/", "", b"").await;
        let pre = field(&page.body, "pre");
        let form = format!("pre={pre}&passphrase={}", PASSPHRASE.replace(' ', "+"));
        let signed = web
            .send(
                "POST",
                "/admin/signin",
                "Content-Type: application/x-www-form-urlencoded\r\n",
                form.as_bytes(),
            )
            .await;
        assert_eq!(signed.status, 303, "sign-in: {}", signed.body);
        let page = web.send("GET", "/admin/", "", b"").await;
        let csrf = field(&page.body, "csrf");
        (web, csrf)
    }

    /// Starts a restore upload: the request and the first `sent` bytes of `body`.
    async fn begin_upload(&self, csrf: &str, body: &[u8], sent: usize) -> tokio::net::TcpStream {
        let mut tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let h = head(
            "POST",
            "/admin/backup/restore",
            self.addr,
            &self.jar,
            &format!("X-CSRF-Token: {csrf}\r\nContent-Type: application/octet-stream\r\n"),
            body.len(),
        );
        tcp.write_all(h.as_bytes()).await.unwrap();
        // A refusal may come (and the socket close) before the body is all read.
        let _ = tcp.write_all(&body[..sent]).await;
        tcp
    }

    async fn upload(&self, csrf: &str, body: &[u8]) -> Answer {
        let tcp = self.begin_upload(csrf, body, body.len()).await;
        read_answer(tcp).await
    }
}

/// A backup file written here, to the format of `src/store/backup.rs`: trees of entries and
/// media files, with a valid checksum.
/// A tree's name and its entries (key, value).
type Tree<'a> = (&'a str, Vec<(Vec<u8>, Vec<u8>)>);

fn craft_backup(trees: &[Tree<'_>], media: &[Vec<u8>]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let header = json!({
        "format": 1, "gateway_version": "0.1.0", "layout_version": 3, "cursor_head": 0,
        "created_ms": 1_700_000_000_000i64, "media_files": media.len(),
        "media_bytes": media.iter().map(|m| m.len()).sum::<usize>(),
    });
    let json = serde_json::to_vec(&header).unwrap();
    let mut b = b"IRIS-GATEWAY-BACKUP\n".to_vec();
    b.extend((json.len() as u32).to_be_bytes());
    b.extend(json);
    for (name, entries) in trees {
        b.push(b'T');
        b.extend((name.len() as u16).to_be_bytes());
        b.extend(name.as_bytes());
        for (k, v) in entries {
            b.push(b'K');
            b.extend((k.len() as u32).to_be_bytes());
            b.extend(k);
            b.extend((v.len() as u32).to_be_bytes());
            b.extend(v);
        }
    }
    for m in media {
        let name = common::sha_hex(m);
        b.push(b'M');
        b.extend((name.len() as u16).to_be_bytes());
        b.extend(name.as_bytes());
        b.extend((m.len() as u64).to_be_bytes());
        b.extend(m);
    }
    b.push(b'E');
    let digest = Sha256::digest(&b);
    b.extend(digest);
    b
}

fn leftovers(data: &Path) -> Vec<String> {
    std::fs::read_dir(data)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pending-restore") || n.starts_with(".restore"))
        .collect()
}

#[tokio::test]
async fn an_upload_is_accepted_only_when_it_will_be_applied() {
    let data = common::temp_data_dir();
    owner_set(data.path(), PASSPHRASE);
    let gw = Gateway::start(data.path(), &[]);
    let phone = pair(data.path(), "phone");
    let tablet = pair(data.path(), "tablet");
    let (mut t, _) = hello_paired(&gw, &tablet).await;
    say(&mut t, "before the backup", 2).await;
    t.close().await;
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("iris.backup");
    backup(&file, data.path());
    let good = std::fs::read(&file).unwrap();
    let (mut p, _) = hello_paired(&gw, &phone).await;
    say(&mut p, "after the backup", 3).await;
    let (_, held) = sync_from(&mut p, 0).await;
    p.close().await;

    let (web, csrf) = Web::sign_in(gw.addr).await;
    // Whole and checksum-valid, with an entry no store can take: refused at the upload.
    let bad = craft_backup(
        &[
            ("meta", vec![]),
            (
                "messages",
                vec![(b"no lane here".to_vec(), b"{not json".to_vec())],
            ),
        ],
        &[],
    );
    // Received, the upload's restore job checks it (the answer: its page, at once).
    let a = web.upload(&csrf, &bad).await;
    assert_eq!(a.status, 303, "{}", a.body);
    let mut pages = common::web::Web::at(gw.addr, "127.0.0.1");
    assert_eq!(pages.sign_in(PASSPHRASE).await.status, 303);
    let job = pages.job_outcome("restore").await;
    assert!(
        job.body.contains("data-phase=\"failed\"") && job.body.contains("nothing was changed"),
        "a bad entry was accepted: {}",
        job.body
    );
    assert!(
        leftovers(data.path()).is_empty(),
        "{:?}",
        leftovers(data.path())
    );

    // Two at once: the second is refused while the first is under way; the first is applied.
    let first = web.begin_upload(&csrf, &good, good.len() / 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = web.upload(&csrf, &good).await;
    assert_eq!(
        second.status, 409,
        "a second upload at once: {}",
        second.body
    );
    let mut first = first;
    first.write_all(&good[good.len() / 2..]).await.unwrap();
    let first = read_answer(first).await;
    assert_eq!(first.status, 303, "{}", first.body);

    // The restart moves it in, with cursors above any the phone holds.
    let addr = nth_listening(&gw, 2, Duration::from_secs(60)).await;
    assert!(
        leftovers(data.path()).is_empty(),
        "{:?}",
        leftovers(data.path())
    );
    let url = format!("ws://{addr}");
    let (mut t, _) = Client::hello(&url, &tablet.token, &tablet.device_id).await;
    let history = history_ids(&mut t).await;
    assert_eq!(
        history.len(),
        4,
        "two messages and their answers: {history:?}"
    );
    let said = say(&mut t, "after the restore", 4).await;
    t.close().await;
    away_phone_catches_up(&url, &phone, held, &said).await;
    let status = status_text(data.path());
    assert!(status.contains("Gateway: online"), "{status}");
    assert!(!status.contains("Restore:"), "{status}");
}

#[tokio::test]
async fn a_restore_that_fails_at_the_restart_is_reported_and_leaves_nothing_behind() {
    let data = common::temp_data_dir();
    let mut gw = Gateway::start(data.path(), &[]);
    let phone = pair(data.path(), "phone");
    let (mut p, _) = hello_paired(&gw, &phone).await;
    let kept = say(&mut p, "kept", 1).await;
    p.close().await;
    gw.stop_ok();
    drop(gw);
    // What an upload leaves for the restart, spoiled since; and an earlier version's failed
    // upload, which used to stay and fill the disk.
    let pending = data.path().join("pending-restore");
    std::fs::create_dir(&pending).unwrap();
    std::fs::write(pending.join("restore-header.json"), b"{spoiled").unwrap();
    std::fs::write(pending.join("confirmed"), b"").unwrap();
    std::fs::write(
        data.path().join("pending-restore.failed"),
        vec![0u8; 1 << 20],
    )
    .unwrap();

    let gw = Gateway::start(data.path(), &[]);
    let status = status_text(data.path());
    assert!(status.contains("Gateway: online"), "{status}");
    assert!(
        status.contains("Restore: the backup uploaded from the admin page was not restored"),
        "{status}"
    );
    assert!(
        leftovers(data.path()).is_empty(),
        "{:?}",
        leftovers(data.path())
    );
    let (mut p, _) = hello_paired(&gw, &phone).await;
    assert_eq!(history_ids(&mut p).await[0], kept[0]);
    say(&mut p, "still taken", 1).await;
    p.close().await;
}

// ---------------------------------------------------------------------------------------------
// A damaged history database
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_history_damaged_after_start_is_named_by_backup_and_degrades_the_gateway() {
    let data = common::temp_data_dir();
    let mut gw = Gateway::start(data.path(), &[]);
    let phone = pair(data.path(), "phone");
    let (mut p, _) = hello_paired(&gw, &phone).await;
    say(
        &mut p,
        "a note long enough to fill a few pages of the history database",
        20,
    )
    .await;
    p.close().await;
    gw.stop_ok();
    drop(gw);
    let gw = Gateway::start(data.path(), &[]);
    let (c, ack) = hello_paired(&gw, &phone).await;
    assert!(ack.is_object());
    // The card goes bad under the running gateway: every page after the first.
    let db = data.path().join("history").join("history.sqlite3");
    let len = std::fs::metadata(&db).unwrap().len();
    assert!(len > 8 * 1024, "the history is {len} bytes");
    let mut garbage = std::fs::read(&db).unwrap();
    for (i, b) in garbage.iter_mut().enumerate().skip(1024) {
        *b = (i as u8).wrapping_mul(31) ^ 0x5A;
    }
    std::fs::write(&db, &garbage).unwrap();

    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("iris.backup");
    let (ok, o, e) = common::cli_backup(&file, data.path());
    assert!(!ok, "a backup of a damaged history was made:\n{o}");
    assert!(
        e.contains("the history database") && e.contains("history.sqlite3"),
        "the failure does not name the history database:\n{e}"
    );
    assert!(
        !e.contains("iris.backup"),
        "the failure blames the backup file:\n{e}"
    );
    let status = status_text(data.path());
    assert!(
        status.contains("Gateway: degraded")
            && status.contains("the history database")
            && status.contains("history.sqlite3 is damaged or unreadable"),
        "{status}"
    );
    drop(c);
}

// ---------------------------------------------------------------------------------------------
// A disk without room for the restore (a tmpfs: needs root, as tests/storage_faults.rs)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn an_upload_without_room_to_restore_it_is_refused_and_changes_nothing() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "\n*** NOT RUN: mounting a tmpfs needs root; the low-space restore is untested here.\n"
        );
        return;
    }
    let mnt = mount_tmpfs("48m").unwrap_or_else(|e| panic!("cannot mount a tmpfs: {e}"));
    let data = mnt.at.join("data");
    std::fs::create_dir(&data).unwrap();
    owner_set(&data, PASSPHRASE);
    let gw = Gateway::start(&data, &[]);
    let phone = pair(&data, "phone");
    // 14 MiB left, for a 7 MiB backup: room for the upload, not for it and the store built
    // from it above the store's 8 MiB reserve.
    let filler = data.join("filler");
    let want = 14u64 << 20;
    let free = free_bytes(&data);
    assert!(free > want, "{free}");
    std::fs::write(&filler, vec![0xA5u8; (free - want) as usize]).unwrap();
    let photo: Vec<u8> = (0..7u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let upload = craft_backup(&[("meta", vec![])], &[photo]);

    let (web, csrf) = Web::sign_in(gw.addr).await;
    let mut a = web.upload(&csrf, &upload).await;
    if a.status == 303 {
        // Refused by its restore job, once the store built from it showed the room it takes.
        let mut pages = common::web::Web::at(gw.addr, "127.0.0.1");
        assert_eq!(pages.sign_in(PASSPHRASE).await.status, 303);
        let job = pages.job_outcome("restore").await;
        assert!(job.body.contains("data-phase=\"failed\""), "{}", job.body);
        a.body = job.body;
    }
    assert!(
        a.body.to_lowercase().contains("not enough room"),
        "{}",
        a.body
    );
    assert!(leftovers(&data).is_empty(), "{:?}", leftovers(&data));
    // Nothing restarts, nothing is degraded, messages are taken.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let status = status_text(&data);
    assert!(status.contains("Gateway: online"), "{status}");
    let (mut p, _) = hello_paired(&gw, &phone).await;
    say(&mut p, "still taken", 1).await;
    p.close().await;
    drop(gw);
    drop(mnt);
}

/// Restores cut by a kill: an upload half received, and a restore built but never confirmed by
/// its job (a stop or a crash before the restart). The next start deletes both, applies
/// neither, reports nothing failed, and the store is the one the gateway had.
#[tokio::test]
async fn a_restore_cut_by_a_kill_is_deleted_at_start_never_applied_later() {
    let data = common::temp_data_dir();
    owner_set(data.path(), PASSPHRASE);
    let mut gw = Gateway::start(data.path(), &[]);
    let phone = pair(data.path(), "phone");
    let (mut p, _) = hello_paired(&gw, &phone).await;
    let kept = say(&mut p, "kept", 1).await;
    p.close().await;
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("iris.backup");
    backup(&file, data.path());
    let good = std::fs::read(&file).unwrap();

    let (web, csrf) = Web::sign_in(gw.addr).await;
    let _half = web.begin_upload(&csrf, &good, good.len() / 2).await;
    // Its part file in the data dir: the upload is being received.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while leftovers(data.path()).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no upload under way");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gw.kill9();
    drop(gw);
    // What a job that built a restore but was cut before confirming it leaves.
    let pending = data.path().join("pending-restore");
    std::fs::create_dir(&pending).unwrap();
    std::fs::write(pending.join("restore-header.json"), b"{}").unwrap();

    let gw = Gateway::start(data.path(), &[]);
    assert!(
        leftovers(data.path()).is_empty(),
        "{:?}",
        leftovers(data.path())
    );
    let status = status_text(data.path());
    assert!(status.contains("Gateway: online"), "{status}");
    assert!(!status.contains("Restore:"), "{status}");
    let (mut p, _) = hello_paired(&gw, &phone).await;
    assert_eq!(history_ids(&mut p).await[0], kept[0]);
    p.close().await;
}
