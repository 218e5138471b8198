//! The backup file format, and copying the store into one and out of one.
//!
//! A backup is one file, written and read as a stream (integers big-endian):
//!
//! ```text
//! "IRIS-GATEWAY-BACKUP\n"                       magic (20 bytes)
//! u32 len, JSON header                          format, versions, cursor head, time, counts
//! 'T' u16 len, tree name                        every sled tree, then its entries:
//!   'K' u32 len, key, u32 len, value
//!                                               (layout 2: then the history database as
//!                                               trees in layout 1's format: `messages`,
//!                                               `media_uses`, and `history_applied`)
//! 'M' u16 len, sha256 (hex), u64 size, bytes    every media file (named by its SHA-256)
//! 'E' 32 bytes                                  SHA-256 of everything before this 'E'
//! ```
//!
//! The store part is read in one go without yielding (`export_trees`), so it is a consistent
//! snapshot: every sled write of the gateway, and every change applied to the history
//! database, happens on the same thread. The history database is read in one SQLite read
//! transaction at that same moment; its `applied` journal position travels with it, and the
//! journal entries after it travel in sled's `journal` tree, so the restored store applies
//! exactly what the snapshot's history had not applied yet. Media files are
//! immutable and content-addressed, so they are streamed afterwards. The trailing checksum
//! lets `restore` refuse a truncated or damaged file before it touches anything.

use std::io::{self, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::base::{StoreError, LAYOUT_VERSION};
use super::engine::handle::Store;

pub const MAGIC: &[u8; 20] = b"IRIS-GATEWAY-BACKUP\n";
/// Version of the file format above (not of the store layout, which the header also carries).
pub const FORMAT_VERSION: u32 = 1;
/// Longest header, tree name, key and value accepted when reading (sled keeps values far below).
const MAX_HEADER: u32 = 1 << 20;
const MAX_VALUE: u32 = 64 << 20;
/// Entries per sled batch when restoring.
const BATCH: usize = 1000;
/// History rows per SQLite transaction when restoring.
const HISTORY_BATCH: usize = 5000;

/// What a backup says about itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Header {
    pub format: u32,
    pub gateway_version: String,
    pub layout_version: u64,
    /// The store's cursor head at the snapshot: the restored gateway continues from here.
    pub cursor_head: u64,
    pub created_ms: i64,
    /// Media files listed at the snapshot, and their total size.
    pub media_files: u64,
    pub media_bytes: u64,
}

impl Header {
    pub fn new(cursor_head: u64, media_files: u64, media_bytes: u64) -> Header {
        Header {
            format: FORMAT_VERSION,
            gateway_version: env!("CARGO_PKG_VERSION").into(),
            layout_version: LAYOUT_VERSION,
            cursor_head,
            created_ms: crate::ids::now_ms(),
            media_files,
            media_bytes,
        }
    }
}

/// Writes the format, hashing as it goes.
pub struct BackupWriter<W: Write> {
    out: W,
    hash: Sha256,
    pub bytes: u64,
}

impl<W: Write> BackupWriter<W> {
    pub fn new(out: W, header: &Header) -> io::Result<BackupWriter<W>> {
        let mut w = BackupWriter {
            out,
            hash: Sha256::new(),
            bytes: 0,
        };
        w.put(MAGIC)?;
        let json = serde_json::to_vec(header).map_err(io::Error::other)?;
        w.put(&(json.len() as u32).to_be_bytes())?;
        w.put(&json)?;
        Ok(w)
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.hash.update(b);
        self.bytes += b.len() as u64;
        self.out.write_all(b)
    }

    pub fn tree(&mut self, name: &[u8]) -> io::Result<()> {
        self.put(b"T")?;
        self.put(&(name.len() as u16).to_be_bytes())?;
        self.put(name)
    }

    pub fn entry(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.put(b"K")?;
        self.put(&(key.len() as u32).to_be_bytes())?;
        self.put(key)?;
        self.put(&(value.len() as u32).to_be_bytes())?;
        self.put(value)
    }

    /// The start of a media file; its `size` bytes follow through `media_bytes`.
    pub fn media_start(&mut self, sha256: &str, size: u64) -> io::Result<()> {
        self.put(b"M")?;
        self.put(&(sha256.len() as u16).to_be_bytes())?;
        self.put(sha256.as_bytes())?;
        self.put(&size.to_be_bytes())
    }

