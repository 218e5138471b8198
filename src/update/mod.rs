//! Signed updates of the gateway's binary, installed beside the running one, switched to,
//! health-checked and rolled back by themselves (docs/updates.md).
//!
//! Two sides, two users. The gateway (unprivileged) takes a bundle from the admin page or the
//! configured URL, checks it in full and stages it in its data dir ([`stage`]). A root helper,
//! started by systemd when something is staged, copies it out of the gateway's reach, checks it
//! again, and runs the steps in [`helper`], each recorded in its journal first, so a power cut
//! at any step is finished or undone by [`helper::recover`] at the next boot before the gateway
//! starts. What happened is kept in the helper's history ([`journal`]), which the gateway reads
//! for `status`, the LED and the admin page.

pub mod bundle;
pub mod checks;
pub mod helper;
pub mod journal;
pub mod keys;
pub mod policy;
pub mod source;
pub mod stage;
pub mod version;

use std::path::{Path, PathBuf};

pub use journal::{Entry, Outcome, Phase};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad signature: {0}")]
    BadSignature(String),
    #[error("not a usable bundle: {0}")]
    Bundle(String),
    #[error("{0}")]
    Key(String),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Helper(String),
}

impl Error {
    pub fn io(context: &'static str, path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            context,
            path: path.to_owned(),
            source,
        }
    }
}

/// The test hook `IRIS_GATEWAY_KILL_AT=update-…` (debug builds only): ends the helper as a power
/// cut would at a step of an update (tests/update_kill.rs kills it at each of [`KILL_POINTS`]).
pub const KILL_POINTS: &[&str] = &[
    "update-copied",
    "update-prepared",
    "update-stopped",
    "update-backed-up",
    "update-switched",
    "update-trial",
    "update-committing",
    "update-rolling-back",
    "update-restored",
];

pub(crate) fn kill_point(name: &str) {
    debug_assert!(KILL_POINTS.contains(&name), "{name} is not in KILL_POINTS");
    if cfg!(debug_assertions) && std::env::var("IRIS_GATEWAY_KILL_AT").as_deref() == Ok(name) {
        // SAFETY: raising a signal in our own process.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// Seconds since the epoch, for the history.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
