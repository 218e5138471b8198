//! Putting a backup back, and checking one before that.
//!
//! [`restore`] refuses while a gateway runs on the data dir, refuses a file that is not a
//! whole, undamaged backup before touching anything, builds the store in a staging directory
//! inside the data dir, checks it opens with the backup's cursor head, then moves the current
//! store and media aside (`DATA_DIR/before-restore-TIME/`, never deleted) and the restored ones
//! in. `iris-gateway restore` runs it; so does the gateway at start, for a backup uploaded from
//! the admin page ([`apply_pending_restore`]).

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::backup::{io, Error, CHUNK};
use super::client::{request, Reached};
use super::wire::{socket_path, ControlRequest};
use crate::store::backup::{read_backup, restore_into, Header, Item};
use crate::store::{human_bytes, Store};

/// A restore uploaded from the admin page waits here (checked in full) until the gateway
/// restarts into it: the store is in use while the gateway runs.
pub const PENDING_RESTORE: &str = "pending-restore.iris";

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

/// Restores the backup `file` into the data dir `dir` (see the module comment).
pub fn restore(dir: &Path, file: &Path) -> Result<Restored, Error> {
    let name = file.display().to_string();
    refuse_if_running(dir)?;
    std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
    // Held until the end: no gateway can start on the store half-way.
    let _lock = lock_store(dir)?;
    let (header, counts) = verify(&name, file)?;
    let stamp = free_stamp(dir);
    let staging = dir.join(format!(".restore-{stamp}"));
    let bad_media = match stage(&name, file, &staging, &header) {
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
fn refuse_if_running(dir: &Path) -> Result<(), Error> {
    if let Reached::Answer(_) =
        request(dir, &ControlRequest::Devices).unwrap_or(Reached::NotRunning)
    {
        return Err(Error::Refused(format!(
            "a gateway is running on {} (it answered on {}): stop it first (systemctl stop \
             iris-gateway), then restore",
            dir.display(),
            socket_path(dir).display()
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

/// Builds the store in `staging` and checks it opens at the backup's cursor head; returns the
/// media files left out for a bad checksum.
fn stage(name: &str, file: &Path, staging: &Path, header: &Header) -> Result<Vec<String>, Error> {
    let input = std::fs::File::open(file).map_err(io(format!("cannot open {name}")))?;
    let (_, bad_media) = restore_into(name, BufReader::with_capacity(CHUNK, input), staging)?;
    let store = Store::open(staging, 1 << 20, Duration::from_secs(1))?;
    let head = store.cursor_head()?;
    if head != header.cursor_head {
        return Err(Error::Refused(format!(
            "the restored store has cursor {head}, the backup says {}: not restored",
            header.cursor_head
        )));
    }
    store.sync_blocking()?;
    Ok(bad_media)
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
    use fs2::FileExt;
    let path = dir.join("db").join("db");
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    else {
        return Ok(None);
    };
    f.try_lock_exclusive().map_err(|_| {
        Error::Refused(format!(
            "{} is in use by another process (a gateway starting, or a `pair` command): stop it, \
             then restore",
            dir.display()
        ))
    })?;
    Ok(Some(f))
}

/// Checks an uploaded backup end to end (structure and checksum) before anything is touched;
/// returns what it holds, in words.
pub fn check_upload(path: &Path) -> Result<String, Error> {
    let (header, counts) = verify("the uploaded backup", path)?;
    Ok(format!(
        "cursor {}, {} store entries, {} media file(s) ({}), made by iris-gateway {}",
        header.cursor_head,
        counts.entries,
        counts.media,
        human_bytes(counts.media_bytes),
        header.gateway_version
    ))
}

/// At start, before the store is opened: restores a backup the admin page left in
/// [`PENDING_RESTORE`], exactly as `iris-gateway restore` does (the old store moved aside).
/// A restore that fails leaves the current store as it was and the file renamed
/// `pending-restore.failed`, so the gateway never loops on it; the reason is logged.
pub fn apply_pending_restore(dir: &Path) -> bool {
    let pending = dir.join(PENDING_RESTORE);
    if !pending.exists() {
        return false;
    }
    tracing::info!("restoring the backup uploaded from the admin page");
    match restore(dir, &pending) {
        Ok(done) => {
            let _ = std::fs::remove_file(&pending);
            tracing::info!(
                cursor = done.header.cursor_head,
                media = done.counts.media - done.bad_media.len() as u64,
                aside = %done.aside.display(),
                "restored the uploaded backup"
            );
            true
        }
        Err(e) => {
            let _ = std::fs::rename(&pending, dir.join("pending-restore.failed"));
            tracing::warn!("the uploaded backup was not restored ({e}); the store is unchanged");
            false
        }
    }
}
