//! A power cut at any instant of a start leaves a store that the next start opens, with every
//! acknowledged message; a refused start changes nothing and says what it touched.
//!
//! - Every kill point of a start (`iris_gateway::store::START_KILL_POINTS`: the open and its
//!   checks, the migration from layout 1, the compression rebuild, the upgrade to layout 3, the
//!   server's recovery) is hit with SIGKILL on a copy of the layout-1 fixture and of the layout-2
//!   fixture (`tests/fixtures/`, see tests/layout1.rs), and the next start must serve exactly what
//!   the old release showed. The list is read from the crate, so a new kill point is covered
//!   without a change here.
//! - The start that was cut between the compression rebuild and sled's first snapshot, and the
//!   state an older version left there (its witness still claiming a snapshot), both open.
//! - A refused start leaves the data dir byte for byte as it was, and its message says so; one
//!   that could not protect sled's files says that instead.
//! - A SIGKILL right after a burst of writes through the protocol: the next start has every
//!   message that got a `read.receipt` (the time it takes is in benches/gateway.rs, "burst").

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::fixtures::{expected, unpack_fixture};
use common::{frame_type, Client, Gateway};
use iris_gateway::store::{KillPoint, START_KILL_POINTS};
use serde_json::{json, Value};

/// How a start with a kill point ended.
#[derive(Debug, PartialEq)]
enum Ended {
    /// SIGKILL at the point.
    Killed,
    /// The start never met the point (not on this store's path) and served; it was stopped.
    Served,
}

/// Runs a start with `IRIS_GATEWAY_KILL_AT=point` and waits for it to die there or serve.
fn start_killed_at(data: &Path, point: &str) -> Ended {
    use std::os::unix::process::ExitStatusExt;
    let mut child = common::gateway_command()
        .env("IRIS_GATEWAY_KILL_AT", point)
        .args(["run", "--data-dir"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0", "--demo-pace-ms", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the gateway");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("listening on ws://") {
                let _ = tx.send(());
            }
        }
    });
    let err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(err), &mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let err = stderr.join().unwrap_or_default();
            assert_eq!(
                status.signal(),
                Some(libc::SIGKILL),
                "a start with kill point {point} ended otherwise: {status:?}\n{err}"
            );
            return Ended::Killed;
        }
        if rx.try_recv().is_ok() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let status = child.wait().unwrap();
            assert!(status.success(), "stopping after {point}: {status:?}");
            return Ended::Served;
        }
        assert!(
            Instant::now() < deadline,
            "a start with kill point {point} neither died nor served"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What the tablet sees of the fixture's store now: it must be what the old release showed,
/// plus the pending message and the notice that answered it.
async fn check_view(data: &Path, layout: u64, after: &str) {
    let e = expected(layout);
    let view = &e["view"];
    let mut gw = Gateway::start(data, &[]);
    let tok = e["devices"]["tablet"]["token"].as_str().unwrap();
    let id = e["devices"]["tablet"]["device_id"].as_str().unwrap();
    let (mut t, _) = Client::hello(&gw.url, tok, id).await;
    t.collect_quiet(Duration::from_millis(200)).await;
    let channels = common::channel_list(&mut t).await;
    assert_eq!(
        Value::Array(channels.clone()),
        view["channels"],
        "channels after a kill at {after}"
    );
    let history: BTreeMap<String, Vec<Value>> = common::lane_histories(&mut t, &channels).await;
    let kitchen = e["chats"]["kitchen"].as_str().unwrap();
    for (chat, old) in view["history"].as_object().unwrap() {
        let new = &history[chat];
        let old = old.as_array().unwrap();
        assert!(
            new.len() >= old.len(),
            "lane {chat} lost messages after a kill at {after}"
        );
        assert_eq!(
            &new[..old.len()],
            &old[..],
            "{chat} after a kill at {after}"
        );
        if chat == kitchen {
            let rest = &new[old.len()..];
            assert_eq!(rest.len(), 2, "after a kill at {after}: {rest:?}");
            assert_eq!(rest[0]["message_id"], e["pending"]);
            assert!(rest[1]["text"].as_str().unwrap().contains("restart"));
        } else {
            assert_eq!(new.len(), old.len(), "{chat} after a kill at {after}");
        }
    }
    let id = t
        .request(
            "search",
            None,
            None,
            json!({ "query": "zucchini", "limit": 100 }),
        )
        .await;
    let r = t.recv_reply(id).await;
    assert_eq!(
        r["payload"]["hits"], view["searches"]["zucchini"],
        "search after a kill at {after}"
    );
    let (outbox, _) = common::sync_from(&mut t, 0).await;
    let old_outbox = view["outbox"].as_array().unwrap();
    assert_eq!(
        &outbox[..old_outbox.len()],
        &old_outbox[..],
        "outbox after a kill at {after}"
    );
    t.close().await;
    gw.stop_ok();
}

/// Kills a start of the fixture's store at every kill point in turn (each on a fresh copy),
/// then starts it and checks it. Returns the points that were met.
async fn every_kill_point(layout: u64) -> Vec<&'static str> {
    let mut met = Vec::new();
    for KillPoint { name, after } in START_KILL_POINTS {
        let work = common::temp_data_dir();
        let data = work.path().join("data");
        unpack_fixture(&data, layout);
        if let Some(first) = after {
            assert_eq!(
                start_killed_at(&data, first),
                Ended::Killed,
                "{first} (to set up {name})"
            );
        }
        if start_killed_at(&data, name) == Ended::Killed {
            met.push(*name);
        }
        check_view(&data, layout, name).await;
    }
    met
}

