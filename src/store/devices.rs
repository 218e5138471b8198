//! Paired devices and their credentials.
//!
//! Only a SHA-256 of each token is stored (`tokens`: hash → device id), so a copied SD card does
//! not leak working credentials. Device records (`devices`: device id → JSON) hold what `devices`
//! lists and what push needs later.

use serde::{Deserialize, Serialize};

use super::base::{from_json, Result};
use super::engine::handle::Store;

/// Why a device record exists: minted by `pair`, or the code printed when a gateway with no
/// devices starts (replaced at each start until a device uses it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceOrigin {
    Pair,
    Startup,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub device_id: String,
    pub name: String,
    pub origin: DeviceOrigin,
    pub created_ms: i64,
    /// Set at the first good hello; `None` means the token was never used.
    #[serde(default)]
    pub last_seen_ms: Option<i64>,
    /// The id the app reports for itself in `hello` (informational).
    #[serde(default)]
    pub app_device_id: Option<String>,
    /// Highest outbox cursor delivered to this device by push (0 = never).
    #[serde(default)]
    pub last_pushed_cursor: u64,
    #[serde(default)]
    pub fcm_token: Option<String>,
    #[serde(default)]
    pub ntfy_topic: Option<String>,
    #[serde(default)]
    pub token_hash: Vec<u8>,
    /// The outbox head when the device last disconnected: it saw everything up to here live.
    #[serde(default)]
    pub seen_cursor: u64,
    /// The address of its last good hello, for the owner to recognise it.
    #[serde(default)]
    pub last_address: Option<String>,
    /// The push service the app named in its last hello's `caps.push` (`fcm`, `ntfy`, …): the
    /// one hint of its platform the protocol carries.
    #[serde(default)]
    pub push_via: Option<String>,
    /// The `User-Agent` of the WebSocket upgrade of its last good hello (at most
    /// `session::MAX_USER_AGENT_BYTES`): the app and platform the Devices page shows.
    #[serde(default)]
    pub user_agent: Option<String>,
}

impl Store {
    pub fn device_by_token_hash(&self, hash: &[u8]) -> Result<Option<Device>> {
        let Some(id) = self.t()?.tokens.get(hash)? else {
            return Ok(None);
        };
        self.device(std::str::from_utf8(&id).unwrap_or(""))
    }

    pub fn device(&self, device_id: &str) -> Result<Option<Device>> {
        match self.t()?.devices.get(device_id.as_bytes())? {
            Some(v) => Ok(Some(from_json(&v, "device")?)),
            None => Ok(None),
        }
    }

    pub fn devices(&self) -> Result<Vec<Device>> {
        self.t()?
            .devices
            .iter()
            .values()
            .map(|v| from_json(&v?, "device"))
            .collect()
    }
}
