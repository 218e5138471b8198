//! Refusing a configuration that would make the gateway unusable, at start rather than at the
//! first frame that hits it. One function per section, each a table of checks where it can be.

use std::collections::HashSet;

use super::{Config, ConfigError, CronJob, Limits, WebhookConfig};

/// One check: the key it is reported under, whether it holds, and why it must.
type Check = (&'static str, bool, &'static str);

impl Config {
    /// Refuses settings that would make the gateway unusable rather than failing later.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // In the order they were always reported in, when several fail.
        let checks = socket_checks(&self.limits)
            .into_iter()
            .chain([self.plain_check()])
            .chain(door_checks(&self.limits))
            .chain(agent_media_checks(&self.limits))
            .chain(self.service_checks())
            .chain(self.transcription_checks())
            .chain(self.speech_checks())
            .chain(self.push_checks());
        for (key, ok, why) in checks {
            if !ok {
                return Err(invalid(key, why));
            }
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err(invalid(
                "tls.cert_file",
                "cert_file and key_file go together (neither: a self-signed certificate)",
            ));
        }
        self.cron.iter().try_for_each(check_cron)?;
        check_webhooks(&self.webhook)
    }

    /// With TLS off, refusing plain connections would refuse every connection.
    fn plain_check(&self) -> Check {
        (
            "tls.allow_plain",
            self.tls.enabled || self.tls.allow_plain,
            "with TLS off, plain connections are all there is: allow_plain must stay true",
        )
    }

    /// The store and agent sections.
    fn service_checks(&self) -> [Check; 5] {
        [
            (
                "store.outbox_retain_frames",
                self.store.outbox_retain_frames >= 100,
                "must be at least 100",
            ),
            (
                "agent.backend",
                matches!(self.agent.backend.as_str(), "demo" | "hermes" | "openai"),
                "must be `demo`, `hermes` or `openai`",
            ),
            (
                "agent.turn_timeout_secs",
                self.agent.turn_timeout_secs >= 1
                    && self.agent.idle_timeout_secs >= 1
                    && self.agent.connect_timeout_secs >= 1,
                "timeouts must be at least 1 second",
            ),
            (
                "limits.agent_file_bytes",
                self.limits.agent_file_bytes >= 1,
                "must be at least 1",
            ),
            (
                "agent.media_dirs",
                self.agent
                    .media_dirs
                    .iter()
                    .flatten()
                    .all(|d| d.is_absolute()),
                "every folder must be an absolute path",
            ),
        ]
    }
}

impl Config {
    /// `[push]`: a backend and content the push worker knows, and a key for FCM. Whether the
    /// key file can be read and holds a usable key is the push worker's to say at start.
    fn push_checks(&self) -> [Check; 3] {
        let p = &self.push;
        [
            (
                "push.backend",
                matches!(p.backend.as_str(), "none" | "ntfy" | "fcm"),
                "must be `none`, `ntfy` or `fcm`",
            ),
            (
                "push.content",
                matches!(p.content.as_str(), "full" | "preview" | "title" | "none"),
                "must be `full`, `preview`, `title` or `none`",
            ),
            (
                "push.fcm_credentials",
                p.backend != "fcm" || p.fcm_credentials.is_some(),
                "the FCM backend needs a service-account key file (upload it on the admin \
                 page's Push page, or set fcm_credentials)",
            ),
        ]
    }

    /// `[transcription]` and its limit: a URL the client can call, a model to ask for.
    fn transcription_checks(&self) -> [Check; 4] {
        let t = &self.transcription;
        [
            (
                "transcription.url",
                off_or_http(&t.base_url()),
                "must be empty (off) or start with http:// or https://",
            ),
            (
                "transcription.model",
                !t.model.trim().is_empty(),
                "must name a model (whisper-1 for OpenAI)",
            ),
            (
                "transcription.timeout_secs",
                (1..=super::transcription::MAX_TIMEOUT_SECS).contains(&t.timeout_secs),
                "must be from 1 to 600",
            ),
            (
                "limits.transcription_bytes",
                self.limits.transcription_bytes >= 1024,
                "must be at least 1024",
            ),
        ]
    }
}

