//! The store: everything on disk, in sled (the outbox, the journal, the small records) and SQLite
//! (history, its search index and media uses). No other module touches either.
//!
//! The store speaks in intents (append these frames to the outbox, keep this message, page this
//! lane) and owns the layout, documented in docs/storage.md. Writes that belong together are one
//! commit, made atomic by its commit record (`commit.rs`), so a power cut leaves either all of a
//! change or none of it; `sync` (`durability.rs`) makes everything written so far durable and is
//! what the hub awaits before it tells any device about a change.
//!
//! This file is the store's face: the handle, its errors, the change list and the helpers every
//! room uses. The engine lives in rooms of one concern each, listed in docs/architecture.md; a
//! start after a power cut walks them in one direction, from `recovery.rs` down
//! (tests/layering.rs holds the order), so a reader follows it top to bottom.

// The store's API by subject.
mod agent_jobs;
mod approvals;
pub mod backup;
mod devices;
mod directory;
mod history;
mod lane_models;
mod media;
mod outbox;
mod read_marks;
mod records;
pub mod search;
mod sessions;
mod view;
// The engine; the order a start walks its rooms is `STORE_ROOMS` in tests/layering.rs.
mod check;
mod commit;
mod durability;
mod fold;
mod journal;
mod kill_points;
mod migrate;
mod open;
mod rebuild;
mod recovery;
mod replay_bound;
mod safety_copy;
mod sql;
mod sql_query;
mod sql_write;
mod witness;
pub use agent_jobs::AgentJob;
pub use approvals::{ApprovalRecord, RunRecord};
pub use lane_models::{LaneModel, VoiceMode};
pub use read_marks::ReadMark;
pub use records::Record;
pub use sessions::AgentSession;
pub use view::StoreView;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};

pub use check::EXIT_DAMAGED;
pub use devices::{Device, DeviceOrigin};
pub use directory::DEFAULT_CHAT_ID;
pub use durability::STORE_RESERVE_BYTES;
pub use history::purge_changes;
pub use kill_points::{kill_point, KillPoint, START_KILL_POINTS};
pub use media::MediaRecord;
pub use safety_copy::SAFETY_DIR;
/// The history database's directory in the data dir.
pub use sql::HISTORY_DIR;
pub use witness::WITNESS_FILE;

use crate::protocol::Outboxed;
use crate::protocol::{Channel, HistoryMessage, Lane, TodoItem};

/// Layout version written at creation. 1: everything in sled (up to 0.1.0 of early 2026);
/// 2: history, its ids, search and media uses in SQLite (`sql.rs`), the rest in sled; 3: the
/// same trees, committed with a commit record instead of sled transactions (`commit.rs`). A
/// layout-1 store is migrated on open (`migrate.rs`), a layout-2 one upgraded
/// (`commit::upgrade_to_layout3`).
const LAYOUT_VERSION: u64 = 3;
const META_LAYOUT: &[u8] = b"layout_version";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the data directory {dir} is in use by another process (is the gateway already running?)"
    )]
    Locked { dir: PathBuf },
    #[error("cannot open the store in {dir}: {source}. The data may be damaged: restore a backup, or move the directory aside to start fresh")]
    Open { dir: PathBuf, source: sled::Error },
    /// Found at open: the files are damaged or older than the store last seen. Nothing was
    /// changed on disk (see `check.rs`).
    #[error("{}", check::damaged_message(.dir, .detail, .touched))]
    Damaged {
        dir: PathBuf,
        detail: String,
        /// What the refused start changed in the data dir before it found the damage (each
        /// said in a few words); empty when it changed nothing.
        touched: Vec<String>,
    },
    /// The disk is (nearly) full: refused before sled is asked to write (`Store::writable`), or
    /// sled's write failed with ENOSPC.
    #[error("the data disk is full ({detail}); nothing new can be saved until space is freed: delete messages with media, or remove other files from that disk")]
    Full { detail: String },
    #[error("the data disk is read-only ({detail}); nothing new can be saved. The SD card may be failing: make a backup now ({}) and check the card", crate::hints::command("backup FILE"))]
    ReadOnly { detail: String },
    /// sled can no longer complete a flush after a failed write and cannot be closed either
    /// (`Store::reopen`): only a restart of the process reopens the store.
    #[error(
        "the storage engine cannot resume after the disk failure without a restart of the gateway"
    )]
    Stuck,
    /// Reopening after a storage failure failed: nothing can be read or written until it works.
    #[error("the store is closed after a storage failure and could not be reopened yet: {0}")]
    Closed(String),
    #[error("storage error: {0}")]
    Sled(sled::Error),
    #[error("history database error: {0}")]
    History(rusqlite::Error),
    /// The history database's own content is damaged: SQLite says the file is corrupt, or a
    /// stored value is not what the schema writes (a text that is not UTF-8). It does not heal
    /// and is not the disk failing: the owner restores a backup (docs/durability.md).
    #[error("the history database is damaged: {detail}")]
    HistoryDamaged { detail: String },
    #[error("stored record is damaged ({what}): {source}")]
    Corrupt {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("store layout version {found} is newer than this build understands ({LAYOUT_VERSION}); upgrade iris-gateway")]
    TooNew { found: u64 },
}

