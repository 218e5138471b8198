//! The witness: a small file beside the store (`DATA_DIR/store-witness.json`) that remembers
//! what sled itself cannot prove after a power cut: the highest cursor known durable, whether
//! sled had a snapshot, when the store was last read back in full, and whether the last run
//! stopped cleanly. Written atomically after each open, every 30 s while cursors advance, and
//! at the clean close (`Store::close_cleanly`); `check.rs` holds a start to it.
//!
//! The witness claims only what is durable (format 2): sled's snapshot once its name is
//! fsynced, and not across the compression rebuild (`withdraw_snapshot_claim`). A power cut at
//! any step of a start must leave a store the next start opens; `START_KILL_POINTS` and
//! tests/start_crash.rs hold every step to that.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::handle::Store;
use crate::store::base::Result;

pub const WITNESS_FILE: &str = "store-witness.json";
/// After a clean stop the store opens without the full read-back and the safety copy, unless
/// the last full check is older than this.
const FULL_CHECK_EVERY_MS: i64 = 7 * 24 * 60 * 60 * 1000;
/// How often the witness follows the head while cursors advance.
const WITNESS_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(in crate::store) struct Witness {
    /// The highest cursor known to be durable in the store when this was written.
    pub(in crate::store) cursor_head: u64,
    /// sled had a snapshot file (`db/snap.*`) by then: from then on a missing one is damage.
    pub(in crate::store) snapshot: bool,
    pub(in crate::store) updated_ms: i64,
    /// When the store last opened and read back in full (`RECHECK_AFTER_MS`).
    #[serde(default)]
    pub(in crate::store) checked_ms: i64,
    /// Written by the last graceful stop after its final flush; any later write of the witness
    /// (the next open) clears it, so a crash or power cut leaves it false.
    #[serde(default)]
    pub(in crate::store) clean: bool,
    #[serde(default)]
    pub(in crate::store) about: String,
    /// 2 from this version on: `snapshot` is claimed only once the snapshot's name is durable
    /// (sled renames it into place without an fsync of its directory), and withdrawn before
    /// the compression rebuild swaps in a copy that has none yet. Older witnesses (0) made the
    /// claim without either, so their claim alone cannot prove damage (`before_open`).
    #[serde(default)]
    pub(in crate::store) format: u32,
    /// With `clean`: sled's files as the graceful stop left them (`stamp_files`). A start that
    /// finds them otherwise (an older copy put back, a file replaced) checks in full, with the
    /// safety copy, instead of trusting the clean stop.
    #[serde(default)]
    pub(in crate::store) files: Option<Vec<FileStamp>>,
}

/// The current witness format (see `Witness::format`).
pub(in crate::store) const WITNESS_FORMAT: u32 = 2;

/// One file of sled's directory as the graceful stop left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(in crate::store) struct FileStamp {
    name: String,
    len: u64,
    mtime_ns: i128,
    inode: u64,
}

/// Every file under `db/` (names relative to it), sorted: enough to see that the files are not
/// the ones a clean stop left, without reading them.
pub(in crate::store) fn stamp_files(db_dir: &Path) -> std::io::Result<Vec<FileStamp>> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![db_dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let m = entry.metadata()?;
            if m.is_dir() {
                stack.push(entry.path());
                continue;
            }
            let name = entry
                .path()
                .strip_prefix(db_dir)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push(FileStamp {
                name,
                len: m.len(),
                mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
                inode: m.ino(),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

impl Witness {
    pub(in crate::store) fn checked_ms(&self) -> i64 {
        self.checked_ms
    }

    /// Whether this open must read every record back (and take the safety copy first).
    pub(in crate::store) fn wants_full_check(witness: Option<&Witness>) -> bool {
        match witness {
            None => true,
            Some(w) => !w.clean || crate::ids::now_ms() - w.checked_ms >= FULL_CHECK_EVERY_MS,
        }
    }
}

/// Withdraws the witness's snapshot claim, durably, before the compression rebuild puts a copy
/// in `db/` that has no snapshot yet (a claim left standing would refuse the next start if the
/// power went before sled wrote one: the copy is whole, only the claim was wrong). The next
/// open claims the new snapshot once it is durable.
pub(in crate::store) fn withdraw_snapshot_claim(dir: &Path) -> std::io::Result<()> {
    let path = witness_path(dir);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let Ok(mut w) = serde_json::from_slice::<Witness>(&text) else {
        // `before_open` read it at this start: it is not changed.
        return Ok(());
    };
    if !w.snapshot {
        return Ok(());
    }
    w.snapshot = false;
    w.clean = false;
    w.files = None;
    w.format = WITNESS_FORMAT;
    w.updated_ms = crate::ids::now_ms();
    let text = serde_json::to_vec_pretty(&w).expect("witness serialises");
    crate::atomic_file::write(&path, &text, 0o644)
}

pub(in crate::store) fn witness_path(dir: &Path) -> PathBuf {
    dir.join(WITNESS_FILE)
}

/// Whether sled has a snapshot file in its directory (it writes one at every open that
/// recovers a log, renaming it into place, so one is always there once a store was reopened).
pub(in crate::store) fn has_snapshot(db_dir: &Path) -> bool {
    std::fs::read_dir(db_dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("snap.") && !name.ends_with(".generating")
            })
        })
        .unwrap_or(false)
}

