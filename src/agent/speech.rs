//! Answers to voice: an OpenAI-compatible `POST {url}/audio/speech` client (OpenAI, or a Piper,
//! Kokoro or openedai-speech server on the LAN), so a lane that asked for voice hears its
//! answer.
//!
//! What is spoken is the answer as a person would read it aloud: markdown marks, links' targets
//! and code left out (`speakable`), cut at `speech.max_chars` with a last sentence saying so.
//! The call is blocking `ureq` on a worker thread (`off_loop`), bounded in time
//! (`speech.timeout_secs`) and in what it reads back (`MAX_AUDIO_BYTES`); an answer that is
//! not audio (an HTML page, JSON, nothing) is refused rather than offered as a voice.

use std::io::Read;
use std::time::Duration;

use serde_json::json;

use super::http::off_loop;
use super::transcribe::{error_detail, service_client};
use crate::config::speech::MAX_AUDIO_BYTES;
use crate::config::{ConfigError, Secret, SpeechConfig};

/// What a cut answer's voice ends with.
const CUT_NOTE: &str = "The rest of the answer is in the text.";

/// Why an answer was not spoken, in words its reader can act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpeechError {
    #[error("the answer has nothing to say aloud (only code or marks)")]
    NothingToSay,
    #[error("the speech service at {url} cannot be reached: {why}")]
    Unreachable { url: String, why: String },
    #[error("the speech service refused the key ({0}); check speech.key")]
    Unauthorized(String),
    #[error("the speech service did not answer within {0} seconds (speech.timeout_secs)")]
    TimedOut(u64),
    #[error("the speech service answered with an error: {0}")]
    Refused(String),
    #[error("the speech service's answer is not audio: {0}")]
    NotAudio(String),
    #[error("the speech service's answer is over {MAX_AUDIO_BYTES} bytes")]
    TooLarge,
    #[error("the speech could not be made: {0}")]
    Worker(String),
}

/// A configured speech service. Cheap to clone (the HTTP client is shared).
#[derive(Clone)]
pub struct Speaker {
    http: ureq::Agent,
    base: String,
    key: Secret,
    model: String,
    voice: String,
    format: String,
    mime: &'static str,
    ext: &'static str,
    timeout_secs: u64,
    max_chars: usize,
}

/// One spoken answer: the service's bytes, and how they are stored and offered.
#[derive(Debug, Clone, PartialEq)]
pub struct Spoken {
    pub bytes: Vec<u8>,
    pub mime: String,
    /// `voice.ogg`, `voice.mp3`, …: the extension tells a phone's player the format.
    pub filename: String,
    /// Whether the answer was longer than `max_chars` and only its start was spoken.
    pub cut: bool,
}

impl Speaker {
    /// The service `config` names; `None` when it is off.
    pub fn from_config(config: &SpeechConfig) -> Result<Option<Speaker>, ConfigError> {
        if !config.is_on() {
            return Ok(None);
        }
        let (mime, ext) = config.format_type().ok_or(ConfigError::Invalid {
            key: "speech.format",
            why: "must be one of opus, mp3, aac, flac, wav".into(),
        })?;
        let key = config.resolve_key()?;
        let http = service_client(config.timeout_secs);
        Ok(Some(Speaker {
            http,
            base: config.base_url(),
            key,
            model: config.model.trim().to_owned(),
            voice: config.voice.trim().to_owned(),
            format: config.format.trim().to_ascii_lowercase(),
            mime,
            ext,
            timeout_secs: config.timeout_secs,
            max_chars: config.max_chars,
        }))
    }

    /// Where it sends text (never with the key), for logs and the pages.
    pub fn describe(&self) -> String {
        format!("{} ({}, {})", self.base, self.model, self.voice)
    }

    /// The longest one answer may take to speak (`speech.timeout_secs`).
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// Speaks `answer` (made speakable and cut at `max_chars` first), on a worker thread.
    pub async fn speak(&self, answer: &str) -> Result<Spoken, SpeechError> {
        let (text, cut) = speakable(answer, self.max_chars);
        if text.is_empty() {
            return Err(SpeechError::NothingToSay);
        }
        let this = self.clone();
        let bytes = off_loop("speech", move |_stop| this.request(&text))
            .await
            .map_err(|e| SpeechError::Worker(e.to_string()))??;
        Ok(Spoken {
            bytes,
            mime: self.mime.to_owned(),
            filename: format!("voice.{}", self.ext),
            cut,
        })
    }

