//! The configuration a command line asks for: defaults, then the file, then the settings saved
//! from the admin page (in the data dir), then flags.

use std::path::PathBuf;

use super::args::RunArgs;
use crate::config::{default_data_dir, Config, ConfigError, Pinned, Secret};
use crate::settings::{Part, Settings, SwitchedOff};

impl RunArgs {
    /// Defaults, then the file, then the settings saved from the admin page (in the data dir),
    /// then flags.
    pub fn resolve(&self) -> Result<(Config, PathBuf), ConfigError> {
        self.resolve_pinned().map(|(config, dir, _)| (config, dir))
    }

    /// As [`RunArgs::resolve`], with the keys the flags set.
    pub fn resolve_pinned(&self) -> Result<(Config, PathBuf, Pinned), ConfigError> {
        self.resolve_checked(Config::validate)
            .map(|(config, dir, pinned, _)| (config, dir, pinned))
    }

    /// As [`RunArgs::resolve_pinned`], for `run`: also what the start itself would refuse
    /// ([`can_start`]), and the parts whose saved settings cannot work, which start switched
    /// off instead of stopping the start (the config file and the flags still refuse to start
    /// when they are wrong: whoever wrote them is at the box).
    pub fn resolve_for_run(
        &self,
    ) -> Result<(Config, PathBuf, Pinned, Vec<SwitchedOff>), ConfigError> {
        self.resolve_checked(|config| {
            config.validate()?;
            can_start(config)
        })
    }

    fn resolve_checked(
        &self,
        check: impl Fn(&Config) -> Result<(), ConfigError>,
    ) -> Result<(Config, PathBuf, Pinned, Vec<SwitchedOff>), ConfigError> {
        let mut config = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        let dir = self
            .data_dir
            .clone()
            .or_else(|| config.data_dir.clone())
            .unwrap_or_else(default_data_dir);
        let with_flags = |config: &Config| {
            let mut config = config.clone();
            self.apply_flags(&mut config);
            check(&config)
        };
        with_flags(&config)?;
        let (saved, mut off) = match Settings::load(&dir) {
            Ok(saved) => (saved, Vec::new()),
            Err(e) => (
                Settings::default(),
                vec![SwitchedOff {
                    part: Part::File,
                    why: e.to_string(),
                }],
            ),
        };
        off.extend(crate::settings::apply_usable(
            &saved,
            &mut config,
            with_flags,
        ));
        let pinned = self.pinned();
        self.apply_flags(&mut config);
        check(&config)?;
        let dir = config.data_dir.clone().unwrap_or_else(default_data_dir);
        Ok((config, dir, pinned, off))
    }

    fn apply_flags(&self, config: &mut Config) {
        self.apply_agent_flags(config);
        self.apply_limit_flags(config);
        self.apply_push_flags(config);
    }

    /// The config keys these flags set: the admin page cannot override them.
    fn pinned(&self) -> Pinned {
        let mut pinned = Pinned::default();
        let flags: [(&'static str, bool); 17] = [
            ("data_dir", self.data_dir.is_some()),
            ("listen", self.listen.is_some()),
            ("agent.backend", self.agent.is_some()),
            ("agent.url", self.agent_url.is_some()),
            (
                "agent.key",
                self.agent_key.is_some() || self.agent_key_file.is_some(),
            ),
            ("agent.model", self.agent_model.is_some()),
            ("log_level", self.log_level.is_some()),
            ("push.backend", self.push.is_some()),
            ("push.ntfy_server", self.ntfy_server.is_some()),
            (
                "push.ntfy_token",
                self.ntfy_token.is_some() || self.ntfy_token_file.is_some(),
            ),
            ("push.fcm_credentials", self.fcm_credentials.is_some()),
            ("discovery.enabled", self.no_discovery),
            ("demo.pace_ms", self.demo_pace_ms.is_some()),
            ("limits.max_frame_bytes", self.max_frame_bytes.is_some()),
            (
                "limits.max_out_frame_bytes",
                self.max_out_frame_bytes.is_some(),
            ),
            ("limits.max_text_bytes", self.max_text_bytes.is_some()),
            (
                "store.outbox_retain_frames",
                self.outbox_retain_frames.is_some(),
            ),
        ];
        for (key, set) in flags {
            if set {
                pinned.push(key);
            }
        }
        pinned
    }

    /// Where the gateway runs and what answers: data dir, listen address, log level, agent.
    fn apply_agent_flags(&self, config: &mut Config) {
        if let Some(v) = &self.data_dir {
            config.data_dir = Some(v.clone());
        }
        if let Some(v) = self.listen {
            config.listen = v;
        }
        if let Some(v) = &self.agent {
            config.agent.backend = v.clone();
        }
        if let Some(v) = &self.agent_url {
            config.agent.url = v.clone();
        }
        if let Some(v) = &self.agent_key {
            config.agent.key = Secret(v.clone());
            config.agent.key_file = None;
        }
        if let Some(v) = &self.agent_key_file {
            config.agent.key_file = Some(v.clone());
        }
        if let Some(v) = &self.agent_model {
            config.agent.model = v.clone();
        }
        if let Some(v) = self.demo_pace_ms {
            config.demo.pace_ms = v;
        }
        if let Some(v) = &self.log_level {
            config.log_level = v.clone();
        }
    }

    /// The limits tests and small boxes most often change.
    fn apply_limit_flags(&self, config: &mut Config) {
        if let Some(v) = self.max_frame_bytes {
            config.limits.max_frame_bytes = v;
        }
        if let Some(v) = self.max_out_frame_bytes {
            config.limits.max_out_frame_bytes = v;
        }
        if let Some(v) = self.max_text_bytes {
            config.limits.max_text_bytes = v;
        }
        if let Some(v) = self.outbox_retain_frames {
            config.store.outbox_retain_frames = v;
        }
    }

    /// Push and discovery: how the gateway reaches devices that are away, and is found.
    fn apply_push_flags(&self, config: &mut Config) {
        if let Some(v) = &self.push {
            config.push.backend = v.clone();
        }
        if let Some(v) = &self.ntfy_server {
            config.push.ntfy_server = v.clone();
        }
        if let Some(v) = &self.ntfy_token {
            config.push.ntfy_token = Some(v.clone());
        }
        if let Some(v) = &self.ntfy_token_file {
            config.push.ntfy_token_file = Some(v.clone());
        }
        if let Some(v) = &self.fcm_credentials {
            config.push.fcm_credentials = Some(v.clone());
        }
        if self.no_discovery {
            config.discovery.enabled = false;
        }
    }
}

/// What a start finds out past `validate`: the key files the agent, transcription and speech read, and
/// push's (an FCM key that works). Run once per part at start, each a small file.
fn can_start(config: &Config) -> Result<(), ConfigError> {
    if matches!(config.agent.backend.as_str(), "hermes" | "openai") {
        config
            .agent
            .resolve_key()
            .map_err(|e| misconfigured("the agent", e))?;
    }
    if config.transcription.is_on() {
        config
            .transcription
            .resolve_key()
            .map_err(|e| misconfigured("transcription", e))?;
    }
    if config.speech.is_on() {
        config
            .speech
            .resolve_key()
            .map_err(|e| misconfigured("speech", e))?;
    }
    crate::push::check_config(&config.push).map_err(|e| misconfigured("push", e))
}

fn misconfigured(part: &'static str, e: impl std::fmt::Display) -> ConfigError {
    ConfigError::Misconfigured {
        part,
        why: e.to_string(),
    }
}
