//! Server→app frames: constructors for every frame this gateway sends, and their encoding.
//!
//! Every encoded frame starts with exactly `{"v":1,` and never carries `cursor`: the outbox stores
//! that encoding once, and `with_cursor` splices the cursor in when `sync` replays it, so a replay
//! costs no re-serialisation and live frames can never carry a cursor by accident.

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};

use super::{Channel, ErrorCode, HealthState, HistoryMessage, ServerCaps, TodoItem};

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

/// A server→app frame before encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub kind: &'static str,
    pub id: Option<i64>,
    pub chat_id: Option<String>,
    pub thread_id: Option<String>,
    pub payload: Value,
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
    payload: &'a Value,
}

const ENCODED_PREFIX: &[u8] = br#"{"v":1,"#;

impl Frame {
    pub fn new(kind: &'static str, payload: Value) -> Frame {
        Frame {
            kind,
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

    pub fn delivery(&self) -> Delivery {
        delivery_of(self.kind)
    }

    pub fn encode(&self) -> Bytes {
        let env = Envelope {
            v: 1,
            id: self.id,
            kind: self.kind,
            chat_id: self.chat_id.as_deref(),
            thread_id: self.thread_id.as_deref(),
            payload: &self.payload,
        };
        let bytes = serde_json::to_vec(&env).expect("a Value always serialises");
        debug_assert!(bytes.starts_with(ENCODED_PREFIX));
        Bytes::from(bytes)
    }

    pub fn error(id: Option<i64>, code: ErrorCode, message: impl Into<String>) -> Frame {
        Frame::new("error", json!({ "code": code, "message": message.into() })).reply_to(id)
    }

    pub fn pong(id: Option<i64>, ts: i64) -> Frame {
        Frame::new("pong", json!({ "ts": ts })).reply_to(id)
    }

    pub fn status(state: HealthState) -> Frame {
        Frame::new("status", json!({ "state": state }))
    }

    pub fn hello_ack(
        id: Option<i64>,
        caps: &ServerCaps,
        sync_cursor: u64,
        last_pushed_cursor: u64,
        channels: &[Channel],
    ) -> Frame {
        Frame::new(
            "hello.ack",
            json!({
                "server_caps": caps,
                "sync_cursor": sync_cursor,
                "last_pushed_cursor": last_pushed_cursor,
                "channels": channels,
            }),
        )
        .reply_to(id)
    }

    pub fn channel_list(id: Option<i64>, channels: &[Channel]) -> Frame {
        Frame::new("channel.list", json!({ "channels": channels })).reply_to(id)
    }

    /// `channel.created` / `channel.renamed` carry the full entry as their payload.
    pub fn channel_entry(kind: &'static str, channel: &Channel) -> Frame {
        Frame::new(
            kind,
            serde_json::to_value(channel).expect("channel serialises"),
        )
    }

    pub fn channel_deleted(chat_id: &str) -> Frame {
        Frame::new("channel.deleted", json!({ "chat_id": chat_id }))
    }

    pub fn read_receipt(id: Option<i64>, message_id: &str) -> Frame {
        Frame::new("read.receipt", json!({ "message_id": message_id })).reply_to(id)
    }

    /// A final, standalone message (the user's echo, or an assistant message outside a stream).
    pub fn message(m: &HistoryMessage) -> Frame {
        Frame::new(
            "message",
            serde_json::to_value(m).expect("message serialises"),
        )
    }

    pub fn typing(on: bool) -> Frame {
        Frame::new("typing", json!({ "on": on }))
    }

    pub fn message_start(message_id: &str) -> Frame {
        Frame::new(
            "message.start",
            json!({ "message_id": message_id, "role": "assistant" }),
        )
    }

    pub fn message_update(message_id: &str, text: &str) -> Frame {
        Frame::new(
            "message.update",
            json!({ "message_id": message_id, "text": text }),
        )
    }

    pub fn message_stop(m: &HistoryMessage) -> Frame {
        let mut p = json!({ "message_id": m.message_id, "final_text": m.text, "ts": m.ts });
        if let Some(r) = &m.reasoning {
            p["reasoning"] = json!(r);
        }
        if let Some(model) = &m.model {
            p["model"] = json!(model);
        }
        if let Some(t) = m.tokens {
            p["tokens"] = json!(t);
        }
        p["runtime"] = json!(m.runtime.clone().unwrap_or_default());
        Frame::new("message.stop", p)
    }

    pub fn commentary(message_id: &str, text: &str) -> Frame {
        Frame::new(
            "commentary",
            json!({ "message_id": message_id, "text": text }),
        )
    }

    pub fn tool_start(
        index: i64,
        name: &str,
        preview: &str,
        args: &Value,
        emoji: Option<&str>,
    ) -> Frame {
        let mut p = json!({ "index": index, "name": name, "preview": preview, "args": args });
        if let Some(e) = emoji {
            p["emoji"] = json!(e);
        }
        Frame::new("tool.start", p)
    }

    pub fn tool_progress(index: i64, name: &str, note: &str) -> Frame {
        Frame::new(
            "tool.progress",
            json!({ "index": index, "name": name, "note": note }),
        )
    }

    pub fn tool_end(
        index: i64,
        name: &str,
        ok: bool,
        duration: f64,
        output_preview: &str,
    ) -> Frame {
        Frame::new(
            "tool.end",
            json!({ "index": index, "name": name, "ok": ok, "duration": duration, "output_preview": output_preview }),
        )
    }

    /// A gateway notice for the phone's notification shade (`kind` from the schema's enum).
    pub fn notification(kind: &str, title: &str, body: &str, ts: i64) -> Frame {
        Frame::new(
            "notification",
            json!({ "kind": kind, "title": title, "body": body, "ts": ts }),
        )
    }

    /// The answer to `commands.catalog`: `commands` is the list of catalog entries.
    pub fn commands_catalog(id: Option<i64>, commands: Value) -> Frame {
        Frame::new("commands.catalog", json!({ "commands": commands })).reply_to(id)
    }

    /// A finite-choice prompt; `choices` holds `{value, label, is_current}` objects.
    pub fn picker_choice(picker_id: &str, title: &str, choices: Value) -> Frame {
        Frame::new(
            "picker.choice",
            json!({ "picker_id": picker_id, "title": title, "choices": choices }),
        )
    }

    pub fn todo_update(todos: &[TodoItem]) -> Frame {
        Frame::new("todo.update", json!({ "todos": todos }))
    }

    pub fn media_upload_ack(id: Option<i64>, ok: bool, media_ref: &str) -> Frame {
        Frame::new(
            "media.upload.ack",
            json!({ "ok": ok, "media_ref": media_ref }),
        )
        .reply_to(id)
    }

    pub fn media_pull_end(id: Option<i64>, ok: bool) -> Frame {
        Frame::new("media.pull.end", json!({ "ok": ok })).reply_to(id)
    }

    /// Agent-sent media: the payload is the media_ref with `message_id` tying it to the reply.
    pub fn media_offer(media: &super::MediaRef) -> Frame {
        Frame::new(
            "media.offer",
            serde_json::to_value(media).expect("media serialises"),
        )
    }

    pub fn message_deleted(id: Option<i64>, message_ids: &[String]) -> Frame {
        Frame::new("message.deleted", json!({ "message_ids": message_ids })).reply_to(id)
    }

    pub fn search_results(
        id: Option<i64>,
        query: &str,
        scope: super::SearchScope,
        hits: Value,
    ) -> Frame {
        Frame::new(
            "search.results",
            json!({ "query": query, "scope": scope, "hits": hits }),
        )
        .reply_to(id)
    }

    pub fn sync_done(id: Option<i64>, cursor: u64) -> Frame {
        Frame::new("sync.done", json!({ "cursor": cursor })).reply_to(id)
    }

    pub fn history(
        id: Option<i64>,
        messages: &[HistoryMessage],
        has_more: bool,
        oldest_message_id: Option<&str>,
    ) -> Frame {
        let mut p = json!({ "messages": messages, "has_more": has_more });
        // v1's `history` knows only `user` and `assistant`: the gateway's own notices and
        // automation posts (`system`, `cron` in live `message` frames) page in as `assistant`.
        if let Some(list) = p["messages"].as_array_mut() {
            for m in list {
                if m["role"] != "user" {
                    m["role"] = json!("assistant");
                }
            }
        }
        if let Some(o) = oldest_message_id {
            p["oldest_message_id"] = json!(o);
        }
        Frame::new("history", p).reply_to(id)
    }
}

/// The delivery class of a frame type, from the schema's `reliability` section.
pub fn delivery_of(kind: &str) -> Delivery {
    match kind {
        "message.update" | "tool.progress" => Delivery::Coalescable,
        "message" | "message.stop" | "message.deleted" | "tool.end" | "notification"
        | "search.results" | "error" => Delivery::NeverDropped,
        k if k.starts_with("channel.") => Delivery::NeverDropped,
        // Replies to a request are never dropped on their connection either.
        "hello.ack" | "history" | "sync.done" | "pong" | "read.receipt" | "media.offer"
        | "media.upload.ack" | "media.pull.end" | "commands.catalog" | "picker.choice" => {
            Delivery::NeverDropped
        }
        _ => Delivery::Ephemeral,
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(delivery_of("message.update"), Delivery::Coalescable);
        assert_eq!(delivery_of("channel.renamed"), Delivery::NeverDropped);
        assert_eq!(delivery_of("tool.end"), Delivery::NeverDropped);
        assert_eq!(delivery_of("typing"), Delivery::Ephemeral);
    }
}
