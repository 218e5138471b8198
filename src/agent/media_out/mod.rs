//! Files from the agent to the phone. Hermes' tools (image generation, text to speech, browser
//! screenshots, file tools) end in a line `MEDIA:/path/file.png`, which Hermes' own messaging
//! gateways turn into an attachment (`gateway/platforms/base.py`, `extract_media`); a model or
//! Hermes' chat-completions path may instead put an image inline as
//! `![alt](data:image/png;base64,…)`. Both are cut out of the answer's text here and become
//! `AgentEvent::File`s, which the hub stores, offers with `media.offer{…, message_id}` and
//! outboxes.
//!
//! Two halves:
//! - [`MediaTags`] (`tags.rs`): a pure streaming filter over the answer's text deltas. It passes
//!   text on at once and holds back only a tail that may still become a tag (a `MEDIA:` line
//!   until its end; an inline image until its `)`, bounded by the base64 size of the file
//!   limit), so no part of a tag ever reaches a `message.update`.
//! - [`FilePolicy`] (`policy.rs`): reading a `MEDIA:` path, only from the allowed folders
//!   (`agent.media_dirs`), after resolving symlinks (one out of them is refused), opened from
//!   the allowed folder down following no symlink, regular files only, never a credential or
//!   system file (a denylist like Hermes' `validate_media_delivery_path`, checked again on where
//!   the opened file really is), at most `limits.agent_file_bytes`. A refused tag becomes a
//!   plain note in the text. An inline image is held to the same limit and offered only once
//!   it decodes (`inline.rs`); a file named as an image is offered as one only once it decodes
//!   too, else as an opaque document (`file_kind.rs`).
//!
//! [`OutFilter`] joins them for the backends' worker threads (file reads never happen on the
//! event loop).
//!
//! Like Hermes (`_mask_protected_spans`), a tag inside a fenced code block, an inline code span
//! or a blockquote line is text, not a file: that is the agent showing an example. Unlike
//! Hermes, `MEDIA:` is matched in capitals only (its tools write it so; prose such as "social
//! media: /r/…" stays prose).

mod file_kind;
mod inline;
mod policy;
mod tags;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use super::AgentEvent;

pub use policy::{default_hermes_home, url_is_local, FilePolicy, HERMES_OUTPUT_DIRS};
pub use tags::{MediaTags, Piece, Tag};

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
    #[error("an inline image could not be read as one: {0}")]
    InlineUnreadable(String),
}

impl Refusal {
    /// The note shown in the answer instead of the tag.
    pub fn note(&self) -> String {
        match self {
            Refusal::InlineTooLarge(_) | Refusal::InlineDamaged | Refusal::InlineUnreadable(_) => {
                format!("[image not sent: {self}]")
            }
            _ => format!("[file not sent: {self}]"),
        }
    }
}

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
                Tag::Inline { alt, base64, .. } => (self.policy.inline(&alt, &base64), false),
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
