//! `[speech]`: the text-to-speech service the agent's answers are spoken by, for lanes that
//! asked for voice (`/voice on|auto`). Any OpenAI-compatible `/audio/speech` endpoint: OpenAI,
//! or a Piper, Kokoro or openedai-speech server on the LAN.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret};

/// The longest `timeout_secs` accepted (config file and admin page): the voice follows the
/// text it speaks, and one that comes minutes later is no longer a reply.
pub const MAX_TIMEOUT_SECS: u64 = 120;
/// The most characters `max_chars` may be: OpenAI's `/audio/speech` takes at most 4096, and
/// local servers slow down past a few minutes of speech.
pub const MAX_CHARS: usize = 4096;
/// The largest audio answer read from the service. Five minutes of Opus is under 2 MiB and of
/// MP3 under 8 MiB; WAV at 24 kHz is 2.9 MiB a minute, so a long WAV answer is cut off here.
pub const MAX_AUDIO_BYTES: u64 = 16 << 20;

/// The audio formats the API names (`response_format`), and the mime type and file extension
/// each is stored as.
pub const FORMATS: &[(&str, &str, &str)] = &[
    ("opus", "audio/ogg", "ogg"),
    ("mp3", "audio/mpeg", "mp3"),
    ("aac", "audio/aac", "aac"),
    ("flac", "audio/flac", "flac"),
    ("wav", "audio/wav", "wav"),
];

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SpeechConfig {
    /// Base URL of the API, up to and including its version (`http://192.168.1.20:8880/v1`,
    /// `https://api.openai.com/v1`). Empty: answers are text only.
    pub url: String,
    /// Bearer key, when the service wants one. Prefer `key_file`: a config file is often shared.
    pub key: Secret,
    /// A file whose first line is the key.
    pub key_file: Option<PathBuf>,
    /// The text-to-speech model to ask for.
    pub model: String,
    /// The voice to speak in (the service's name for it).
    pub voice: String,
    /// The audio format asked for: `opus` (Ogg Opus, small, what phones play as a voice note),
    /// `mp3`, `aac`, `flac` or `wav`.
    pub format: String,
    /// Longest one answer may take to speak, in seconds (upload, synthesis, download): past
    /// it the text stands alone with a note.
    pub timeout_secs: u64,
    /// The most characters of an answer spoken; a longer one is cut there, and the voice says
    /// it was.
    pub max_chars: usize,
}

impl Default for SpeechConfig {
    fn default() -> Self {
        SpeechConfig {
            url: String::new(),
            key: Secret::default(),
            key_file: None,
            model: "tts-1".into(),
            voice: "alloy".into(),
            format: "opus".into(),
            timeout_secs: 30,
            max_chars: 1500,
        }
    }
}

impl SpeechConfig {
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

    /// The mime type and file extension of `format`; `None` for a format the API does not name.
    pub fn format_type(&self) -> Option<(&'static str, &'static str)> {
        let asked = self.format.trim().to_ascii_lowercase();
        FORMATS
            .iter()
            .find(|(name, _, _)| *name == asked)
            .map(|(_, mime, ext)| (*mime, *ext))
    }
}
