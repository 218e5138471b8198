//! Files from the agent to the phone. Hermes' tools (image generation, text to speech, browser
//! screenshots, file tools) end in a line `MEDIA:/path/file.png`, which Hermes' own messaging
//! gateways turn into an attachment (`gateway/platforms/base.py`, `extract_media`); a model or
//! Hermes' chat-completions path may instead put an image inline as
//! `![alt](data:image/png;base64,…)`. Both are cut out of the answer's text here and become
//! `AgentEvent::File`s, which the hub stores, offers with `media.offer{…, message_id}` and
//! outboxes.
//!
//! Two halves:
//! - [`MediaTags`]: a pure streaming filter over the answer's text deltas. It passes text on at
//!   once and holds back only a tail that may still become a tag (a `MEDIA:` line until its end;
//!   an inline image until its `)`, bounded by the base64 size of the file limit), so no part of
//!   a tag ever reaches a `message.update`.
//! - [`FilePolicy`]: reading a `MEDIA:` path, only from the allowed folders (`agent.media_dirs`),
//!   after resolving symlinks (one out of them is refused), opened with `O_NOFOLLOW`, regular
//!   files only, never a credential or system file (a denylist like Hermes'
//!   `validate_media_delivery_path`), at most `limits.agent_file_bytes`. A refused tag becomes a
//!   plain note in the text.
//!
//! [`OutFilter`] joins them for the backends' worker threads (file reads never happen on the
//! event loop).
//!
//! Like Hermes (`_mask_protected_spans`), a tag inside a fenced code block, an inline code span
//! or a blockquote line is text, not a file: that is the agent showing an example. Unlike
//! Hermes, `MEDIA:` is matched in capitals only (its tools write it so; prose such as "social
//! media: /r/…" stays prose).

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use base64::Engine;

use super::AgentEvent;

/// What a `MEDIA:` tag may follow on its line before it is read anyway: a path is at most
/// `PATH_MAX` (4096) bytes, so a longer line without an end cannot hold a real one.
const MAX_TAG_LINE: usize = 4096 + 64;
/// Longest alt text of an inline image.
const MAX_ALT: usize = 256;
/// Longest image subtype in a data URL (`svg+xml`, `vnd.microsoft.icon`).
const MAX_SUBTYPE: usize = 32;

/// Extensions Hermes delivers unconditionally (`MEDIA_DELIVERY_EXTS` in Hermes 0.19.0's
/// `gateway/platforms/base.py`): a path ending in one of them may contain spaces.
const DELIVERY_EXTS: &[&str] = &[
    "png", "jpg", "jpeg", "gif", "webp", "bmp", "tiff", "svg", "mp4", "mov", "avi", "mkv", "webm",
    "mp3", "wav", "ogg", "opus", "m4a", "flac", "pdf", "docx", "doc", "odt", "rtf", "txt", "md",
    "epub", "xlsx", "xls", "ods", "csv", "tsv", "json", "xml", "yaml", "yml", "pptx", "ppt", "odp",
    "key", "zip", "tar", "gz", "tgz", "bz2", "xz", "7z", "rar", "apk", "ipa", "html", "htm",
];

/// Hermes' directives that ride along with `MEDIA:` tags; never shown.
const VOICE_DIRECTIVE: &str = "[[audio_as_voice]]";
const DOCUMENT_DIRECTIVE: &str = "[[as_document]]";

/// What the filter found in the text.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Tag(Tag),
}

/// A tag cut out of the text.
#[derive(Debug, Clone, PartialEq)]
pub enum Tag {
    /// `MEDIA:<path>`, the path as written (quotes removed). `line`: the tag was its line's
    /// only content and the line's end was taken with it (a note in its place ends the line).
    Path { path: String, line: bool },
    /// `![alt](data:image/SUBTYPE;base64,DATA)`.
    Inline {
        alt: String,
        subtype: String,
        base64: String,
    },
    /// An inline image whose data ran past the limit: its data was dropped as it came.
    InlineTooLarge,
    /// The answer ended inside an inline image's data.
    InlineCut,
}

/// Where a candidate tag at the start of a slice stands.
enum Found {
    /// Not a tag: the byte is text.
    No,
    /// Could still become one: hold from here.
    Hold,
    /// An inline image whose data goes on: hold from here, its first `scanned` bytes checked
    /// (`count` base64 characters among them), so the next delta resumes there.
    HoldData { scanned: usize, count: usize },
    /// A tag of `len` bytes; `skip`: drop the base64 that follows (an oversized image).
    Tag { len: usize, tag: Tag, skip: bool },
    /// A directive of `len` bytes (consumed, nothing shown).
    Directive { len: usize, voice: bool },
}

/// Markdown context of the current line: tags count only outside code and quotes.
#[derive(Debug, Clone, Default)]
struct LineState {
    in_fence: bool,
    /// Up to the first three non-blank bytes of the line.
    head: Vec<u8>,
    indent: usize,
    blank: bool,
    /// Backticks seen on this line outside a fence: odd means inside an inline code span.
    ticks: usize,
    prev: Option<u8>,
}

impl LineState {
    fn fresh() -> LineState {
        LineState {
            blank: true,
            ..LineState::default()
        }
    }

    fn advance(&mut self, b: u8) {
        if b == b'\n' {
            let fence = self.indent <= 3 && (self.head == b"```" || self.head == b"~~~");
            if fence {
                self.in_fence = !self.in_fence;
            }
            *self = LineState {
                in_fence: self.in_fence,
                prev: Some(b),
                ..LineState::fresh()
            };
            return;
        }
        if self.blank && (b == b' ' || b == b'\t') {
            self.indent += 1;
        } else {
            self.blank = false;
            if self.head.len() < 3 {
                self.head.push(b);
            }
        }
        if b == b'`' {
            self.ticks += 1;
        }
        self.prev = Some(b);
    }

    /// Whether a tag may start here.
    fn tags_allowed(&self) -> bool {
        let quote = self.head.first() == Some(&b'>');
        let fence_line = self.head.starts_with(b"```") || self.head.starts_with(b"~~~");
        !self.in_fence && !quote && !fence_line && self.ticks.is_multiple_of(2)
    }

    /// A tag must start a word: not glued to a word, a path or a code span.
    fn at_boundary(&self) -> bool {
        self.prev
            .is_none_or(|p| !(p.is_ascii_alphanumeric() || b"`/\\._-".contains(&p)))
    }
}

