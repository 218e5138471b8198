//! The restore job (`jobs.rs`) the Backup page starts, from the folder of scheduled backups or
//! from an upload once its bytes are here: the file (sealed or plain) opened, checked and built
//! off the event loop, staged whole for the restart (`control::restore::prepare_upload`), and
//! the restart into it.

use std::path::PathBuf;
use std::rc::Rc;

use tracing::info;

use super::jobs::Ticket;
use super::reply::sentence;
use super::{owner, Admin};
use crate::backups::sealed;
use crate::control::restore::{confirm_pending, prepare_upload, OPENED_PART, PENDING_RESTORE};
use crate::hub::Hub;

/// Whether a restore may begin: none waits for the restart, and the disk has room for `need`.
pub(super) fn restore_room(admin: &Admin, hub: &Rc<Hub>, need: u64) -> Result<(), String> {
    if admin.data_dir.join(PENDING_RESTORE).exists() {
        return Err("A restore is already waiting for the restart; nothing was changed.".into());
    }
    // The opened backup and the store built from it, about as big each, stay until the restart.
    hub.store().disk_ok(need).map_err(|e| {
        format!("Not enough room on the data disk to restore it ({e}); nothing was changed.")
    })
}

/// The restore job on `ticket`: `file` (sealed with `passphrase`, or plain) opened, checked and
/// built off the event loop, staged whole for the restart (`control::restore::prepare_upload`),
/// then the restart into it. `uploaded`: the file is the page's upload, removed either way.
pub(super) fn start_restore(
    admin: &Admin,
    hub: &Rc<Hub>,
    ticket: Ticket,
    file: PathBuf,
    passphrase: Option<zeroize::Zeroizing<String>>,
    uploaded: bool,
) {
    let (dir, store, restart) = (
        admin.data_dir.clone(),
        hub.store().clone(),
        admin.restart.clone(),
    );
    let confirm_dir = dir.clone();
    tokio::task::spawn_local(async move {
        let done = tokio::task::spawn_blocking(move || {
            let room = || store.disk_ok(0).map_err(|e| e.to_string());
            let result = restore_blocking(
                &dir,
                &file,
                passphrase.as_deref().map(String::as_str),
                owner::FILE_NAME,
                room,
            );
            if uploaded {
                let _ = std::fs::remove_file(&file);
            }
            result
        })
        .await
        .map_err(|e| format!("The restore stopped: {e}; nothing was changed."))
        .and_then(|r| r);
        // Confirmed here, on the loop's side: a stop or a crash before this leaves it
        // unconfirmed, and the next start deletes it instead of applying it by surprise.
        let done = match done {
            Ok(summary) => {
                let dir = confirm_dir;
                tokio::task::spawn_blocking(move || confirm_pending(&dir))
                    .await
                    .map_err(std::io::Error::other)
                    .and_then(|r| r)
                    .map(|()| summary)
                    .map_err(|e| {
                        sentence(&format!(
                            "the restore could not be confirmed ({e}); nothing was changed"
                        ))
                    })
            }
            Err(e) => Err(e),
        };
        if let Ok(summary) = &done {
            info!("admin page: backup opened, checked and built ({summary}); restarting into it");
            restart_soon(restart);
        }
        ticket.finish(done.map(|summary| {
            format!(
                "The backup is whole and ready ({summary}). The gateway restarts into it; the \
                 current store is kept aside in the data dir."
            )
        }));
    });
}

/// What a file given to restore is, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    /// The store backup as the download makes it.
    Plain,
    /// A scheduled backup: age-sealed, with the settings and the owner file.
    Sealed,
}

/// The refusal of a file that is neither.
pub(super) const FOREIGN: &str = "this is not an iris-gateway backup: it is neither a plain \
     backup (a download from this page) nor an age-sealed one (a scheduled backup); nothing was \
     changed";

/// Reads the first bytes of `path`: which kind of backup it is, if any.
pub(super) fn format_of(path: &std::path::Path) -> Option<Format> {
    use std::io::Read;
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

/// The blocking part of a restore: a sealed backup is opened first (a wrong passphrase stops
/// there, nothing written); then checked and built as an upload is, its settings and owner file
/// staged with the store in the one move that makes it pending. Every part file is removed on
/// failure. Returns what it holds, in words, or why not, as the job page says it.
fn restore_blocking(
    dir: &std::path::Path,
    file: &std::path::Path,
    passphrase: Option<&str>,
    owner_name: &str,
    room: impl Fn() -> Result<(), String>,
) -> Result<String, String> {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let refused = |e: crate::control::backup::Error| match e {
        crate::control::backup::Error::Refused(why) => sentence(&why),
        e => sentence(&format!(
            "{name} is not a whole, undamaged backup ({e}); nothing was changed"
        )),
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
                    return Err(sentence(&e.to_string()));
                }
            }
        }
        None => None,
    };
    let source = if extras.is_some() { &opened } else { file };
    let stage_extras = |to: &std::path::Path| -> std::io::Result<()> {
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

/// Asks `run` (through `restart`) to restart in a moment: a page answered just before reaches
/// the browser first.
pub(super) fn restart_soon(restart: Rc<tokio::sync::Notify>) {
    tokio::task::spawn_local(async move {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        restart.notify_one();
    });
}
