//! The built-in demo agent: deterministic, offline, and exercising every streaming frame.
//!
//! Each turn reasons, plans a todo list, calls one tool (with progress), comments, and streams a
//! reply built from the user's text word by word. It shows a newcomer what a turn looks like
//! and gives the tests and benchmarks an agent whose output they can predict exactly.
//!
//! With files it says what it was shown (each file's name, kind and size, an image's pixel size,
//! a text document's first line, what it heard in a voice note) and answers with a file, so the
//! media paths in both directions can be tried without a real agent.

use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use super::{Agent, AgentError, AgentEvent, LocalBoxFuture, TurnInput, TurnSummary};
use crate::protocol::{MediaRef, Runtime, TodoItem, TodoStatus};

/// The model name the demo reports in footers.
pub const DEMO_MODEL: &str = "iris-demo";

pub struct DemoAgent {
    /// Pause between steps; zero streams as fast as the hub takes events.
    pace: Duration,
}

impl DemoAgent {
    pub fn new(pace_ms: u64) -> DemoAgent {
        DemoAgent {
            pace: Duration::from_millis(pace_ms),
        }
    }
}

/// The demo's answer to `text`: predictable so tests can assert it.
pub fn demo_reply(text: &str) -> String {
    let words = text.split_whitespace().count();
    let chars = text.chars().count();
    let quoted: String = text.chars().take(200).collect();
    format!(
        "You said: \u{201c}{quoted}\u{201d}. That is {words} word{} and {chars} character{}. I am the demo agent; connect a Hermes agent for real answers.",
        if words == 1 { "" } else { "s" },
        if chars == 1 { "" } else { "s" },
    )
}

/// How much of an image the demo reads looking for its size: a JPEG's frame header comes after
/// its EXIF and ICC segments (each at most 64 KiB), so a bounded prefix finds it in photos from
/// phones without reading a whole file into memory.
const IMAGE_HEADER_READ: u64 = 512 * 1024;

/// How much of a text document the demo reads for its first line.
const FIRST_LINE_READ: u64 = 4096;

/// The longest first line the demo quotes, in characters.
const FIRST_LINE_CHARS: usize = 200;

/// What the demo adds when a message carries files: one line per file, read from disk so the
/// demo proves it received the bytes, not just the metadata; for an image its pixel size, for a
/// text document its first line; for a voice note what it heard (`text`, which carries the
/// transcripts of the notes in `heard`). Blocking file I/O: call it off the event loop.
pub fn describe_media(
    media: &[(MediaRef, std::path::PathBuf)],
    text: &str,
    heard: &[String],
) -> String {
    let mut out = String::new();
    let mut voice = Vec::new();
    for (m, path) in media {
        let on_disk = std::fs::metadata(path).map(|md| md.len()).unwrap_or(0);
        out.push_str(&format!(
            "\nYou attached {} ({}, {}, {} bytes; {} bytes received).",
            m.filename, m.kind, m.mime, m.size, on_disk
        ));
        if let Some(more) = look_inside(m, path) {
            out.push('\n');
            out.push_str(&more);
        }
        if m.is_audio() && !heard.contains(&m.media_id) {
            voice.push(m.filename.as_str());
        }
    }
    if !heard.is_empty() {
        out.push_str(&format!("\nI heard: \u{201c}{}\u{201d}", text.trim()));
    }
    if !voice.is_empty() {
        out.push_str(&format!(
            "\nI got {} without a transcript: voice needs a transcription service that answers \
             (admin page \u{2192} Agent \u{2192} Transcription, or [transcription] url in config.toml).",
            voice.join(", ")
        ));
    }
    out
}

