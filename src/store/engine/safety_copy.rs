//! The safety copy: sled's files copied before sled opens them, put back if the open fails.

use std::path::{Path, PathBuf};

use super::durability::{statvfs, STORE_RESERVE_BYTES};
use super::kill_points::kill_point;
use super::witness::Witness;

/// A store opened and read back in full this recently is not copied again before opening: a
/// service manager restarting a gateway that fails after its store opened (a bad agent setting)
/// would otherwise copy the store every few seconds.
const RECHECK_AFTER_MS: i64 = 10 * 60 * 1000;

/// A copy of sled's files taken before sled opens them, put back if the open fails.
///
/// sled "repairs" what it cannot read while it opens: it overwrites the rest of a segment
/// after the first unreadable record, blanks later segments and deletes its files for large
/// values past that point, and only then, sometimes, reports an error (measured: one flipped
/// byte near the start of the log had 205 KB of it overwritten before the open failed). After
/// a crash that is how it drops a torn, unacknowledged tail; on a damaged card it destroys
/// what a careful recovery could still read. So a store that was used before is copied first
/// (`DATA_DIR/.open-check/`; large-value files are hard links, which cost nothing), and if the
/// open or the checks after it fail, the copy is put back: the damaged files are left exactly
/// as they were. On success the copy is deleted. It costs one copy of the log per start (on a
/// Pi's SD card about 2 s per 50 MB); when the disk has no room for it, the store opens
/// without one and says so in the log.
pub(in crate::store) struct SafetyCopy {
    pub(in crate::store) root: PathBuf,
}

pub const SAFETY_DIR: &str = ".open-check";
const SAFETY_COMPLETE: &str = "complete";
/// The files of the copy, one relative path a line, written before `complete`: putting the
/// copy back moves files out of it one by one, and a start cut short half-way must not take
/// the files already moved back for ones sled created.
const SAFETY_MANIFEST: &str = "manifest";

/// What a refusal says when sled opened the files without a copy taken first.
pub(in crate::store) const NO_COPY_NOTE: &str =
    "sled may have rewritten parts of its files in db/ while opening them (no copy was taken first";

/// What `SafetyCopy::take` did.
pub(in crate::store) struct Taken {
    pub copy: Option<SafetyCopy>,
    /// Why there is no copy of a store that was used before, for an honest refusal.
    pub why_none: Option<&'static str>,
    /// A copy an interrupted start had left was put back first.
    pub put_back_leftover: bool,
}

impl SafetyCopy {
    /// Takes the copy, or `None` for a new store (nothing to protect), a store another process
    /// has open (sled will say so; nothing here may touch its files), or when it does not fit.
    /// The caller holds the open lock (`open_lock`).
    pub(in crate::store) fn take(dir: &Path, witness: Option<&Witness>) -> std::io::Result<Taken> {
        let db_dir = dir.join("db");
        let root = dir.join(SAFETY_DIR);
        let none = |why_none, put_back_leftover| Taken {
            copy: None,
            why_none,
            put_back_leftover,
        };
        if in_use(&db_dir.join("db")) {
            return Ok(none(None, false));
        }
        let put_back = Self::recover_leftover(dir, &root)?;
        if !Witness::wants_full_check(witness) {
            tracing::debug!("the store was stopped cleanly and checked in full this week: no copy before opening");
            return Ok(none(
                Some("the last run stopped cleanly and the store was checked in full this week"),
                put_back,
            ));
        }
        if witness.is_some_and(|w| crate::ids::now_ms() - w.checked_ms < RECHECK_AFTER_MS) {
            tracing::debug!("the store was read back in full minutes ago: no copy before opening");
            return Ok(none(
                Some("the store had been read back in full less than 10 minutes before"),
                put_back,
            ));
        }
        let size = match std::fs::metadata(db_dir.join("db")) {
            Ok(m) if m.len() > 0 => m.len(),
            _ => return Ok(none(None, put_back)),
        };
        if let Ok(st) = statvfs(dir) {
            if st.available < size.saturating_add(STORE_RESERVE_BYTES) {
                tracing::warn!(
                    "not enough free space for a copy of the store before opening it ({} needed): \
                     opening without one, so a damaged store may be changed by the attempt",
                    crate::units::human_bytes(size)
                );
                return Ok(none(Some("the disk had no room for it"), put_back));
            }
        }
        let copied = (|| {
            std::fs::create_dir_all(root.join("db"))?;
            let mut names = Vec::new();
            copy_tree(&db_dir, &root.join("db"), Path::new(""), &mut names)?;
            let mut manifest = names.join("\n");
            manifest.push('\n');
            crate::atomic_file::write(&root.join(SAFETY_MANIFEST), manifest.as_bytes(), 0o600)?;
            std::fs::File::create(root.join(SAFETY_COMPLETE))?;
            crate::atomic_file::sync_dir(&root)?;
            std::io::Result::Ok(())
        })();
        if let Err(e) = copied {
            let _ = std::fs::remove_dir_all(&root);
            return Err(e);
        }
        Ok(Taken {
            copy: Some(SafetyCopy { root }),
            why_none: None,
            put_back_leftover: put_back,
        })
    }

