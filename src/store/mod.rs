//! Everything on disk, in sled. No other module touches sled.
//!
//! The store speaks in intents (append these frames to the outbox, keep this message, page this
//! lane) and owns the layout, documented in docs/storage.md. Writes that belong together are one
//! commit, made atomic by its commit record (`commit.rs`), so a power cut leaves either all of a
//! change or none of it; `sync` makes
//! everything written so far durable (an fsync of sled's log) and is what the hub awaits before it
//! tells any device about a change.

mod approvals;
pub mod backup;
mod check;
mod commit;
mod devices;
mod directory;
mod fold;
mod history;
mod lane_models;
mod media;
mod migrate;
mod outbox;
mod read_marks;
mod rebuild;
pub mod search;
mod sessions;
mod sql;
pub use approvals::{ApprovalRecord, RunRecord};
pub use lane_models::LaneModel;
pub use read_marks::ReadMark;
pub use sessions::AgentSession;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};

pub use check::{EXIT_DAMAGED, WITNESS_FILE};
pub use devices::{Device, DeviceOrigin};
pub use directory::DEFAULT_CHAT_ID;
pub use history::purge_changes;
pub use media::MediaRecord;
/// The history database's directory in the data dir.
pub use sql::HISTORY_DIR;

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
    #[error("the data disk is read-only ({detail}); nothing new can be saved. The SD card may be failing: make a backup now (iris-gateway backup FILE) and check the card")]
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
    /// Journal position (u64 BE) → a history change (`sql::Op`, JSON), written in the commit
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
    witness: check::WitnessClock,
    /// The journal position the last finished checkpoint made durable in SQLite.
    durable_applied: std::sync::atomic::AtomicU64,
    checkpointing: AtomicBool,
    last_checkpoint: std::sync::Mutex<std::time::Instant>,
    kill_at: Option<String>,
    /// sled records written since sled last opened (about: `Store::commit` counts its
    /// changes): what a start after a crash would replay (`bound_replay`).
    written_since_open: std::sync::atomic::AtomicU64,
    /// `REPLAY_BOUND`, or the test hook's value.
    replay_bound: u64,
    /// Why the last apply of the journal failed, until one succeeds.
    history_behind: std::sync::Mutex<Option<String>>,
}

/// Free space below which the store refuses to write, so sled never meets a full disk halfway
/// through its log (after which it stops writing until reopened). Overridable for tests with
/// `IRIS_GATEWAY_STORE_RESERVE_BYTES` (0 lets sled itself run into the full disk; debug
/// builds only).
pub const STORE_RESERVE_BYTES: u64 = 8 << 20;
const RESERVE_ENV: &str = "IRIS_GATEWAY_STORE_RESERVE_BYTES";

