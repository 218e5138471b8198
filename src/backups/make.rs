//! Making a backup: one file (format in `store/backup.rs`) with every sled tree, then every
//! media file, then a checksum.
//!
//! The store part is written in one go on the event loop (every store write happens there, so
//! nothing changes half-way: a consistent snapshot; the gateway pauses for as long as that
//! takes), the media part from a worker thread (files are immutable and named by their
//! SHA-256; deleting any of them waits until the backup is done). Three ways out: as a stream
//! of chunks ([`stream`]: the admin page's download, the schedule, and `iris-gateway backup`
//! through the control socket), straight into a writer when no spool can be written
//! ([`store_part`], then [`StorePart::send_media`]), and from the store itself when no gateway
//! runs ([`write_offline`]).

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::hub::Hub;
use crate::store::backup::{BackupError, BackupWriter, Header};
use crate::store::{Store, StoreError, StoreView};

/// Reads and writes of a backup go in pieces this big.
pub const CHUNK: usize = 1 << 16;

/// Why a backup or a restore did not happen; the command prints it, the admin page shows it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Backup(#[from] BackupError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Refused(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

/// The `Io` error for `what` was being done (what a person reads first).
pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// The media files the store records (live blobs), with their sizes.
fn media_list(store: &StoreView, media_dir: &Path) -> Result<MediaList, StoreError> {
    Ok(store
        .live_blobs()?
        .into_iter()
        .filter_map(|sha| {
            let size = std::fs::metadata(media_dir.join(&sha)).ok()?.len();
            Some((sha, size))
        })
        .collect())
}

/// Media files to add to a backup: name (SHA-256) and size.
type MediaList = Vec<(String, u64)>;

/// Writes the store part: the header and every tree. Returns the writer and the media to add.
fn snapshot<W: Write>(
    store: &StoreView,
    media_dir: &Path,
    out: W,
) -> Result<(BackupWriter<W>, MediaList), Error> {
    let media = media_list(store, media_dir)?;
    let header = Header::new(
        store.cursor_head()?,
        media.len() as u64,
        media.iter().map(|(_, n)| n).sum(),
    );
    let mut w = BackupWriter::new(out, &header).map_err(io("writing the backup"))?;
    store.export_trees(&mut w)?;
    Ok((w, media))
}

/// Appends the media files and the checksum. A file gone since the listing is left out.
fn add_media<W: Write>(
    mut w: BackupWriter<W>,
    media_dir: &Path,
    media: &[(String, u64)],
) -> std::io::Result<(W, u64)> {
    let mut included = 0;
    let mut buf = vec![0u8; CHUNK];
    for (sha, size) in media {
        let Ok(f) = std::fs::File::open(media_dir.join(sha)) else {
            continue;
        };
        w.media_start(sha, *size)?;
        let mut body = f.take(*size);
        let mut left = *size;
        while left > 0 {
            let n = body.read(&mut buf)?;
            if n == 0 {
                // Shorter than listed: the backup cannot be completed truthfully.
                return Err(std::io::Error::other(format!(
                    "media file {sha} is shorter than the {size} bytes recorded"
                )));
            }
            w.media_bytes(&buf[..n])?;
            left -= n as u64;
        }
        included += 1;
    }
    Ok((w.finish()?, included))
}

/// A backup whose store part is written (on the event loop: a consistent snapshot) and whose
/// media files are still to come ([`StorePart::send_media`]).
pub struct StorePart<W: Write> {
    writer: BackupWriter<W>,
    media: MediaList,
    media_dir: PathBuf,
}

/// Writes the store part of a backup made now into `out`, without yielding to the event loop.
/// A snapshot that finds the history database damaged makes the gateway `degraded`.
pub fn store_part<W: Write>(hub: &Hub, out: W) -> Result<StorePart<W>, Error> {
    let media_dir = hub.store().dir().join("media");
    let (writer, media) = snapshot(hub.store(), &media_dir, out).inspect_err(|e| {
        note_damage(hub, e);
    })?;
    Ok(StorePart {
        writer,
        media,
        media_dir,
    })
}

impl<W: Write + Send + 'static> StorePart<W> {
    /// Bytes written so far (the store part).
    pub fn bytes(&self) -> u64 {
        self.writer.bytes
    }

    /// Appends the media files and the checksum from a worker thread; the files stay on disk
    /// until it is done. Returns how many media files went in.
    pub async fn send_media(self, hub: &Hub) -> std::io::Result<u64> {
        let _hold = hub.media().hold_files();
        let StorePart {
            writer,
            media,
            media_dir,
        } = self;
        tokio::task::spawn_blocking(move || add_media(writer, &media_dir, &media))
            .await
            .map_err(std::io::Error::other)?
            .map(|(_, included)| included)
    }
}

/// A snapshot that found the history database damaged makes the gateway `degraded` with that
/// cause: every later backup would fail the same way, and nothing else may show it.
fn note_damage(hub: &Hub, e: &Error) {
    if let Error::Backup(BackupError::HistoryDamaged { .. }) = e {
        hub.status().note_history_damaged(e.to_string());
    }
}