    pub fn media_bytes(&mut self, chunk: &[u8]) -> io::Result<()> {
        self.put(chunk)
    }

    /// Writes the checksum and returns the sink.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.write_all(b"E")?;
        let digest = self.hash.clone().chain_update(b"E").finalize();
        self.out.write_all(&digest)?;
        self.bytes += 33;
        self.out.flush()?;
        Ok(self.out)
    }

    /// Hands out the sink and the hash state, to continue on another (async) writer.
    pub fn into_parts(self) -> (W, Sha256, u64) {
        (self.out, self.hash, self.bytes)
    }

    pub fn from_parts(out: W, hash: Sha256, bytes: u64) -> BackupWriter<W> {
        BackupWriter { out, hash, bytes }
    }
}

/// One element of a backup, as read.
pub enum Item<'a> {
    Tree(Vec<u8>),
    Entry(Vec<u8>, Vec<u8>),
    /// A media file: its name and a reader of exactly its bytes (read it to the end).
    Media(String, u64, &'a mut dyn Read),
}

/// Why a file cannot be restored.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0} is not an iris-gateway backup (it does not start with the backup marker)")]
    Foreign(String),
    #[error("{file} is damaged or incomplete: {why}; it cannot be restored (make a new backup, or use an older one)")]
    Damaged { file: String, why: String },
    #[error(
        "{file} was written by a newer iris-gateway ({what}); upgrade iris-gateway to restore it"
    )]
    TooNew { file: String, what: String },
    #[error("cannot read {file}: {source}")]
    Io { file: String, source: io::Error },
    /// Making a backup: the gateway's own history database could not be read. The backup was
    /// not made; the history needs repair (a restore of an earlier backup).
    #[error("the history database {file} is damaged or unreadable ({detail}); no backup can be made of it. Restore your latest backup ({}), which keeps the damaged files aside", crate::hints::command("restore FILE"))]
    HistoryDamaged { file: String, detail: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Reads a backup front to back, checking its structure and (at the end) its checksum.
pub fn read_backup(
    file: &str,
    input: impl Read,
    mut visit: impl FnMut(&Header, Item<'_>) -> io::Result<()>,
) -> std::result::Result<Header, BackupError> {
    let damaged = |why: String| BackupError::Damaged {
        file: file.to_owned(),
        why,
    };
    let io_err = |e: io::Error| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            damaged("it ends too early (truncated)".into())
        } else {
            BackupError::Io {
                file: file.to_owned(),
                source: e,
            }
        }
    };
    let mut r = HashingReader {
        inner: io::BufReader::with_capacity(1 << 16, input),
        hash: Sha256::new(),
        count: 0,
    };
    let mut magic = [0u8; 20];
    let got = read_up_to(&mut r, &mut magic).map_err(io_err)?;
    if got < magic.len() || &magic != MAGIC {
        return Err(BackupError::Foreign(file.to_owned()));
    }
    let len = r.u32().map_err(io_err)?;
    if len > MAX_HEADER {
        return Err(damaged(format!("its header claims {len} bytes")));
    }
    let header: Header = serde_json::from_slice(&r.take_vec(len as usize).map_err(io_err)?)
        .map_err(|e| damaged(format!("its header is not readable ({e})")))?;
    if header.format > FORMAT_VERSION {
        return Err(BackupError::TooNew {
            file: file.to_owned(),
            what: format!("backup format {}", header.format),
        });
    }
    if header.layout_version > LAYOUT_VERSION {
        return Err(BackupError::TooNew {
            file: file.to_owned(),
            what: format!("store layout {}", header.layout_version),
        });
    }
    let mut in_tree = false;
    loop {
        let tag = r.take_vec(1).map_err(io_err)?[0];
        match tag {
            b'T' => {
                let n = r.u16().map_err(io_err)?;
                let name = r.take_vec(n as usize).map_err(io_err)?;
                in_tree = true;
                visit(&header, Item::Tree(name)).map_err(io_err)?;
            }
            b'K' if in_tree => {
                let kl = r.u32().map_err(io_err)?;
                if kl > MAX_VALUE {
                    return Err(damaged(format!("a key claims {kl} bytes")));
                }
                let k = r.take_vec(kl as usize).map_err(io_err)?;
                let vl = r.u32().map_err(io_err)?;
                if vl > MAX_VALUE {
                    return Err(damaged(format!("a value claims {vl} bytes")));
                }
                let v = r.take_vec(vl as usize).map_err(io_err)?;
                visit(&header, Item::Entry(k, v)).map_err(io_err)?;
            }
            b'M' => {
                in_tree = false;
                let n = r.u16().map_err(io_err)?;
                let name = String::from_utf8(r.take_vec(n as usize).map_err(io_err)?)
                    .map_err(|_| damaged("a media name is not text".into()))?;
                if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(damaged(format!("a media file is named {name:?}")));
                }
                let size = r.u64().map_err(io_err)?;
                let mut body = (&mut r).take(size);
                visit(&header, Item::Media(name, size, &mut body)).map_err(io_err)?;
                // Whatever the visitor did not read is still part of the checksum.
                io::copy(&mut body, &mut io::sink()).map_err(io_err)?;
                if body.limit() != 0 {
                    return Err(damaged("it ends inside a media file (truncated)".into()));
                }
            }
            b'E' => {
                let expected = r.hash.clone().finalize();
                let mut digest = [0u8; 32];
                r.inner.read_exact(&mut digest).map_err(io_err)?;
                if digest[..] != expected[..] {
                    return Err(damaged("its checksum does not match its content".into()));
                }
                let mut extra = [0u8; 1];
                if r.inner.read(&mut extra).map_err(io_err)? != 0 {
                    return Err(damaged("there are bytes after its end marker".into()));
                }
                return Ok(header);
            }
            other => {
                return Err(damaged(format!(
                    "an unexpected record (tag {other:#04x}) after {} bytes",
                    r.count - 1
                )))
            }
        }
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

struct HashingReader<R: Read> {
    inner: io::BufReader<R>,
    hash: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    fn take_vec(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; n];
        self.read_exact(&mut v)?;
        Ok(v)
    }
    fn u16(&mut self) -> io::Result<u16> {
        let mut b = [0u8; 2];
        self.read_exact(&mut b)?;
        Ok(u16::from_be_bytes(b))
    }
    fn u32(&mut self) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b)?;
        Ok(u32::from_be_bytes(b))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

