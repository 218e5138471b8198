//! The terminal client's files: `/attach PATH [caption]` uploads a file with the protocol's
//! upload frames and sends it; files the gateway offers are pulled and saved to a downloads
//! folder. Both stream: neither an upload nor a pull is ever held in memory whole.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// Bytes per binary upload frame: within the 64–256 KiB docs/media.md recommends and far below
/// the default `limits.max_frame_bytes` (1 MiB).
const CHUNK: usize = 64 * 1024;

/// Bytes of a file read to tell its type when its name does not.
const SNIFF: usize = 64;

/// Where offered files go unless `--downloads` says otherwise: `$XDG_DOWNLOAD_DIR/iris`, else
/// `~/Downloads/iris`, else `iris-downloads` in the current directory.
pub fn default_downloads() -> PathBuf {
    let from_env = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = from_env("XDG_DOWNLOAD_DIR") {
        return PathBuf::from(dir).join("iris");
    }
    match from_env("HOME") {
        Some(home) => PathBuf::from(home).join("Downloads").join("iris"),
        None => PathBuf::from("iris-downloads"),
    }
}

/// `/attach PATH [caption]`: the path (in double or single quotes when it has spaces; a leading
/// `~/` is the home directory) and the caption. `None` when no path is given.
pub fn parse_attach(rest: &str) -> Option<(PathBuf, String)> {
    let rest = rest.trim_start();
    let (path, caption) = match rest.chars().next()? {
        q @ ('"' | '\'') => {
            let inner = &rest[1..];
            let end = inner.find(q)?;
            (&inner[..end], &inner[end + 1..])
        }
        _ => rest.split_once(char::is_whitespace).unwrap_or((rest, "")),
    };
    if path.is_empty() {
        return None;
    }
    let path = match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(under), Some(home)) => PathBuf::from(home).join(under),
        _ => PathBuf::from(path),
    };
    Some((path, caption.trim().to_owned()))
}

/// A file's kind (the protocol's image, audio, video, voice, document) and mime type, from its
/// extension, else from its first bytes. Ogg is a voice note when it carries Opus (what phones
/// record voice notes in: WhatsApp, Telegram, Signal), other audio (music in Vorbis) otherwise.
pub fn kind_and_mime(name: &str, head: &[u8]) -> (&'static str, &'static str) {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let opus = head.starts_with(b"OggS") && head.get(28..36) == Some(b"OpusHead".as_slice());
    match ext.as_str() {
        "png" => ("image", "image/png"),
        "jpg" | "jpeg" => ("image", "image/jpeg"),
        "gif" => ("image", "image/gif"),
        "webp" => ("image", "image/webp"),
        "heic" | "heif" => ("image", "image/heic"),
        "bmp" => ("image", "image/bmp"),
        "svg" => ("image", "image/svg+xml"),
        "opus" => ("voice", "audio/ogg"),
        "ogg" | "oga" if opus => ("voice", "audio/ogg"),
        "ogg" | "oga" => ("audio", "audio/ogg"),
        "amr" => ("voice", "audio/amr"),
        "mp3" => ("audio", "audio/mpeg"),
        "m4a" | "aac" => ("audio", "audio/mp4"),
        "wav" => ("audio", "audio/wav"),
        "flac" => ("audio", "audio/flac"),
        "mp4" | "m4v" => ("video", "video/mp4"),
        "mov" => ("video", "video/quicktime"),
        "webm" => ("video", "video/webm"),
        "mkv" => ("video", "video/x-matroska"),
        "txt" | "log" => ("document", "text/plain"),
        "md" | "markdown" => ("document", "text/markdown"),
        "csv" => ("document", "text/csv"),
        "html" | "htm" => ("document", "text/html"),
        "json" => ("document", "application/json"),
        "xml" => ("document", "application/xml"),
        "yaml" | "yml" => ("document", "application/yaml"),
        "toml" => ("document", "application/toml"),
        "pdf" => ("document", "application/pdf"),
        "zip" => ("document", "application/zip"),
        "rs" | "py" | "js" | "ts" | "c" | "h" | "go" | "java" | "sh" => ("document", "text/plain"),
        _ if head.starts_with(b"\x89PNG") => ("image", "image/png"),
        _ if head.starts_with(&[0xff, 0xd8, 0xff]) => ("image", "image/jpeg"),
        _ if head.starts_with(b"GIF8") => ("image", "image/gif"),
        _ if head.starts_with(b"RIFF") && head.get(8..12) == Some(b"WEBP".as_slice()) => {
            ("image", "image/webp")
        }
        _ if opus => ("voice", "audio/ogg"),
        _ if head.starts_with(b"OggS") => ("audio", "audio/ogg"),
        _ if head.starts_with(b"%PDF") => ("document", "application/pdf"),
        _ if looks_like_text(head) => ("document", "text/plain"),
        _ => ("document", "application/octet-stream"),
    }
}

