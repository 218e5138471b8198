//! Hermes approvals on the phone, against a real Hermes Agent 0.19.0 (`approvals.mode: manual`)
//! whose scripted LLM makes it run `rm -rf` on a directory the test owns, so whether the command
//! ran is checked on disk and in what the model was told (the mock's request log).
//!
//! Allow once, deny, no answer (Hermes' timeout closes the picker), "Stop the task" and
//! `agent.stop` while waiting, two devices (the first answer wins), an away device's push, and
//! the gateway SIGKILLed while an approval waits.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::peers::{Hermes, HermesRig, MockLlm, HERMES_TURN_TIMEOUT, ONE_HERMES};
use common::{
    connect_awaiting_online, frame_type, pair, picker_values, pstr, system_answer, temp_data_dir,
    typing_off, Client, Gateway,
};
use serde_json::{json, Value};

/// Long enough for any test to answer; the no-answer test uses its own short one.
const APPROVAL_TIMEOUT_SECS: u64 = 60;

/// A Hermes rig whose Hermes asks before running flagged commands, and a directory for the
/// flagged command to delete, with a file in it.
struct Rig {
    hermes_rig: HermesRig,
    victim: PathBuf,
    _scratch: tempfile::TempDir,
}

/// The rig's Hermes, gateway and phone, as `r.gw`, `r.p` and so on.
impl std::ops::Deref for Rig {
    type Target = HermesRig;
    fn deref(&self) -> &HermesRig {
        &self.hermes_rig
    }
}

impl std::ops::DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut HermesRig {
        &mut self.hermes_rig
    }
}

fn approvals_yaml(timeout_secs: u64) -> String {
    format!("approvals:\n  mode: manual\n  timeout: {timeout_secs}\n")
}

fn rig_with(timeout_secs: u64, gateway_args: &[&str], dir: tempfile::TempDir) -> Rig {
    let hermes_rig = HermesRig::start(&approvals_yaml(timeout_secs), gateway_args, dir);
    let scratch = tempfile::Builder::new()
        .prefix("iris-approval-")
        .tempdir()
        .expect("scratch dir");
    let victim = scratch.path().join("old-photos");
    std::fs::create_dir(&victim).expect("create the victim dir");
    std::fs::write(victim.join("cat.jpg"), b"not really a cat").expect("victim file");
    Rig {
        hermes_rig,
        victim,
        _scratch: scratch,
    }
}

fn rig(timeout_secs: u64) -> Rig {
    rig_with(timeout_secs, &[], temp_data_dir())
}

fn command_of(r: &Rig) -> String {
    format!("rm -rf {}", r.victim.display())
}

/// Sends the message that makes Hermes want to run `rm -rf VICTIM`; returns the picker.
async fn ask_for_danger(c: &mut Client, r: &Rig) -> Value {
    let text = format!("[[danger {}]] tidy up", r.victim.display());
    c.send_text(Some("default"), None, &text).await;
    let picker = c.recv_type("picker.choice").await;
    let title = pstr(&picker, "title");
    assert!(
        title.contains(&format!("`{}`", command_of(r))) && title.contains("Hermes flags it"),
        "{picker}"
    );
    picker
}

async fn select(c: &mut Client, picker: &Value, value: &str) -> i64 {
    c.request(
        "picker.select",
        Some("default"),
        None,
        json!({ "picker_id": pstr(picker, "picker_id"), "value": value }),
    )
    .await
}

/// What the model was told about the terminal call: the tool results it was sent.
fn tool_results(llm: &MockLlm) -> Vec<String> {
    llm.requests()
        .iter()
        .filter_map(|r| r["messages"].as_array().cloned())
        .flatten()
        .filter(|m| m["role"] == "tool" && m["tool_call_id"] == "call_mock_terminal_1")
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

fn final_text(frames: &[Value]) -> String {
    frames
        .iter()
        .find(|f| frame_type(f) == "message.stop")
        .map(|f| pstr(f, "final_text").to_owned())
        .unwrap_or_else(|| panic!("no message.stop in {}", common::dump(frames)))
}

/// Frames until the turn ends (`typing{on:false}`), inclusive.
async fn rest_of_turn(c: &mut Client) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let f = c.recv().await;
        let done = typing_off(&f);
        frames.push(f);
        if done {
            return frames;
        }
    }
}