impl Store {
    /// Writes every tree, entry by entry, without yielding: a consistent snapshot. Returns the
    /// number of entries. A history database SQLite cannot read is `HistoryDamaged`, named as
    /// such: the backup being written is not what is wrong.
    pub fn export_trees<W: Write>(
        &self,
        w: &mut BackupWriter<W>,
    ) -> std::result::Result<u64, BackupError> {
        let t = self.t()?;
        let mut entries = 0;
        for name in t.db.tree_names() {
            if HISTORY_TREES.contains(&name.as_ref()) {
                continue;
            }
            let tree = t.db.open_tree(&name).map_err(StoreError::from)?;
            w.tree(&name).map_err(io_store)?;
            for item in tree.iter() {
                let (k, v) = item.map_err(StoreError::from)?;
                w.entry(&k, &v).map_err(io_store)?;
                entries += 1;
            }
        }
        // The history database, as layout 1 kept it in sled: one message per entry.
        w.tree(b"messages").map_err(io_store)?;
        let mut uses = Vec::new();
        let applied = t
            .hist
            .export(
                |lane, seq, m| {
                    let key = super::keys::message_key(lane, seq);
                    w.entry(&key, &super::base::to_json(m)).map_err(io_store)?;
                    entries += 1;
                    Ok(())
                },
                |media, message| {
                    uses.push([media.as_bytes(), &[0], message.as_bytes()].concat());
                    Ok(())
                },
            )
            .map_err(|e| match e {
                // Errors of the writer are sled-wrapped I/O; SQLite's own are the history's.
                // Only damage: a busy or failing disk is not a damaged database.
                e if e.is_history_damage() || matches!(e, StoreError::Corrupt { .. }) => {
                    BackupError::HistoryDamaged {
                        file: super::sql::history_path(self.dir()).display().to_string(),
                        detail: match e {
                            StoreError::HistoryDamaged { detail } => detail,
                            other => other.to_string(),
                        },
                    }
                }
                other => other.into(),
            })?;
        w.tree(b"media_uses").map_err(io_store)?;
        for k in uses {
            w.entry(&k, &[]).map_err(io_store)?;
            entries += 1;
        }
        w.tree(APPLIED_TREE).map_err(io_store)?;
        w.entry(b"applied", &applied.to_be_bytes())
            .map_err(io_store)?;
        Ok(entries + 1)
    }
}

