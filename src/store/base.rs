//! The store's base, shared by every room: its errors, the JSON and big-endian encodings of
//! what it keeps, and the layout version. Imports nothing else of the store, so any room may
//! use it without a loop.

use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Serialize};

/// Layout version written at creation. 1: everything in sled (up to 0.1.0 of early 2026);
/// 2: history, its ids, search and media uses in SQLite (`sql.rs`), the rest in sled; 3: the
/// same trees, committed with a commit record instead of sled transactions (`engine/commit.rs`). A
/// layout-1 store is migrated on open (`engine/migrate.rs`), a layout-2 one upgraded
/// (`commit::upgrade_to_layout3`).
pub(in crate::store) const LAYOUT_VERSION: u64 = 3;
pub(in crate::store) const META_LAYOUT: &[u8] = b"layout_version";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the data directory {dir} is in use by another process (is the gateway already running?)"
    )]
    Locked { dir: PathBuf },
    #[error("cannot open the store in {dir}: {source}. The data may be damaged: restore a backup, or move the directory aside to start fresh")]
    Open { dir: PathBuf, source: sled::Error },
    /// Found at open: the files are damaged or older than the store last seen. Nothing was
    /// changed on disk (see `engine/check.rs`).
    #[error("{}", damaged_message(.dir, .detail, .touched))]
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
pub(in crate::store) fn classify_io(io: &std::io::Error) -> Option<StoreError> {
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

pub type Result<T> = std::result::Result<T, StoreError>;

impl StoreError {
    /// A file operation on the data dir failed while opening (or migrating, or rebuilding)
    /// the store.
    pub(in crate::store) fn open_io(dir: &Path, e: std::io::Error) -> StoreError {
        StoreError::Open {
            dir: dir.to_owned(),
            source: sled::Error::Io(e),
        }
    }
}

/// The user-facing text of `StoreError::Damaged`. `touched`: what the start changed before it
/// found the damage; the message says "nothing" only when that is so.
pub fn damaged_message(dir: &Path, detail: &str, touched: &[String]) -> String {
    let changed = if touched.is_empty() {
        "Nothing was changed or removed.".to_owned()
    } else {
        format!(
            "Before it found that, this start changed: {}; nothing else was changed or removed.",
            touched.join("; ")
        )
    };
    format!(
        "the store in {db} is damaged: {detail}. {changed} To recover, restore your latest \
         backup with `iris-gateway restore FILE --data-dir {dir}` (backups are made with \
         `iris-gateway backup FILE`; restore keeps the damaged files aside). Without a backup, \
         move {dir} aside (keep it) to start with an empty store",
        db = dir.join("db").display(),
        dir = dir.display(),
    )
}

pub(in crate::store) fn u64_from(v: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = v.len().min(8);
    b[8 - n..].copy_from_slice(&v[v.len() - n..]);
    u64::from_be_bytes(b)
}

pub(in crate::store) fn to_json<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("store records always serialise")
}

pub(in crate::store) fn from_json<T: DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt { what, source })
}
