//! `iris-gateway backup FILE` and `restore FILE`, end to end with the real binary: a backup
//! taken while the gateway runs under light load (through the control socket) and one taken
//! while it is stopped both restore into a data dir whose gateway then has the same history,
//! channels, devices, cursor and media; damaged, truncated and foreign files are refused before
//! anything is touched, and so is a restore while the gateway runs.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::{
    create_channel, create_thread, frame_type, hello_paired, pair, pstr, Client, Gateway, Paired,
};
use serde_json::{json, Value};

fn backup(file: &Path, data: &Path) -> String {
    let (ok, out, err) = common::cli_backup(file, data);
    assert!(ok, "backup failed:\n{out}\n{err}");
    out
}

async fn upload(c: &mut Client, media_ref: &str, data: &[u8]) -> String {
    common::upload_png(c, media_ref, data).await;
    let id = c
        .request(
            "message.send",
            None,
            None,
            json!({ "text": "a photo of the garden", "media_refs": [media_ref] }),
        )
        .await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "read.receipt", "{r}");
    let user = pstr(&r, "message_id").to_owned();
    let echo = c
        .recv_until(|f| frame_type(f) == "message" && pstr(f, "message_id") == user)
        .await;
    c.recv_type("message.stop").await;
    echo["payload"]["media"][0]["media_id"]
        .as_str()
        .expect("media id")
        .to_owned()
}

/// Everything a device can see of a gateway: directory, every lane's history, the outbox.
#[derive(Debug, PartialEq)]
struct Seen {
    head: u64,
    channels: Vec<Value>,
    history: BTreeMap<String, Vec<Value>>,
    outbox: Vec<Value>,
}

async fn look(gw: &Gateway, p: &Paired) -> Seen {
    let (mut c, _ack) = hello_paired(gw, p).await;
    // A turn of the load may still be finishing: look once the gateway has been quiet a while.
    c.collect_quiet(std::time::Duration::from_millis(800)).await;
    let channels = common::channel_list(&mut c).await;
    let history = common::lane_histories(&mut c, &channels).await;
    let (outbox, head) = common::sync_from(&mut c, 0).await;
    c.close().await;
    Seen {
        head,
        channels,
        history,
        outbox,
    }
}

fn devices(data: &Path) -> Value {
    let mut d = common::devices_json(data);
    // Connecting updates last-seen times; compare who is paired.
    for dev in d.as_array_mut().unwrap() {
        dev.as_object_mut().unwrap().remove("last_seen_ms");
    }
    d
}

/// A gateway with channels, a thread, messages, a media file, and two paired devices.
async fn populated(data: &Path) -> (Gateway, Paired, Paired, String, Vec<u8>) {
    let gw = Gateway::start(data, &[]);
    let pa = pair(data, "phone A");
    let pb = pair(data, "tablet B");
    let (mut a, _) = hello_paired(&gw, &pa).await;
    let garden = create_channel(&mut a, "Garden").await;
    let plans = create_thread(&mut a, &garden, "Plans").await;
    for i in 0..5 {
        common::send_until_stop(&mut a, None, None, &format!("default lane note {i}")).await;
        common::send_until_stop(&mut a, Some(&garden), None, &format!("garden note {i}")).await;
        common::send_until_stop(&mut a, Some(&garden), Some(&plans), &format!("plan {i}")).await;
    }
    let photo: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let media_id = upload(&mut a, "photo-1", &photo).await;
    a.close().await;
    (gw, pa, pb, media_id, photo)
}

