//! `iris-gateway backup FILE` and `iris-gateway restore FILE`.
//!
//! A backup is one file (format in `store/backup.rs`): every sled tree, then every media file,
//! then a checksum. While the gateway runs it owns sled's lock, so `backup` asks it over the
//! control socket and the gateway streams the backup back: the store part in one go on its
//! event loop (every store write happens there, so nothing changes half-way: a consistent
//! snapshot; the gateway pauses for as long as that takes), the media part from a worker thread
//! (files are immutable and named by their SHA-256; deleting any of them waits until the backup
//! is done). When no gateway runs, `backup` opens the store itself. Either way the command
//! writes `FILE.partial`, checks it end to end, fsyncs it and only then renames it to `FILE`.
//!
//! `restore` refuses while a gateway runs on the data dir, refuses a file that is not a whole,
//! undamaged backup before touching anything, builds the store in a staging directory inside
//! the data dir, checks it opens with the backup's cursor head, then moves the current store
//! and media aside (`DATA_DIR/before-restore-TIME/`, never deleted) and the restored ones in.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use crate::config::default_data_dir;
use crate::control;
use crate::hub::Hub;
use crate::store::backup::{read_backup, restore_into, BackupError, BackupWriter, Header, MAGIC};
use crate::store::{human_bytes, Store, StoreError};

/// How long the gateway waits for a `backup` command that stopped reading (its event loop is
/// paused meanwhile: well inside the systemd watchdog's 30 s).
const STALLED_READER: Duration = Duration::from_secs(10);
const CHUNK: usize = 1 << 16;

