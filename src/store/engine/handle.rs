//! The store's handle: `Store`, the state its clones share, and the two engines' handles
//! (sled's database and trees, the history database) it reaches them through. Every room of
//! the store reads and writes through `Store::t`; the rooms of `engine/` open, check, commit,
//! sync and reopen what this file holds.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::replay_bound::ReplayBound;
use super::witness_clock::WitnessClock;
use crate::store::base::{Result, StoreError};
use crate::store::sql;

/// The last cursor and journal position ever assigned. Kept in the commit record, apart from
/// the outbox and the journal, so that pruning either can never make a number be reused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::store) struct Heads {
    pub cursor: u64,
    pub journal: u64,
}

/// Both engines. Replaced as a whole when the store is reopened after a storage failure (sled
/// refuses every write once one of its own writes failed).
pub(in crate::store) struct Trees {
    pub(in crate::store) s: Sled,
    pub(in crate::store) hist: sql::History,
}

impl std::ops::Deref for Trees {
    type Target = Sled;
    fn deref(&self) -> &Sled {
        &self.s
    }
}

/// The sled database and its trees: the outbox, the journal and the small bounded records.
pub(in crate::store) struct Sled {
    pub(in crate::store) db: sled::Db,
    /// sled's log file and the directory of its files for large values, fsynced by `sync`.
    pub(in crate::store) db_file: std::fs::File,
    pub(in crate::store) blobs_dir: PathBuf,
    pub(in crate::store) meta: sled::Tree,
    pub(in crate::store) outbox: sled::Tree,
    /// Journal position (u64 BE) → a history change (`sql_write::Op`, JSON), written in the commit
    /// that carries it; dropped once a checkpoint made SQLite durable past it.
    pub(in crate::store) journal: sled::Tree,
    pub(in crate::store) channels: sled::Tree,
    pub(in crate::store) devices: sled::Tree,
    pub(in crate::store) tokens: sled::Tree,
    pub(in crate::store) todos: sled::Tree,
    /// Lane → its conversation at the agent (`sessions.rs`).
    pub(in crate::store) sessions: sled::Tree,
    /// Lane → where the household has read it up to (`read_marks.rs`).
    pub(in crate::store) read_marks: sled::Tree,
    /// Lane → the model `/model` chose there (`lane_models.rs`).
    pub(in crate::store) lane_models: sled::Tree,
    /// Lane → its voice mode, when `/voice` set one other than off (`lane_models.rs`).
    pub(in crate::store) lane_voices: sled::Tree,
    pub(in crate::store) turns: sled::Tree,
    /// Message id → the cursors of its outbox frames, and cursor → message id: both only for
    /// frames still in the outbox (pruned with it), so they stay bounded by the retention.
    pub(in crate::store) message_frames: sled::Tree,
    pub(in crate::store) frame_of: sled::Tree,
    pub(in crate::store) media: sled::Tree,
    pub(in crate::store) media_refs: sled::Tree,
    pub(in crate::store) blobs: sled::Tree,
    /// The last cursor and journal position assigned, as the last commit record has them
    /// (`commit.rs`); the lock also orders commits.
    pub(in crate::store) heads: std::sync::Mutex<Heads>,
    /// The journal head as of the last `sync`: what the history database may be given.
    pub(in crate::store) durable_journal: std::sync::atomic::AtomicU64,
}

impl Sled {
    pub(in crate::store) fn heads(&self) -> Heads {
        *self
            .heads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The store: cheap to clone, every clone sees the same (possibly reopened) database.
#[derive(Clone)]
pub struct Store {
    pub(in crate::store) shared: Arc<Shared>,
}

pub(in crate::store) struct Shared {
    pub(in crate::store) dir: PathBuf,
    pub(in crate::store) cache_bytes: u64,
    /// `None` only while a reopen is under way or after one failed.
    pub(in crate::store) trees: RwLock<Option<Arc<Trees>>>,
    /// Why the last reopen failed, for `StoreError::Closed`.
    pub(in crate::store) closed_why: std::sync::Mutex<String>,
    /// A sled write or flush failed: sled has stopped writing (or can no longer complete a
    /// flush) and only a reopen, or a restart, resumes. Also keeps what the failure was.
    pub(in crate::store) failed: AtomicBool,
    pub(in crate::store) failure: std::sync::Mutex<Option<StoreError>>,
    /// sled's files for large values already fsynced (`fsync_files`).
    pub(in crate::store) synced_blobs:
        std::sync::Mutex<std::collections::HashSet<std::ffi::OsString>>,
    /// Free bytes the data disk must keep before the store writes (`writable`).
    pub(in crate::store) reserve: u64,
    pub(in crate::store) witness: WitnessClock,
    /// The journal position the last finished checkpoint made durable in SQLite.
    pub(in crate::store) durable_applied: std::sync::atomic::AtomicU64,
    pub(in crate::store) checkpointing: AtomicBool,
    pub(in crate::store) last_checkpoint: std::sync::Mutex<std::time::Instant>,
    pub(in crate::store) kill_at: Option<String>,
    /// What was written since sled last opened, against what its last reopen wrote: when
    /// `bound_replay` reopens it.
    pub(in crate::store) replay: std::sync::Mutex<ReplayBound>,
    /// Why the last apply of the journal failed, until one succeeds.
    pub(in crate::store) history_behind: std::sync::Mutex<Option<String>>,
}

impl Store {
    /// The current database, or `Closed` while it is being reopened.
    pub(in crate::store) fn t(&self) -> Result<Arc<Trees>> {
        let guard = self
            .shared
            .trees
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*guard {
            Some(t) => Ok(t.clone()),
            None => Err(StoreError::Closed(
                self.shared
                    .closed_why
                    .lock()
                    .map(|w| w.clone())
                    .unwrap_or_default(),
            )),
        }
    }

    /// The data directory this store lives in.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The last cursor assigned (0 before the first frame).
    pub fn cursor_head(&self) -> Result<u64> {
        Ok(self.t()?.heads().cursor)
    }

    /// Bytes the store occupies on disk (sled and the history database): tracked to watch
    /// SD-card wear and space amplification.
    pub fn size_on_disk(&self) -> Result<u64> {
        Ok(self.t()?.db.size_on_disk()? + self.history_bytes()?)
    }

    /// Bytes of the history database's files (database, WAL, shared memory).
    pub fn history_bytes(&self) -> Result<u64> {
        let dir = self.shared.dir.join(sql::HISTORY_DIR);
        let mut total = 0;
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                total += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        Ok(total)
    }
}

impl Store {
    /// The store's replay bound, for a commit to count into or a reopen to reset.
    pub(in crate::store) fn replay_bound(&self) -> std::sync::MutexGuard<'_, ReplayBound> {
        self.shared
            .replay
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