/// UTF-8 without NULs (a character cut at the end of the sniffed bytes is allowed).
fn looks_like_text(head: &[u8]) -> bool {
    let valid = match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    };
    valid && !head.contains(&0)
}

/// Where an upload is in the protocol's flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `media.upload.start` and a `ping` are sent: the start is refused (an `error` with its id)
    /// or, when the `pong` arrives first, accepted (the start itself has no reply).
    Announced,
    /// Binary chunks are going out.
    Sending,
    /// `media.upload.end` is sent; its `media.upload.ack` decides.
    Ending,
}

/// One `/attach` in progress (one at a time: every binary frame between a start and its end
/// belongs to that upload).
pub struct Upload {
    pub stage: Stage,
    pub media_ref: String,
    pub filename: String,
    pub kind: &'static str,
    pub mime: &'static str,
    pub size: u64,
    pub caption: String,
    pub start_id: i64,
    pub ping_id: i64,
    pub end_id: i64,
    file: tokio::fs::File,
    hasher: Sha256,
    sent: u64,
    /// The file's length differed from what was announced (it changed while it was sent).
    pub changed: bool,
    /// Why it failed was already said (a read error): the refused ack adds nothing.
    pub reported: bool,
}

/// What the next step of an upload sends.
pub enum Step {
    Chunk(Vec<u8>),
    End(Value),
}

impl Upload {
    /// Opens `path` and builds its `media.upload.start` (ids `start_id` and `start_id + 1` for
    /// the ping after it; the end takes `start_id + 2`). The error is a sentence for the user.
    pub async fn open(
        path: &Path,
        caption: String,
        start_id: i64,
    ) -> Result<(Upload, Value, Value), String> {
        let shown = path.display();
        let meta = tokio::fs::metadata(path)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => format!("cannot attach {shown}: no such file"),
                _ => format!("cannot attach {shown}: {e}"),
            })?;
        if !meta.is_file() {
            return Err(format!("cannot attach {shown}: not a regular file"));
        }
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| format!("cannot attach {shown}: {e}"))?;
        let mut head = vec![0u8; SNIFF];
        let n = read_full(&mut file, &mut head)
            .await
            .map_err(|e| format!("cannot attach {shown}: {e}"))?;
        head.truncate(n);
        file.seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(|e| format!("cannot attach {shown}: {e}"))?;
        let filename = crate::media::clean_filename(
            &path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        let (kind, mime) = kind_and_mime(&filename, &head);
        let media_ref = format!("cli-{}-{start_id}", crate::ids::now_ms());
        let start = json!({"v":1,"type":"media.upload.start","id":start_id,"payload":{
            "media_ref": media_ref, "kind": kind, "mime": mime, "size": meta.len(), "filename": filename}});
        let ping = json!({"v":1,"type":"ping","id":start_id + 1});
        Ok((
            Upload {
                stage: Stage::Announced,
                media_ref,
                filename,
                kind,
                mime,
                size: meta.len(),
                caption,
                start_id,
                ping_id: start_id + 1,
                end_id: start_id + 2,
                file,
                hasher: Sha256::new(),
                sent: 0,
                changed: false,
                reported: false,
            },
            start,
            ping,
        ))
    }

    /// Bytes sent so far, and the size announced.
    pub fn progress(&self) -> (u64, u64) {
        (self.sent, self.size)
    }

    /// The next chunk, or the end frame once the announced size is sent (or the file ended).
    pub async fn step(&mut self) -> std::io::Result<Step> {
        let left = self.size - self.sent;
        let mut buf = vec![0u8; CHUNK.min(usize::try_from(left).unwrap_or(CHUNK))];
        let n = read_full(&mut self.file, &mut buf).await?;
        if n == 0 {
            if left > 0 {
                self.changed = true;
            } else {
                // Bytes past the announced size: the file grew since it was measured.
                let mut probe = [0u8; 1];
                if self.file.read(&mut probe).await? > 0 {
                    self.changed = true;
                }
            }
            self.stage = Stage::Ending;
            let sha: String = self
                .hasher
                .clone()
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            return Ok(Step::End(
                json!({"v":1,"type":"media.upload.end","id":self.end_id,"payload":{"media_ref":self.media_ref,"sha256":sha}}),
            ));
        }
        buf.truncate(n);
        self.hasher.update(&buf);
        self.sent += n as u64;
        Ok(Step::Chunk(buf))
    }
}