/// Trees of a layout-2 backup that go to the history database, not to sled.
const HISTORY_TREES: &[&[u8]] = &[b"messages", b"media_uses", APPLIED_TREE];
const APPLIED_TREE: &[u8] = b"history_applied";

/// Rows on their way to the history database while restoring.
#[derive(Default)]
struct HistoryRows {
    rows: Vec<(crate::protocol::Lane, u64, crate::protocol::HistoryMessage)>,
    uses: Vec<(String, String)>,
    applied: u64,
}

impl HistoryRows {
    fn put(&mut self, tree: &[u8], k: &[u8], v: &[u8]) -> io::Result<()> {
        let bad = |what: &str| io::Error::other(format!("a damaged {what} entry"));
        match tree {
            b"messages" => {
                let (lane, seq) =
                    super::engine::migrate::split_key(k).ok_or_else(|| bad("message"))?;
                let m = serde_json::from_slice(v).map_err(|_| bad("message"))?;
                self.rows.push((lane, seq, m));
            }
            b"media_uses" => {
                let mut parts = k.splitn(2, |b| *b == 0);
                let (Some(media), Some(message)) = (parts.next(), parts.next()) else {
                    return Err(bad("media use"));
                };
                self.uses.push((
                    String::from_utf8_lossy(media).into_owned(),
                    String::from_utf8_lossy(message).into_owned(),
                ));
            }
            _ => self.applied = super::base::u64_from(v),
        }
        Ok(())
    }

    fn flush(&mut self, hist: &super::sql::History) -> io::Result<()> {
        hist.import(&self.rows, &self.uses)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.rows.clear();
        self.uses.clear();
        Ok(())
    }
}

fn io_store(e: io::Error) -> StoreError {
    StoreError::Sled(sled::Error::Io(e))
}

/// Builds a store from a backup in `dir` (which must not hold one): sled trees from the
/// backup's entries, media files (each checked against its SHA-256) into `dir/media`. Returns
/// the header and the names of media files whose bytes did not match their name (left out).
pub fn restore_into(
    file: &str,
    input: impl Read,
    dir: &Path,
) -> std::result::Result<(Header, Vec<String>), BackupError> {
    let db_path = dir.join("db");
    if db_path.exists() {
        return Err(BackupError::Io {
            file: db_path.display().to_string(),
            source: io::Error::new(io::ErrorKind::AlreadyExists, "a store is already there"),
        });
    }
    let media_dir = dir.join("media");
    std::fs::create_dir_all(media_dir.join("tmp")).map_err(|source| BackupError::Io {
        file: media_dir.display().to_string(),
        source,
    })?;
    let db = super::engine::open::sled_config(&db_path, 1 << 20)
        .open()
        .map_err(StoreError::from)?;
    let mut restore = Restore {
        dir,
        db: &db,
        hist: None,
        hist_rows: HistoryRows::default(),
        hist_tree: None,
        tree: None,
        batch: sled::Batch::default(),
        batched: 0,
        bad_media: Vec::new(),
    };
    let header = read_backup(file, input, |header, item| {
        match item {
            Item::Tree(name) => restore.begin_tree(header, name)?,
            Item::Entry(k, v) => restore.entry(k, v)?,
            Item::Media(name, _size, body) => {
                restore.end_tree()?;
                if !receive_media(&media_dir, &name, body)? {
                    restore.bad_media.push(name);
                }
            }
        }
        Ok(())
    })?;
    restore.end_tree().map_err(|source| BackupError::Io {
        file: db_path.display().to_string(),
        source,
    })?;
    let Restore {
        hist,
        hist_rows,
        bad_media,
        ..
    } = restore;
    if let Some(h) = &hist {
        finish_history(dir, h, hist_rows)?;
    }
    db.flush().map_err(StoreError::from)?;
    drop(db);
    let _ = std::fs::remove_dir(media_dir.join("tmp"));
    Ok((header, bad_media))
}

/// Where a restore is in the stream: the tree being filled (sled, in batches) or the history
/// table being filled (SQLite, from a layout-2 backup), and the media that did not check out.
struct Restore<'a> {
    dir: &'a Path,
    db: &'a sled::Db,
    /// Made on the first history entry of a layout-2 backup; a layout-1 backup's history goes
    /// into sled as it was, and the store migrates it when it is first opened.
    hist: Option<super::sql::History>,
    hist_rows: HistoryRows,
    hist_tree: Option<Vec<u8>>,
    tree: Option<sled::Tree>,
    batch: sled::Batch,
    batched: usize,
    bad_media: Vec<String>,
}

