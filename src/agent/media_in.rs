//! What a turn's files become for the agent (docs/media.md, "Phone to agent").
//!
//! - An image the agent can take (JPEG, PNG, WebP, GIF) goes as an image: as it is when it is
//!   already within `limits.agent_image_side` and `limits.agent_image_bytes` (bytes equal),
//!   else decoded, scaled down and re-encoded as JPEG until it fits. The original stays in
//!   media storage.
//! - A text document (by mime type or file name), valid UTF-8 and within
//!   `limits.agent_document_bytes`, is inlined into the message's text under its name.
//! - Anything else (audio, video, other documents, and images or documents that could not be
//!   used) is an attachment line saying what the file is and why it was not read, so the agent
//!   can tell the person.
//!
//! Decoding and encoding cost CPU and memory in proportion to the file: this runs on a turn's
//! worker thread (`off_loop`), never on the event loop.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use base64::Engine;
use image::codecs::jpeg::JpegEncoder;
use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};

use crate::config::Limits;
use crate::protocol::MediaRef;

/// The most a decoded image may take in memory (its pixels, before scaling). A 24-megapixel
/// photo is 72 MB as RGB; a larger one is named in an attachment line instead of risking a
/// small board's memory with several turns decoding at once.
pub const DECODE_MAX_BYTES: u64 = 128 << 20;
/// The longest side a decoder is allowed to start on, whatever the byte count says.
const DECODE_MAX_SIDE: u32 = 16_384;
/// All the images of one message together, as sent: Hermes' API server refuses a request
/// over 10 MB (`MAX_REQUEST_BYTES` in gateway/platforms/api_server.py) and base64 adds a
/// third, so images past this are named in attachment lines rather than sinking the turn.
pub const TURN_IMAGE_BYTES: usize = 6 << 20;
/// JPEG qualities tried at each size, best first.
const QUALITIES: [u8; 4] = [85, 75, 60, 45];
/// Below this longest side an image stops being worth sending.
const MIN_SIDE: u32 = 64;

/// The bounds on what the agent is given, from `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaLimits {
    pub image_side: u32,
    pub image_bytes: usize,
    pub document_bytes: usize,
}

impl MediaLimits {
    pub fn from_limits(l: &Limits) -> MediaLimits {
        MediaLimits {
            image_side: l.agent_image_side,
            image_bytes: l.agent_image_bytes,
            document_bytes: l.agent_document_bytes,
        }
    }
}

impl Default for MediaLimits {
    fn default() -> Self {
        MediaLimits::from_limits(&Limits::default())
    }
}

/// An image as the agent gets it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentImage {
    pub filename: String,
    /// The type of `bytes` (read from the bytes, not the phone's claim).
    pub mime: &'static str,
    pub bytes: Vec<u8>,
    pub width: u32,
    pub height: u32,
}

impl AgentImage {
    /// `data:image/…;base64,…`: what OpenAI-style `image_url` parts carry.
    pub fn data_url(&self) -> String {
        format!(
            "data:{};base64,{}",
            self.mime,
            base64::engine::general_purpose::STANDARD.encode(&self.bytes)
        )
    }
}

/// A message as the agent gets it: its text (with inlined documents and attachment lines) and
/// its images.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentInput {
    pub text: String,
    pub images: Vec<AgentImage>,
}

/// Builds what the agent gets for a message's text and files; `heard` are the voice notes whose
/// transcript the text already carries (`TurnInput::heard`). Blocking: call it on a worker
/// thread.
pub fn prepare(
    text: &str,
    media: &[(MediaRef, PathBuf)],
    heard: &[String],
    limits: &MediaLimits,
) -> AgentInput {
    let mut input = AgentInput {
        text: text.to_owned(),
        images: Vec::new(),
    };
    let mut image_budget = TURN_IMAGE_BYTES;
    for (m, path) in media {
        if heard.contains(&m.media_id) {
            input.text.push_str(&attachment_line(
                m,
                "heard: the message's text carries its words",
            ));
            continue;
        }
        match prepare_one(m, path, limits) {
            Prepared::Image(img) if img.bytes.len() > image_budget => {
                input.text.push_str(&attachment_line(
                    m,
                    &format!(
                        "not sent: the message's images are over the {} MiB the agent is sent at once",
                        TURN_IMAGE_BYTES >> 20
                    ),
                ));
            }
            Prepared::Image(img) => {
                image_budget -= img.bytes.len();
                input.text.push_str(&format!("\n[image: {}]", m.filename));
                input.images.push(img);
            }
            Prepared::Document(content) => {
                input.text.push_str(&format!(
                    "\n[file: {} ({}, {} bytes)]\n{}\n[end of file: {}]",
                    m.filename,
                    m.mime,
                    content.len(),
                    content.trim_end_matches(['\n', '\r']),
                    m.filename
                ));
            }
            Prepared::Line(why) => input.text.push_str(&attachment_line(m, &why)),
        }
    }
    // A message of files alone starts with its first file's line.
    if text.is_empty() {
        input
            .text
            .drain(..input.text.len() - input.text.trim_start_matches('\n').len());
    }
    input
}

