//! Media bytes on the SD card: content-addressed files, streamed uploads, quota and free space.
//!
//! Files are named by the SHA-256 of their bytes (`DATA_DIR/media/<sha256>`), so the same bytes
//! are stored once and no name a client sends ever becomes part of a path. An upload streams
//! into `media/tmp/` chunk by chunk (memory does not depend on the file's size), is checked
//! against the announced size and checksum, fsynced, and only then renamed into place; a
//! failed, abandoned or crashed upload leaves nothing behind (the temp file is removed on drop
//! and `media/tmp` is emptied at start). Metadata lives in the store (`store/media.rs`).

use std::cell::Cell;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// Free space kept back on the data disk: the store must still be able to write when media
/// has filled everything else.
const DISK_RESERVE_BYTES: u64 = 64 << 20;

/// The media kinds of the schema (`definitions.kind`).
pub const KINDS: [&str; 5] = ["image", "audio", "video", "document", "voice"];

#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    #[error("the file is {size} bytes; the limit is {max} (limits.max_media_bytes)")]
    TooLarge { size: u64, max: u64 },
    #[error("media storage is full ({used} of {quota} bytes used, limits.media_quota_bytes); delete messages with media to make room")]
    QuotaFull { used: u64, quota: u64 },
    #[error(
        "the data disk is full ({available} bytes free); delete messages with media to make room"
    )]
    DiskFull { available: u64 },
    #[error("more bytes arrived than the {expected} announced")]
    TooMuchData { expected: u64 },
    #[error("{received} bytes arrived; {expected} were announced")]
    WrongLength { received: u64, expected: u64 },
    #[error("the checksum does not match (got sha256 {actual})")]
    WrongChecksum { actual: String },
    #[error("media storage I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

impl MediaError {
    /// Space problems degrade the gateway (and clear when space returns).
    pub fn is_space(&self) -> bool {
        matches!(
            self,
            MediaError::QuotaFull { .. } | MediaError::DiskFull { .. }
        )
    }
}

pub struct MediaFiles {
    dir: PathBuf,
    tmp: PathBuf,
    max_size: u64,
    quota: u64,
    /// Bytes of stored blobs, kept in memory: a directory scan at start, then adjusted.
    used: Cell<u64>,
}

impl MediaFiles {
    /// Opens the media directory, discarding any upload a crash left half-written and, when
    /// `live` (the blobs the store has records for) is given, any file no record points at: what
    /// a crash between storing bytes and recording them, or between removing a record and its
    /// file, leaves behind. One pass over the directory also sums what the quota counts.
    pub fn open(
        data_dir: &Path,
        max_size: u64,
        quota: u64,
        live: Option<&std::collections::HashSet<String>>,
    ) -> std::io::Result<MediaFiles> {
        let dir = data_dir.join("media");
        let tmp = dir.join("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        let mut used = 0;
        let mut orphans = 0;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if !entry.file_type()?.is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if live.is_some_and(|live| !live.contains(&name)) {
                std::fs::remove_file(entry.path())?;
                orphans += 1;
            } else {
                used += entry.metadata()?.len();
            }
        }
        if orphans > 0 {
            tracing::warn!("removed {orphans} media file(s) no record points at (left by a crash)");
        }
        Ok(MediaFiles {
            dir,
            tmp,
            max_size,
            quota,
            used: Cell::new(used),
        })
    }

    pub fn used(&self) -> u64 {
        self.used.get()
    }

    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.dir.join(sha256)
    }

    /// Whether `size` more bytes may be stored: the per-file limit, the quota, the free disk.
    pub fn check_space(&self, size: u64) -> Result<(), MediaError> {
        if size > self.max_size {
            return Err(MediaError::TooLarge {
                size,
                max: self.max_size,
            });
        }
        if self.used.get() + size > self.quota {
            return Err(MediaError::QuotaFull {
                used: self.used.get(),
                quota: self.quota,
            });
        }
        let available = crate::disk::free_bytes(&self.dir)?;
        if available < size.saturating_add(DISK_RESERVE_BYTES) {
            return Err(MediaError::DiskFull { available });
        }
        Ok(())
    }

    /// Starts an upload of `size` bytes after checking there is room for it.
    pub async fn begin(&self, size: u64) -> Result<Upload, MediaError> {
        self.check_space(size)?;
        let tmp = self
            .tmp
            .join(format!("{}.part", crate::ids::time_ordered("up")));
        let file = tokio::fs::File::create(&tmp).await?;
        Ok(Upload {
            file: Some(file),
            tmp,
            hasher: Sha256::new(),
            received: 0,
            expected: size,
        })
    }

    /// Stores bytes the agent produced (small files: held in memory by the agent anyway).
    pub async fn store_bytes(&self, bytes: &[u8]) -> Result<(String, u64), MediaError> {
        let mut up = self.begin(bytes.len() as u64).await?;
        up.write(bytes).await?;
        let sha = hex(&Sha256::digest(bytes));
        up.finish(self, &sha).await
    }

    /// Deletes a blob no record uses any more.
    pub fn remove_blob(&self, sha256: &str) {
        let path = self.blob_path(sha256);
        if let Ok(meta) = std::fs::metadata(&path) {
            if std::fs::remove_file(&path).is_ok() {
                self.used.set(self.used.get().saturating_sub(meta.len()));
            }
        }
    }
}