/// The streaming filter: feed it deltas, get text and tags in order.
#[derive(Debug, Clone)]
pub struct MediaTags {
    /// The undecided tail: it starts where a tag may start.
    pending: String,
    line: LineState,
    /// Most base64 characters an inline image may have (the file limit's base64 size).
    max_base64: usize,
    /// Dropping the rest of an oversized inline image's data.
    skipping: bool,
    /// How far the held inline image's data was checked (see `Found::HoldData`): each delta
    /// costs its own length, not the whole held image again.
    data_seen: Option<(usize, usize)>,
    /// Hermes' `[[audio_as_voice]]` was seen: audio files are voice notes.
    pub voice: bool,
}

impl MediaTags {
    /// `max_file_bytes`: the largest file an inline image may decode to.
    pub fn new(max_file_bytes: u64) -> MediaTags {
        let max = usize::try_from(max_file_bytes).unwrap_or(usize::MAX / 2);
        MediaTags {
            pending: String::new(),
            line: LineState::fresh(),
            max_base64: max.div_ceil(3).saturating_mul(4),
            skipping: false,
            data_seen: None,
            voice: false,
        }
    }

    /// How many bytes are held back now (for tests and bounds).
    pub fn held(&self) -> usize {
        self.pending.len()
    }

    /// Feeds one delta; returns what is decided.
    pub fn push(&mut self, delta: &str) -> Vec<Piece> {
        self.pending.push_str(delta);
        self.scan(false)
    }

    /// The text is over (the answer ended, or a tool call starts a new stretch): everything held
    /// is decided now.
    pub fn finish(&mut self) -> Vec<Piece> {
        let out = self.scan(true);
        self.line = LineState::fresh();
        self.skipping = false;
        self.data_seen = None;
        out
    }

    fn scan(&mut self, last: bool) -> Vec<Piece> {
        let s = std::mem::take(&mut self.pending);
        // Valid for the candidate the held tail starts with, at 0.
        let mut resume = self.data_seen.take();
        let bytes = s.as_bytes();
        let mut out = Vec::new();
        let mut text_from = 0;
        let mut i = 0;
        let mut hold_at = None;
        let flush = |out: &mut Vec<Piece>, from: usize, to: usize| {
            if to > from {
                push_text(out, &s[from..to]);
            }
        };
        while i < bytes.len() {
            if self.skipping {
                let b = bytes[i];
                if is_base64(b) || (b.is_ascii_whitespace() && b != b'\n') {
                    i += 1;
                    text_from = i;
                    continue;
                }
                self.skipping = false;
                if b == b')' {
                    i += 1;
                    text_from = i;
                }
                continue;
            }
            let b = bytes[i];
            if matches!(b, b'M' | b'"' | b'\'' | b'!' | b'[') && self.line.tags_allowed() {
                let resume = if i == 0 { resume.take() } else { None };
                match self.candidate(&s[i..], last, resume) {
                    Found::No => {}
                    Found::Hold => {
                        hold_at = Some(i);
                        break;
                    }
                    Found::HoldData { scanned, count } => {
                        self.data_seen = Some((scanned, count));
                        hold_at = Some(i);
                        break;
                    }
                    Found::Tag { len, tag, skip } => {
                        flush(&mut out, text_from, i);
                        out.push(Piece::Tag(tag));
                        for &c in &bytes[i..i + len] {
                            self.line.advance(c);
                        }
                        self.skipping = skip;
                        i += len;
                        text_from = i;
                        continue;
                    }
                    Found::Directive { len, voice } => {
                        flush(&mut out, text_from, i);
                        self.voice |= voice;
                        i += len;
                        text_from = i;
                        continue;
                    }
                }
            }
            self.line.advance(b);
            i += 1;
        }
        let end = hold_at.unwrap_or(bytes.len());
        flush(&mut out, text_from, end);
        self.pending = match hold_at {
            // The held tail is the whole of it: kept as it is, not copied.
            Some(0) => s,
            Some(at) => s[at..].to_owned(),
            None => String::new(),
        };
        out
    }

    /// What starts at `s` (whose first byte is a possible tag start).
    fn candidate(&self, s: &str, last: bool, resume: Option<(usize, usize)>) -> Found {
        let b = s.as_bytes();
        match b[0] {
            b'!' => self.inline_image(s, last, resume),
            b'[' => directive(s, last),
            b'"' | b'\'' => {
                // `"MEDIA:/x.png"`: the quote belongs to the tag.
                if b.len() == 1 {
                    return if last || !self.line.at_boundary() {
                        Found::No
                    } else {
                        Found::Hold
                    };
                }
                if b[1] != b'M' || !self.line.at_boundary() {
                    return Found::No;
                }
                self.media_tag(s, 1, last)
            }
            _ if self.line.at_boundary() => self.media_tag(s, 0, last),
            _ => Found::No,
        }
    }

    /// `MEDIA:<path>` at `s[lead..]`, `lead` being 1 after a quote.
    fn media_tag(&self, s: &str, lead: usize, last: bool) -> Found {
        const WORD: &str = "MEDIA:";
        let rest = &s[lead..];
        if rest.len() < WORD.len() {
            return if WORD.starts_with(rest) && !last {
                Found::Hold
            } else {
                Found::No
            };
        }
        if !rest.starts_with(WORD) {
            return Found::No;
        }
        let line_end = s.find('\n');
        let line = match line_end {
            Some(end) => &s[..end],
            None if last || s.len() > MAX_TAG_LINE => s,
            None => return Found::Hold,
        };
        let mut cut = line.len().min(MAX_TAG_LINE);
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        let line = &line[..cut];
        let after = lead + WORD.len();
        let spaces = line[after..].len() - line[after..].trim_start().len();
        let start = after + spaces;
        let Some((path, mut end)) = tag_path(&line[start..]) else {
            return Found::No;
        };
        end += start;
        // A closing quote matching the opening one, or Hermes' optional trailing quote.
        if let Some(&q) = line.as_bytes().get(end) {
            if matches!(q, b'`' | b'"' | b'\'') {
                end += 1;
            }
        }
        let whole_line = self.line.blank && line[end..].trim().is_empty();
        let len = if whole_line {
            match line_end {
                Some(e) if e == line.len() => e + 1,
                _ => line.len(),
            }
        } else {
            end
        };
        Found::Tag {
            len,
            tag: Tag::Path {
                path,
                line: whole_line && line_end.is_some(),
            },
            skip: false,
        }
    }

