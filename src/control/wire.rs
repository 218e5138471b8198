//! What travels on the control socket: one JSON request line from a command, one JSON answer
//! line back (or, for `backup`, the backup's bytes). Shared by both ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::Device;

/// How long either end waits for the other's line: a command that stalls must not hold a
/// task of the gateway, and a gateway that stalls must not hang a command.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The socket in the data dir: found by the commands from the same data dir flag the gateway
/// was started with, and reachable only by its user (mode 0600).
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("control.sock")
}

/// What a command asks; `op` names it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ControlRequest {
    Pair {
        name: String,
    },
    Devices,
    Revoke {
        device_id: String,
    },
    Backup,
    /// A fresh one-time code for the pairing page (`pair --page`).
    PairPage,
    /// Health, agent, push, storage and devices (`status`).
    Status,
}

/// The gateway's answer; `result` names it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ControlResponse {
    Paired {
        device_id: String,
        token: String,
        url: String,
        /// `wss://` URL and certificate fingerprint, when TLS is on.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tls: Option<crate::tls::Advert>,
    },
    Devices {
        devices: Vec<Device>,
    },
    Revoked {
        existed: bool,
    },
    PageCode {
        /// `XXXX-XXXX`; it replaces any earlier code.
        code: String,
        /// Where to enter it: `http(s)://HOST:PORT/pair`.
        page_url: String,
        expires_in_secs: u64,
    },
    Status {
        report: Box<crate::hub::StatusReport>,
    },
    Error {
        message: String,
    },
}
