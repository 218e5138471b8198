//! Requests that wait on the agent run beside the device's reader, through the real binary: while
//! the agent is slow to answer (a fake OpenAI-compatible server, or a fake Hermes, held at a
//! gate, so no clock is guessed at), the same phone's ping is answered, a second such request of
//! the same kind from that phone is refused with `error{rate_limited}`, and the held answer still
//! arrives once the agent answers.

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use common::fake_hermes::FakeHermes;
use common::fake_http::{self, json_200};
use common::gate::Gate;
use common::{connect, connect_awaiting_online, frame_type, pair, pstr, temp_data_dir, Gateway};
use serde_json::json;

/// Gates the next `GET /v1/models` requests wait at, one each, in order.
type Holds = Arc<Mutex<VecDeque<Gate>>>;

/// An OpenAI-compatible server whose `GET /v1/models` answers at once, except while `holds`
/// has a gate: the next request takes it and waits there until it is opened.
fn models_server(holds: Holds) -> String {
    let url = fake_http::start(move |taken| {
        if !taken.line.starts_with("GET /v1/models") {
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                .to_vec();
        }
        let held = holds.lock().unwrap().pop_front();
        if let Some(gate) = held {
            gate.wait();
        }
        let models = json!({ "object": "list", "data": [
            { "id": "small-model", "object": "model" },
            { "id": "large-model", "object": "model" },
        ]});
        json_200(models.to_string().as_bytes())
    });
    format!("{url}/v1")
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_model_list_leaves_the_phone_answered_and_one_per_device() {
    let holds = Holds::default();
    let url = models_server(holds.clone());
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--agent", "openai", "--agent-url", &url]);
    let (mut phone, _) = connect(&gw, &pair(dir.path(), "phone")).await;

    let gate = Gate::default();
    holds.lock().unwrap().push_back(gate.clone());
    let model = phone.send_text(Some("default"), None, "/model").await;
    let receipt = phone.recv_reply(model).await;
    assert_eq!(frame_type(&receipt), "read.receipt", "{receipt}");
    // The agent has not answered (it cannot: its answer waits at the gate), yet the phone's
    // ping is answered.
    let ping = phone.request("ping", None, None, json!({ "ts": 7 })).await;
    let pong = phone.recv_reply(ping).await;
    assert_eq!(frame_type(&pong), "pong", "{pong}");
    // A second model choice from the same phone while the first waits: refused, not queued
    // without a bound, and not stored.
    let again = phone
        .send_text(Some("default"), None, "/model large-model")
        .await;
    let refused = phone.recv_reply(again).await;
    assert_eq!(frame_type(&refused), "error", "{refused}");
    assert_eq!(refused["payload"]["code"], "rate_limited", "{refused}");
    assert!(
        refused["payload"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("still on its way to the agent"),
        "{refused}"
    );
    assert!(
        !phone.seen.iter().any(|f| frame_type(f) == "picker.choice"),
        "nothing can have come from the agent yet: {}",
        phone.recent()
    );

    gate.open();
    let picker = phone.recv_type("picker.choice").await;
    assert_eq!(
        common::picker_values(&picker),
        ["default", "small-model", "large-model"],
        "{picker}"
    );
    // The picker's answer asks the agent for its models too: beside the reader as well, and the
    // slot is free again since the agent answered.
    let gate = Gate::default();
    holds.lock().unwrap().push_back(gate.clone());
    let select = phone
        .request(
            "picker.select",
            None,
            None,
            json!({ "picker_id": picker["payload"]["picker_id"], "value": "large-model" }),
        )
        .await;
    let ping = phone.request("ping", None, None, json!({ "ts": 8 })).await;
    assert_eq!(frame_type(&phone.recv_reply(ping).await), "pong");
    let is_chosen = |f: &serde_json::Value| {
        frame_type(f) == "message"
            && f["payload"]["role"] == "system"
            && f["payload"]["text"] == "Model in this chat: large-model."
    };
    assert!(
        !phone.seen.iter().any(is_chosen),
        "answered before the agent was: {}",
        phone.recent()
    );
    gate.open();
    phone.recv_until(is_chosen).await;
    assert!(
        phone
            .seen
            .iter()
            .all(|f| f.get("id").and_then(serde_json::Value::as_i64) != Some(select)),
        "a picker's answer is a message in its lane, not an error: {}",
        phone.recent()
    );
}

/// A fake Hermes, a gateway on it and a phone connected once the agent is online.
async fn with_fake_hermes() -> (FakeHermes, tempfile::TempDir, Gateway, common::Client) {
    let hermes = FakeHermes::start();
    let dir = temp_data_dir();
    let gw = Gateway::start(
        dir.path(),
        &[
            "--agent",
            "hermes",
            "--agent-url",
            &hermes.url,
            "--agent-key",
            "fake-hermes-key-0123456789",
        ],
    );
    let p = pair(dir.path(), "phone");
    let phone = connect_awaiting_online(&gw, &p, std::time::Duration::from_secs(10)).await;
    (hermes, dir, gw, phone)
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_steer_leaves_the_steering_phone_answered_and_one_per_device() {
    let (hermes, _dir, _gw, mut phone) = with_fake_hermes().await;
    phone.send_text(Some("default"), None, "plan my tea").await;
    // The run is under way at the agent: its first words arrived.
    phone
        .recv_until(|f| frame_type(f) == "message.update")
        .await;

    let steer = phone
        .request(
            "agent.steer",
            Some("default"),
            None,
            json!({ "text": "add honey" }),
        )
        .await;
    phone
        .recv_until(|f| {
            frame_type(f) == "message"
                && f["payload"]["steer"] == true
                && pstr(f, "text") == "add honey"
        })
        .await;
    // The steer is at the agent, which does not answer it until the gate opens...
    assert_eq!(hermes.next_held(), "steer add honey");
    // ...and meanwhile the steering phone is answered.
    let ping = phone.request("ping", None, None, json!({ "ts": 9 })).await;
    assert_eq!(frame_type(&phone.recv_reply(ping).await), "pong");
    // A second steer from the same phone while the first waits: refused before it is stored.
    let again = phone
        .request(
            "agent.steer",
            Some("default"),
            None,
            json!({ "text": "and lemon" }),
        )
        .await;
    let refused = phone.recv_reply(again).await;
    assert_eq!(frame_type(&refused), "error", "{refused}");
    assert_eq!(refused["payload"]["code"], "rate_limited", "{refused}");
    assert!(
        pstr(&refused, "message").contains("a steer from this device is still on its way"),
        "{refused}"
    );

    // The agent takes the steer, then the run ends: the answer arrives, with no error for the
    // steer that was taken.
    hermes.steer_answer.open();
    hermes.run_end.open();
    let stop = phone.recv_type("message.stop").await;
    assert_eq!(pstr(&stop, "final_text"), "Working on it. Done.", "{stop}");
    assert!(
        phone
            .seen
            .iter()
            .all(|f| f.get("id").and_then(serde_json::Value::as_i64) != Some(steer)),
        "a taken steer has no reply: {}",
        phone.recent()
    );
    assert!(
        !phone.seen.iter().any(|f| pstr(f, "text") == "and lemon"),
        "the refused steer was stored: {}",
        phone.recent()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_approval_answer_leaves_the_phone_answered_and_one_per_device() {
    let (hermes, _dir, _gw, mut phone) = with_fake_hermes().await;
    phone
        .send_text(Some("default"), None, "[[approval]] clean up")
        .await;
    let picker = phone
        .recv_until(|f| frame_type(f) == "picker.choice" && pstr(f, "picker_id").starts_with("ap_"))
        .await;
    let answer =
        |value: &str| json!({ "picker_id": picker["payload"]["picker_id"], "value": value });
    phone
        .request("picker.select", None, None, answer("once"))
        .await;
    // The answer is at the agent, which does not take it until the gate opens...
    assert_eq!(hermes.next_held(), "approval once");
    // ...and meanwhile the phone is answered.
    let ping = phone.request("ping", None, None, json!({ "ts": 10 })).await;
    assert_eq!(frame_type(&phone.recv_reply(ping).await), "pong");
    let again = phone
        .request("picker.select", None, None, answer("deny"))
        .await;
    let refused = phone.recv_reply(again).await;
    assert_eq!(refused["payload"]["code"], "rate_limited", "{refused}");
    let allowed = |f: &serde_json::Value| {
        frame_type(f) == "message" && pstr(f, "text").contains("allowed `rm -rf /tmp/old` once")
    };
    assert!(!phone.seen.iter().any(allowed), "{}", phone.recent());

    hermes.approval_answer.open();
    phone.recv_until(allowed).await;
    hermes.run_end.open();
    let stop = phone.recv_type("message.stop").await;
    assert_eq!(pstr(&stop, "final_text"), "Working on it. Done.", "{stop}");
}
