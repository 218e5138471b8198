//! The Hermes backend against a real Hermes Agent (PyPI `hermes-agent`, see tests/common/peers.rs)
//! on loopback, whose LLM is the scripted mock: a plain turn and session continuity, a tool call
//! with its todo list, reasoning, `/new`, `/stop` and `agent.stop`, Hermes killed mid-turn, and the
//! gateway killed mid-turn (the run is followed to its end; the message is never handed to Hermes
//! twice). Turns go through Hermes' runs API (`/v1/runs`).

mod common;

use std::time::{Duration, Instant};

use common::peers::{Hermes, HermesRig, MockLlm, HERMES_TURN_TIMEOUT, ONE_HERMES};
use common::{
    connect_awaiting_online, connect_with_status, frame_type, pair, pstr, recv_answer,
    temp_data_dir, typing_off, Client, Gateway,
};
use serde_json::{json, Value};

/// Sends `text` (a `[[slow]]` script: the model streams it word by word) and waits until the
/// answer is under way.
async fn start_slow_turn(c: &mut Client, text: &str) {
    c.send_text(Some("default"), None, &text).await;
    c.recv_type("message.update").await;
}

/// Sends `text` and returns every frame of the turn, through `typing{on:false}`.
async fn turn(c: &mut Client, text: &str) -> Vec<Value> {
    c.say(text, typing_off).await
}

fn find<'a>(frames: &'a [Value], kind: &str) -> &'a Value {
    frames
        .iter()
        .find(|f| frame_type(f) == kind)
        .unwrap_or_else(|| panic!("no {kind} in {}", common::dump(frames)))
}