/// How an earlier message of the conversation reads in the history sent with a later turn:
/// its text and a line per file. No file's bytes or contents are sent again: a photo reaches
/// the agent once, with its message (docs/agents.md, "Images and documents").
pub fn history_text(text: &str, media: &[MediaRef]) -> String {
    let mut out = text.to_owned();
    for m in media {
        if m.is_image() {
            out.push_str(&format!("\n[image: {}]", m.filename));
        } else {
            out.push_str(&format!(
                "\n[attached: {} ({}, {} bytes)]",
                m.filename, m.mime, m.size
            ));
        }
    }
    if text.is_empty() {
        out.drain(..out.len() - out.trim_start_matches('\n').len());
    }
    out
}

/// An image's width and height from its header alone (cheap: nothing is decoded), for a
/// description of the file; `None` when it is not an image the gateway reads.
pub fn image_dimensions(path: &Path) -> Option<(u32, u32)> {
    ImageReader::open(path)
        .ok()?
        .with_guessed_format()
        .ok()?
        .into_dimensions()
        .ok()
}

/// What one file becomes.
enum Prepared {
    Image(AgentImage),
    Document(String),
    /// An attachment line, with why the file was not read.
    Line(String),
}

fn prepare_one(m: &MediaRef, path: &Path, limits: &MediaLimits) -> Prepared {
    if is_text_like(&m.mime, &m.filename) {
        return match read_document(path, limits.document_bytes) {
            Ok(text) => Prepared::Document(text),
            Err(why) => Prepared::Line(why),
        };
    }
    if m.is_image() {
        return match image_for_agent(&m.filename, path, limits) {
            Ok(img) => Prepared::Image(img),
            Err(why) => Prepared::Line(why),
        };
    }
    let base = mime_base(&m.mime);
    let why = match (m.kind.as_str(), base.split('/').next().unwrap_or("")) {
        ("voice" | "audio", _) | (_, "audio") => "not read: the gateway sends the agent no audio",
        ("video", _) | (_, "video") => "not read: the gateway sends the agent no video",
        _ => "not read: not a text document or an image",
    };
    Prepared::Line(why.to_owned())
}

fn attachment_line(m: &MediaRef, why: &str) -> String {
    format!(
        "\n[attached: {} ({}, {} bytes): {why}]",
        m.filename, m.mime, m.size
    )
}

