//! sled's files rebuilt with compression, once, for a store made before sled compressed.
//!
//! sled 0.34 compresses the pages it writes (zstd) only if the database was created that way,
//! and refuses to open one with the other setting. Compression halves what sled writes per turn
//! (its page rewrites are JSON frames, which compress well: docs/storage.md, "SD-card wear"),
//! so a store from an older version is copied once into a new compressed sled. sled holds only
//! what is bounded by the retention (the outbox, the journal, the small records: a few MB), so
//! the copy takes seconds even on a Pi; history is in SQLite and is not touched.
//!
//! The copy is made beside the old files and swapped in by renames, each step leaving a state
//! `finish_or_undo` recognises at the next start:
//!
//! 1. `db.rebuild/` is written and fsynced (a crash here: it is removed, `db/` is as it was);
//! 2. the witness stops claiming a snapshot (durably): the copy has none until sled first
//!    opens it, and a claim left standing would make the next start refuse a whole store;
//! 3. `db/` becomes `db.uncompressed/`, then `db.rebuild/` becomes `db/` (a crash between the
//!    two: the second rename is done at the next start);
//! 4. `db.uncompressed/` is removed.
//!
//! Each step has a kill point (`START_KILL_POINTS`): tests/start_crash.rs cuts a start at each.

use std::path::{Path, PathBuf};

use super::kill_points::kill_point;
use super::open::sled_config;
use super::witness::withdraw_snapshot_claim;
use crate::store::base::{Result, StoreError};

const REBUILD_DIR: &str = "db.rebuild";
const OLD_DIR: &str = "db.uncompressed";
/// Entries copied per sled batch.
const BATCH: usize = 1000;

/// Completes or undoes a rebuild a crash interrupted (see the module comment). Run before
/// anything opens sled. Says what it changed, if anything (for an honest refusal).
pub(in crate::store) fn finish_or_undo(dir: &Path) -> Result<Option<String>> {
    let db = dir.join("db");
    let rebuilt = dir.join(REBUILD_DIR);
    let old = dir.join(OLD_DIR);
    let mut done = Vec::new();
    if rebuilt.exists() {
        if db.exists() {
            // Step 1 did not finish: the old files are still in place.
            std::fs::remove_dir_all(&rebuilt).map_err(|e| StoreError::open_io(dir, e))?;
            done.push(format!(
                "it removed {}, a compressed copy of the store an interrupted start had not finished",
                rebuilt.display()
            ));
        } else {
            std::fs::rename(&rebuilt, &db).map_err(|e| StoreError::open_io(dir, e))?;
            crate::atomic_file::sync_dir(dir).map_err(|e| StoreError::open_io(dir, e))?;
            tracing::info!("finished swapping in the compressed copy of the store");
            done.push(format!(
                "it renamed {} to {}, finishing the swap an interrupted start had begun",
                rebuilt.display(),
                db.display()
            ));
        }
    }
    if old.exists() && db.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| StoreError::open_io(dir, e))?;
        done.push(format!(
            "it removed {}, the uncompressed files a finished rebuild had replaced",
            old.display()
        ));
    }
    Ok((!done.is_empty()).then(|| done.join("; ")))
}

/// Copies every tree of the sled database `from` into a new compressed one beside it, and
/// swaps it in. `from` must be the only handle on the old database; it is closed here.
pub(in crate::store) fn compress(dir: &Path, from: sled::Db, cache_bytes: u64) -> Result<()> {
    let started = std::time::Instant::now();
    let target = dir.join(REBUILD_DIR);
    if target.exists() {
        std::fs::remove_dir_all(&target).map_err(|e| StoreError::open_io(dir, e))?;
    }
    let mut entries = 0u64;
    {
        let to = sled_config(&target, cache_bytes)
            .use_compression(true)
            .open()?;
        for name in from.tree_names() {
            let src = from.open_tree(&name)?;
            let dst = to.open_tree(&name)?;
            let mut batch = sled::Batch::default();
            let mut n = 0;
            for item in src.iter() {
                let (k, v) = item?;
                batch.insert(k, v);
                n += 1;
                entries += 1;
                if n == BATCH {
                    dst.apply_batch(std::mem::take(&mut batch))?;
                    n = 0;
                }
            }
            dst.apply_batch(batch)?;
        }
        to.flush()?;
    }
    kill_point("rebuild-copied", None);
    // sled's own files are only `sync_file_range`d: fsync them before they replace the old.
    sync_tree(&target).map_err(|e| StoreError::open_io(dir, e))?;
    withdraw_snapshot_claim(dir).map_err(|e| StoreError::open_io(dir, e))?;
    kill_point("rebuild-synced", None);
    drop(from);
    let db = dir.join("db");
    let old = dir.join(OLD_DIR);
    std::fs::rename(&db, &old).map_err(|e| StoreError::open_io(dir, e))?;
    kill_point("rebuild-old-aside", None);
    std::fs::rename(&target, &db).map_err(|e| StoreError::open_io(dir, e))?;
    crate::atomic_file::sync_dir(dir).map_err(|e| StoreError::open_io(dir, e))?;
    kill_point("rebuild-swapped", None);
    std::fs::remove_dir_all(&old).map_err(|e| StoreError::open_io(dir, e))?;
    kill_point("rebuild-done", None);
    tracing::info!(
        entries,
        ms = started.elapsed().as_millis() as u64,
        "the store's sled files were rebuilt with compression (once: it writes the SD card about half as much)"
    );
    Ok(())
}

