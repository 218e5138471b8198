//! Configuration: the TOML file, its defaults, and every input limit in one place.
//!
//! Precedence is flags > settings saved from the admin page (`DATA_DIR/settings.toml`, see
//! `settings.rs`) > config file > embedded defaults, so `iris-gateway run` with nothing else
//! works out of the box, a systemd unit can pin everything in `/etc`, and the owner's page can
//! change what the file says without write access to `/etc`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, Serializer};

pub mod agent;
pub mod board;
pub mod discovery;
pub mod power;
pub mod push;
pub mod speech;
pub mod transcription;
pub mod update;
mod validate;

pub use agent::{AgentConfig, AgentSettings};
pub use board::LedConfig;
pub use discovery::DiscoveryConfig;
pub use power::PowerConfig;
pub use push::PushConfig;
pub use speech::SpeechConfig;
pub use transcription::TranscriptionConfig;
pub use update::UpdateConfig;

/// The port the app expects a gateway on when the user types only a host name.
pub const DEFAULT_PORT: u16 = 8765;

/// Why the configuration cannot be used; the gateway refuses to start with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("invalid setting `{key}`: {why}")]
    Invalid { key: &'static str, why: String },
    #[error("the settings saved from the admin page ({path}) are not usable: {why}")]
    Settings { path: PathBuf, why: String },
    /// A part cannot start with these settings (a key file it cannot read, a push key that is
    /// not one): found at start, past what `validate` can see.
    #[error("{part} is misconfigured: {why}")]
    Misconfigured { part: &'static str, why: String },
}

/// A service's key: the first line of `key_file` when one is set, else `key` (agent and
/// transcription keys alike).
pub(crate) fn key_of(key: &Secret, key_file: Option<&Path>) -> Result<Secret, ConfigError> {
    match key_file {
        Some(path) => std::fs::read_to_string(path)
            .map(|text| Secret(text.lines().next().unwrap_or("").trim().to_owned()))
            .map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            }),
        None => Ok(key.clone()),
    }
}

/// A service's base URL as typed, without spaces or a trailing `/` (empty: the service is off).
pub(crate) fn base_url_of(url: &str) -> String {
    url.trim().trim_end_matches('/').to_owned()
}

/// The whole configuration after defaults, file and flags are merged.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the WebSocket listens; `0.0.0.0` makes the gateway reachable on the LAN.
    pub listen: SocketAddr,
    /// The store, control socket and the local chat client's credentials live here.
    pub data_dir: Option<PathBuf>,
    /// `[agent]`: which backend answers messages, and how to reach it.
    pub agent: AgentConfig,
    /// `error`, `warn`, `info`, `debug` or `trace`; `RUST_LOG` overrides it.
    pub log_level: String,
    pub demo: DemoConfig,
    pub store: StoreConfig,
    pub limits: Limits,
    /// `[tls]`: `wss://` on the listen port, beside or instead of plain `ws://`.
    pub tls: TlsConfig,
    pub push: PushConfig,
    /// `[led]`: the status LED (see board/README.md).
    pub led: LedConfig,
    /// `[discovery]`: advertising the gateway on the LAN with mDNS/DNS-SD (src/discovery.rs).
    pub discovery: DiscoveryConfig,
    /// `[[cron]]`: prompts the agent answers on a schedule, posted into automation channels.
    pub cron: Vec<CronJob>,
    /// `[[webhook]]`: HTTP endpoints that post into automation channels.
    pub webhook: Vec<WebhookConfig>,
    /// `[transcription]`: the speech-to-text service voice notes go to before the agent.
    pub transcription: TranscriptionConfig,
    /// `[speech]`: the text-to-speech service answers are spoken by in lanes that ask for voice.
    pub speech: SpeechConfig,
    /// `[power]`: how the admin page reboots and shuts down the box.
    pub power: PowerConfig,
    /// `[update]`: signed updates, their health window and the helper that installs them.
    pub update: UpdateConfig,
}

/// The config keys command-line flags set (`agent.url`, …), beside the `Config` they shaped: a
/// setting saved from the admin page is below flags, so the page must know which of its values
/// cannot take effect, and `config --effective` says where each value came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pinned(pub Vec<&'static str>);

