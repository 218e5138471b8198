//! The `read.receipt` extension through the real binary on the demo backend: `read.receipt
//! {message_id}` from one device moves the household's marker for the lane, which every device
//! that asked gets as `read.marker` live and by `sync`, and in `hello.ack.read` (also after a
//! restart); a marker never moves back; a device that did not ask sees neither the frame nor
//! the field; bad receipts get `error{not_found}` (or `unsupported` for a malformed payload).

mod common;

use common::{
    connect, connect_with, create_channel, cursor_of, frame_type, pair, pstr, sync_cursor,
    temp_data_dir, typing_off, Client, Gateway, Paired,
};
use serde_json::{json, Value};
use std::time::Duration;

fn read_caps() -> Value {
    json!({ "caps": { "extensions": ["read.receipt"] } })
}

fn is_marker(f: &Value) -> bool {
    frame_type(f) == "read.marker"
}

/// Says `text` in the default channel; returns (the user message's id, the answer's id).
async fn exchange(c: &mut Client, text: &str) -> (String, String) {
    let frames = c.say(text, typing_off).await;
    let user = frames
        .iter()
        .find(|f| frame_type(f) == "message" && f["payload"]["role"] == "user")
        .expect("the echo");
    let stop = frames
        .iter()
        .find(|f| frame_type(f) == "message.stop")
        .expect("the answer");
    (
        pstr(user, "message_id").to_owned(),
        pstr(stop, "message_id").to_owned(),
    )
}

async fn receipt(c: &mut Client, chat: Option<&str>, message_id: &str) -> i64 {
    c.request(
        "read.receipt",
        chat,
        None,
        json!({ "message_id": message_id }),
    )
    .await
}

/// Neither `read.marker` nor `hello.ack.read` reached this device.
fn assert_never_told(c: &Client, ack: &Value) {
    assert!(ack["payload"].get("read").is_none(), "{ack}");
    assert!(
        !c.seen_types().iter().any(|t| t == "read.marker"),
        "{}",
        c.recent()
    );
}

/// Hello with `sync` from `cursor`; returns the ack and every frame up to `sync.done`.
async fn resync(
    gw: &Gateway,
    p: &Paired,
    extra: Value,
    cursor: u64,
) -> (Client, Value, Vec<Value>) {
    let (mut c, ack) = connect_with(gw, p, extra).await;
    let id = c
        .request("sync", None, None, json!({ "cursor": cursor }))
        .await;
    let mut frames = Vec::new();
    loop {
        let f = c.recv().await;
        let done = frame_type(&f) == "sync.done" && f["id"] == json!(id);
        frames.push(f);
        if done {
            return (c, ack, frames);
        }
    }
}

