//! Server→app frames: the envelope, constructors for every frame this gateway sends, and the one
//! place they are encoded.
//!
//! Every encoded frame starts with exactly `{"v":1,` and never carries `cursor`: the outbox stores
//! that encoding once, and `with_cursor` splices the cursor in when `sync` replays it, so a replay
//! costs no re-serialisation and live frames can never carry a cursor by accident.
//!
//! Payload keys are written sorted, at every depth: the encoder goes through `serde_json::Value`
//! (whose maps are ordered), which is the order the wire has always had and the order stored
//! outbox frames on disk already have.

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;

use super::payload::{LaneRead, LaneRef, MessagePayload, MessageStop, Notification, Payload};
use super::{Channel, ErrorCode, HealthState, HistoryMessage, Role, ServerCaps, TodoItem};

/// A server→app frame before encoding: the envelope's routing fields and the typed payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    id: Option<i64>,
    chat_id: Option<String>,
    thread_id: Option<String>,
    payload: Payload,
}

#[derive(Serialize)]
struct Envelope<'a> {
    v: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<i64>,
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    chat_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thread_id: Option<&'a str>,
    payload: Value,
}

const ENCODED_PREFIX: &[u8] = br#"{"v":1,"#;

impl Frame {
    /// A frame outside any lane and not answering a request; the builders below add those.
    pub fn new(payload: Payload) -> Frame {
        Frame {
            id: None,
            chat_id: None,
            thread_id: None,
            payload,
        }
    }

    /// Echoes a request id (responses and errors carry the id of the request they answer).
    pub fn reply_to(mut self, id: Option<i64>) -> Frame {
        self.id = id;
        self
    }

    /// Scopes the frame to a lane: `chat_id` is the channel, `thread_id` the thread inside it.
    pub fn in_lane(mut self, chat_id: &str, thread_id: Option<&str>) -> Frame {
        self.chat_id = Some(chat_id.to_owned());
        self.thread_id = thread_id.map(str::to_owned);
        self
    }

    /// The message a `message` frame answers (the user's echo quoting an earlier message).
    /// Other frame types have no such field, so for them this changes nothing.
    pub fn with_reply_to(mut self, message_id: Option<&str>) -> Frame {
        if let Payload::Message(m) = &mut self.payload {
            m.reply_to = message_id.map(str::to_owned);
        }
        self
    }