impl Restore<'_> {
    /// A new tree begins: the last one's batch is written, and history trees of a layout-2
    /// backup go to SQLite instead of sled.
    fn begin_tree(&mut self, header: &Header, name: Vec<u8>) -> io::Result<()> {
        self.end_tree()?;
        if header.layout_version >= 2 && HISTORY_TREES.contains(&name.as_slice()) {
            if self.hist.is_none() {
                self.hist = Some(
                    super::sql::History::open(&super::sql::history_path(self.dir), true)
                        .map_err(|e| io::Error::other(e.to_string()))?,
                );
            }
            self.hist_tree = Some(name);
            return Ok(());
        }
        self.tree = Some(
            self.db
                .open_tree(&name)
                .map_err(|e| io::Error::other(e.to_string()))?,
        );
        Ok(())
    }

    fn entry(&mut self, k: Vec<u8>, v: Vec<u8>) -> io::Result<()> {
        if let Some(tree) = self.hist_tree.as_deref() {
            self.hist_rows.put(tree, &k, &v)?;
            if self.hist_rows.rows.len() + self.hist_rows.uses.len() >= HISTORY_BATCH {
                if let Some(h) = &self.hist {
                    self.hist_rows.flush(h)?;
                }
            }
            return Ok(());
        }
        self.batch.insert(k, v);
        self.batched += 1;
        if self.batched >= BATCH {
            self.write_batch()?;
        }
        Ok(())
    }

    /// Writes what is batched and leaves the tree (media, a new tree, or the end follow).
    fn end_tree(&mut self) -> io::Result<()> {
        self.write_batch()?;
        self.tree = None;
        self.hist_tree = None;
        Ok(())
    }

    fn write_batch(&mut self) -> io::Result<()> {
        if let Some(t) = &self.tree {
            t.apply_batch(std::mem::take(&mut self.batch))
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        self.batched = 0;
        Ok(())
    }
}

/// Streams one media file into place, checking it against its name (its SHA-256): false, and
/// nothing kept, when it does not match.
fn receive_media(media_dir: &Path, name: &str, body: &mut dyn Read) -> io::Result<bool> {
    let tmp = media_dir.join("tmp").join(name);
    let mut out = std::fs::File::create(&tmp)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = body.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    out.sync_all()?;
    if hex(&hash.finalize()) == name {
        std::fs::rename(&tmp, media_dir.join(name))?;
        Ok(true)
    } else {
        std::fs::remove_file(&tmp)?;
        Ok(false)
    }
}

/// The restored history made whole and durable: last rows, the applied position, a checkpoint.
fn finish_history(
    dir: &Path,
    h: &super::sql::History,
    mut rows: HistoryRows,
) -> std::result::Result<(), BackupError> {
    let history_file = super::sql::history_path(dir).display().to_string();
    rows.flush(h).map_err(|source| BackupError::Io {
        file: history_file.clone(),
        source,
    })?;
    h.set_applied(rows.applied)?;
    if h.checkpoint()?.is_none() {
        return Err(BackupError::Io {
            file: history_file,
            source: io::Error::other("the restored history database cannot be made durable"),
        });
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_or_foreign_file_is_refused() {
        let mut buf = Vec::new();
        let mut w = BackupWriter::new(&mut buf, &Header::new(7, 0, 0)).unwrap();
        w.tree(b"meta").unwrap();
        w.entry(b"k", b"v").unwrap();
        w.finish().unwrap();
        let ok = read_backup("b", buf.as_slice(), |_, _| Ok(())).unwrap();
        assert_eq!(ok.cursor_head, 7);
        let mut flipped = buf.clone();
        let at = flipped.len() - 40;
        flipped[at] ^= 1;
        assert!(matches!(
            read_backup("b", flipped.as_slice(), |_, _| Ok(())),
            Err(BackupError::Damaged { .. })
        ));
        assert!(matches!(
            read_backup("b", &buf[..buf.len() - 5], |_, _| Ok(())),
            Err(BackupError::Damaged { .. })
        ));
        assert!(matches!(
            read_backup("b", &b"hello world, not a backup"[..], |_, _| Ok(())),
            Err(BackupError::Foreign(_))
        ));
    }
}