    /// One blocking `POST /audio/speech`: the audio's bytes.
    fn request(&self, text: &str) -> Result<Vec<u8>, SpeechError> {
        let body = json!({
            "model": self.model,
            "voice": self.voice,
            "input": text,
            "response_format": self.format,
        })
        .to_string();
        let mut req = self
            .http
            .post(format!("{}/audio/speech", self.base))
            .header("Content-Type", "application/json")
            .header("Accept", self.mime);
        if !self.key.is_empty() {
            req = req.header("Authorization", format!("Bearer {}", self.key.expose()));
        }
        let resp = req.send(body.as_bytes()).map_err(|e| self.transport(&e))?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut bytes = Vec::new();
        resp.into_body()
            .into_reader()
            .take(MAX_AUDIO_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::TimedOut => SpeechError::TimedOut(self.timeout_secs),
                _ => self.unreachable(e.to_string()),
            })?;
        match status {
            200..=299 => {
                if bytes.len() as u64 > MAX_AUDIO_BYTES {
                    return Err(SpeechError::TooLarge);
                }
                audio_or_why(&content_type, bytes)
            }
            401 | 403 => Err(SpeechError::Unauthorized(format!("HTTP {status}"))),
            _ => Err(SpeechError::Refused(
                match error_detail(&String::from_utf8_lossy(&bytes)) {
                    d if d.is_empty() => format!("HTTP {status}"),
                    d => format!("HTTP {status}: {d}"),
                },
            )),
        }
    }

    fn unreachable(&self, why: String) -> SpeechError {
        SpeechError::Unreachable {
            url: self.base.clone(),
            why,
        }
    }

    fn transport(&self, e: &ureq::Error) -> SpeechError {
        use ureq::Error as E;
        match e {
            E::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect) => {
                self.unreachable("no connection in time".into())
            }
            E::Timeout(_) => SpeechError::TimedOut(self.timeout_secs),
            E::HostNotFound => self.unreachable("its host name is unknown".into()),
            E::ConnectionFailed => self.unreachable("the connection failed".into()),
            E::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                self.unreachable("nothing listens there (connection refused)".into())
            }
            E::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                SpeechError::TimedOut(self.timeout_secs)
            }
            other => self.unreachable(other.to_string()),
        }
    }
}

/// The audio of a 2xx answer, or why it is not audio: empty, or a type that is text (an HTML
/// error page, JSON). A service that sends no type, or a generic binary one, is believed.
fn audio_or_why(content_type: &str, bytes: Vec<u8>) -> Result<Vec<u8>, SpeechError> {
    if bytes.is_empty() {
        return Err(SpeechError::NotAudio("it is empty".into()));
    }
    let essence = content_type.split(';').next().unwrap_or("").trim();
    let textual = essence.starts_with("text/")
        || essence.contains("json")
        || essence.contains("xml")
        || essence.contains("html");
    if textual {
        let head: String = String::from_utf8_lossy(&bytes).chars().take(120).collect();
        return Err(SpeechError::NotAudio(format!("{essence}: {}", head.trim())));
    }
    Ok(bytes)
}

/// The answer as it is read aloud: fenced code blocks and inline code left out, markdown marks
/// (headings, emphasis, quotes, list bullets, table bars) dropped, a link as its words, and at
/// most `max_chars` characters, cut at a sentence or word end with `CUT_NOTE` after. Also
/// whether it was cut.
pub fn speakable(answer: &str, max_chars: usize) -> (String, bool) {
    let mut lines = Vec::new();
    let mut in_fence = false;
    for line in answer.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence || trimmed.starts_with("    ") || line.starts_with('\t') {
            continue;
        }
        let plain = plain_line(trimmed);
        if !plain.is_empty() {
            lines.push(plain);
        }
    }
    let text = lines.join("\n");
    cut_at(&text, max_chars)
}