impl Config {
    /// `[speech]`: a URL the client can call, a model, voice and format to ask for, and the
    /// bounds of `timeout_secs` and `max_chars`.
    fn speech_checks(&self) -> [Check; 6] {
        use super::speech::{MAX_CHARS, MAX_TIMEOUT_SECS};
        let s = &self.speech;
        [
            (
                "speech.url",
                off_or_http(&s.base_url()),
                "must be empty (off) or start with http:// or https://",
            ),
            (
                "speech.model",
                !s.model.trim().is_empty(),
                "must name a model (tts-1 for OpenAI)",
            ),
            (
                "speech.voice",
                !s.voice.trim().is_empty(),
                "must name a voice (alloy for OpenAI)",
            ),
            (
                "speech.format",
                s.format_type().is_some(),
                "must be one of opus, mp3, aac, flac, wav",
            ),
            (
                "speech.timeout_secs",
                (1..=MAX_TIMEOUT_SECS).contains(&s.timeout_secs),
                "must be from 1 to 120",
            ),
            (
                "speech.max_chars",
                (1..=MAX_CHARS).contains(&s.max_chars),
                "must be from 1 to 4096",
            ),
        ]
    }
}

/// The error for a setting, with why it must be otherwise.
fn invalid(key: &'static str, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        why: why.into(),
    }
}

/// The limits a socket and its frames live under.
fn socket_checks(l: &Limits) -> [Check; 10] {
    [
        (
            "limits.max_frame_bytes",
            l.max_frame_bytes >= 4096,
            "must be at least 4096",
        ),
        // Below this the outgoing shares (text, reasoning, reserve) leave no room to talk.
        (
            "limits.max_out_frame_bytes",
            l.max_out_frame_bytes >= 64 << 10,
            "must be at least 65536",
        ),
        // A text limit above what a frame can carry is harmless: the frame limit bites first.
        (
            "limits.max_text_bytes",
            l.max_text_bytes >= 1,
            "must be at least 1",
        ),
        (
            "limits.history_max",
            l.history_max >= 1 && l.history_default <= l.history_max,
            "history_default must be between 1 and history_max",
        ),
        (
            "limits.max_running_turns",
            l.max_running_turns >= 1,
            "must be at least 1",
        ),
        (
            "limits.frames_per_second",
            l.frames_per_second >= 1 && l.frame_burst >= 1,
            "rate and burst must be at least 1",
        ),
        (
            "limits.query_ms_per_second",
            l.query_ms_per_second >= 1 && l.query_burst_ms >= 1,
            "rate and burst must be at least 1",
        ),
        (
            "limits.byte_burst",
            l.bytes_per_second >= 1 && l.byte_burst >= l.max_frame_bytes as u64,
            "bytes_per_second must be at least 1 and byte_burst at least max_frame_bytes",
        ),
        (
            "limits.max_connections_per_ip",
            l.max_connections_per_ip >= 1,
            "must be at least 1",
        ),
        // Beyond a few seconds a streamed answer no longer looks streamed.
        (
            "limits.stream_update_ms",
            l.stream_update_ms <= 5000,
            "must be at most 5000",
        ),
    ]
}

/// The limits of the browser doors: the pairing page and the admin page.
fn door_checks(l: &Limits) -> [Check; 3] {
    [
        (
            "limits.pair_code_ttl_secs",
            l.pair_code_ttl_secs >= 1 && l.pair_code_failures_per_minute >= 1,
            "pair_code_ttl_secs and pair_code_failures_per_minute must be at least 1",
        ),
        (
            "limits.admin_max_sessions",
            l.admin_max_sessions >= 1
                && l.admin_signin_failures_per_minute >= 1
                && l.admin_session_idle_secs >= 1
                && l.admin_session_max_secs >= l.admin_session_idle_secs
                && l.admin_max_form_bytes >= 1024
                && l.admin_health_refresh_secs >= 1
                && l.admin_disk_low_percent <= 100
                && l.admin_power_command_secs >= 1
                && l.admin_strength_checks_per_minute >= 1,
            "admin limits: sessions, sign-in failures, strength checks, idle seconds, health \
             refresh and power command seconds at least 1, admin_session_max_secs at least \
             admin_session_idle_secs, forms at least 1024 bytes, admin_disk_low_percent at most 100",
        ),
        (
            "limits.backup_day_secs",
            l.backup_day_secs >= 1
                && l.backup_check_secs >= 1
                && l.backup_retry_secs >= 1
                && l.backup_keep_max >= 1,
            "backup_day_secs, backup_check_secs, backup_retry_secs and backup_keep_max must be \
             at least 1",
        ),
    ]
}

