//! The store as the doors above the hub see it: the admin page, the control socket and a
//! device's session read it (devices, replay, backups, free space) but never write to it. Every
//! durable change goes through the hub's committer, which publishes it in cursor order only after
//! it is synced; a door holding a `Store` could commit around that, so it gets this handle, whose
//! type has no way to write.

use std::path::Path;

use bytes::Bytes;

use super::backup::{BackupError, BackupWriter};
use super::base::Result;
use super::devices::Device;
use super::engine::handle::Store;

/// A read-only handle on the live store (cheap to clone: it shares the store's handles).
#[derive(Clone)]
pub struct StoreView(Store);

impl Store {
    /// This store, for a reader that must not write.
    pub fn view(&self) -> StoreView {
        StoreView(self.clone())
    }
}

impl StoreView {
    /// The data dir the store lives in.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }

    /// The paired devices.
    pub fn devices(&self) -> Result<Vec<Device>> {
        self.0.devices()
    }

    /// Whether `bytes` more would still leave the store its reserve (`durability.rs`).
    pub fn disk_ok(&self, bytes: u64) -> Result<()> {
        self.0.disk_ok(bytes)
    }

    /// The store's size on disk: sled and the history database.
    pub fn size_on_disk(&self) -> Result<u64> {
        self.0.size_on_disk()
    }

    /// The newest cursor committed.
    pub fn cursor_head(&self) -> Result<u64> {
        self.0.cursor_head()
    }

    /// Outbox frames after `after` up to `upto`, at most `max` (a `sync` replay's batch).
    pub fn outbox_range(&self, after: u64, upto: u64, max: usize) -> Result<Vec<(u64, Bytes)>> {
        self.0.outbox_range(after, upto, max)
    }

    /// Where a device's cursor fell into a gap left by a restore (`outbox.rs`).
    pub fn forked_at(&self, cursor: u64) -> Result<Option<u64>> {
        self.0.forked_at(cursor)
    }

    /// Media blobs still used, for a backup's media part.
    pub fn live_blobs(&self) -> Result<Vec<String>> {
        self.0.live_blobs()
    }

    /// Every tree into a backup, as one consistent snapshot.
    pub fn export_trees<W: std::io::Write>(
        &self,
        w: &mut BackupWriter<W>,
    ) -> std::result::Result<u64, BackupError> {
        self.0.export_trees(w)
    }
}