impl Pinned {
    pub fn contains(&self, key: &str) -> bool {
        self.0.contains(&key)
    }

    pub fn push(&mut self, key: &'static str) {
        self.0.push(key);
    }

    pub fn iter(&self) -> impl Iterator<Item = &&'static str> {
        self.0.iter()
    }
}

/// A secret read from the config (an API key, a webhook token). Its `Debug` never shows it,
/// so a logged config cannot leak it.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What a listing of the configuration shows for a secret: whether one is set, never the secret
/// (`config --effective` prints the serialized config).
fn redacted<S: Serializer>(set: bool, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(if set { "(set)" } else { "(not set)" })
}

/// For an optional secret field: `#[serde(serialize_with = "redact_option")]`.
pub(crate) fn redact_option<S: Serializer>(
    secret: &Option<String>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    redacted(secret.is_some(), serializer)
}

/// A secret serializes as whether it is set: nothing that serializes a config can leak it.
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        redacted(!self.0.is_empty(), serializer)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "\"<redacted>\""
        })
    }
}

/// A scheduled prompt: at each `schedule` instant the agent answers `prompt` and the answer is
/// posted (role `cron`) into the automation channel named `channel`, created if missing.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CronJob {
    /// Channel name (created as an automation channel if no channel has this name).
    pub channel: String,
    /// Cron expression with seconds, local time: `sec min hour day-of-month month day-of-week`,
    /// e.g. `0 30 7 * * *` for 07:30 every day.
    pub schedule: String,
    pub prompt: String,
}

/// An HTTP endpoint, `POST /hooks/<name>` with `Authorization: Bearer <token>`, whose body is
/// posted into the automation channel named `channel` (created if missing).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// The URL path segment: letters, digits, `-` and `_`.
    pub name: String,
    pub channel: String,
    /// At least 16 characters. Prefer `token_file`.
    #[serde(default)]
    pub token: Secret,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

/// `[demo]`: the built-in agent that needs nothing (first start, tests).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemoConfig {
    /// Milliseconds between streamed steps of a demo turn; 0 streams as fast as possible.
    pub pace_ms: u64,
}

/// `[store]`: the store's memory and replay window.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// sled's page cache. sled defaults to 1 GiB, far beyond a Pi's budget; a small cache costs
    /// a little read latency on cold history pages and nothing on the write path.
    pub cache_bytes: u64,
    /// How many outbox frames `sync` can replay; older frames are pruned (history keeps them).
    pub outbox_retain_frames: u64,
}

/// TLS on the listen port (docs/security.md). TLS and plain connections share the port: the
/// first byte of a connection tells them apart.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Serve `wss://` (TLS) on the listen port.
    pub enabled: bool,
    /// Also serve plain `ws://` (unencrypted) on the same port; `false` refuses it with 426.
    pub allow_plain: bool,
    /// PEM certificate chain (leaf first) to serve instead of the self-signed one the gateway
    /// makes in `DATA_DIR/tls`. Needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            enabled: true,
            allow_plain: true,
            cert_file: None,
            key_file: None,
        }
    }
}

