//! A start, and every start may follow a power cut: opening the store is recovering it. This
//! room holds the order; the steps live in the rooms below it.
//!
//! What a start after a power cut repairs, in the order it does it (`Store::open`):
//!
//! 1. the open lock (`open::open_lock`): one process opens a data dir at a time;
//! 2. a compression rebuild the cut interrupted is finished or undone (`rebuild::finish_or_undo`);
//! 3. the witness read and sled's files checked without sled (`check::before_open`);
//! 4. a safety copy an interrupted start left is put back, and a new one taken
//!    (`safety_copy.rs`), so a refusal leaves the files as they were;
//! 5. sled opened (it cuts its torn log tail), every record read back (`check::after_open`),
//!    and the last commit replayed: what a commit wrote past its record dropped, the record's
//!    redo list applied again (`commit::recover`);
//! 6. the history database opened (SQLite replays its WAL), migrated from layout 1
//!    (`migrate.rs`), and checked against sled's journal (`check::history`);
//! 7. the safety copy discarded, or put back with an honest refusal (`keep_or_put_back`);
//! 8. the compression rebuild, once, for an older store;
//! 9. the layout record brought to layout 3 (`Store::init_layout`);
//! 10. the journal replayed into the history database (`Store::replay_journal`);
//! 11. the witness written (`Store::record_witness`): the store is open.
//!
//! The server then settles the turns the last run left (`start-recovered`). Each step has a kill
//! point (`START_KILL_POINTS`), and tests/start_crash.rs cuts a start at every one of them.
//! `Store::reopen`, after a storage failure, repeats steps 5 and 6 without the checks: what was
//! checked at open stands.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::durability::poke;
use super::handle::{Store, Trees};
use super::kill_points::kill_point;
use super::open::{
    compresses, open_history, open_history_file, open_lock, open_sled, snapshot_lsn,
};
use super::safety_copy::{SafetyCopy, NO_COPY_NOTE};
use super::witness::Witness;
use super::{check, commit, rebuild};
use crate::store::base::{Result, StoreError};
use crate::store::sql;

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
        let _open_lock = open_lock(dir, lock_wait)?;
        // What this start changed before a refusal, so its message can say so honestly.
        let mut touched = Vec::new();
        if let Some(note) = rebuild::finish_or_undo(dir)? {
            touched.push(note);
        }
        let witness = check::before_open(dir).map_err(|e| check::with_touched(e, &touched))?;
        let full_check = Witness::wants_full_check(witness.as_ref());
        let checked_ms = match &witness {
            Some(w) if !full_check => w.checked_ms(),
            _ => crate::ids::now_ms(),
        };
        let taken =
            SafetyCopy::take(dir, witness.as_ref()).map_err(|e| StoreError::open_io(dir, e))?;
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
        let opened = open_and_check(
            dir,
            cache_bytes,
            lock_wait,
            witness.as_ref(),
            full_check,
            safety.as_ref(),
            &mut history_opened,
        );
        let refusal = Refusal {
            touched,
            why_none,
            history_opened,
        };
        let trees = keep_or_put_back(dir, opened, safety, refusal)?;
        kill_point("open-copy-discarded", Some(&trees.db));
        let trees = compress_once(dir, trees, cache_bytes, lock_wait)?;
        let store = Store::assemble(dir, cache_bytes, trees);
        store.init_layout()?;
        store.replay_journal()?;
        give_back_memory();
        store.record_witness(checked_ms);
        kill_point("open-witness", None);
        Ok(store)
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
                self.replay_bound()
                    .after_open(snapshot_lsn(&dir.join("db")));
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
}