/// Reads until `buf` is full or the file ends; the count read.
async fn read_full(file: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]).await? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// One pull in flight: its bytes stream to a hidden part file beside the final name.
struct Pull {
    id: i64,
    media_id: String,
    filename: String,
    size: u64,
    part: PathBuf,
    file: Option<tokio::fs::File>,
    written: u64,
    /// Why the bytes are no longer kept (the pull still has to end before the next one).
    failed: Option<String>,
}

/// Files being pulled, in request order (the gateway serves pulls one at a time in that order,
/// so binary frames belong to the oldest pull not yet ended).
pub struct Downloads {
    dir: PathBuf,
    queue: VecDeque<Pull>,
    /// Media already pulled or being pulled: an offer and a message naming the same file
    /// download it once.
    seen: HashSet<String>,
}

impl Downloads {
    pub fn new(dir: PathBuf) -> Downloads {
        Downloads {
            dir,
            queue: VecDeque::new(),
            seen: HashSet::new(),
        }
    }

    pub fn busy(&self) -> bool {
        !self.queue.is_empty()
    }

    /// The connection that carried the pulls is gone: their part files are removed and their
    /// media forgotten, so the offers a reconnect replays pull them again.
    pub async fn abandon(&mut self) {
        for pull in std::mem::take(&mut self.queue) {
            drop(pull.file);
            let _ = tokio::fs::remove_file(&pull.part).await;
            self.seen.remove(&pull.media_id);
        }
    }

