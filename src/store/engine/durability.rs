//! Durability: what makes a write stay after a power cut (sled's flush, then an fsync of its
//! files), and what the store does when the disk refuses (the failure flag: `note_failure`,
//! `failure`, `needs_reopen`), including refusing writes before the disk is full (`writable`).
//! The hub awaits `sync` before it tells any device about a change.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::handle::{Shared, Store, Trees};
use crate::store::base::{classify_io, Result, StoreError};
use crate::store::sql;
use crate::store::sql_query;
use crate::units::human_bytes;

/// Free space below which the store refuses to write, so sled never meets a full disk halfway
/// through its log (after which it stops writing until reopened). Overridable for tests with
/// `IRIS_GATEWAY_STORE_RESERVE_BYTES` (0 lets sled itself run into the full disk; debug
/// builds only).
pub const STORE_RESERVE_BYTES: u64 = 8 << 20;
pub(in crate::store) const RESERVE_ENV: &str = "IRIS_GATEWAY_STORE_RESERVE_BYTES";

/// Which failures are the storage itself failing, and which are the history database's
/// content damaged: what the hub's health reports as `degraded`.
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

impl Store {
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
    pub(in crate::store) fn writable_for(&self, bytes: u64) -> Result<()> {
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
    pub(in crate::store) fn failure(&self) -> StoreError {
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
    pub(in crate::store) fn note_failure<T>(
        &self,
        r: std::result::Result<T, sled::Error>,
    ) -> Result<T> {
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
    pub(in crate::store) fn note_io_failure<T>(&self, r: std::io::Result<T>) -> Result<T> {
        r.map_err(sled::Error::Io)
            .or_else(|e| self.note_failure(Err(e)))
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
        // Applied once a few turns' worth has gathered (`apply_due`): they share one
        // transaction's index pages. Reads catch up first either way (`read_history`,
        // `query`). On a worker thread: its cost follows the changes (a channel's deletion is
        // thousands of index removals), and the event loop waits on nothing whose cost grows
        // with the data; the caller (the committer) awaits it, so the health it reports
        // includes its result.
        if self.apply_due(&t) {
            let store = self.clone();
            let _ = tokio::task::spawn_blocking(move || store.apply_or_note()).await;
        }
        self.maybe_checkpoint();
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
pub(in crate::store) fn poke(t: &Trees) -> std::result::Result<(), sled::Error> {
    t.meta.insert(META_FLUSH_PROBE, &[]).map(|_| ())
}

pub(in crate::store) struct DiskState {
    pub(in crate::store) available: u64,
    pub(in crate::store) read_only: bool,
}

pub(in crate::store) fn statvfs(dir: &Path) -> Result<DiskState> {
    let space = crate::disk::space(dir).map_err(|e| match e.raw_os_error() {
        // The only error without one: the path could not be handed to the OS.
        None => StoreError::Sled(sled::Error::Unsupported(
            "a data dir path with a NUL byte".into(),
        )),
        Some(_) => classify_io(&e).unwrap_or(StoreError::Sled(sled::Error::Io(e))),
    })?;
    Ok(DiskState {
        available: space.free,
        read_only: space.read_only,
    })
}