    /// `![alt](data:image/SUBTYPE;base64,DATA)` at `s`.
    fn inline_image(&self, s: &str, last: bool, resume: Option<(usize, usize)>) -> Found {
        let b = s.as_bytes();
        // A partial match that the stream may still complete, unless it is over.
        let partial = || if last { Found::No } else { Found::Hold };
        if b.len() < 2 {
            return partial();
        }
        if b[1] != b'[' {
            return Found::No;
        }
        let Some(close) = s[2..].find(']') else {
            return if s.len() - 2 > MAX_ALT || s[2..].contains('\n') {
                Found::No
            } else {
                partial()
            };
        };
        let alt = &s[2..2 + close];
        if alt.len() > MAX_ALT || alt.contains('\n') {
            return Found::No;
        }
        let mut at = match literal(s, 2 + close + 1, "(data:image/", last) {
            Ok(after) => after,
            Err(found) => return found,
        };
        let sub_len = s[at..]
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || b".+-".contains(c))
            .count();
        if sub_len > MAX_SUBTYPE {
            return Found::No;
        }
        let subtype = &s[at..at + sub_len];
        at += sub_len;
        if subtype.is_empty() && at < s.len() {
            return Found::No;
        }
        at = match literal(s, at, ";base64,", last) {
            Ok(after) => after,
            Err(found) => return found,
        };
        // From here it is an inline image for sure: never text again.
        let data_from = at;
        let (start, mut count) = match resume {
            Some((scanned, count)) if scanned >= data_from && scanned <= s.len() => {
                (scanned, count)
            }
            _ => (data_from, 0),
        };
        for (k, c) in s[start..].bytes().enumerate() {
            let k = k + start - data_from;
            if c == b')' {
                let base64: String = s[data_from..data_from + k]
                    .chars()
                    .filter(|c| !c.is_ascii_whitespace())
                    .collect();
                return Found::Tag {
                    len: data_from + k + 1,
                    tag: Tag::Inline {
                        alt: alt.to_owned(),
                        subtype: subtype.to_owned(),
                        base64,
                    },
                    skip: false,
                };
            }
            if is_base64(c) {
                count += 1;
                if count > self.max_base64 {
                    return Found::Tag {
                        len: data_from + k + 1,
                        tag: Tag::InlineTooLarge,
                        skip: true,
                    };
                }
            } else if !(c.is_ascii_whitespace() && c != b'\n') {
                // Damaged data: what was an image is dropped; the text goes on from here.
                return Found::Tag {
                    len: data_from + k,
                    tag: Tag::InlineCut,
                    skip: false,
                };
            }
        }
        if last {
            Found::Tag {
                len: s.len(),
                tag: Tag::InlineCut,
                skip: false,
            }
        } else {
            Found::HoldData {
                scanned: s.len(),
                count,
            }
        }
    }
}

/// `lit` at `s[at..]`: where it ends, or what that means when it is not (all) there.
fn literal(s: &str, at: usize, lit: &str, last: bool) -> Result<usize, Found> {
    let have = &s[at..];
    if have.starts_with(lit) {
        return Ok(at + lit.len());
    }
    Err(
        if have.len() < lit.len() && lit.starts_with(have) && !last {
            Found::Hold
        } else {
            Found::No
        },
    )
}

/// `[[audio_as_voice]]` / `[[as_document]]` at `s`.
fn directive(s: &str, last: bool) -> Found {
    for (d, voice) in [(VOICE_DIRECTIVE, true), (DOCUMENT_DIRECTIVE, false)] {
        if s.starts_with(d) {
            return Found::Directive {
                len: d.len(),
                voice,
            };
        }
        if !last && s.len() < d.len() && d.starts_with(s) {
            return Found::Hold;
        }
    }
    Found::No
}

fn is_base64(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'=' | b'-' | b'_')
}

/// Appends text, joining it to a text piece just before.
fn push_text(out: &mut Vec<Piece>, text: &str) {
    match out.last_mut() {
        Some(Piece::Text(t)) => t.push_str(text),
        _ => out.push(Piece::Text(text.to_owned())),
    }
}

/// The path of a tag, from just after `MEDIA:` and its spaces to the line's end: the path
/// and where it ends. Hermes' `MEDIA_TAG_CLEANUP_RE`: a quoted path; or an absolute (`/`,
/// `~/`) one ending in a known extension (it may then contain spaces: the shortest such);
/// else (`MEDIA_EXTENSIONLESS_TAG_RE`) up to the first space or quote.
fn tag_path(line: &str) -> Option<(String, usize)> {
    let b = line.as_bytes();
    let first = *b.first()?;
    if matches!(first, b'`' | b'"' | b'\'') {
        let close = line[1..].find(first as char)?;
        let path = line[1..1 + close].trim();
        return (!path.is_empty()).then(|| (normalize(path), 1 + close));
    }
    if !(first == b'/' || line.starts_with("~/")) {
        return None;
    }
    let delimiter = |k: usize| {
        b.get(k)
            .is_none_or(|c| c.is_ascii_whitespace() || b"`\"',;:)]}".contains(c))
    };
    for (dot, _) in line.match_indices('.') {
        let ext_len = line[dot + 1..]
            .bytes()
            .take_while(u8::is_ascii_alphanumeric)
            .count();
        let end = dot + 1 + ext_len;
        let ext = line[dot + 1..end].to_ascii_lowercase();
        if ext_len > 0 && DELIVERY_EXTS.contains(&ext.as_str()) && delimiter(end) {
            return Some((line[..end].to_owned(), end));
        }
    }
    let end = line
        .bytes()
        .position(|c| c.is_ascii_whitespace() || b"`\"'".contains(&c))
        .unwrap_or(line.len());
    // The punctuation trimmed off the path goes with the tag, as in Hermes' pattern.
    let path = normalize(&line[..end]);
    (!path.is_empty()).then_some((path, end))
}

/// Hermes' `_normalize_media_tag_path`: trailing punctuation is prose, not path.
fn normalize(path: &str) -> String {
    path.trim()
        .trim_end_matches(|c: char| "`\"',.;:)}]".contains(c))
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------------

/// A file taken from the agent, ready to be stored and offered.
#[derive(Debug, Clone, PartialEq)]
pub struct OutFile {
    pub filename: String,
    pub mime: String,
    pub kind: String,
    pub bytes: Vec<u8>,
}

/// Why a tag did not become a file; its text is the note put in the answer in its place.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("{0} is on the agent's machine, which the gateway cannot read (only images put inline in the answer reach the phone)")]
    Remote(String),
    #[error("{0} is not an absolute path")]
    NotAbsolute(String),
    #[error("{0} does not exist")]
    Missing(String),
    #[error("{0} is outside the folders the gateway may read (agent.media_dirs)")]
    Outside(String),
    #[error("{0} is a credential or system file")]
    Denied(String),
    #[error("{0} is not a regular file")]
    NotRegular(String),
    #[error("{name} is {size} bytes, over the limit of {max} (limits.agent_file_bytes)")]
    TooLarge { name: String, size: u64, max: u64 },
    #[error("{0} could not be read: {1}")]
    Unreadable(String, String),
    #[error("an inline image is over the limit of {0} bytes (limits.agent_file_bytes)")]
    InlineTooLarge(u64),
    #[error("an inline image was damaged or cut off")]
    InlineDamaged,
}

