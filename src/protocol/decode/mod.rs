//! App→server frame decoding.
//!
//! Two steps, on purpose. The envelope header (`v`, `type`, `id`, `chat_id`, `thread_id`) is
//! read with serde-json-core into borrowed, fixed-size fields: no heap allocation, so junk, wrong
//! versions and unknown types are refused before the gateway spends memory on them. Only a frame
//! that names a known type gets its payload decoded, with serde_json, into an owned typed request
//! (payloads hold arbitrary objects and long escaped text that a no-alloc decoder cannot own).
//!
//! The parts follow those steps: `envelope` for the header (before anything is allocated),
//! `request` for the payload of a known type, and `hello` apart, since its caps are advisory and
//! must never refuse a hello.

mod envelope;
mod hello;
mod request;
#[cfg(test)]
mod tests;

pub use hello::{Hello, HelloCaps};
pub use request::{
    ChannelCreate, ChannelIcon, CreateKind, HistoryRequest, MessageSend, Request, SearchRequest,
    SearchScope, UploadStart,
};

use super::{ErrorCode, PROTOCOL_VERSION};
use envelope::{read_header, scope_id};
use request::decode_payload;

/// Deepest JSON nesting accepted. serde-json-core recurses without a limit, so a frame of a
/// million `[` would overflow the stack; no v1 frame nests deeper than a handful of levels.
const MAX_NESTING: usize = 32;

/// Why a frame was refused, with the request id to echo when the header was readable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    pub id: Option<i64>,
    pub code: ErrorCode,
    pub message: String,
}

impl DecodeError {
    fn new(id: Option<i64>, code: ErrorCode, message: impl Into<String>) -> Self {
        DecodeError {
            id,
            code,
            message: message.into(),
        }
    }
}

/// A decoded app→server frame: the envelope fields the hub routes on plus the typed payload.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFrame {
    pub id: Option<i64>,
    pub chat_id: Option<String>,
    pub thread_id: Option<String>,
    pub request: Request,
}

/// Decodes one text frame. Every refusal carries a message that names the offending field.
pub fn decode_request(text: &str) -> Result<RequestFrame, DecodeError> {
    check_nesting(text.as_bytes())?;
    let header = read_header(text)?;
    let id = header.id;
    match header.v {
        Some(PROTOCOL_VERSION) => {}
        Some(other) => {
            return Err(DecodeError::new(
                id,
                ErrorCode::Unsupported,
                format!("protocol version {other} is not supported; this gateway speaks v1"),
            ))
        }
        None => {
            return Err(DecodeError::new(
                id,
                ErrorCode::Unsupported,
                "missing envelope field `v` (must be 1)",
            ))
        }
    }
    let kind = header.kind.ok_or_else(|| {
        DecodeError::new(id, ErrorCode::Unsupported, "missing envelope field `type`")
    })?;
    let chat_id = scope_id(id, "chat_id", header.chat_id)?;
    let thread_id = scope_id(id, "thread_id", header.thread_id)?;
    let request = decode_payload(id, &kind, text)?;
    Ok(RequestFrame {
        id,
        chat_id,
        thread_id,
        request,
    })
}

fn check_nesting(bytes: &[u8]) -> Result<(), DecodeError> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in bytes {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(DecodeError::new(
                        None,
                        ErrorCode::Unsupported,
                        format!("frame nests deeper than {MAX_NESTING} levels"),
                    ));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(())
}
