//! A fake OpenAI-compatible text-to-speech service on loopback (`POST /v1/audio/speech`): it
//! keeps each request's JSON body for the test to check and answers what the test scripted:
//! audio bytes, an error, a page that is not audio, or nothing until a gate opens (a service
//! that hangs).

use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::fake_http::{self, Taken};
use super::gate::Gate;

/// One request the service took.
#[derive(Debug, Clone)]
pub struct TtsRequest {
    /// `POST /v1/audio/speech HTTP/1.1`.
    pub line: String,
    pub authorization: Option<String>,
    /// The JSON body (`model`, `voice`, `input`, `response_format`); `Null` when it was not JSON.
    pub body: Value,
}

impl TtsRequest {
    /// The text asked to be spoken.
    pub fn input(&self) -> &str {
        self.body["input"].as_str().unwrap_or("")
    }
}

/// What the fake answers a request with.
#[derive(Clone)]
pub enum TtsAnswer {
    /// `200` with these bytes as `audio/ogg`.
    Audio(Vec<u8>),
    /// `200` with an HTML page: a proxy's or a misrouted server's answer, not audio.
    Html,
    /// This status with an OpenAI-style error body.
    Fail(u16, String),
    /// No answer until the gate opens (then a `503`).
    Hang(Gate),
}

/// The running fake: its base URL (with `/v1`, as `[speech] url` takes it) and its log.
pub struct FakeTts {
    pub url: String,
    log: Arc<Mutex<Vec<TtsRequest>>>,
}

impl FakeTts {
    /// Starts the service answering every request with `answer`.
    pub fn start(answer: TtsAnswer) -> FakeTts {
        let log: Arc<Mutex<Vec<TtsRequest>>> = Arc::default();
        let kept = log.clone();
        let base = fake_http::start(move |taken: Taken| {
            let req = TtsRequest {
                line: taken.line.clone(),
                authorization: taken.header("authorization").map(str::to_owned),
                body: serde_json::from_slice(&taken.body).unwrap_or(Value::Null),
            };
            kept.lock().unwrap().push(req.clone());
            if req.line != "POST /v1/audio/speech HTTP/1.1" {
                return response(
                    404,
                    "application/json",
                    b"{\"error\":{\"message\":\"no route\"}}",
                );
            }
            match &answer {
                TtsAnswer::Audio(bytes) => response(200, "audio/ogg", bytes),
                TtsAnswer::Html => response(
                    200,
                    "text/html",
                    b"<html><body>Welcome to nginx</body></html>",
                ),
                TtsAnswer::Fail(status, why) => {
                    let body = serde_json::json!({ "error": { "message": why } }).to_string();
                    response(*status, "application/json", body.as_bytes())
                }
                TtsAnswer::Hang(gate) => {
                    gate.wait();
                    response(503, "application/json", b"{}")
                }
            }
        });
        FakeTts {
            url: format!("{base}/v1"),
            log,
        }
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<TtsRequest> {
        self.log.lock().unwrap().clone()
    }
}

fn response(status: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}
