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
//! A message's deletion drops its media uses in the same transaction; `collect_unused` then
//! removes media no message uses any more and reports the blobs whose last record went, so the
//! caller can delete the file.

use serde::{Deserialize, Serialize};

use super::{from_json, to_json, Result, Store};
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

fn ref_key(device_id: &str, media_ref: &str) -> Vec<u8> {
    [device_id.as_bytes(), &[0], media_ref.as_bytes()].concat()
}

impl Store {
    /// Records a finished upload under the device's ref; durable when this returns.
    pub fn add_media(&self, record: &MediaRecord, device_id: &str, media_ref: &str) -> Result<()> {
        self.writable()?;
        let count = self
            .t()?
            .blobs
            .get(record.sha256.as_bytes())?
            .map(|v| super::u64_from(&v))
            .unwrap_or(0);
        self.t()?
            .blobs
            .insert(record.sha256.as_bytes(), &(count + 1).to_be_bytes())?;
        self.t()?
            .media
            .insert(record.media_id.as_bytes(), to_json(record))?;
        if !device_id.is_empty() {
            self.t()?
                .media_refs
                .insert(ref_key(device_id, media_ref), record.media_id.as_bytes())?;
        }
        Ok(())
    }

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

    /// Removes media that no message uses any more among `candidates`; returns the sha256 of
    /// every blob that no record shares any longer (its file can go).
    pub fn collect_unused(&self, candidates: &[String]) -> Result<Vec<String>> {
        self.writable()?;
        let mut freed = Vec::new();
        for media_id in candidates {
            if self.read_history()?.hist.is_used(media_id)? {
                continue;
            }
            let Some(record) = self.media(media_id)? else {
                continue;
            };
            self.t()?.media.remove(media_id.as_bytes())?;
            let count = self
                .t()?
                .blobs
                .get(record.sha256.as_bytes())?
                .map(|v| super::u64_from(&v))
                .unwrap_or(1);
            if count <= 1 {
                self.t()?.blobs.remove(record.sha256.as_bytes())?;
                freed.push(record.sha256);
            } else {
                self.t()?
                    .blobs
                    .insert(record.sha256.as_bytes(), &(count - 1).to_be_bytes())?;
            }
        }
        // Device refs pointing at removed media are dropped lazily: a lookup finds no record.
        Ok(freed)
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
