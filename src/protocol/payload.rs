//! The payload of every server→app frame type, one variant each.
//!
//! A frame's type, its delivery class and what a push says about it all follow from the variant,
//! so no caller names a type by string or reaches into a payload by key. Field names are the
//! schema's; the encoder writes payload keys sorted (see `encode`), so declaration order here
//! never changes the bytes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    Channel, ErrorCode, HealthState, HistoryMessage, MediaRef, Role, Runtime, SearchScope,
    ServerCaps, TodoItem,
};

/// How a frame may be treated when a device's queue is under pressure (`reliability` in the
/// schema). The class is a property of the frame type, so it is decided here, not by callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Must reach the device or the device must be disconnected (it then catches up by `sync`).
    NeverDropped,
    /// A later frame with the same key supersedes an unsent earlier one (latest wins).
    Coalescable,
    /// Live-only state (typing, message.start, ...): delivered in order while the device keeps
    /// up; a device that falls behind is disconnected like for never-dropped frames.
    Ephemeral,
}

/// What a server→app frame says, by frame type. Serialises as the bare payload object (the
/// envelope around it is `Frame`'s).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Payload {
    Error {
        code: ErrorCode,
        message: String,
    },
    Pong {
        ts: i64,
    },
    Status {
        state: HealthState,
    },
    HelloAck {
        server_caps: ServerCaps,
        sync_cursor: u64,
        last_pushed_cursor: u64,
        channels: Vec<Channel>,
        /// Lanes with a turn running at connect (the `agent.busy` extension); left out for a
        /// device that did not ask for it.
        #[serde(skip_serializing_if = "Option::is_none")]
        agent_busy: Option<Vec<LaneRef>>,
        /// Per lane, the message the household has read up to (the `read.receipt`
        /// extension); left out for a device that did not ask for it.
        #[serde(skip_serializing_if = "Option::is_none")]
        read: Option<Vec<LaneRead>>,
    },
    ChannelList {
        channels: Vec<Channel>,
    },
    /// `channel.created` and `channel.renamed` carry the full directory entry as their payload.
    ChannelCreated(Channel),
    ChannelRenamed(Channel),
    ChannelDeleted {
        chat_id: String,
    },
    ReadReceipt {
        message_id: String,
    },
    Message(MessagePayload),
    Typing {
        on: bool,
    },
    /// `agent.busy` / `agent.idle` (the `agent.busy` extension): the envelope's lane has a turn
    /// running, or no longer. The lane is all they say, so the payload is empty.
    AgentBusy {},
    AgentIdle {},
    /// `read.marker` (the `read.receipt` extension): the envelope's lane is read up to
    /// `message_id`. A type of its own, not v1's `read.receipt` (which acks a `message.send`),
    /// so an app that did not ask can tell it apart and is never sent it.
    ReadMarker {
        message_id: String,
    },
    MessageStart {
        message_id: String,
        role: Role,
    },
    /// `text` is the whole text so far; with `append_at` (the `update_append` extension) it is
    /// only what follows the first `append_at` characters the device already has. Only an
    /// append continuation goes without `message_id` (`Frame::message_update_continued`).
    MessageUpdate {
        #[serde(skip_serializing_if = "Option::is_none")]
        message_id: Option<String>,
        text: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        append_at: Option<u64>,
    },
    MessageStop(MessageStop),
    Commentary {
        message_id: String,
        text: String,
    },
    /// `args` is the agent's own tool input: free-form JSON the gateway passes through.
    ToolStart {
        index: i64,
        name: String,
        preview: String,
        args: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        emoji: Option<String>,
    },
    ToolProgress {
        index: i64,
        name: String,
        note: String,
    },
    ToolEnd {
        index: i64,
        name: String,
        ok: bool,
        duration: f64,
        output_preview: String,
    },
    Notification(Notification),
    /// Catalog entries are built by the hub's command table as JSON objects.
    CommandsCatalog {
        commands: Value,
    },
    /// `choices` holds `{value, label, is_current}` objects built by the hub.
    PickerChoice {
        picker_id: String,
        title: String,
        choices: Value,
    },
    TodoUpdate {
        todos: Vec<TodoItem>,
    },
    MediaUploadAck {
        ok: bool,
        media_ref: String,
    },
    MediaPullEnd {
        ok: bool,
    },
    /// Agent-sent media: the media_ref itself, with `message_id` tying it to the reply.
    MediaOffer(MediaRef),
    MessageDeleted {
        message_ids: Vec<String>,
    },
    /// `hits` are the store's search rows, already shaped as the schema's hit objects.
    SearchResults {
        query: String,
        scope: SearchScope,
        hits: Value,
    },
    SyncDone {
        cursor: u64,
    },
    History {
        /// Roles as v1's `history` knows them (see `Frame::history`).
        messages: Vec<HistoryMessage>,
        has_more: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        oldest_message_id: Option<String>,
    },
}

