//! `[discovery]`: whether and under which name the gateway advertises itself on the LAN.
//! Plain data read from the config file; src/discovery.rs does the advertising.

/// `[discovery]` in the config file.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Advertise the gateway on the LAN with mDNS/DNS-SD.
    pub enabled: bool,
    /// The name the app lists; empty: "Iris on HOSTNAME".
    pub name: String,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            enabled: true,
            name: String::new(),
        }
    }
}
