//! `[agent]`: which backend answers messages and how to reach it, and the choices the user
//! makes at run time (`/model`, `/reasoning`, `/fast`) on top of it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret};

/// The agent backend. `demo` needs nothing; `hermes` and `openai` are reached over HTTP with
/// blocking `ureq` calls on worker threads (one per running turn), so the event loop never waits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// `demo`, `hermes` (a Hermes Agent's API server) or `openai` (any `/v1/chat/completions`).
    pub backend: String,
    /// Base URL. Empty means the backend's usual local address: `http://127.0.0.1:8642` for
    /// Hermes, `http://127.0.0.1:8080/v1` (llama.cpp's server) for `openai`.
    pub url: String,
    /// Bearer key (Hermes' `API_SERVER_KEY`). Prefer `key_file`: a config file is often shared.
    pub key: Secret,
    /// A file whose first line is the key.
    pub key_file: Option<PathBuf>,
    /// Model to ask for. Empty: Hermes uses its own default; `openai` asks the server's
    /// `/v1/models` and takes the first. `/model` changes it at run time.
    pub model: String,
    /// `openai` only: the system prompt sent first in every request.
    pub system_prompt: String,
    /// `openai` only: how many earlier messages of the conversation are sent with a new one.
    pub history_messages: usize,
    /// Seconds to wait for a TCP connection to the agent.
    pub connect_timeout_secs: u64,
    /// Seconds a turn's stream may stay silent (Hermes sends a keep-alive every 30 s) before
    /// the turn is failed as stopped mid-answer.
    pub idle_timeout_secs: u64,
    /// Longest a single turn may run, in seconds; then it is stopped and failed.
    pub turn_timeout_secs: u64,
    /// Seconds a message waits for an unreachable agent (status `degraded`) before it is
    /// answered with a failure. It was never handed to the agent, so waiting is safe.
    pub unreachable_wait_secs: u64,
    /// Seconds between health checks of the agent while it is reachable; while it is not, it
    /// is checked every second or two.
    pub probe_interval_secs: u64,
    /// Folders a `MEDIA:<path>` in the agent's answer may be read from (docs/media.md). Unset:
    /// Hermes' output and cache folders under `hermes_home` when the agent's URL is on this
    /// machine, none when it is not (its paths name files there). `[]`: no `MEDIA:` file is
    /// read; inline images still are.
    pub media_dirs: Option<Vec<PathBuf>>,
    /// Hermes' `HERMES_HOME`, for the default `media_dirs` and the credential files there that
    /// are never read. Unset: `$HERMES_HOME`, else `~/.hermes` of the user the gateway runs as.
    pub hermes_home: Option<PathBuf>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            backend: "demo".into(),
            url: String::new(),
            key: Secret::default(),
            key_file: None,
            model: String::new(),
            system_prompt: "You are a helpful assistant, answering in a chat app.".into(),
            history_messages: 40,
            connect_timeout_secs: 5,
            idle_timeout_secs: 90,
            turn_timeout_secs: 900,
            unreachable_wait_secs: 300,
            probe_interval_secs: 30,
            media_dirs: None,
            hermes_home: None,
        }
    }
}

impl AgentConfig {
    /// The base URL in use: the configured one or the backend's default, without a trailing `/`.
    pub fn base_url(&self) -> String {
        let url = match (self.url.trim(), self.backend.as_str()) {
            ("", "hermes") => "http://127.0.0.1:8642",
            ("", "openai") => "http://127.0.0.1:8080/v1",
            (url, _) => url,
        };
        url.trim_end_matches('/').to_owned()
    }

    /// The key: `key_file` if set (first line), else `key`.
    pub fn resolve_key(&self) -> Result<Secret, ConfigError> {
        super::key_of(&self.key, self.key_file.as_deref())
    }
}

/// Choices the user makes with slash commands; they apply to every lane and survive restarts.
/// They refine `AgentConfig` the way a saved setting refines the file, which is why they live
/// with the config (the store keeps them, the agent applies them, neither owns them).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AgentSettings {
    /// Reasoning effort: `none`, `low`, `medium`, `high`; `None` leaves the agent's default.
    pub reasoning: Option<String>,
    /// Ask for the provider's fast (priority) tier.
    pub fast: bool,
    /// Model override; `None` uses the configured or default model. A lane's own choice
    /// (`/model` in that lane) replaces it for the lane's turns.
    pub model: Option<String>,
    /// The provider that serves `model`, where the agent lists models per provider (Hermes'
    /// model options); `None` leaves it to the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}