/// One line without its markdown: block marks at its start, inline code, emphasis and link
/// targets.
fn plain_line(line: &str) -> String {
    let mut rest = line.trim_start_matches(['#', '>']).trim_start();
    for bullet in ["- ", "* ", "+ "] {
        if let Some(r) = rest.strip_prefix(bullet) {
            rest = r;
        }
    }
    if rest
        .chars()
        .all(|c| matches!(c, '-' | '=' | '|' | ':' | '*' | '_' | ' '))
    {
        return String::new();
    }
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' => {
                // Inline code is left out, up to its closing backtick.
                for d in chars.by_ref() {
                    if d == '`' {
                        break;
                    }
                }
            }
            '*' | '_' | '~' | '|' => {
                if c == '|' {
                    out.push(',');
                }
            }
            ']' if chars.peek() == Some(&'(') => {
                // A link's target is not read out: its words before it are.
                for d in chars.by_ref() {
                    if d == ')' {
                        break;
                    }
                }
            }
            // A link's or an image's opening bracket.
            '[' => {}
            '!' if chars.peek() == Some(&'[') => {}
            _ => out.push(c),
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` within `max` characters: whole when it fits, else cut after the last sentence end
/// (or space) in the budget left for `CUT_NOTE`, which follows.
fn cut_at(text: &str, max: usize) -> (String, bool) {
    if text.chars().count() <= max {
        return (text.to_owned(), false);
    }
    let room = max.saturating_sub(CUT_NOTE.chars().count() + 1);
    let head: String = text.chars().take(room).collect();
    let end = head
        .rfind(['.', '!', '?', '\n'])
        .map(|i| i + 1)
        .filter(|&i| i > room / 2)
        .or_else(|| head.rfind(' '))
        .unwrap_or(head.len());
    let head = head[..end].trim_end();
    if head.is_empty() {
        return (CUT_NOTE.chars().take(max).collect(), true);
    }
    (format!("{head} {CUT_NOTE}"), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_and_marks_are_left_out() {
        let answer = "## Plan\n\nRun **this**:\n```sh\nrm -rf /tmp/x\n```\n- use `ls` to see\n- read [the docs](https://x.org/a)\n\n| a | b |\n|---|---|\n";
        let (text, cut) = speakable(answer, 1000);
        assert!(!cut);
        assert_eq!(
            text,
            "Plan\nRun this:\nuse to see\nread the docs\n, a , b ,"
        );
        assert!(!text.contains("rm -rf") && !text.contains("https"));
    }

    #[test]
    fn a_long_answer_is_cut_at_a_sentence_and_says_so() {
        let answer = "One sentence here. ".repeat(100);
        let (text, cut) = speakable(&answer, 200);
        assert!(cut);
        assert!(text.chars().count() <= 200, "{}", text.len());
        assert!(text.ends_with(CUT_NOTE), "{text}");
        assert!(text.starts_with("One sentence here. One"));
        let (short, cut) = speakable("Hi.", 200);
        assert_eq!((short.as_str(), cut), ("Hi.", false));
        // Not even the note fits: the note's start, never more than asked.
        assert!(speakable(&answer, 10).0.chars().count() <= 10);
    }

    #[test]
    fn only_code_is_nothing_to_say() {
        assert_eq!(speakable("```\nx = 1\n```", 100).0, "");
    }

    #[test]
    fn text_answers_are_not_audio() {
        assert!(audio_or_why("audio/ogg", vec![1, 2]).is_ok());
        assert!(audio_or_why("", vec![1, 2]).is_ok());
        assert!(matches!(
            audio_or_why("text/html; charset=utf-8", b"<html>oops".to_vec()),
            Err(SpeechError::NotAudio(_))
        ));
        assert!(matches!(
            audio_or_why("application/json", b"{}".to_vec()),
            Err(SpeechError::NotAudio(_))
        ));
        assert!(matches!(
            audio_or_why("audio/ogg", Vec::new()),
            Err(SpeechError::NotAudio(_))
        ));
    }

    #[test]
    fn the_key_is_not_in_what_is_described() {
        let config = SpeechConfig {
            url: "http://127.0.0.1:9/v1/".into(),
            key: Secret("sk-very-secret".into()),
            ..SpeechConfig::default()
        };
        let s = Speaker::from_config(&config).unwrap().unwrap();
        assert_eq!(s.describe(), "http://127.0.0.1:9/v1 (tts-1, alloy)");
        assert!(Speaker::from_config(&SpeechConfig::default())
            .unwrap()
            .is_none());
    }
}
