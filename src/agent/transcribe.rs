//! Voice notes to text: an OpenAI-compatible `POST {url}/audio/transcriptions` client (OpenAI,
//! Groq, a faster-whisper or whisper.cpp server on the LAN), so the agent reads what was said.
//!
//! The request is multipart/form-data built here by hand: four short fields and the file. A
//! crate for it would bring a second HTTP stack's worth of code for what is a few lines of
//! bytes. The call is blocking `ureq` on a worker thread (`off_loop`), bounded in time
//! (`transcription.timeout_secs`) and in what it sends (`limits.transcription_bytes`).

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::http::off_loop;
use crate::config::{ConfigError, Secret, TranscriptionConfig};
use crate::protocol::mime;

/// Largest answer read: a transcript of 25 MiB of speech is far smaller.
const MAX_ANSWER_BYTES: u64 = 1 << 20;
/// How long a connection to the service may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a voice note was not transcribed, in words its sender can act on.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TranscribeError {
    #[error("the voice note is {size} bytes; at most {limit} are sent for transcription (limits.transcription_bytes)")]
    TooLarge { size: u64, limit: u64 },
    #[error("the voice note could not be read from media storage: {0}")]
    Unreadable(String),
    #[error("the transcription service at {url} cannot be reached: {why}")]
    Unreachable { url: String, why: String },
    #[error("the transcription service refused the key ({0}); check transcription.key")]
    Unauthorized(String),
    #[error(
        "the transcription service did not answer within {0} seconds (transcription.timeout_secs)"
    )]
    TimedOut(u64),
    #[error("the transcription service answered with an error: {0}")]
    Refused(String),
    #[error("the transcription service's answer has no transcript: {0}")]
    BadAnswer(String),
    #[error("the transcription could not run: {0}")]
    Worker(String),
}

/// A configured transcription service. Cheap to clone (the HTTP client is shared).
#[derive(Clone)]
pub struct Transcriber {
    http: ureq::Agent,
    base: String,
    key: Secret,
    model: String,
    language: String,
    timeout_secs: u64,
    max_bytes: u64,
}

/// One audio file to transcribe: its bytes as stored, and what the sender called it.
pub struct Audio {
    pub bytes: Vec<u8>,
    pub filename: String,
    pub mime: String,
}

impl Transcriber {
    /// The service `config` names, with at most `max_bytes` sent per file; `None` when it is off.
    pub fn from_config(
        config: &TranscriptionConfig,
        max_bytes: u64,
    ) -> Result<Option<Transcriber>, ConfigError> {
        if !config.is_on() {
            return Ok(None);
        }
        let key = config.resolve_key()?;
        let http = service_client(config.timeout_secs);
        Ok(Some(Transcriber {
            http,
            base: config.base_url(),
            key,
            model: config.model.trim().to_owned(),
            language: config.language.trim().to_owned(),
            timeout_secs: config.timeout_secs,
            max_bytes,
        }))
    }

