//! The `[update]` config section: where updates come from, how long a new version has to prove
//! itself, and how the root helper that installs them reaches the service. The helper reads
//! this section from the config file under /etc (root's), never from settings the admin page
//! saves (docs/security.md, "Updates").

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpdateConfig {
    /// A release index (JSON) the admin page checks for newer versions; empty: updates come
    /// only from an upload on the admin page (a LAN-only box).
    pub url: String,
    /// Fetch and install a newer version with the same major part found at `url` by itself
    /// (once a day). A major version always waits for the owner's click.
    pub automatic: bool,
    /// Seconds a new version has to come up healthy before it is rolled back, at the least:
    /// the helper adds time for a large store, and waits longer while the store is still
    /// opening (a migration), up to `max_window_secs`.
    pub window_secs: u64,
    pub max_window_secs: u64,
    /// The helper's own directory (root's): its journal, the update history, the previous
    /// binary while an update is under way.
    pub helper_dir: PathBuf,
    /// The binary the service runs, which an update replaces.
    pub binary: PathBuf,
    /// Public keys trusted beside the built-in release key (`*.pub`, root's).
    pub keys_dir: PathBuf,
    /// How the helper stops and starts the gateway (run directly, no shell).
    pub stop: Vec<String>,
    pub start: Vec<String>,
    /// The operating system's automatic security updates, as the admin page shows them: the
    /// log unattended-upgrades keeps, and the flag Debian's packages set when a restart is
    /// needed (with the packages that asked for it beside it, `.pkgs`).
    pub system_log: PathBuf,
    pub reboot_required: PathBuf,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig {
            url: String::new(),
            automatic: true,
            window_secs: 120,
            max_window_secs: 3600,
            helper_dir: "/var/lib/iris-gateway-update".into(),
            binary: "/usr/bin/iris-gateway".into(),
            keys_dir: "/etc/iris-gateway/update-keys".into(),
            stop: ["systemctl", "stop", "iris-gateway"].map(Into::into).into(),
            start: ["systemctl", "start", "iris-gateway"]
                .map(Into::into)
                .into(),
            system_log: "/var/log/unattended-upgrades/unattended-upgrades.log".into(),
            reboot_required: "/run/reboot-required".into(),
        }
    }
}