/// The mime type without parameters, lower case.
fn mime_base(mime: &str) -> String {
    mime.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Mime types of text that are not `text/*`.
const TEXT_MIMES: &[&str] = &[
    "application/json",
    "application/xml",
    "application/yaml",
    "application/x-yaml",
    "application/toml",
    "application/x-toml",
    "application/csv",
    "application/x-csv",
    "application/javascript",
    "application/x-javascript",
    "application/ecmascript",
    "application/typescript",
    "application/x-sh",
    "application/x-shellscript",
    "application/sql",
    "application/x-python",
    "application/x-python-code",
    "application/x-tex",
    "application/x-latex",
    "application/graphql",
    "application/x-ndjson",
    "application/x-subrip",
];

/// File name endings of text files a phone may label `application/octet-stream`.
const TEXT_EXTENSIONS: &[&str] = &[
    "txt",
    "text",
    "md",
    "markdown",
    "rst",
    "adoc",
    "org",
    "csv",
    "tsv",
    "json",
    "jsonl",
    "ndjson",
    "geojson",
    "xml",
    "yaml",
    "yml",
    "toml",
    "ini",
    "cfg",
    "conf",
    "properties",
    "env",
    "log",
    "html",
    "htm",
    "css",
    "scss",
    "js",
    "mjs",
    "cjs",
    "ts",
    "tsx",
    "jsx",
    "vue",
    "svelte",
    "py",
    "rs",
    "go",
    "c",
    "h",
    "cc",
    "cpp",
    "cxx",
    "hpp",
    "hh",
    "java",
    "kt",
    "kts",
    "swift",
    "m",
    "mm",
    "rb",
    "php",
    "pl",
    "pm",
    "lua",
    "r",
    "scala",
    "cs",
    "fs",
    "hs",
    "ex",
    "exs",
    "erl",
    "clj",
    "dart",
    "zig",
    "nim",
    "sh",
    "bash",
    "zsh",
    "fish",
    "ps1",
    "bat",
    "sql",
    "graphql",
    "proto",
    "tex",
    "bib",
    "srt",
    "vtt",
    "diff",
    "patch",
    "gradle",
    "cmake",
    "mk",
    "dockerfile",
    "tf",
    "nix",
    "ics",
    "vcf",
    "gpx",
    "svg",
];

/// File names without an extension that are text.
const TEXT_NAMES: &[&str] = &[
    "makefile",
    "dockerfile",
    "readme",
    "license",
    "changelog",
    "gemfile",
    "rakefile",
    "procfile",
    "justfile",
];

/// Whether a file is a text document, by its mime type or, failing that, its name.
pub fn is_text_like(mime: &str, filename: &str) -> bool {
    let base = mime_base(mime);
    if base.starts_with("text/")
        || TEXT_MIMES.contains(&base.as_str())
        || base.ends_with("+json")
        || base.ends_with("+xml")
        || base.ends_with("+yaml")
    {
        return true;
    }
    let name = filename.rsplit(['/', '\\']).next().unwrap_or("");
    let lower = name.to_ascii_lowercase();
    match lower.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => TEXT_EXTENSIONS.contains(&ext),
        // A dot file (`.env`, `.gitignore`) or no extension: the whole name decides.
        Some(("", rest)) => TEXT_EXTENSIONS.contains(&rest) || rest.starts_with("git"),
        _ => TEXT_NAMES.contains(&lower.as_str()),
    }
}

/// A text document's content, or why it is not inlined.
fn read_document(path: &Path, limit: usize) -> Result<String, String> {
    let file = File::open(path).map_err(|e| format!("not read: the stored file is gone ({e})"))?;
    let mut bytes = Vec::new();
    file.take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("not read: {e}"))?;
    if bytes.len() > limit {
        return Err(format!(
            "not read: larger than the {} the gateway inlines (limits.agent_document_bytes)",
            human_bytes(limit)
        ));
    }
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| "not read: not UTF-8 text".to_owned())?
        .trim_start_matches('\u{feff}');
    if text.contains('\0') {
        return Err("not read: binary data, not text".to_owned());
    }
    Ok(text.to_owned())
}

fn human_bytes(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

/// An image within the limits, or why it cannot be sent.
fn image_for_agent(
    filename: &str,
    path: &Path,
    limits: &MediaLimits,
) -> Result<AgentImage, String> {
    let file = File::open(path).map_err(|e| format!("not read: the stored file is gone ({e})"))?;
    let size = file.metadata().map(|md| md.len()).unwrap_or(u64::MAX);
    let mut reader = ImageReader::new(BufReader::new(file))
        .with_guessed_format()
        .map_err(|e| format!("not read: {e}"))?;
    let format = match reader.format() {
        Some(f @ (ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Gif)) => f,
        Some(other) => {
            return Err(format!(
                "not sent: the gateway does not read {other:?} images (it reads JPEG, PNG, WebP and GIF)"
            ))
        }
        None => {
            return Err(
                "not sent: not an image the gateway can read (it reads JPEG, PNG, WebP and GIF; HEIC and RAW are not)"
                    .to_owned(),
            )
        }
    };
    let mut bounds = image::Limits::default();
    bounds.max_alloc = Some(DECODE_MAX_BYTES);
    bounds.max_image_width = Some(DECODE_MAX_SIDE);
    bounds.max_image_height = Some(DECODE_MAX_SIDE);
    reader.limits(bounds);
    let undecodable = |e: image::ImageError| format!("not sent: the image cannot be decoded ({e})");
    let mut decoder = reader.into_decoder().map_err(undecodable)?;
    let (width, height) = decoder.dimensions();
    if decoder.total_bytes() > DECODE_MAX_BYTES {
        return Err(format!(
            "not sent: {width}×{height} pixels is more than the gateway decodes"
        ));
    }
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    // Decoded in full even when the file goes as it is: a damaged file would make the model's
    // server refuse the whole turn.
    let mut img = DynamicImage::from_decoder(decoder).map_err(undecodable)?;
    let within = width.max(height) <= limits.image_side
        && usize::try_from(size).is_ok_and(|s| s <= limits.image_bytes)
        && orientation == Orientation::NoTransforms;
    if within {
        let bytes = std::fs::read(path).map_err(|e| format!("not read: {e}"))?;
        if bytes.len() <= limits.image_bytes {
            return Ok(AgentImage {
                filename: filename.to_owned(),
                mime: mime_of(format),
                bytes,
                width,
                height,
            });
        }
    }
    // A camera photo is stored sideways with an EXIF note; re-encoding drops the note, so the
    // pixels are turned first.
    img.apply_orientation(orientation);
    let img = flatten(img);
    shrink_to_fit(filename, img, limits)
}

fn mime_of(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "image/png",
        ImageFormat::WebP => "image/webp",
        ImageFormat::Gif => "image/gif",
        _ => "image/jpeg",
    }
}

