//! `agent.steer` and `/steer TEXT` through the real binary on the demo backend, which cannot
//! be steered: the steer is stored and shown to every device marked `steer`, and since nothing
//! can take it, it becomes the lane's next message with a system note saying why (never an
//! `error`); bad steers are refused with the right code and store nothing. A Hermes that takes
//! steers is tested in tests/hermes_newer.rs, one that does not in tests/agent_hermes.rs.

mod common;

use common::{connect, demo_reply, frame_type, pair, pstr, system_answer, temp_data_dir, Gateway};
use serde_json::{json, Value};

fn is_steer_echo(f: &Value, text: &str) -> bool {
    frame_type(f) == "message"
        && f["payload"]["role"] == "user"
        && f["payload"]["steer"] == json!(true)
        && f["payload"]["text"] == json!(text)
}

fn is_answer(f: &Value) -> bool {
    frame_type(f) == "message.stop"
}

#[tokio::test]
async fn with_nothing_to_take_it_a_steer_is_the_next_message_on_every_device() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "50"]);
    let (mut phone, ack) = connect(&gw, &pair(dir.path(), "phone")).await;
    let (mut tablet, _) = connect(&gw, &pair(dir.path(), "tablet")).await;
    // The demo cannot be steered: the extension is not offered.
    let listed = ack["payload"]["server_caps"]["extensions"]
        .as_array()
        .expect("extensions");
    assert!(!listed.contains(&json!("agent.steer")), "{ack}");

    // Nothing is running.
    phone
        .request(
            "agent.steer",
            Some("default"),
            None,
            json!({ "text": "keep it short" }),
        )
        .await;
    tablet
        .recv_until(|f| is_steer_echo(f, "keep it short"))
        .await;
    let note = tablet.recv_until(system_answer).await;
    assert_eq!(
        pstr(&note, "text"),
        "Not taken by a running answer (nothing was running in this chat): sent to the agent as the next message.",
        "{note}"
    );
    let answer = tablet.recv_until(is_answer).await;
    assert_eq!(
        pstr(&answer, "final_text"),
        demo_reply("keep it short"),
        "{answer}"
    );
    phone.recv_until(is_answer).await;

    // `/steer TEXT` while an answer runs, which the demo cannot take: it waits for that answer
    // and goes next. Its sender gets the read.receipt of a message.send, naming the steer.
    let long: String = (1..=40).map(|i| format!("w{i} ")).collect();
    phone.send_text(Some("default"), None, long.trim()).await;
    phone
        .recv_until(|f| frame_type(f) == "message.update")
        .await;
    let id = phone
        .send_text(Some("default"), None, "/steer in French please")
        .await;
    let receipt = phone.recv_reply(id).await;
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    let echo = phone
        .recv_until(|f| is_steer_echo(f, "in French please"))
        .await;
    assert_eq!(
        receipt["payload"]["message_id"], echo["payload"]["message_id"],
        "{receipt} {echo}"
    );
    let note = phone.recv_until(system_answer).await;
    assert!(
        pstr(&note, "text").contains("this agent cannot take guidance while it answers"),
        "{note}"
    );
    let first = phone.recv_until(is_answer).await;
    assert_eq!(pstr(&first, "final_text"), demo_reply(long.trim()));
    let second = phone.recv_until(is_answer).await;
    assert_eq!(pstr(&second, "final_text"), demo_reply("in French please"));

    // History keeps both marked.
    let id = tablet
        .request("history", Some("default"), None, json!({ "limit": 20 }))
        .await;
    let h = tablet.recv_reply(id).await;
    let marked: Vec<&str> = h["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["steer"] == json!(true))
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(marked, ["keep it short", "in French please"], "{h}");
}

#[tokio::test]
async fn a_bad_steer_is_refused_and_stores_nothing() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--max-text-bytes", "1000"]);
    let (mut c, _) = connect(&gw, &pair(dir.path(), "phone")).await;
    let too_long = "x".repeat(1001);
    for (chat, text, code) in [
        (Some("default"), "   ", "unsupported"),
        (Some("chan_doesnotexist"), "hi", "not_found"),
        (Some("default"), too_long.as_str(), "unsupported"),
    ] {
        let id = c
            .request("agent.steer", chat, None, json!({ "text": text }))
            .await;
        let e = c.recv_reply(id).await;
        assert_eq!(frame_type(&e), "error", "{e}");
        assert_eq!(e["payload"]["code"], code, "{e}");
        assert!(!pstr(&e, "message").is_empty(), "{e}");
    }
    let id = c
        .request("agent.steer", Some("default"), None, json!({}))
        .await;
    let e = c.recv_reply(id).await;
    assert_eq!(e["payload"]["code"], "unsupported", "{e}");
    let id = c
        .request("history", Some("default"), None, json!({ "limit": 10 }))
        .await;
    let h = c.recv_reply(id).await;
    assert_eq!(h["payload"]["messages"], json!([]), "{h}");
}