/// An upload in progress. Dropping it unfinished removes its temp file.
pub struct Upload {
    file: Option<tokio::fs::File>,
    tmp: PathBuf,
    hasher: Sha256,
    received: u64,
    expected: u64,
}

impl Upload {
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Appends a chunk; refuses bytes beyond the announced size.
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), MediaError> {
        if self.received + chunk.len() as u64 > self.expected {
            return Err(MediaError::TooMuchData {
                expected: self.expected,
            });
        }
        if let Some(f) = self.file.as_mut() {
            f.write_all(chunk).await?;
        }
        self.hasher.update(chunk);
        self.received += chunk.len() as u64;
        Ok(())
    }

    /// Verifies length and checksum, makes the bytes durable and moves them into place.
    /// Returns the content's sha256 and size.
    pub async fn finish(
        mut self,
        files: &MediaFiles,
        claimed_sha256: &str,
    ) -> Result<(String, u64), MediaError> {
        if self.received != self.expected {
            return Err(MediaError::WrongLength {
                received: self.received,
                expected: self.expected,
            });
        }
        let actual = hex(&std::mem::take(&mut self.hasher).finalize());
        if !actual.eq_ignore_ascii_case(claimed_sha256.trim()) {
            return Err(MediaError::WrongChecksum { actual });
        }
        let mut file = self.file.take().expect("an unfinished upload has its file");
        file.flush().await?;
        file.sync_all().await?;
        drop(file);
        let target = files.blob_path(&actual);
        if tokio::fs::try_exists(&target).await.unwrap_or(false) {
            // Same bytes already stored: keep one copy.
            tokio::fs::remove_file(&self.tmp).await?;
        } else {
            tokio::fs::rename(&self.tmp, &target).await?;
            // The rename is durable only once the directory is: before the record points at it.
            tokio::fs::File::open(&files.dir).await?.sync_all().await?;
            files.used.set(files.used.get() + self.received);
        }
        self.tmp = PathBuf::new();
        Ok((actual, self.received))
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A display name that is safe to show and store: no directories, no control characters.
/// It never becomes part of a path (files are named by their hash); this only keeps the
/// metadata tidy.
pub fn clean_filename(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or("");
    let cleaned: String = base.chars().filter(|c| !c.is_control()).take(255).collect();
    let cleaned = cleaned.trim().trim_start_matches('.').to_owned();
    if cleaned.is_empty() {
        "file".into()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn upload_checks_length_and_checksum_and_dedupes() {
        let dir = tempfile::tempdir().unwrap();
        let files = MediaFiles::open(dir.path(), 1 << 20, 10 << 20, None).unwrap();
        let data = b"hello media";
        let sha = hex(&Sha256::digest(data));
        let mut up = files.begin(data.len() as u64).await.unwrap();
        up.write(&data[..5]).await.unwrap();
        up.write(&data[5..]).await.unwrap();
        assert_eq!(up.finish(&files, &sha).await.unwrap(), (sha.clone(), 11));
        assert!(files.blob_path(&sha).exists());
        assert_eq!(files.used(), 11);
        // The same bytes again: stored once.
        let (again, _) = files.store_bytes(data).await.unwrap();
        assert_eq!(again, sha);
        assert_eq!(files.used(), 11);
        // Wrong checksum and truncation leave nothing behind.
        let mut up = files.begin(3).await.unwrap();
        up.write(b"abc").await.unwrap();
        assert!(matches!(
            up.finish(&files, "00").await,
            Err(MediaError::WrongChecksum { .. })
        ));
        let mut up = files.begin(3).await.unwrap();
        up.write(b"ab").await.unwrap();
        assert!(matches!(
            up.finish(&files, &sha).await,
            Err(MediaError::WrongLength { .. })
        ));
        let mut up = files.begin(3).await.unwrap();
        assert!(matches!(
            up.write(b"abcd").await,
            Err(MediaError::TooMuchData { .. })
        ));
        drop(up);
        assert_eq!(
            std::fs::read_dir(dir.path().join("media/tmp"))
                .unwrap()
                .count(),
            0
        );
        files.remove_blob(&sha);
        assert_eq!(files.used(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn limits_refuse_before_any_byte_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let files = MediaFiles::open(dir.path(), 100, 150, None).unwrap();
        assert!(matches!(
            files.begin(101).await,
            Err(MediaError::TooLarge { .. })
        ));
        files.store_bytes(&[1u8; 100]).await.unwrap();
        let err = files.begin(60).await.err().unwrap();
        assert!(err.is_space(), "{err}");
    }

    #[test]
    fn filenames_cannot_name_directories() {
        assert_eq!(clean_filename("../../etc/passwd"), "passwd");
        assert_eq!(clean_filename("C:\\x\\photo.jpg"), "photo.jpg");
        assert_eq!(clean_filename("..\u{0}"), "file");
        assert_eq!(clean_filename(".hidden"), "hidden");
    }
}
