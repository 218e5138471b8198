//! Damage in the history database found while the gateway runs is named and shown wherever it
//! is found (docs/durability.md, "Damage found while running"): a backup, a phone's history page
//! and a search that read a message whose text is not UTF-8 each fail with a message naming
//! the damaged history database, and the gateway turns `degraded` with that cause and what the
//! owner can do, in `iris-gateway status` and to every phone. The damage is made with SQLite
//! itself on a stopped gateway's store, as a failing card could leave it: the start-up checks
//! do not read every row, so the gateway starts `online`.

mod common;

use std::path::Path;

use common::web::Web;
use common::{
    cli_backup, cli_os, connect_with_status, frame_type, owner_set, pair, pstr, send_until_stop,
    temp_data_dir, Client, Gateway, Paired,
};
use serde_json::json;

const PASSPHRASE: &str = "violet tractor harbour 42";
/// A word only the damaged message holds, for the search.
const WORD: &str = "zanzibar";
/// How many of the newest history rows the start-up check reads back (`History::quick_look`).
const START_CHECKED_ROWS: usize = 64;

/// A stopped gateway's store with one message whose text is no longer UTF-8 (the search index
/// still holds its words) and newer ones after it, and the phone paired to it.
async fn store_with_a_damaged_text(data: &Path) -> Paired {
    owner_set(data, PASSPHRASE);
    let phone = pair(data, "phone");
    let mut gw = Gateway::start(data, &[]);
    let (mut c, _, _) = connect_with_status(&gw, &phone).await;
    let damaged = send_until_stop(&mut c, None, None, &format!("a note on {WORD}")).await;
    // Older than the rows the start-up check reads back (the newest 64: a user message and a
    // reply each), as damage that check cannot see.
    for i in 0..START_CHECKED_ROWS / 2 + 1 {
        send_until_stop(&mut c, None, None, &format!("and one more, {i}")).await;
    }
    c.close().await;
    gw.stop_ok();
    drop(gw);

    let db = rusqlite::Connection::open(data.join("history").join("history.sqlite3")).unwrap();
    // The index's triggers call the gateway's own fold function: the damage bypasses them, as
    // a bad sector would.
    let trigger: String = db
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'messages_au'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    db.execute_batch("DROP TRIGGER messages_au").unwrap();
    let changed = db
        .execute(
            "UPDATE messages SET text = CAST(X'6E6F7465C328FF' AS TEXT) WHERE message_id = ?1",
            [&damaged],
        )
        .unwrap();
    assert_eq!(
        changed, 1,
        "the message {damaged} is not in the history database"
    );
    db.execute_batch(&trigger).unwrap();
    db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    phone
}

fn status_text(data: &Path) -> String {
    let out = cli_os(&["status".as_ref(), "--data-dir".as_ref(), data.as_os_str()]);
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// What every path must leave: `degraded` in `status`, saying what is damaged and what to do,
/// the same among the admin home page's problems, and a phone that connects now is told
/// `degraded`.
async fn assert_degraded_with_the_cause(gw: &Gateway, data: &Path, phone: &Paired) {
    let status = status_text(data);
    eprintln!("{status}");
    assert!(
        status.contains("Gateway: degraded")
            && status.contains("the history database")
            && status.contains("damaged")
            && status.contains("restore"),
        "{status}"
    );
    let mut owner = Web::new(gw, "127.0.0.1");
    assert_eq!(owner.sign_in(PASSPHRASE).await.status, 303);
    let home = owner.get("/admin/").await;
    let problems = home.body.split("id=\"problems\"").nth(1).unwrap_or("");
    assert!(
        problems.contains("the history database") && problems.contains("damaged"),
        "the home page's problems do not name the damage:\n{}",
        home.body
    );
    let (_, _, greeting) = connect_with_status(gw, phone).await;
    assert_eq!(greeting["payload"]["state"], "degraded", "{greeting}");
}

/// The phone was `online`, is told `degraded` as it happens, and gets an `error` (not a hang)
/// naming the damage for the request that found it.
async fn refused_for_damage(c: &mut Client, kind: &str, payload: serde_json::Value) {
    let id = c.request(kind, None, None, payload).await;
    let reply = c.recv_reply(id).await;
    assert_eq!(frame_type(&reply), "error", "{kind} answered {reply}");
    assert_eq!(pstr(&reply, "code"), "internal", "{reply}");
    let said = pstr(&reply, "message");
    assert!(
        said.contains("the history database is damaged") && said.contains("restore"),
        "{said}"
    );
    assert!(
        c.seen
            .iter()
            .any(|f| frame_type(f) == "status" && f["payload"]["state"] == "degraded"),
        "the phone was not told `degraded`: {}",
        c.recent()
    );
}

#[tokio::test]
async fn a_backup_that_meets_damage_names_it_and_degrades_the_gateway() {
    let data = temp_data_dir();
    let phone = store_with_a_damaged_text(data.path()).await;
    let gw = Gateway::start(data.path(), &[]);
    assert!(status_text(data.path()).contains("Gateway: online"));

    let out = tempfile::tempdir().unwrap();
    let (ok, o, e) = cli_backup(&out.path().join("iris.backup"), data.path());
    assert!(!ok, "a backup of a damaged history was made:\n{o}");
    assert!(
        e.contains("the history database") && e.contains("history.sqlite3"),
        "the failure does not name the history database:\n{e}"
    );
    assert_degraded_with_the_cause(&gw, data.path(), &phone).await;
}

/// A phone's request that reads the damaged message, on a gateway that started `online`: it
/// gets an `error` naming the damage, and the gateway is `degraded` with that cause.
async fn a_phone_request_meets_damage(kind: &str, payload: serde_json::Value) {
    let data = temp_data_dir();
    let phone = store_with_a_damaged_text(data.path()).await;
    let gw = Gateway::start(data.path(), &[]);
    let (mut c, _, greeting) = connect_with_status(&gw, &phone).await;
    assert_eq!(greeting["payload"]["state"], "online", "{greeting}");

    refused_for_damage(&mut c, kind, payload).await;
    assert_degraded_with_the_cause(&gw, data.path(), &phone).await;
}

#[tokio::test]
async fn a_history_page_that_meets_damage_is_an_error_and_degrades_the_gateway() {
    a_phone_request_meets_damage("history", json!({ "limit": 200 })).await;
}

#[tokio::test]
async fn a_search_that_meets_damage_is_an_error_and_degrades_the_gateway() {
    a_phone_request_meets_damage("search", json!({ "query": WORD })).await;
}
