//! Slash commands and pickers against the real binary with the demo agent: the catalog, the
//! commands the gateway answers itself (never sent to the agent), pickers that are outboxed and
//! expire on restart, `/stop` of a running turn, and `/status`.

mod common;

use std::time::Duration;

use common::{
    connect, frame_type, pair, pstr, system_answer, temp_data_dir, typing_off, Client, Gateway,
};
use serde_json::{json, Value};

/// Sends `text` in the default channel and returns every frame up to the gateway's `system`
/// answer (inclusive).
async fn command(c: &mut Client, text: &str) -> Vec<Value> {
    c.say(text, system_answer).await
}

fn system_text(frames: &[Value]) -> String {
    frames
        .last()
        .map(|f| pstr(f, "text").to_owned())
        .unwrap_or_default()
}

fn field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

fn start() -> (tempfile::TempDir, Gateway, common::Paired) {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    (dir, gw, p)
}

#[tokio::test]
async fn the_catalog_lists_the_gateway_commands() {
    let (_dir, gw, p) = start();
    let (mut c, ack) = connect(&gw, &p).await;
    assert_eq!(ack["payload"]["server_caps"]["pickers"], true, "{ack}");
    let id = c.request("commands.catalog", None, None, json!({})).await;
    let r = c.recv_reply(id).await;
    assert_eq!(frame_type(&r), "commands.catalog", "{r}");
    let commands = r["payload"]["commands"].as_array().expect("commands");
    let names: Vec<&str> = commands.iter().map(|c| field(c, "name")).collect();
    for want in ["/new", "/stop", "/help", "/status", "/reasoning", "/fast"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // The demo cannot switch models, so /model is not offered.
    assert!(!names.contains(&"/model"), "{names:?}");
    let new = commands.iter().find(|c| c["name"] == "/new").unwrap();
    assert_eq!(new["aliases"], json!(["/reset"]), "{new}");
    for c in commands {
        assert!(field(c, "name").starts_with('/'), "{c}");
        assert!(!field(c, "description").is_empty(), "{c}");
        assert!(!field(c, "category").is_empty(), "{c}");
    }
    let reasoning = commands.iter().find(|c| c["name"] == "/reasoning").unwrap();
    assert!(
        field(reasoning, "args_hint").contains("high"),
        "{reasoning}"
    );
}

#[tokio::test]
async fn commands_are_answered_by_the_gateway_and_never_reach_the_agent() {
    let (_dir, gw, p) = start();
    let (mut c, _) = connect(&gw, &p).await;
    let frames = command(&mut c, "/help").await;
    assert!(
        frames.iter().all(|f| frame_type(f) != "message.start"),
        "a command must not start an agent turn: {frames:?}"
    );
    // The command itself is echoed and stored like any message.
    assert!(
        frames
            .iter()
            .any(|f| frame_type(f) == "message" && f["payload"]["role"] == "user"),
        "{frames:?}"
    );
    let help = system_text(&frames);
    assert!(help.contains("/new") && help.contains("/reset"), "{help}");
    assert!(help.contains("sent to the agent"), "{help}");

    let status = system_text(&command(&mut c, "/status").await);
    assert!(status.contains("Gateway: online"), "{status}");
    assert!(status.contains("Agent: demo"), "{status}");
    assert!(
        status.contains("Storage:") && status.contains("Push: none"),
        "{status}"
    );
    assert!(status.contains("1 device(s) connected"), "{status}");

    let new = system_text(&command(&mut c, "/reset").await);
    assert!(new.contains("new conversation"), "{new}");
    let idle = system_text(&command(&mut c, "/stop").await);
    assert!(idle.contains("Nothing is running"), "{idle}");

    // Both the commands and the answers are in history.
    let id = c
        .request("history", Some("default"), None, json!({ "limit": 20 }))
        .await;
    let h = c.recv_reply(id).await;
    let roles: Vec<&str> = h["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| field(m, "role"))
        .collect();
    // (v1 `history` has only user/assistant roles: the gateway's answers page in as assistant.)
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant"
        ],
        "{h}"
    );
}

