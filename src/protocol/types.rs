//! Payload types shared by requests, server frames and the store.
//!
//! Field names and optionality follow `wire-v1.schema.json`; optional fields are skipped when
//! absent so every frame the gateway writes validates against the schema's strict reading.

use serde::{Deserialize, Serialize};

/// `error.code`: the schema's closed set. Each variant says which kind of mistake the app made,
/// so the app can react (re-pair, back off, shrink the upload) without parsing the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    Auth,
    NotFound,
    RateLimited,
    MediaTooLarge,
    Unsupported,
    Internal,
}

/// Author of a stored or streamed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    System,
    Cron,
}

/// A directory entry's kind. `Default` marks the one channel that is the default; threads are
/// entries of kind `Thread` with a `parent_chat_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelKind {
    Default,
    Channel,
    Thread,
}

/// One channel-directory entry as every device sees it (`definitions.channel`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Channel {
    pub chat_id: String,
    pub name: String,
    pub kind: ChannelKind,
    pub parent_chat_id: Option<String>,
    pub is_default: bool,
    pub archived: bool,
    /// Only ever written as `true`: the schema reserves it for gateway-minted auto-threads.
    #[serde(default, skip_serializing_if = "is_false")]
    pub auto: bool,
    #[serde(default)]
    pub favorite: bool,
    #[serde(default)]
    pub icon: Option<String>,
    #[serde(default)]
    pub color: Option<String>,
    #[serde(default)]
    pub automation: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Channel {
    /// A plain entry: not default, not archived, no cosmetics, not automation.
    pub fn new(
        chat_id: String,
        name: String,
        kind: ChannelKind,
        parent_chat_id: Option<String>,
    ) -> Channel {
        Channel {
            chat_id,
            name,
            is_default: kind == ChannelKind::Default,
            kind,
            parent_chat_id,
            archived: false,
            auto: false,
            favorite: false,
            icon: None,
            color: None,
            automation: false,
        }
    }

    /// Threads are addressed through their parent; everything else is its own lane root.
    pub fn is_thread(&self) -> bool {
        self.kind == ChannelKind::Thread
    }
}

/// The runtime footer on final assistant messages (`definitions.runtime`). All keys optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Runtime {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_pct: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// A file attached to a message (`definitions.media_ref`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MediaRef {
    pub media_id: String,
    pub kind: String,
    pub mime: String,
    pub size: i64,
    pub filename: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

impl MediaRef {
    /// A voice note or other sound (by kind, or by mime when the app called it a document):
    /// what a transcription service turns into text.
    pub fn is_audio(&self) -> bool {
        matches!(self.kind.as_str(), "voice" | "audio")
            || self
                .mime
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("audio/")
    }

    /// A picture, by kind or by mime.
    pub fn is_image(&self) -> bool {
        self.kind == "image"
            || self
                .mime
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("image/")
    }
}

/// One item of the agent's todo list (`todo.update.todos[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TodoItem {
    pub id: String,
    pub content: String,
    pub status: TodoStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    Pending,
    InProgress,
    Completed,
    Cancelled,
}

/// A message as `history` returns it and as the store keeps it: the final state only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryMessage {
    pub message_id: String,
    pub role: Role,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    pub ts: i64,
    #[serde(default)]
    pub media: Vec<MediaRef>,
    /// A user message sent as `agent.steer` (or `/steer`): guidance for the answer that was
    /// running, not a question of its own. Left out when false, so v1 frames are unchanged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub steer: bool,
}

impl HistoryMessage {
    /// A message of text alone: no reasoning, model, usage or media (what a user sends, and
    /// what tools and benchmarks fill a history with). Richer messages start from it
    /// (`..HistoryMessage::text_only(..)`), so a new field needs its default here alone.
    pub fn text_only(message_id: String, role: Role, text: String, ts: i64) -> HistoryMessage {
        HistoryMessage {
            message_id,
            role,
            text,
            reasoning: None,
            model: None,
            tokens: None,
            runtime: None,
            ts,
            media: Vec::new(),
            steer: false,
        }
    }
}

/// `status.state`: one gateway health state feeds these frames (and, later, the LED).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    Online,
    Restarting,
    Degraded,
}

/// `hello.ack.server_caps`: must tell the truth about what this build implements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerCaps {
    pub streaming: bool,
    pub reasoning: bool,
    pub tools: bool,
    pub media: bool,
    pub search: bool,
    pub push: &'static str,
    pub push_ntfy_server: String,
    pub pickers: bool,
    /// Protocol extensions beyond v1 this gateway implements ([`EXTENSIONS`]); an app turns
    /// one on by listing its name in `hello.caps.extensions`.
    pub extensions: &'static [&'static str],
}

/// `update_append`: `message.update` carries only the text appended since the device's last
/// update, and where it goes (docs/protocol.md, "Extensions").
pub const EXT_UPDATE_APPEND: &str = "update_append";

/// `agent.busy`: `agent.busy` / `agent.idle` frames when a lane's turn starts and ends, and
/// `hello.ack.agent_busy` (docs/protocol.md, "Extensions").
pub const EXT_AGENT_BUSY: &str = "agent.busy";

/// `read.receipt`: the household's read state per lane, as `read.marker` frames (outboxed) and
/// `hello.ack.read` (docs/protocol.md, "Extensions").
pub const EXT_READ_RECEIPT: &str = "read.receipt";

/// Every extension this build implements, as `hello.ack.server_caps.extensions` lists them.
pub const EXTENSIONS: &[&str] = &[EXT_UPDATE_APPEND, EXT_AGENT_BUSY, EXT_READ_RECEIPT];

/// `agent.steer`: the app may send `agent.steer {text}` to hand guidance to a lane's running
/// answer; listed only while the agent can be steered (docs/protocol.md, "Extensions"). A
/// message sent that way carries `steer: true` wherever it is shown.
pub const EXT_AGENT_STEER: &str = "agent.steer";

/// [`EXTENSIONS`] and [`EXT_AGENT_STEER`]: what `hello.ack` lists while the agent takes steers.
pub const EXTENSIONS_WITH_STEER: &[&str] = &[
    EXT_UPDATE_APPEND,
    EXT_AGENT_BUSY,
    EXT_READ_RECEIPT,
    EXT_AGENT_STEER,
];

/// A conversation lane: a channel's flat lane (`thread_id` None) or one thread inside it.
/// Turns run one at a time per lane; history and todo lists are kept per lane.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Lane {
    pub chat_id: String,
    pub thread_id: Option<String>,
}

impl Lane {
    pub fn new(chat_id: &str, thread_id: Option<&str>) -> Lane {
        Lane {
            chat_id: chat_id.to_owned(),
            thread_id: thread_id.map(str::to_owned),
        }
    }

    pub fn thread(&self) -> Option<&str> {
        self.thread_id.as_deref()
    }
}

impl std::fmt::Display for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.thread_id {
            Some(t) => write!(f, "{}/{}", self.chat_id, t),
            None => f.write_str(&self.chat_id),
        }
    }
}