#[tokio::test]
async fn a_backup_taken_under_load_restores_the_same_gateway() {
    let src = common::temp_data_dir();
    let (gw, pa, pb, media_id, photo) = populated(src.path()).await;
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("iris.backup");

    // Light load while the backup runs: B keeps sending.
    let (mut b, _) = hello_paired(&gw, &pb).await;
    let load = async {
        for i in 0.. {
            common::send_until_stop(&mut b, None, None, &format!("sent during the backup {i}"))
                .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let file2 = file.clone();
    let src_path = src.path().to_owned();
    let made = tokio::task::spawn_blocking(move || backup(&file2, &src_path));
    let printed = tokio::select! {
        _ = load => unreachable!(),
        done = made => done.unwrap(),
    };
    eprintln!("{printed}");
    assert!(printed.contains("from the running gateway"), "{printed}");
    assert!(!printed.contains(" 0 media file(s)"), "{printed}");
    assert!(!out_dir.path().join("iris.backup.partial").exists());
    b.close().await;
    let live = look(&gw, &pa).await;

    let dst = common::temp_data_dir();
    let (ok, out, err) = common::cli_restore(&file, dst.path());
    assert!(ok, "restore failed:\n{out}\n{err}");
    eprintln!("{out}");
    let restored_gw = Gateway::start(dst.path(), &[]);
    let mut restored = look(&restored_gw, &pa).await;
    // A turn may have been running at the snapshot: the restored gateway starts by marking its
    // message interrupted, as after any stop. Those notices are the restored gateway's own.
    let notice = |m: &Value| {
        m["text"]
            .as_str()
            .or_else(|| m["payload"]["text"].as_str())
            .is_some_and(|t| t.contains("The gateway restarted before the agent answered"))
    };
    let notices = restored.outbox.iter().filter(|f| notice(f)).count();
    restored.outbox.retain(|f| !notice(f));
    for msgs in restored.history.values_mut() {
        msgs.retain(|m| !notice(m));
    }
    eprintln!("{notices} turn(s) were running at the snapshot");
    restored.head -= notices as u64;
    // The backup is a snapshot from during the load: the restored gateway has exactly the
    // state of some moment: the same directory, a prefix of the outbox, and each lane's history
    // the messages the outbox had by then.
    assert_eq!(restored.channels, live.channels);
    assert!(
        restored.head <= live.head && restored.head >= 3 * 15,
        "head {} vs {}",
        restored.head,
        live.head
    );
    assert_eq!(
        restored.outbox[..],
        live.outbox[..restored.outbox.len()],
        "the outbox up to the backup's head"
    );
    assert_eq!(
        restored.outbox.last().and_then(common::cursor_of),
        Some(restored.head)
    );
    for (chat, msgs) in &restored.history {
        let all = &live.history[chat];
        assert_eq!(
            &all[..msgs.len()],
            &msgs[..],
            "history of {chat}: a prefix of the live one"
        );
    }
    // Every message the restored outbox carries is in the restored history, and vice versa.
    let in_history: std::collections::BTreeSet<&str> = restored
        .history
        .values()
        .flatten()
        .map(|m| m["message_id"].as_str().unwrap())
        .collect();
    for f in restored
        .outbox
        .iter()
        .filter(|f| matches!(frame_type(f), "message" | "message.stop"))
    {
        assert!(
            in_history.contains(pstr(f, "message_id")),
            "{f} not in the restored history"
        );
    }
    // The set-up device `run` prints goes at the first start after a phone connected
    // (docs/pairing.md): the restored gateway's start is such a start, the source's was not.
    let paired = |d: serde_json::Value| -> Vec<serde_json::Value> {
        d.as_array()
            .unwrap()
            .iter()
            .filter(|d| d["origin"] != "startup")
            .cloned()
            .collect()
    };
    assert_eq!(paired(devices(dst.path())), paired(devices(src.path())));
    let (mut c, _) = hello_paired(&restored_gw, &pb).await;
    assert_eq!(
        common::pull_media(&mut c, &media_id).await,
        photo,
        "the restored media file"
    );
    // And the restored gateway carries on from its head.
    common::send_until_stop(&mut c, None, None, "after the restore").await;
    let after = look(&restored_gw, &pa).await;
    assert_eq!(
        after.outbox[0].get("cursor"),
        restored.outbox[0].get("cursor")
    );
    assert!(after.head > restored.head);
}

#[tokio::test]
async fn a_backup_of_a_stopped_gateway_restores_over_another_store() {
    let src = common::temp_data_dir();
    let (mut gw, pa, _pb, media_id, photo) = populated(src.path()).await;
    let before = look(&gw, &pa).await;
    gw.stop_ok();
    drop(gw);
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("iris.backup");
    let printed = backup(&file, src.path());
    assert!(printed.contains("the gateway was not running"), "{printed}");

    // The destination has a store of its own: it is moved aside, not deleted.
    let dst = common::temp_data_dir();
    let mut other = Gateway::start(dst.path(), &[]);
    let po = pair(dst.path(), "another phone");
    let (mut c, _) = hello_paired(&other, &po).await;
    common::send_until_stop(&mut c, None, None, "the other store's only message").await;
    c.close().await;
    other.stop_ok();
    drop(other);
    let (ok, out, err) = common::cli_restore(&file, dst.path());
    assert!(ok, "restore failed:\n{out}\n{err}");
    assert!(out.contains("was moved to"), "{out}");
    let aside: Vec<_> = std::fs::read_dir(dst.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("before-restore-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "the previous store is kept aside");
    assert!(aside[0].path().join("db/db").exists());

    let gw = Gateway::start(dst.path(), &[]);
    let after = look(&gw, &pa).await;
    assert_eq!(
        after, before,
        "the restored gateway shows exactly what the original did"
    );
    let (mut c, _) = hello_paired(&gw, &pa).await;
    assert_eq!(common::pull_media(&mut c, &media_id).await, photo);
    // The other store's device is not paired with the restored one.
    let mut x = Client::open(&gw.url).await;
    x.send(json!({
        "v": 1, "type": "hello", "id": 1,
        "payload": { "token": po.token, "device_id": po.device_id, "device_name": "x" },
    }))
    .await;
    let r = x
        .recv_until(|f| matches!(frame_type(f), "hello.ack" | "error"))
        .await;
    assert_eq!(pstr(&r, "code"), "auth", "{r}");
}

#[tokio::test]
async fn damaged_foreign_and_untimely_restores_are_refused() {
    let src = common::temp_data_dir();
    let (gw, _pa, _pb, _m, _p) = populated(src.path()).await;
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("iris.backup");
    backup(&file, src.path());
    let good = std::fs::read(&file).unwrap();

    // While the gateway runs on the data dir.
    let (ok, _, err) = common::cli_restore(&file, src.path());
    assert!(!ok);
    assert!(
        err.contains("a gateway is running") && err.contains("stop it first"),
        "{err}"
    );
    drop(gw);

    let dst = common::temp_data_dir();
    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    cases.push(("a flipped byte", flipped, "is damaged or incomplete"));
    cases.push((
        "cut short",
        good[..good.len() * 2 / 3].to_vec(),
        "is damaged or incomplete",
    ));
    cases.push((
        "missing its last byte",
        good[..good.len() - 1].to_vec(),
        "is damaged or incomplete",
    ));
    cases.push((
        "not a backup",
        b"hello, this is a text file\n".to_vec(),
        "is not an iris-gateway backup",
    ));
    cases.push(("empty", Vec::new(), "is not an iris-gateway backup"));
    for (case, bytes, words) in cases {
        let bad = out_dir.path().join("bad.backup");
        std::fs::write(&bad, &bytes).unwrap();
        let (ok, out, err) = common::cli_restore(&bad, dst.path());
        assert!(!ok, "{case}: restored anyway:\n{out}");
        assert!(err.contains(words), "{case}: {err}");
        let left: Vec<_> = std::fs::read_dir(dst.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(
            left.is_empty(),
            "{case}: the data dir was touched: {left:?}"
        );
        eprintln!("{case}: {}", err.trim());
    }
    // The good one still works there.
    let (ok, out, err) = common::cli_restore(&file, dst.path());
    assert!(ok, "{out}\n{err}");
}