/// A lane as a payload names it: `thread_id` is left out for a channel's flat lane, as the
/// envelope leaves it out.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LaneRef {
    pub chat_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// A lane's read marker as `hello.ack.read` lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LaneRead {
    pub chat_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    pub message_id: String,
}

/// A standalone final message, and for the user's echo the message it answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagePayload {
    #[serde(flatten)]
    pub message: HistoryMessage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

/// The end of a streamed assistant message: its final text and footer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageStop {
    pub message_id: String,
    pub final_text: String,
    pub ts: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<i64>,
    /// Always present on the wire, empty when the agent reported nothing.
    #[serde(default)]
    pub runtime: Runtime,
}

/// A gateway notice for the phone's notification shade (`kind` from the schema's enum).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    pub kind: String,
    pub title: String,
    pub body: String,
    pub ts: i64,
}

impl Payload {
    /// The frame's `type` on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Payload::Error { .. } => "error",
            Payload::Pong { .. } => "pong",
            Payload::Status { .. } => "status",
            Payload::HelloAck { .. } => "hello.ack",
            Payload::ChannelList { .. } => "channel.list",
            Payload::ChannelCreated(_) => "channel.created",
            Payload::ChannelRenamed(_) => "channel.renamed",
            Payload::ChannelDeleted { .. } => "channel.deleted",
            Payload::ReadReceipt { .. } => "read.receipt",
            Payload::Message(_) => "message",
            Payload::Typing { .. } => "typing",
            Payload::AgentBusy {} => "agent.busy",
            Payload::AgentIdle {} => "agent.idle",
            Payload::ReadMarker { .. } => "read.marker",
            Payload::MessageStart { .. } => "message.start",
            Payload::MessageUpdate { .. } => "message.update",
            Payload::MessageStop(_) => "message.stop",
            Payload::Commentary { .. } => "commentary",
            Payload::ToolStart { .. } => "tool.start",
            Payload::ToolProgress { .. } => "tool.progress",
            Payload::ToolEnd { .. } => "tool.end",
            Payload::Notification(_) => "notification",
            Payload::CommandsCatalog { .. } => "commands.catalog",
            Payload::PickerChoice { .. } => "picker.choice",
            Payload::TodoUpdate { .. } => "todo.update",
            Payload::MediaUploadAck { .. } => "media.upload.ack",
            Payload::MediaPullEnd { .. } => "media.pull.end",
            Payload::MediaOffer(_) => "media.offer",
            Payload::MessageDeleted { .. } => "message.deleted",
            Payload::SearchResults { .. } => "search.results",
            Payload::SyncDone { .. } => "sync.done",
            Payload::History { .. } => "history",
        }
    }

    /// The delivery class from the schema's `reliability` section. No wildcard arm: a new frame
    /// type has to choose its class.
    pub fn delivery(&self) -> Delivery {
        match self {
            Payload::MessageUpdate { .. } | Payload::ToolProgress { .. } => Delivery::Coalescable,
            Payload::Status { .. }
            | Payload::Typing { .. }
            // Lane state like typing: `hello.ack` carries the current state after a reconnect,
            // so a lost transition heals there and nothing is outboxed.
            | Payload::AgentBusy {}
            | Payload::AgentIdle {}
            | Payload::MessageStart { .. }
            | Payload::Commentary { .. }
            | Payload::ToolStart { .. }
            | Payload::TodoUpdate { .. } => Delivery::Ephemeral,
            // Content and directory changes every device must see.
            Payload::Message(_)
            | Payload::MessageStop(_)
            | Payload::MessageDeleted { .. }
            | Payload::ToolEnd { .. }
            | Payload::Notification(_)
            | Payload::ChannelCreated(_)
            | Payload::ChannelRenamed(_)
            | Payload::ChannelDeleted { .. }
            | Payload::ChannelList { .. }
            | Payload::MediaOffer(_)
            // Outboxed: a device away when a lane was read learns it by `sync`.
            | Payload::ReadMarker { .. }
            | Payload::Error { .. } => Delivery::NeverDropped,
            // Replies to a request are never dropped on their connection either.
            Payload::HelloAck { .. }
            | Payload::History { .. }
            | Payload::SyncDone { .. }
            | Payload::Pong { .. }
            | Payload::ReadReceipt { .. }
            | Payload::MediaUploadAck { .. }
            | Payload::MediaPullEnd { .. }
            | Payload::CommandsCatalog { .. }
            | Payload::PickerChoice { .. }
            | Payload::SearchResults { .. } => Delivery::NeverDropped,
        }
    }
}