#[tokio::test]
async fn a_start_killed_anywhere_in_the_layout1_migration_opens_with_everything() {
    let met = every_kill_point(1).await;
    // A layout-1 store goes through every step: open, migration, rebuild, layout 3, recovery.
    let all: Vec<&str> = START_KILL_POINTS.iter().map(|p| p.name).collect();
    assert_eq!(met, all);
}

#[tokio::test]
async fn a_start_killed_anywhere_in_the_layout2_rebuild_opens_with_everything() {
    let met = every_kill_point(2).await;
    let expected: Vec<&str> = START_KILL_POINTS
        .iter()
        .map(|p| p.name)
        .filter(|n| !n.starts_with("migrate-"))
        .collect();
    assert_eq!(met, expected);
}

/// The power cut of the issue: after the compression rebuild swapped the copy in and before
/// sled first opened it (so it has no snapshot yet).
#[tokio::test]
async fn a_start_cut_between_the_rebuild_and_the_first_snapshot_serves() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    unpack_fixture(&data, 2);
    assert_eq!(start_killed_at(&data, "rebuild-done"), Ended::Killed);
    assert!(
        !std::fs::read_dir(data.join("db"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("snap.")),
        "the rebuilt copy has no snapshot yet"
    );
    check_view(&data, 2, "rebuild-done").await;
}

/// What an older version left after that cut: a rebuilt `db/` without a snapshot, and its
/// witness still claiming one. That claim was never made durable, so it proves nothing: the
/// store is checked in full and opens (older versions refused it for good with status 65).
#[tokio::test]
async fn a_snapshot_claim_of_an_older_witness_does_not_refuse_a_whole_store() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    unpack_fixture(&data, 2);
    let old_witness = std::fs::read(data.join("store-witness.json")).unwrap();
    assert!(String::from_utf8_lossy(&old_witness).contains("\"snapshot\": true"));
    // Rebuilt and opened once, as the older version got that far; then its snapshot taken
    // away and its old witness back: the state it left when the power went in between.
    let mut gw = Gateway::start(&data, &[]);
    gw.stop_ok();
    for entry in std::fs::read_dir(data.join("db")).unwrap().flatten() {
        if entry.file_name().to_string_lossy().starts_with("snap.") {
            std::fs::remove_file(entry.path()).unwrap();
        }
    }
    std::fs::write(data.join("store-witness.json"), &old_witness).unwrap();
    check_view(
        &data,
        2,
        "an older version's cut between the rebuild and the snapshot",
    )
    .await;
}

/// Every file under `dir` (relative path → SHA-256 of its bytes).
fn hash_tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, common::sha_hex(&std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

/// Runs a start that must be refused as damaged; returns its stderr.
fn refused_start(data: &Path) -> String {
    let out = common::gateway_command()
        .args(["run", "--data-dir"])
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(iris_gateway::store::EXIT_DAMAGED.into()),
        "{err}"
    );
    err
}

/// A store with a few messages, stopped as `stop` says, and its device. Each sync applies its
/// history (`IRIS_GATEWAY_APPLY_EVERY=1`), so after a kill the history database is ahead of an
/// older copy of sled's files put back: what makes the start refuse it.
async fn small_store(data: &Path, texts: &[&str]) -> (common::Paired, Gateway) {
    let phone = common::pair(data, "phone");
    let gw = Gateway::start_with_env(data, &[], &[("IRIS_GATEWAY_APPLY_EVERY", "1")]);
    let (mut c, _) = Client::hello(&gw.url, &phone.token, &phone.device_id).await;
    for text in texts {
        common::send_until_stop(&mut c, None, None, text).await;
    }
    c.close().await;
    (phone, gw)
}

/// Older files put back under a witness that saw newer ones (the last run stopped cleanly, so
/// the start would skip its full check if it trusted that): refused, and every file of the
/// data dir is byte for byte as it was, as the message says.
#[tokio::test]
async fn a_refused_start_changes_no_file_and_says_so() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    let (_, mut gw) = small_store(&data, &["first tomato", "second tomato"]).await;
    gw.stop_ok();
    let older = work.path().join("older-db");
    copy_dir(&data.join("db"), &older);
    let (_, mut gw) = small_store(&data, &["third tomato"]).await;
    gw.stop_ok();
    std::fs::remove_dir_all(data.join("db")).unwrap();
    copy_dir(&older, &data.join("db"));
    let before = hash_tree(&data);
    let err = refused_start(&data);
    assert!(err.contains("Nothing was changed or removed"), "{err}");
    assert_eq!(
        hash_tree(&data),
        before,
        "the refused start changed files: {err}"
    );
}

