//! The helper's two records, both in its own directory and readable by the gateway:
//!
//! - the **journal** (`journal.json`): the update under way and the last step it finished,
//!   written (whole, fsynced) before the step's effects, so a boot after a power cut knows what
//!   to finish or undo; absent when nothing is under way;
//! - the **history** (`history.json`): every update tried and how it ended, the newest
//!   [`HISTORY_KEEP`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Error;

pub const JOURNAL_FILE: &str = "journal.json";
pub const HISTORY_FILE: &str = "history.json";
/// Entries kept in the history: years of monthly updates.
pub const HISTORY_KEEP: usize = 50;
/// Largest journal or history file read (both are a few kilobytes).
const MAX_RECORD: u64 = 256 * 1024;

/// The last step of an update that was finished, in the order they are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The bundle is in the helper's directory and checked; nothing else changed.
    Copied,
    /// The new binary and a copy of the running one are in the helper's directory.
    Prepared,
    /// The gateway was stopped.
    Stopped,
    /// A whole copy of the store is beside it.
    BackedUp,
    /// The new binary is in place of the old.
    Switched,
    /// The new binary was started; devices wait until it is committed.
    Trial,
    /// The new version was healthy: it stays.
    Committed,
    /// The new version failed: the old one is being put back.
    RollingBack,
}

/// The update under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub id: String,
    pub phase: Phase,
    pub from: String,
    pub to: String,
    #[serde(default)]
    pub signed_by: String,
    /// Why it is being rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub started_at: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Installed and healthy.
    Installed,
    /// Installed, failed its health check, and the previous version put back.
    RolledBack,
    /// Refused before anything changed.
    Refused,
    /// Cut short (a power cut, a killed helper) before the switch: nothing changed.
    Interrupted,
}

/// One update tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
    pub at: u64,
    pub from: String,
    pub to: String,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Entry {
    /// How an update ended, now.
    pub fn new(id: &str, from: &str, to: &str, outcome: Outcome, reason: Option<String>) -> Entry {
        Entry {
            id: id.to_owned(),
            at: super::now_secs(),
            from: from.to_owned(),
            to: to.to_owned(),
            outcome,
            reason,
        }
    }

    /// In words, as `status`, the LED's cause and the admin page say it.
    pub fn summary(&self) -> String {
        let why = self.reason.as_deref().unwrap_or("no reason recorded");
        match self.outcome {
            Outcome::Installed => format!("updated from {} to {}", self.from, self.to),
            Outcome::RolledBack => format!("update to {} failed, rolled back: {why}", self.to),
            Outcome::Refused => format!("update to {} refused: {why}", self.to),
            Outcome::Interrupted => {
                format!("update to {} interrupted, nothing changed: {why}", self.to)
            }
        }
    }
}

/// The helper's directory and its records.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new(dir: &Path) -> Records {
        Records {
            dir: dir.to_owned(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The update under way, if any. A journal that does not parse is reported, not guessed at.
    pub fn journal(&self) -> Result<Option<Journal>, Error> {
        read_json(&self.dir.join(JOURNAL_FILE))
    }

    pub fn write_journal(&self, journal: &Journal) -> Result<(), Error> {
        write_json(&self.dir.join(JOURNAL_FILE), journal)
    }

    /// Nothing under way any more.
    pub fn clear_journal(&self) -> Result<(), Error> {
        let path = self.dir.join(JOURNAL_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => crate::atomic_file::sync_dir(&self.dir)
                .map_err(|e| Error::io("syncing", &self.dir, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("removing", &path, e)),
        }
    }

    /// Every update tried, oldest first.
    pub fn history(&self) -> Vec<Entry> {
        read_json(&self.dir.join(HISTORY_FILE))
            .ok()
            .flatten()
            .unwrap_or_default()
    }

    pub fn append(&self, entry: Entry) -> Result<(), Error> {
        let mut all = self.history();
        // A recovery that runs twice (a second power cut) records its outcome once.
        all.retain(|e| e.id != entry.id);
        all.push(entry);
        let drop = all.len().saturating_sub(HISTORY_KEEP);
        all.drain(..drop);
        write_json(&self.dir.join(HISTORY_FILE), &all)
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, Error> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("reading", path, e)),
        Ok(m) if m.len() > MAX_RECORD => {
            return Err(Error::Helper(format!("{} is too large", path.display())))
        }
        Ok(_) => {}
    }
    let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Helper(format!("{} does not parse: {e}", path.display())))
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), Error> {
    let bytes = serde_json::to_vec_pretty(value).expect("records serialize");
    // World-readable: the gateway shows them; only root writes the directory.
    crate::atomic_file::write(path, &bytes, 0o644).map_err(|e| Error::io("writing", path, e))
}
