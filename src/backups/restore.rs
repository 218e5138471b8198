//! Putting a backup back, and checking one before that.
//!
//! [`restore`] refuses while a gateway runs on the data dir, refuses a file that is not a
//! whole, undamaged backup before touching anything, builds the store in a staging directory
//! inside the data dir, checks it opens with the backup's cursor head, then moves the current
//! store and media aside (`DATA_DIR/before-restore-TIME/`, never deleted) and the restored ones
//! in. `iris-gateway restore` runs it, telling it how to see a running gateway ([`Probe`]: the
//! control socket's client, a door above this wing).
//!
//! Cursors never go backwards across a restore: the restored store's head is raised above every
//! cursor the replaced store issued (read from the witness beside it, [`cursor_floor`]), and the
//! cursors skipped are kept as a gap, so a device that synced past the backup is told to reload
//! (`store/outbox.rs`).
//!
//! A backup uploaded from the admin page is checked and built in full while the gateway runs
//! ([`prepare_upload`], off the event loop): every entry, and the room it takes, before the page
//! says "accepted". The built store waits in `DATA_DIR/pending-restore/` for the restart, which
//! only opens it, raises its head and moves it in ([`apply_pending_restore`]); only once the
//! admin page's job that built it confirmed it ([`confirm_pending`]): one a crash or a stop cut
//! short is deleted at the next start, never applied later by surprise. A restore that
//! still fails there is deleted (its space given back) and its reason reported in `status` and
//! on the admin page; the gateway starts on the store it had.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::make::{io, Error, CHUNK};
use crate::store::backup::{read_backup, restore_into, Header, Item};
use crate::store::{human_bytes, Store};

/// A restore uploaded from the admin page waits here, built in full, until the gateway restarts
/// into it (the store is in use while the gateway runs).
pub const PENDING_RESTORE: &str = "pending-restore";
/// What an earlier version left for the restart: the uploaded file itself, restored at start.
const LEGACY_PENDING: &str = "pending-restore.iris";
/// An earlier version's failed upload, left in the data dir for good (and filling it).
const LEGACY_FAILED: &str = "pending-restore.failed";
/// Files restored beside the store (a sealed backup's settings and owner file), waiting in the
/// pending restore until the store is moved in; each then replaces the data dir's file of its
/// name. Whoever stages them names them.
pub const PENDING_EXTRAS: &str = "extras";
/// An admin page's restore upload while it is received and until its job has read it.
pub const RECEIVED_PART: &str = "pending-restore.upload";
/// A sealed backup's store part while it is decrypted, until its job has built a store from it.
pub const OPENED_PART: &str = "pending-restore.partial";
/// Written into [`PENDING_RESTORE`] by the job that built it, just before the restart into it
/// ([`confirm_pending`]): a pending restore without it (its job cut by a crash or a stop) is
/// deleted at start, never applied later.
const CONFIRMED: &str = "confirmed";
/// The backup's header, beside the store built from it.
const STAGED_HEADER: &str = "restore-header.json";
/// Where an upload is built before it is accepted.
const UPLOAD_STAGING: &str = ".restore-upload";
/// Cursors added above the replaced store's witnessed head when that head may be behind what
/// devices hold: the witness follows the head every 30 s, so after a crash devices may have
/// seen later cursors (far more than 30 s of frames would need a flood no gateway sees).
pub const RESTORE_CURSOR_MARGIN: u64 = 10_000;

/// What the store consists of on disk, moved aside and replaced as a whole.
const STORE_PARTS: [&str; 4] = [
    "db",
    crate::store::HISTORY_DIR,
    "media",
    crate::store::WITNESS_FILE,
];

/// What a backup file holds, counted while checking it.
pub struct Counts {
    pub entries: u64,
    pub media: u64,
    pub media_bytes: u64,
}

/// Reads a backup file end to end (structure and checksum).
pub fn verify(name: &str, path: &Path) -> Result<(Header, Counts), Error> {
    let f = std::fs::File::open(path).map_err(io(format!("cannot open {name}")))?;
    let mut counts = Counts {
        entries: 0,
        media: 0,
        media_bytes: 0,
    };
    let header = read_backup(name, f, |_, item| {
        match item {
            Item::Entry(..) => counts.entries += 1,
            Item::Media(_, size, _) => {
                counts.media += 1;
                counts.media_bytes += size;
            }
            Item::Tree(_) => {}
        }
        Ok(())
    })?;
    Ok((header, counts))
}