impl From<sled::Error> for StoreError {
    /// A full or read-only disk gets its own message: that is what the user must act on.
    fn from(e: sled::Error) -> StoreError {
        match &e {
            sled::Error::Io(io) => classify_io(io).unwrap_or(StoreError::Sled(e)),
            _ => StoreError::Sled(e),
        }
    }
}

/// `Full` or `ReadOnly` for the I/O errors that mean so (sled keeps the kind, not the errno,
/// when it repeats a stored error).
fn classify_io(io: &std::io::Error) -> Option<StoreError> {
    use std::io::ErrorKind;
    let detail = io.to_string();
    match (io.kind(), io.raw_os_error()) {
        (ErrorKind::StorageFull | ErrorKind::QuotaExceeded, _) => Some(StoreError::Full { detail }),
        (_, Some(libc::ENOSPC | libc::EDQUOT)) => Some(StoreError::Full { detail }),
        (ErrorKind::ReadOnlyFilesystem, _) | (_, Some(libc::EROFS)) => {
            Some(StoreError::ReadOnly { detail })
        }
        _ => None,
    }
}

impl StoreError {
    /// The storage itself failed (as opposed to a bad record or a refused request): the
    /// gateway reports `degraded` until it works again.
    pub fn is_storage_failure(&self) -> bool {
        matches!(
            self,
            StoreError::Full { .. }
                | StoreError::ReadOnly { .. }
                | StoreError::Closed(_)
                | StoreError::Stuck
                | StoreError::Sled(sled::Error::Io(_))
        ) || matches!(self, StoreError::History(e) if sql::is_io(e))
    }

