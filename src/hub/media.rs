//! `Media`: the media files as the hub serves them. It owns the files on disk (`MediaFiles`),
//! recording a verified upload, collecting media no message uses, and the holds a backup takes
//! while it reads the files (with the removals that wait for them). It reaches the hub only
//! through its port (`port.rs`): the committer and the health (a full media disk degrades it).

use std::cell::{Cell, RefCell};
use std::rc::Weak;

use tracing::warn;

use crate::ids;
use crate::media::MediaFiles;
use crate::store::{Change, MediaRecord, Store};

use super::errors::CommitError;
use super::port::Back;
use super::port::Port;

/// The media files, and the backups reading them right now.
pub struct Media<P> {
    port: Back<P>,
    files: MediaFiles,
    store: Store,
    holds: Holds,
}

/// Backups streaming media right now (`Media::hold_files`), and the files whose removal waits
/// for them.
#[derive(Default)]
struct Holds {
    count: Cell<usize>,
    deferred: RefCell<Vec<String>>,
}

/// While alive, media files are not deleted (a backup is reading them); see `Media::collect`.
pub struct MediaHold<'a> {
    files: &'a MediaFiles,
    holds: &'a Holds,
}

impl Drop for MediaHold<'_> {
    fn drop(&mut self) {
        let holds = self.holds;
        holds.count.set(holds.count.get() - 1);
        if holds.count.get() == 0 {
            for sha in std::mem::take(&mut *holds.deferred.borrow_mut()) {
                self.files.remove_blob(&sha);
            }
        }
    }
}

// The doors above the hub only ever see the service over the `Hub` (its accessor), so the
// port it is generic over stays the hub's own.
#[allow(private_bounds)]
impl<P: Port> Media<P> {
    /// `port`: the hub being built around these files (it owns them, so it is held weakly).
    pub(super) fn new(port: Weak<P>, files: MediaFiles, store: Store) -> Media<P> {
        Media {
            port: Back::new(port),
            files,
            store,
            holds: Holds::default(),
        }
    }

    /// The files on disk: where uploads are written and pulls read from.
    pub fn files(&self) -> &MediaFiles {
        &self.files
    }

    /// Media storage is full (`Some(why)`) or has room again (`None`): a cause of `degraded`.
    pub fn set_full(&self, why: Option<String>) {
        self.port.hub().update_health(|st| st.media_full = why);
    }

    /// Records a verified upload under the device's ref, durably, and returns its record.
    pub async fn finish_upload(
        &self,
        device_id: &str,
        media_ref: &str,
        start: &crate::protocol::UploadStart,
        sha256: String,
        size: u64,
    ) -> Result<MediaRecord, CommitError> {
        let record = MediaRecord {
            media_id: ids::time_ordered("med"),
            sha256,
            kind: start.kind.clone(),
            mime: start.mime.chars().take(128).collect(),
            size,
            filename: crate::media::clean_filename(&start.filename),
            created_ms: ids::now_ms(),
        };
        let add = Change::AddMedia {
            record: record.clone(),
            device_id: device_id.to_owned(),
            media_ref: media_ref.to_owned(),
        };
        self.port.hub().commit(vec![add], None).await?;
        self.set_full(None);
        Ok(record)
    }

    /// Deletes media that no message uses any more, and their files. The records' removal is
    /// made durable before any file goes, so a crash can leave an orphaned file (removed at the
    /// next start) but never a record whose bytes are gone.
    pub async fn collect(&self, media_ids: &[String]) {
        if media_ids.is_empty() {
            return;
        }
        let unused = match self.store.unused_media(media_ids) {
            Ok(unused) => unused,
            Err(e) => return warn!("media clean-up failed: {e}"),
        };
        if unused.is_empty() {
            return;
        }
        let gone = unused
            .iter()
            .map(|m| Change::RemoveMedia(m.media_id.clone()))
            .collect();
        if let Err(e) = self.port.hub().commit(gone, None).await {
            return warn!("media clean-up not durable, files kept: {e}");
        }
        // A file goes once no record shares its bytes, as the commit left the counts.
        let mut freed: Vec<String> = unused
            .into_iter()
            .map(|m| m.sha256)
            .filter(|sha| matches!(self.store.blob_is_kept(sha), Ok(false)))
            .collect();
        // Two unused records of one file name its blob twice.
        freed.sort();
        freed.dedup();
        if self.holds.count.get() > 0 {
            // A backup is streaming media: the files go when it is done.
            self.holds.deferred.borrow_mut().extend(freed);
            return;
        }
        for sha in freed {
            self.files.remove_blob(&sha);
        }
    }

    /// Keeps every media file on disk until the returned hold is dropped (`backup`).
    pub fn hold_files(&self) -> MediaHold<'_> {
        self.holds.count.set(self.holds.count.get() + 1);
        MediaHold {
            files: &self.files,
            holds: &self.holds,
        }
    }
}