/// A finished restore, for the command to report.
pub struct Restored {
    pub header: Header,
    pub counts: Counts,
    /// Media files whose bytes did not match their name: left out.
    pub bad_media: Vec<String>,
    /// The parts of the previous store that were moved to `aside` (none: there was none).
    pub moved: Vec<&'static str>,
    pub aside: PathBuf,
}

/// Whether a gateway runs on a data dir: how it was seen (`"it answered on …"`), or `None`.
pub type Probe = fn(&Path) -> Option<String>;

/// Restores the backup `file` into the data dir `dir` (see the module comment); `running` says
/// whether a gateway runs there.
pub fn restore(dir: &Path, file: &Path, running: Probe) -> Result<Restored, Error> {
    let name = file.display().to_string();
    refuse_if_running(dir, running)?;
    std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
    // Held until the end: no gateway can start on the store half-way.
    let _lock = lock_store(dir)?;
    let (header, counts) = verify(&name, file)?;
    let stamp = free_stamp(dir);
    let staging = dir.join(format!(".restore-{stamp}"));
    let staged = stage(&name, file, &staging).and_then(|bad| {
        finish_staged(&staging, &header, cursor_floor(dir, header.cursor_head))?;
        Ok(bad)
    });
    let bad_media = match staged {
        Ok(bad) => bad,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    let aside = dir.join(format!("before-restore-{stamp}"));
    let moved = switch_in(dir, &staging, &aside)?;
    Ok(Restored {
        header,
        counts,
        bad_media,
        moved,
        aside,
    })
}

/// The running gateway owns the store; it must be stopped first.
fn refuse_if_running(dir: &Path, running: Probe) -> Result<(), Error> {
    if let Some(seen) = running(dir) {
        return Err(Error::Refused(format!(
            "a gateway is running on {} ({seen}): stop it first (systemctl stop iris-gateway), \
             then restore",
            dir.display(),
        )));
    }
    Ok(())
}

/// A time stamp no earlier restore (finished, or its staging left by a crash) has used.
fn free_stamp(dir: &Path) -> String {
    let base = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    let mut stamp = base.clone();
    for n in 2.. {
        if !dir.join(format!("before-restore-{stamp}")).exists()
            && !dir.join(format!(".restore-{stamp}")).exists()
        {
            break;
        }
        stamp = format!("{base}-{n}");
    }
    stamp
}

/// Builds the store in `staging` from the backup, reading and storing every entry (a bad one
/// fails it); returns the media files left out for a bad checksum.
fn stage(name: &str, file: &Path, staging: &Path) -> Result<Vec<String>, Error> {
    let input = std::fs::File::open(file).map_err(io(format!("cannot open {name}")))?;
    let (_, bad_media) = restore_into(name, BufReader::with_capacity(CHUNK, input), staging)?;
    Ok(bad_media)
}

/// Opens the store built in `staging`, checks it has the backup's cursor head, raises the head
/// to `floor` (the cursors skipped become a gap: `store/outbox.rs`) and closes it cleanly.
fn finish_staged(staging: &Path, header: &Header, floor: u64) -> Result<(), Error> {
    let store = Store::open(staging, 1 << 20, Duration::from_secs(1))?;
    let head = store.cursor_head()?;
    if head != header.cursor_head {
        return Err(Error::Refused(format!(
            "the restored store has cursor {head}, the backup says {}: not restored",
            header.cursor_head
        )));
    }
    if let Some(gap) = store.raise_cursor_head(floor)? {
        tracing::info!(
            backup_head = gap.from,
            raised_to = gap.to,
            "restore: cursors continue above every cursor the replaced store issued"
        );
    }
    store.close_cleanly()?;
    Ok(())
}

/// The highest cursor a device may hold from the store in `dir` that a restore of a backup
/// with head `backup_head` replaces: its witness's head, exact after a clean stop, plus
/// [`RESTORE_CURSOR_MARGIN`] when not (a crash, or a store without a witness). A data dir
/// without a store gives the backup's own head: nothing is known to be ahead of it.
pub fn cursor_floor(dir: &Path, backup_head: u64) -> u64 {
    let witness = std::fs::read(dir.join(crate::store::WITNESS_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    match witness {
        Some(w) => {
            let head = w["cursor_head"].as_u64().unwrap_or(0);
            let margin = if w["clean"].as_bool() == Some(true) {
                0
            } else {
                RESTORE_CURSOR_MARGIN
            };
            head.saturating_add(margin).max(backup_head)
        }
        None if dir.join("db").exists() => backup_head.saturating_add(RESTORE_CURSOR_MARGIN),
        None => backup_head,
    }
}

/// The switch: the current store and media aside (kept), the restored ones in. Returns the
/// parts that were moved aside.
fn switch_in(dir: &Path, staging: &Path, aside: &Path) -> Result<Vec<&'static str>, Error> {
    let mut moved = Vec::new();
    for part in STORE_PARTS {
        let from = dir.join(part);
        if from.exists() {
            std::fs::create_dir_all(aside)
                .map_err(io(format!("cannot create {}", aside.display())))?;
            std::fs::rename(&from, aside.join(part))
                .map_err(io(format!("cannot move {} aside", from.display())))?;
            moved.push(part);
        }
    }
    for part in STORE_PARTS {
        let from = staging.join(part);
        if from.exists() {
            std::fs::rename(&from, dir.join(part))
                .map_err(io(format!("cannot move the restored {part} into place")))?;
        }
    }
    let _ = std::fs::remove_dir_all(staging);
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("cannot sync {}", dir.display())))?;
    Ok(moved)
}