#[tokio::test]
async fn a_picker_sets_a_choice_and_answers_in_its_chat() {
    let (_dir, gw, p) = start();
    let (mut c, _) = connect(&gw, &p).await;
    let id = c.send_text(Some("default"), None, "/reasoning").await;
    c.recv_reply(id).await;
    let picker = c.recv_type("picker.choice").await;
    assert_eq!(picker["chat_id"], "default", "{picker}");
    assert_eq!(pstr(&picker, "title"), "Reasoning effort");
    let choices = picker["payload"]["choices"].as_array().unwrap();
    let values: Vec<&str> = choices.iter().map(|c| field(c, "value")).collect();
    assert_eq!(values, ["default", "none", "low", "medium", "high"]);
    let current: Vec<&str> = choices
        .iter()
        .filter(|c| c["is_current"] == true)
        .map(|c| field(c, "value"))
        .collect();
    assert_eq!(current, ["default"]);
    let picker_id = pstr(&picker, "picker_id").to_owned();

    c.request(
        "picker.select",
        None,
        None,
        json!({ "picker_id": picker_id, "value": "high" }),
    )
    .await;
    let answer = c
        .recv_until(|f| frame_type(f) == "message" && f["payload"]["role"] == "system")
        .await;
    assert_eq!(answer["chat_id"], "default", "{answer}");
    assert_eq!(pstr(&answer, "text"), "Reasoning effort: high.");

    // Answered once: the same id again is a no-op, as is an unknown one.
    for id in [picker_id.as_str(), "pk_unknown"] {
        c.request(
            "picker.select",
            None,
            None,
            json!({ "picker_id": id, "value": "low" }),
        )
        .await;
    }
    c.assert_silent(Duration::from_millis(600)).await;

    // The next picker shows the new choice as current; /fast has its own.
    let frames = {
        c.send_text(Some("default"), None, "/reasoning").await;
        c.recv_type("picker.choice").await
    };
    let current: Vec<&str> = frames["payload"]["choices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["is_current"] == true)
        .map(|c| field(c, "value"))
        .collect();
    assert_eq!(current, ["high"]);
    let fast = system_text(&command(&mut c, "/fast on").await);
    assert_eq!(fast, "Fast mode on.");
    let bad = system_text(&command(&mut c, "/reasoning extreme").await);
    assert!(bad.contains("not a reasoning level"), "{bad}");
    let model = system_text(&command(&mut c, "/model big").await);
    assert!(
        model.contains("does not offer a choice of model"),
        "{model}"
    );
    let status = system_text(&command(&mut c, "/status").await);
    assert!(status.contains("reasoning high, fast on"), "{status}");
}

#[tokio::test]
async fn pickers_are_outboxed_and_expire_on_restart() {
    let dir = temp_data_dir();
    let mut gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, ack) = connect(&gw, &p).await;
    let start_cursor = common::sync_cursor(&ack);
    c.send_text(Some("default"), None, "/fast").await;
    let picker = c.recv_type("picker.choice").await;
    let picker_id = pstr(&picker, "picker_id").to_owned();

    // A device that was away sees the picker on sync.
    let other = pair(dir.path(), "tablet");
    let (mut t, _) = connect(&gw, &other).await;
    let id = t
        .request("sync", None, None, json!({ "cursor": start_cursor }))
        .await;
    let replayed = t
        .recv_until(|f| frame_type(f) == "picker.choice" || f["id"] == json!(id))
        .await;
    assert_eq!(frame_type(&replayed), "picker.choice", "{}", t.recent());
    assert_eq!(pstr(&replayed, "picker_id"), picker_id);
    assert!(common::cursor_of(&replayed).is_some(), "{replayed}");
    drop((c, t));

    gw.stop_ok();
    let gw = Gateway::start(dir.path(), &["--listen", &gw.addr.to_string()]);
    let (mut c, _) = connect(&gw, &p).await;
    c.request(
        "picker.select",
        None,
        None,
        json!({ "picker_id": picker_id, "value": "on" }),
    )
    .await;
    c.assert_silent(Duration::from_millis(600)).await;
    let status = system_text(&command(&mut c, "/status").await);
    assert!(
        status.contains("fast off"),
        "the expired picker changed nothing: {status}"
    );
}

#[tokio::test]
async fn stop_ends_the_running_turn_and_keeps_what_was_said() {
    let dir = temp_data_dir();
    // A slow demo turn: about 20 steps of 150 ms.
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "150"]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect(&gw, &p).await;
    c.send_text(
        Some("default"),
        None,
        "one two three four five six seven eight nine ten",
    )
    .await;
    c.recv_type("message.update").await;
    let frames = command(&mut c, "/stop").await;
    assert_eq!(system_text(&frames), "Stopped the agent's answer.");
    // The stopped turn's end may come before or after the gateway's answer.
    let stop = match frames.iter().find(|f| frame_type(f) == "message.stop") {
        Some(f) => f.clone(),
        None => c.recv_type("message.stop").await,
    };
    let text = pstr(&stop, "final_text");
    assert!(text.ends_with("Stopped."), "{stop}");
    assert!(
        !text.contains("demo agent; connect"),
        "the reply was cut short: {stop}"
    );
    c.recv_until(typing_off).await;

    // The lane is free again: the next message gets a whole answer.
    c.send_text(Some("default"), None, "again").await;
    let stop = c.recv_type("message.stop").await;
    assert_eq!(pstr(&stop, "final_text"), common::demo_reply("again"));
}
