//! The streaming half: `MEDIA:` tags and inline images found in the answer's text deltas, holding
//! back no more than what may still become one.

/// What a `MEDIA:` tag may follow on its line before it is read anyway: a path is at most
/// `PATH_MAX` (4096) bytes, so a longer line without an end cannot hold a real one.
pub(super) const MAX_TAG_LINE: usize = 4096 + 64;
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
                if is_base64(b) || b.is_ascii_whitespace() {
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
            } else if !c.is_ascii_whitespace() {
                // Spaces, tabs and line breaks are how base64 is wrapped (`base64` prints 76
                // columns a line): part of the data, dropped when it is decoded.
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
