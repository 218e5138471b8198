//! Whether a verified bundle may be installed here and now: the rules both sides apply, the
//! gateway before it stages a bundle (so the page can say why at once) and the helper again
//! before it changes anything (it trusts nothing the gateway decided).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::bundle::Verified;
use super::version::{self, Step};
use super::Error;

/// What the store is on disk, copied before an update and put back by a rollback. Media files
/// are not copied: they are named by their hash and never rewritten, so no version changes them.
pub const STORE_PARTS: [&str; 3] = ["db", crate::store::HISTORY_DIR, crate::store::WITNESS_FILE];

/// Room kept free on each file system beyond what an update needs.
pub const SPACE_MARGIN: u64 = 64 * 1024 * 1024;

/// What the owner chose when staging: whether going back, or a major version, is wanted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consent {
    #[serde(default)]
    pub downgrade: bool,
    #[serde(default)]
    pub major: bool,
}

/// What an update will need on disk: the store copied beside itself, and on the binary's file
/// system the new binary twice (the helper's copy, the one put in place) and the old once.
#[derive(Debug, Clone, Copy)]
pub struct Space {
    pub store_bytes: u64,
    pub data_free: u64,
    pub binary_free: u64,
    pub old_binary: u64,
}

impl Space {
    /// What the disks hold now, for an update of the gateway on `data_dir` configured by
    /// `config` (the staged bundle, if any, is on the data disk already).
    pub fn measure(data_dir: &Path, config: &crate::config::UpdateConfig) -> Space {
        Space {
            store_bytes: store_bytes(data_dir),
            data_free: free_bytes(data_dir),
            binary_free: free_bytes(&config.helper_dir),
            old_binary: std::fs::metadata(&config.binary).map_or(0, |m| m.len()),
        }
    }
}

/// The architecture this binary runs on, as bundles name it.
pub fn this_arch() -> &'static str {
    std::env::consts::ARCH
}

/// Refuses what must not be installed, with the reason in words; otherwise says how the
/// version steps.
pub fn check(verified: &Verified, consent: Consent, space: Space) -> Result<Step, Error> {
    let m = &verified.manifest;
    if m.arch != this_arch() {
        return Err(Error::Refused(format!(
            "wrong architecture: the bundle is for {}, this box is {}",
            m.arch,
            this_arch()
        )));
    }
    let running = version::running();
    let step = version::step(&running, &verified.version);
    match step {
        Step::Same => {
            return Err(Error::Refused(format!(
                "version {} is the one running",
                m.version
            )))
        }
        Step::Older if !consent.downgrade => {
            return Err(Error::Refused(format!(
                "downgrade: {} is older than the running {running}; tick \"Go back to an older \
                 version\" to install it anyway",
                m.version
            )))
        }
        Step::Major if !consent.major => {
            return Err(Error::Refused(format!(
                "major version: {} may change what {running} does; tick \"Allow a new major \
                 version\" (or, for an offered one, \"I have read what changes\") to install it",
                m.version
            )))
        }
        _ => {}
    }
    let need_data = space.store_bytes + SPACE_MARGIN;
    if space.data_free < need_data {
        return Err(Error::Refused(format!(
            "not enough space: the store ({}) is copied before the update, and the data disk \
             has {} free (needs {})",
            human(space.store_bytes),
            human(space.data_free),
            human(need_data)
        )));
    }
    let need_binary = 2 * m.payload_len + space.old_binary + SPACE_MARGIN / 4;
    if space.binary_free < need_binary {
        return Err(Error::Refused(format!(
            "not enough space: the system disk has {} free, the update needs {}",
            human(space.binary_free),
            human(need_binary)
        )));
    }
    Ok(step)
}

/// The bytes the store's files take (what the helper copies before an update).
pub fn store_bytes(data_dir: &Path) -> u64 {
    STORE_PARTS
        .iter()
        .map(|part| tree_bytes(&data_dir.join(part)))
        .sum()
}

fn tree_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| tree_bytes(&e.path())).sum())
        .unwrap_or(0)
}

/// Free bytes for an unprivileged writer on the file system holding `path`.
pub fn free_bytes(path: &Path) -> u64 {
    crate::disk::free_bytes(path).unwrap_or(0)
}

fn human(bytes: u64) -> String {
    crate::store::human_bytes(bytes)
}