/// The one thing worth saying about a file's content, if any.
fn look_inside(m: &MediaRef, path: &std::path::Path) -> Option<String> {
    if m.is_image() {
        let head = read_prefix(path, IMAGE_HEADER_READ).ok()?;
        return Some(match image_size(&head) {
            Some((format, w, h)) => format!("It is a {format} image of {w}\u{d7}{h} pixels."),
            None => {
                "I could not read its size (not a PNG, JPEG, GIF or WebP header I know).".into()
            }
        });
    }
    if !super::media_in::is_text_like(&m.mime, &m.filename) {
        return None;
    }
    let head = read_prefix(path, FIRST_LINE_READ).ok()?;
    Some(
        match first_line(&head, head.len() as u64 == FIRST_LINE_READ) {
            Some(line) if line.is_empty() => "Its first line is empty.".into(),
            Some(line) => format!("Its first line: \u{201c}{line}\u{201d}"),
            None => "It does not read as UTF-8 text.".into(),
        },
    )
}

/// At most `max` bytes from the start of a file.
fn read_prefix(path: &std::path::Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)?.take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The first line of `head`, if it is UTF-8 text (a BOM and a CR dropped, at most
/// `FIRST_LINE_CHARS` characters). `cut` says `head` stops at the read limit, so a character
/// split there is not a sign of binary data.
fn first_line(head: &[u8], cut: bool) -> Option<String> {
    let head = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let (line, whole) = match head.iter().position(|&b| b == b'\n') {
        Some(at) => (&head[..at], true),
        None => (head, !cut),
    };
    let text = match std::str::from_utf8(line) {
        Ok(t) => t,
        // Only the last character was cut by the read limit.
        Err(e) if !whole && e.error_len().is_none() => {
            std::str::from_utf8(&line[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    if text.contains('\0') {
        return None;
    }
    let text = text.trim_end_matches('\r');
    let mut quoted: String = text.chars().take(FIRST_LINE_CHARS).collect();
    if quoted.len() < text.len() || !whole {
        quoted.push('\u{2026}');
    }
    Some(quoted)
}

/// An image's format and pixel size from its header alone (PNG IHDR, JPEG SOF, GIF logical
/// screen, WebP VP8/VP8L/VP8X). `None` for anything else, or a header cut short: never panics.
pub fn image_size(b: &[u8]) -> Option<(&'static str, u32, u32)> {
    fn at<const N: usize>(b: &[u8], i: usize) -> Option<[u8; N]> {
        b.get(i..i.checked_add(N)?)?.try_into().ok()
    }
    let be16 = |i| at::<2>(b, i).map(|x| u32::from(u16::from_be_bytes(x)));
    let le16 = |i| at::<2>(b, i).map(|x| u32::from(u16::from_le_bytes(x)));
    let le24 = |i| at::<3>(b, i).map(|x| u32::from_le_bytes([x[0], x[1], x[2], 0]));
    let found = if b.starts_with(b"\x89PNG\r\n\x1a\n") {
        if at::<4>(b, 12)? != *b"IHDR" {
            return None;
        }
        let w = u32::from_be_bytes(at(b, 16)?);
        let h = u32::from_be_bytes(at(b, 20)?);
        ("PNG", w, h)
    } else if b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a") {
        ("GIF", le16(6)?, le16(8)?)
    } else if b.starts_with(b"RIFF") && at::<4>(b, 8)? == *b"WEBP" {
        match &at::<4>(b, 12)? {
            b"VP8 " => {
                // Lossy: a key frame's start code, then 14-bit width and height.
                if at::<3>(b, 23)? != [0x9d, 0x01, 0x2a] {
                    return None;
                }
                ("WebP", le16(26)? & 0x3fff, le16(28)? & 0x3fff)
            }
            b"VP8L" => {
                // Lossless: a signature byte, then width-1 and height-1 in 14 bits each.
                if *b.get(20)? != 0x2f {
                    return None;
                }
                let bits = u32::from_le_bytes(at(b, 21)?);
                ("WebP", (bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1)
            }
            b"VP8X" => ("WebP", le24(24)? + 1, le24(27)? + 1),
            _ => return None,
        }
    } else if b.starts_with(&[0xff, 0xd8]) {
        let mut i = 2usize;
        loop {
            // Every segment starts with 0xFF (any number of fill bytes), then the marker.
            if *b.get(i)? != 0xff {
                return None;
            }
            while *b.get(i)? == 0xff {
                i += 1;
            }
            let marker = *b.get(i)?;
            i += 1;
            match marker {
                // Markers without a length.
                0x01 | 0xd0..=0xd8 => continue,
                // The image data (or its end) before any frame header: no size to find.
                0xd9 | 0xda => return None,
                // Frame headers (SOF0-15; C4, C8 and CC are other tables).
                0xc0..=0xcf if !matches!(marker, 0xc4 | 0xc8 | 0xcc) => {
                    break ("JPEG", be16(i + 5)?, be16(i + 3)?);
                }
                _ => {}
            }
            let len = be16(i)? as usize;
            if len < 2 {
                return None;
            }
            i = i.checked_add(len)?;
        }
    } else {
        return None;
    };
    (found.1 > 0 && found.2 > 0).then_some(found)
}

/// "1 word", "2 words": a count with its noun, singular for one.
fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn todos(done: usize) -> Vec<TodoItem> {
    let steps = ["Read the message", "Count its words", "Write the reply"];
    steps
        .iter()
        .enumerate()
        .map(|(i, content)| TodoItem {
            id: format!("t{}", i + 1),
            content: (*content).to_owned(),
            status: match i.cmp(&done) {
                std::cmp::Ordering::Less => TodoStatus::Completed,
                std::cmp::Ordering::Equal => TodoStatus::InProgress,
                std::cmp::Ordering::Greater => TodoStatus::Pending,
            },
        })
        .collect()
}

impl Agent for DemoAgent {
    fn name(&self) -> &'static str {
        "demo"
    }

    /// The demo answers as itself: there is no model to pick.
    fn can_pick_model(&self) -> bool {
        false
    }

    fn run_turn(
        &self,
        turn: TurnInput,
        events: mpsc::Sender<AgentEvent>,
    ) -> LocalBoxFuture<'_, Result<TurnSummary, AgentError>> {
        Box::pin(async move {
            tracing::debug!(lane = %turn.lane, message = %turn.user_message_id, "demo turn");
            let started = tokio::time::Instant::now();
            let pace = self.pace;
            let send = |ev: AgentEvent| {
                let events = events.clone();
                async move {
                    events
                        .send(ev)
                        .await
                        .map_err(|_| AgentError::Failed("the turn was abandoned".into()))?;
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                    Ok::<(), AgentError>(())
                }
            };
            let words = turn.text.split_whitespace().count();
            let chars = turn.text.chars().count();
            send(AgentEvent::Reasoning(format!(
                "The user sent {}. I will count them with a tool and echo the message back.",
                counted(words, "word")
            )))
            .await?;
            send(AgentEvent::Todos(todos(1))).await?;
            let preview: String = turn.text.chars().take(64).collect();
            send(AgentEvent::ToolStart {
                index: 0,
                name: "word_count".into(),
                preview: format!("counting words in \u{201c}{preview}\u{201d}"),
                args: json!({ "text": preview }),
                emoji: Some("\u{1f522}".into()),
            })
            .await?;
            send(AgentEvent::ToolProgress {
                index: 0,
                note: "splitting on whitespace".into(),
            })
            .await?;
            send(AgentEvent::ToolProgress {
                index: 0,
                note: format!("{} so far", counted(words, "word")),
            })
            .await?;
            send(AgentEvent::ToolEnd {
                index: 0,
                ok: true,
                duration_secs: pace.as_secs_f64() * 2.0,
                output_preview: format!("{words} words, {chars} characters"),
            })
            .await?;
            send(AgentEvent::Todos(todos(2))).await?;
            send(AgentEvent::Commentary(
                "Counted; writing the reply now.".into(),
            ))
            .await?;
            // Reading the files is blocking I/O: off the event loop.
            let (media, text, heard) = (turn.media.clone(), turn.text.clone(), turn.heard.clone());
            let described =
                tokio::task::spawn_blocking(move || describe_media(&media, &text, &heard))
                    .await
                    .map_err(|e| AgentError::Failed(format!("reading the files failed: {e}")))?;
            let reply = format!("{}{described}", demo_reply(&turn.text));
            let mut tokens = 0i64;
            for (i, word) in reply.split(' ').enumerate() {
                let chunk = if i == 0 {
                    word.to_owned()
                } else {
                    format!(" {word}")
                };
                send(AgentEvent::Text(chunk)).await?;
                tokens += 1;
            }
            if !turn.media.is_empty() {
                // Answer files with a file: exercises agent-sent media (media.offer) end to end.
                let listing: String = turn
                    .media
                    .iter()
                    .map(|(m, _)| format!("{}\t{}\t{}\n", m.filename, m.mime, m.size))
                    .collect();
                send(AgentEvent::File {
                    filename: "received.txt".into(),
                    mime: "text/plain".into(),
                    kind: "document".into(),
                    bytes: listing.into_bytes(),
                })
                .await?;
            }
            send(AgentEvent::Todos(todos(3))).await?;
            Ok(TurnSummary {
                model: Some(DEMO_MODEL.into()),
                tokens: Some(tokens),
                runtime: Runtime {
                    model: Some(DEMO_MODEL.into()),
                    latency: Some(started.elapsed().as_secs_f64()),
                    ..Runtime::default()
                },
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_word_is_not_one_words() {
        assert_eq!(counted(1, "word"), "1 word");
        assert_eq!(counted(0, "word"), "0 words");
        assert_eq!(counted(5, "word"), "5 words");
    }
    use crate::protocol::Lane;

    #[tokio::test(flavor = "current_thread")]
    async fn emits_every_kind_of_event_and_the_predicted_text() {
        let agent = DemoAgent::new(0);
        let (tx, mut rx) = mpsc::channel(64);
        let turn = TurnInput {
            lane: Lane::new("default", None),
            user_message_id: "m1".into(),
            text: "hello there world".into(),
            media: Vec::new(),
            heard: Vec::new(),
            session: "s".into(),
            history: Vec::new(),
            settings: Default::default(),
            resume_run: None,
        };
        let (summary, events) = tokio::join!(agent.run_turn(turn, tx), async {
            let mut v = Vec::new();
            while let Some(e) = rx.recv().await {
                v.push(e);
            }
            v
        });
        let summary = summary.unwrap();
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                AgentEvent::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text, demo_reply("hello there world"));
        assert!(text.contains("3 words"));
        for want in [
            "Reasoning",
            "Commentary",
            "ToolStart",
            "ToolProgress",
            "ToolEnd",
            "Todos",
        ] {
            assert!(
                events.iter().any(|e| format!("{e:?}").starts_with(want)),
                "no {want}"
            );
        }
        assert_eq!(summary.model.as_deref(), Some(DEMO_MODEL));
    }

    /// A real PNG from an encoder, not a hand-made header.
    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        image::RgbImage::new(w, h)
            .write_to(&mut out, image::ImageFormat::Png)
            .unwrap();
        out.into_inner()
    }

    /// A baseline JPEG's segments up to its frame header: SOI, fill bytes, an APP1 (EXIF-like)
    /// segment, a quantisation table, SOF0 (or SOF2), and the start of scan.
    fn jpeg(w: u16, h: u16, progressive: bool) -> Vec<u8> {
        let mut b = vec![0xff, 0xd8, 0xff, 0xff, 0xe1];
        let exif = vec![0x45u8; 3000];
        b.extend_from_slice(&((exif.len() + 2) as u16).to_be_bytes());
        b.extend_from_slice(&exif);
        b.extend_from_slice(&[0xff, 0xdb, 0x00, 0x43]);
        b.extend_from_slice(&[1u8; 65]);
        b.extend_from_slice(&[0xff, if progressive { 0xc2 } else { 0xc0 }, 0x00, 0x11, 8]);
        b.extend_from_slice(&h.to_be_bytes());
        b.extend_from_slice(&w.to_be_bytes());
        b.extend_from_slice(&[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
        b.extend_from_slice(&[0xff, 0xda, 0x00, 0x02, 0x12, 0x34]);
        b
    }

    fn gif(w: u16, h: u16) -> Vec<u8> {
        let mut b = b"GIF89a".to_vec();
        b.extend_from_slice(&w.to_le_bytes());
        b.extend_from_slice(&h.to_le_bytes());
        b.extend_from_slice(&[0xf7, 0, 0, 0x21, 0xf9]);
        b
    }

    fn riff(chunk: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut b = b"RIFF".to_vec();
        b.extend_from_slice(&((4 + 8 + data.len()) as u32).to_le_bytes());
        b.extend_from_slice(b"WEBP");
        b.extend_from_slice(chunk);
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(data);
        b
    }

    fn webp_lossy(w: u16, h: u16) -> Vec<u8> {
        let mut d = vec![0x50, 0x2a, 0x00, 0x9d, 0x01, 0x2a];
        d.extend_from_slice(&w.to_le_bytes());
        d.extend_from_slice(&h.to_le_bytes());
        d.extend_from_slice(&[0u8; 8]);
        riff(b"VP8 ", &d)
    }

    fn webp_lossless(w: u32, h: u32) -> Vec<u8> {
        let bits = (w - 1) | ((h - 1) << 14);
        let mut d = vec![0x2f];
        d.extend_from_slice(&bits.to_le_bytes());
        d.extend_from_slice(&[0u8; 8]);
        riff(b"VP8L", &d)
    }

    fn webp_extended(w: u32, h: u32) -> Vec<u8> {
        let mut d = vec![0x10, 0, 0, 0];
        d.extend_from_slice(&(w - 1).to_le_bytes()[..3]);
        d.extend_from_slice(&(h - 1).to_le_bytes()[..3]);
        riff(b"VP8X", &d)
    }

    #[test]
    fn image_sizes_come_from_each_formats_header() {
        assert_eq!(image_size(&png(7, 5)), Some(("PNG", 7, 5)));
        assert_eq!(
            image_size(&jpeg(4032, 3024, false)),
            Some(("JPEG", 4032, 3024))
        );
        assert_eq!(image_size(&jpeg(640, 480, true)), Some(("JPEG", 640, 480)));
        assert_eq!(image_size(&gif(300, 200)), Some(("GIF", 300, 200)));
        assert_eq!(
            image_size(&webp_lossy(1024, 768)),
            Some(("WebP", 1024, 768))
        );
        assert_eq!(
            image_size(&webp_lossless(16383, 1)),
            Some(("WebP", 16383, 1))
        );
        assert_eq!(
            image_size(&webp_extended(20_000, 9_000)),
            Some(("WebP", 20_000, 9_000))
        );
        // Not an image header this reader knows (HEIC), and empty input.
        assert_eq!(image_size(b"\0\0\0\x18ftypheic\0\0\0\0mif1heic"), None);
        assert_eq!(image_size(b""), None);
        // A JPEG whose scan starts before any frame header has no size to give.
        assert_eq!(
            image_size(&[0xff, 0xd8, 0xff, 0xda, 0, 2, 0xff, 0xd9]),
            None
        );
        // A zero-sized header is not an image size.
        assert_eq!(image_size(&gif(0, 10)), None);
    }

    #[test]
    fn a_truncated_or_damaged_header_never_panics() {
        for whole in [
            png(3, 2),
            jpeg(10, 20, false),
            gif(1, 1),
            webp_lossy(2, 3),
            webp_lossless(4, 5),
            webp_extended(6, 7),
        ] {
            let want = image_size(&whole).expect("the whole header reads");
            for n in 0..whole.len() {
                let got = image_size(&whole[..n]);
                assert!(got.is_none() || got == Some(want), "prefix {n}: {got:?}");
            }
            // Any byte damaged anywhere: an answer or none, never a panic.
            for i in 0..whole.len() {
                for v in [0x00, 0xff, 0x01, 0xc0, 0xd9] {
                    let mut bad = whole.clone();
                    bad[i] = v;
                    let _ = image_size(&bad);
                }
            }
        }
        // A JPEG segment length pointing past the end (and past usize) does not panic.
        assert_eq!(image_size(&[0xff, 0xd8, 0xff, 0xe0, 0xff, 0xff]), None);
        assert_eq!(image_size(&[0xff, 0xd8, 0xff, 0xe0, 0x00, 0x01]), None);
        assert_eq!(image_size(&[0xff, 0xd8, 0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn first_lines_of_text_and_not_of_binary() {
        assert_eq!(
            first_line(b"Shopping\r\nmilk\n", false).as_deref(),
            Some("Shopping")
        );
        assert_eq!(
            first_line(b"\xef\xbb\xbfh\xc3\xa9llo", false).as_deref(),
            Some("h\u{e9}llo")
        );
        assert_eq!(first_line(b"\nsecond", false).as_deref(), Some(""));
        assert_eq!(first_line(b"bin\xff\xfe\n", false), None);
        assert_eq!(first_line(b"nul\0byte\n", false), None);
        // A line cut by the read limit in the middle of a character is still text.
        assert_eq!(first_line(b"caf\xc3", true).as_deref(), Some("caf\u{2026}"));
        let long = "x".repeat(FIRST_LINE_CHARS + 5);
        let quoted = first_line(long.as_bytes(), false).unwrap();
        assert_eq!(quoted.chars().count(), FIRST_LINE_CHARS + 1);
        assert!(quoted.ends_with('\u{2026}'));
    }

    fn file(
        dir: &std::path::Path,
        name: &str,
        kind: &str,
        mime: &str,
        bytes: &[u8],
    ) -> (MediaRef, std::path::PathBuf) {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let m = MediaRef {
            media_id: format!("med_{name}"),
            kind: kind.into(),
            mime: mime.into(),
            size: bytes.len() as i64,
            filename: name.into(),
            message_id: None,
        };
        (m, path)
    }

    #[test]
    fn describes_images_documents_and_voice_notes() {
        let dir = tempfile::tempdir().unwrap();
        let picture = png(4, 3);
        let media = vec![
            file(dir.path(), "plant.png", "image", "image/png", &picture),
            file(
                dir.path(),
                "notes.md",
                "document",
                "text/markdown",
                b"# Garden plan\nbeans\n",
            ),
            file(
                dir.path(),
                "scan.heic",
                "image",
                "image/heic",
                b"\0\0\0\x18ftypheic",
            ),
            file(
                dir.path(),
                "blob.bin",
                "document",
                "application/octet-stream",
                &[0, 1, 2],
            ),
        ];
        let text = describe_media(&media, "look", &[]);
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(
            lines,
            [
                format!("You attached plant.png (image, image/png, {0} bytes; {0} bytes received).", picture.len()).as_str(),
                "It is a PNG image of 4\u{d7}3 pixels.",
                "You attached notes.md (document, text/markdown, 20 bytes; 20 bytes received).",
                "Its first line: \u{201c}# Garden plan\u{201d}",
                "You attached scan.heic (image, image/heic, 12 bytes; 12 bytes received).",
                "I could not read its size (not a PNG, JPEG, GIF or WebP header I know).",
                "You attached blob.bin (document, application/octet-stream, 3 bytes; 3 bytes received).",
            ]
        );

        let note = vec![file(dir.path(), "note.ogg", "voice", "audio/ogg", b"OggS")];
        let note_id = vec![note[0].0.media_id.clone()];
        let heard = describe_media(&note, "water the beans", &note_id);
        assert!(
            heard.ends_with("\nI heard: \u{201c}water the beans\u{201d}"),
            "{heard}"
        );
        // A caption typed with a note that was not heard is not what was heard.
        let unheard = describe_media(&note, "a caption", &[]);
        assert!(
            unheard.contains(
                "I got note.ogg without a transcript: voice needs a transcription service"
            ),
            "{unheard}"
        );
        assert!(!unheard.contains("I heard"), "{unheard}");
    }
}