impl Refusal {
    /// The note shown in the answer instead of the tag.
    pub fn note(&self) -> String {
        match self {
            Refusal::InlineTooLarge(_) | Refusal::InlineDamaged => {
                format!("[image not sent: {self}]")
            }
            _ => format!("[file not sent: {self}]"),
        }
    }
}

/// System places never read, whatever `media_dirs` says, unless an allowed folder itself lies
/// inside one (the owner chose it). Hermes' `_MEDIA_DELIVERY_DENIED_PREFIXES`, plus `/run`.
const DENIED_PREFIXES: &[&str] = &[
    "/etc", "/proc", "/sys", "/dev", "/root", "/boot", "/var/log", "/var/lib", "/var/run", "/run",
];
/// Credential folders: never read wherever they are (Hermes' `_MEDIA_DELIVERY_DENIED_HOME_SUBPATHS`
/// and `_ROOT_CREDENTIAL_DIRS`).
const DENIED_DIRS: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".kube",
    ".docker",
    ".azure",
    ".gcloud",
    ".password-store",
    "mcp-tokens",
];
/// Credential files: never read wherever they are (Hermes' `_ROOT_CREDENTIAL_FILES`, and the
/// usual key files).
const DENIED_FILES: &[&str] = &[
    ".env",
    "auth.json",
    "auth.lock",
    "credentials",
    ".anthropic_oauth.json",
    "google_token.json",
    "google_oauth_pending.json",
    "google_oauth.json",
    "webhook_subscriptions.json",
    "bws_cache.json",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    "id_rsa",
    "id_ecdsa",
    "id_ed25519",
    "id_dsa",
];

/// The folders under `HERMES_HOME` where Hermes 0.19.0 writes what it makes
/// (`MEDIA_DELIVERY_SAFE_ROOTS` in `gateway/platforms/base.py`, through `get_hermes_dir`): image
/// generation (`agent/image_gen_provider.py`), text to speech (`tools/tts_tool.py`), browser
/// screenshots (`tools/browser_tool.py`), MCP images and audio (`tools/mcp_tool.py`) and cached
/// documents, in the current layout and the legacy one.
pub const HERMES_OUTPUT_DIRS: &[&str] = &[
    "cache/images",
    "cache/audio",
    "cache/videos",
    "cache/documents",
    "cache/screenshots",
    "image_cache",
    "audio_cache",
    "video_cache",
    "document_cache",
    "browser_screenshots",
];

/// Where `MEDIA:` files may be read from, and how much.
#[derive(Debug, Clone, Default)]
pub struct FilePolicy {
    /// Allowed folders (resolved when a file is read: they may appear later).
    pub dirs: Vec<PathBuf>,
    /// The agent runs on another machine and no folders were configured: its paths are not
    /// on this one.
    pub remote: bool,
    /// The largest file taken: `limits.agent_file_bytes`, and never over `max_media_bytes`.
    pub max_bytes: u64,
    /// Hermes' home: its credential files there are never read.
    pub hermes_home: Option<PathBuf>,
    /// The gateway's own data (store, keys): never read.
    pub data_dir: Option<PathBuf>,
    /// The gateway user's home, for `~/` paths.
    pub home: Option<PathBuf>,
}

/// `$HERMES_HOME`, else `~/.hermes` of the user the gateway runs as.
pub fn default_hermes_home() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HERMES_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".hermes"))
}