/// Takes sled's lock on the current store, if there is one: a gateway (or `pair`) starting
/// now would fail to open it instead of racing the restore.
fn lock_store(dir: &Path) -> Result<Option<std::fs::File>, Error> {
    let path = dir.join("db").join("db");
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    else {
        return Ok(None);
    };
    f.try_lock().map_err(|_| {
        Error::Refused(format!(
            "{} is in use by another process (a gateway starting, or a `pair` command): stop it, \
             then restore",
            dir.display()
        ))
    })?;
    Ok(Some(f))
}

/// An uploaded backup, checked and built in full in the data dir `dir` while the gateway
/// runs (call it off the event loop): structure and checksum, then every entry stored into a
/// new store beside the current one, then `room` (the disk keeps the store's reserve with the
/// built store on it), then `extras` writes the files restored beside the store into the
/// folder it is given. Only then is the whole moved to [`PENDING_RESTORE`] for the restart, in
/// one rename: a crash before it leaves only the staging, which the next start deletes. The
/// uploaded file is deleted either way. Returns what it holds, in words.
pub fn prepare_upload(
    dir: &Path,
    upload: &Path,
    room: impl Fn() -> Result<(), String>,
    extras: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<String, Error> {
    let result = (|| {
        let pending = dir.join(PENDING_RESTORE);
        if pending.exists() {
            return Err(Error::Refused(
                "a restore is already waiting for the restart; nothing was changed".into(),
            ));
        }
        let name = "the uploaded backup";
        let (header, counts) = verify(name, upload)?;
        let staging = dir.join(UPLOAD_STAGING);
        let _ = std::fs::remove_dir_all(&staging);
        let built = stage(name, upload, &staging).and_then(|bad| {
            let _ = std::fs::remove_file(upload);
            room().map_err(|why| {
                Error::Refused(format!(
                    "there is not enough room on the data disk to restore it ({why}); free \
                     some space and upload it again"
                ))
            })?;
            extras(&staging.join(PENDING_EXTRAS))
                .map_err(io("cannot stage the settings and owner restored with it"))?;
            // Written last: a pending restore without its header was cut short.
            let json = serde_json::to_vec(&header).unwrap_or_default();
            crate::atomic_file::write(&staging.join(STAGED_HEADER), &json, 0o600)
                .map_err(io("cannot record the backup's header"))?;
            std::fs::rename(&staging, &pending).map_err(io(format!(
                "cannot move the restore to {}",
                pending.display()
            )))?;
            Ok(bad)
        });
        let bad_media = match built {
            Ok(bad) => bad,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                return Err(e);
            }
        };
        Ok(format!(
            "cursor {}, {} store entries, {} media file(s) ({}){}, made by iris-gateway {}",
            header.cursor_head,
            counts.entries,
            counts.media,
            human_bytes(counts.media_bytes),
            if bad_media.is_empty() {
                String::new()
            } else {
                format!(", {} left out for a bad checksum", bad_media.len())
            },
            header.gateway_version
        ))
    })();
    let _ = std::fs::remove_file(upload);
    result
}

/// The job that built the pending restore sees it through: the restart that follows applies it.
/// Blocking (a small file, synced).
/// Not confirmed, it is deleted at once (nothing is left waiting for a restart that would not
/// apply it).
pub fn confirm_pending(dir: &Path) -> std::io::Result<()> {
    let pending = dir.join(PENDING_RESTORE);
    let written = crate::atomic_file::write(&pending.join(CONFIRMED), b"", 0o600);
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&pending);
    }
    written
}