/// Steps 5 and 6: sled opened and read back, the last commit replayed, the history database
/// opened and checked. `history_opened` says whether SQLite was given its file (for a refusal).
fn open_and_check(
    dir: &Path,
    cache_bytes: u64,
    lock_wait: Duration,
    witness: Option<&Witness>,
    full_check: bool,
    safety: Option<&SafetyCopy>,
    history_opened: &mut bool,
) -> Result<Trees> {
    // sled 0.34 panics on some damaged files, at open or when a damaged page is first
    // read: the guard turns that into the "damaged store" message and exit status 1
    // (after putting the safety copy back).
    let _guard = check::PanicGuard::new(dir, safety);
    let started = std::time::Instant::now();
    let s = open_sled(dir, cache_bytes, lock_wait)?;
    kill_point("open-sled-opened", None);
    check::after_open(dir, &s, witness, full_check)?;
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
    *history_opened = sql::history_path(dir).exists();
    let hist = open_history(dir, &s)?;
    kill_point("open-history-checked", Some(&s.db));
    let trees = Trees { s, hist };
    let ms = started.elapsed().as_millis();
    if full_check {
        tracing::info!(ms, "store opened and every record read back");
    } else {
        tracing::info!(
            ms,
            "store opened after a clean stop; full read-back skipped (one ran within the week)"
        );
    }
    Ok(trees)
}

/// What a refused start changed before it found the damage.
struct Refusal {
    touched: Vec<String>,
    /// Why no safety copy was taken of a store that was used before.
    why_none: Option<&'static str>,
    history_opened: bool,
}

impl Refusal {
    fn into_error(self, dir: &Path, e: StoreError, put_back: bool) -> StoreError {
        let mut touched = self.touched;
        // sled has been given the files: without a copy put back, a refusal cannot say
        // they are as they were.
        if !put_back {
            if let Some(why) = self.why_none {
                touched.push(format!("{NO_COPY_NOTE}: {why})"));
            }
        }
        if self.history_opened {
            touched.push(format!(
                "SQLite opened the history database in {} (which replays or drops what its                  WAL holds) and, for a layout-1 store, built it afresh from sled",
                dir.join(sql::HISTORY_DIR).display()
            ));
        }
        check::with_touched(e, &touched)
    }
}

/// Step 7: on success the safety copy goes; on a refusal it is put back, so the damaged files
/// are left as they were, and the error says what the start changed all the same.
fn keep_or_put_back(
    dir: &Path,
    opened: Result<Trees>,
    safety: Option<SafetyCopy>,
    refusal: Refusal,
) -> Result<Trees> {
    match (opened, safety) {
        (Ok(trees), safety) => {
            if let Some(s) = safety {
                s.discard().map_err(|e| StoreError::open_io(dir, e))?;
            }
            Ok(trees)
        }
        // sled did not get the files (another process holds them): nothing to put back,
        // and putting it back would overwrite that process's files.
        (Err(e @ StoreError::Locked { .. }), Some(s)) => {
            let _ = s.discard();
            Err(e)
        }
        (Err(e), Some(s)) => {
            // Closes sled's files (the error dropped everything opened) before they are
            // put back as they were.
            Err(match s.restore(dir) {
                Ok(()) => refusal.into_error(dir, e, true),
                Err(io) => refusal.into_error(
                    dir,
                    StoreError::Damaged {
                        dir: dir.to_owned(),
                        detail: format!("{e}; and the copy of its files taken before opening could not be put back ({io}): it is in {}", dir.join(".open-check").display()),
                        touched: Vec::new(),
                    },
                    false,
                ),
            })
        }
        (Err(e), None) => Err(refusal.into_error(dir, e, false)),
    }
}

/// Step 8: an older, uncompressed store, checked and migrated, is copied into a compressed
/// sled, once (`rebuild.rs`).
fn compress_once(dir: &Path, trees: Trees, cache_bytes: u64, lock_wait: Duration) -> Result<Trees> {
    if compresses(&dir.join("db")) {
        return Ok(trees);
    }
    let Trees { s, hist } = trees;
    // Every tree handle goes first: the database closes with its last handle.
    let db = s.db.clone();
    drop(s);
    rebuild::compress(dir, db, cache_bytes)?;
    let s = open_sled(dir, cache_bytes, lock_wait)?;
    kill_point("rebuild-reopened", None);
    Ok(Trees { s, hist })
}

/// What opening allocated and freed (the read-back after a crash above all: ~11 MiB with a
/// full outbox) stays in malloc's arenas; given back, the idle gateway is as small after a
/// crash as after a clean stop.
fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of glibc's allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}