/// Every input limit, with its default. Documented in docs/limits.md; the names are the config
/// keys under `[limits]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest JSON text frame read from a socket. Larger frames are not buffered: the socket
    /// gets an `error` and a policy close (1009).
    pub max_frame_bytes: usize,
    /// Largest frame the gateway writes to a socket: what an app can be expected to take. Every
    /// outgoing frame is built to fit (directory, history pages, agent text by encoded size)
    /// and the writer cuts anything that still does not (docs/limits.md, "Outgoing frames").
    pub max_out_frame_bytes: usize,
    /// Longest `message.send` text (UTF-8 bytes).
    pub max_text_bytes: usize,
    /// Longest channel or device name (characters).
    pub max_name_chars: usize,
    /// Largest decoded `channel.icon` image.
    pub max_icon_bytes: usize,
    /// Turns waiting behind a running turn in one lane before `rate_limited`.
    pub lane_queue_depth: usize,
    /// Turns running at once across all lanes; more wait their turn.
    pub max_running_turns: usize,
    /// Sustained frames per second one connection may send...
    pub frames_per_second: u32,
    /// ...and the burst above that rate it may use.
    pub frame_burst: u32,
    /// Sustained bytes per second (text and binary frames) one connection may send...
    pub bytes_per_second: u64,
    /// ...and the burst above that rate it may use.
    pub byte_burst: u64,
    /// Failed hellos from one IP address per minute before `rate_limited`.
    pub bad_hellos_per_minute: u32,
    /// Open sockets (counted from accept, before hello); more are closed at once.
    pub max_connections: usize,
    /// Open sockets from one IP address (IPv6: one /64); more from it are closed at once.
    pub max_connections_per_ip: usize,
    /// Seconds a new socket has to send a good `hello`.
    pub hello_timeout_secs: u64,
    /// `history` page size when the request does not say...
    pub history_default: usize,
    /// ...and the most one page returns.
    pub history_max: usize,
    /// Channels (including threads) in the directory.
    pub max_channels: usize,
    /// `search` hits when the request does not say...
    pub search_default: usize,
    /// ...and the most one answer returns.
    pub search_max: usize,
    /// Longest search query (characters).
    pub max_query_chars: usize,
    /// Milliseconds of the query worker's time one device may use per second, on average
    /// (searches and history pages, charged what each took)...
    pub query_ms_per_second: u32,
    /// ...and the burst above that rate it may use.
    pub query_burst_ms: u32,
    /// Message ids one `message.delete` may name.
    pub max_delete_ids: usize,
    /// Largest single media file (upload or agent-produced).
    pub max_media_bytes: u64,
    /// Total bytes of stored media.
    pub media_quota_bytes: u64,
    /// Attachments one message may carry.
    pub max_media_per_message: usize,
    /// Seconds an upload may go without a binary frame before it is abandoned.
    pub media_idle_timeout_secs: u64,
    /// Longest side, in pixels, of an image sent to the agent: a larger photo is scaled down
    /// (the original stays in media storage). Models look at about this much anyway
    /// (Anthropic's guidance is 1568), and pixels beyond it cost tokens and upload time.
    pub agent_image_side: u32,
    /// Largest image sent to the agent, after re-encoding (JPEG at falling quality, then
    /// smaller sides, until it fits).
    pub agent_image_bytes: usize,
    /// Largest text document inlined into the agent's message; a larger one reaches the agent
    /// as an attachment line saying so.
    pub agent_document_bytes: usize,
    /// Largest webhook request body.
    pub max_webhook_bytes: usize,
    /// Webhook requests per minute, over all webhooks; more get 429.
    pub webhooks_per_minute: u32,
    /// Seconds a pairing-page code (printed at start, or by `pair --page`) stays valid; it
    /// also dies at its first use.
    pub pair_code_ttl_secs: u64,
    /// Wrong pairing-page codes from one IP address per minute before HTTP 429.
    pub pair_code_failures_per_minute: u32,
    /// Wrong owner passphrases on the admin page from one IP address per minute before
    /// HTTP 429 (a success does not reset the count; rotating addresses shares one count).
    pub admin_signin_failures_per_minute: u32,
    /// Minutes an admin session lasts without a request before it must sign in again.
    pub admin_session_idle_secs: u64,
    /// The longest an admin session lasts, however busy.
    pub admin_session_max_secs: u64,
    /// Admin sessions kept at once; signing in past it ends the least recently used one.
    pub admin_max_sessions: usize,
    /// Largest admin form body (a backup upload is bounded by the media limits instead).
    pub admin_max_form_bytes: usize,
    /// Seconds between two refreshes of the health on the admin page's home (while it is open).
    pub admin_health_refresh_secs: u64,
    /// Free space on the data disk, in percent of its size, under which the admin page lists
    /// "the disk is almost full".
    pub admin_disk_low_percent: u8,
    /// Seconds the admin page waits for `[power]`'s reboot or shut-down command to return.
    pub admin_power_command_secs: u64,
    /// Passphrase strength checks (`/admin/strength`, the set-up and change forms' meter) per
    /// minute, over all browsers; past it the meter waits and the form's own check still runs.
    pub admin_strength_checks_per_minute: u32,
    /// Milliseconds between two `message.update` (or `tool.progress`) frames of one message:
    /// each carries the latest state, so a fast stream costs a device what the text costs, not
    /// one frame per token (docs/backpressure.md, "Pacing"). 0 sends one per token.
    pub stream_update_ms: u64,
    /// Largest voice note or audio file sent to the transcription service (OpenAI's own
    /// limit); a larger one reaches the agent as an attachment line, with a note in the lane.
    pub transcription_bytes: u64,
    /// Largest file taken from the agent's answer (a `MEDIA:` path or an inline data image);
    /// never more than `max_media_bytes`. A larger one is left out with a note in the text.
    pub agent_file_bytes: u64,
    /// Seconds in a "day" of the scheduled backups (a weekly one waits seven of them). Only
    /// tests shorten it, to see the schedule fire.
    pub backup_day_secs: u64,
    /// Seconds between two looks at whether a scheduled backup is due.
    pub backup_check_secs: u64,
    /// Seconds before a scheduled backup that failed is tried again (a USB stick not plugged
    /// in is not retried every minute, nor its warning logged every minute).
    pub backup_retry_secs: u64,
    /// Most scheduled backups kept in the folder (the owner's "keep N" is at most this).
    pub backup_keep_max: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
            data_dir: None,
            agent: AgentConfig::default(),
            log_level: "info".into(),
            demo: DemoConfig::default(),
            store: StoreConfig::default(),
            limits: Limits::default(),
            tls: TlsConfig::default(),
            push: PushConfig::default(),
            led: LedConfig::default(),
            discovery: DiscoveryConfig::default(),
            cron: Vec::new(),
            webhook: Vec::new(),
            transcription: TranscriptionConfig::default(),
            speech: SpeechConfig::default(),
            power: PowerConfig::default(),
            update: UpdateConfig::default(),
        }
    }
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig { pace_ms: 60 }
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            cache_bytes: 1 << 20,
            outbox_retain_frames: 20_000,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 1 << 20,
            max_out_frame_bytes: 1 << 20,
            max_text_bytes: 256 << 10,
            max_name_chars: 100,
            max_icon_bytes: 512 << 10,
            lane_queue_depth: 8,
            max_running_turns: 4,
            frames_per_second: 20,
            frame_burst: 60,
            bytes_per_second: 8 << 20,
            byte_burst: 16 << 20,
            bad_hellos_per_minute: 5,
            max_connections: 64,
            max_connections_per_ip: 16,
            hello_timeout_secs: 10,
            history_default: 50,
            history_max: 200,
            max_channels: 500,
            search_default: 20,
            search_max: 100,
            max_query_chars: 256,
            query_ms_per_second: 250,
            query_burst_ms: 2000,
            max_delete_ids: 100,
            max_media_bytes: 128 << 20,
            media_quota_bytes: 2 << 30,
            max_media_per_message: 10,
            media_idle_timeout_secs: 60,
            agent_image_side: 1568,
            agent_image_bytes: 1 << 20,
            agent_document_bytes: 64 << 10,
            max_webhook_bytes: 64 << 10,
            webhooks_per_minute: 60,
            pair_code_ttl_secs: 600,
            pair_code_failures_per_minute: 5,
            admin_signin_failures_per_minute: 5,
            admin_session_idle_secs: 30 * 60,
            admin_session_max_secs: 12 * 3600,
            admin_max_sessions: 8,
            admin_max_form_bytes: 16 << 10,
            admin_health_refresh_secs: 5,
            admin_disk_low_percent: 10,
            admin_power_command_secs: 15,
            admin_strength_checks_per_minute: 120,
            stream_update_ms: 200,
            transcription_bytes: 25 << 20,
            agent_file_bytes: 32 << 20,
            backup_day_secs: 86_400,
            backup_check_secs: 60,
            backup_retry_secs: 3600,
            backup_keep_max: 100,
        }
    }
}

impl Config {
    /// Reads a TOML file; unknown keys are errors so a typo never silently keeps a default.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

/// Where state lives when neither flag nor file says: systemd's `StateDirectory` when run as a
/// service, else the user's XDG data dir, so `run` and `pair` agree without being told.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("STATE_DIRECTORY") {
        // systemd may pass several colon-separated directories; the first is ours.
        let first = dir
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_owned();
        if !first.is_empty() {
            return PathBuf::from(first);
        }
    }
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("iris-gateway");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home).join(".local/share/iris-gateway");
    }
    PathBuf::from("iris-data")
}