    /// The frame's `type` on the wire.
    pub fn kind(&self) -> &'static str {
        self.payload.kind()
    }

    pub fn delivery(&self) -> super::Delivery {
        self.payload.delivery()
    }

    pub fn payload(&self) -> &Payload {
        &self.payload
    }

    /// The channel the frame is scoped to, if any.
    pub fn chat_id(&self) -> Option<&str> {
        self.chat_id.as_deref()
    }

    /// The thread inside `chat_id` the frame is scoped to, if any.
    pub fn thread_id(&self) -> Option<&str> {
        self.thread_id.as_deref()
    }

    pub fn encode(&self) -> Bytes {
        let env = Envelope {
            v: 1,
            id: self.id,
            kind: self.kind(),
            chat_id: self.chat_id.as_deref(),
            thread_id: self.thread_id.as_deref(),
            payload: serde_json::to_value(&self.payload).expect("payloads serialise"),
        };
        let bytes = serde_json::to_vec(&env).expect("a Value always serialises");
        debug_assert!(bytes.starts_with(ENCODED_PREFIX));
        Bytes::from(bytes)
    }

    pub fn error(id: Option<i64>, code: ErrorCode, message: impl Into<String>) -> Frame {
        Frame::new(Payload::Error {
            code,
            message: message.into(),
        })
        .reply_to(id)
    }

    pub fn pong(id: Option<i64>, ts: i64) -> Frame {
        Frame::new(Payload::Pong { ts }).reply_to(id)
    }

    pub fn status(state: HealthState) -> Frame {
        Frame::new(Payload::Status { state })
    }

    pub fn hello_ack(
        id: Option<i64>,
        caps: &ServerCaps,
        sync_cursor: u64,
        last_pushed_cursor: u64,
        channels: &[Channel],
    ) -> Frame {
        Frame::new(Payload::HelloAck {
            server_caps: caps.clone(),
            sync_cursor,
            last_pushed_cursor,
            channels: channels.to_vec(),
            agent_busy: None,
            read: None,
        })
        .reply_to(id)
    }

    /// Adds the lanes busy at connect to a `hello.ack` (`agent.busy` extension); other frame
    /// types have no such field, so for them this changes nothing.
    pub fn with_busy_lanes(mut self, lanes: Vec<LaneRef>) -> Frame {
        if let Payload::HelloAck { agent_busy, .. } = &mut self.payload {
            *agent_busy = Some(lanes);
        }
        self
    }

    pub fn channel_list(id: Option<i64>, channels: &[Channel]) -> Frame {
        Frame::new(Payload::ChannelList {
            channels: channels.to_vec(),
        })
        .reply_to(id)
    }

    /// `channel.created` / `channel.renamed`, named by their type: the hub decides which one a
    /// directory change is in the same place it decides the change (`kind` is always one of the
    /// two literals; anything else is a programming error).
    pub fn channel_entry(kind: &'static str, channel: &Channel) -> Frame {
        match kind {
            "channel.created" => Frame::new(Payload::ChannelCreated(channel.clone())),
            "channel.renamed" => Frame::new(Payload::ChannelRenamed(channel.clone())),
            other => panic!("channel_entry takes channel.created or channel.renamed, not {other}"),
        }
    }

    pub fn channel_deleted(chat_id: &str) -> Frame {
        Frame::new(Payload::ChannelDeleted {
            chat_id: chat_id.to_owned(),
        })
    }

    pub fn read_receipt(id: Option<i64>, message_id: &str) -> Frame {
        Frame::new(Payload::ReadReceipt {
            message_id: message_id.to_owned(),
        })
        .reply_to(id)
    }

    /// A final, standalone message (the user's echo, or an assistant message outside a stream).
    pub fn message(m: &HistoryMessage) -> Frame {
        Frame::new(Payload::Message(MessagePayload {
            message: m.clone(),
            reply_to: None,
        }))
    }

    pub fn typing(on: bool) -> Frame {
        Frame::new(Payload::Typing { on })
    }

    /// Adds the lanes' read markers to a `hello.ack` (`read.receipt` extension).
    pub fn with_read_lanes(mut self, lanes: Vec<LaneRead>) -> Frame {
        if let Payload::HelloAck { read, .. } = &mut self.payload {
            *read = Some(lanes);
        }
        self
    }

    /// `read.marker`: the lane (`in_lane`) is read up to `message_id`.
    pub fn read_marker(message_id: &str) -> Frame {
        Frame::new(Payload::ReadMarker {
            message_id: message_id.to_owned(),
        })
    }

    /// `agent.busy` (`busy`) or `agent.idle`; the lane goes in the envelope (`in_lane`).
    pub fn agent_busy(busy: bool) -> Frame {
        Frame::new(if busy {
            Payload::AgentBusy {}
        } else {
            Payload::AgentIdle {}
        })
    }

    pub fn message_start(message_id: &str) -> Frame {
        Frame::new(Payload::MessageStart {
            message_id: message_id.to_owned(),
            role: Role::Assistant,
        })
    }

    pub fn message_update(message_id: &str, text: &str) -> Frame {
        Frame::new(Payload::MessageUpdate {
            message_id: Some(message_id.to_owned()),
            text: text.to_owned(),
            append_at: None,
        })
    }

    /// A `message.update` in the `update_append` form: `appended` goes after the first
    /// `append_at` characters (Unicode scalar values) of the text the device has; 0 replaces it.
    pub fn message_update_append(message_id: &str, appended: &str, append_at: u64) -> Frame {
        Frame::new(Payload::MessageUpdate {
            message_id: Some(message_id.to_owned()),
            text: appended.to_owned(),
            append_at: Some(append_at),
        })
    }

    /// An `update_append` continuation (`append_at` above 0) of the message the connection's
    /// previous `message.update` was for: the app knows which, so the frame does not say.
    pub fn message_update_continued(appended: &str, append_at: u64) -> Frame {
        debug_assert!(append_at > 0, "a replacing update names its message");
        Frame::new(Payload::MessageUpdate {
            message_id: None,
            text: appended.to_owned(),
            append_at: Some(append_at),
        })
    }

    pub fn message_stop(m: &HistoryMessage) -> Frame {
        Frame::new(Payload::MessageStop(MessageStop {
            message_id: m.message_id.clone(),
            final_text: m.text.clone(),
            ts: m.ts,
            reasoning: m.reasoning.clone(),
            model: m.model.clone(),
            tokens: m.tokens,
            runtime: m.runtime.clone().unwrap_or_default(),
        }))
    }

    pub fn commentary(message_id: &str, text: &str) -> Frame {
        Frame::new(Payload::Commentary {
            message_id: message_id.to_owned(),
            text: text.to_owned(),
        })
    }

    /// `args` stays JSON: it is the agent's own tool input, passed through as it came.
    pub fn tool_start(
        index: i64,
        name: &str,
        preview: &str,
        args: &Value,
        emoji: Option<&str>,
    ) -> Frame {
        Frame::new(Payload::ToolStart {
            index,
            name: name.to_owned(),
            preview: preview.to_owned(),
            args: args.clone(),
            emoji: emoji.map(str::to_owned),
        })
    }

    pub fn tool_progress(index: i64, name: &str, note: &str) -> Frame {
        Frame::new(Payload::ToolProgress {
            index,
            name: name.to_owned(),
            note: note.to_owned(),
        })
    }

    pub fn tool_end(
        index: i64,
        name: &str,
        ok: bool,
        duration: f64,
        output_preview: &str,
    ) -> Frame {
        Frame::new(Payload::ToolEnd {
            index,
            name: name.to_owned(),
            ok,
            duration,
            output_preview: output_preview.to_owned(),
        })
    }

    /// A gateway notice for the phone's notification shade (`kind` from the schema's enum).
    pub fn notification(kind: &str, title: &str, body: &str, ts: i64) -> Frame {
        Frame::new(Payload::Notification(Notification {
            kind: kind.to_owned(),
            title: title.to_owned(),
            body: body.to_owned(),
            ts,
        }))
    }

    /// The answer to `commands.catalog`: `commands` is the list of catalog entries, which the
    /// hub's command table builds as JSON.
    pub fn commands_catalog(id: Option<i64>, commands: Value) -> Frame {
        Frame::new(Payload::CommandsCatalog { commands }).reply_to(id)
    }

    /// A finite-choice prompt; `choices` holds `{value, label, is_current}` objects.
    pub fn picker_choice(picker_id: &str, title: &str, choices: Value) -> Frame {
        Frame::new(Payload::PickerChoice {
            picker_id: picker_id.to_owned(),
            title: title.to_owned(),
            choices,
        })
    }

    pub fn todo_update(todos: &[TodoItem]) -> Frame {
        Frame::new(Payload::TodoUpdate {
            todos: todos.to_vec(),
        })
    }

    pub fn media_upload_ack(id: Option<i64>, ok: bool, media_ref: &str) -> Frame {
        Frame::new(Payload::MediaUploadAck {
            ok,
            media_ref: media_ref.to_owned(),
        })
        .reply_to(id)
    }

    pub fn media_pull_end(id: Option<i64>, ok: bool) -> Frame {
        Frame::new(Payload::MediaPullEnd { ok }).reply_to(id)
    }

    /// Agent-sent media: the payload is the media_ref with `message_id` tying it to the reply.
    pub fn media_offer(media: &super::MediaRef) -> Frame {
        Frame::new(Payload::MediaOffer(media.clone()))
    }

    pub fn message_deleted(id: Option<i64>, message_ids: &[String]) -> Frame {
        Frame::new(Payload::MessageDeleted {
            message_ids: message_ids.to_vec(),
        })
        .reply_to(id)
    }

    /// `hits` are the search rows as the hub shapes them (JSON objects of the schema's hit).
    pub fn search_results(
        id: Option<i64>,
        query: &str,
        scope: super::SearchScope,
        hits: Value,
    ) -> Frame {
        Frame::new(Payload::SearchResults {
            query: query.to_owned(),
            scope,
            hits,
        })
        .reply_to(id)
    }

    pub fn sync_done(id: Option<i64>, cursor: u64) -> Frame {
        Frame::new(Payload::SyncDone { cursor }).reply_to(id)
    }

    pub fn history(
        id: Option<i64>,
        messages: &[HistoryMessage],
        has_more: bool,
        oldest_message_id: Option<&str>,
    ) -> Frame {
        // v1's `history` knows only `user` and `assistant`: the gateway's own notices and
        // automation posts (`system`, `cron` in live `message` frames) page in as `assistant`.
        let messages = messages
            .iter()
            .map(|m| HistoryMessage {
                role: match m.role {
                    Role::User => Role::User,
                    Role::Assistant | Role::System | Role::Cron => Role::Assistant,
                },
                ..m.clone()
            })
            .collect();
        Frame::new(Payload::History {
            messages,
            has_more,
            oldest_message_id: oldest_message_id.map(str::to_owned),
        })
        .reply_to(id)
    }
}