fn system_texts(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| system_answer(f))
        .map(|f| pstr(f, "text").to_owned())
        .collect()
}

#[tokio::test]
async fn allow_once_runs_the_command_and_the_turn_finishes() {
    let _one = ONE_HERMES.lock().await;
    let r = rig(APPROVAL_TIMEOUT_SECS);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut c, &r).await;
    // `always` (allow-list the pattern in Hermes for ever) is never one tap.
    assert_eq!(
        picker_values(&picker),
        ["once", "session", "deny", "stop"],
        "{picker}"
    );
    let labels: Vec<&str> = picker["payload"]["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["Allow once", "Allow for this task", "Deny", "Stop the task"]
    );
    let notice = c.recv_type("notification").await;
    assert_eq!(notice["payload"]["kind"], "approval", "{notice}");
    assert!(pstr(&notice, "body").contains(&command_of(&r)), "{notice}");
    // Waiting: nothing ran yet.
    assert!(r.victim.exists());
    assert!(tool_results(&r.llm).is_empty());

    // `always` is refused with a clear error, and the request stays open.
    let id = select(&mut c, &picker, "always").await;
    let e = c.recv_reply(id).await;
    assert_eq!(frame_type(&e), "error", "{e}");
    assert!(pstr(&e, "message").contains("for ever"), "{e}");

    select(&mut c, &picker, "once").await;
    let frames = rest_of_turn(&mut c).await;
    let said = system_texts(&frames);
    assert!(
        said.iter()
            .any(|t| t.contains("phone allowed") && t.contains("once")),
        "{said:?}\n{}",
        common::dump(&frames)
    );
    assert!(!r.victim.exists(), "the approved command did not run");
    let results = tool_results(&r.llm);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(!results[0].contains("pending_approval"), "{results:?}");
    let text = final_text(&frames);
    assert!(text.starts_with("Tool said:"), "{text}");
    // The terminal tool's frames are there, with Hermes' own emoji for it.
    let start = c
        .seen
        .iter()
        .find(|f| frame_type(f) == "tool.start")
        .expect("tool.start");
    assert_eq!(pstr(start, "name"), "terminal");
    assert_eq!(pstr(start, "emoji"), "\u{1f4bb}", "{start}");
    let end = frames
        .iter()
        .find(|f| frame_type(f) == "tool.end")
        .expect("tool.end");
    assert_eq!(end["payload"]["ok"], true, "{end}");

    // Answering again: the request is no longer open.
    let id = select(&mut c, &picker, "once").await;
    let e = c.recv_reply(id).await;
    assert_eq!(e["payload"]["code"], "not_found", "{e}");
    assert!(pstr(&e, "message").contains("no longer open"), "{e}");

    // `/status` says where the approval mode is set (Hermes' API does not report it).
    let status = c.say("/status", system_answer).await;
    let text = pstr(status.last().unwrap(), "text");
    assert!(
        text.contains("Approvals: 0 waiting") && text.contains("approvals.mode"),
        "{text}"
    );
    let _ = (&r.hermes, &r.dir);
}

#[tokio::test]
async fn deny_does_not_run_the_command_and_the_agent_is_told() {
    let _one = ONE_HERMES.lock().await;
    let r = rig(APPROVAL_TIMEOUT_SECS);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut c, &r).await;
    select(&mut c, &picker, "deny").await;
    let frames = rest_of_turn(&mut c).await;
    let said = system_texts(&frames);
    assert!(said.iter().any(|t| t.contains("phone denied")), "{said:?}");
    assert!(r.victim.join("cat.jpg").exists(), "a denied command ran");
    let results = tool_results(&r.llm);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(
        results[0].to_lowercase().contains("denied"),
        "the model was not told: {results:?}"
    );
    let end = frames
        .iter()
        .find(|f| frame_type(f) == "tool.end")
        .expect("tool.end");
    assert_eq!(end["payload"]["ok"], false, "{end}");
    assert!(final_text(&frames).starts_with("Tool said:"));
}