    /// Starts pulling `media` (a media entry: media_id, filename, size) as request `id`:
    /// `Ok(Some(media.pull frame))` to send, `Ok(None)` when it is already pulled, or a sentence
    /// saying why it cannot be saved.
    pub async fn begin(&mut self, media: &Value, id: i64) -> Result<Option<Value>, String> {
        let Some(media_id) = media["media_id"].as_str() else {
            return Ok(None);
        };
        if !self.seen.insert(media_id.to_owned()) {
            return Ok(None);
        }
        let filename = safe_name(media["filename"].as_str().unwrap_or(""));
        let size = media["size"].as_u64().unwrap_or(0);
        tokio::fs::create_dir_all(&self.dir).await.map_err(|e| {
            format!(
                "cannot save {filename}: cannot create {}: {e}",
                self.dir.display()
            )
        })?;
        let part = self
            .dir
            .join(format!(".iris-{}-{id}.part", std::process::id()));
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&part)
            .await
            .map_err(|e| format!("cannot save {filename}: {}: {e}", part.display()))?;
        self.queue.push_back(Pull {
            id,
            media_id: media_id.to_owned(),
            filename,
            size,
            part,
            file: Some(file),
            written: 0,
            failed: None,
        });
        Ok(Some(
            json!({"v":1,"type":"media.pull","id":id,"payload":{"media_id":media_id}}),
        ))
    }

    /// A binary frame: the next bytes of the oldest pull. More bytes than offered stop keeping
    /// it (the announced size bounds what lands on disk).
    pub async fn chunk(&mut self, bytes: &[u8]) {
        let Some(pull) = self.queue.front_mut() else {
            return;
        };
        if pull.failed.is_some() {
            return;
        }
        if pull.written + bytes.len() as u64 > pull.size {
            pull.failed = Some(format!("more than the {} bytes offered arrived", pull.size));
            pull.file = None;
            return;
        }
        if let Some(file) = pull.file.as_mut() {
            if let Err(e) = file.write_all(bytes).await {
                pull.failed = Some(format!("cannot write {}: {e}", pull.part.display()));
                pull.file = None;
                return;
            }
        }
        pull.written += bytes.len() as u64;
    }

    /// `media.pull.end` (`ok`) or an `error` (`refused`) with some pull's id: the line to print,
    /// or `None` when the id is not a pull's.
    pub async fn end(&mut self, id: i64, ok: bool, refused: Option<&str>) -> Option<String> {
        let at = self.queue.iter().position(|p| p.id == id)?;
        let mut pull = self.queue.remove(at)?;
        let why = match (refused, pull.failed.take()) {
            (Some(msg), _) => Some(format!("the gateway refused: {msg}")),
            (None, Some(why)) => Some(why),
            (None, None) if !ok => Some("the gateway could not read it".into()),
            (None, None) if pull.written != pull.size => Some(format!(
                "{} bytes arrived; {} were offered",
                pull.written, pull.size
            )),
            (None, None) => None,
        };
        let saved = match why {
            Some(why) => Err(why),
            None => self.keep(&mut pull).await,
        };
        let _ = tokio::fs::remove_file(&pull.part).await;
        Some(match saved {
            Ok(path) => format!(
                "[saved {} ({} bytes): {}]",
                pull.filename,
                pull.written,
                path.display()
            ),
            Err(why) => format!("[could not save {}: {why}]", pull.filename),
        })
    }

    /// Makes the part file durable and gives it its name, never replacing a file already there
    /// (`name (1).ext`, `name (2).ext`, … instead).
    async fn keep(&self, pull: &mut Pull) -> Result<PathBuf, String> {
        let fail = |e: std::io::Error| format!("cannot write {}: {e}", pull.part.display());
        if let Some(mut file) = pull.file.take() {
            file.flush().await.map_err(fail)?;
            file.sync_all().await.map_err(fail)?;
        }
        let (stem, ext) = match pull.filename.rsplit_once('.') {
            Some((s, e)) if !s.is_empty() => (s.to_owned(), format!(".{e}")),
            _ => (pull.filename.clone(), String::new()),
        };
        for n in 0u32.. {
            let name = if n == 0 {
                pull.filename.clone()
            } else {
                format!("{stem} ({n}){ext}")
            };
            let target = self.dir.join(name);
            // A hard link fails when the name is taken, so no file is ever replaced.
            match tokio::fs::hard_link(&pull.part, &target).await {
                Ok(()) => return Ok(target),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                // Some filesystems (FAT on a USB stick) have no hard links: copy instead, into
                // a file that must be new.
                Err(_) => match copy_to_new(&pull.part, &target).await {
                    Ok(()) => return Ok(target),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(format!("cannot save as {}: {e}", target.display())),
                },
            }
        }
        unreachable!("some suffix is free")
    }
}

/// Copies `from` into `to`, which must not exist yet (a half-copied `to` is removed).
async fn copy_to_new(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut out = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .await?;
    let copied = async {
        let mut src = tokio::fs::File::open(from).await?;
        tokio::io::copy(&mut src, &mut out).await?;
        out.sync_all().await
    }
    .await;
    if copied.is_err() {
        let _ = tokio::fs::remove_file(to).await;
    }
    copied
}

