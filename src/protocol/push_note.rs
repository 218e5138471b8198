//! What a push notification says about a frame, and reading a stored outbox frame back into the
//! typed form that decides it.
//!
//! Pushed: final assistant messages (`message.stop`), standalone assistant and cron `message`s
//! and `notification`s other than automation's. The rule is a match on the frame's type here, so
//! the live path and a restart's catch-up (which has only the outbox's bytes) cannot disagree.

use bytes::Bytes;
use serde::Deserialize;

use super::payload::{MessagePayload, MessageStop, Notification, Payload};
use super::{Frame, Role};

/// The content of one push: where it points the app to and the text it shows.
/// An outboxed frame as the committer receives it: the bytes the outbox keeps, and what a push
/// of it would say, worked out from its type while it was still typed, so publication never
/// reads the bytes back. Frames from elsewhere (tombstones, fixtures) carry no note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outboxed {
    pub bytes: Bytes,
    pub push: Option<PushNote>,
}

impl From<Bytes> for Outboxed {
    fn from(bytes: Bytes) -> Outboxed {
        Outboxed { bytes, push: None }
    }
}

impl AsRef<[u8]> for Outboxed {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Frame {
    /// The frame encoded for the outbox, with its push note.
    pub fn outboxed(&self) -> Outboxed {
        Outboxed {
            bytes: self.encode(),
            push: self.push_note(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushNote {
    pub chat_id: String,
    pub thread_id: Option<String>,
    /// Empty for notifications, which belong to no message.
    pub message_id: String,
    pub body: String,
}

impl Frame {
    /// What a push for this frame would say; `None` for frames that are never pushed.
    pub fn push_note(&self) -> Option<PushNote> {
        let (message_id, body) = match self.payload() {
            Payload::MessageStop(m) => (m.message_id.clone(), m.final_text.clone()),
            // Not the user's own words, nor the gateway's answers to a command someone just typed.
            Payload::Message(MessagePayload { message: m, .. })
                if !matches!(m.role, Role::User | Role::System) =>
            {
                (m.message_id.clone(), m.text.clone())
            }
            // An automation post is pushed once, as its message (titled with the channel); the
            // notification beside it would make the phone ring twice.
            Payload::Notification(n) if n.kind == "cron" => return None,
            Payload::Notification(n) => {
                let sep = if n.title.is_empty() { "" } else { ": " };
                (String::new(), format!("{}{sep}{}", n.title, n.body))
            }
            _ => return None,
        };
        Some(PushNote {
            chat_id: self.chat_id().unwrap_or("default").to_owned(),
            thread_id: self.thread_id().map(str::to_owned),
            message_id,
            body,
        })
    }
}

/// Reads an encoded outbox frame back into its typed form when its type is one a push can come
/// from; every other frame (most of the outbox: echoes, tool ends, directory changes) is `None`,
/// told apart without allocating.
pub fn decode_pushable(encoded: &[u8]) -> Option<Frame> {
    if !may_push(encoded) {
        return None;
    }
    let stored: Stored = serde_json::from_slice(encoded).ok()?;
    let payload = match stored.payload {
        StoredPayload::Message(m) => Payload::Message(m),
        StoredPayload::MessageStop(m) => Payload::MessageStop(m),
        StoredPayload::Notification(n) => Payload::Notification(n),
    };
    let mut frame = Frame::new(payload).reply_to(stored.id);
    if let Some(chat) = &stored.chat_id {
        frame = frame.in_lane(chat, stored.thread_id.as_deref());
    }
    Some(frame)
}

/// The envelope of a stored frame of a pushable type (`cursor` and `v` are not needed).
#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    id: Option<i64>,
    #[serde(default)]
    chat_id: Option<String>,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(flatten)]
    payload: StoredPayload,
}

/// The pushable frame types, by `type`, with their payloads.
#[derive(Deserialize)]
#[serde(tag = "type", content = "payload")]
enum StoredPayload {
    #[serde(rename = "message")]
    Message(MessagePayload),
    #[serde(rename = "message.stop")]
    MessageStop(MessageStop),
    #[serde(rename = "notification")]
    Notification(Notification),
}

/// Whether a frame's type can be pushed, read with serde-json-core into a borrowed field: no
/// allocation for the frames that cannot.
fn may_push(encoded: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<&'a str>,
    }
    match serde_json_core::from_slice::<Kind<'_>>(encoded) {
        Ok((k, _)) => matches!(k.kind, Some("message.stop" | "message" | "notification")),
        // Not readable by the fast path: let the full parser decide.
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{HistoryMessage, Runtime};

    fn message(role: Role) -> HistoryMessage {
        HistoryMessage {
            runtime: Some(Runtime::default()),
            ..HistoryMessage::text_only("m".into(), role, "a \"quoted\" line\n".into(), 1)
        }
    }

    #[test]
    fn only_pushable_kinds_get_a_full_parse() {
        let m = message(Role::User);
        assert!(may_push(&Frame::message_stop(&m).encode()));
        assert!(may_push(
            &Frame::message(&m).in_lane("c", Some("t")).encode()
        ));
        assert!(!may_push(
            &Frame::tool_end(0, "x", true, 0.1, "out").encode()
        ));
        assert!(!may_push(
            &Frame::channel_deleted("c").reply_to(Some(3)).encode()
        ));
    }

    #[test]
    fn what_is_pushed_follows_the_type() {
        let note = |f: Frame| f.push_note().map(|n| n.body);
        let text = "a \"quoted\" line\n".to_owned();
        assert_eq!(
            note(Frame::message_stop(&message(Role::User))),
            Some(text.clone())
        );
        assert_eq!(
            note(Frame::message(&message(Role::Assistant))),
            Some(text.clone())
        );
        assert_eq!(note(Frame::message(&message(Role::Cron))), Some(text));
        assert_eq!(note(Frame::message(&message(Role::User))), None);
        assert_eq!(note(Frame::message(&message(Role::System))), None);
        assert_eq!(
            note(Frame::notification("approval", "Approve?", "rm", 1)),
            Some("Approve?: rm".into())
        );
        assert_eq!(
            note(Frame::notification("generic", "", "hi", 1)),
            Some("hi".into())
        );
        assert_eq!(note(Frame::notification("cron", "t", "b", 1)), None);
        assert_eq!(note(Frame::typing(true)), None);
        let n = Frame::message_stop(&message(Role::Assistant))
            .in_lane("chan", Some("thr"))
            .push_note()
            .unwrap();
        assert_eq!(
            (n.chat_id.as_str(), n.thread_id.as_deref()),
            ("chan", Some("thr"))
        );
        assert_eq!(n.message_id, "m");
        let n = Frame::notification("generic", "t", "b", 1)
            .push_note()
            .unwrap();
        assert_eq!((n.chat_id.as_str(), n.message_id.as_str()), ("default", ""));
    }

    #[test]
    fn a_stored_frame_decodes_to_the_frame_that_was_encoded() {
        let frames = [
            Frame::message_stop(&message(Role::Assistant)).in_lane("c", Some("t")),
            Frame::message(&message(Role::Cron))
                .with_reply_to(Some("m0"))
                .in_lane("c", None),
            Frame::notification("approval", "Approve?", "rm", 7),
        ];
        for f in frames {
            let stored = crate::protocol::with_cursor(&f.encode(), 9);
            assert_eq!(decode_pushable(&stored).as_ref(), Some(&f));
            assert_eq!(decode_pushable(&f.encode()), Some(f));
        }
        assert_eq!(decode_pushable(&Frame::typing(true).encode()), None);
        assert_eq!(decode_pushable(b"{\"v\":1,\"type\":\"message\"}"), None);
        assert_eq!(decode_pushable(b"not json"), None);
    }

    /// The live path (the note made while typed) and a restart's catch-up (the note read back
    /// from the stored bytes) must say the same for every frame.
    #[test]
    fn an_outboxed_frame_carries_what_its_bytes_would_say() {
        let frames = [
            Frame::message_stop(&message(Role::Assistant)).in_lane("c", Some("t")),
            Frame::message(&message(Role::Cron)).in_lane("c", None),
            Frame::message(&message(Role::System)),
            Frame::notification("cron", "t", "b", 1),
            Frame::notification("approval", "Approve?", "rm", 7),
            Frame::tool_end(0, "x", true, 0.1, "out"),
        ];
        for f in frames {
            let out = f.outboxed();
            assert_eq!(out.bytes, f.encode());
            let read_back = decode_pushable(&out.bytes).and_then(|g| g.push_note());
            assert_eq!(
                out.push,
                read_back,
                "{}",
                String::from_utf8_lossy(&out.bytes)
            );
        }
        assert_eq!(Outboxed::from(Frame::typing(true).encode()).push, None);
    }
}