#[tokio::test]
async fn no_answer_closes_the_picker_when_hermes_stops_waiting() {
    let _one = ONE_HERMES.lock().await;
    let r = rig(4);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut c, &r).await;
    let t0 = Instant::now();
    let frames = rest_of_turn(&mut c).await;
    let said = system_texts(&frames);
    assert!(
        said.iter()
            .any(|t| t.contains("was not approved in time; Hermes did not run it")),
        "{said:?}\n{}",
        common::dump(&frames)
    );
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "closed before Hermes' timeout"
    );
    assert!(
        r.victim.join("cat.jpg").exists(),
        "an unanswered command ran"
    );
    let results = tool_results(&r.llm);
    assert_eq!(results.len(), 1, "{results:?}");
    // A late answer changes nothing and says so.
    let id = select(&mut c, &picker, "once").await;
    let e = c.recv_reply(id).await;
    assert_eq!(e["payload"]["code"], "not_found", "{e}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(r.victim.join("cat.jpg").exists());
}

/// The run the gateway logged for the approval it offered.
fn run_id_in_log(gw: &Gateway) -> String {
    let out = gw.output_tail();
    let at = out
        .rfind("run=run_")
        .unwrap_or_else(|| panic!("no run id in the gateway's log\n{out}"));
    out[at + 4..]
        .split(|c: char| c.is_whitespace())
        .next()
        .unwrap()
        .to_owned()
}

/// Waits until Hermes itself reports the run cancelled (`GET /v1/runs/{id}`).
async fn hermes_says_cancelled(hermes: &Hermes, run_id: &str) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status: Value = agent
            .get(format!("{}/v1/runs/{run_id}", hermes.url()))
            .header("Authorization", format!("Bearer {}", hermes.key))
            .call()
            .expect("GET /v1/runs/{id}")
            .into_body()
            .read_json()
            .expect("run status JSON");
        if status["status"] == "cancelled" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the run was not cancelled: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Polls until `path` is gone or `wait` passes; returns whether it still exists.
async fn still_there_after(path: &Path, wait: Duration) -> bool {
    tokio::time::sleep(wait).await;
    path.exists()
}

/// The rest of a turn stopped while its approval waited: the answer ends "Stopped.", the lane
/// is told `why`, Hermes reports the run cancelled, and the flagged command never ran.
async fn stopped_and_nothing_ran(c: &mut Client, r: &Rig, why: &str) {
    let frames = rest_of_turn(c).await;
    assert!(
        final_text(&frames).ends_with("Stopped."),
        "{}",
        common::dump(&frames)
    );
    let said = system_texts(&frames);
    assert!(said.iter().any(|t| t.contains(why)), "{said:?}");
    hermes_says_cancelled(&r.hermes, &run_id_in_log(&r.gw)).await;
    assert!(still_there_after(&r.victim.join("cat.jpg"), Duration::from_secs(2)).await);
}

#[tokio::test]
async fn stop_the_task_while_waiting_cancels_the_run_and_nothing_runs() {
    let _one = ONE_HERMES.lock().await;
    let r = rig(APPROVAL_TIMEOUT_SECS);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut c, &r).await;
    select(&mut c, &picker, "stop").await;
    stopped_and_nothing_ran(&mut c, &r, "phone stopped the task").await;
    // The run was cancelled at Hermes: the model never heard back about the command.
    assert!(
        tool_results(&r.llm).is_empty(),
        "{:?}",
        tool_results(&r.llm)
    );
    // The lane is free again.
    let next = c.say("still there?", typing_off).await;
    assert!(final_text(&next).starts_with("Echo: still there?"));
}

#[tokio::test]
async fn agent_stop_while_waiting_stops_the_run_and_closes_the_picker() {
    let _one = ONE_HERMES.lock().await;
    let r = rig(APPROVAL_TIMEOUT_SECS);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut c, &r).await;
    // While a run waits for an approval its events stream is silent: only an explicit stop
    // at Hermes ends it.
    c.send_raw_text(r#"{"v":1,"type":"agent.stop","id":77,"chat_id":"default","payload":{}}"#)
        .await;
    stopped_and_nothing_ran(&mut c, &r, "The task was stopped").await;
    assert!(tool_results(&r.llm).is_empty());
    let id = select(&mut c, &picker, "once").await;
    let e = c.recv_reply(id).await;
    assert_eq!(e["payload"]["code"], "not_found", "{e}");
    assert!(r.victim.join("cat.jpg").exists());
}

