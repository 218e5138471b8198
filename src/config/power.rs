//! The `[power]` config section: the commands the admin page runs to reboot or shut down the
//! box. The service is unprivileged; the shipped polkit rule lets its user, and only it, ask
//! logind for these two (docs/security.md, "Reboot and shut down").

use serde::{Deserialize, Serialize};

/// A command and its arguments, run directly (no shell).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PowerConfig {
    /// Reboots the box. Empty: the page offers no reboot.
    pub reboot: Vec<String>,
    /// Shuts the box down. Empty: the page offers no shut-down.
    pub poweroff: Vec<String>,
}

impl Default for PowerConfig {
    fn default() -> Self {
        PowerConfig {
            reboot: vec!["systemctl".into(), "reboot".into()],
            poweroff: vec!["systemctl".into(), "poweroff".into()],
        }
    }
}