impl Store {
    /// Records the store as it is on disk now (just opened or reopened: everything is durable).
    /// `checked_ms` is when every record was last read back: now after a full check, else the
    /// previous witness's.
    pub(in crate::store) fn record_witness(&self, checked_ms: i64) {
        self.shared
            .witness
            .checked_ms
            .store(checked_ms, std::sync::atomic::Ordering::SeqCst);
        let db_dir = self.shared.dir.join("db");
        // sled renames its snapshot into place without an fsync of the directory, and its log
        // is only `sync_file_range`d: both made durable before the witness claims them.
        let durable = self
            .t()
            .ok()
            .map(|t| t.db_file.sync_all().is_ok() && crate::atomic_file::sync_dir(&db_dir).is_ok());
        let snapshot = durable == Some(true) && has_snapshot(&db_dir);
        if let Ok(head) = self.cursor_head() {
            self.write_witness(head, snapshot, false);
        }
    }

    /// The last step of a graceful stop: flushes, then marks the witness `clean`, so the next
    /// start may skip the full read-back. Nothing may write to the store after this.
    pub fn close_cleanly(&self) -> Result<()> {
        self.sync_blocking()?;
        // The history database fsynced too, and the journal emptied: the next start has
        // nothing to apply.
        if let Err(e) = self.checkpoint_blocking() {
            tracing::warn!("history checkpoint at shutdown failed: {e}");
        }
        self.sync_blocking()?;
        let head = self.cursor_head()?;
        let snapshot = self.shared.witness.claims_snapshot();
        self.write_witness(head, snapshot, true);
        Ok(())
    }

    /// After a flush made everything up to `head` durable: follows the head every
    /// `WITNESS_EVERY` (or now, with `force`).
    pub(in crate::store) fn witness_durable(&self, head: u64, force: bool) {
        let (due, snapshot) = {
            let last = self.shared.witness.last.lock().ok();
            match last.as_deref().copied().flatten() {
                Some((at, h, snap)) => {
                    (h != head && (force || at.elapsed() >= WITNESS_EVERY), snap)
                }
                None => (true, false),
            }
        };
        if due {
            self.write_witness(head, snapshot, false);
        }
    }

    fn write_witness(&self, head: u64, snapshot: bool, clean: bool) {
        let files = if clean {
            stamp_files(&self.shared.dir.join("db")).ok()
        } else {
            None
        };
        let w = Witness {
            format: WITNESS_FORMAT,
            files,
            clean,
            cursor_head: head,
            snapshot,
            updated_ms: crate::ids::now_ms(),
            checked_ms: self
                .shared
                .witness
                .checked_ms
                .load(std::sync::atomic::Ordering::SeqCst),
            about:
                "written by iris-gateway to detect a damaged store at start; see docs/storage.md"
                    .into(),
        };
        let path = witness_path(&self.shared.dir);
        let text = serde_json::to_vec_pretty(&w).expect("witness serialises");
        match crate::atomic_file::write(&path, &text, 0o644) {
            Ok(()) => {
                if let Ok(mut last) = self.shared.witness.last.lock() {
                    *last = Some((Instant::now(), head, snapshot));
                }
            }
            // An older witness stays valid (it is below the durable head); only refusals of a
            // full or read-only disk are expected here.
            Err(e) => tracing::debug!("could not update {}: {e}", path.display()),
        }
    }
}
