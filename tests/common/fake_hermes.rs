//! A fake Hermes API server on loopback, for what the real one cannot be made to do on cue: its
//! runs API (`/v1/capabilities` with `run_steer`, `POST /v1/runs`, the run's event stream,
//! `POST /v1/runs/{id}/steer` and `/approval`), one thread per connection so a held event stream
//! does not hold the other requests. The run's end and the answers to a steer and to an approval
//! each wait at a [`Gate`] the test opens, so "slow" lasts exactly as long as the test needs. A
//! message containing `[[approval]]` makes the run ask for one approval after its first words.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::fake_http::{json_200, read_request};
use super::gate::Gate;

/// The one run the fake starts.
pub const RUN_ID: &str = "run_fake_1";

/// The running fake: its URL (for `--agent-url`) and its gates.
pub struct FakeHermes {
    pub url: String,
    /// The run's event stream sends its first words, then waits here before `run.completed`.
    pub run_end: Gate,
    /// A steer is answered (`accepted`) only once this is open.
    pub steer_answer: Gate,
    /// An approval's answer is taken (`resolved`) only once this is open.
    pub approval_answer: Gate,
    /// Each held request as it arrives, before its answer waits: `steer TEXT`, `approval CHOICE`.
    held: Mutex<mpsc::Receiver<String>>,
}

/// What the connections' threads share.
struct Shared {
    run_end: Gate,
    steer_answer: Gate,
    approval_answer: Gate,
    held: Mutex<mpsc::Sender<String>>,
    /// The run was asked for with `[[approval]]` in its message.
    asks_approval: std::sync::atomic::AtomicBool,
}

impl FakeHermes {
    pub fn start() -> FakeHermes {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake Hermes");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (held_tx, held) = mpsc::channel();
        let shared = Arc::new(Shared {
            run_end: Gate::default(),
            steer_answer: Gate::default(),
            approval_answer: Gate::default(),
            held: Mutex::new(held_tx),
            asks_approval: Default::default(),
        });
        let fake = FakeHermes {
            url,
            run_end: shared.run_end.clone(),
            steer_answer: shared.steer_answer.clone(),
            approval_answer: shared.approval_answer.clone(),
            held: Mutex::new(held),
        };
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let shared = shared.clone();
                std::thread::spawn(move || serve(stream, &shared));
            }
        });
        fake
    }

    /// The next held request as it reaches the fake (within 10 s): `steer TEXT` or
    /// `approval CHOICE`.
    pub fn next_held(&self) -> String {
        self.held
            .lock()
            .unwrap()
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("no held request reached the fake Hermes")
    }
}

fn serve(mut stream: TcpStream, shared: &Shared) {
    let taken = read_request(&stream);
    let path = taken.line.split(' ').nth(1).unwrap_or("").to_owned();
    let method = taken.line.split(' ').next().unwrap_or("").to_owned();
    let body: Value = serde_json::from_slice(&taken.body).unwrap_or_default();
    let run = format!("/v1/runs/{RUN_ID}");
    let hold = |what: String, gate: &Gate| {
        let _ = shared.held.lock().unwrap().send(what);
        gate.wait();
    };
    let answer = match (method.as_str(), path.strip_prefix(&run)) {
        ("GET", _) if path == "/health" => json!({ "status": "ok", "version": "fake" }),
        ("GET", _) if path == "/v1/capabilities" => json!({
            "platform": "hermes-agent",
            "features": { "run_submission": true, "run_events_sse": true, "run_status": true,
                          "run_stop": true, "run_steer": true, "approval_events": true,
                          "run_approval_response": true }
        }),
        ("GET", _) if path == "/v1/models" => {
            json!({ "object": "list", "data": [{ "id": "fake-model" }] })
        }
        ("POST", _) if path == "/v1/runs" => {
            let asks = body.to_string().contains("[[approval]]");
            shared
                .asks_approval
                .store(asks, std::sync::atomic::Ordering::SeqCst);
            return respond(
                &mut stream,
                202,
                &json!({ "run_id": RUN_ID, "status": "started" }),
            );
        }
        ("GET", Some("/events")) => {
            let asks = shared
                .asks_approval
                .load(std::sync::atomic::Ordering::SeqCst);
            return stream_run(&mut stream, &shared.run_end, asks);
        }
        ("POST", Some("/steer")) => {
            hold(
                format!("steer {}", body["text"].as_str().unwrap_or("")),
                &shared.steer_answer,
            );
            json!({ "accepted": true })
        }
        ("POST", Some("/approval")) => {
            let choice = body["choice"].as_str().unwrap_or("");
            hold(format!("approval {choice}"), &shared.approval_answer);
            json!({ "resolved": 1 })
        }
        _ => {
            return respond(
                &mut stream,
                404,
                &json!({ "error": { "message": "not here" } }),
            )
        }
    };
    let _ = stream.write_all(&json_200(answer.to_string().as_bytes()));
}

fn respond(stream: &mut TcpStream, status: u16, body: &Value) {
    let body = body.to_string();
    let _ = stream.write_all(
        format!(
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
}

/// The run's events: its first words at once (and an approval request, when asked for),
/// `run.completed` once `run_end` opens.
fn stream_run(stream: &mut TcpStream, run_end: &Gate, asks_approval: bool) {
    let event = |v: Value| format!("data: {v}\n\n");
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    let mut first = event(json!({ "event": "message.delta", "delta": "Working on it. " }));
    if asks_approval {
        first += &event(
            json!({ "event": "approval.request", "command": "rm -rf /tmp/old",
                                "description": "delete in a temp path",
                                "choices": ["once", "session", "deny"] }),
        );
    }
    if stream
        .write_all(format!("{head}{first}").as_bytes())
        .is_err()
    {
        return;
    }
    let _ = stream.flush();
    run_end.wait();
    let _ =
        stream.write_all(event(json!({ "event": "message.delta", "delta": "Done." })).as_bytes());
    let end = json!({ "event": "run.completed", "output": "Working on it. Done.",
                      "usage": { "total_tokens": 5 } });
    let _ = stream.write_all(event(end).as_bytes());
}