#[tokio::test]
async fn a_plain_turn_continues_its_session_and_new_starts_fresh() {
    let _one = ONE_HERMES.lock().await;
    let r = HermesRig::start("", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;

    let first = turn(&mut c, "Hello Hermes").await;
    let stop = find(&first, "message.stop");
    assert_eq!(
        pstr(stop, "final_text"),
        "Echo: Hello Hermes. I have seen 0 earlier user messages; the first was: none.",
        "{}",
        r.hermes.log_tail()
    );
    // The real model comes from Hermes' session object, not the echoed request.
    assert_eq!(pstr(stop, "model"), "mock-model", "{stop}");
    assert_eq!(stop["payload"]["runtime"]["model"], "mock-model");
    assert!(
        stop["payload"]["tokens"].as_i64().unwrap_or(0) > 0,
        "{stop}"
    );
    assert!(
        stop["payload"]["runtime"]["latency"]
            .as_f64()
            .unwrap_or(-1.0)
            >= 0.0
    );
    assert!(first.iter().any(|f| frame_type(f) == "message.update"));

    // Hermes keeps the conversation: the second answer shows it saw the first.
    let second = turn(&mut c, "And now?").await;
    assert_eq!(
        pstr(find(&second, "message.stop"), "final_text"),
        "Echo: And now?. I have seen 1 earlier user messages; the first was: Hello Hermes."
    );

    c.send_text(Some("default"), None, "/new").await;
    c.recv_until(|f| frame_type(f) == "message" && f["payload"]["role"] == "system")
        .await;
    let third = turn(&mut c, "Fresh?").await;
    assert_eq!(
        pstr(find(&third, "message.stop"), "final_text"),
        "Echo: Fresh?. I have seen 0 earlier user messages; the first was: none."
    );
    // Each message reached the model once (Hermes loads history itself).
    for text in ["Hello Hermes", "And now?", "Fresh?"] {
        assert_eq!(r.llm.times_asked(text), 1, "{text}");
    }
}

#[tokio::test]
async fn a_tool_call_streams_commentary_tool_frames_and_the_todo_list() {
    let _one = ONE_HERMES.lock().await;
    let r = HermesRig::start("", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let frames = turn(&mut c, "[[tool]] plan my tea").await;

    // Text before the tool call is commentary, not part of the answer.
    let commentary = find(&frames, "commentary");
    assert_eq!(pstr(commentary, "text"), "Let me plan this.");
    let start = find(&frames, "tool.start");
    assert_eq!(pstr(start, "name"), "todo");
    assert_eq!(pstr(start, "emoji"), "\u{1f4cb}");
    assert!(pstr(start, "preview").contains("2 task"), "{start}");
    let todo = find(&frames, "todo.update");
    let todos = todo["payload"]["todos"].as_array().unwrap();
    let items: Vec<(&str, &str)> = todos
        .iter()
        .map(|t| {
            (
                t["content"].as_str().unwrap(),
                t["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        items,
        [("Boil water", "in_progress"), ("Steep tea", "pending")]
    );
    let end = find(&frames, "tool.end");
    assert_eq!(end["payload"]["ok"], true, "{end}");
    assert_eq!(end["payload"]["index"], start["payload"]["index"]);
    assert!(pstr(end, "output_preview").contains("Boil water"), "{end}");
    let stop = find(&frames, "message.stop");
    assert_eq!(pstr(stop, "final_text"), "The plan is ready.");
    let order: Vec<&str> = frames.iter().map(frame_type).collect();
    let pos = |k: &str| order.iter().position(|t| *t == k).unwrap();
    assert!(pos("commentary") < pos("tool.start"), "{order:?}");
    assert!(pos("tool.start") < pos("todo.update"), "{order:?}");
    assert!(pos("todo.update") < pos("message.stop"), "{order:?}");

    // The list is a snapshot after hello for a device that connects later.
    let other = pair(r.dir.path(), "tablet");
    let (mut t, _) = common::hello_paired(&r.gw, &other).await;
    let snapshot = t.recv_type("todo.update").await;
    assert_eq!(snapshot["payload"]["todos"], todo["payload"]["todos"]);
}

#[tokio::test]
async fn reasoning_comes_from_the_transcript() {
    let _one = ONE_HERMES.lock().await;
    let r = HermesRig::start("", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let frames = turn(&mut c, "[[reason]] why").await;
    let stop = find(&frames, "message.stop");
    assert_eq!(pstr(stop, "final_text"), "Reasoned answer.");
    assert_eq!(pstr(stop, "reasoning"), "Thinking about the question.");
}

#[tokio::test]
async fn stop_aborts_the_running_turn_at_hermes() {
    let _one = ONE_HERMES.lock().await;
    let r = HermesRig::start("", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    start_slow_turn(&mut c, "[[slow]] count").await;
    c.send_text(Some("default"), None, "/stop").await;
    let stop = c.recv_type("message.stop").await;
    let text = pstr(&stop, "final_text");
    assert!(
        text.starts_with("word1") && text.ends_with("Stopped."),
        "{stop}"
    );
    assert!(!text.contains("word80"), "{stop}");
    // Hermes stops reading the model soon after: the mock sees its client go.
    hermes_stops_reading_the_model(&r.llm, "/stop").await;
    c.recv_until(typing_off).await;
    let next = turn(&mut c, "still there?").await;
    assert!(
        pstr(find(&next, "message.stop"), "final_text").starts_with("Echo: still there?"),
        "{}",
        common::dump(&next)
    );
}

/// Waits (bounded) until the mock LLM sees Hermes go away: the stop reached the model.
async fn hermes_stops_reading_the_model(llm: &MockLlm, after: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !llm.stderr().contains("client went away") {
        assert!(
            Instant::now() < deadline,
            "Hermes kept streaming after {after}\n{}",
            llm.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `agent.stop` (a frame the schema lists as planned; not in its app→server list, so sent raw)
/// does what `/stop` does, without a command message: the run is stopped at Hermes.
#[tokio::test]
async fn agent_stop_stops_the_running_turn_like_slash_stop() {
    let _one = ONE_HERMES.lock().await;
    let r = HermesRig::start("", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    // Nothing running: a clear error, nothing else happens.
    c.send_raw_text(r#"{"v":1,"type":"agent.stop","id":901,"chat_id":"default","payload":{}}"#)
        .await;
    let e = c.expect_error("not_found").await;
    assert_eq!(e["id"], 901, "{e}");

    start_slow_turn(&mut c, "[[slow]] count again").await;
    c.send_raw_text(r#"{"v":1,"type":"agent.stop","id":902,"chat_id":"default","payload":{}}"#)
        .await;
    let stop = c.recv_type("message.stop").await;
    let text = pstr(&stop, "final_text");
    assert!(
        text.starts_with("word1") && text.ends_with("Stopped."),
        "{stop}"
    );
    hermes_stops_reading_the_model(&r.llm, "agent.stop").await;
    c.recv_until(typing_off).await;
    // The catalog tells an app that the frame exists.
    let id = c.request("commands.catalog", None, None, json!({})).await;
    let catalog = c.recv_reply(id).await;
    let stop_entry = catalog["payload"]["commands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "/stop")
        .cloned()
        .unwrap();
    assert!(
        pstr_of(&stop_entry, "description").contains("agent.stop"),
        "{stop_entry}"
    );
}

fn pstr_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

#[tokio::test]
async fn hermes_killed_mid_turn_gives_a_clear_end_then_degraded_then_online() {
    let _one = ONE_HERMES.lock().await;
    let mut r = HermesRig::start("", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    start_slow_turn(&mut c, "[[slow]] long story").await;
    r.hermes.kill();
    // The turn ends clearly, and the gateway reports the agent's absence (in either order).
    let mut stop = None;
    let mut degraded = false;
    while stop.is_none() || !degraded {
        let f = c
            .recv_until(|f| matches!(frame_type(f), "message.stop" | "status"))
            .await;
        match frame_type(&f) {
            "status" => degraded |= f["payload"]["state"] == "degraded",
            _ => stop = Some(f),
        }
    }
    let stop = stop.unwrap();
    let text = pstr(&stop, "final_text");
    assert!(text.contains("the agent stopped mid-answer"), "{stop}");
    assert!(text.contains("was not asked again"), "{stop}");

    r.hermes.restart();
    let online = c.recv_type("status").await;
    assert_eq!(online["payload"]["state"], "online", "{online}");
    let next = turn(&mut c, "back?").await;
    // Hermes died before storing an answer, so its session ends with the unanswered message,
    // which Hermes itself merges into the next one (the gateway sent it once).
    assert!(
        pstr(find(&next, "message.stop"), "final_text")
            .starts_with("Echo: [[slow]] long story\n\nback?."),
        "{}",
        common::dump(&next)
    );
}

#[tokio::test]
async fn a_gateway_killed_mid_turn_follows_the_run_and_never_hands_the_message_over_twice() {
    let _one = ONE_HERMES.lock().await;
    let mut r = HermesRig::start("", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    c.send_text(Some("default"), None, "[[slow]] interrupted tale")
        .await;
    c.recv_type("read.receipt").await;
    c.recv_type("message.update").await;
    let addr = r.gw.addr.to_string();
    r.gw.kill9();
    drop(c);
    // The run goes on at Hermes without the gateway (closing its events stream does not stop it).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let gw = r.hermes.gateway(r.dir.path(), &["--listen", &addr]);
    let mut c = connect_awaiting_online(&gw, &r.p, HERMES_TURN_TIMEOUT).await;
    // The run outlived the gateway at Hermes: the restarted gateway follows it (by its
    // status: a run's events stream cannot be resumed) and delivers its whole answer once.
    let (answer, text) = recv_answer(&mut c).await;
    assert!(
        text.starts_with("word1 word2") && text.ends_with("word80"),
        "{answer}\n{}",
        gw.output_tail()
    );
    let id = c
        .request("history", Some("default"), None, json!({ "limit": 10 }))
        .await;
    let h = c.recv_reply(id).await;
    let messages = h["payload"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{h}\n{}", gw.output_tail());
    assert_eq!(messages[1]["text"], text, "{h}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.llm.times_asked("interrupted tale"), 1);

    // The conversation goes on in the same session (which saw the interrupted message).
    let next = turn(&mut c, "after the restart").await;
    assert!(
        pstr(find(&next, "message.stop"), "final_text").starts_with(
            "Echo: after the restart. I have seen 1 earlier user messages; the first was: [[slow]] interrupted tale."
        ),
        "{}",
        common::dump(&next)
    );
}

#[tokio::test]
async fn a_wrong_key_is_reported_not_retried() {
    let _one = ONE_HERMES.lock().await;
    let llm = MockLlm::start();
    let hermes = Hermes::start(&llm);
    let dir = temp_data_dir();
    let url = hermes.url();
    let gw = Gateway::start(
        dir.path(),
        &[
            "--agent",
            "hermes",
            "--agent-url",
            &url,
            "--agent-key",
            "not-the-key-at-all",
        ],
    );
    let p = pair(dir.path(), "phone");
    let (mut c, _, status) = connect_with_status(&gw, &p).await;
    c.timeout = HERMES_TURN_TIMEOUT;
    if status["payload"]["state"] == "online" {
        let s = c.recv_type("status").await;
        assert_eq!(s["payload"]["state"], "degraded", "{s}");
    }
    let frames = turn(&mut c, "hello?").await;
    let text = pstr(find(&frames, "message.stop"), "final_text").to_owned();
    assert!(text.contains("refused the gateway's key"), "{text}");
    assert!(text.contains("agent.key"), "{text}");
    assert!(llm.requests().is_empty(), "nothing reached the model");
    // The key never appears in the gateway's logs.
    assert!(!gw.output_tail().contains("not-the-key-at-all"));
}