#[tokio::test]
async fn two_devices_see_the_picker_and_the_first_answer_wins() {
    let _one = ONE_HERMES.lock().await;
    let r = rig(APPROVAL_TIMEOUT_SECS);
    let mut phone = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let tablet_pair = pair(r.dir.path(), "tablet");
    let mut tablet = connect_awaiting_online(&r.gw, &tablet_pair, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut phone, &r).await;
    let seen = tablet.recv_type("picker.choice").await;
    assert_eq!(seen["payload"], picker["payload"]);
    // The tablet answers first; the phone's later "deny" finds the request closed.
    select(&mut tablet, &seen, "once").await;
    let on_tablet = tablet
        .recv_until(|f| system_answer(f) && pstr(f, "text").contains("allowed"))
        .await;
    assert!(
        pstr(&on_tablet, "text").starts_with("tablet allowed"),
        "{on_tablet}"
    );
    let id = select(&mut phone, &picker, "deny").await;
    let e = phone.recv_reply(id).await;
    assert_eq!(e["payload"]["code"], "not_found", "{e}");
    // Both see the outcome and the answer.
    let frames = rest_of_turn(&mut phone).await;
    let said = system_texts(&phone.seen);
    assert!(
        said.iter().any(|t| t.starts_with("tablet allowed")),
        "{said:?}"
    );
    assert!(final_text(&frames).starts_with("Tool said:"));
    let tablet_frames = rest_of_turn(&mut tablet).await;
    assert!(final_text(&tablet_frames).starts_with("Tool said:"));
    assert!(!r.victim.exists(), "the approved command did not run");
    assert_eq!(tool_results(&r.llm).len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Push: a minimal ntfy server that records every POST body
// ---------------------------------------------------------------------------------------------

struct FakeNtfy {
    port: u16,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl FakeNtfy {
    fn start() -> FakeNtfy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake ntfy");
        let port = listener.local_addr().unwrap().port();
        let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
        let seen = bodies.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = s.read(&mut chunk) else { return };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() < end + 4 + len {
                            continue;
                        }
                        let body = &buf[end + 4..end + 4 + len];
                        if let Ok(v) = serde_json::from_slice::<Value>(body) {
                            seen.lock().unwrap().push(v);
                        }
                        let _ = s.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                        );
                        return;
                    }
                });
            }
        });
        FakeNtfy { port, bodies }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }
}

