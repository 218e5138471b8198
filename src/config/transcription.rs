//! `[transcription]`: the speech-to-text service voice notes are sent to before the agent is
//! asked, so the agent reads what was said. Any OpenAI-compatible `/audio/transcriptions`
//! endpoint: OpenAI, Groq, or a faster-whisper / whisper.cpp server on the LAN.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret};

/// The longest `timeout_secs` the admin page accepts: a person waits for a voice note's answer,
/// and past ten minutes the note is better sent as an attachment.
pub const MAX_TIMEOUT_SECS: u64 = 600;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TranscriptionConfig {
    /// Base URL of the API, up to and including its version (`http://192.168.1.20:8000/v1`,
    /// `https://api.openai.com/v1`). Empty: voice notes reach the agent as an attachment line.
    pub url: String,
    /// Bearer key, when the service wants one. Prefer `key_file`: a config file is often shared.
    pub key: Secret,
    /// A file whose first line is the key.
    pub key_file: Option<PathBuf>,
    /// The speech-to-text model to ask for.
    pub model: String,
    /// The spoken language as an ISO-639-1 code (`en`, `de`); empty lets the service detect it.
    pub language: String,
    /// Longest the voice notes of one message may take to transcribe, in seconds (upload,
    /// recognition and answer): the lane waits on them no longer; past it the agent gets them
    /// as attachments.
    pub timeout_secs: u64,
}

impl Default for TranscriptionConfig {
    fn default() -> Self {
        TranscriptionConfig {
            url: String::new(),
            key: Secret::default(),
            key_file: None,
            model: "whisper-1".into(),
            language: String::new(),
            timeout_secs: 30,
        }
    }
}

impl TranscriptionConfig {
    /// The base URL without a trailing `/`; empty when the service is off.
    pub fn base_url(&self) -> String {
        super::base_url_of(&self.url)
    }

    /// Whether a service is set at all.
    pub fn is_on(&self) -> bool {
        !self.base_url().is_empty()
    }

    /// The key: `key_file` if set (first line), else `key`.
    pub fn resolve_key(&self) -> Result<Secret, ConfigError> {
        super::key_of(&self.key, self.key_file.as_deref())
    }
}
