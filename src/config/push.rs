//! `[push]`: which push service reaches devices that are away, and how hard it is retried.
//! Plain data read from the config file; the push worker (src/push/) acts on it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The `[push]` section of the config file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PushConfig {
    /// `none`, `ntfy` or `fcm`.
    pub backend: String,
    /// ntfy server base URL, e.g. `https://ntfy.sh` or `http://192.168.1.10:8080`.
    pub ntfy_server: String,
    /// ntfy access token (`Authorization: Bearer`), or read from `ntfy_token_file`.
    #[serde(serialize_with = "super::redact_option")]
    pub ntfy_token: Option<String>,
    pub ntfy_token_file: Option<PathBuf>,
    /// ntfy user and password (basic auth), as an alternative to a token.
    pub ntfy_user: Option<String>,
    #[serde(serialize_with = "super::redact_option")]
    pub ntfy_password: Option<String>,
    /// FCM service-account key file (JSON, from the Firebase console).
    pub fcm_credentials: Option<PathBuf>,
    /// FCM API base; only tests point it elsewhere.
    pub fcm_endpoint: String,
    /// What a push may carry: `full` (title and body up to 140 characters), `preview` (title and
    /// a 60-character body), `title` (title only) or `none` (only ids: the app fetches the rest).
    pub content: String,
    /// How long a failing push is retried before it is given up.
    pub give_up_secs: u64,
    /// First retry delay; doubles per attempt up to `max_backoff_secs`.
    pub backoff_ms: u64,
    pub max_backoff_secs: u64,
}

impl Default for PushConfig {
    fn default() -> Self {
        PushConfig {
            backend: "none".into(),
            ntfy_server: "https://ntfy.sh".into(),
            ntfy_token: None,
            ntfy_token_file: None,
            ntfy_user: None,
            ntfy_password: None,
            fcm_credentials: None,
            fcm_endpoint: "https://fcm.googleapis.com".into(),
            content: "preview".into(),
            give_up_secs: 3600,
            backoff_ms: 1000,
            max_backoff_secs: 300,
        }
    }
}