/// A refused start that could not copy sled's files first (the store was checked in full
/// minutes before, which spares a crash loop a copy per start) does not claim nothing changed.
#[tokio::test]
async fn a_refused_start_without_a_copy_says_sled_may_have_changed_files() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    let (_, mut gw) = small_store(&data, &["first tomato"]).await;
    gw.stop_ok();
    let older = work.path().join("older-db");
    copy_dir(&data.join("db"), &older);
    let (_, mut gw) = small_store(&data, &["second tomato"]).await;
    gw.kill9();
    std::fs::remove_dir_all(data.join("db")).unwrap();
    copy_dir(&older, &data.join("db"));
    let err = refused_start(&data);
    assert!(!err.contains("Nothing was changed"), "{err}");
    assert!(
        err.contains("sled may have rewritten parts of its files"),
        "{err}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Messages a burst sends: enough to make sled replay thousands of records after the kill.
fn burst_messages() -> usize {
    std::env::var("IRIS_TEST_BURST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600)
}

/// A SIGKILL right after a burst of messages through the protocol (four devices, each in a
/// channel of its own, 16 in flight each), with sled reopened for its snapshot several times
/// during the burst: every message that got a `read.receipt` is in history after the restart.
/// How long that start takes is benchmarked, not asserted (benches/gateway.rs, "burst").
#[tokio::test]
async fn a_crash_right_after_a_burst_keeps_every_acknowledged_message() {
    let work = common::temp_data_dir();
    let data = work.path().join("data");
    let config = work.path().join("gateway.toml");
    std::fs::write(
        &config,
        "[limits]\nframes_per_second = 100000\nframe_burst = 100000\nlane_queue_depth = 64\n",
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let phones: Vec<_> = (0..4)
        .map(|i| common::pair(&data, &format!("phone {i}")))
        .collect();
    // sled reopened for its snapshot every 100 KB of its log (a few dozen messages): several
    // times in the burst, so the kill lands between two such reopens, with commits around each.
    let mut gw = Gateway::start_with_env(
        &data,
        &["--config", cfg],
        &[
            ("IRIS_GATEWAY_REPLAY_BOUND_BYTES", "100000"),
            ("IRIS_GATEWAY_REPLAY_CAP_BYTES", "100000"),
        ],
    );
    let per_lane = burst_messages() / 4;
    let mut lanes = Vec::new();
    for (k, p) in phones.iter().enumerate() {
        let (mut c, _) = Client::hello(&gw.url, &p.token, &p.device_id).await;
        let chat = common::create_channel(&mut c, &format!("burst {k}")).await;
        lanes.push(async move {
            let mut receipted = Vec::new();
            let mut sent = BTreeMap::new();
            // 16 waiting for their answers at most, well within the lane's queue.
            let (mut next, mut answered) = (0, 0);
            while receipted.len() < per_lane {
                while next < per_lane && next - answered < 16 {
                    let text = format!("burst {k} message {next}");
                    let id = c.send_text(Some(&chat), None, &text).await;
                    sent.insert(id, text);
                    next += 1;
                }
                let f = c.recv().await;
                match frame_type(&f) {
                    "read.receipt" => {
                        if let Some(text) = common::id_of(&f).and_then(|id| sent.get(&id)) {
                            receipted.push(text.clone());
                        }
                    }
                    "message.stop" if f["chat_id"] == chat.as_str() => answered += 1,
                    t => assert_ne!(t, "error", "{f}"),
                }
            }
            (chat, receipted)
        });
    }
    let all = futures_util::future::join_all(lanes).await;
    gw.kill9();
    assert!(
        gw.stderr_tail()
            .contains("sled reopened to write its snapshot"),
        "sled was not reopened during the burst\n{}",
        gw.output_tail()
    );
    let gw = Gateway::start(&data, &["--config", cfg]);
    let (mut c, _) = Client::hello(&gw.url, &phones[0].token, &phones[0].device_id).await;
    for (chat, receipted) in all {
        let history = whole_lane(&mut c, &chat).await;
        let texts: std::collections::HashSet<&str> =
            history.iter().filter_map(|m| m["text"].as_str()).collect();
        for text in &receipted {
            assert!(texts.contains(text.as_str()), "{text} lost after the crash");
        }
    }
    drop(gw);
}

/// Every message of a channel's lane, paging back with `before_message_id`.
async fn whole_lane(c: &mut Client, chat: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut before: Option<Value> = None;
    loop {
        let mut payload = json!({ "limit": 200 });
        if let Some(b) = &before {
            payload["before_message_id"] = b.clone();
        }
        let id = c.request("history", Some(chat), None, payload).await;
        let r = c.recv_reply(id).await;
        assert_eq!(frame_type(&r), "history", "{r}");
        let page = r["payload"]["messages"].as_array().unwrap().clone();
        let Some(oldest) = page.first() else { break };
        before = Some(oldest["message_id"].clone());
        let n = page.len();
        all.extend(page);
        if n < 200 {
            break;
        }
    }
    all
}