/// The bounds on what the agent is sent of a message's files (src/agent/media_in/).
fn agent_media_checks(l: &Limits) -> [Check; 3] {
    [
        // Below this a photo says nothing; above it no model looks closer (and a decoded side
        // costs memory on the board).
        (
            "limits.agent_image_side",
            (64..=8192).contains(&l.agent_image_side),
            "must be between 64 and 8192",
        ),
        // A JPEG of the smallest side (64 px) must be able to fit; all of a message's images
        // together are bounded separately (6 MiB) by what Hermes accepts in one request.
        (
            "limits.agent_image_bytes",
            (16 << 10..=6 << 20).contains(&l.agent_image_bytes),
            "must be between 16384 and 6291456 (6 MiB)",
        ),
        (
            "limits.agent_document_bytes",
            (1..=4 << 20).contains(&l.agent_document_bytes),
            "must be between 1 and 4194304 (4 MiB)",
        ),
    ]
}

/// A `[[cron]]` needs a schedule the cron crate reads, a channel and a prompt.
fn check_cron(job: &CronJob) -> Result<(), ConfigError> {
    if let Err(e) = job.schedule.parse::<cron::Schedule>() {
        return Err(invalid(
            "cron.schedule",
            format!(
                "`{}`: {e} (use `sec min hour day month weekday`)",
                job.schedule
            ),
        ));
    }
    if job.channel.trim().is_empty() || job.prompt.trim().is_empty() {
        return Err(invalid(
            "cron",
            "every [[cron]] needs a channel and a prompt",
        ));
    }
    Ok(())
}

/// Every `[[webhook]]` needs a unique URL-safe name, a channel and a token long enough not to
/// be guessed.
fn check_webhooks(hooks: &[WebhookConfig]) -> Result<(), ConfigError> {
    let mut names = HashSet::new();
    for hook in hooks {
        let good_name = !hook.name.is_empty()
            && hook.name.len() <= 64
            && hook
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !good_name || !names.insert(hook.name.as_str()) {
            return Err(invalid(
                "webhook.name",
                format!(
                    "`{}` must be unique, 1-64 letters, digits, `-` or `_`",
                    hook.name
                ),
            ));
        }
        if hook.channel.trim().is_empty() {
            return Err(invalid(
                "webhook.channel",
                format!("webhook `{}` needs a channel", hook.name),
            ));
        }
        if hook.token_file.is_none() && hook.token.0.chars().count() < 16 {
            return Err(invalid(
                "webhook.token",
                format!(
                    "webhook `{}` needs a token of at least 16 characters (or token_file)",
                    hook.name
                ),
            ));
        }
    }
    Ok(())
}

/// A service URL a client can call: empty (the service is off) or HTTP(S).
fn off_or_http(url: &str) -> bool {
    url.is_empty() || url.starts_with("http://") || url.starts_with("https://")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcription_wait_is_bounded_in_the_file_as_on_the_page() {
        let mut c = Config::default();
        c.transcription.timeout_secs = 600;
        assert!(c.validate().is_ok());
        c.transcription.timeout_secs = 601;
        assert_eq!(refused_key(c.validate()), "transcription.timeout_secs");
        c.transcription.timeout_secs = 0;
        assert_eq!(refused_key(c.validate()), "transcription.timeout_secs");
    }

    fn with(f: impl FnOnce(&mut Limits)) -> Result<(), ConfigError> {
        let mut c = Config::default();
        f(&mut c.limits);
        c.validate()
    }

    fn refused_key(r: Result<(), ConfigError>) -> &'static str {
        match r {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn agent_media_limits_are_bounded_at_both_ends() {
        assert!(with(|l| l.agent_image_side = 64).is_ok());
        assert!(with(|l| l.agent_image_side = 8192).is_ok());
        assert_eq!(
            refused_key(with(|l| l.agent_image_side = 63)),
            "limits.agent_image_side"
        );
        assert_eq!(
            refused_key(with(|l| l.agent_image_side = 8193)),
            "limits.agent_image_side"
        );
        assert!(with(|l| l.agent_image_bytes = 16 << 10).is_ok());
        assert!(with(|l| l.agent_image_bytes = 6 << 20).is_ok());
        assert_eq!(
            refused_key(with(|l| l.agent_image_bytes = (16 << 10) - 1)),
            "limits.agent_image_bytes"
        );
        assert_eq!(
            refused_key(with(|l| l.agent_image_bytes = (6 << 20) + 1)),
            "limits.agent_image_bytes"
        );
        assert!(with(|l| l.agent_document_bytes = 1).is_ok());
        assert!(with(|l| l.agent_document_bytes = 4 << 20).is_ok());
        assert_eq!(
            refused_key(with(|l| l.agent_document_bytes = 0)),
            "limits.agent_document_bytes"
        );
        assert_eq!(
            refused_key(with(|l| l.agent_document_bytes = (4 << 20) + 1)),
            "limits.agent_document_bytes"
        );
    }
}