/// At start, before the store is opened: moves in the store an admin page's upload built in
/// [`PENDING_RESTORE`], its head raised above the current store's (the current store moved
/// aside, as `iris-gateway restore` does). Returns why a restore waiting there failed (the
/// pending store is then deleted, the current one is as it was, and nothing is left behind
/// that keeps the gateway degraded); `None` when nothing waited or it was restored.
pub fn apply_pending_restore(dir: &Path, running: Probe) -> Option<String> {
    let legacy_failed = dir.join(LEGACY_FAILED);
    if legacy_failed.exists() {
        tracing::warn!(
            "removing {}: an upload an earlier version could not restore",
            legacy_failed.display()
        );
        let _ = std::fs::remove_file(&legacy_failed);
    }
    // Left by a start, an upload or a restore job cut short: nothing was accepted from them.
    let _ = std::fs::remove_dir_all(dir.join(UPLOAD_STAGING));
    for part in [RECEIVED_PART, OPENED_PART] {
        if std::fs::remove_file(dir.join(part)).is_ok() {
            tracing::info!("removed {part}: a restore cut short (nothing of it is applied)");
        }
    }
    let legacy = dir.join(LEGACY_PENDING);
    let pending = dir.join(PENDING_RESTORE);
    if pending.is_dir() && !pending.join(CONFIRMED).is_file() {
        // Not completely written, or its job never saw it through to the restart (a crash, a
        // stop): never applied by surprise, days later.
        tracing::warn!("removing {PENDING_RESTORE}: its restore was cut short; not applied");
        let _ = std::fs::remove_dir_all(&pending);
    }
    let outcome = if pending.is_dir() {
        tracing::info!("restoring the backup uploaded from the admin page");
        // Out of the way of the store's move (which deletes what is left of `pending`), and
        // moved in only once the store is.
        let extras = dir.join(".restore-extras");
        let _ = std::fs::remove_dir_all(&extras);
        let _ = std::fs::rename(pending.join(PENDING_EXTRAS), &extras);
        let result = apply_staged(dir, &pending);
        if result.is_ok() {
            move_extras_in(dir, &extras);
        }
        let _ = std::fs::remove_dir_all(&extras);
        let _ = std::fs::remove_dir_all(&pending);
        result
    } else if legacy.exists() {
        tracing::info!("restoring the backup uploaded from the admin page");
        let result = restore(dir, &legacy, running).map(|done| (done.header, done.aside));
        let _ = std::fs::remove_file(&legacy);
        result
    } else {
        return None;
    };
    match outcome {
        Ok((header, aside)) => {
            tracing::info!(
                cursor = header.cursor_head,
                aside = %aside.display(),
                "restored the uploaded backup"
            );
            None
        }
        Err(e) => {
            let why = format!(
                "the backup uploaded from the admin page was not restored: {e}; the store is \
                 unchanged (upload it again, or restore it with {})",
                crate::hints::command("restore FILE")
            );
            tracing::warn!("{why}");
            Some(why)
        }
    }
}

/// Moves each staged extra file over the data dir's file of its name (written whole before, so
/// a rename is all it takes), then syncs the data dir.
fn move_extras_in(dir: &Path, extras: &Path) {
    let Ok(entries) = std::fs::read_dir(extras) else {
        return;
    };
    for e in entries.flatten() {
        let to = dir.join(e.file_name());
        match std::fs::rename(e.path(), &to) {
            Ok(()) => tracing::info!("restored {}", to.display()),
            Err(err) => tracing::warn!("cannot restore {}: {err}", to.display()),
        }
    }
    let _ = crate::atomic_file::sync_dir(dir);
}

/// The restart's part of an upload: the built store opened, checked, raised and moved in.
fn apply_staged(dir: &Path, pending: &Path) -> Result<(Header, PathBuf), Error> {
    let _lock = lock_store(dir)?;
    let header: Header = std::fs::read(pending.join(STAGED_HEADER))
        .map_err(io("cannot read the pending restore's header"))
        .and_then(|b| {
            serde_json::from_slice(&b).map_err(|e| {
                Error::Refused(format!("the pending restore's header is unreadable ({e})"))
            })
        })?;
    finish_staged(pending, &header, cursor_floor(dir, header.cursor_head))?;
    let aside = dir.join(format!("before-restore-{}", free_stamp(dir)));
    switch_in(dir, pending, &aside)?;
    Ok((header, aside))
}