#[derive(Args, Debug)]
pub struct BackupArgs {
    /// Where to write the backup (replaced atomically if it exists).
    pub file: PathBuf,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// A file written by `iris-gateway backup`.
    pub file: PathBuf,
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

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

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// The media files the store records (live blobs), with their sizes.
fn media_list(store: &Store, media_dir: &Path) -> Result<MediaList, StoreError> {
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
    store: &Store,
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

// ---------------------------------------------------------------------------------------------
// In the gateway: answering `backup` on the control socket
// ---------------------------------------------------------------------------------------------

/// Streams a backup to a `backup` command on the control socket.
pub async fn serve(hub: &Hub, stream: tokio::net::UnixStream) -> std::io::Result<()> {
    let std_stream = stream.into_std()?;
    std_stream.set_nonblocking(false)?;
    std_stream.set_write_timeout(Some(STALLED_READER))?;
    let media_dir = hub.store().dir().join("media");
    let started = std::time::Instant::now();
    // The store part, without yielding to the event loop: a consistent snapshot.
    let out = BufWriter::with_capacity(CHUNK, std_stream.try_clone()?);
    let (writer, media) = match snapshot(hub.store(), &media_dir, out) {
        Ok(done) => done,
        Err(e) => {
            tracing::warn!("backup refused: {e}");
            let answer = control::ControlResponse::Error {
                message: format!("cannot make a backup: {e}"),
            };
            let mut line = serde_json::to_vec(&answer).unwrap_or_default();
            line.push(b'\n');
            let mut s = std_stream;
            return s.write_all(&line);
        }
    };
    tracing::info!(
        ms = started.elapsed().as_millis() as u64,
        bytes = writer.bytes,
        "backup: store snapshot sent; sending media"
    );
    // Media from a worker thread; their files stay until it is done.
    let _hold = hub.hold_media_files();
    let sent = tokio::task::spawn_blocking(move || add_media(writer, &media_dir, &media))
        .await
        .map_err(std::io::Error::other)?;
    match sent {
        Ok((_, included)) => {
            tracing::info!(
                media = included,
                ms = started.elapsed().as_millis() as u64,
                "backup sent"
            );
            Ok(())
        }
        Err(e) => {
            tracing::warn!("backup not completed: {e}");
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The commands
// ---------------------------------------------------------------------------------------------

pub fn run_backup(args: BackupArgs) -> Result<(), Error> {
    let dir = args.data_dir.unwrap_or_else(default_data_dir);
    let file = args.file;
    let partial = partial_path(&file);
    let result = (|| {
        let out = std::fs::File::create(&partial)
            .map_err(io(format!("cannot create {}", partial.display())))?;
        let from_gateway = match fetch_from_gateway(&dir)? {
            Some(mut stream) => {
                let mut out = BufWriter::with_capacity(CHUNK, out);
                std::io::copy(&mut stream, &mut out)
                    .map_err(io("reading the backup from the gateway"))?;
                out.into_inner()
                    .map_err(|e| Error::Io {
                        what: "writing the backup".into(),
                        source: e.into_error(),
                    })?
                    .sync_all()
                    .map_err(io("writing the backup"))?;
                true
            }
            None => {
                let store = Store::open(&dir, 1 << 20, Duration::from_secs(5))?;
                let media_dir = dir.join("media");
                let (w, media) =
                    snapshot(&store, &media_dir, BufWriter::with_capacity(CHUNK, out))?;
                let (out, _) =
                    add_media(w, &media_dir, &media).map_err(io("writing the backup"))?;
                out.into_inner()
                    .map_err(|e| Error::Io {
                        what: "writing the backup".into(),
                        source: e.into_error(),
                    })?
                    .sync_all()
                    .map_err(io("writing the backup"))?;
                false
            }
        };
        // Read back end to end: a backup that cannot be restored is not written as FILE.
        let name = file.display().to_string();
        let (header, counts) = verify(&name, &partial)?;
        std::fs::rename(&partial, &file).map_err(io(format!("cannot rename to {name}")))?;
        if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(io(format!("cannot sync {}", parent.display())))?;
        }
        let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        println!(
            "Backed up {} ({}) to {name}: {} records, cursor {}, {} media file(s) ({}){}.",
            dir.display(),
            if from_gateway {
                "from the running gateway"
            } else {
                "the gateway was not running"
            },
            counts.entries,
            header.cursor_head,
            counts.media,
            human_bytes(counts.media_bytes),
            if counts.media < header.media_files {
                format!(
                    "; {} media file(s) were missing from {} and are not in it",
                    header.media_files - counts.media,
                    dir.join("media").display()
                )
            } else {
                String::new()
            }
        );
        println!(
            "{} in all. Restore it with: iris-gateway restore {name} --data-dir DIR",
            human_bytes(size)
        );
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

fn partial_path(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    file.with_file_name(name)
}

/// Asks a running gateway for a backup: the byte stream, or `None` when none runs.
fn fetch_from_gateway(dir: &Path) -> Result<Option<impl Read>, Error> {
    let path = control::socket_path(dir);
    let mut stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => {
            return Err(io(format!(
                "cannot reach the gateway at {}",
                path.display()
            ))(e))
        }
    };
    stream
        .set_read_timeout(Some(STALLED_READER * 6))
        .map_err(io("control socket"))?;
    let mut request = serde_json::to_vec(&control::ControlRequest::Backup).unwrap_or_default();
    request.push(b'\n');
    stream
        .write_all(&request)
        .map_err(io("asking the gateway for a backup"))?;
    let mut reader = BufReader::with_capacity(CHUNK, stream);
    let first = {
        use std::io::BufRead;
        reader
            .fill_buf()
            .map_err(io("reading the gateway's answer"))?
            .first()
            .copied()
    };
    match first {
        Some(b) if b == MAGIC[0] => Ok(Some(reader)),
        Some(b'{') => {
            let mut line = String::new();
            use std::io::BufRead;
            reader
                .read_line(&mut line)
                .map_err(io("reading the gateway's answer"))?;
            let message = match serde_json::from_str(&line) {
                Ok(control::ControlResponse::Error { message }) => message,
                _ => format!("unexpected answer: {line}"),
            };
            Err(Error::Refused(format!("the gateway refused: {message}")))
        }
        _ => Err(Error::Refused(
            "the gateway closed the control socket without sending a backup (see its log)".into(),
        )),
    }
}

struct Counts {
    entries: u64,
    media: u64,
    media_bytes: u64,
}

/// Reads a backup file end to end (structure and checksum).
fn verify(name: &str, path: &Path) -> Result<(Header, Counts), Error> {
    let f = std::fs::File::open(path).map_err(io(format!("cannot open {name}")))?;
    let mut counts = Counts {
        entries: 0,
        media: 0,
        media_bytes: 0,
    };
    let header = read_backup(name, f, |_, item| {
        match item {
            crate::store::backup::Item::Entry(..) => counts.entries += 1,
            crate::store::backup::Item::Media(_, size, _) => {
                counts.media += 1;
                counts.media_bytes += size;
            }
            crate::store::backup::Item::Tree(_) => {}
        }
        Ok(())
    })?;
    Ok((header, counts))
}

pub fn run_restore(args: RestoreArgs) -> Result<(), Error> {
    let dir = args.data_dir.unwrap_or_else(default_data_dir);
    let name = args.file.display().to_string();
    if let control::Reached::Answer(_) = control::request(&dir, &control::ControlRequest::Devices)
        .unwrap_or(control::Reached::NotRunning)
    {
        return Err(Error::Refused(format!(
            "a gateway is running on {} (it answered on {}): stop it first (systemctl stop \
             iris-gateway), then restore",
            dir.display(),
            control::socket_path(&dir).display()
        )));
    }
    std::fs::create_dir_all(&dir).map_err(io(format!("cannot create {}", dir.display())))?;
    // Held until the end: no gateway can start on the store half-way.
    let _lock = lock_store(&dir)?;
    let (header, counts) = verify(&name, &args.file)?;
    let mut stamp = chrono::Local::now().format("%Y%m%d-%H%M%S").to_string();
    let base = stamp.clone();
    for n in 2.. {
        if !dir.join(format!("before-restore-{stamp}")).exists()
            && !dir.join(format!(".restore-{stamp}")).exists()
        {
            break;
        }
        stamp = format!("{base}-{n}");
    }
    let staging = dir.join(format!(".restore-{stamp}"));
    let result = (|| {
        let input = std::fs::File::open(&args.file).map_err(io(format!("cannot open {name}")))?;
        let (_, bad_media) = restore_into(&name, BufReader::with_capacity(CHUNK, input), &staging)?;
        {
            let store = Store::open(&staging, 1 << 20, Duration::from_secs(1))?;
            let head = store.cursor_head()?;
            if head != header.cursor_head {
                return Err(Error::Refused(format!(
                    "the restored store has cursor {head}, the backup says {}: not restored",
                    header.cursor_head
                )));
            }
            store.sync_blocking()?;
        }
        Ok(bad_media)
    })();
    let bad_media = match result {
        Ok(bad) => bad,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    // The switch: the current store and media aside (kept), the restored ones in.
    let aside = dir.join(format!("before-restore-{stamp}"));
    let mut moved = Vec::new();
    for part in [
        "db",
        crate::store::HISTORY_DIR,
        "media",
        crate::store::WITNESS_FILE,
    ] {
        let from = dir.join(part);
        if from.exists() {
            std::fs::create_dir_all(&aside)
                .map_err(io(format!("cannot create {}", aside.display())))?;
            std::fs::rename(&from, aside.join(part))
                .map_err(io(format!("cannot move {} aside", from.display())))?;
            moved.push(part);
        }
    }
    for part in [
        "db",
        crate::store::HISTORY_DIR,
        "media",
        crate::store::WITNESS_FILE,
    ] {
        let from = staging.join(part);
        if from.exists() {
            std::fs::rename(&from, dir.join(part))
                .map_err(io(format!("cannot move the restored {part} into place")))?;
        }
    }
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("cannot sync {}", dir.display())))?;
    let made = chrono::DateTime::from_timestamp_millis(header.created_ms)
        .map(|t| {
            t.with_timezone(&chrono::Local)
                .format("%Y-%m-%d %H:%M")
                .to_string()
        })
        .unwrap_or_default();
    println!(
        "Restored {name} (made {made} by iris-gateway {}) into {}: cursor {}, {} media file(s) ({}).",
        header.gateway_version,
        dir.display(),
        header.cursor_head,
        counts.media - bad_media.len() as u64,
        human_bytes(counts.media_bytes),
    );
    if !bad_media.is_empty() {
        println!(
            "{} media file(s) in the backup did not match their checksum and were left out: {}",
            bad_media.len(),
            bad_media.join(", ")
        );
    }
    if moved.is_empty() {
        println!("There was no store there before.");
    } else {
        println!(
            "The previous {} was moved to {} (delete it once you are happy with the restore).",
            moved.join(", "),
            aside.display()
        );
    }
    println!("Start the gateway to use it.");
    Ok(())
}

/// Takes sled's lock on the current store, if there is one: a gateway (or `pair`) starting
/// now would fail to open it instead of racing the restore.
fn lock_store(dir: &Path) -> Result<Option<std::fs::File>, Error> {
    use fs2::FileExt;
    let path = dir.join("db").join("db");
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    else {
        return Ok(None);
    };
    f.try_lock_exclusive().map_err(|_| {
        Error::Refused(format!(
            "{} is in use by another process (a gateway starting, or a `pair` command): stop it, \
             then restore",
            dir.display()
        ))
    })?;
    Ok(Some(f))
}

// ---------------------------------------------------------------------------------------------
// In the gateway: a backup streamed to the admin page, and a restore it uploaded
// ---------------------------------------------------------------------------------------------

/// A restore uploaded from the admin page waits here (checked in full) until the gateway
/// restarts into it: the store is in use while the gateway runs.
pub const PENDING_RESTORE: &str = "pending-restore.iris";
/// Chunks of a streamed backup in flight between the worker thread and the HTTP answer.
const STREAM_CHUNKS: usize = 4;

/// Where [`stream`] writes: first a spool file (the store part, written on the event loop),
/// then the channel to the HTTP answer (everything else, from a worker thread). The switch is
/// made through the shared mode, since the backup writer owns this writer.
struct Switch(std::sync::Arc<std::sync::Mutex<Mode>>);

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
    let (writer, media) = snapshot(store, &media_dir, Switch(mode.clone()))?;
    let (tx, rx) = tokio::sync::mpsc::channel(STREAM_CHUNKS);
    // Media files stay on disk until the worker is done with them.
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    {
        let hub = hub.clone();
        tokio::task::spawn_local(async move {
            let _hold = hub.hold_media_files();
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

/// Checks an uploaded backup end to end (structure and checksum) before anything is touched;
/// returns what it holds, in words.
pub fn check_upload(path: &Path) -> Result<String, Error> {
    let (header, counts) = verify("the uploaded backup", path)?;
    Ok(format!(
        "cursor {}, {} store entries, {} media file(s) ({}), made by iris-gateway {}",
        header.cursor_head,
        counts.entries,
        counts.media,
        human_bytes(counts.media_bytes),
        header.gateway_version
    ))
}

/// At start, before the store is opened: restores a backup the admin page left in
/// [`PENDING_RESTORE`], exactly as `iris-gateway restore` does (the old store moved aside).
/// A restore that fails leaves the current store as it was and the file renamed
/// `pending-restore.failed`, so the gateway never loops on it; the reason is logged.
pub fn apply_pending_restore(dir: &Path) -> bool {
    let pending = dir.join(PENDING_RESTORE);
    if !pending.exists() {
        return false;
    }
    tracing::info!("restoring the backup uploaded from the admin page");
    let result = run_restore(RestoreArgs {
        file: pending.clone(),
        data_dir: Some(dir.to_owned()),
    });
    match result {
        Ok(()) => {
            let _ = std::fs::remove_file(&pending);
            tracing::info!("restored the uploaded backup");
            true
        }
        Err(e) => {
            let _ = std::fs::rename(&pending, dir.join("pending-restore.failed"));
            tracing::warn!("the uploaded backup was not restored ({e}); the store is unchanged");
            false
        }
    }
}