    /// The open succeeded: the copy goes. Its "complete" mark first, and durably: a complete
    /// copy left behind would be put back at the next start, undoing everything written since.
    pub(in crate::store) fn discard(self) -> std::io::Result<()> {
        std::fs::remove_file(self.root.join(SAFETY_COMPLETE))?;
        std::fs::File::open(&self.root)?.sync_all()?;
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            // Harmless now: an incomplete copy is simply removed at the next start.
            tracing::warn!("could not remove {}: {e}", self.root.display());
        }
        Ok(())
    }

    /// The open failed: every file of `db/` is put back as it was.
    pub(in crate::store) fn restore(self, dir: &Path) -> std::io::Result<()> {
        Self::put_back(dir, &self.root)
    }

    pub(in crate::store) fn put_back(dir: &Path, root: &Path) -> std::io::Result<()> {
        let db_dir = dir.join("db");
        let saved_db = root.join("db");
        match std::fs::read_to_string(root.join(SAFETY_MANIFEST)) {
            Ok(manifest) => {
                let keep: std::collections::HashSet<&str> =
                    manifest.lines().filter(|l| !l.is_empty()).collect();
                // Files sled created while opening (a new snapshot, say) go; the saved ones
                // come back, each by a rename over what sled made of it. Run again after a
                // cut, it finds the files already back listed, and moves the rest.
                std::fs::create_dir_all(&db_dir)?;
                remove_unlisted(&db_dir, Path::new(""), &keep)?;
                let mut moved = 0;
                for name in &keep {
                    let from = saved_db.join(name);
                    if !from.exists() {
                        continue;
                    }
                    let to = db_dir.join(name);
                    if let Some(parent) = to.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    std::fs::rename(&from, &to)?;
                    moved += 1;
                    if moved == 1 {
                        kill_point("put-back-partial", None);
                    }
                }
                sync_dirs(&db_dir)?;
            }
            // A copy taken by an older version, put back as that version did.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                remove_files_not_in(&db_dir, &saved_db)?;
                move_tree(&saved_db, &db_dir)?;
                std::fs::File::open(&db_dir)?.sync_all()?;
            }
            Err(e) => return Err(e),
        }
        // Not complete any more before anything else of it goes: a cut from here leaves an
        // incomplete copy, which the next start only removes.
        std::fs::remove_file(root.join(SAFETY_COMPLETE))?;
        crate::atomic_file::sync_dir(root)?;
        std::fs::remove_dir_all(root)
    }

    /// A copy left by an open that was cut short (power cut, kill): a complete one is the
    /// state before that open and is put back; an incomplete one was taken before sled was
    /// given the files, which are therefore untouched. True when a copy was put back.
    fn recover_leftover(dir: &Path, root: &Path) -> std::io::Result<bool> {
        if !root.exists() {
            return Ok(false);
        }
        if root.join(SAFETY_COMPLETE).exists() {
            tracing::warn!(
                "an earlier start was interrupted while opening the store: putting back the copy \
                 of its files taken before that"
            );
            Self::put_back(dir, root)?;
            Ok(true)
        } else {
            std::fs::remove_dir_all(root)?;
            Ok(false)
        }
    }
}

/// Whether another process has sled's lock on this log file (it has the store open).
fn in_use(log: &Path) -> bool {
    match std::fs::OpenOptions::new().read(true).write(true).open(log) {
        // Dropping the file releases the probe's own lock at once.
        Ok(f) => f.try_lock().is_err(),
        Err(_) => false,
    }
}

/// Copies a directory tree: files of sled's `blobs/` are hard-linked (sled never rewrites one,
/// it only deletes them), the others copied and fsynced. `names` gets every file's path
/// relative to the top (`rel` is `from`'s).
fn copy_tree(from: &Path, to: &Path, rel: &Path, names: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        let rel = rel.join(entry.file_name());
        if kind.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_tree(&entry.path(), &target, &rel, names)?;
        } else if kind.is_file() {
            names.push(rel.to_string_lossy().into_owned());
            if from.file_name().is_some_and(|n| n == "blobs") {
                std::fs::hard_link(entry.path(), &target)?;
            } else {
                std::fs::copy(entry.path(), &target)?;
                std::fs::File::open(&target)?.sync_all()?;
            }
        }
    }
    std::fs::File::open(to)?.sync_all()
}

/// Removes the files under `dir` whose relative path is not in `keep`.
fn remove_unlisted(
    dir: &Path,
    rel: &Path,
    keep: &std::collections::HashSet<&str>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let rel = rel.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            remove_unlisted(&entry.path(), &rel, keep)?;
        } else if !keep.contains(rel.to_string_lossy().as_ref()) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// fsyncs `dir` and every directory below it.
fn sync_dirs(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_dirs(&entry.path())?;
        }
    }
    crate::atomic_file::sync_dir(dir)
}

fn remove_files_not_in(current: &Path, saved: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(current)? {
        let entry = entry?;
        let twin = saved.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if twin.is_dir() {
                remove_files_not_in(&entry.path(), &twin)?;
            }
        } else if !twin.exists() {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

fn move_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            move_tree(&entry.path(), &target)?;
            std::fs::File::open(&target)?.sync_all()?;
        } else {
            std::fs::rename(entry.path(), &target)?;
        }
    }
    Ok(())
}
