//! A file given to restore, whichever its kind: a plain backup (the admin page's download,
//! `iris-gateway backup`) or a sealed one (a scheduled backup, `sealed.rs`), opened first with
//! its backup passphrase. Restored offline for `iris-gateway restore` ([`restore_sealed`]), or
//! built whole for the restart from the admin page's restore job ([`stage_for_restart`]).

use std::io::Read;
use std::path::Path;

use super::make::{io, Error};
use super::restore::{prepare_upload, restore, Probe, Restored, OPENED_PART, PENDING_RESTORE};
use super::sealed::{self, SealError};
use crate::store::{StoreError, StoreView};

/// What a file given to restore is, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The store backup as the download makes it.
    Plain,
    /// A scheduled backup: age-sealed, with the settings and the owner file.
    Sealed,
}

/// The refusal of a file that is neither.
pub const FOREIGN: &str = "this is not an iris-gateway backup: it is neither a plain \
     backup (a download from this page) nor an age-sealed one (a scheduled backup); nothing was \
     changed";

/// Reads the first bytes of `path`: which kind of backup it is, if any.
pub fn format_of(path: &Path) -> Option<Format> {
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(sealed::MAGIC.len() as u64).read_to_end(&mut head))
        .ok()?;
    if head.starts_with(crate::store::backup::MAGIC) {
        Some(Format::Plain)
    } else if head == sealed::MAGIC {
        Some(Format::Sealed)
    } else {
        None
    }
}

/// Why a restore from the admin page may not begin.
#[derive(Debug, thiserror::Error)]
pub enum NoRoom {
    #[error("A restore is already waiting for the restart; nothing was changed.")]
    Pending,
    #[error("Not enough room on the data disk to restore it ({0}); nothing was changed.")]
    Disk(StoreError),
}

/// Whether a restore may begin in `data_dir`: none waits for the restart, and the disk has room
/// for `need` bytes.
pub fn restore_room(data_dir: &Path, store: &StoreView, need: u64) -> Result<(), NoRoom> {
    if data_dir.join(PENDING_RESTORE).exists() {
        return Err(NoRoom::Pending);
    }
    // The opened backup and the store built from it, about as big each, stay until the restart.
    store.disk_ok(need).map_err(NoRoom::Disk)
}

/// Why a restore from the admin page was not built; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("{0}")]
    Refused(String),
    #[error("{name} is not a whole, undamaged backup ({source}); nothing was changed")]
    NotWhole { name: String, source: Error },
    #[error(transparent)]
    Seal(#[from] SealError),
}

/// A restore from the admin page, built whole for the restart (blocking: call it off the event
/// loop). A sealed backup is opened first (a wrong passphrase stops there, nothing written);
/// then checked and built as an upload is, its settings and owner file (named `owner_name` in
/// the data dir) staged with the store in the one move that makes it pending. Every part file is
/// removed on failure. Returns what it holds, in words. The restore job then confirms it
/// ([`super::confirm_pending`]) and restarts into it.
pub fn stage_for_restart(
    dir: &Path,
    file: &Path,
    passphrase: Option<&str>,
    owner_name: &str,
    room: impl Fn() -> Result<(), String>,
) -> Result<String, StageError> {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let refused = |e: Error| match e {
        Error::Refused(why) => StageError::Refused(why),
        source => StageError::NotWhole {
            name: name.clone(),
            source,
        },
    };
    // Read once: a FIFO or a stick that changes under us gives no second look.
    let opened = dir.join(OPENED_PART);
    let _ = std::fs::remove_file(&opened);
    let extras = match passphrase {
        Some(pass) => {
            let extras = sealed::open(file, pass, &opened).and_then(|x| {
                sealed::check_extras(&x, &name)?;
                Ok(x)
            });
            match extras {
                Ok(x) => Some(x),
                Err(e) => {
                    let _ = std::fs::remove_file(&opened);
                    return Err(e.into());
                }
            }
        }
        None => None,
    };
    let source = if extras.is_some() { &opened } else { file };
    let stage_extras = |to: &Path| -> std::io::Result<()> {
        let Some(x) = &extras else { return Ok(()) };
        std::fs::create_dir_all(to)?;
        if let Some(s) = &x.settings {
            crate::atomic_file::write(&to.join(crate::settings::FILE_NAME), s, 0o600)?;
        }
        if let Some(o) = &x.owner {
            crate::atomic_file::write(&to.join(owner_name), o, 0o600)?;
        }
        Ok(())
    };
    let result = prepare_upload(dir, source, room, stage_extras).map_err(refused);
    let _ = std::fs::remove_file(&opened);
    result
}

/// The opened store backup, in the data dir while `iris-gateway restore` restores it; deleted
/// after either way.
const OPENED: &str = ".restore-sealed.iris";

/// Restores the sealed backup `file` into `dir` offline, as `iris-gateway restore` does any
/// backup: opened with `passphrase` into a plain store backup in the data dir (a wrong
/// passphrase is refused before anything is written), restored, and only then the settings
/// and the owner file it carried put back (the owner file as `owner_file`), each told to
/// `put_back` once written.
pub fn restore_sealed(
    dir: &Path,
    file: &Path,
    passphrase: &str,
    running: Probe,
    owner_file: &Path,
    mut put_back: impl FnMut(&Path),
) -> Result<Restored, Error> {
    std::fs::create_dir_all(dir).map_err(io(format!("cannot create {}", dir.display())))?;
    let opened = dir.join(OPENED);
    let _ = std::fs::remove_file(&opened);
    let refused = |e: SealError| Error::Refused(e.to_string());
    let result = (|| {
        let extras = sealed::open(file, passphrase, &opened).map_err(refused)?;
        sealed::check_extras(&extras, &file.display().to_string()).map_err(refused)?;
        let done = restore(dir, &opened, running)?;
        let mut put = |name: &Path, bytes: &Option<Vec<u8>>| -> Result<(), Error> {
            if let Some(b) = bytes {
                crate::atomic_file::write(name, b, 0o600)
                    .map_err(io(format!("cannot write {}", name.display())))?;
                put_back(name);
            }
            Ok(())
        };
        put(&crate::settings::path(dir), &extras.settings)?;
        put(owner_file, &extras.owner)?;
        Ok(done)
    })();
    let _ = std::fs::remove_file(&opened);
    result
}
