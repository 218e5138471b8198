//! The history database is given sled's journal a few turns at a time (docs/storage.md, "The
//! apply path" and "SD-card wear"), so turns share one SQLite transaction's index pages in the
//! WAL; nothing a device can see waits for it: a search or a history page right after a turn
//! finds it, and a SIGKILL before the batch is applied loses nothing.

mod common;

use std::path::Path;

use common::{frame_type, hello_paired, pair, pstr, temp_data_dir, Client, Gateway};

/// A WAL frame: its 24-byte header and one 1 KiB page (the history database's page size).
const WAL_FRAME_BYTES: u64 = 24 + 1024;

/// Sends `text` in the default channel, waits for the demo agent's reply to finish; returns
/// the user message's id and the reply's.
async fn turn(c: &mut Client, text: &str) -> (String, String) {
    let frames = c.say(text, |f| frame_type(f) == "message.stop").await;
    let receipt = frames
        .iter()
        .find(|f| frame_type(f) == "read.receipt")
        .unwrap_or_else(|| panic!("no read.receipt for `{text}`"));
    let stop = frames.last().unwrap();
    (
        pstr(receipt, "message_id").to_owned(),
        pstr(stop, "message_id").to_owned(),
    )
}

/// The ids of the default channel's newest messages, oldest first.
async fn newest_ids(c: &mut Client) -> Vec<String> {
    c.newest_messages(None, 50)
        .await
        .iter()
        .map(|m| m["message_id"].as_str().unwrap().to_owned())
        .collect()
}

fn wal_bytes(data: &Path) -> u64 {
    std::fs::metadata(data.join("history").join("history.sqlite3-wal")).map_or(0, |m| m.len())
}

#[tokio::test]
async fn a_turn_is_found_at_once_though_history_is_applied_a_few_turns_at_a_time() {
    let dir = temp_data_dir();
    let phone = pair(dir.path(), "phone");
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = hello_paired(&gw, &phone).await;
    // One turn: far fewer journal entries than a batch, so nothing applied them at its syncs.
    let (asked, answered) = turn(&mut c, "a parsnip for the soup").await;
    assert_eq!(
        c.search_ids("parsnip").await,
        [answered.clone(), asked.clone()]
    );
    let ids = newest_ids(&mut c).await;
    assert!(ids.ends_with(&[asked.clone(), answered.clone()]), "{ids:?}");
    // The next turn, read through a history page before any search.
    let (asked2, answered2) = turn(&mut c, "a swede as well").await;
    let ids = newest_ids(&mut c).await;
    assert!(
        ids.ends_with(&[asked, answered, asked2, answered2]),
        "{ids:?}"
    );
}

/// Sixteen demo turns write the WAL fewer than half the pages a turn did when each turn was
/// its own transaction: 12.8 pages a turn here then (`IRIS_GATEWAY_APPLY_EVERY=turn`), 2.6
/// applied sixteen journal entries at a time.
#[tokio::test]
async fn turns_share_the_history_databases_pages() {
    const TURNS: u64 = 16;
    let dir = temp_data_dir();
    let phone = pair(dir.path(), "phone");
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = hello_paired(&gw, &phone).await;
    // The first turn creates the lane's pages; count the steady state after it.
    turn(&mut c, "the first turn of the lane").await;
    assert!(c.search_ids("first").await.len() == 2);
    let before = wal_bytes(dir.path());
    let mut said = Vec::new();
    for i in 0..TURNS {
        said.push(turn(&mut c, &format!("turn number{i}x of the count")).await);
    }
    // A search applies whatever the journal still holds, and finds every turn.
    for (i, (asked, answered)) in said.iter().enumerate() {
        let hits = c.search_ids(&format!("number{i}x")).await;
        assert_eq!(hits, [answered.clone(), asked.clone()], "turn {i}");
    }
    let grown = wal_bytes(dir.path()) - before;
    let pages_a_turn = grown as f64 / WAL_FRAME_BYTES as f64 / TURNS as f64;
    eprintln!("WAL pages a turn: {pages_a_turn:.1}");
    assert!(
        pages_a_turn < 6.0,
        "the WAL grew {grown} bytes over {TURNS} turns: {pages_a_turn:.1} pages a turn"
    );
}

/// A SIGKILL while the last turns wait in sled's journal for their batch: the next start
/// applies them, and search and history have them.
#[tokio::test]
async fn turns_not_yet_applied_survive_a_kill() {
    let dir = temp_data_dir();
    let phone = pair(dir.path(), "phone");
    let mut gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = hello_paired(&gw, &phone).await;
    let (asked, answered) = turn(&mut c, "a beetroot before the kill").await;
    gw.kill9();
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = hello_paired(&gw, &phone).await;
    assert_eq!(
        c.search_ids("beetroot").await,
        [answered.clone(), asked.clone()]
    );
    let ids = newest_ids(&mut c).await;
    assert!(ids.ends_with(&[asked, answered]), "{ids:?}");
}
