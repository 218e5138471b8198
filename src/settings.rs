//! Settings saved from the admin page: `DATA_DIR/settings.toml`, plain data beside the config.
//!
//! The service cannot write `/etc/iris-gateway/config.toml` (and should not: it is a conffile
//! the package manager owns), so what the owner changes in the browser lives in the data dir.
//! The order, highest first: command-line flags, these saved settings, the config file, the
//! built-in defaults (README, "Where settings come from"). `iris-gateway config --effective`
//! shows each value with where it came from.
//!
//! The file holds the agent key, the transcription key and the ntfy token as typed, so it is written mode 0600
//! (readable by the gateway's user and root only, like the store), atomically (a temporary file,
//! fsync, rename), and nothing in it is ever shown back on a page or logged ([`Hidden`]).
//!
//! A saved secret that is empty means "none": the page saves it so when the owner points the
//! agent or push at a new address without typing a new secret, so the old address's secret
//! (saved, or from the config file) is never sent to the new one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Config, ConfigError, Secret};

/// The file's name inside the data dir.
pub const FILE_NAME: &str = "settings.toml";
/// Largest settings file read: a few short strings; anything bigger is not ours.
pub const MAX_FILE_BYTES: u64 = 64 << 10;

/// A secret in the saved settings: serialised as is (the file is 0600), never in `Debug`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Hidden(pub String);

impl std::fmt::Debug for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// Everything the page can save; `None` leaves the config file's (or default) value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub agent: AgentSettings,
    pub push: PushSettings,
    pub transcription: TranscriptionSettings,
    pub speech: SpeechSettings,
    pub backup: BackupSettings,
    pub log: LogSettings,
    pub update: UpdateSettings,
}

/// `[update]` as the page sets it: where newer versions are looked for. Only the gateway reads
/// these (the root helper reads the config file alone); a bundle from any address must still
/// carry a trusted signature.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpdateSettings {
    pub url: Option<String>,
    pub automatic: Option<bool>,
}

/// `[backup]`: the scheduled backups (`crate::backups`). No schedule: none are made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackupSettings {
    /// `daily` or `weekly`; absent (or anything else) is off.
    pub schedule: Option<String>,
    /// Where they are written: a folder, or a mounted USB stick.
    pub folder: Option<String>,
    /// How many are kept (the oldest beyond it are deleted).
    pub keep: Option<u32>,
}

/// `[log]`: how the Log page shows times.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// A zone name of the zone database (`Europe/Berlin`); absent: the box's own.
    pub timezone: Option<String>,
}

/// `[transcription]` as the page sets it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TranscriptionSettings {
    pub url: Option<String>,
    pub key: Option<Hidden>,
    pub model: Option<String>,
    pub language: Option<String>,
    pub timeout_secs: Option<u64>,
}

/// `[speech]` as the page sets it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpeechSettings {
    pub url: Option<String>,
    pub key: Option<Hidden>,
    pub model: Option<String>,
    pub voice: Option<String>,
    pub format: Option<String>,
    pub timeout_secs: Option<u64>,
    pub max_chars: Option<usize>,
}

impl SpeechSettings {
    /// Lays the saved values over `[speech]`.
    fn apply(&self, speech: &mut crate::config::SpeechConfig) {
        if let Some(v) = &self.url {
            speech.url = v.clone();
        }
        if let Some(v) = &self.key {
            // Empty: none (the page moved the service to a new address without a new key).
            speech.key = Secret(v.0.clone());
            speech.key_file = None;
        }
        if let Some(v) = &self.model {
            speech.model = v.clone();
        }
        if let Some(v) = &self.voice {
            speech.voice = v.clone();
        }
        if let Some(v) = &self.format {
            speech.format = v.clone();
        }
        if let Some(v) = self.timeout_secs {
            speech.timeout_secs = v;
        }
        if let Some(v) = self.max_chars {
            speech.max_chars = v;
        }
    }
}

