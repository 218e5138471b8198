//! The restore job (`jobs.rs`) the Backup page starts, from the folder of scheduled backups or
//! from an upload once its bytes are here: the file (sealed or plain) opened, checked and built
//! off the event loop by the backups wing (`backups::stage_for_restart`), confirmed, and the
//! restart into it.

use std::path::PathBuf;
use std::rc::Rc;

use tracing::info;

use super::jobs::Ticket;
use super::reply::sentence;
use super::{owner, Admin};
use crate::backups::{self, confirm_pending};
use crate::hub::Hub;

/// Whether a restore may begin: none waits for the restart, and the disk has room for `need`.
pub(super) fn restore_room(admin: &Admin, hub: &Rc<Hub>, need: u64) -> Result<(), String> {
    backups::restore_room(&admin.data_dir, hub.store(), need).map_err(|e| e.to_string())
}

/// The restore job on `ticket`: `file` (sealed with `passphrase`, or plain) opened, checked and
/// built off the event loop, staged whole for the restart (`backups::stage_for_restart`), then
/// the restart into it. `uploaded`: the file is the page's upload, removed either way.
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
            let result = backups::stage_for_restart(
                &dir,
                &file,
                passphrase.as_deref().map(String::as_str),
                owner::FILE_NAME,
                room,
            )
            .map_err(|e| sentence(&e.to_string()));
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

/// Asks `run` (through `restart`) to restart in a moment: a page answered just before reaches
/// the browser first.
pub(super) fn restart_soon(restart: Rc<tokio::sync::Notify>) {
    tokio::task::spawn_local(async move {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        restart.notify_one();
    });
}
