//! The Iris wire protocol v1: frame types, the envelope and the codec.
//!
//! Pure by design: no I/O, no clock, no storage. Everything that crosses the socket is described
//! here, so the codec can be fuzzed and unit-tested without a gateway around it.
//! `protocol/wire-v1.schema.json` at the repository root is the authoritative description.

mod decode;
mod encode;
#[cfg(test)]
mod encode_pins;
pub mod fit;
pub mod mime;
mod payload;
mod push_note;
mod types;

pub use decode::{
    decode_request, ChannelCreate, ChannelIcon, CreateKind, Hello, HelloCaps, HistoryRequest,
    MessageSend, Request, RequestFrame, SearchRequest, SearchScope, UploadStart,
};
pub use encode::{encoded_extension, with_cursor, Frame};
pub use payload::{
    Delivery, LaneRead, LaneRef, MessagePayload, MessageStop, Notification, Payload,
};
pub use push_note::{decode_pushable, Outboxed, PushNote};
pub use types::*;

/// The only protocol version this gateway speaks; a frame with any other `v` is refused.
pub const PROTOCOL_VERSION: i64 = 1;

/// Identifiers the gateway accepts from the app (chat, thread, message, device ids) are short
/// ASCII tokens; anything longer is refused at decode so no id can be used to grow memory.
pub const MAX_ID_BYTES: usize = 64;

/// True for ids the gateway mints and accepts: 1..=64 bytes of `[A-Za-z0-9_.:-]`.
///
/// Restricting ids keeps them safe as sled key parts (no NUL separator can appear) and as log
/// fields, and lets the no-allocation header decoder borrow them unescaped.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}