/// Whether the agent URL names this machine (loopback): only then are its paths ours.
pub fn url_is_local(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    let host = host.to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

impl FilePolicy {
    pub fn from_config(config: &crate::config::Config) -> FilePolicy {
        let a = &config.agent;
        let hermes_home = a.hermes_home.clone().or_else(default_hermes_home);
        let explicit = a.media_dirs.clone();
        let remote = explicit.is_none() && !url_is_local(&a.base_url());
        let dirs = match explicit {
            Some(dirs) => dirs,
            None if remote => Vec::new(),
            None => hermes_home
                .iter()
                .flat_map(|h| HERMES_OUTPUT_DIRS.iter().map(move |d| h.join(d)))
                .collect(),
        };
        FilePolicy {
            dirs,
            remote,
            max_bytes: config
                .limits
                .agent_file_bytes
                .min(config.limits.max_media_bytes),
            hermes_home,
            data_dir: Some(
                config
                    .data_dir
                    .clone()
                    .unwrap_or_else(crate::config::default_data_dir),
            ),
            home: std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from),
        }
    }

    /// One line for the admin page: what of the agent's files reaches the phone.
    pub fn describe(&self) -> String {
        if self.remote {
            return "The agent runs on another machine: only images it puts inline in its \
                    answer reach the phone; files it names with MEDIA: are on its machine and \
                    are left out with a note (set agent.media_dirs to a folder of its files \
                    mounted here to change that)."
                .to_owned();
        }
        if self.dirs.is_empty() {
            return "Files the agent names with MEDIA: are not read (agent.media_dirs is \
                    empty); images it puts inline in its answer reach the phone."
                .to_owned();
        }
        let dirs: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        format!(
            "Files the agent names with MEDIA: (up to {} bytes) reach the phone from: {}; \
             images it puts inline in its answer always do.",
            self.max_bytes,
            dirs.join(", ")
        )
    }

    /// Reads the file a `MEDIA:` tag names, or says why not. Blocking: worker threads only.
    pub fn read(&self, raw: &str, voice: bool) -> Result<OutFile, Refusal> {
        let shown = shown_path(raw);
        if self.remote {
            return Err(Refusal::Remote(shown));
        }
        let expanded = match (raw.strip_prefix("~/"), &self.home) {
            (Some(rest), Some(home)) => home.join(rest),
            _ => PathBuf::from(raw),
        };
        if !expanded.is_absolute() || raw.contains('\0') {
            return Err(Refusal::NotAbsolute(shown));
        }
        // Resolves every symlink: what is checked is where the bytes really are.
        let real = std::fs::canonicalize(&expanded).map_err(|_| Refusal::Missing(shown.clone()))?;
        let Some(root) = self.allowed_root(&real) else {
            return Err(Refusal::Outside(shown));
        };
        if self.denied(&real, &root) {
            return Err(Refusal::Denied(shown));
        }
        let bytes = self.read_checked(&real, &shown)?;
        let filename = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "file".into());
        let (mime, kind) = kind_of(&filename, &bytes, voice);
        Ok(OutFile {
            filename,
            mime,
            kind,
            bytes,
        })
    }

    /// The allowed folder (resolved) that holds `real`.
    fn allowed_root(&self, real: &Path) -> Option<PathBuf> {
        self.dirs
            .iter()
            .filter_map(|d| std::fs::canonicalize(d).ok())
            .find(|root| real.starts_with(root) && real != root)
    }

    fn denied(&self, real: &Path, root: &Path) -> bool {
        let prefix = DENIED_PREFIXES
            .iter()
            .map(Path::new)
            .any(|p| real.starts_with(p) && !root.starts_with(p));
        let component = real.components().any(|c| match c {
            Component::Normal(name) => {
                let name = name.to_string_lossy();
                DENIED_DIRS.contains(&name.as_ref())
            }
            _ => false,
        });
        let name = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let file = DENIED_FILES.contains(&name.as_str());
        // Hermes' own settings at the top of its home (config.yaml holds its model keys).
        let hermes_config = self.hermes_home.as_ref().is_some_and(|h| {
            std::fs::canonicalize(h).is_ok_and(|h| {
                real.parent() == Some(h.as_path())
                    || real.starts_with(h.join("pairing"))
                    || real.starts_with(h.join("auth"))
            })
        });
        let own_data = self
            .data_dir
            .as_ref()
            .and_then(|d| std::fs::canonicalize(d).ok())
            .is_some_and(|d| real.starts_with(d));
        prefix || component || file || hermes_config || own_data
    }

    /// Opens without following a symlink swapped in since the check, and reads a regular file
    /// within the limit.
    fn read_checked(&self, real: &Path, shown: &str) -> Result<Vec<u8>, Refusal> {
        use std::os::unix::fs::OpenOptionsExt;
        let unreadable = |e: std::io::Error| Refusal::Unreadable(shown.to_owned(), e.to_string());
        let file = std::fs::OpenOptions::new()
            .read(true)
            // O_NONBLOCK: a FIFO put there must not hang the worker on open.
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(real)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => Refusal::Outside(shown.to_owned()),
                _ => unreadable(e),
            })?;
        let meta = file.metadata().map_err(unreadable)?;
        if !meta.is_file() {
            return Err(Refusal::NotRegular(shown.to_owned()));
        }
        // Where the open file really is: a folder on the way swapped for a symlink after the
        // check would show here.
        if let Ok(now) = std::fs::read_link(format!("/proc/self/fd/{}", raw_fd(&file))) {
            if self.allowed_root(&now).is_none() {
                return Err(Refusal::Outside(shown.to_owned()));
            }
        }
        let name = real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let too_large = |size| Refusal::TooLarge {
            name: name.clone(),
            size,
            max: self.max_bytes,
        };
        if meta.len() > self.max_bytes {
            return Err(too_large(meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(unreadable)?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(too_large(bytes.len() as u64));
        }
        Ok(bytes)
    }

    /// Decodes an inline image, within the limit.
    pub fn inline(&self, alt: &str, subtype: &str, base64: &str) -> Result<OutFile, Refusal> {
        use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
        // Models drop or add padding: either way the data is the same.
        let engine = GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
        );
        let bytes = engine.decode(base64).map_err(|_| Refusal::InlineDamaged)?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(Refusal::InlineTooLarge(self.max_bytes));
        }
        let declared = format!("image/{}", subtype.to_ascii_lowercase());
        let mime = match sniff_image(&bytes) {
            Some(m) => m.to_owned(),
            None if declared == "image/svg+xml" => declared,
            None => return Err(Refusal::InlineDamaged),
        };
        let ext = extension_for(&mime);
        let stem: String = alt
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .take(60)
            .collect::<String>()
            .trim()
            .replace(' ', "-");
        let stem = if stem.is_empty() {
            "image".into()
        } else {
            stem
        };
        Ok(OutFile {
            filename: format!("{stem}.{ext}"),
            mime,
            kind: "image".into(),
            bytes,
        })
    }
}

fn raw_fd(file: &std::fs::File) -> i32 {
    use std::os::fd::AsRawFd;
    file.as_raw_fd()
}

/// A path as shown in a note: no control characters, bounded.
fn shown_path(raw: &str) -> String {
    raw.chars().filter(|c| !c.is_control()).take(300).collect()
}

/// The image type the bytes say, from their magic numbers.
fn sniff_image(b: &[u8]) -> Option<&'static str> {
    Some(if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        "image/png"
    } else if b.starts_with(&[0xff, 0xd8, 0xff]) {
        "image/jpeg"
    } else if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        "image/gif"
    } else if b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP" {
        "image/webp"
    } else if b.starts_with(b"BM") {
        "image/bmp"
    } else if b.starts_with(b"II*\0") || b.starts_with(b"MM\0*") {
        "image/tiff"
    } else {
        return None;
    })
}

fn extension_for(mime: &str) -> &'static str {
    match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/bmp" => "bmp",
        "image/tiff" => "tiff",
        "image/svg+xml" => "svg",
        _ => "bin",
    }
}

/// Mime type and media kind of a file: from its extension, and for images from its bytes
/// (a `.png` that is not an image is sent as a document, not shown as a broken picture).
fn kind_of(filename: &str, bytes: &[u8], voice: bool) -> (String, String) {
    let ext = filename
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    let by_ext = match ext.as_str() {
        "png" | "jpg" | "jpeg" | "gif" | "webp" | "bmp" | "tif" | "tiff" => "image/raster",
        "svg" => "image/svg+xml",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "ogg" | "oga" => "audio/ogg",
        "opus" => "audio/opus",
        "m4a" => "audio/mp4",
        "flac" => "audio/flac",
        "aac" => "audio/aac",
        "mp4" | "m4v" => "video/mp4",
        "mov" => "video/quicktime",
        "avi" => "video/x-msvideo",
        "mkv" => "video/x-matroska",
        "webm" => "video/webm",
        "pdf" => "application/pdf",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "json" => "application/json",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "html" | "htm" => "text/html",
        "rtf" => "application/rtf",
        "epub" => "application/epub+zip",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "doc" => "application/msword",
        "xls" => "application/vnd.ms-excel",
        "ppt" => "application/vnd.ms-powerpoint",
        "odt" => "application/vnd.oasis.opendocument.text",
        "ods" => "application/vnd.oasis.opendocument.spreadsheet",
        "odp" => "application/vnd.oasis.opendocument.presentation",
        _ => "application/octet-stream",
    };
    let (mime, kind) = if by_ext == "image/raster" {
        match sniff_image(bytes) {
            Some(m) => (m.to_owned(), "image"),
            None => ("application/octet-stream".to_owned(), "document"),
        }
    } else if by_ext == "image/svg+xml" {
        (by_ext.to_owned(), "image")
    } else if by_ext.starts_with("audio/") {
        (by_ext.to_owned(), if voice { "voice" } else { "audio" })
    } else if by_ext.starts_with("video/") {
        (by_ext.to_owned(), "video")
    } else {
        (by_ext.to_owned(), "document")
    };
    (mime, kind.to_owned())
}

