//! A fake OpenAI-compatible speech-to-text service on loopback (`POST /v1/audio/transcriptions`):
//! it parses each multipart request, keeps it for the test to check (fields, the file's bytes,
//! name and type), and answers what the test scripted. Requests that are not well-formed
//! multipart are kept too, with `malformed` saying why, and answered 400.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::fake_http::{self, Taken};

/// One request the service took, parsed.
#[derive(Debug, Clone, Default)]
pub struct SttRequest {
    /// `POST /v1/audio/transcriptions HTTP/1.1`.
    pub line: String,
    pub authorization: Option<String>,
    pub content_type: String,
    /// The plain form fields (`model`, `response_format`, `language`).
    pub fields: BTreeMap<String, String>,
    /// The `file` part: its bytes, its `filename` and its `Content-Type`.
    pub file: Vec<u8>,
    pub filename: String,
    pub file_type: String,
    /// Set when the body was not the multipart the API takes.
    pub malformed: Option<String>,
}

/// What the fake answers a request with.
pub enum SttAnswer {
    /// `200 {"text": …}`.
    Text(String),
    /// This status with an OpenAI-style error body carrying the message.
    Fail(u16, String),
}

/// The running fake: its base URL (with `/v1`, as `[transcription] url` takes it) and its log.
pub struct FakeStt {
    pub url: String,
    log: Arc<Mutex<Vec<SttRequest>>>,
}

impl FakeStt {
    /// Starts the service; `answer` decides each (well-formed) request's answer.
    pub fn start(answer: impl Fn(&SttRequest) -> SttAnswer + Send + 'static) -> FakeStt {
        let log: Arc<Mutex<Vec<SttRequest>>> = Arc::default();
        let kept = log.clone();
        let base = fake_http::start(move |taken: Taken| {
            let req = parse(&taken);
            kept.lock().unwrap().push(req.clone());
            if let Some(why) = &req.malformed {
                return response(400, &serde_json::json!({ "error": { "message": why } }));
            }
            match answer(&req) {
                SttAnswer::Text(t) => response(200, &serde_json::json!({ "text": t })),
                SttAnswer::Fail(status, why) => {
                    response(status, &serde_json::json!({ "error": { "message": why } }))
                }
            }
        });
        FakeStt {
            url: format!("{base}/v1"),
            log,
        }
    }

    /// A service that hears `text` in every file.
    pub fn hearing(text: &str) -> FakeStt {
        let text = text.to_owned();
        FakeStt::start(move |_| SttAnswer::Text(text.clone()))
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<SttRequest> {
        self.log.lock().unwrap().clone()
    }
}

fn response(status: u16, body: &serde_json::Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Parses a multipart/form-data request the way a strict server would.
fn parse(t: &Taken) -> SttRequest {
    let mut req = SttRequest {
        line: t.line.clone(),
        authorization: t.header("authorization").map(str::to_owned),
        content_type: t.header("content-type").unwrap_or("").to_owned(),
        ..SttRequest::default()
    };
    if t.line != "POST /v1/audio/transcriptions HTTP/1.1" {
        req.malformed = Some(format!("unexpected request line {}", t.line));
        return req;
    }
    let Some(boundary) = req
        .content_type
        .strip_prefix("multipart/form-data; boundary=")
        .map(str::to_owned)
    else {
        req.malformed = Some(format!("not multipart/form-data: {}", req.content_type));
        return req;
    };
    let delimiter = format!("--{boundary}").into_bytes();
    let body = &t.body[..];
    if !body.starts_with(&delimiter) || !body.ends_with(format!("--{boundary}--\r\n").as_bytes()) {
        req.malformed = Some("the body does not start and end with the boundary".into());
        return req;
    }
    // Parts sit between "--B\r\n" and "\r\n--B".
    let mut rest = &body[delimiter.len()..];
    let separator = [b"\r\n".as_slice(), &delimiter].concat();
    loop {
        if rest.starts_with(b"--") {
            break;
        }
        let Some(after_crlf) = rest.strip_prefix(b"\r\n") else {
            req.malformed = Some("no line break after a boundary".into());
            return req;
        };
        let Some(end) = find(after_crlf, &separator) else {
            req.malformed = Some("a part without its closing boundary".into());
            return req;
        };
        let part = &after_crlf[..end];
        rest = &after_crlf[end + separator.len()..];
        let Some(split) = find(part, b"\r\n\r\n") else {
            req.malformed = Some("a part without headers".into());
            return req;
        };
        let headers = String::from_utf8_lossy(&part[..split]).into_owned();
        let content = &part[split + 4..];
        let disposition = headers
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("content-disposition:"))
            .unwrap_or("");
        let name = quoted(disposition, "name=\"").unwrap_or_default();
        if name == "file" {
            req.file = content.to_vec();
            req.filename = quoted(disposition, "filename=\"").unwrap_or_default();
            req.file_type = headers
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .starts_with("content-type:")
                        .then(|| l["content-type:".len()..].trim().to_owned())
                })
                .unwrap_or_default();
        } else {
            req.fields
                .insert(name, String::from_utf8_lossy(content).into_owned());
        }
    }
    req
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The value after `key` up to the next `"`.
fn quoted(header: &str, key: &str) -> Option<String> {
    let start = header.find(key)? + key.len();
    let len = header[start..].find('"')?;
    Some(header[start..start + len].to_owned())
}

/// Sends a message of the uploads `refs` alone (no text) in the default channel; the reply to it
/// (its `read.receipt`, or an `error`).
pub async fn send_notes(c: &mut super::Client, refs: &[&str]) -> serde_json::Value {
    let id = c
        .request(
            "message.send",
            Some("default"),
            None,
            serde_json::json!({ "text": "", "media_refs": refs }),
        )
        .await;
    c.recv_reply(id).await
}

/// Uploads `data` as a voice note `filename` (audio/ogg) under `media_ref`; it must be taken.
pub async fn upload_voice(c: &mut super::Client, media_ref: &str, filename: &str, data: &[u8]) {
    super::upload_file(c, media_ref, "voice", "audio/ogg", filename, data).await;
}