/// `[agent]` as the page sets it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSettings {
    pub backend: Option<String>,
    pub url: Option<String>,
    pub key: Option<Hidden>,
    pub model: Option<String>,
}

/// `[push]` as the page sets it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PushSettings {
    pub backend: Option<String>,
    pub ntfy_server: Option<String>,
    pub ntfy_token: Option<Hidden>,
    pub content: Option<String>,
    /// The FCM service-account key the Push page took as an upload: [`FCM_KEY_FILE`] when it
    /// is there. Not written to the file (where it would be a key older versions refuse, and
    /// a path that breaks when the data dir moves): [`Settings::load`] looks for the file.
    #[serde(skip)]
    pub fcm_credentials: Option<PathBuf>,
}

/// Appended to [`FILE_NAME`] for saved settings a start could not read: kept for the owner,
/// out of the way of the pages, which save afresh.
pub const SET_ASIDE: &str = ".unreadable";

/// Where the Push page keeps the FCM service-account key it took, inside the data dir (0600).
pub const FCM_KEY_FILE: &str = "fcm-service-account.json";

/// A part of the gateway the saved settings configure, each switched off on its own when its
/// saved settings cannot work (no saved setting may stop the gateway from starting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Part {
    /// `settings.toml` itself: unreadable, so none of it is used.
    File,
    Agent,
    Push,
    Transcription,
    Speech,
}

impl Part {
    /// What the owner reads in a cause.
    pub fn label(self) -> &'static str {
        match self {
            Part::File => "the saved settings",
            Part::Agent => "the agent",
            Part::Push => "push",
            Part::Transcription => "transcription",
            Part::Speech => "speech",
        }
    }

    /// The admin page where it is fixed.
    pub fn page(self) -> &'static str {
        match self {
            Part::File | Part::Agent | Part::Transcription | Part::Speech => "/admin/agent",
            Part::Push => "/admin/push",
        }
    }
}

/// A part that starts switched off, and why, in words for the status and the admin page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchedOff {
    pub part: Part,
    pub why: String,
}

impl SwitchedOff {
    /// The cause of `degraded` this is.
    pub fn cause(&self) -> String {
        match self.part {
            Part::File => format!(
                "the saved settings cannot be read, so none are used (they were set aside as \
                 {FILE_NAME}{SET_ASIDE}: save each page again): {}",
                self.why
            ),
            _ => format!("{} is off: {}", self.part.label(), self.why),
        }
    }
}

/// The saved settings laid over `config` part by part: a part whose saved values `check`
/// refuses starts switched off (push: none, transcription: no service; the agent is left to
/// the server, which runs one that says why) and is reported, so the other parts still get
/// theirs. `check` applies what outranks the saved settings (flags) and validates; `config`
/// alone must already pass it (what the config file gets wrong stays the file's refusal).
pub fn apply_usable(
    saved: &Settings,
    config: &mut Config,
    check: impl Fn(&Config) -> Result<(), ConfigError>,
) -> Vec<SwitchedOff> {
    let mut kept = Settings {
        backup: saved.backup.clone(),
        log: saved.log.clone(),
        update: saved.update.clone(),
        ..Settings::default()
    };
    let mut refused = Vec::new();
    for part in [Part::Agent, Part::Push, Part::Transcription, Part::Speech] {
        let mut candidate = kept.clone();
        candidate.take_part(saved, part);
        let mut trial = config.clone();
        candidate.apply(&mut trial);
        match check(&trial) {
            Ok(()) => kept = candidate,
            Err(e) => refused.push(SwitchedOff {
                part,
                why: format!("its saved settings cannot work ({e})"),
            }),
        }
    }
    kept.apply(config);
    for off in &refused {
        match off.part {
            Part::Push => config.push.backend = "none".into(),
            Part::Transcription => config.transcription.url = String::new(),
            Part::Speech => config.speech.url = String::new(),
            Part::File | Part::Agent => {}
        }
    }
    refused
}

/// Where the file is for a data dir.
pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