/// RGB for the JPEG encoder: transparent parts over white (what a chat shows them on).
fn flatten(img: DynamicImage) -> DynamicImage {
    if !img.color().has_alpha() {
        return DynamicImage::ImageRgb8(img.into_rgb8());
    }
    let rgba = img.into_rgba8();
    let (w, h) = rgba.dimensions();
    let rgb = image::RgbImage::from_fn(w, h, |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        let over = |c: u8| ((u16::from(c) * u16::from(a) + 255 * (255 - u16::from(a))) / 255) as u8;
        image::Rgb([over(r), over(g), over(b)])
    });
    DynamicImage::ImageRgb8(rgb)
}

/// Scales to the side limit and encodes JPEG at falling quality, then at smaller sides, until
/// the bytes fit.
fn shrink_to_fit(
    filename: &str,
    img: DynamicImage,
    limits: &MediaLimits,
) -> Result<AgentImage, String> {
    let mut side = limits.image_side.min(img.width().max(img.height()));
    let mut current = img;
    loop {
        if current.width().max(current.height()) > side {
            current = current.thumbnail(side, side);
        }
        for quality in QUALITIES {
            let mut out = Vec::new();
            JpegEncoder::new_with_quality(&mut out, quality)
                .encode_image(&current)
                .map_err(|e| format!("not sent: the image could not be re-encoded ({e})"))?;
            if out.len() <= limits.image_bytes {
                return Ok(AgentImage {
                    filename: filename.to_owned(),
                    mime: "image/jpeg",
                    bytes: out,
                    width: current.width(),
                    height: current.height(),
                });
            }
        }
        if side <= MIN_SIDE {
            return Err(format!(
                "not sent: it could not be made smaller than {} (limits.agent_image_bytes)",
                human_bytes(limits.image_bytes)
            ));
        }
        side = (side * 3 / 4).max(MIN_SIDE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn media(
        name: &str,
        kind: &str,
        mime: &str,
        bytes: &[u8],
    ) -> (MediaRef, PathBuf, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        let m = MediaRef {
            media_id: "med_1".into(),
            kind: kind.into(),
            mime: mime.into(),
            size: bytes.len() as i64,
            filename: name.into(),
            message_id: None,
        };
        (m, path, dir)
    }

    fn one(
        text: &str,
        name: &str,
        kind: &str,
        mime: &str,
        bytes: &[u8],
        l: &MediaLimits,
    ) -> AgentInput {
        let (m, p, _dir) = media(name, kind, mime, bytes);
        prepare(text, &[(m, p)], &[], l)
    }

    fn encoded(img: &DynamicImage, format: ImageFormat) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        out.into_inner()
    }

    /// A noisy picture (so it does not compress to nothing).
    fn noise(w: u32, h: u32) -> DynamicImage {
        let mut s = 0x2545_f491_u32;
        DynamicImage::ImageRgb8(image::RgbImage::from_fn(w, h, |_, _| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            image::Rgb([s as u8, (s >> 8) as u8, (s >> 16) as u8])
        }))
    }

    #[test]
    fn a_small_image_goes_as_it_is() {
        let png = encoded(&noise(40, 30), ImageFormat::Png);
        let got = one(
            "what is it?",
            "p.png",
            "image",
            "image/png",
            &png,
            &MediaLimits::default(),
        );
        assert_eq!(got.text, "what is it?\n[image: p.png]");
        assert_eq!(got.images.len(), 1);
        assert_eq!(got.images[0].bytes, png);
        assert_eq!(got.images[0].mime, "image/png");
        assert!(got.images[0]
            .data_url()
            .starts_with("data:image/png;base64,iVBOR"));
    }

    #[test]
    fn the_type_comes_from_the_bytes_not_the_claim() {
        let jpg = encoded(&noise(20, 20), ImageFormat::Jpeg);
        let got = one(
            "",
            "x.png",
            "image",
            "image/png",
            &jpg,
            &MediaLimits::default(),
        );
        assert_eq!(got.images[0].mime, "image/jpeg");
    }

    #[test]
    fn a_large_image_is_scaled_and_reencoded_within_both_limits() {
        let l = MediaLimits {
            image_side: 100,
            image_bytes: 6_000,
            document_bytes: 10,
        };
        let png = encoded(&noise(400, 200), ImageFormat::Png);
        let got = one("", "big.png", "image", "image/png", &png, &l);
        let img = &got.images[0];
        assert_eq!(img.mime, "image/jpeg");
        assert!(img.bytes.len() <= 6_000, "{}", img.bytes.len());
        let back = image::load_from_memory(&img.bytes).unwrap();
        assert!(back.width().max(back.height()) <= 100);
        assert_eq!(back.width(), 2 * back.height(), "the aspect ratio is kept");
        assert_eq!((img.width, img.height), (back.width(), back.height()));
    }

    #[test]
    fn a_photo_stored_sideways_is_turned_upright() {
        use image::ImageEncoder;
        // EXIF (TIFF, big-endian) with one entry: Orientation (0x0112) = 6, turn 90° clockwise.
        let exif = [
            b"MM\0*\0\0\0\x08\0\x01".as_slice(),
            &[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0],
            &[0, 0, 0, 0],
        ]
        .concat();
        let img = noise(40, 20);
        let mut jpg = Vec::new();
        let mut enc = JpegEncoder::new_with_quality(&mut jpg, 90);
        enc.set_exif_metadata(exif).unwrap();
        enc.write_image(img.as_bytes(), 40, 20, image::ExtendedColorType::Rgb8)
            .unwrap();
        let got = one(
            "",
            "side.jpg",
            "image",
            "image/jpeg",
            &jpg,
            &MediaLimits::default(),
        );
        let sent = &got.images[0];
        assert_ne!(
            sent.bytes, jpg,
            "re-encoded, so the EXIF note is not needed"
        );
        assert_eq!((sent.width, sent.height), (20, 40));
    }

    #[test]
    fn every_format_the_agent_takes_goes_as_it_is() {
        let img = noise(30, 20);
        for (format, mime) in [
            (ImageFormat::Png, "image/png"),
            (ImageFormat::Jpeg, "image/jpeg"),
            (ImageFormat::WebP, "image/webp"),
            (ImageFormat::Gif, "image/gif"),
        ] {
            let bytes = encoded(&img, format);
            let got = one(
                "",
                "x",
                "image",
                "application/octet-stream",
                &bytes,
                &MediaLimits::default(),
            );
            assert_eq!(got.images.len(), 1, "{format:?}: {}", got.text);
            assert_eq!((got.images[0].mime, &got.images[0].bytes), (mime, &bytes));
        }
    }

    #[test]
    fn an_image_at_the_byte_limit_goes_as_it_is_and_one_byte_less_is_reencoded() {
        let png = encoded(&noise(60, 60), ImageFormat::Png);
        let at = MediaLimits {
            image_bytes: png.len(),
            ..MediaLimits::default()
        };
        assert_eq!(
            one("", "a.png", "image", "image/png", &png, &at).images[0].bytes,
            png
        );
        let under = MediaLimits {
            image_bytes: png.len() - 1,
            ..MediaLimits::default()
        };
        let got = one("", "a.png", "image", "image/png", &png, &under);
        assert_eq!(got.images[0].mime, "image/jpeg");
        assert!(got.images[0].bytes.len() < png.len());
    }

    #[test]
    fn an_image_that_cannot_fit_is_an_attachment_line() {
        let l = MediaLimits {
            image_side: 1568,
            image_bytes: 100,
            document_bytes: 10,
        };
        let png = encoded(&noise(300, 300), ImageFormat::Png);
        let got = one("hi", "n.png", "image", "image/png", &png, &l);
        assert!(got.images.is_empty());
        assert!(
            got.text
                .contains("could not be made smaller than 100 bytes"),
            "{}",
            got.text
        );
    }

    #[test]
    fn alpha_is_flattened_over_white() {
        let clear = DynamicImage::ImageRgba8(image::RgbaImage::from_pixel(
            300,
            300,
            image::Rgba([0, 0, 0, 0]),
        ));
        let png = encoded(&clear, ImageFormat::Png);
        let l = MediaLimits {
            image_side: 100,
            ..MediaLimits::default()
        };
        let got = one("", "c.png", "image", "image/png", &png, &l);
        let back = image::load_from_memory(&got.images[0].bytes)
            .unwrap()
            .into_rgb8();
        assert!(back.get_pixel(50, 50).0.iter().all(|c| *c > 245));
    }

    #[test]
    fn undecodable_images_are_attachment_lines_saying_why() {
        let l = MediaLimits::default();
        // HEIC: an ISO box header no decoder here reads.
        let heic = b"\0\0\0\x18ftypheic\0\0\0\0mif1heic";
        let got = one("look", "p.heic", "image", "image/heic", heic, &l);
        assert!(got.images.is_empty());
        assert_eq!(
            got.text,
            "look\n[attached: p.heic (image/heic, 24 bytes): not sent: not an image the gateway can read (it reads JPEG, PNG, WebP and GIF; HEIC and RAW are not)]"
        );
        // A PNG cut short: the header reads, the pixels do not.
        let png = encoded(&noise(50, 50), ImageFormat::Png);
        let got = one(
            "",
            "cut.png",
            "image",
            "image/png",
            &png[..png.len() / 2],
            &l,
        );
        assert!(got.images.is_empty());
        assert!(
            got.text.contains("not sent: the image cannot be decoded"),
            "{}",
            got.text
        );
        // A format the gateway knows of but does not decode.
        let bmp = b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0\x28\0\0\0";
        let got = one("", "x.bmp", "image", "image/bmp", bmp, &l);
        assert!(
            got.text.contains("does not read Bmp images"),
            "{}",
            got.text
        );
    }

    #[test]
    fn a_huge_image_is_refused_before_it_is_decoded() {
        // A PNG claiming 16000×16000 RGBA (1 GB of pixels), with no pixel data.
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&16_000u32.to_be_bytes());
        ihdr.extend_from_slice(&16_000u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
        for (kind, data) in [(&b"IHDR"[..], &ihdr[..]), (b"IDAT", b""), (b"IEND", b"")] {
            png.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let chunk = [kind, data].concat();
            png.extend_from_slice(&chunk);
            png.extend_from_slice(&crc32(&chunk).to_be_bytes());
        }
        let got = one(
            "",
            "huge.png",
            "image",
            "image/png",
            &png,
            &MediaLimits::default(),
        );
        assert!(got.images.is_empty());
        assert!(
            got.text
                .contains("16000×16000 pixels is more than the gateway decodes"),
            "{}",
            got.text
        );
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for b in data {
            crc ^= u32::from(*b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn text_documents_are_inlined_under_their_name_up_to_the_limit() {
        let l = MediaLimits {
            document_bytes: 12,
            ..MediaLimits::default()
        };
        let got = one(
            "read this",
            "notes.md",
            "document",
            "application/octet-stream",
            b"# Title\nbody\n",
            &l,
        );
        assert!(
            got.text.contains("[attached: notes.md"),
            "13 bytes is over 12: {}",
            got.text
        );
        assert!(got
            .text
            .contains("larger than the 12 bytes the gateway inlines"));
        let got = one(
            "read this",
            "notes.md",
            "document",
            "application/octet-stream",
            b"# Title\nbody",
            &l,
        );
        assert_eq!(
            got.text,
            "read this\n[file: notes.md (application/octet-stream, 12 bytes)]\n# Title\nbody\n[end of file: notes.md]"
        );
    }

    #[test]
    fn text_that_is_not_utf8_or_has_nul_is_not_inlined() {
        let l = MediaLimits::default();
        let got = one("", "latin1.txt", "document", "text/plain", b"caf\xe9", &l);
        assert!(
            got.text
                .ends_with("latin1.txt (text/plain, 4 bytes): not read: not UTF-8 text]"),
            "{}",
            got.text
        );
        let got = one("", "x.json", "document", "application/json", b"{\0}", &l);
        assert!(got.text.contains("not read: binary data"), "{}", got.text);
        // A byte-order mark is not content.
        let got = one(
            "",
            "b.txt",
            "document",
            "text/plain",
            "\u{feff}hi".as_bytes(),
            &l,
        );
        assert!(
            got.text.contains("]\nhi\n[end of file: b.txt]"),
            "{}",
            got.text
        );
    }

    #[test]
    fn what_counts_as_text() {
        for (mime, name) in [
            ("text/plain", "a"),
            ("text/csv; charset=utf-8", "a"),
            ("application/json", "a"),
            ("application/vnd.api+json", "a"),
            ("application/octet-stream", "main.RS"),
            ("application/octet-stream", "data.yaml"),
            ("", "Makefile"),
            ("", ".env"),
            ("", ".gitignore"),
            ("image/svg+xml", "logo.svg"),
        ] {
            assert!(is_text_like(mime, name), "{mime} {name}");
        }
        for (mime, name) in [
            ("application/pdf", "doc.pdf"),
            ("application/octet-stream", "archive.zip"),
            ("image/png", "p.png"),
            ("application/octet-stream", "md"),
            ("audio/ogg", "voice.ogg"),
        ] {
            assert!(!is_text_like(mime, name), "{mime} {name}");
        }
    }

    #[test]
    fn audio_video_and_other_files_are_attachment_lines() {
        let l = MediaLimits::default();
        let got = one("", "v.ogg", "voice", "audio/ogg", b"OggS", &l);
        assert_eq!(got.text, "[attached: v.ogg (audio/ogg, 4 bytes): not read: the gateway sends the agent no audio]");
        let got = one("", "c.mp4", "video", "video/mp4", b"....", &l);
        assert!(got
            .text
            .ends_with("not read: the gateway sends the agent no video]"));
        let got = one("", "d.pdf", "document", "application/pdf", b"%PDF", &l);
        assert!(got
            .text
            .ends_with("not read: not a text document or an image]"));
    }

    #[test]
    fn a_message_s_images_share_one_budget() {
        let l = MediaLimits::default();
        let png = encoded(&noise(580, 580), ImageFormat::Png);
        assert!(png.len() <= l.image_bytes && png.len() * 7 > TURN_IMAGE_BYTES);
        let files: Vec<_> = (0..7)
            .map(|i| media(&format!("{i}.png"), "image", "image/png", &png))
            .collect();
        let refs: Vec<_> = files
            .iter()
            .map(|(m, p, _)| (m.clone(), p.clone()))
            .collect();
        let got = prepare("", &refs, &[], &l);
        assert_eq!(got.images.len(), TURN_IMAGE_BYTES / png.len());
        assert!(
            got.text
                .contains("over the 6 MiB the agent is sent at once"),
            "{}",
            got.text
        );
    }

    #[test]
    fn history_names_files_without_their_contents() {
        let (img, _, _d1) = media("p.png", "image", "image/png", b"x");
        let (doc, _, _d2) = media("n.txt", "document", "text/plain", b"y");
        assert_eq!(
            history_text("see", &[img, doc]),
            "see\n[image: p.png]\n[attached: n.txt (text/plain, 1 bytes)]"
        );
        let (img, _, _d3) = media("p.png", "image", "image/png", b"x");
        assert_eq!(history_text("", &[img]), "[image: p.png]");
    }

    #[test]
    fn dimensions_come_from_the_header() {
        let (_, p, _d) = media(
            "p.png",
            "image",
            "image/png",
            &encoded(&noise(7, 5), ImageFormat::Png),
        );
        assert_eq!(image_dimensions(&p), Some((7, 5)));
        let (_, p, _d) = media("t.txt", "document", "text/plain", b"hello");
        assert_eq!(image_dimensions(&p), None);
    }
}