    /// What the history database holds is damaged (not the disk failing, not a refused
    /// request): whoever finds it reports it to the hub's health.
    pub fn is_history_damage(&self) -> bool {
        matches!(
            self,
            StoreError::HistoryDamaged { .. }
                | StoreError::Corrupt {
                    what: sql_query::HISTORY_MESSAGE,
                    ..
                }
        )
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

impl StoreError {
    /// A file operation on the data dir failed while opening (or migrating, or rebuilding)
    /// the store.
    fn open_io(dir: &Path, e: std::io::Error) -> StoreError {
        StoreError::Open {
            dir: dir.to_owned(),
            source: sled::Error::Io(e),
        }
    }
}

/// One change to persist. A `commit` applies a list of them atomically, in order.
#[derive(Debug, Clone)]
pub enum Change {
    /// Append an encoded frame to the outbox under the next cursor (its push note rides along
    /// for publication; the store keeps only the bytes).
    Outbox(Outboxed),
    /// Append a frame that carries (part of) a message's content: deleting the message later
    /// replaces this outbox entry with a tombstone, so no replay returns the content.
    OutboxOf {
        message_id: String,
        frame: Outboxed,
    },
    /// Remove a message from history, the search index and the outbox (whose entries become
    /// `tombstone`, keeping cursors contiguous). Unknown ids are no-ops.
    DeleteMessage {
        message_id: String,
        tombstone: Bytes,
    },
    /// Insert or replace a message in its lane's history.
    PutMessage(Lane, HistoryMessage),
    /// Remove every remaining message of a channel (all its lanes) or one thread from history
    /// (after their `DeleteMessage`s, which tombstone their outbox frames): also catches a
    /// message whose commit was still on its way to the history database.
    PurgeHistory {
        chat_id: String,
        thread_id: Option<String>,
    },
    PutChannel(Channel),
    DeleteChannel(String),
    /// Remember that a user message is waiting for its turn, so a restart can close it cleanly.
    BeginTurn(PendingTurn),
    EndTurn(String),
    /// Set a lane's read marker (the caller has checked it moves forward).
    MarkRead(Lane, ReadMark),
    /// Set (or, with `None`, clear) the model a lane's turns ask for.
    SetLaneModel(Lane, Option<LaneModel>),
    /// Set (or, with `None`, clear: off) whether a lane's answers are also spoken.
    SetLaneVoice(Lane, Option<VoiceMode>),
    /// Write one of the gateway's small records (records.rs).
    Record(Record),
    /// A stored file's record, under its uploader's ref (`device_id` empty for a file the agent
    /// made); its blob's count goes up.
    AddMedia {
        record: MediaRecord,
        device_id: String,
        media_ref: String,
    },
    /// A file no message uses goes (nothing when it is not there); its blob's count goes down.
    RemoveMedia(String),
}

impl Change {
    /// Roughly what the change writes (its value sizes), for the free-space check.
    fn approx_bytes(&self) -> u64 {
        let n = match self {
            Change::Outbox(f) | Change::OutboxOf { frame: f, .. } => f.bytes.len(),
            Change::PutMessage(_, m) => m.text.len() * 2 + 512,
            Change::PutChannel(c) => to_json(c).len(),
            Change::BeginTurn(t) => t.text.len() + 128,
            Change::DeleteMessage { tombstone, .. } => tombstone.len() + 128,
            Change::MarkRead(_, m) => m.message_id.len() + 96,
            Change::SetLaneModel(_, m) => m.as_ref().map_or(0, |m| m.model.len()) + 160,
            Change::SetLaneVoice(..) => 160,
            Change::Record(r) => r.approx_bytes(),
            Change::AddMedia { record, .. } => record.filename.len() + record.mime.len() + 256,
            Change::RemoveMedia(_) => 64,
            Change::DeleteChannel(_) | Change::EndTurn(_) | Change::PurgeHistory { .. } => 64,
        };
        n as u64
    }
}

/// A user message whose agent turn has not finished yet.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct PendingTurn {
    pub user_message_id: String,
    pub lane: Lane,
    pub text: String,
}

/// Both engines. Replaced as a whole when the store is reopened after a storage failure (sled
/// refuses every write once one of its own writes failed).
struct Trees {
    s: Sled,
    hist: sql::History,
}

impl std::ops::Deref for Trees {
    type Target = Sled;
    fn deref(&self) -> &Sled {
        &self.s
    }
}

/// The sled database and its trees: the outbox, the journal and the small bounded records.
struct Sled {
    db: sled::Db,
    /// sled's log file and the directory of its files for large values, fsynced by `sync`.
    db_file: std::fs::File,
    blobs_dir: PathBuf,
    meta: sled::Tree,
    outbox: sled::Tree,
    /// Journal position (u64 BE) → a history change (`sql_write::Op`, JSON), written in the commit
    /// that carries it; dropped once a checkpoint made SQLite durable past it.
    journal: sled::Tree,
    channels: sled::Tree,
    devices: sled::Tree,
    tokens: sled::Tree,
    todos: sled::Tree,
    /// Lane → its conversation at the agent (`sessions.rs`).
    sessions: sled::Tree,
    /// Lane → where the household has read it up to (`read_marks.rs`).
    read_marks: sled::Tree,
    /// Lane → the model `/model` chose there (`lane_models.rs`).
    lane_models: sled::Tree,
    /// Lane → its voice mode, when `/voice` set one other than off (`lane_models.rs`).
    lane_voices: sled::Tree,
    turns: sled::Tree,
    /// Message id → the cursors of its outbox frames, and cursor → message id: both only for
    /// frames still in the outbox (pruned with it), so they stay bounded by the retention.
    message_frames: sled::Tree,
    frame_of: sled::Tree,
    media: sled::Tree,
    media_refs: sled::Tree,
    blobs: sled::Tree,
    /// The last cursor and journal position assigned, as the last commit record has them
    /// (`commit.rs`); the lock also orders commits.
    heads: std::sync::Mutex<commit::Heads>,
    /// The journal head as of the last `sync`: what the history database may be given.
    durable_journal: std::sync::atomic::AtomicU64,
}

impl Sled {
    fn heads(&self) -> commit::Heads {
        *self
            .heads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The store: cheap to clone, every clone sees the same (possibly reopened) database.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    cache_bytes: u64,
    /// `None` only while a reopen is under way or after one failed.
    trees: RwLock<Option<Arc<Trees>>>,
    /// Why the last reopen failed, for `StoreError::Closed`.
    closed_why: std::sync::Mutex<String>,
    /// A sled write or flush failed: sled has stopped writing (or can no longer complete a
    /// flush) and only a reopen, or a restart, resumes. Also keeps what the failure was.
    failed: AtomicBool,
    failure: std::sync::Mutex<Option<StoreError>>,
    /// sled's files for large values already fsynced (`fsync_files`).
    synced_blobs: std::sync::Mutex<std::collections::HashSet<std::ffi::OsString>>,
    /// Free bytes the data disk must keep before the store writes (`writable`).
    reserve: u64,
    witness: witness::WitnessClock,
    /// The journal position the last finished checkpoint made durable in SQLite.
    durable_applied: std::sync::atomic::AtomicU64,
    checkpointing: AtomicBool,
    last_checkpoint: std::sync::Mutex<std::time::Instant>,
    kill_at: Option<String>,
    /// What was written since sled last opened, against what its last reopen wrote: when
    /// `bound_replay` reopens it.
    replay: std::sync::Mutex<replay_bound::ReplayBound>,
    /// Why the last apply of the journal failed, until one succeeds.
    history_behind: std::sync::Mutex<Option<String>>,
}

impl Store {
    /// The current database, or `Closed` while it is being reopened.
    fn t(&self) -> Result<Arc<Trees>> {
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

    pub fn all_todos(&self) -> Result<Vec<(Lane, Vec<TodoItem>)>> {
        history::per_lane(&self.t()?.todos, "todo list")
    }

    /// User messages whose turns never finished (the gateway stopped mid-turn).
    pub fn pending_turns(&self) -> Result<Vec<PendingTurn>> {
        self.t()?
            .turns
            .iter()
            .values()
            .map(|v| from_json(&v?, "pending turn"))
            .collect()
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

/// Whether `dir` holds a store (sled's directory, there in every layout): what a read-only
/// command checks first, since opening a store makes one.
pub fn exists_in(dir: &Path) -> bool {
    dir.join("db").is_dir()
}

/// 8 MiB, 340 KiB, 12 bytes: for messages people read.
pub fn human_bytes(n: u64) -> String {
    const K: u64 = 1024;
    match n {
        n if n >= K * K * K => format!("{:.1} GiB", n as f64 / (K * K * K) as f64),
        n if n >= K * K => format!("{:.1} MiB", n as f64 / (K * K) as f64),
        n if n >= K => format!("{:.1} KiB", n as f64 / K as f64),
        n => format!("{n} bytes"),
    }
}

fn u64_from(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[8 - n..].copy_from_slice(&v[v.len() - n..]);
    u64::from_be_bytes(b)
}

fn to_json<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("store records always serialise")
}

fn from_json<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt { what, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Role;
    use std::time::Duration;

    pub(crate) fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
        (dir, store)
    }

    pub(crate) fn msg(id: &str, text: &str) -> HistoryMessage {
        HistoryMessage::text_only(id.into(), Role::User, text.into(), 1)
    }

    #[test]
    fn cursors_increase_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
            let c = s
                .commit(&vec![
                    Change::Outbox(
                        Bytes::from_static(b"{\"v\":1,}").into()
                    );
                    3
                ])
                .unwrap();
            assert_eq!(c, vec![1, 2, 3]);
            s.sync_blocking().unwrap();
        }
        let s = Store::open(dir.path(), 1 << 20, Duration::from_secs(1)).unwrap();
        assert_eq!(s.cursor_head().unwrap(), 3);
        let c = s
            .commit(&[Change::Outbox(Bytes::from_static(b"{\"v\":1,}").into())])
            .unwrap();
        assert_eq!(c, vec![4]);
    }

    #[test]
    fn a_second_open_reports_the_lock() {
        let (dir, _s) = temp_store();
        match Store::open(dir.path(), 1 << 20, Duration::from_millis(100)) {
            Err(StoreError::Locked { .. }) => {}
            other => panic!("expected Locked, got {:?}", other.err()),
        }
    }

    #[test]
    fn replacing_a_message_keeps_its_place() {
        let (_d, s) = temp_store();
        let lane = Lane::new("default", None);
        s.commit(&[Change::PutMessage(lane.clone(), msg("a", "1"))])
            .unwrap();
        s.commit(&[Change::PutMessage(lane.clone(), msg("b", "2"))])
            .unwrap();
        s.commit(&[Change::PutMessage(lane.clone(), msg("a", "1 edited"))])
            .unwrap();
        // Not in history until durable in sled (read-your-writes holds after `sync`).
        assert!(s
            .history_page(&lane, None, 10)
            .unwrap()
            .unwrap()
            .messages
            .is_empty());
        s.sync_blocking().unwrap();
        let page = s.history_page(&lane, None, 10).unwrap().unwrap();
        let ids: Vec<_> = page
            .messages
            .iter()
            .map(|m| m.message_id.as_str())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(page.messages[0].text, "1 edited");
    }
}