#[tokio::test]
async fn read_state_reaches_devices_that_asked_live_after_sync_and_in_hello_ack() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let phone = pair(dir.path(), "phone");
    let tablet = pair(dir.path(), "tablet");
    let old = pair(dir.path(), "old app");

    let (mut p, p_ack) = connect_with(&gw, &phone, read_caps()).await;
    assert!(
        p_ack["payload"]["server_caps"]["extensions"]
            .as_array()
            .expect("extensions")
            .contains(&json!("read.receipt")),
        "{p_ack}"
    );
    assert_eq!(p_ack["payload"]["read"], json!([]), "{p_ack}");
    let (mut t, t_ack) = connect_with(&gw, &tablet, read_caps()).await;
    let (mut o, o_ack) = connect(&gw, &old).await;

    let (first_user, first_answer) = exchange(&mut p, "hello there").await;
    t.recv_until(typing_off).await;

    // Live: the tablet (and the phone itself) learn the phone read the answer.
    receipt(&mut p, Some("default"), &first_answer).await;
    let m = t.recv_until(is_marker).await;
    assert_eq!(m["payload"], json!({ "message_id": first_answer }), "{m}");
    assert_eq!(m["chat_id"], json!("default"), "{m}");
    assert!(
        m.get("thread_id").is_none() && m.get("cursor").is_none(),
        "{m}"
    );
    let own = p.recv_until(is_marker).await;
    assert_eq!(own["payload"], m["payload"]);

    // Away: the tablet misses a second marker and gets it by `sync`.
    t.close().await;
    let (_, second_answer) = exchange(&mut p, "and again").await;
    receipt(&mut p, None, &second_answer).await;
    p.recv_until(|f| is_marker(f) && pstr(f, "message_id") == second_answer)
        .await;
    // An older message does not move the marker back (nothing is sent for it either).
    receipt(&mut p, Some("default"), &first_user).await;
    receipt(&mut p, Some("default"), &second_answer).await;
    let quiet = p.collect_quiet(Duration::from_millis(400)).await;
    assert!(!quiet.iter().any(is_marker), "{quiet:?}");

    // From where the tablet's first connection began: both markers are after it.
    let (_t2, t2_ack, replay) = resync(&gw, &tablet, read_caps(), sync_cursor(&t_ack)).await;
    let markers: Vec<&Value> = replay.iter().filter(|f| is_marker(f)).collect();
    let ids: Vec<&str> = markers.iter().map(|f| pstr(f, "message_id")).collect();
    assert_eq!(
        ids,
        [first_answer.as_str(), second_answer.as_str()],
        "{replay:?}"
    );
    assert!(
        markers.iter().all(|f| cursor_of(f).is_some()),
        "{markers:?}"
    );
    assert_eq!(
        t2_ack["payload"]["read"],
        json!([{ "chat_id": "default", "message_id": second_answer }]),
        "{t2_ack}"
    );

    // The app that did not ask: nothing live, nothing replayed, nothing in its ack.
    o.collect_quiet(Duration::from_millis(300)).await;
    assert_never_told(&o, &o_ack);
    let (o2, o2_ack, o_replay) = resync(&gw, &old, json!({}), sync_cursor(&o_ack)).await;
    assert!(
        o_replay.iter().any(|f| frame_type(f) == "message.stop"),
        "the replay is there: {o_replay:?}"
    );
    assert_never_told(&o2, &o2_ack);

    // Durable: a restart keeps the marker.
    drop((p, o, o2));
    gw.stop_ok();
    let gw = Gateway::start(dir.path(), &[]);
    let (_t3, t3_ack) = connect_with(&gw, &tablet, read_caps()).await;
    assert_eq!(
        t3_ack["payload"]["read"],
        json!([{ "chat_id": "default", "message_id": second_answer }]),
        "{t3_ack}"
    );
}

#[tokio::test]
async fn bad_receipts_get_errors_and_move_nothing() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let phone = pair(dir.path(), "phone");
    let (mut p, _) = connect_with(&gw, &phone, read_caps()).await;
    let (_, answer) = exchange(&mut p, "hello").await;
    let elsewhere = create_channel(&mut p, "Elsewhere").await;

    let expect = |code: &'static str| {
        move |f: &Value| {
            assert_eq!(frame_type(f), "error", "{f}");
            assert_eq!(f["payload"]["code"], json!(code), "{f}");
        }
    };
    let id = receipt(&mut p, Some("default"), "msg_nonexistent").await;
    expect("not_found")(&p.recv_reply(id).await);
    let id = receipt(&mut p, Some(&elsewhere), &answer).await;
    let wrong_lane = p.recv_reply(id).await;
    expect("not_found")(&wrong_lane);
    assert!(
        pstr(&wrong_lane, "message").contains("not in"),
        "{wrong_lane}"
    );
    let id = receipt(&mut p, Some("chan_gone"), &answer).await;
    expect("not_found")(&p.recv_reply(id).await);
    let id = p
        .request("read.receipt", Some("default"), None, json!({}))
        .await;
    expect("unsupported")(&p.recv_reply(id).await);

    let quiet = p.collect_quiet(Duration::from_millis(300)).await;
    assert!(!quiet.iter().any(is_marker), "{quiet:?}");
    let (_again, ack) = connect_with(&gw, &phone, read_caps()).await;
    assert_eq!(ack["payload"]["read"], json!([]), "{ack}");
}
