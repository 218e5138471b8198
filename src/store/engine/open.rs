//! Opening the engines: the open lock, sled and its trees, the history database (made, migrated
//! from layout 1 or opened), the layout record brought to the current layout, and the handle
//! around them. No step here decides what a start after a power cut must repair: that order
//! is `recovery.rs`'s; these are the steps it calls.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::durability::{statvfs, RESERVE_ENV, STORE_RESERVE_BYTES};
use super::handle::{Shared, Sled, Store, Trees};
use super::kill_points::kill_hook;
use super::replay_bound::ReplayBound;
use super::witness_clock::WitnessClock;
use super::{check, commit, migrate};
use crate::store::base::{classify_io, u64_from, Result, StoreError, LAYOUT_VERSION, META_LAYOUT};
use crate::store::sql;

/// Serializes the opening of one data dir between processes (a gateway starting while an
/// offline `pair` runs, say): the safety copy and its putting back must never run while
/// another process is half-way through opening the same store. Held until the open is done.
pub(in crate::store) fn open_lock(dir: &Path, wait: Duration) -> Result<std::fs::File> {
    let path = dir.join(".open-check.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StoreError::open_io(dir, e))?;
    let deadline = Instant::now() + wait;
    while f.try_lock().is_err() {
        if Instant::now() >= deadline {
            return Err(StoreError::Locked {
                dir: dir.to_owned(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(f)
}

impl Store {
    /// The handle around freshly opened engines, with the test knobs read (debug builds only).
    pub(in crate::store) fn assemble(dir: &Path, cache_bytes: u64, trees: Trees) -> Store {
        // The override is a test hook: debug builds only.
        let reserve = std::env::var(RESERVE_ENV)
            .ok()
            .filter(|_| cfg!(debug_assertions))
            .and_then(|v| v.parse().ok())
            .unwrap_or(STORE_RESERVE_BYTES);
        Store {
            shared: Arc::new(Shared {
                dir: dir.to_owned(),
                cache_bytes,
                trees: RwLock::new(Some(Arc::new(trees))),
                closed_why: Default::default(),
                failed: AtomicBool::new(false),
                failure: Default::default(),
                synced_blobs: Default::default(),
                reserve,
                witness: WitnessClock::default(),
                durable_applied: Default::default(),
                checkpointing: AtomicBool::new(false),
                last_checkpoint: std::sync::Mutex::new(std::time::Instant::now()),
                kill_at: kill_hook(),
                replay: std::sync::Mutex::new(ReplayBound::new(snapshot_lsn(&dir.join("db")))),
                history_behind: Default::default(),
            }),
        }
    }

    pub(in crate::store) fn init_layout(&self) -> Result<()> {
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

    /// Bounds what a start after a crash replays: sled 0.34.7 writes its snapshot (the page
    /// table a start reads instead of the log) only when it opens (`advance_snapshot` in its
    /// `pagecache/snapshot.rs`; `snapshot_after_ops` does nothing since 0.31), so a start after
    /// a SIGKILL replays all the log written since the last open: 100,000 messages written in
    /// a burst took 0.95 s to `hello.ack` here. Once `ReplayBound` says enough log was written
    /// (`replay_bound.rs`: several times what the last reopen wrote, within a floor and a cap),
    /// this closes sled and opens it again, which writes a new snapshot; the start after a
    /// crash then replays at most that. Done only when nothing else holds the database (a
    /// checkpoint on a worker thread, a flush being awaited): the caller (the committer, after
    /// a group) tries again after its next group.
    pub fn bound_replay(&self) {
        let due = self.replay_bound().due();
        if !due || self.shared.failed.load(Ordering::SeqCst) {
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
        // sled's open writes on this thread (the zeros and the snapshot): what it wrote is
        // what this thread's write calls passed.
        let written_before = thread_written_bytes();
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
                let wrote = thread_written_bytes()
                    .zip(written_before)
                    .map(|(after, before)| after.saturating_sub(before));
                let db = dir.join("db");
                let r = self.replay_bound().reopened(snapshot_lsn(&db), wrote);
                tracing::info!(
                    records = r.records,
                    committed_bytes = r.committed,
                    log_bytes = r.log_bytes.unwrap_or(0),
                    wrote_bytes = wrote.unwrap_or(0),
                    snapshot_bytes = snapshot_bytes(&db),
                    next_bound_bytes = r.next_bound.unwrap_or(0),
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
}

/// sled's snapshot files (`snap.<log position, hex>`) in its directory, by position.
fn snapshots(db: &Path) -> Vec<(u64, std::fs::DirEntry)> {
    let mut found: Vec<_> = std::fs::read_dir(db)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let lsn = u64::from_str_radix(name.to_str()?.strip_prefix("snap.")?, 16).ok()?;
            Some((lsn, e))
        })
        .collect();
    found.sort_by_key(|(lsn, _)| *lsn);
    found
}

/// The log position sled's snapshot was taken at (its file's name): the log a start replays
/// begins there, so two of them measure the log written in between. `None` before sled wrote
/// one (a new store).
pub(in crate::store) fn snapshot_lsn(db: &Path) -> Option<u64> {
    snapshots(db).last().map(|(lsn, _)| *lsn)
}

/// The size of sled's snapshot file, for the log.
fn snapshot_bytes(db: &Path) -> u64 {
    snapshots(db)
        .last()
        .and_then(|(_, e)| e.metadata().ok())
        .map_or(0, |m| m.len())
}

/// Bytes this thread's write calls have passed to the kernel (`wchar` in
/// `/proc/thread-self/io`); `None` where the system does not say.
fn thread_written_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/io")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("wchar: "))?
        .trim()
        .parse()
        .ok()
}

/// Opens the history database of a layout-2 store: its file must be there (`create` only for
/// a new one). Damage SQLite reports is `Damaged`.
pub(in crate::store) fn open_history_file(dir: &Path, create: bool) -> Result<sql::History> {
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
        StoreError::HistoryDamaged { detail: e } => StoreError::Damaged {
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
pub(in crate::store) fn open_history(dir: &Path, s: &Sled) -> Result<sql::History> {
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
pub(in crate::store) fn open_sled(
    dir: &Path,
    cache_bytes: u64,
    lock_wait: Duration,
) -> Result<Sled> {
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
        lane_voices: tree("lane_voices")?,
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
pub(in crate::store) fn sled_config(path: &Path, cache_bytes: u64) -> sled::Config {
    sled::Config::new()
        .path(path)
        .cache_capacity(cache_bytes)
        // The hub fsyncs explicitly before anything is announced; the background flush
        // only bounds what a crash can lose of writes nobody was told about.
        .flush_every_ms(Some(1000))
        .mode(sled::Mode::LowSpace)
        // New stores compress; an older uncompressed one keeps its setting (sled refuses to
        // open it otherwise) until `rebuild::compress` has copied it.
        .use_compression(compresses(path))
}

fn is_lock_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
        || e.raw_os_error() == Some(libc::EWOULDBLOCK)
        || e.to_string().contains("lock")
}

/// Whether the sled database at `db` compresses (or will: a new one does). Read from the
/// configuration sled keeps beside its log.
pub(in crate::store) fn compresses(db: &Path) -> bool {
    // Text lines, then a CRC32 in four raw bytes: not necessarily UTF-8 as a whole.
    match std::fs::read(db.join("conf")) {
        Ok(conf) => String::from_utf8_lossy(&conf)
            .lines()
            .any(|l| l.trim() == "use_compression: true"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        // Unreadable: let sled say what is wrong with it, with the setting it was made with
        // before this version.
        Err(_) => false,
    }
}

/// Whether `dir` holds a store (sled's directory, there in every layout): what a read-only
/// command checks first, since opening a store makes one.
pub fn exists_in(dir: &Path) -> bool {
    dir.join("db").is_dir()
}
