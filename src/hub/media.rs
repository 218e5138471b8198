//! Media records and files: recording a verified upload, collecting media no message uses, and
//! holding files on disk while a backup reads them.

use tracing::warn;

use crate::ids;
use crate::store::{Change, MediaRecord};

use super::errors::CommitError;
use super::state::Hub;

/// While alive, media files are not deleted (a backup is reading them); see `collect_media`.
pub struct MediaHold<'a>(&'a Hub);

impl Drop for MediaHold<'_> {
    fn drop(&mut self) {
        let hub = self.0;
        hub.media_holds.count.set(hub.media_holds.count.get() - 1);
        if hub.media_holds.count.get() == 0 {
            for sha in std::mem::take(&mut *hub.media_holds.deferred.borrow_mut()) {
                hub.media.remove_blob(&sha);
            }
        }
    }
}

impl Hub {
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
        self.commit(vec![add], None).await?;
        self.set_media_full(None);
        Ok(record)
    }

    /// Deletes media that no message uses any more, and their files. The records' removal is
    /// made durable before any file goes, so a crash can leave an orphaned file (removed at the
    /// next start) but never a record whose bytes are gone.
    pub async fn collect_media(&self, media_ids: &[String]) {
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
        if let Err(e) = self.commit(gone, None).await {
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
        if self.media_holds.count.get() > 0 {
            // A backup is streaming media: the files go when it is done.
            self.media_holds.deferred.borrow_mut().extend(freed);
            return;
        }
        for sha in freed {
            self.media.remove_blob(&sha);
        }
    }

    /// Keeps every media file on disk until the returned hold is dropped (`backup`).
    pub fn hold_media_files(&self) -> MediaHold<'_> {
        self.media_holds.count.set(self.media_holds.count.get() + 1);
        MediaHold(self)
    }
}
