//! A fake Hermes API server on loopback, for what the real one cannot be made to do on cue: its
//! runs API (`/v1/capabilities` with `run_steer`, `POST /v1/runs`, the run's event stream,
//! `POST /v1/runs/{id}/steer`), one thread per connection so a held event stream does not hold
//! the other requests. The run's end and the answer to a steer each wait at a [`Gate`] the test
//! opens, so "slow" lasts exactly as long as the test needs.

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
    /// The text of each steer, sent as it arrives (before its answer waits).
    steers: Mutex<mpsc::Receiver<String>>,
}

impl FakeHermes {
    pub fn start() -> FakeHermes {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake Hermes");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (run_end, steer_answer) = (Gate::default(), Gate::default());
        let (steer_tx, steers) = mpsc::channel();
        let shared = Arc::new((run_end.clone(), steer_answer.clone(), Mutex::new(steer_tx)));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let (run_end, steer_answer, steer_tx) = &*shared;
                    let steer_tx = steer_tx.lock().unwrap().clone();
                    serve(stream, run_end, steer_answer, &steer_tx);
                });
            }
        });
        FakeHermes {
            url,
            run_end,
            steer_answer,
            steers: Mutex::new(steers),
        }
    }

    /// The next steer's text as it reaches the fake (within 10 s).
    pub fn next_steer(&self) -> String {
        self.steers
            .lock()
            .unwrap()
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("no steer reached the fake Hermes")
    }
}

fn serve(
    mut stream: TcpStream,
    run_end: &Gate,
    steer_answer: &Gate,
    steers: &mpsc::Sender<String>,
) {
    let taken = read_request(&stream);
    let path = taken.line.split(' ').nth(1).unwrap_or("").to_owned();
    let method = taken.line.split(' ').next().unwrap_or("").to_owned();
    let events = format!("/v1/runs/{RUN_ID}/events");
    let steer = format!("/v1/runs/{RUN_ID}/steer");
    let answer = match (method.as_str(), path.as_str()) {
        ("GET", "/health") => json!({ "status": "ok", "version": "fake" }),
        ("GET", "/v1/capabilities") => json!({
            "platform": "hermes-agent",
            "features": { "run_submission": true, "run_events_sse": true, "run_status": true,
                          "run_stop": true, "run_steer": true }
        }),
        ("GET", "/v1/models") => json!({ "object": "list", "data": [{ "id": "fake-model" }] }),
        ("POST", "/v1/runs") => {
            return respond(
                &mut stream,
                202,
                &json!({ "run_id": RUN_ID, "status": "started" }),
            )
        }
        ("GET", p) if p == events => return stream_run(&mut stream, run_end),
        ("POST", p) if p == steer => {
            let text: Value = serde_json::from_slice(&taken.body).unwrap_or_default();
            let _ = steers.send(text["text"].as_str().unwrap_or("").to_owned());
            steer_answer.wait();
            json!({ "accepted": true })
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

/// The run's events: its first words at once, `run.completed` once `run_end` opens.
fn stream_run(stream: &mut TcpStream, run_end: &Gate) {
    let event = |v: Value| format!("data: {v}\n\n");
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
    let first = event(json!({ "event": "message.delta", "delta": "Working on it. " }));
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