/// Splices `"cursor":N` into an encoded frame for `sync` replay (see the module comment).
pub fn with_cursor(encoded: &[u8], cursor: u64) -> Bytes {
    debug_assert!(encoded.starts_with(ENCODED_PREFIX));
    let rest = &encoded[ENCODED_PREFIX.len()..];
    let mut out = Vec::with_capacity(encoded.len() + 24);
    out.extend_from_slice(ENCODED_PREFIX);
    out.extend_from_slice(format!("\"cursor\":{cursor},").as_bytes());
    out.extend_from_slice(rest);
    Bytes::from(out)
}

/// The extension an encoded outbox frame belongs to, if any: a device that did not ask for
/// it is neither sent it live nor by `sync`. Read from the bytes, since a replay has nothing
/// else; outboxed frames carry no `id`, so the type follows the prefix directly.
pub fn encoded_extension(encoded: &[u8]) -> Option<&'static str> {
    const READ_MARKER: &[u8] = br#"{"v":1,"type":"read.marker","#;
    encoded
        .starts_with(READ_MARKER)
        .then_some(super::EXT_READ_RECEIPT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Delivery;

    #[test]
    fn outboxed_read_markers_are_known_by_their_bytes() {
        let marker = Frame::read_marker("msg_1")
            .in_lane("default", None)
            .encode();
        assert_eq!(encoded_extension(&marker), Some("read.receipt"));
        let receipt = Frame::read_receipt(None, "msg_1").encode();
        assert_eq!(encoded_extension(&receipt), None);
        assert_eq!(encoded_extension(&Frame::typing(true).encode()), None);
    }

    #[test]
    fn encodes_the_envelope_first_and_splices_cursor() {
        let f = Frame::typing(true)
            .in_lane("default", Some("thr_1"))
            .reply_to(Some(4));
        let enc = f.encode();
        assert!(enc.starts_with(ENCODED_PREFIX));
        let replay = with_cursor(&enc, 42);
        let v: Value = serde_json::from_slice(&replay).unwrap();
        assert_eq!(v["cursor"], 42);
        assert_eq!(v["type"], "typing");
        assert_eq!(v["thread_id"], "thr_1");
        assert_eq!(v["id"], 4);
        let live: Value = serde_json::from_slice(&enc).unwrap();
        assert!(live.get("cursor").is_none());
    }

    #[test]
    fn delivery_classes_follow_the_schema() {
        let m = |f: Frame| f.delivery();
        assert_eq!(m(Frame::message_update("m", "t")), Delivery::Coalescable);
        assert_eq!(m(Frame::tool_progress(0, "x", "n")), Delivery::Coalescable);
        let c = Channel::new(
            "c".into(),
            "C".into(),
            super::super::ChannelKind::Channel,
            None,
        );
        assert_eq!(
            m(Frame::channel_entry("channel.renamed", &c)),
            Delivery::NeverDropped
        );
        assert_eq!(m(Frame::channel_deleted("c")), Delivery::NeverDropped);
        assert_eq!(
            m(Frame::tool_end(0, "x", true, 0.1, "o")),
            Delivery::NeverDropped
        );
        assert_eq!(m(Frame::typing(true)), Delivery::Ephemeral);
        assert_eq!(m(Frame::status(HealthState::Online)), Delivery::Ephemeral);
    }
}