    /// Where it sends audio (never with the key), for logs and the admin page.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.base, self.model)
    }

    /// The longest one transcription may take (`transcription.timeout_secs`).
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// The most bytes of audio one request carries.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Reads the stored file at `path` (at most `max_bytes`) and transcribes it, on a worker
    /// thread. A file over the limit is not read at all.
    pub async fn transcribe_file(
        &self,
        path: PathBuf,
        filename: String,
        mime: String,
    ) -> Result<String, TranscribeError> {
        let this = self.clone();
        off_loop("transcribe", move |_stop| {
            let audio = this.read(&path, filename, mime)?;
            this.request(&audio)
        })
        .await
        .map_err(|e| TranscribeError::Worker(e.to_string()))?
    }

    /// Transcribes bytes already in memory (the admin page's test sound), on a worker thread.
    pub async fn transcribe(&self, audio: Audio) -> Result<String, TranscribeError> {
        let this = self.clone();
        off_loop("transcribe", move |_stop| this.request(&audio))
            .await
            .map_err(|e| TranscribeError::Worker(e.to_string()))?
    }

    fn read(
        &self,
        path: &std::path::Path,
        filename: String,
        mime: String,
    ) -> Result<Audio, TranscribeError> {
        let unreadable = |e: std::io::Error| TranscribeError::Unreadable(e.to_string());
        let file = std::fs::File::open(path).map_err(unreadable)?;
        let size = file.metadata().map_err(unreadable)?.len();
        if size > self.max_bytes {
            return Err(TranscribeError::TooLarge {
                size,
                limit: self.max_bytes,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        file.take(self.max_bytes)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        Ok(Audio {
            bytes,
            filename,
            mime,
        })
    }

    /// One blocking `POST /audio/transcriptions`: the transcript, trimmed.
    fn request(&self, audio: &Audio) -> Result<String, TranscribeError> {
        if audio.bytes.len() as u64 > self.max_bytes {
            return Err(TranscribeError::TooLarge {
                size: audio.bytes.len() as u64,
                limit: self.max_bytes,
            });
        }
        let boundary = boundary();
        let body = multipart(&boundary, self, audio);
        let mut req = self
            .http
            .post(format!("{}/audio/transcriptions", self.base))
            .header(
                "Content-Type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .header("Accept", "application/json");
        if !self.key.is_empty() {
            req = req.header("Authorization", format!("Bearer {}", self.key.expose()));
        }
        let resp = req.send(&body[..]).map_err(|e| self.transport(&e))?;
        let status = resp.status().as_u16();
        let text = resp
            .into_body()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_string()
            .map_err(|e| self.transport(&e))?;
        match status {
            200..=299 => transcript_of(&text),
            401 | 403 => Err(TranscribeError::Unauthorized(format!("HTTP {status}"))),
            _ => Err(TranscribeError::Refused(match error_detail(&text) {
                d if d.is_empty() => format!("HTTP {status}"),
                d => format!("HTTP {status}: {d}"),
            })),
        }
    }

    fn transport(&self, e: &ureq::Error) -> TranscribeError {
        use ureq::Error as E;
        let unreachable = |why: String| TranscribeError::Unreachable {
            url: self.base.clone(),
            why,
        };
        match e {
            E::Timeout(ureq::Timeout::Resolve | ureq::Timeout::Connect) => {
                unreachable("no connection in time".into())
            }
            E::Timeout(_) => TranscribeError::TimedOut(self.timeout_secs),
            E::HostNotFound => unreachable("its host name is unknown".into()),
            E::ConnectionFailed => unreachable("the connection failed".into()),
            E::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                unreachable("nothing listens there (connection refused)".into())
            }
            E::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                TranscribeError::TimedOut(self.timeout_secs)
            }
            other => unreachable(other.to_string()),
        }
    }
}

/// The HTTP client of a speech service (this one, and `speech.rs`'s): HTTP errors are
/// answers, a connection gives up after `CONNECT_TIMEOUT`, a whole call after `timeout_secs`.
pub(super) fn service_client(timeout_secs: u64) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_global(Some(Duration::from_secs(timeout_secs)))
        .tls_config(crate::http_client::system_tls())
        .user_agent(concat!("iris-gateway/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// A boundary no audio file will contain by chance: 128 random bits.
fn boundary() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("the OS random source is unavailable");
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("iris-{hex}")
}

/// The multipart/form-data body: `model`, `response_format`, `language` (when set), `file`.
fn multipart(boundary: &str, t: &Transcriber, audio: &Audio) -> Vec<u8> {
    let mut body = Vec::with_capacity(audio.bytes.len() + 1024);
    let mut field = |name: &str, value: &str| {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    };
    field("model", &t.model);
    field("response_format", "json");
    if !t.language.is_empty() {
        field("language", &t.language);
    }
    // Checked here too, not only at upload: a mime type stored before that check existed must
    // not end this header and write its own.
    let mime = mime::header_safe(&audio.mime);
    let filename = upload_name(&audio.filename, mime);
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: {mime}\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(&audio.bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

/// The file name sent: services tell the format by its extension (OpenAI refuses a name
/// without a known one), so a name without one gets the mime type's; quotes and line breaks,
/// which would end the header, become `_`.
fn upload_name(filename: &str, mime: &str) -> String {
    let clean: String = filename
        .chars()
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    let clean = if clean.trim().is_empty() {
        "voice".to_owned()
    } else {
        clean
    };
    let has_ext = std::path::Path::new(&clean)
        .extension()
        .is_some_and(|e| !e.is_empty());
    if has_ext {
        return clean;
    }
    let ext = match mime.split(';').next().unwrap_or("").trim() {
        "audio/ogg" | "audio/opus" => "ogg",
        "audio/mpeg" | "audio/mp3" => "mp3",
        "audio/mp4" | "audio/m4a" | "audio/x-m4a" | "audio/aac" => "m4a",
        "audio/wav" | "audio/x-wav" | "audio/wave" => "wav",
        "audio/webm" => "webm",
        "audio/flac" | "audio/x-flac" => "flac",
        _ => return clean,
    };
    format!("{clean}.{ext}")
}

/// `{"text": …}` (`response_format=json`); some servers answer plain text whatever was asked.
fn transcript_of(body: &str) -> Result<String, TranscribeError> {
    match serde_json::from_str::<Value>(body) {
        Ok(v) => v
            .get("text")
            .and_then(Value::as_str)
            .map(|t| t.trim().to_owned())
            .ok_or_else(|| {
                TranscribeError::BadAnswer(format!(
                    "no `text` in {}",
                    body.chars().take(200).collect::<String>()
                ))
            }),
        Err(_) if !body.trim_start().starts_with(['{', '[', '<']) => Ok(body.trim().to_owned()),
        Err(e) => Err(TranscribeError::BadAnswer(format!("not JSON ({e})"))),
    }
}

/// The `error.message` of an OpenAI-style error body, or the start of the body.
pub(super) fn error_detail(body: &str) -> String {
    let message = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("error"))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("message"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    message
        .unwrap_or_else(|| body.to_owned())
        .trim()
        .chars()
        .take(300)
        .collect()
}

/// One second of a 440 Hz tone as a 16 kHz mono 16-bit WAV (32 KiB): the admin page's test
/// sound. A tone, not silence, so a service that refuses empty audio still transcribes it.
pub fn test_sound() -> Vec<u8> {
    const RATE: u32 = 16_000;
    let samples: Vec<i16> = (0..RATE)
        .map(|i| {
            let t = i as f64 / RATE as f64;
            ((t * 440.0 * std::f64::consts::TAU).sin() * 8000.0) as i16
        })
        .collect();
    let data_len = samples.len() as u32 * 2;
    let mut wav = Vec::with_capacity(44 + data_len as usize);
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + data_len).to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    wav.extend_from_slice(&16u32.to_le_bytes()); // fmt chunk size
    wav.extend_from_slice(&1u16.to_le_bytes()); // PCM
    wav.extend_from_slice(&1u16.to_le_bytes()); // mono
    wav.extend_from_slice(&RATE.to_le_bytes());
    wav.extend_from_slice(&(RATE * 2).to_le_bytes()); // bytes per second
    wav.extend_from_slice(&2u16.to_le_bytes()); // block align
    wav.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&data_len.to_le_bytes());
    for s in samples {
        wav.extend_from_slice(&s.to_le_bytes());
    }
    wav
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcriber(language: &str) -> Transcriber {
        let config = TranscriptionConfig {
            url: "http://127.0.0.1:9/v1/".into(),
            language: language.into(),
            ..TranscriptionConfig::default()
        };
        Transcriber::from_config(&config, 100).unwrap().unwrap()
    }

    #[test]
    fn the_body_has_every_field_and_the_exact_bytes() {
        let t = transcriber("de");
        let audio = Audio {
            bytes: vec![0, 1, 2, 255, b'\r', b'\n'],
            filename: "note".into(),
            mime: "audio/ogg".into(),
        };
        let body = multipart("B", &t, &audio);
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.starts_with(
                "--B\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n"
            ),
            "{text}"
        );
        assert!(text.contains("name=\"response_format\"\r\n\r\njson\r\n"));
        assert!(text.contains("name=\"language\"\r\n\r\nde\r\n"));
        assert!(text
            .contains("name=\"file\"; filename=\"note.ogg\"\r\nContent-Type: audio/ogg\r\n\r\n"));
        let tail = b"\r\n--B--\r\n";
        assert!(body.ends_with(tail));
        let start = body.len() - tail.len() - audio.bytes.len();
        assert_eq!(&body[start..body.len() - tail.len()], &audio.bytes[..]);
        assert!(
            !String::from_utf8_lossy(&multipart("B", &transcriber(""), &audio))
                .contains("language")
        );
        assert_eq!(t.describe(), "http://127.0.0.1:9/v1 (whisper-1)");
    }

    #[test]
    fn a_stored_mime_type_cannot_write_a_header() {
        // As if stored before uploads checked mime types.
        let audio = Audio {
            bytes: vec![1, 2, 3],
            filename: "note".into(),
            mime: "audio/ogg\r\nX-Injected: yes".into(),
        };
        let text = String::from_utf8_lossy(&multipart("B", &transcriber(""), &audio)).into_owned();
        assert!(!text.contains("X-Injected"), "{text}");
        assert!(
            text.contains("filename=\"note\"\r\nContent-Type: application/octet-stream\r\n\r\n"),
            "{text}"
        );
    }

    #[test]
    fn names_keep_their_extension_and_lose_header_breakers() {
        assert_eq!(upload_name("a\"b\r\n.m4a", "audio/mp4"), "a_b__.m4a");
        assert_eq!(upload_name("", "audio/mpeg"), "voice.mp3");
        assert_eq!(upload_name("x", "application/octet-stream"), "x");
    }

    #[test]
    fn answers_are_read_as_json_or_plain_text() {
        assert_eq!(
            transcript_of("{\"text\":\" hi there \"}").unwrap(),
            "hi there"
        );
        assert_eq!(transcript_of("hello\n").unwrap(), "hello");
        assert!(matches!(
            transcript_of("{\"x\":1}"),
            Err(TranscribeError::BadAnswer(_))
        ));
        assert_eq!(
            error_detail("{\"error\":{\"message\":\"bad file\"}}"),
            "bad file"
        );
    }

    #[test]
    fn the_test_sound_is_a_one_second_wav() {
        let wav = test_sound();
        assert_eq!(&wav[..4], b"RIFF");
        assert_eq!(wav.len(), 44 + 32_000);
    }

    #[tokio::test]
    async fn too_large_and_unreachable_are_told_apart() {
        let t = transcriber("");
        let big = Audio {
            bytes: vec![0; 101],
            filename: "a.wav".into(),
            mime: "audio/wav".into(),
        };
        let e = t.transcribe(big).await.unwrap_err();
        assert_eq!(
            e,
            TranscribeError::TooLarge {
                size: 101,
                limit: 100
            }
        );
        let ok = Audio {
            bytes: vec![0; 10],
            filename: "a.wav".into(),
            mime: "audio/wav".into(),
        };
        let e = t.transcribe(ok).await.unwrap_err();
        assert!(matches!(e, TranscribeError::Unreachable { .. }), "{e:?}");
        assert!(e.to_string().contains("127.0.0.1:9"), "{e}");
    }
}
