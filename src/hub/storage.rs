//! Watching the data disk: a full or read-only disk degrades the gateway (writes are refused
//! with an `error` frame saying so, everything already stored is still served), and it comes
//! back by itself when the disk works again.
//!
//! The store refuses writes while the disk has less than its reserve free or is read-only
//! (`Store::writable`, one `statvfs` per write), so in the usual case sled never meets the full
//! disk. When it does anyway (the disk filled between the check and sled's write, it failed
//! with an I/O error, or the kernel made it read-only after errors), sled stops writing for
//! good; reads still work. Either way this monitor reports `degraded` and, once a probe file
//! can be written and fsynced in the data dir again, reopens the store when sled had stopped
//! (what is on disk is what was made durable) and reports `online`.
//!
//! `StorageWatch` is that monitor: it owns the answers kept while the disk failed (`Unsettled`)
//! and reaches the hub through its port (`port.rs`): the committer, which stays the hub's, and
//! the health.

use std::path::Path;
use std::time::Duration;

use tracing::{error, info, warn};

use super::port::Port;
use super::unsettled::Unsettled;
use crate::shutdown::Listener;
use crate::store::{Change, Store, StoreError};

/// How often the disk is looked at (one `statvfs`; a probe write only while degraded).
const CHECK_EVERY: Duration = Duration::from_secs(1);
const PROBE_FILE: &str = ".write-probe";

/// What the storage watch asks of the hub beyond the core: a restart when the store cannot
/// resume.
pub(super) trait StorageWatchPort: Port {
    /// Tells every device the gateway is restarting and closes them (the store cannot resume).
    fn begin_shutdown(&self);
}

/// The data disk's watch, and the answers that wait for it.
pub(super) struct StorageWatch {
    store: Store,
    /// Turns' final changes kept while the disk failed.
    unsettled: Unsettled,
}

/// Storage is failing (`Some(why)`) or works again (`None`): a cause of `degraded`.
fn set_error(port: &impl StorageWatchPort, error: Option<String>) {
    port.update_health(|st| st.storage_error = error);
}

impl StorageWatch {
    pub(super) fn new(store: Store) -> StorageWatch {
        StorageWatch {
            store,
            unsettled: Unsettled::default(),
        }
    }

    /// Watches a failed disk until it takes writes again, then stores what waited and clears `degraded`.
    pub(super) async fn watch(&self, port: &impl StorageWatchPort, mut stop: Listener) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CHECK_EVERY) => {}
                _ = stop.recv() => return,
            }
            let failing = port.health_causes(|c| c.storage_error.is_some());
            if !failing {
                // Seen before any write is refused: the LED and `status` tell the household early.
                if let Err(e) = self.store.writable() {
                    set_error(port, Some(e.to_string()));
                } else if self.store.needs_reopen() {
                    set_error(
                        port,
                        Some("a write to the store failed; retrying once the disk works".into()),
                    );
                } else if let Some(why) = self.store.history_behind() {
                    set_error(port, Some(why));
                }
                continue;
            }
            if let Err(e) = self.store.disk_ok(0) {
                set_error(port, Some(e.to_string()));
                continue;
            }
            if let Err(e) = probe_write(self.store.dir()) {
                set_error(
                    port,
                    Some(format!("the data disk does not accept writes: {e}")),
                );
                continue;
            }
            if self.store.needs_reopen() {
                info!("the data disk accepts writes again: reopening the store");
                match self.store.reopen().await {
                    Ok(()) => {}
                    Err(StoreError::Stuck) => return restart_store(port).await,
                    Err(e) => {
                        warn!("could not reopen the store: {e}");
                        set_error(port, Some(e.to_string()));
                        continue;
                    }
                }
            }
            // Changes durable in sled that the history database could not take yet.
            if let Err(e) = self.store.retry_apply() {
                set_error(port, Some(e.to_string()));
                continue;
            }
            // The answers that waited are stored before `online` is said (one commit, so the
            // committer's success is what says it): a device that writes on seeing `online`
            // finds them in history ahead of its own message.
            if let Err(e) = self.settle_unsettled(port).await {
                set_error(port, Some(e));
                continue;
            }
            set_error(port, None);
        }
    }

    /// Keeps a turn's final changes that could not be stored, to store them on recovery.
    pub(super) fn keep_unsettled(&self, changes: Vec<Change>) {
        self.unsettled.keep(changes);
    }

    /// Stores (and so delivers) the answers that finished while the disk was failing, in one
    /// commit (at most `MAX_UNSETTLED` answers); on failure they are kept for the next try.
    async fn settle_unsettled(&self, port: &impl StorageWatchPort) -> Result<(), String> {
        let kept = self.unsettled.take_all();
        if kept.is_empty() {
            return Ok(());
        }
        info!(
            "storing {} answer(s) that finished while the disk was failing",
            kept.len()
        );
        let changes: Vec<_> = kept.iter().flatten().cloned().collect();
        match port.commit(changes, None).await {
            Ok(_) => Ok(()),
            Err(e) => {
                warn!("could not store the kept answers: {e}");
                for changes in kept {
                    self.keep_unsettled(changes);
                }
                Err(e.to_string())
            }
        }
    }
}

/// The disk works again but sled cannot resume in this process (`StoreError::Stuck`): tell
/// the devices the gateway is restarting and exit with status 1, so that systemd
/// (`Restart=on-failure`) starts it again; the new process opens the store from disk.
async fn restart_store(port: &impl StorageWatchPort) {
    error!(
        "the data disk works again, but the storage engine cannot resume after the failure \
     without a restart: exiting with status 1 so the service manager restarts the gateway"
    );
    port.begin_shutdown();
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::process::exit(1);
}

/// Writes, fsyncs and removes a small file: whether the disk really takes writes again.
fn probe_write(dir: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let path = dir.join(PROBE_FILE);
    let result = (|| {
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&[0u8; 4096])?;
        f.sync_all()
    })();
    let _ = std::fs::remove_file(&path);
    result
}
