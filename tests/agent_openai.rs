//! The OpenAI-compatible backend against the scripted mock LLM on loopback, through the real
//! binary: the lane's history is sent with each message (and restarts with `/new`), streamed
//! `reasoning_content` becomes the message's reasoning, `/model` and `/reasoning` reach the
//! request, an upstream error is a clear terminal message, and a message sent while the server
//! is down waits (status `degraded`) and is answered once it is back.

mod common;

use std::time::Duration;

use common::peers::MockLlm;
use common::{
    connect, connect_with_status, frame_type, pair, pstr, system_answer, temp_data_dir, Client,
    Gateway,
};
use serde_json::{json, Value};

fn start_gateway(dir: &std::path::Path, url: &str, extra: &[&str]) -> Gateway {
    let mut args = vec!["--agent", "openai", "--agent-url", url];
    args.extend_from_slice(extra);
    Gateway::start(dir, &args)
}

/// Sends `text` in the default channel and returns the turn's `message.stop`.
async fn ask(c: &mut Client, text: &str) -> Value {
    let frames = c.say(text, |f| frame_type(f) == "message.stop").await;
    frames.last().cloned().expect("message.stop")
}

/// Sends a command and returns the gateway's `system` answer.
async fn command(c: &mut Client, text: &str) -> String {
    let frames = c.say(text, system_answer).await;
    frames
        .last()
        .map(|f| pstr(f, "text").to_owned())
        .unwrap_or_default()
}

fn user_texts(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn history_is_sent_and_new_starts_afresh() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect(&gw, &p).await;

    let first = ask(&mut c, "What is tea?").await;
    assert_eq!(
        pstr(&first, "final_text"),
        "Echo: What is tea?. I have seen 0 earlier user messages; the first was: none."
    );
    // The server's first model is used, and the footer says so, with usage and wall time.
    assert_eq!(pstr(&first, "model"), "mock-model", "{first}");
    assert_eq!(first["payload"]["runtime"]["model"], "mock-model");
    assert!(
        first["payload"]["tokens"].as_i64().unwrap_or(0) > 0,
        "{first}"
    );
    assert!(
        first["payload"]["runtime"]["latency"].as_f64().is_some(),
        "{first}"
    );

    let second = ask(&mut c, "And coffee?").await;
    assert_eq!(
        pstr(&second, "final_text"),
        "Echo: And coffee?. I have seen 1 earlier user messages; the first was: What is tea?."
    );
    let sent = llm.requests();
    let last = sent.last().unwrap();
    assert_eq!(last["model"], "mock-model");
    assert_eq!(last["stream"], true);
    let roles: Vec<&str> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"], "{last}");
    assert!(last.get("reasoning_effort").is_none(), "{last}");

    assert!(command(&mut c, "/new").await.contains("new conversation"));
    let third = ask(&mut c, "Fresh start").await;
    assert_eq!(
        pstr(&third, "final_text"),
        "Echo: Fresh start. I have seen 0 earlier user messages; the first was: none."
    );
    // Commands and the gateway's answers never reach the model.
    let all_user_texts: Vec<String> = llm.requests().iter().flat_map(user_texts).collect();
    assert!(
        all_user_texts.iter().all(|t| !t.starts_with('/')),
        "{all_user_texts:?}"
    );
}

#[tokio::test]
async fn reasoning_content_becomes_the_reasoning_and_choices_reach_the_request() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect(&gw, &p).await;

    let stop = ask(&mut c, "[[reason]] why is the sky blue").await;
    assert_eq!(pstr(&stop, "final_text"), "Reasoned answer.");
    assert_eq!(pstr(&stop, "reasoning"), "Thinking about the question.");

    // /model offers the server's models as a picker.
    c.send_text(Some("default"), None, "/model").await;
    let picker = c.recv_type("picker.choice").await;
    assert_eq!(
        common::picker_values(&picker),
        ["default", "mock-model", "mock-large"],
        "{picker}"
    );
    c.request(
        "picker.select",
        None,
        None,
        json!({ "picker_id": pstr(&picker, "picker_id"), "value": "mock-large" }),
    )
    .await;
    let answer = c
        .recv_until(|f| frame_type(f) == "message" && f["payload"]["role"] == "system")
        .await;
    assert_eq!(pstr(&answer, "text"), "Model in this chat: mock-large.");
    assert_eq!(
        command(&mut c, "/reasoning low").await,
        "Reasoning effort: low."
    );
    assert!(command(&mut c, "/model gpt-9")
        .await
        .contains("no model `gpt-9`"));

    let stop = ask(&mut c, "hello").await;
    assert_eq!(pstr(&stop, "model"), "mock-large", "{stop}");
    let last = llm.requests().last().cloned().unwrap();
    assert_eq!(last["model"], "mock-large");
    assert_eq!(last["reasoning_effort"], "low");
}

