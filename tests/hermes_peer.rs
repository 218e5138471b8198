//! The real-peer harness itself: the scripted mock LLM and a real Hermes Agent on loopback.
//! One streamed `POST /v1/chat/completions` through Hermes reaches the mock and its echo comes
//! back; a second turn in the same Hermes session sees the first, also across a restart.

mod common;

use std::time::Duration;

use common::peers::{body_text, Hermes, MockLlm};
use serde_json::{json, Value};

/// One streamed turn in Hermes session `session`; returns the concatenated `delta.content`.
fn streamed_turn(hermes: &Hermes, session: &str, text: &str) -> String {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let resp = agent
        .post(format!("{}/v1/chat/completions", hermes.url()))
        .header("Authorization", format!("Bearer {}", hermes.key))
        .header("X-Hermes-Session-Id", session)
        .send_json(json!({
            "model": "mock-model",
            "stream": true,
            "messages": [{ "role": "user", "content": text }],
        }))
        .unwrap_or_else(|e| panic!("POST /v1/chat/completions: {e}\n{}", hermes.log_tail()));
    assert_eq!(resp.status(), 200, "{}", hermes.log_tail());
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let body = body_text(resp);
    assert!(
        body.contains("data: [DONE]"),
        "stream not finished:\n{body}"
    );
    let mut content = String::new();
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value =
            serde_json::from_str(data).unwrap_or_else(|e| panic!("bad chunk {data}: {e}"));
        if let Some(piece) = chunk
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            content.push_str(piece);
        }
        if let Some(reason) = chunk
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
        {
            assert_eq!(reason, "stop", "finish chunk: {chunk}");
        }
    }
    content
}

#[test]
fn mock_llm_and_real_hermes_stream_a_turn_and_keep_the_session() {
    let llm = MockLlm::start();
    let mut hermes = Hermes::start(&llm);

    let first = streamed_turn(&hermes, "iris_harness", "hello harness");
    assert_eq!(
        first,
        "Echo: hello harness. I have seen 0 earlier user messages; the first was: none."
    );
    let requests = llm.requests();
    let last = requests.last().expect("the mock saw no request");
    assert_eq!(last["model"], "mock-model");
    assert_eq!(last["stream"], true);
    let tools: Vec<&str> = last["tools"]
        .as_array()
        .expect("Hermes sends tool definitions")
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .collect();
    assert!(tools.contains(&"todo"), "tools offered: {tools:?}");

    let second = streamed_turn(&hermes, "iris_harness", "second");
    assert_eq!(
        second,
        "Echo: second. I have seen 1 earlier user messages; the first was: hello harness."
    );

    hermes.restart();
    let third = streamed_turn(&hermes, "iris_harness", "after restart");
    assert_eq!(
        third,
        "Echo: after restart. I have seen 2 earlier user messages; the first was: hello harness."
    );
}