impl Store {
    /// Opens (or creates) the store, waiting up to `lock_wait` for another process (a short-lived
    /// `pair` command) to let go of sled's lock.
    ///
    /// A store that was used before is checked first (`check.rs`): its files must be there, sled
    /// must open them without failing, every record must read back, and the cursor head must not
    /// be below the one last recorded beside it. If not, this returns `Damaged` and leaves every
    /// file as it was: it never resets or discards what is there.
    pub fn open(dir: &Path, cache_bytes: u64, lock_wait: Duration) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::open_io(dir, e))?;
        let _open_lock = check::open_lock(dir, lock_wait)?;
        // What this start changed before a refusal, so its message can say so honestly.
        let mut touched = Vec::new();
        if let Some(note) = rebuild::finish_or_undo(dir)? {
            touched.push(note);
        }
        let witness = check::before_open(dir).map_err(|e| check::with_touched(e, &touched))?;
        let full_check = check::Witness::wants_full_check(witness.as_ref());
        let checked_ms = match &witness {
            Some(w) if !full_check => w.checked_ms(),
            _ => crate::ids::now_ms(),
        };
        let taken = check::SafetyCopy::take(dir, witness.as_ref())
            .map_err(|e| StoreError::open_io(dir, e))?;
        if taken.put_back_leftover {
            touched.push(
                "it put sled's files back from the copy an interrupted earlier start had taken \
                 of them"
                    .into(),
            );
        }
        let (safety, why_none) = (taken.copy, taken.why_none);
        kill_point("open-copied", None);
        let mut history_opened = false;
        let opened = {
            // sled 0.34 panics on some damaged files, at open or when a damaged page is first
            // read: the guard turns that into the "damaged store" message and exit status 1
            // (after putting the safety copy back).
            let _guard = check::PanicGuard::new(dir, safety.as_ref());
            let started = std::time::Instant::now();
            open_sled(dir, cache_bytes, lock_wait).and_then(|s| {
                kill_point("open-sled-opened", None);
                check::after_open(dir, &s, witness.as_ref(), full_check)?;
                // Reading every record back leaves sled's pages resident beyond its cache; closed
                // and opened again, sled holds only what it needs. (Measured alone this did not
                // lower the idle RSS after a crash: the memory stayed in malloc's arenas until
                // the `malloc_trim` at the end of `open`; together they took it from 21 to
                // 10 MiB with a full outbox.)
                let s = if full_check {
                    drop(s);
                    open_sled(dir, cache_bytes, lock_wait)?
                } else {
                    s
                };
                kill_point("open-read-back", None);
                commit::recover(&s)?;
                kill_point("open-recovered", Some(&s.db));
                // SQLite touches the file only if there is one (a missing one is refused).
                history_opened = sql::history_path(dir).exists();
                let hist = open_history(dir, &s)?;
                kill_point("open-history-checked", Some(&s.db));
                let trees = Trees { s, hist };
                let ms = started.elapsed().as_millis();
                if full_check {
                    tracing::info!(ms, "store opened and every record read back");
                } else {
                    tracing::info!(ms, "store opened after a clean stop; full read-back skipped (one ran within the week)");
                }
                Ok(trees)
            })
        };
        let refused = |e: StoreError, mut touched: Vec<String>, put_back: bool| {
            // sled has been given the files: without a copy put back, a refusal cannot say
            // they are as they were.
            if !put_back {
                if let Some(why) = why_none {
                    touched.push(format!("{}: {why})", check::NO_COPY_NOTE));
                }
            }
            if history_opened {
                touched.push(format!(
                    "SQLite opened the history database in {} (which replays or drops what its \
                     WAL holds) and, for a layout-1 store, built it afresh from sled",
                    dir.join(sql::HISTORY_DIR).display()
                ));
            }
            check::with_touched(e, &touched)
        };
        let trees = match (opened, safety) {
            (Ok(trees), safety) => {
                if let Some(s) = safety {
                    s.discard().map_err(|e| StoreError::open_io(dir, e))?;
                }
                trees
            }
            // sled did not get the files (another process holds them): nothing to put back,
            // and putting it back would overwrite that process's files.
            (Err(e @ StoreError::Locked { .. }), Some(s)) => {
                let _ = s.discard();
                return Err(e);
            }
            (Err(e), Some(s)) => {
                // Closes sled's files (the error dropped everything opened) before they are
                // put back as they were.
                return Err(match s.restore(dir) {
                    Ok(()) => refused(e, touched, true),
                    Err(io) => refused(
                        StoreError::Damaged {
                            dir: dir.to_owned(),
                            detail: format!("{e}; and the copy of its files taken before opening could not be put back ({io}): it is in {}", dir.join(".open-check").display()),
                            touched: Vec::new(),
                        },
                        touched,
                        false,
                    ),
                });
            }
            (Err(e), None) => return Err(refused(e, touched, false)),
        };
        kill_point("open-copy-discarded", Some(&trees.db));
        let trees = if rebuild::compresses(&dir.join("db")) {
            trees
        } else {
            // Checked and migrated: copy it into a compressed sled, once (`rebuild.rs`).
            let Trees { s, hist } = trees;
            // Every tree handle goes first: the database closes with its last handle.
            let db = s.db.clone();
            drop(s);
            rebuild::compress(dir, db, cache_bytes)?;
            let s = open_sled(dir, cache_bytes, lock_wait)?;
            kill_point("rebuild-reopened", None);
            Trees { s, hist }
        };
        // The override is a test hook: debug builds only.
        let reserve = std::env::var(RESERVE_ENV)
            .ok()
            .filter(|_| cfg!(debug_assertions))
            .and_then(|v| v.parse().ok())
            .unwrap_or(STORE_RESERVE_BYTES);
        let store = Store {
            shared: Arc::new(Shared {
                dir: dir.to_owned(),
                cache_bytes,
                trees: RwLock::new(Some(Arc::new(trees))),
                closed_why: Default::default(),
                failed: AtomicBool::new(false),
                failure: Default::default(),
                synced_blobs: Default::default(),
                reserve,
                witness: check::WitnessClock::default(),
                durable_applied: Default::default(),
                checkpointing: AtomicBool::new(false),
                last_checkpoint: std::sync::Mutex::new(std::time::Instant::now()),
                kill_at: kill_hook(),
                written_since_open: Default::default(),
                replay_bound: std::env::var(REPLAY_BOUND_ENV)
                    .ok()
                    .filter(|_| cfg!(debug_assertions))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(REPLAY_BOUND),
                history_behind: Default::default(),
            }),
        };
        store.init_layout()?;
        // Entries below the journal's first are durable in SQLite (a checkpoint pruned them):
        // the volume bound of `maybe_checkpoint` counts from there, not from 0.
        {
            let t = store.t()?;
            let settled = match t.journal.first()? {
                Some((k, _)) => u64_from(&k).saturating_sub(1),
                None => t.heads().journal,
            };
            store
                .shared
                .durable_applied
                .store(settled, Ordering::SeqCst);
        }
        // What sled made durable before a crash but the history database lost or never got.
        store.apply_journal()?;
        kill_point("open-journal-applied", None);
        // What opening allocated and freed (the read-back after a crash above all: ~11 MiB
        // with a full outbox) stays in malloc's arenas; give it back, so the idle gateway is
        // as small after a crash as after a clean stop.
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free memory of glibc's allocator.
        unsafe {
            libc::malloc_trim(0);
        }
        store.record_witness(checked_ms);
        kill_point("open-witness", None);
        Ok(store)
    }

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

    /// Refuses writes while the data disk is read-only or has less than the reserve free, or
    /// after sled failed to write: checked (one `statvfs`) before anything is handed to sled,
    /// so in the usual case sled never meets a full disk and writes resume by themselves once
    /// space returns.
    pub fn writable(&self) -> Result<()> {
        self.writable_for(0)
    }

    /// As `writable`, for a write of about `bytes`: sled writes values over 128 KiB to files
    /// of their own, and one of those failing leaves sled unable to complete any flush (see
    /// `reopen`), so the room for them is checked too.
    fn writable_for(&self, bytes: u64) -> Result<()> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.failure());
        }
        self.disk_ok(bytes)
    }

    /// Whether the disk (not sled) could take a write of `bytes` now: not read-only, and the
    /// reserve plus twice the write free.
    pub fn disk_ok(&self, bytes: u64) -> Result<()> {
        let st = statvfs(&self.shared.dir)?;
        if st.read_only {
            return Err(StoreError::ReadOnly {
                detail: format!(
                    "{} is on a read-only file system",
                    self.shared.dir.display()
                ),
            });
        }
        // A reserve of 0 (the test knob) lets sled itself run into the full disk.
        let reserve = self.shared.reserve;
        if reserve > 0 && st.available < reserve.saturating_add(bytes.saturating_mul(2)) {
            return Err(StoreError::Full {
                detail: format!(
                    "{} free in {}; the gateway keeps {} free for its store",
                    human_bytes(st.available),
                    self.shared.dir.display(),
                    human_bytes(reserve)
                ),
            });
        }
        Ok(())
    }

    /// True once a write or flush failed inside sled: it refuses every write from then on, and
    /// only `reopen` (when the disk works again) resumes.
    pub fn needs_reopen(&self) -> bool {
        self.shared.failed.load(Ordering::SeqCst) || self.t().is_err()
    }

    /// What the failure that stopped sled was (full, read-only, other), as an error to report.
    fn failure(&self) -> StoreError {
        let saved = self.shared.failure.lock().ok();
        match saved.as_deref() {
            Some(Some(StoreError::Full { detail })) => StoreError::Full {
                detail: detail.clone(),
            },
            Some(Some(StoreError::ReadOnly { detail })) => StoreError::ReadOnly {
                detail: detail.clone(),
            },
            Some(Some(other)) => {
                StoreError::Closed(format!("a write to the store failed: {other}"))
            }
            _ => StoreError::Closed("a write to the store failed".into()),
        }
    }

    /// Notes a failed sled write or flush (sled has stopped writing).
    fn note_failure<T>(&self, r: std::result::Result<T, sled::Error>) -> Result<T> {
        r.map_err(|e| {
            let is_io = matches!(e, sled::Error::Io(_));
            let e = StoreError::from(e);
            if is_io {
                if let Ok(mut saved) = self.shared.failure.lock() {
                    if saved.is_none() {
                        *saved = Some(match &e {
                            StoreError::Full { detail } => StoreError::Full {
                                detail: detail.clone(),
                            },
                            StoreError::ReadOnly { detail } => StoreError::ReadOnly {
                                detail: detail.clone(),
                            },
                            other => StoreError::Closed(other.to_string()),
                        });
                    }
                }
                self.shared.failed.store(true, Ordering::SeqCst);
            }
            e
        })
    }

    /// As `note_failure`, for the fsync that follows sled's flush: after a failed fsync the
    /// kernel may have dropped the dirty pages, so nothing later can be trusted either.
    fn note_io_failure<T>(&self, r: std::io::Result<T>) -> Result<T> {
        r.map_err(sled::Error::Io)
            .or_else(|e| self.note_failure(Err(e)))
    }

    /// Closes the database and opens it again from disk: after a storage failure, what is on
    /// disk is what was made durable, and the new sled writes again. Whatever a failed flush
    /// had not written is dropped, as a power cut would (nobody was told it was stored).
    /// Waits (asynchronously) for other tasks to finish with the old database, which holds
    /// sled's file lock until the last handle goes.
    ///
    /// sled 0.34 fails in two ways. Usually a failed log write makes it refuse every write
    /// (its "global error"): then it can be closed and reopened. But when writing a large
    /// value's own file fails, it leaks a writer on its log buffer instead: writes still seem
    /// to work, no flush ever completes again, and closing it would wait forever for that
    /// flush. That case is `Stuck`: only a new process can open the store again.
    pub async fn reopen(&self) -> Result<()> {
        if let Ok(t) = self.t() {
            if self.shared.failed.load(Ordering::SeqCst) && poke(&t).is_ok() {
                return Err(StoreError::Stuck);
            }
        }
        let old = self
            .shared
            .trees
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(old) = old {
            // Wakes any flush still waiting on the failed sled (see `sync`), so its threads
            // let go of the database and its file lock.
            let _ = poke(&old);
        }
        let dir = &self.shared.dir;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let opened = loop {
            match open_sled(dir, self.shared.cache_bytes, Duration::ZERO) {
                Err(StoreError::Locked { .. }) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => break other,
            }
        };
        // What was checked at open stands: the history database is opened as it is.
        let opened = opened.and_then(|s| {
            commit::recover(&s)?;
            let hist = open_history_file(dir, false)?;
            Ok(Trees { s, hist })
        });
        match opened {
            Ok(trees) => {
                *self
                    .shared
                    .trees
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(trees));
                self.shared.failed.store(false, Ordering::SeqCst);
                self.shared.written_since_open.store(0, Ordering::SeqCst);
                if let Ok(mut saved) = self.shared.failure.lock() {
                    *saved = None;
                }
                if let Ok(mut synced) = self.shared.synced_blobs.lock() {
                    synced.clear();
                }
                // A reopen after a write failure reads nothing back: the last full check stands.
                let checked = self.shared.witness.checked_ms();
                self.record_witness(checked);
                Ok(())
            }
            Err(e) => {
                if let Ok(mut why) = self.shared.closed_why.lock() {
                    *why = e.to_string();
                }
                Err(e)
            }
        }
    }

    /// Bounds what a start after a crash replays: sled 0.34.7 writes its snapshot (the page
    /// table a start reads instead of the log) only when it opens (`advance_snapshot` in its
    /// `pagecache/snapshot.rs`; `snapshot_after_ops` does nothing since 0.31), so a start after
    /// a SIGKILL replays every record written since the last open: 100,000 messages written in
    /// a burst took 0.95 s to `hello.ack` here. Once `REPLAY_BOUND` records were written, this
    /// closes sled and opens it again, which writes a new snapshot; the start after a crash
    /// then replays at most that many records. Done only when nothing else holds the database
    /// (a checkpoint on a worker thread, a flush being awaited): the caller (the committer,
    /// after a group) tries again after its next group. Its cost is the replay it saves a
    /// crash start, bounded by `REPLAY_BOUND` (docs/benchmarks.md, "A start after a burst").
    pub fn bound_replay(&self) {
        let written = self.shared.written_since_open.load(Ordering::SeqCst);
        if written < self.shared.replay_bound || self.shared.failed.load(Ordering::SeqCst) {
            return;
        }
        let mut slot = self
            .shared
            .trees
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Under the write lock nobody can take a new handle; one still held elsewhere makes
        // `try_unwrap` give the trees back.
        let Some(current) = slot.take() else {
            return;
        };
        let Trees { s, hist } = match Arc::try_unwrap(current) {
            Ok(trees) => trees,
            Err(current) => {
                *slot = Some(current);
                return;
            }
        };
        let started = std::time::Instant::now();
        let durable_journal = s.durable_journal.load(Ordering::SeqCst);
        // sled flushes and lets go of its files (and its lock) with its last handle.
        drop(s);
        let dir = &self.shared.dir;
        let reopened =
            open_sled(dir, self.shared.cache_bytes, Duration::from_secs(1)).and_then(|s| {
                // What was durable stays so; the new snapshot's name made durable like the log.
                s.durable_journal.store(durable_journal, Ordering::SeqCst);
                s.db_file
                    .sync_all()
                    .and_then(|()| crate::atomic_file::sync_dir(&dir.join("db")))
                    .map_err(|e| StoreError::open_io(dir, e))?;
                Ok(s)
            });
        match reopened {
            Ok(s) => {
                *slot = Some(Arc::new(Trees { s, hist }));
                self.shared.written_since_open.store(0, Ordering::SeqCst);
                tracing::info!(
                    records = written,
                    ms = started.elapsed().as_millis() as u64,
                    "sled reopened to write its snapshot: a start after a crash replays only what follows"
                );
            }
            Err(e) => {
                // As after a storage failure: the storage monitor reopens it once it can.
                tracing::warn!("reopening sled to write its snapshot failed: {e}");
                if let Ok(mut why) = self.shared.closed_why.lock() {
                    *why = e.to_string();
                }
            }
        }
    }

    fn init_layout(&self) -> Result<()> {
        let t = self.t()?;
        match t.meta.get(META_LAYOUT)?.map(|v| u64_from(&v)) {
            Some(found) if found > LAYOUT_VERSION => return Err(StoreError::TooNew { found }),
            // Layout 1 was migrated to 2 by `open_history`.
            Some(2) => {
                self.writable()?;
                commit::upgrade_to_layout3(&t)?;
            }
            Some(_) => {}
            None => {
                self.writable()?;
                // A new store: the commit record comes first, as in the upgrade.
                commit::upgrade_to_layout3(&t)?;
            }
        }
        self.ensure_default_channel()?;
        self.note_failure(t.db.flush())?;
        Ok(())
    }

    /// The last cursor assigned (0 before the first frame).
    pub fn cursor_head(&self) -> Result<u64> {
        Ok(self.t()?.heads().cursor)
    }

    /// Makes every write so far durable. Runs sled's fsync on sled's own thread pool, so the
    /// event loop keeps serving while the SD card catches up.
    pub async fn sync(&self) -> Result<()> {
        let t = self.t()?;
        if self.shared.failed.load(Ordering::SeqCst) {
            // After a failed write no flush can succeed, and one could wait forever (see
            // `reopen`): report the failure instead.
            return Err(self.failure());
        }
        // Read before the flush: everything committed so far is covered by it.
        let head = self.cursor_head()?;
        let journal = t.heads().journal;
        let mut flush = Box::pin(t.db.flush_async());
        let flushed = loop {
            tokio::select! {
                r = &mut flush => break r.map(|_| ()),
                _ = tokio::time::sleep(FLUSH_CHECK) => {
                    // sled 0.34 does not wake a flush waiting for a log write that failed
                    // (its `exit_reservation` path stores the error without notifying), so
                    // a flush after ENOSPC could wait forever and stall every commit (found
                    // by tests/storage_faults.rs). A write attempt returns the stored error
                    // at once and wakes the waiters; when sled is healthy it is one tiny record.
                    if let Err(e) = poke(&t) {
                        break Err(e);
                    }
                }
            }
        };
        drop(flush);
        self.note_failure(flushed)?;
        let shared = self.shared.clone();
        let synced = {
            let t = t.clone();
            tokio::task::spawn_blocking(move || fsync_files(&t, &shared))
        }
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        self.note_io_failure(synced)?;
        t.durable_journal.fetch_max(journal, Ordering::SeqCst);
        self.witness_durable(head, false);
        if self.shared.kill_at.as_deref() == Some("before-apply") {
            self.kill_if_unapplied();
        }
        // Applied now unless a turn is waiting for its answer: its user message then goes to
        // the history database with the reply, one transaction for the turn instead of two
        // (each writes the lane's index pages, the id index, FTS5's structure and `applied`
        // again). Reads catch up first either way (`read_history`, `query`). On a worker
        // thread: its cost follows the changes (a channel's deletion is thousands of index
        // removals), and the event loop waits on nothing whose cost grows with the data; the
        // caller (the committer) awaits it, so the health it reports includes its result.
        if t.turns.is_empty() {
            let store = self.clone();
            let _ = tokio::task::spawn_blocking(move || store.apply_or_note()).await;
        }
        self.maybe_checkpoint();
        Ok(())
    }

    /// Runs `f` on the history database's query thread, after bringing the database up to
    /// date with the journal there (read-your-writes, as `read_history`); returns what it gave
    /// and how long the thread spent on it (the device's query budget, `hub/budget.rs`). The
    /// event loop only awaits: the queue is first in first out, and each device has at most
    /// one query in it (the hub answers a device's frames one at a time), so one device's
    /// queries cannot keep another's waiting for more than one of them.
    async fn query<T: Send + 'static>(
        &self,
        f: impl FnOnce(&sql::Query<'_>) -> Result<T> + Send + 'static,
    ) -> Result<(T, Duration)> {
        let t = self.t()?;
        let store = self.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        t.hist.run(Box::new(move |q| {
            store.catch_up();
            // Timed after the catch-up: a device pays for its query, not for others' writes.
            let started = std::time::Instant::now();
            let r = f(q).map(|v| (v, started.elapsed()));
            let _ = tx.send(r);
        }))?;
        drop(t);
        rx.await
            .map_err(|_| StoreError::Closed("a history query did not finish".into()))?
    }

    /// `query` on this thread, through the writing connection (tools, tests, benchmarks).
    fn query_blocking<T>(&self, f: impl FnOnce(&sql::Query<'_>) -> Result<T>) -> Result<T> {
        self.read_history()?.hist.read(f)
    }

    /// Applies what is durable but not yet in the history database (off the event loop).
    fn catch_up(&self) {
        if let Ok(t) = self.t() {
            if t.durable_journal.load(Ordering::SeqCst) > t.hist.applied().unwrap_or(0) {
                self.apply_or_note();
            }
        }
    }

    /// The trees, with the history database first brought up to date with the journal. Every
    /// read of history goes through here: a user message waits for its turn's reply (`sync`),
    /// and a device still sees it in the `history` it asks for right after its
    /// `read.receipt`.
    fn read_history(&self) -> Result<Arc<Trees>> {
        let t = self.t()?;
        if t.durable_journal.load(Ordering::SeqCst) > t.hist.applied()? {
            // A failure is noted (`history_behind`, the gateway reports `degraded`); the
            // read still answers with what the history database has.
            self.apply_or_note();
        }
        Ok(t)
    }

    /// Applies the journal; a failure (the disk full under SQLite) does not fail the sync:
    /// what sled made durable is stored, and will reach the history database when the disk
    /// works (`retry_apply`). Until then `history_behind` says why, and the gateway reports
    /// `degraded`.
    fn apply_or_note(&self) {
        let result = self.apply_journal();
        let mut behind = self
            .shared
            .history_behind
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match result {
            Ok(()) => *behind = None,
            Err(e) => {
                if behind.is_none() {
                    tracing::warn!("the history database is behind the store: {e}");
                }
                *behind = Some(e.to_string());
            }
        }
    }

    /// Why the history database lacks changes that are durable in sled, if it does.
    pub fn history_behind(&self) -> Option<String> {
        self.shared
            .history_behind
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Applies what the history database lacks (after a failure to): `Ok` once it has it all.
    pub fn retry_apply(&self) -> Result<()> {
        self.apply_or_note();
        match self.history_behind() {
            None => Ok(()),
            Some(why) => Err(StoreError::Closed(why)),
        }
    }

    /// Test hook: `IRIS_GATEWAY_KILL_AT=before-apply` ends the process with SIGKILL at the
    /// first `sync` that has history changes to apply, after their sled commit is durable and
    /// before the history database has them, so the tests can prove the journal repairs it at
    /// the next start.
    fn kill_if_unapplied(&self) {
        let pending = self
            .t()
            .ok()
            .and_then(|t| Some(t.durable_journal.load(Ordering::SeqCst) > t.hist.applied().ok()?));
        if pending == Some(true) {
            kill_now();
        }
    }

    /// Applies the journal entries the history database does not have yet, in batches of one
    /// SQLite transaction each. Called only once they are durable in sled (`sync`, and at
    /// open): the history database must never hold a change that sled could lose.
    fn apply_journal(&self) -> Result<()> {
        let t = self.t()?;
        // Only what sled made durable: the history database must never hold a change a crash
        // could take back from sled (and past the head lies what a failed commit wrote).
        let last = t.durable_journal.load(Ordering::SeqCst);
        let mut applied = t.hist.applied()?;
        while applied < last {
            let mut batch = Vec::new();
            for item in t
                .journal
                .range((applied + 1).to_be_bytes()..=last.to_be_bytes())
                .take(APPLY_BATCH)
            {
                let (k, v) = item?;
                batch.push((u64_from(&k), from_json::<sql::Op>(&v, "journal entry")?));
            }
            let Some(&(end, _)) = batch.last() else {
                break;
            };
            t.hist.apply(&batch)?;
            applied = end;
        }
        Ok(())
    }

    /// Drops the journal entries a finished checkpoint made durable in SQLite; when the last
    /// checkpoint is `CHECKPOINT_EVERY` old, applies the journal and starts a checkpoint on a
    /// worker thread: the one fsync of the history database, off the event loop. A backlog of
    /// `APPLY_BATCH` entries is applied at once, so a read never has more than that to catch
    /// up on (`read_history`).
    fn maybe_checkpoint(&self) {
        let durable = self.shared.durable_applied.load(Ordering::SeqCst);
        if durable > 0 {
            let _ = self.prune_journal(durable);
        }
        // The journal entries not yet durable in SQLite: what sled holds of history and what a
        // start after a crash reads back and SQLite replays from its WAL. A burst (a restore,
        // an automation storm) checkpoints by volume, not only every 5 minutes.
        let unsettled = self.t().ok().map_or(0, |t| {
            t.durable_journal
                .load(Ordering::SeqCst)
                .saturating_sub(durable)
        });
        let due = {
            let last = self
                .shared
                .last_checkpoint
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            last.elapsed() >= CHECKPOINT_EVERY || unsettled >= CHECKPOINT_AFTER_ENTRIES
        };
        let backlog = self.t().ok().and_then(|t| {
            let applied = t.hist.applied().ok()?;
            Some(
                t.durable_journal
                    .load(Ordering::SeqCst)
                    .saturating_sub(applied),
            )
        });
        let checkpoint = due && !self.shared.checkpointing.swap(true, Ordering::SeqCst);
        if !checkpoint {
            if backlog.is_some_and(|n| n >= APPLY_BATCH as u64) {
                let store = self.clone();
                tokio::task::spawn_blocking(move || store.apply_or_note());
            }
            return;
        }
        let Ok(t) = self.t() else {
            self.shared.checkpointing.store(false, Ordering::SeqCst);
            return;
        };
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            store.apply_or_note();
            let shared = &store.shared;
            match t.hist.checkpoint() {
                Ok(Some(p)) => shared.durable_applied.store(p, Ordering::SeqCst),
                Ok(None) => {}
                Err(e) => tracing::warn!("history checkpoint failed: {e}"),
            }
            *shared
                .last_checkpoint
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = std::time::Instant::now();
            shared.checkpointing.store(false, Ordering::SeqCst);
        });
    }

    /// Removes journal entries up to `upto` (durable in SQLite): sled writes without a flush of
    /// their own, since an entry that comes back after a crash is skipped as already applied.
    fn prune_journal(&self, upto: u64) -> Result<()> {
        let t = self.t()?;
        while let Some((k, _)) = t.journal.first()? {
            if u64_from(&k) > upto {
                break;
            }
            self.writable()?;
            t.journal.remove(k)?;
        }
        Ok(())
    }

    /// A checkpoint now, on this thread, then the journal pruned (graceful stop, tools and
    /// benchmarks that fill a store without the gateway's periodic checkpoints).
    pub fn checkpoint_blocking(&self) -> Result<()> {
        let t = self.t()?;
        if let Some(p) = t.hist.checkpoint()? {
            self.shared.durable_applied.store(p, Ordering::SeqCst);
            self.prune_journal(p)?;
        }
        Ok(())
    }

    /// Blocking variant for shutdown and the command-line tools.
    pub fn sync_blocking(&self) -> Result<()> {
        let t = self.t()?;
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.failure());
        }
        let head = self.cursor_head()?;
        let journal = t.heads().journal;
        self.note_failure(t.db.flush().map(|_| ()))?;
        self.note_io_failure(fsync_files(&t, &self.shared))?;
        t.durable_journal.fetch_max(journal, Ordering::SeqCst);
        self.witness_durable(head, true);
        self.apply_or_note();
        Ok(())
    }

    /// Saves a lane's todo list. Not awaited for durability: `todo.update` is ephemeral, the
    /// saved copy only lets a restarted gateway give a better snapshot than none.
    pub fn put_todos(&self, lane: &Lane, todos: &[TodoItem]) -> Result<()> {
        self.writable()?;
        let key = history::lane_prefix(lane);
        if todos.is_empty() {
            self.t()?.todos.remove(key)?;
        } else {
            self.t()?.todos.insert(key, to_json(&todos))?;
        }
        Ok(())
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

/// Journal entries applied per SQLite transaction.
const APPLY_BATCH: usize = 256;
/// How often the journal is applied to the history database and checkpointed (fsynced)
/// while history changes: bounds the journal in sled, the WAL, and what a start after a crash
/// applies; it is the only fsync SQLite does. Each checkpoint writes every page the changes
/// since touched once, so a longer interval writes the SD card less (docs/storage.md).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(300);
/// Journal entries after which a checkpoint is due whatever the time: bounds the journal in
/// sled, the WAL and what a start after a crash reads back during a burst of writes (a
/// household's 5 minutes are a few dozen entries).
const CHECKPOINT_AFTER_ENTRIES: u64 = 5_000;
const KILL_ENV: &str = "IRIS_GATEWAY_KILL_AT";
/// sled records written after which `bound_replay` reopens sled (its snapshot): what a start
/// after a crash replays at most. About 300 demo turns (a commit counts twice its changes plus
/// one); a reopen then costs what replaying them costs (docs/benchmarks.md, "A start after a
/// burst"). With 20,000 a start after a 100,000-message burst still took 0.62 s here.
const REPLAY_BOUND: u64 = 5_000;
/// Test hook (debug builds only): a smaller `REPLAY_BOUND`, so a short burst reopens sled.
const REPLAY_BOUND_ENV: &str = "IRIS_GATEWAY_REPLAY_BOUND";

/// A place where a start can be cut short by the test hook `IRIS_GATEWAY_KILL_AT`.
#[derive(Debug, Clone, Copy)]
pub struct KillPoint {
    pub name: &'static str,
    /// A start killed at this point first leaves the state the hook needs (a start that puts
    /// a safety copy back needs one left behind).
    pub after: Option<&'static str>,
}

const fn point(name: &'static str) -> KillPoint {
    KillPoint { name, after: None }
}

/// Every kill point of a start, in the order a start meets them (open, migration from layout
/// 1, the compression rebuild, the upgrade to layout 3, the server's recovery). The tests in
/// tests/start_crash.rs kill a start at each of them and require the next start to serve
/// everything that was acknowledged, so a step added here is covered at once. A point that
/// flushes sled first stands for sled's background flush having run just before the power went.
pub const START_KILL_POINTS: &[KillPoint] = &[
    // A complete copy of `db/` is in `.open-check/`; sled has not seen the files.
    point("open-copied"),
    // sled has opened the files: written its snapshot, cut the torn tail of its log.
    point("open-sled-opened"),
    // Half of the files of a copy put back (after a start killed with its copy in place).
    KillPoint {
        name: "put-back-partial",
        after: Some("open-sled-opened"),
    },
    // Every record read back, sled opened again.
    point("open-read-back"),
    // A commit cut short dropped, the last record's redo applied (flushed).
    point("open-recovered"),
    // Layout 1: the history database built and checkpointed; sled still layout 1.
    point("migrate-history-built"),
    // Layout 1: frame lists rewritten in sled (flushed); the layout record still says 1.
    point("migrate-frames"),
    // Layout 1: the layout record says 2 (flushed); the old trees are still there.
    point("migrate-layout2"),
    // The history database opened and checked against sled's journal.
    point("open-history-checked"),
    // The safety copy removed.
    point("open-copy-discarded"),
    // The compressed copy written to `db.rebuild/`, not yet fsynced.
    point("rebuild-copied"),
    // The copy fsynced, the witness no longer claims a snapshot; nothing swapped yet.
    point("rebuild-synced"),
    // `db/` renamed to `db.uncompressed/`, the copy not yet renamed to `db/`.
    point("rebuild-old-aside"),
    // The copy is `db/`; the old files are still beside it.
    point("rebuild-swapped"),
    // The old files removed; sled has not opened the copy yet, so it has no snapshot.
    point("rebuild-done"),
    // sled opened the copy (its first snapshot).
    point("rebuild-reopened"),
    // Layout 2 → 3: the commit record written (flushed), the layout record still says 2.
    point("layout3-record"),
    // Layout 3 written and flushed; the default channel not checked yet.
    point("layout3-done"),
    // The journal applied to the history database.
    point("open-journal-applied"),
    // The witness written: the store is open.
    point("open-witness"),
    // The server settled the turns the last run left (their notices committed and synced).
    point("start-recovered"),
];

/// Test hook: ends the process as a power cut would at the start's kill point `name`, when
/// `IRIS_GATEWAY_KILL_AT` names it (debug builds only). With `flush`, sled's writes so far are
/// made to reach the file first, as its background flush might have done.
pub fn kill_point(name: &str, flush: Option<&sled::Db>) {
    debug_assert!(
        START_KILL_POINTS.iter().any(|p| p.name == name),
        "kill point {name} is not in START_KILL_POINTS"
    );
    if kill_hook().as_deref() == Some(name) {
        if let Some(db) = flush {
            let _ = db.flush();
        }
        kill_now();
    }
}

/// The test hook `IRIS_GATEWAY_KILL_AT` (tests/durability.rs): where to kill the process with
/// SIGKILL, to prove what a crash there leaves. Debug builds only: the release binary people
/// run never reads it.
fn kill_hook() -> Option<String> {
    if cfg!(debug_assertions) {
        std::env::var(KILL_ENV).ok()
    } else {
        None
    }
}

/// Ends the process as a power cut would, for the kill hooks.
fn kill_now() {
    // SAFETY: raising a signal in our own process.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
}

/// How long a flush may take before `sync` checks that sled can still write at all.
const FLUSH_CHECK: Duration = Duration::from_secs(2);
const META_FLUSH_PROBE: &[u8] = b"flush_probe";

/// Makes sled's flushed writes durable. sled 0.34 "flushes" with `sync_file_range` on Linux:
/// the written pages reach the disk, but not the file's new size and extents (file system
/// metadata) nor the drive's cache, and its files for values over 128 KiB are never fsynced;
/// only its own flusher thread fsyncs the log, once a second. A power cut could therefore take
/// back writes a device was told were stored: tests/storage_faults.rs found it (an ext4 error
/// right after acknowledged writes left an empty store). fsync works on any descriptor of the
/// file, so the store keeps its own.
fn fsync_files(t: &Trees, shared: &Shared) -> std::io::Result<()> {
    t.db_file.sync_all()?;
    let mut synced = shared
        .synced_blobs
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut present = std::collections::HashSet::new();
    let mut new = false;
    for entry in std::fs::read_dir(&t.blobs_dir)? {
        let name = entry?.file_name();
        if !synced.contains(&name) {
            match std::fs::File::open(t.blobs_dir.join(&name)) {
                Ok(f) => f.sync_all()?,
                // Removed by sled in the meantime (its page was rewritten).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            new = true;
        }
        present.insert(name);
    }
    if new {
        std::fs::File::open(&t.blobs_dir)?.sync_all()?;
    }
    *synced = present;
    Ok(())
}

/// One tiny write: fails at once with sled's stored error once sled has stopped writing, and
/// then also wakes whatever waits for a log write that will never complete.
fn poke(t: &Trees) -> std::result::Result<(), sled::Error> {
    t.meta.insert(META_FLUSH_PROBE, &[]).map(|_| ())
}

/// Opens the history database of a layout-2 store: its file must be there (`create` only for
/// a new one). Damage SQLite reports is `Damaged`.
fn open_history_file(dir: &Path, create: bool) -> Result<sql::History> {
    let path = sql::history_path(dir);
    if !create && !path.exists() {
        return Err(StoreError::Damaged {
            touched: Vec::new(),
            dir: dir.to_owned(),
            detail: format!("its history database {} is missing", path.display()),
        });
    }
    let disk_read_only = || statvfs(dir).map(|s| s.read_only).unwrap_or(true);
    sql::History::open(&path, create).map_err(|e| match e {
        StoreError::History(e) if sql::is_damage(&e) => StoreError::Damaged {
            touched: Vec::new(),
            dir: dir.to_owned(),
            detail: format!(
                "its history database {} cannot be read ({e})",
                path.display()
            ),
        },
        // SQLite opens a file whose header names a format it cannot write read-only.
        StoreError::ReadOnly { detail } if !disk_read_only() => StoreError::Damaged {
            touched: Vec::new(),
            dir: dir.to_owned(),
            detail: format!(
                "its history database {} cannot be written ({detail}): its header is damaged",
                path.display()
            ),
        },
        e => e,
    })
}

/// The history database for an opened sled: made for a new store, migrated from a layout-1
/// store, or opened and looked at (bounded: the newest messages, the journal positions).
fn open_history(dir: &Path, s: &Sled) -> Result<sql::History> {
    let layout = s.meta.get(META_LAYOUT)?.map(|v| u64_from(&v));
    let hist = match layout {
        Some(found) if found > LAYOUT_VERSION => return Err(StoreError::TooNew { found }),
        Some(1) => migrate::from_layout1(dir, s)?,
        None => {
            if sql::history_path(dir).exists() {
                return Err(StoreError::Damaged {
                    touched: Vec::new(),
                    dir: dir.to_owned(),
                    detail: format!(
                        "it has no layout record but a history database ({}) is there",
                        sql::history_path(dir).display()
                    ),
                });
            }
            open_history_file(dir, true)?
        }
        Some(_) => open_history_file(dir, false)?,
    };
    check::history(dir, s, &hist)?;
    migrate::drop_leftovers(s)?;
    Ok(hist)
}

/// Opens sled and every tree (no checks: `open` checks, `reopen` trusts what it checked).
fn open_sled(dir: &Path, cache_bytes: u64, lock_wait: Duration) -> Result<Sled> {
    let deadline = std::time::Instant::now() + lock_wait;
    let db = loop {
        let attempt = sled_config(&dir.join("db"), cache_bytes).open();
        match attempt {
            Ok(db) => break db,
            Err(sled::Error::Io(e)) if is_lock_error(&e) => {
                if std::time::Instant::now() >= deadline {
                    return Err(StoreError::Locked {
                        dir: dir.to_owned(),
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(sled::Error::Io(e)) if classify_io(&e).is_some() => {
                return Err(classify_io(&e).expect("classified"))
            }
            Err(source) => return Err(open_failure(dir, source)),
        }
    };
    // sled writes its configuration file (and a new store's log) without an fsync: after an
    // ext4 error or a power cut right after the first start the file could come back empty,
    // and sled refuses a store whose configuration it cannot read. Cheap, once per open.
    let db_dir = dir.join("db");
    let synced = std::fs::File::open(db_dir.join("conf"))
        .and_then(|f| f.sync_all())
        .and_then(|()| std::fs::File::open(&db_dir)?.sync_all());
    if let Err(e) = synced {
        match classify_io(&e) {
            // Nothing can be written: the checks and the `degraded` state say what to do.
            Some(StoreError::ReadOnly { .. }) => {}
            _ => return Err(StoreError::open_io(dir, e)),
        }
    }
    let tree = |name: &str| db.open_tree(name).map_err(|e| open_failure(dir, e));
    let meta = tree("meta")?;
    let heads = commit::load_heads(&meta).map_err(|e| match e {
        StoreError::Sled(source) | StoreError::Open { source, .. } => open_failure(dir, source),
        StoreError::Corrupt { what, source } => StoreError::Damaged {
            touched: Vec::new(),
            dir: dir.to_owned(),
            detail: format!("its {what} cannot be read ({source})"),
        },
        other => other,
    })?;
    Ok(Sled {
        // What sled recovered is on disk: durable.
        durable_journal: heads.journal.into(),
        heads: std::sync::Mutex::new(heads),
        meta,
        outbox: tree("outbox")?,
        journal: tree("journal")?,
        channels: tree("channels")?,
        devices: tree("devices")?,
        tokens: tree("tokens")?,
        todos: tree("todos")?,
        sessions: tree("sessions")?,
        read_marks: tree("read_marks")?,
        lane_models: tree("lane_models")?,
        turns: tree("turns")?,
        message_frames: tree("message_frames")?,
        frame_of: tree("frame_of")?,
        media: tree("media")?,
        media_refs: tree("media_refs")?,
        blobs: tree("blobs")?,
        db_file: std::fs::File::open(dir.join("db").join("db"))
            .map_err(|e| StoreError::open_io(dir, e))?,
        blobs_dir: dir.join("db").join("blobs"),
        db,
    })
}

/// What sled refusing to open means: damage (its files do not read back), or something else
/// (permissions, a missing directory).
fn open_failure(dir: &Path, source: sled::Error) -> StoreError {
    match source {
        sled::Error::Corruption { .. }
        | sled::Error::ReportableBug(_)
        | sled::Error::Unsupported(_) => StoreError::Damaged {
            touched: Vec::new(),
            dir: dir.to_owned(),
            detail: format!("sled cannot open it ({source})"),
        },
        source => StoreError::Open {
            dir: dir.to_owned(),
            source,
        },
    }
}

/// The one sled configuration (also used to build a restored store).
fn sled_config(path: &Path, cache_bytes: u64) -> sled::Config {
    sled::Config::new()
        .path(path)
        .cache_capacity(cache_bytes)
        // The hub fsyncs explicitly before anything is announced; the background flush
        // only bounds what a crash can lose of writes nobody was told about.
        .flush_every_ms(Some(1000))
        .mode(sled::Mode::LowSpace)
        // New stores compress; an older uncompressed one keeps its setting (sled refuses to
        // open it otherwise) until `rebuild::compress` has copied it.
        .use_compression(rebuild::compresses(path))
}

struct DiskState {
    available: u64,
    read_only: bool,
}

fn statvfs(dir: &Path) -> Result<DiskState> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
        StoreError::Sled(sled::Error::Unsupported(
            "a data dir path with a NUL byte".into(),
        ))
    })?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` a properly sized, writable struct.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(classify_io(&e).unwrap_or(StoreError::Sled(sled::Error::Io(e))));
    }
    Ok(DiskState {
        available: (st.f_bavail as u64).saturating_mul(st.f_frsize as u64),
        read_only: st.f_flag & libc::ST_RDONLY != 0,
    })
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

fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
        || e.raw_os_error() == Some(libc::EWOULDBLOCK)
        || e.to_string().contains("lock")
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
