//! Media metadata: which files exist, who uploaded them under which ref, who uses them.
//!
//! The bytes live in files named by their SHA-256 (see `crate::media`); sled holds:
//! - `media`: media id → record (kind, mime, size, filename, sha256);
//! - `media_refs`: `device_id 0x00 media_ref` → media id (a device's upload handle);
//! - `blobs`: sha256 → how many media records share those bytes;
//!
//! and the history database holds `media_uses` (media id, message id): which messages
//! reference a file, written with the message.
//!
//! Written only through a commit: `Change::AddMedia` for a stored file, `Change::RemoveMedia`
//! for one no message uses any more (`unused_media` finds them: a message's deletion drops its
//! media uses in the same transaction). The commit turns each into absolute blob counts
//! (`Record::PutMedia`, `Record::DropMedia`), so a replay after a crash counts nothing twice; a
//! blob whose count reached zero (`blob_is_kept` false) can have its file deleted.

use serde::{Deserialize, Serialize};

use super::base::{from_json, Result};
use super::engine::handle::Store;
use crate::protocol::MediaRef;

/// One stored file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MediaRecord {
    pub media_id: String,
    pub sha256: String,
    pub kind: String,
    pub mime: String,
    pub size: u64,
    pub filename: String,
    /// When the bytes were stored; unused uploads older than a day are collected at start.
    #[serde(default)]
    pub created_ms: i64,
}

impl MediaRecord {
    /// The wire form (`definitions.media_ref`).
    pub fn to_ref(&self, message_id: Option<&str>) -> MediaRef {
        MediaRef {
            media_id: self.media_id.clone(),
            kind: self.kind.clone(),
            mime: self.mime.clone(),
            size: self.size as i64,
            filename: self.filename.clone(),
            message_id: message_id.map(str::to_owned),
        }
    }
}

pub(super) fn ref_key(device_id: &str, media_ref: &str) -> Vec<u8> {
    [device_id.as_bytes(), &[0], media_ref.as_bytes()].concat()
}

impl Store {
    pub fn media(&self, media_id: &str) -> Result<Option<MediaRecord>> {
        match self.t()?.media.get(media_id.as_bytes())? {
            Some(v) => Ok(Some(from_json(&v, "media record")?)),
            None => Ok(None),
        }
    }

    /// The media a device uploaded under `media_ref`.
    pub fn media_by_ref(&self, device_id: &str, media_ref: &str) -> Result<Option<MediaRecord>> {
        match self.t()?.media_refs.get(ref_key(device_id, media_ref))? {
            Some(id) => self.media(&String::from_utf8_lossy(&id)),
            None => Ok(None),
        }
    }

    /// The media among `candidates` that exist and that no message uses any more.
    pub fn unused_media(&self, candidates: &[String]) -> Result<Vec<MediaRecord>> {
        let mut out = Vec::new();
        for media_id in candidates {
            if self.read_history()?.hist.is_used(media_id)? {
                continue;
            }
            if let Some(record) = self.media(media_id)? {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// Whether some media record still shares the bytes `sha256` (their file must stay).
    pub fn blob_is_kept(&self, sha256: &str) -> Result<bool> {
        Ok(self.t()?.blobs.get(sha256.as_bytes())?.is_some())
    }

    /// Media stored before `cutoff_ms` (candidates for collection if no message uses them).
    pub fn media_older_than(&self, cutoff_ms: i64) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for item in self.t()?.media.iter() {
            let (_, v) = item?;
            let record: MediaRecord = from_json(&v, "media record")?;
            if record.created_ms < cutoff_ms {
                out.push(record.media_id);
            }
        }
        Ok(out)
    }

    /// Every blob (sha256) with at least one record: what must stay on disk.
    pub fn live_blobs(&self) -> Result<Vec<String>> {
        self.t()?
            .blobs
            .iter()
            .keys()
            .map(|k| Ok(String::from_utf8_lossy(&k?).into_owned()))
            .collect()
    }
}
