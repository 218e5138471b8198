//! What a turn's files become for the agent (docs/media.md, "Phone to agent").
//!
//! - An image the agent can take (JPEG, PNG, WebP, GIF) goes as an image once it decodes in
//!   full: as it is when it is already within `limits.agent_image_side` and
//!   `limits.agent_image_bytes` (bytes equal), else scaled down as it is decoded and re-encoded
//!   as JPEG until it fits. The original stays in media storage.
//! - A text document (by mime type or file name), valid UTF-8 and within
//!   `limits.agent_document_bytes`, is inlined into the message's text under its name.
//! - Anything else (audio, video, other documents, and images or documents that could not be
//!   used) is an attachment line saying what the file is and why it was not read, so the agent
//!   can tell the person.
//!
//! Decoding and encoding cost CPU and memory in proportion to the file: this runs on a turn's
//! worker thread (`off_loop`), never on the event loop, and every decode takes its share of one
//! gateway-wide budget of decoded pixels first (`images.rs`).
//!
//! Here: what a message as a whole becomes (its text, its files' lines, the images within one
//! budget). An image made fit for the agent is `images.rs`; a document read for inlining is
//! `documents.rs`.

mod documents;
pub(super) mod images;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use base64::Engine;

use crate::config::Limits;
use crate::protocol::MediaRef;
use documents::read_document;
use images::image_for_agent;

pub use documents::is_text_like;
pub use images::{
    image_dimensions, verify_image, DecodeError, DECODE_BUDGET_BYTES, DECODE_MAX_PIXELS,
};

/// All the images of one message together, as sent: Hermes' API server refuses a request
/// over 10 MB (`MAX_REQUEST_BYTES` in gateway/platforms/api_server.py) and base64 adds a
/// third, so images past this are named in attachment lines rather than sinking the turn.
pub const TURN_IMAGE_BYTES: usize = 6 << 20;

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

/// The limits here are `usize`; the wording is the crate's one (`units`).
fn human_bytes(n: usize) -> String {
    crate::units::human_bytes(n as u64)
}