// ---------------------------------------------------------------------------------------------
// The two joined, for a backend's worker thread
// ---------------------------------------------------------------------------------------------

/// The answer's text on its way out of a backend: text events with the tags cut out, and a
/// file event (or a note) where each tag was. Runs on the turn's worker thread.
pub struct OutFilter {
    tags: MediaTags,
    policy: Arc<FilePolicy>,
}

impl OutFilter {
    pub fn new(policy: Arc<FilePolicy>) -> OutFilter {
        OutFilter {
            tags: MediaTags::new(policy.max_bytes),
            policy,
        }
    }

    /// One streamed delta.
    pub fn push(&mut self, delta: &str) -> Vec<AgentEvent> {
        let pieces = self.tags.push(delta);
        self.events(pieces)
    }

    /// The stretch of text is over (the answer ended, or a tool call comes).
    pub fn end(&mut self) -> Vec<AgentEvent> {
        let pieces = self.tags.finish();
        self.events(pieces)
    }

    /// A whole text at once (an answer that did not stream).
    pub fn whole(&mut self, text: &str) -> Vec<AgentEvent> {
        let mut events = self.push(text);
        events.extend(self.end());
        events
    }

    fn events(&self, pieces: Vec<Piece>) -> Vec<AgentEvent> {
        let mut out = Vec::new();
        let text = |out: &mut Vec<AgentEvent>, t: String| {
            if t.is_empty() {
                return;
            }
            match out.last_mut() {
                Some(AgentEvent::Text(prev)) => prev.push_str(&t),
                _ => out.push(AgentEvent::Text(t)),
            }
        };
        for piece in pieces {
            let tag = match piece {
                Piece::Text(t) => {
                    text(&mut out, t);
                    continue;
                }
                Piece::Tag(tag) => tag,
            };
            let (result, line) = match tag {
                Tag::Path { path, line } => (self.policy.read(&path, self.tags.voice), line),
                Tag::Inline {
                    alt,
                    subtype,
                    base64,
                } => (self.policy.inline(&alt, &subtype, &base64), false),
                Tag::InlineTooLarge => (Err(Refusal::InlineTooLarge(self.policy.max_bytes)), false),
                Tag::InlineCut => (Err(Refusal::InlineDamaged), false),
            };
            match result {
                Ok(f) => out.push(AgentEvent::File {
                    filename: f.filename,
                    mime: f.mime,
                    kind: f.kind,
                    bytes: f.bytes,
                }),
                Err(refusal) => {
                    tracing::info!("a file from the agent was not sent: {refusal}");
                    let mut note = refusal.note();
                    if line {
                        note.push('\n');
                    }
                    text(&mut out, note);
                }
            }
        }
        out
    }
}