/// fsyncs every file under `dir` and the directories themselves.
fn sync_tree(dir: &Path) -> std::io::Result<()> {
    let mut stack: Vec<PathBuf> = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            } else {
                std::fs::File::open(entry.path())?.sync_all()?;
            }
        }
        crate::atomic_file::sync_dir(&d)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::engine::open::compresses;

    fn uncompressed(dir: &Path) -> sled::Db {
        super::sled_config(&dir.join("db"), 1 << 20)
            .use_compression(false)
            .open()
            .unwrap()
    }

    #[test]
    fn an_uncompressed_store_is_copied_whole_and_swapped_in() {
        let tmp = tempfile::tempdir().unwrap();
        let db = uncompressed(tmp.path());
        for (tree, n) in [("outbox", 2500u64), ("meta", 3)] {
            let t = db.open_tree(tree).unwrap();
            for i in 0..n {
                t.insert(i.to_be_bytes(), format!("value {i} of {tree}").as_bytes())
                    .unwrap();
            }
        }
        db.flush().unwrap();
        assert!(!compresses(&tmp.path().join("db")));
        compress(tmp.path(), db, 1 << 20).unwrap();
        assert!(compresses(&tmp.path().join("db")));
        assert!(!tmp.path().join(REBUILD_DIR).exists() && !tmp.path().join(OLD_DIR).exists());
        // sled lets go of its file lock when its flusher thread ends, a moment after the last
        // handle is dropped: on a busy machine the reopen can come first (as at a start,
        // `open_sled` waits for it).
        let db = (0..200)
            .find_map(|_| {
                let opened = super::sled_config(&tmp.path().join("db"), 1 << 20).open();
                if opened.is_err() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                opened.ok()
            })
            .expect("the rebuilt store opens within 2 s");
        let outbox = db.open_tree("outbox").unwrap();
        assert_eq!(outbox.len(), 2500);
        assert_eq!(
            outbox.get(2499u64.to_be_bytes()).unwrap().unwrap(),
            b"value 2499 of outbox"[..]
        );
        assert_eq!(db.open_tree("meta").unwrap().len(), 3);
    }

    #[test]
    fn a_crash_during_the_rebuild_is_undone_or_finished() {
        // Before the swap: the half-made copy goes, the old files stay.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("db")).unwrap();
        std::fs::write(tmp.path().join("db/db"), b"old").unwrap();
        std::fs::create_dir_all(tmp.path().join(REBUILD_DIR)).unwrap();
        assert!(finish_or_undo(tmp.path()).unwrap().is_some());
        assert!(!tmp.path().join(REBUILD_DIR).exists());
        assert_eq!(std::fs::read(tmp.path().join("db/db")).unwrap(), b"old");
        // Between the two renames: the copy becomes the store, the old files go.
        std::fs::rename(tmp.path().join("db"), tmp.path().join(OLD_DIR)).unwrap();
        std::fs::create_dir_all(tmp.path().join(REBUILD_DIR)).unwrap();
        std::fs::write(tmp.path().join(REBUILD_DIR).join("db"), b"new").unwrap();
        finish_or_undo(tmp.path()).unwrap();
        assert_eq!(std::fs::read(tmp.path().join("db/db")).unwrap(), b"new");
        assert!(!tmp.path().join(OLD_DIR).exists());
    }
}