#[tokio::test]
async fn an_upstream_error_is_a_clear_answer() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect(&gw, &p).await;
    let stop = ask(&mut c, "[[fail500]] please").await;
    let text = pstr(&stop, "final_text");
    assert!(
        text.starts_with("\u{26a0}\u{fe0f} the agent failed: HTTP 500"),
        "{stop}"
    );
    // One failed request is not an outage: the gateway stays online.
    c.recv_until(common::typing_off).await;
    c.assert_silent(Duration::from_millis(300)).await;
    let again = ask(&mut c, "ok now").await;
    assert!(
        pstr(&again, "final_text").starts_with("Echo: ok now."),
        "{again}"
    );
}

#[tokio::test]
async fn a_message_sent_while_the_server_is_down_is_answered_when_it_returns() {
    // A port with nothing listening on it, where the mock will start later.
    let port = common::peers::free_port();
    let dir = temp_data_dir();
    let url = format!("http://127.0.0.1:{port}/v1");
    let gw = start_gateway(dir.path(), &url, &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _, status) = connect_with_status(&gw, &p).await;
    if status["payload"]["state"] == "online" {
        // The first check of the agent may land just after the greeting.
        let s = c.recv_type("status").await;
        assert_eq!(s["payload"]["state"], "degraded", "{s}");
    }
    let id = c.send_text(Some("default"), None, "Are you there?").await;
    let receipt = c.recv_reply(id).await;
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    let note = c.recv_type("commentary").await;
    assert!(pstr(&note, "text").contains("kept"), "{note}");

    let llm = MockLlm::start_on(port);
    let online = c
        .recv_until(|f| frame_type(f) == "status" && f["payload"]["state"] == "online")
        .await;
    assert_eq!(online["payload"]["state"], "online");
    let stop = c.recv_type("message.stop").await;
    assert!(
        pstr(&stop, "final_text").starts_with("Echo: Are you there?"),
        "{stop}"
    );
    // Sent exactly once.
    let asked: Vec<Value> = llm
        .requests()
        .into_iter()
        .filter(|r| user_texts(r).iter().any(|t| t == "Are you there?"))
        .collect();
    assert_eq!(asked.len(), 1, "{asked:?}");
}

#[tokio::test]
async fn a_server_that_never_returns_gets_a_clear_failure() {
    let port = common::peers::free_port();
    let dir = temp_data_dir();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nbackend = \"openai\"\nurl = \"http://127.0.0.1:{port}/v1\"\nunreachable_wait_secs = 2\n"
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let gw = Gateway::start(&data, &["--config", config.to_str().unwrap()]);
    let p = pair(&data, "phone");
    let (mut c, _) = connect(&gw, &p).await;
    let stop = ask(&mut c, "Hello?").await;
    let text = pstr(&stop, "final_text");
    assert!(text.contains("the agent is unreachable"), "{stop}");
    assert!(text.contains("send the message again"), "{stop}");
}

#[tokio::test]
async fn a_busy_server_is_asked_again_after_retry_after() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let gw = start_gateway(dir.path(), &llm.url(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = connect(&gw, &p).await;
    c.send_text(Some("default"), None, "[[busy]] hello").await;
    let note = c.recv_type("commentary").await;
    assert!(pstr(&note, "text").contains("busy"), "{note}");
    let stop = c.recv_type("message.stop").await;
    assert!(
        pstr(&stop, "final_text").starts_with("Echo: [[busy]] hello."),
        "{stop}"
    );
    // Refused once (429, not taken), then answered once.
    let asked = llm
        .requests()
        .iter()
        .filter(|r| user_texts(r).last().is_some_and(|t| t == "[[busy]] hello"))
        .count();
    assert_eq!(asked, 2);
}

#[tokio::test]
async fn a_turn_past_the_time_limit_is_stopped_and_says_so() {
    let llm = MockLlm::start();
    let dir = temp_data_dir();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nbackend = \"openai\"\nurl = \"{}\"\nturn_timeout_secs = 1\n",
            llm.url()
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let gw = Gateway::start(&data, &["--config", config.to_str().unwrap()]);
    let p = pair(&data, "phone");
    let (mut c, _) = connect(&gw, &p).await;
    let stop = ask(&mut c, "[[slow]] go on").await;
    let text = pstr(&stop, "final_text");
    assert!(text.starts_with("word1"), "{stop}");
    assert!(
        text.contains("took longer than 1 seconds and was stopped"),
        "{stop}"
    );
    // The stream to the server is closed, so it stops generating.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !llm.stderr().contains("client went away") {
        assert!(std::time::Instant::now() < deadline, "{}", llm.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