/// A backup of the store in `dir`, for when no gateway runs (the command holds sled's lock
/// meanwhile): written to `out`, which is returned synced.
pub fn write_offline(dir: &Path, out: std::fs::File) -> Result<std::fs::File, Error> {
    let store = Store::open(dir, 1 << 20, Duration::from_secs(5))?;
    let media_dir = dir.join("media");
    let (w, media) = snapshot(
        &store.view(),
        &media_dir,
        BufWriter::with_capacity(CHUNK, out),
    )?;
    let (out, _) = add_media(w, &media_dir, &media).map_err(io("writing the backup"))?;
    let file = out.into_inner().map_err(|e| Error::Io {
        what: "writing the backup".into(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io("writing the backup"))?;
    Ok(file)
}

/// Chunks of a streamed backup in flight between the worker thread and the HTTP answer.
const STREAM_CHUNKS: usize = 4;

/// Where [`stream`] writes: first a spool file (the store part, written on the event loop),
/// then the channel to the HTTP answer (everything else, from a worker thread). The switch is
/// made through the shared mode, since the backup writer owns this writer.
struct Switch(std::sync::Arc<std::sync::Mutex<Mode>>);

/// Where the backup's bytes go now.
enum Mode {
    Spool(BufWriter<std::fs::File>),
    Channel {
        tx: tokio::sync::mpsc::Sender<std::io::Result<bytes::Bytes>>,
        buf: Vec<u8>,
    },
    Gone,
}

impl Write for Switch {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let mut mode = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *mode {
            Mode::Spool(f) => f.write(data),
            Mode::Channel { tx, buf } => {
                buf.extend_from_slice(data);
                if buf.len() >= CHUNK {
                    let chunk = bytes::Bytes::from(std::mem::take(buf));
                    tx.blocking_send(Ok(chunk))
                        .map_err(|_| std::io::Error::other("the browser stopped reading"))?;
                }
                Ok(data.len())
            }
            Mode::Gone => Err(std::io::Error::other("backup stream closed")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut mode = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *mode {
            Mode::Spool(f) => f.flush(),
            Mode::Channel { tx, buf } if !buf.is_empty() => {
                let chunk = bytes::Bytes::from(std::mem::take(buf));
                tx.blocking_send(Ok(chunk))
                    .map_err(|_| std::io::Error::other("the browser stopped reading"))
            }
            _ => Ok(()),
        }
    }
}

/// A backup made now, as a stream of chunks for an HTTP answer (never whole in memory). The
/// store part is written on the event loop, as for `iris-gateway backup` (a consistent
/// snapshot), to an unlinked spool file in the data dir; a worker thread then sends it and the
/// media files, at most [`STREAM_CHUNKS`] × 64 KiB ahead of the browser. A failure half-way
/// ends the stream with an error, so the browser sees a failed download, not a short file.
pub fn stream(
    hub: &std::rc::Rc<Hub>,
) -> Result<tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>, Error> {
    let store = hub.store();
    store.disk_ok(store.size_on_disk()?)?;
    let spool_path = store
        .dir()
        .join(format!(".admin-backup-{}.spool", crate::ids::now_ms()));
    let spool = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&spool_path)
        .map_err(io(format!("cannot create {}", spool_path.display())))?;
    // Unlinked at once: a crash leaves nothing behind; the open handle keeps the bytes.
    let _ = std::fs::remove_file(&spool_path);
    let reader = spool.try_clone().map_err(io("spool file"))?;
    let mode = std::sync::Arc::new(std::sync::Mutex::new(Mode::Spool(
        BufWriter::with_capacity(CHUNK, spool),
    )));
    let media_dir = store.dir().join("media");
    let (writer, media) = snapshot(store, &media_dir, Switch(mode.clone())).inspect_err(|e| {
        note_damage(hub, e);
    })?;
    let (tx, rx) = tokio::sync::mpsc::channel(STREAM_CHUNKS);
    // Media files stay on disk until the worker is done with them.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    {
        let hub = hub.clone();
        tokio::task::spawn_local(async move {
            let _hold = hub.media().hold_files();
            let _ = done_rx.await;
        });
    }
    std::thread::Builder::new()
        .name("admin-backup".into())
        .spawn(move || {
            let _done = done_tx;
            let result = (|| -> std::io::Result<u64> {
                let old = std::mem::replace(
                    &mut *mode.lock().unwrap_or_else(|p| p.into_inner()),
                    Mode::Channel {
                        tx: tx.clone(),
                        buf: Vec::with_capacity(CHUNK),
                    },
                );
                let Mode::Spool(mut spool) = old else {
                    return Err(std::io::Error::other("backup spool lost"));
                };
                spool.flush()?;
                let mut file = reader;
                use std::io::Seek;
                file.seek(std::io::SeekFrom::Start(0))?;
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = file.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    tx.blocking_send(Ok(bytes::Bytes::copy_from_slice(&buf[..n])))
                        .map_err(|_| std::io::Error::other("the browser stopped reading"))?;
                }
                let (mut out, included) = add_media(writer, &media_dir, &media)?;
                out.flush()?;
                Ok(included)
            })();
            *mode.lock().unwrap_or_else(|p| p.into_inner()) = Mode::Gone;
            match result {
                Ok(media) => tracing::info!(media, "admin page: backup downloaded"),
                Err(e) => {
                    tracing::warn!("admin page: backup not completed: {e}");
                    let _ = tx.blocking_send(Err(e));
                }
            }
        })
        .map_err(io("cannot start the backup thread"))?;
    Ok(rx)
}