/// A finished answer that did not stream through a turn (a run that ended while the gateway
/// was down, an answer recovered from the agent's store): its text with the tags taken out, and
/// the files. Off the event loop.
pub async fn files_of(policy: Arc<FilePolicy>, text: String) -> (String, Vec<AgentEvent>) {
    let original = text.clone();
    let work = move |_| {
        let mut clean = String::new();
        let mut files = Vec::new();
        for e in OutFilter::new(policy).whole(&text) {
            match e {
                AgentEvent::Text(t) => clean.push_str(&t),
                file => files.push(file),
            }
        }
        (clean, files)
    };
    match super::http::off_loop("agent-files", work).await {
        Ok(done) => done,
        // No thread to read files on: the text stays as it was rather than be lost.
        Err(e) => {
            tracing::warn!("could not look for files in a recovered answer: {e}");
            (original, Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything the filter gives for `deltas`, then its end: (text, tags).
    fn run(deltas: &[&str]) -> (String, Vec<Tag>) {
        let mut f = MediaTags::new(1 << 20);
        let mut pieces = Vec::new();
        for d in deltas {
            pieces.extend(f.push(d));
        }
        pieces.extend(f.finish());
        split(pieces)
    }

    fn split(pieces: Vec<Piece>) -> (String, Vec<Tag>) {
        let mut text = String::new();
        let mut tags = Vec::new();
        for p in pieces {
            match p {
                Piece::Text(t) => text.push_str(&t),
                Piece::Tag(t) => tags.push(t),
            }
        }
        (text, tags)
    }

    fn path(p: &str, line: bool) -> Tag {
        Tag::Path {
            path: p.into(),
            line,
        }
    }

    /// The text cut at every byte boundary (on char boundaries) into two deltas, and byte by
    /// byte, gives what the whole text gives.
    fn same_at_every_split(text: &str) -> (String, Vec<Tag>) {
        let whole = run(&[text]);
        for cut in 0..=text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            assert_eq!(
                run(&[&text[..cut], &text[cut..]]),
                whole,
                "cut at {cut} of {text:?}"
            );
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(run(&refs), whole, "char by char: {text:?}");
        whole
    }

    #[test]
    fn a_media_line_is_cut_out_at_every_split() {
        let (text, tags) = same_at_every_split("Here it is.\nMEDIA:/tmp/cat.png\nEnjoy!");
        assert_eq!(text, "Here it is.\nEnjoy!");
        assert_eq!(tags, [path("/tmp/cat.png", true)]);
    }

    #[test]
    fn hermes_forms_of_the_tag() {
        let cases = [
            ("MEDIA: /a/b.ogg", "/a/b.ogg", ""),
            ("MEDIA:`/a/b c.png`", "/a/b c.png", ""),
            ("\"MEDIA:/a/b.pdf\" done", "/a/b.pdf", " done"),
            (
                "See MEDIA:/a/report final.pdf, ok",
                "/a/report final.pdf",
                "See , ok",
            ),
            ("MEDIA:/a/Caddyfile.", "/a/Caddyfile", ""),
            ("MEDIA:'/a/x.mp3'", "/a/x.mp3", ""),
        ];
        for (input, want_path, want_text) in cases {
            let (text, tags) = same_at_every_split(input);
            assert_eq!(text, want_text, "{input}");
            assert_eq!(tags.len(), 1, "{input}: {tags:?}");
            let Tag::Path { path, .. } = &tags[0] else {
                panic!("{input}: {tags:?}")
            };
            assert_eq!(path, want_path, "{input}");
        }
    }

    #[test]
    fn text_without_tags_passes_unchanged_and_at_once() {
        let text = "Plain words, MEDIA without colon, ![a link](https://x.y/z.png), \
                    a \"quote\" and it's [[fine]]. Ünïcödé ✓\nNext line.";
        let (out, tags) = same_at_every_split(text);
        assert_eq!(out, text);
        assert!(tags.is_empty());
        // Fed whole, nothing is held back but a trailing maybe-tag start.
        let mut f = MediaTags::new(1 << 20);
        let got = split(f.push("Hello there, friend.\nNext"));
        assert_eq!(got.0, "Hello there, friend.\nNext");
        assert_eq!(f.held(), 0);
        let got = split(f.push(" and ME"));
        assert_eq!(got.0, " and ", "a possible `MEDIA:` start waits");
        assert_eq!(f.held(), 2);
        let got = split(f.push("AT!"));
        assert_eq!(got.0, "MEAT");
        assert_eq!(f.held(), 1, "`!` may start an inline image");
    }

    #[test]
    fn tags_in_code_and_quotes_are_text() {
        let text = "```\nMEDIA:/tmp/a.png\n```\n`MEDIA:/tmp/b.png`\n> MEDIA:/tmp/c.png\nMEDIA:/tmp/d.png\n";
        let (out, tags) = same_at_every_split(text);
        assert_eq!(tags, [path("/tmp/d.png", true)]);
        assert_eq!(
            out,
            "```\nMEDIA:/tmp/a.png\n```\n`MEDIA:/tmp/b.png`\n> MEDIA:/tmp/c.png\n"
        );
        // Glued to a word: not a tag.
        let (out, tags) = same_at_every_split("xMEDIA:/tmp/a.png");
        assert!(tags.is_empty());
        assert_eq!(out, "xMEDIA:/tmp/a.png");
    }

    #[test]
    fn not_a_path_is_text() {
        for t in ["MEDIA: see below", "MEDIA:relative/x.png", "MEDIA:"] {
            let (out, tags) = same_at_every_split(t);
            assert!(tags.is_empty(), "{t}");
            assert_eq!(out, t);
        }
    }

    #[test]
    fn inline_images_are_cut_out_at_every_split() {
        let text = "Look: ![a cat](data:image/png;base64,iVBORw0KGgo=) nice";
        let (out, tags) = same_at_every_split(text);
        assert_eq!(out, "Look:  nice");
        assert_eq!(
            tags,
            [Tag::Inline {
                alt: "a cat".into(),
                subtype: "png".into(),
                base64: "iVBORw0KGgo=".into()
            }]
        );
        let (_, tags) = same_at_every_split("![x](data:image/png;base64,AAAA");
        assert_eq!(tags, [Tag::InlineCut]);
    }

    #[test]
    fn an_oversized_inline_image_is_dropped_as_it_comes_and_held_within_its_bound() {
        let mut f = MediaTags::new(30); // 40 base64 characters at most
        let mut pieces = f.push("a ![x](data:image/png;base64,");
        for _ in 0..100 {
            pieces.extend(f.push("AAAA"));
            assert!(f.held() <= 80, "held {}", f.held());
        }
        pieces.extend(f.push("AA==) b"));
        pieces.extend(f.finish());
        let (text, tags) = split(pieces);
        assert_eq!(text, "a  b");
        assert_eq!(tags, [Tag::InlineTooLarge]);
        // At the limit exactly: kept.
        let mut f = MediaTags::new(30);
        let (_, tags) = split(f.push(&format!("![x](data:image/png;base64,{})", "A".repeat(40))));
        assert!(matches!(tags[..], [Tag::Inline { .. }]), "{tags:?}");
    }

    #[test]
    fn a_large_inline_image_streamed_in_small_deltas_costs_its_length_once() {
        // 3 MB of base64 in 4-byte deltas: rescanning the held data at every delta would take
        // minutes; resuming where the last delta ended takes well under a second.
        let mut f = MediaTags::new(4 << 20);
        let started = std::time::Instant::now();
        let mut pieces = f.push("See ![big](data:image/png;base64,");
        let chunk = "QUJD";
        for _ in 0..(3 << 20) / chunk.len() {
            pieces.extend(f.push(chunk));
        }
        pieces.extend(f.push(") done"));
        pieces.extend(f.finish());
        let (text, tags) = split(pieces);
        assert_eq!(text, "See  done");
        assert!(matches!(&tags[..], [Tag::Inline { base64, .. }] if base64.len() == 3 << 20));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn directives_are_hidden_and_mark_voice() {
        let mut f = MediaTags::new(1 << 20);
        let mut pieces = f.push("[[audio_");
        pieces.extend(f.push("as_voice]]\nMEDIA:/a/b.ogg\n"));
        pieces.extend(f.finish());
        let (text, tags) = split(pieces);
        assert_eq!(text, "\n");
        assert_eq!(tags, [path("/a/b.ogg", true)]);
        assert!(f.voice);
    }

    #[test]
    fn a_held_line_is_bounded() {
        let mut f = MediaTags::new(1 << 20);
        f.push("MEDIA:/");
        for _ in 0..100 {
            f.push(&"a".repeat(100));
            assert!(f.held() <= MAX_TAG_LINE + 100);
        }
    }

    #[test]
    fn urls_on_this_machine() {
        for (url, local) in [
            ("http://127.0.0.1:8642", true),
            ("http://localhost:8642/v1", true),
            ("http://[::1]:8642", true),
            ("http://user:pw@127.0.0.2/", true),
            ("http://studio.local:8642", false),
            ("http://192.168.1.20:8642", false),
        ] {
            assert_eq!(url_is_local(url), local, "{url}");
        }
    }

    #[test]
    fn the_default_folders_follow_where_the_agent_runs() {
        let mut config = crate::config::Config::default();
        config.agent.backend = "hermes".into();
        config.agent.hermes_home = Some("/srv/hermes".into());
        let local = FilePolicy::from_config(&config);
        assert!(!local.remote);
        assert_eq!(local.dirs.len(), HERMES_OUTPUT_DIRS.len());
        assert!(local
            .dirs
            .contains(&PathBuf::from("/srv/hermes/cache/images")));
        assert_eq!(local.max_bytes, 32 << 20);
        config.agent.url = "http://studio.local:8642".into();
        let far = FilePolicy::from_config(&config);
        assert!(far.remote && far.dirs.is_empty());
        assert!(far.describe().contains("only images it puts inline"));
        // Folders named by the owner are read whatever the URL (a mount of the agent's files).
        config.agent.media_dirs = Some(vec!["/mnt/hermes-cache".into()]);
        let mounted = FilePolicy::from_config(&config);
        assert!(!mounted.remote);
        assert_eq!(mounted.dirs, [PathBuf::from("/mnt/hermes-cache")]);
        config.limits.max_media_bytes = 1000;
        assert_eq!(FilePolicy::from_config(&config).max_bytes, 1000);
        config.agent.media_dirs = Some(vec!["relative".into()]);
        assert!(config.validate().is_err());
    }

    #[test]
    fn kinds_come_from_the_extension_and_image_bytes() {
        let png = b"\x89PNG\r\n\x1a\n....";
        assert_eq!(
            kind_of("a.png", png, false),
            ("image/png".into(), "image".into())
        );
        assert_eq!(
            kind_of("a.jpg", png, false),
            ("image/png".into(), "image".into()),
            "the bytes win for images"
        );
        assert_eq!(
            kind_of("a.png", b"not an image", false),
            ("application/octet-stream".into(), "document".into())
        );
        assert_eq!(kind_of("a.ogg", b"", true).1, "voice");
        assert_eq!(kind_of("a.ogg", b"", false).1, "audio");
        assert_eq!(
            kind_of("a.pdf", b"", false),
            ("application/pdf".into(), "document".into())
        );
    }

    fn policy(dir: &Path, max: u64) -> FilePolicy {
        FilePolicy {
            dirs: vec![dir.join("allowed")],
            max_bytes: max,
            ..FilePolicy::default()
        }
    }

    #[test]
    fn reading_stays_inside_the_allowed_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let allowed = tmp.path().join("allowed");
        std::fs::create_dir_all(allowed.join(".ssh")).unwrap();
        std::fs::write(allowed.join("ok.txt"), b"hello").unwrap();
        std::fs::write(allowed.join("big.txt"), b"hello!").unwrap();
        std::fs::write(allowed.join(".ssh/id"), b"k").unwrap();
        std::fs::write(allowed.join(".env"), b"k").unwrap();
        std::fs::write(tmp.path().join("secret.txt"), b"s").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret.txt"), allowed.join("out.txt")).unwrap();
        let p = policy(tmp.path(), 5);
        let at = |n: &str| allowed.join(n).display().to_string();
        let f = p.read(&at("ok.txt"), false).unwrap();
        assert_eq!(
            (f.filename.as_str(), f.bytes.as_slice(), f.kind.as_str()),
            ("ok.txt", &b"hello"[..], "document")
        );
        assert!(matches!(
            p.read(&at("big.txt"), false),
            Err(Refusal::TooLarge { size: 6, .. })
        ));
        assert!(matches!(
            p.read(&at("out.txt"), false),
            Err(Refusal::Outside(_))
        ));
        assert!(matches!(
            p.read(&at(".ssh/id"), false),
            Err(Refusal::Denied(_))
        ));
        assert!(matches!(
            p.read(&at(".env"), false),
            Err(Refusal::Denied(_))
        ));
        assert!(matches!(
            p.read(&at("gone.txt"), false),
            Err(Refusal::Missing(_))
        ));
        assert!(
            matches!(p.read(&at(""), false), Err(Refusal::Outside(_))),
            "the folder itself"
        );
        assert!(matches!(
            p.read("/etc/passwd", false),
            Err(Refusal::Outside(_))
        ));
        assert!(matches!(
            p.read("rel/x.png", false),
            Err(Refusal::NotAbsolute(_))
        ));
        let remote = FilePolicy {
            remote: true,
            ..p.clone()
        };
        assert!(matches!(
            remote.read(&at("ok.txt"), false),
            Err(Refusal::Remote(_))
        ));
        assert!(Refusal::Outside("/etc/passwd".into())
            .note()
            .starts_with("[file not sent: /etc/passwd is outside"));
    }

    #[test]
    fn a_fifo_or_folder_is_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let allowed = tmp.path().join("allowed");
        std::fs::create_dir_all(allowed.join("sub")).unwrap();
        let fifo = allowed.join("pipe.ogg");
        let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let p = policy(tmp.path(), 100);
        assert!(matches!(
            p.read(&fifo.display().to_string(), false),
            Err(Refusal::NotRegular(_))
        ));
        assert!(matches!(
            p.read(&allowed.join("sub").display().to_string(), false),
            Err(Refusal::NotRegular(_))
        ));
    }

    #[test]
    fn inline_images_decode_within_the_limit() {
        let png = b"\x89PNG\r\n\x1a\n0123456789";
        let b64 = base64::engine::general_purpose::STANDARD.encode(png);
        let p = FilePolicy {
            max_bytes: png.len() as u64,
            ..FilePolicy::default()
        };
        let f = p.inline("a cat!", "png", &b64).unwrap();
        assert_eq!(
            (f.filename.as_str(), f.mime.as_str()),
            ("a-cat.png", "image/png")
        );
        assert_eq!(f.bytes, png);
        let smaller = FilePolicy {
            max_bytes: png.len() as u64 - 1,
            ..FilePolicy::default()
        };
        assert!(matches!(
            smaller.inline("", "png", &b64),
            Err(Refusal::InlineTooLarge(_))
        ));
        let not_image = base64::engine::general_purpose::STANDARD.encode(b"hello");
        assert_eq!(p.inline("", "png", &not_image), Err(Refusal::InlineDamaged));
    }

    #[test]
    fn the_joined_filter_gives_files_and_notes_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let allowed = tmp.path().join("allowed");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::write(allowed.join("a.txt"), b"A").unwrap();
        let mut f = OutFilter::new(Arc::new(policy(tmp.path(), 100)));
        let text = format!(
            "One.\nMEDIA:{}\nTwo.\nMEDIA:/etc/passwd\nThree.",
            allowed.join("a.txt").display()
        );
        let events = f.whole(&text);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0], AgentEvent::Text("One.\n".into()));
        assert!(matches!(&events[1], AgentEvent::File { filename, .. } if filename == "a.txt"));
        assert_eq!(
            events[2],
            AgentEvent::Text(
                "Two.\n[file not sent: /etc/passwd is outside the folders the gateway may read (agent.media_dirs)]\nThree."
                    .into()
            )
        );
    }
}