#[tokio::test]
async fn an_away_device_gets_the_approval_push_exactly_once() {
    let _one = ONE_HERMES.lock().await;
    let ntfy = FakeNtfy::start();
    let aux = tempfile::tempdir().unwrap();
    let config = aux.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[push]\nbackend = \"ntfy\"\nntfy_server = \"http://127.0.0.1:{}\"\nbackoff_ms = 100\nmax_backoff_secs = 1\n",
            ntfy.port
        ),
    )
    .unwrap();
    let r = rig_with(
        APPROVAL_TIMEOUT_SECS,
        &["--config", config.to_str().unwrap()],
        temp_data_dir(),
    );
    // The tablet registers its topic, then goes away (locked in a drawer).
    let tablet = pair(r.dir.path(), "tablet");
    {
        let mut t = Client::open(&r.gw.url).await;
        let id = t.next_id();
        t.send(json!({ "v": 1, "type": "hello", "id": id, "payload": {
            "token": tablet.token, "device_id": tablet.device_id, "ntfy_topic": "tablet-topic" } }))
            .await;
        t.recv_type("hello.ack").await;
        t.close().await;
    }
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut c, &r).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let approval_pushes = |b: &[Value]| {
        b.iter()
            .filter(|p| {
                p["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("Approval needed")
            })
            .count()
    };
    while approval_pushes(&ntfy.bodies()) == 0 {
        assert!(
            Instant::now() < deadline,
            "no approval push: {:?}\n{}",
            ntfy.bodies(),
            r.gw.output_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = ntfy
        .bodies()
        .into_iter()
        .find(|p| {
            p["message"]
                .as_str()
                .unwrap_or("")
                .contains("Approval needed")
        })
        .unwrap();
    assert_eq!(first["topic"], "tablet-topic", "{first}");
    // The phone (connected) answers; the turn ends; still exactly one approval push.
    select(&mut c, &picker, "deny").await;
    rest_of_turn(&mut c).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(approval_pushes(&ntfy.bodies()), 1, "{:?}", ntfy.bodies());
    assert!(ntfy.bodies().iter().all(|p| p["topic"] == "tablet-topic"));
}

#[tokio::test]
async fn a_gateway_killed_while_an_approval_waits_re_offers_it_after_the_restart() {
    let _one = ONE_HERMES.lock().await;
    let mut r = rig(APPROVAL_TIMEOUT_SECS);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut c, &r).await;
    let picker_id = pstr(&picker, "picker_id").to_owned();
    let addr = r.gw.addr.to_string();
    r.gw.kill9();
    drop(c);
    assert!(r.victim.exists());
    let gw = r.hermes.gateway(r.dir.path(), &["--listen", &addr]);
    let mut c = connect_awaiting_online(&gw, &r.p, HERMES_TURN_TIMEOUT).await;
    // The outboxed picker is replayed by sync, and still answerable.
    let id = c.request("sync", None, None, json!({ "cursor": 0 })).await;
    let replayed = c
        .recv_until(|f| frame_type(f) == "picker.choice" && pstr(f, "picker_id") == picker_id)
        .await;
    assert_eq!(replayed["payload"], picker["payload"]);
    let _ = id;
    select(&mut c, &replayed, "once").await;
    let answer = c.recv_until(|f| frame_type(f) == "message.stop").await;
    assert!(
        pstr(&answer, "final_text").starts_with("Tool said:"),
        "{answer}\n{}",
        gw.output_tail()
    );
    assert!(!r.victim.exists(), "the approved command did not run");
    // The answer arrives once: in history, and no second copy later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = c
        .request("history", Some("default"), None, json!({ "limit": 20 }))
        .await;
    let h = c.recv_reply(id).await;
    let answers: Vec<&Value> = h["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            m["role"] == "assistant" && m["text"].as_str().unwrap_or("").starts_with("Tool said:")
        })
        .collect();
    assert_eq!(answers.len(), 1, "{h}");
    assert_eq!(tool_results(&r.llm).len(), 1);
    let asked = r
        .llm
        .requests()
        .iter()
        .filter(|q| {
            q["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .is_some_and(|t| t.contains("tidy up"))
                && q.get("tools").is_some()
                && q["messages"]
                    .as_array()
                    .is_some_and(|m| !m.iter().any(|m| m["role"] == "tool"))
        })
        .count();
    assert_eq!(asked, 1, "the message was handed over again");
}

/// The gateway restarts while an approval waits and nobody answers: the restarted gateway,
/// following the run by its status only, still closes the picker when Hermes stops waiting.
#[tokio::test]
async fn after_a_restart_an_unanswered_approval_still_closes_when_hermes_stops_waiting() {
    let _one = ONE_HERMES.lock().await;
    let mut r = rig(8);
    let mut c = connect_awaiting_online(&r.gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let picker = ask_for_danger(&mut c, &r).await;
    let addr = r.gw.addr.to_string();
    r.gw.kill9();
    drop(c);
    let gw = r.hermes.gateway(r.dir.path(), &["--listen", &addr]);
    let mut c = connect_awaiting_online(&gw, &r.p, HERMES_TURN_TIMEOUT).await;
    let closed = c
        .recv_until(|f| system_answer(f) && pstr(f, "text").contains("was not approved in time"))
        .await;
    assert!(pstr(&closed, "text").contains(&command_of(&r)), "{closed}");
    let answer = c.recv_type("message.stop").await;
    assert!(
        pstr(&answer, "final_text").starts_with("Tool said:"),
        "{answer}\n{}",
        gw.output_tail()
    );
    assert!(
        r.victim.join("cat.jpg").exists(),
        "an unanswered command ran"
    );
    let id = select(&mut c, &picker, "once").await;
    let e = c.recv_reply(id).await;
    assert_eq!(e["payload"]["code"], "not_found", "{e}");
}
