//! The change list: what one `Store::commit` applies atomically, in order
//! (`engine/commit.rs`), each change named by its subject's plain record types.

use bytes::Bytes;

use super::base::to_json;
use super::lane_models::{LaneModel, VoiceMode};
use super::media::MediaRecord;
use super::read_marks::ReadMark;
use super::records::Record;
use super::turns::PendingTurn;
use crate::protocol::Outboxed;
use crate::protocol::{Channel, HistoryMessage, Lane};

/// One change to persist. A `commit` applies a list of them atomically, in order.
#[derive(Debug, Clone)]
pub enum Change {
    /// Append an encoded frame to the outbox under the next cursor (its push note rides along
    /// for publication; the store keeps only the bytes).
    Outbox(Outboxed),
    /// Append a frame that carries (part of) a message's content: deleting the message later
    /// replaces this outbox entry with a tombstone, so no replay returns the content.
    OutboxOf {
        message_id: String,
        frame: Outboxed,
    },
    /// Remove a message from history, the search index and the outbox (whose entries become
    /// `tombstone`, keeping cursors contiguous). Unknown ids are no-ops.
    DeleteMessage {
        message_id: String,
        tombstone: Bytes,
    },
    /// Insert or replace a message in its lane's history.
    PutMessage(Lane, HistoryMessage),
    /// Remove every remaining message of a channel (all its lanes) or one thread from history
    /// (after their `DeleteMessage`s, which tombstone their outbox frames): also catches a
    /// message whose commit was still on its way to the history database.
    PurgeHistory {
        chat_id: String,
        thread_id: Option<String>,
    },
    PutChannel(Channel),
    DeleteChannel(String),
    /// Remember that a user message is waiting for its turn, so a restart can close it cleanly.
    BeginTurn(PendingTurn),
    EndTurn(String),
    /// Set a lane's read marker (the caller has checked it moves forward).
    MarkRead(Lane, ReadMark),
    /// Set (or, with `None`, clear) the model a lane's turns ask for.
    SetLaneModel(Lane, Option<LaneModel>),
    /// Set (or, with `None`, clear: off) whether a lane's answers are also spoken.
    SetLaneVoice(Lane, Option<VoiceMode>),
    /// Write one of the gateway's small records (records.rs).
    Record(Record),
    /// A stored file's record, under its uploader's ref (`device_id` empty for a file the agent
    /// made); its blob's count goes up.
    AddMedia {
        record: MediaRecord,
        device_id: String,
        media_ref: String,
    },
    /// A file no message uses goes (nothing when it is not there); its blob's count goes down.
    RemoveMedia(String),
}

impl Change {
    /// Roughly what the change writes (its value sizes), for the free-space check.
    pub(in crate::store) fn approx_bytes(&self) -> u64 {
        let n = match self {
            Change::Outbox(f) | Change::OutboxOf { frame: f, .. } => f.bytes.len(),
            Change::PutMessage(_, m) => m.text.len() * 2 + 512,
            Change::PutChannel(c) => to_json(c).len(),
            Change::BeginTurn(t) => t.text.len() + 128,
            Change::DeleteMessage { tombstone, .. } => tombstone.len() + 128,
            Change::MarkRead(_, m) => m.message_id.len() + 96,
            Change::SetLaneModel(_, m) => m.as_ref().map_or(0, |m| m.model.len()) + 160,
            Change::SetLaneVoice(..) => 160,
            Change::Record(r) => r.approx_bytes(),
            Change::AddMedia { record, .. } => record.filename.len() + record.mime.len() + 256,
            Change::RemoveMedia(_) => 64,
            Change::DeleteChannel(_) | Change::EndTurn(_) | Change::PurgeHistory { .. } => 64,
        };
        n as u64
    }
}