impl Settings {
    /// Reads the saved settings; none saved yet is the empty set.
    pub fn load(data_dir: &Path) -> Result<Settings, ConfigError> {
        let mut saved = Settings::read(data_dir)?;
        let key = data_dir.join(FCM_KEY_FILE);
        if key.is_file() {
            saved.push.fcm_credentials = Some(key);
        }
        Ok(saved)
    }

    /// The file as written.
    fn read(data_dir: &Path) -> Result<Settings, ConfigError> {
        let path = path(data_dir);
        let bad = |why: String| ConfigError::Settings {
            path: path.clone(),
            why,
        };
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Settings::default()),
            Err(e) => return Err(bad(e.to_string())),
        };
        let mut text = String::new();
        use std::io::Read;
        file.take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| bad(e.to_string()))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(bad(format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        // The message and the line only: toml's own text quotes the line, which may be a key.
        toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            bad(match line {
                Some(line) => format!("line {line}: {}", e.message()),
                None => e.message().to_owned(),
            })
        })
    }

    /// Writes the settings atomically, mode 0600.
    pub fn save(&self, data_dir: &Path) -> std::io::Result<()> {
        let text = toml::to_string(self).map_err(std::io::Error::other)?;
        let mut bytes = b"# Saved by the iris-gateway admin page; flags override it, it overrides the config file.\n".to_vec();
        bytes.extend_from_slice(text.as_bytes());
        crate::atomic_file::write(&path(data_dir), &bytes, 0o600)
    }

    /// Copies one part's saved values from `from`.
    fn take_part(&mut self, from: &Settings, part: Part) {
        match part {
            Part::File => {}
            Part::Agent => self.agent = from.agent.clone(),
            Part::Push => self.push = from.push.clone(),
            Part::Transcription => self.transcription = from.transcription.clone(),
            Part::Speech => self.speech = from.speech.clone(),
        }
    }

    /// Lays the saved values over `config` (flags are applied after this, so they win).
    pub fn apply(&self, config: &mut Config) {
        let (a, p) = (&self.agent, &self.push);
        if let Some(v) = &a.backend {
            config.agent.backend = v.clone();
        }
        if let Some(v) = &a.url {
            config.agent.url = v.clone();
        }
        if let Some(v) = &a.key {
            config.agent.key = Secret(v.0.clone());
            config.agent.key_file = None;
        }
        if let Some(v) = &a.model {
            config.agent.model = v.clone();
        }
        if let Some(v) = &p.backend {
            config.push.backend = v.clone();
        }
        if let Some(v) = &p.ntfy_server {
            config.push.ntfy_server = v.clone();
        }
        if let Some(v) = &p.ntfy_token {
            // Empty: saved when the page moved push to a new server without a token, so no
            // credentials at all, not even the config file's user and password, which were
            // given for the old server.
            config.push.ntfy_token = (!v.0.is_empty()).then(|| v.0.clone());
            config.push.ntfy_token_file = None;
            if v.0.is_empty() {
                config.push.ntfy_user = None;
                config.push.ntfy_password = None;
            }
        }
        if let Some(v) = &p.content {
            config.push.content = v.clone();
        }
        if let Some(v) = &p.fcm_credentials {
            config.push.fcm_credentials = Some(v.clone());
        }
        let t = &self.transcription;
        if let Some(v) = &t.url {
            config.transcription.url = v.clone();
        }
        if let Some(v) = &t.key {
            // Empty: none (the page moved the service to a new address without a new key).
            config.transcription.key = Secret(v.0.clone());
            config.transcription.key_file = None;
        }
        if let Some(v) = &t.model {
            config.transcription.model = v.clone();
        }
        if let Some(v) = &t.language {
            config.transcription.language = v.clone();
        }
        if let Some(v) = t.timeout_secs {
            config.transcription.timeout_secs = v;
        }
        self.speech.apply(&mut config.speech);
        if let Some(v) = &self.update.url {
            config.update.url = v.clone();
        }
        if let Some(v) = self.update.automatic {
            config.update.automatic = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_settings_round_trip_privately_and_sit_between_file_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Settings::load(dir.path()).unwrap(), Settings::default());
        let saved = Settings {
            agent: AgentSettings {
                backend: Some("openai".into()),
                url: Some("http://127.0.0.1:1/v1".into()),
                key: Some(Hidden("sk-secret".into())),
                model: None,
            },
            push: PushSettings::default(),
            transcription: TranscriptionSettings {
                url: Some("http://127.0.0.1:2/v1".into()),
                key: Some(Hidden("stt-secret".into())),
                ..TranscriptionSettings::default()
            },
            ..Settings::default()
        };
        saved.save(dir.path()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!format!("{saved:?}").contains("sk-secret"));
        assert!(!format!("{saved:?}").contains("stt-secret"));
        let loaded = Settings::load(dir.path()).unwrap();
        assert_eq!(loaded, saved);

        let mut config: Config = toml::from_str("[agent]\nmodel = \"m\"\n").unwrap();
        loaded.apply(&mut config);
        assert_eq!(config.agent.backend, "openai");
        assert_eq!(config.agent.model, "m");
        assert_eq!(config.transcription.key.expose(), "stt-secret");
    }

    #[test]
    fn an_empty_saved_token_means_no_credentials_at_all() {
        let mut config: Config = toml::from_str(
            "[push]\nntfy_server = \"http://old\"\nntfy_token_file = \"/t\"\n\
             ntfy_user = \"u\"\nntfy_password = \"p\"\n",
        )
        .unwrap();
        let saved = Settings {
            push: PushSettings {
                ntfy_server: Some("http://new".into()),
                ntfy_token: Some(Hidden(String::new())),
                ..PushSettings::default()
            },
            ..Settings::default()
        };
        saved.apply(&mut config);
        let p = &config.push;
        assert_eq!(p.ntfy_server, "http://new");
        assert!(p.ntfy_token.is_none() && p.ntfy_token_file.is_none());
        assert!(p.ntfy_user.is_none() && p.ntfy_password.is_none());
    }

    #[test]
    fn a_part_whose_saved_settings_cannot_work_is_switched_off_alone() {
        let saved: Settings = toml::from_str(
            "[agent]\nmodel = \"kept\"\n[push]\nbackend = \"fcm\"\ncontent = \"title\"\n\
             [transcription]\nurl = \"ftp://x\"\n[speech]\nurl = \"http://s\"\ntimeout_secs = 999\n\
             [update]\nurl = \"https://u\"\n",
        )
        .unwrap();
        let mut config: Config = toml::from_str(
            "[push]\nbackend = \"ntfy\"\n[transcription]\nurl = \"http://t\"\n[speech]\nurl = \"http://s0\"\n",
        )
        .unwrap();
        let off = apply_usable(&saved, &mut config, Config::validate);
        let parts: Vec<Part> = off.iter().map(|o| o.part).collect();
        assert_eq!(parts, [Part::Push, Part::Transcription, Part::Speech]);
        assert!(off[2].why.contains("speech.timeout_secs"), "{:?}", off[2]);
        assert!(
            !config.speech.is_on(),
            "speech is off, not the file's service"
        );
        assert!(off[0].why.contains("push.fcm_credentials"), "{:?}", off[0]);
        assert!(off[1].cause().starts_with("transcription is off: "));
        // Off, not the file's: the owner chose another service than the file's.
        assert_eq!(config.push.backend, "none");
        assert_eq!(
            config.push.content, "preview",
            "none of push's saved values"
        );
        assert!(!config.transcription.is_on());
        assert_eq!(config.agent.model, "kept");
        assert_eq!(config.update.url, "https://u");
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_broken_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), "[agent]\nbogus = 1\n").unwrap();
        let e = Settings::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("settings.toml") && e.contains("bogus"), "{e}");
    }
}