/// A name that stays inside the downloads folder: no path separators, no leading dot, no
/// control characters, and short enough for a suffix within the usual 255-byte limit.
pub fn safe_name(name: &str) -> String {
    let mut clean: String = crate::media::clean_filename(&name.replace(['/', '\\'], "_"));
    const MAX_BYTES: usize = 200;
    if clean.len() > MAX_BYTES {
        let keep = (0..=MAX_BYTES)
            .rev()
            .find(|&i| clean.is_char_boundary(i))
            .unwrap_or(0);
        clean.truncate(keep);
    }
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_takes_a_path_quoted_or_not_and_a_caption() {
        assert_eq!(
            parse_attach(" plant.png what is this?"),
            Some((PathBuf::from("plant.png"), "what is this?".into()))
        );
        assert_eq!(
            parse_attach("\"my notes.txt\" read it"),
            Some((PathBuf::from("my notes.txt"), "read it".into()))
        );
        assert_eq!(
            parse_attach("'a b.png'"),
            Some((PathBuf::from("a b.png"), String::new()))
        );
        assert_eq!(parse_attach("   "), None);
        assert_eq!(parse_attach("\"unclosed"), None);
    }

    #[test]
    fn kinds_come_from_the_name_then_the_bytes() {
        let mut opus = b"OggS".to_vec();
        opus.resize(28, 0);
        opus.extend_from_slice(b"OpusHead");
        let mut vorbis = b"OggS".to_vec();
        vorbis.resize(28, 0);
        vorbis.extend_from_slice(b"\x01vorbis");
        assert_eq!(kind_and_mime("a.PNG", b""), ("image", "image/png"));
        assert_eq!(kind_and_mime("note.opus", b""), ("voice", "audio/ogg"));
        assert_eq!(kind_and_mime("note.ogg", &opus), ("voice", "audio/ogg"));
        assert_eq!(kind_and_mime("song.ogg", &vorbis), ("audio", "audio/ogg"));
        assert_eq!(kind_and_mime("clip.mov", b""), ("video", "video/quicktime"));
        assert_eq!(kind_and_mime("x.md", b""), ("document", "text/markdown"));
        assert_eq!(
            kind_and_mime("noext", b"\x89PNG\r\n"),
            ("image", "image/png")
        );
        assert_eq!(kind_and_mime("noext", &opus), ("voice", "audio/ogg"));
        assert_eq!(
            kind_and_mime("README", b"hello"),
            ("document", "text/plain")
        );
        assert_eq!(
            kind_and_mime("blob", &[0, 1, 2]),
            ("document", "application/octet-stream")
        );
    }

    #[test]
    fn saved_names_stay_in_the_folder() {
        assert_eq!(safe_name("../../etc/passwd"), "_.._etc_passwd");
        assert_eq!(safe_name("a\\b.txt"), "a_b.txt");
        assert_eq!(safe_name(".."), "file");
        assert_eq!(safe_name(""), "file");
        assert_eq!(safe_name(".hidden"), "hidden");
        let long = "\u{e9}".repeat(200);
        assert!(safe_name(&long).len() <= 200);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_pull_streams_to_a_new_name_and_never_replaces_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let downloads_dir = dir.path().join("nested").join("iris");
        let mut d = Downloads::new(downloads_dir.clone());
        let media = json!({"media_id": "med_1", "filename": "../r.txt", "size": 6});
        d.begin(&media, 7).await.unwrap().expect("a pull frame");
        assert!(d.begin(&media, 8).await.unwrap().is_none(), "pulled once");
        d.chunk(b"abc").await;
        d.chunk(b"def").await;
        let line = d.end(7, true, None).await.unwrap();
        let first = downloads_dir.join("_r.txt");
        assert_eq!(
            line,
            format!("[saved _r.txt (6 bytes): {}]", first.display())
        );
        assert_eq!(std::fs::read(&first).unwrap(), b"abcdef");

        let media = json!({"media_id": "med_2", "filename": "_r.txt", "size": 2});
        d.begin(&media, 9).await.unwrap().unwrap();
        d.chunk(b"zz").await;
        let line = d.end(9, true, None).await.unwrap();
        assert!(line.ends_with("_r (1).txt]"), "{line}");
        assert_eq!(std::fs::read(&first).unwrap(), b"abcdef", "not replaced");

        // More than offered, a refusal, a failed read: nothing kept, no part file left.
        let media = json!({"media_id": "med_3", "filename": "big.bin", "size": 2});
        d.begin(&media, 10).await.unwrap().unwrap();
        d.chunk(b"123").await;
        let line = d.end(10, true, None).await.unwrap();
        assert!(line.contains("more than the 2 bytes offered"), "{line}");
        let media = json!({"media_id": "med_4", "filename": "gone.bin", "size": 2});
        d.begin(&media, 11).await.unwrap().unwrap();
        let line = d.end(11, false, Some("no media `med_4`")).await.unwrap();
        assert!(line.contains("the gateway refused: no media"), "{line}");
        assert!(d.end(12, true, None).await.is_none(), "not a pull's id");
        assert!(!d.busy());
        let mut names: Vec<String> = std::fs::read_dir(&downloads_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["_r (1).txt", "_r.txt"]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_copy_without_hard_links_never_replaces_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("part"), dir.path().join("a.txt"));
        std::fs::write(&from, b"new bytes").unwrap();
        copy_to_new(&from, &to).await.unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), b"new bytes");
        std::fs::write(&from, b"other").unwrap();
        let e = copy_to_new(&from, &to).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&to).unwrap(), b"new bytes");
    }
}
