//! Search folds case and normalisation as docs/search.md says, over the socket: "σας" and
//! "ΣΑΣ" find each other (every Greek word ending in -ς), "istanbul" finds "İstanbul", a
//! composed "café" finds a decomposed one and the reverse. A history indexed by the old code
//! (schema 1: the raw text, FTS5's `unicode61`) is re-indexed at start, and a SIGKILL in the
//! middle of that (`IRIS_GATEWAY_KILL_AT=reindex`) leaves a store that opens and finishes it.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use common::{
    connect_online, frame_type, gateway_command, pair, pstr, temp_data_dir, Client, Gateway,
};

/// Sends `text` to the default channel and waits for the demo agent's reply to finish; returns
/// the user message's id.
async fn say(c: &mut Client, text: &str) -> String {
    let frames = c.say(text, |f| frame_type(f) == "message.stop").await;
    let receipt = frames
        .iter()
        .find(|f| frame_type(f) == "read.receipt")
        .unwrap_or_else(|| panic!("no read.receipt for `{text}`"));
    pstr(receipt, "message_id").to_owned()
}

/// The messages every case test writes: (label, text).
const TEXTS: [(&str, &str); 5] = [
    ("upper", "ΣΑΣ ΕΥΧΑΡΙΣΤΟΥΜΕ"),
    ("lower", "σας ευχαριστούμε πολύ"),
    ("dotted", "İstanbul in May"),
    ("composed", "caf\u{e9} crème tonight"),
    ("decomposed", "cafe\u{301} tomorrow"),
];

/// Asserts every folding the docs promise, given the user message ids by label.
async fn assert_folds(c: &mut Client, ids: &[(&str, String)]) {
    let id = |label: &str| ids.iter().find(|(l, _)| *l == label).unwrap().1.clone();
    let has = |hits: &[String], label: &str| hits.contains(&id(label));
    for q in ["σας", "ΣΑΣ", "Σας"] {
        let hits = c.search_ids(q).await;
        assert!(
            has(&hits, "upper") && has(&hits, "lower"),
            "`{q}` must find both ΣΑΣ and σας: {hits:?} (ids {ids:?})"
        );
    }
    for q in ["istanbul", "İSTANBUL", "Istanbul"] {
        let hits = c.search_ids(q).await;
        assert!(has(&hits, "dotted"), "`{q}` must find İstanbul: {hits:?}");
    }
    for q in ["caf\u{e9}", "cafe\u{301}", "CAF\u{c9}"] {
        let hits = c.search_ids(q).await;
        assert!(
            has(&hits, "composed") && has(&hits, "decomposed"),
            "`{q}` must find both forms of café: {hits:?}"
        );
    }
    // Diacritics are kept, as before.
    assert!(!has(&c.search_ids("creme").await, "composed"));
}

async fn write_texts(c: &mut Client) -> Vec<(&'static str, String)> {
    let mut ids = Vec::new();
    for (label, text) in TEXTS {
        ids.push((label, say(c, text).await));
    }
    ids
}

#[tokio::test]
async fn search_folds_case_and_normalisation_both_ways() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect_online(&gw, &p).await;
    let ids = write_texts(&mut c).await;
    assert_folds(&mut c, &ids).await;
}

/// Makes the history database's index what iris-gateway 0.1 wrote (schema 1): the raw text,
/// tokenised by `unicode61`, no fold.
fn downgrade_to_schema_1(dir: &Path) {
    let c = rusqlite::Connection::open(dir.join("history").join("history.sqlite3")).unwrap();
    c.execute_batch(
        "BEGIN;
         DROP TRIGGER messages_ai; DROP TRIGGER messages_ad; DROP TRIGGER messages_au;
         DROP TABLE search;
         CREATE VIRTUAL TABLE search USING fts5(text, content='messages', content_rowid='seq',
             tokenize='unicode61 remove_diacritics 0', columnsize=0);
         CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
             INSERT INTO search(rowid, text) VALUES (new.seq, new.text); END;
         CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
             INSERT INTO search(search, rowid, text) VALUES ('delete', old.seq, old.text); END;
         CREATE TRIGGER messages_au AFTER UPDATE OF text ON messages BEGIN
             INSERT INTO search(search, rowid, text) VALUES ('delete', old.seq, old.text);
             INSERT INTO search(rowid, text) VALUES (new.seq, new.text); END;
         INSERT INTO search(search) VALUES ('rebuild');
         UPDATE meta SET value = 1 WHERE key = 'schema';
         COMMIT;
         PRAGMA wal_checkpoint(TRUNCATE);",
    )
    .unwrap();
}

fn schema(dir: &Path) -> i64 {
    let c = rusqlite::Connection::open(dir.join("history").join("history.sqlite3")).unwrap();
    c.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
        r.get(0)
    })
    .unwrap()
}

#[tokio::test]
async fn an_old_history_is_reindexed_and_a_kill_during_it_is_finished_at_the_next_start() {
    let dir = temp_data_dir();
    let p = pair(dir.path(), "phone");
    let ids = {
        let mut gw = Gateway::start(dir.path(), &[]);
        let (mut c, _) = connect_online(&gw, &p).await;
        let ids = write_texts(&mut c).await;
        gw.stop_ok();
        ids
    };
    downgrade_to_schema_1(dir.path());
    assert_eq!(schema(dir.path()), 1);

    // Killed in the middle of the re-index: after every row was indexed, before the commit.
    let mut child = gateway_command()
        .args(["run", "--data-dir"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0"])
        .env("IRIS_GATEWAY_KILL_AT", "reindex")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the gateway did not die at the re-index hook within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the gateway must die at the re-index hook: {status:?}"
    );
    assert_eq!(
        schema(dir.path()),
        1,
        "a killed re-index must leave schema 1"
    );

    // The next start opens the store and finishes it.
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = connect_online(&gw, &p).await;
    assert_folds(&mut c, &ids).await;
    drop(c);
    drop(gw);
    assert_eq!(schema(dir.path()), 2);
}
