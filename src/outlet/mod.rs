//! The per-device outlet: where the hub puts frames for one connection, and how it asks that
//! connection to end. It sits below both the hub (which pushes and closes) and the connection
//! (which drains it onto the socket), so neither needs the other to talk about a device.
//!
//! An outlet knows nothing of sockets: closing is said with a [`CloseReason`], and the
//! connection turns that into the WebSocket close frame.

pub mod queue;

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio_tungstenite::tungstenite::Utf8Bytes;
use tracing::warn;

pub use queue::{OutQueue, Outbound, Pushed, QUEUE_CAPACITY};

use crate::protocol::{Delivery, Frame};

/// Identifies a live connection inside the hub.
pub type ConnId = u64;

/// An encoded text frame as the socket sends it: converted once (`encode_text`), then shared by
/// every queue it is fanned out to, so a broadcast costs one buffer, not one per device.
pub type FrameText = Utf8Bytes;

/// A streamed message's text as the hub last published it, shared by every queue it is pushed
/// to. Within one `generation` the text only ever grows at its end; anything else (a cut, the
/// answer restarting after a tool call, a retry) starts a new generation.
#[derive(Debug)]
pub struct StreamedText {
    pub message_id: String,
    pub chat_id: String,
    pub thread_id: Option<String>,
    pub generation: u64,
    pub text: String,
    /// The whole-text `message.update`, encoded once for every device in the v1 form.
    pub full: FrameText,
    /// The stream pauses here (a tool, a file follows): every device gets this state, whatever
    /// its whole-text budget says.
    pub settles: bool,
}

/// A device in the v1 (whole-text) form is sent at most this many times the text it holds, in
/// `message.update` text for one message: each update repeats everything before it, so pacing
/// by time alone costs the square of the answer (a 1,500-token answer at 100 tokens/s paced
/// at 200 ms is ~37x its bytes). An update over the budget is skipped; later ones get through
/// as the text grows, so updates thin out as the answer gets long.
pub const WHOLE_TEXT_UPDATE_FACTOR: usize = 16;

/// Streams whose last-sent state a connection remembers (for append updates and the
/// whole-text budget). A few turns run
/// at once (`limits.max_running_turns`); forgetting one only costs its next update being the
/// whole text, so the oldest is dropped rather than the memory growing with turns.
pub const APPEND_STREAMS_TRACKED: usize = 16;

/// What one device was last sent of a stream: enough to send only what it lacks.
#[derive(Debug, Clone, Copy)]
struct SentText {
    key: u64,
    generation: u64,
    /// UTF-8 bytes and characters (Unicode scalar values) the device has.
    bytes: usize,
    chars: u64,
    /// Text bytes sent in whole-text updates of this stream so far.
    spent: usize,
}

/// Whether outboxed frames published by the hub go into this connection's queue (`Live`) or are
/// left for the running `sync` replay to read from the store (`CatchingUp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Live,
    CatchingUp,
}

/// Why a connection ends, in the gateway's words; the connection picks the close code for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The device's socket ended on its side, or it said goodbye.
    Bye,
    /// The device was revoked while connected.
    Revoked,
    /// The gateway is shutting down (or restarting).
    Restarting,
    /// The device reads too slowly for its queue; it reconnects and syncs.
    SlowConsumer,
    /// The device sent a frame over `limits.max_frame_bytes`.
    FrameTooLarge,
    /// The device kept sending past its byte rate after being refused.
    RateLimited,
    /// A frame could not be written (or not cut to fit `limits.max_out_frame_bytes`).
    SendFailed,
    /// The device sent a text frame that is not UTF-8.
    InvalidUtf8,
    /// The device broke WebSocket framing rules.
    ProtocolViolation,
}

impl CloseReason {
    /// The reason text of the close frame.
    pub fn text(self) -> &'static str {
        match self {
            CloseReason::Bye => "bye",
            CloseReason::Revoked => "device revoked",
            CloseReason::Restarting => "gateway restarting",
            CloseReason::SlowConsumer => "too slow: reconnect and sync",
            CloseReason::FrameTooLarge => "frame too large",
            CloseReason::RateLimited => "rate limited",
            CloseReason::SendFailed => "a frame could not be sent",
            CloseReason::InvalidUtf8 => "invalid UTF-8",
            CloseReason::ProtocolViolation => "protocol error",
        }
    }

    /// Whether what is queued is sent first (shutdown, revocation, a peer's fault) or dropped:
    /// a reader too slow to drain, or a socket that already failed, would only stall the close.
    pub fn drains(self) -> bool {
        !matches!(self, CloseReason::SlowConsumer | CloseReason::SendFailed)
    }
}

/// The hub's handle on a connection: where frames for it go.
pub struct Outlet {
    pub conn_id: ConnId,
    pub device_id: String,
    queue: RefCell<OutQueue>,
    mode: Cell<Mode>,
    closing: Cell<Option<CloseReason>>,
    /// The device asked for `update_append` in its hello.
    append_updates: Cell<bool>,
    /// The device asked for `agent.busy` in its hello: it is sent lanes' busy/idle state.
    busy_frames: Cell<bool>,
    /// The device asked for `read.receipt`: it is sent `read.marker` and `hello.ack.read`.
    read_markers: Cell<bool>,
    /// Per stream, what the device was last sent (append updates only), newest last.
    sent: RefCell<Vec<SentText>>,
    /// The message this connection's last `message.update` was for, whatever its form: an
    /// append continuation of that same message need not name it again.
    last_update: RefCell<Option<String>>,
    /// Wakes the writer: something was queued or closing was requested.
    wake: Notify,
    /// Wakes the reader (and a writer stuck on a stalled socket) when closing is requested.
    closed: Notify,
}

impl Outlet {
    /// A fresh outlet of an authenticated connection, delivering live.
    pub fn new(conn_id: ConnId, device_id: String) -> Outlet {
        Outlet {
            conn_id,
            device_id,
            queue: RefCell::new(OutQueue::default()),
            mode: Cell::new(Mode::Live),
            closing: Cell::new(None),
            append_updates: Cell::new(false),
            busy_frames: Cell::new(false),
            read_markers: Cell::new(false),
            sent: RefCell::new(Vec::new()),
            last_update: RefCell::new(None),
            wake: Notify::new(),
            closed: Notify::new(),
        }
    }

    /// Queues one encoded frame. A queue that cannot take a never-dropped frame closes the
    /// connection (the device will `sync`), rather than losing the frame.
    pub fn push(&self, text: &FrameText, delivery: Delivery, key: Option<u64>) {
        if self.is_closing() {
            return;
        }
        let pushed = self
            .queue
            .borrow_mut()
            .push_frame(text.clone(), delivery, key);
        self.after_push(pushed);
    }

    /// Turns on `update_append` for this connection (its hello listed the extension).
    pub fn set_append_updates(&self, on: bool) {
        self.append_updates.set(on);
    }

    /// Turns on `agent.busy` for this connection (its hello listed the extension).
    pub fn set_busy_frames(&self, on: bool) {
        self.busy_frames.set(on);
    }

    /// Whether this device is sent `agent.busy` / `agent.idle` and `hello.ack.agent_busy`.
    pub fn wants_busy_frames(&self) -> bool {
        self.busy_frames.get()
    }

    /// Turns on `read.receipt` for this connection (its hello listed the extension).
    pub fn set_read_markers(&self, on: bool) {
        self.read_markers.set(on);
    }

    pub fn wants_read_markers(&self) -> bool {
        self.read_markers.get()
    }

    /// Whether an encoded outbox frame is for this device: one of an extension it did not
    /// ask for is skipped, live and in `sync` alike.
    pub fn takes_outboxed(&self, encoded: &[u8]) -> bool {
        match crate::protocol::encoded_extension(encoded) {
            Some(crate::protocol::EXT_READ_RECEIPT) => self.read_markers.get(),
            _ => true,
        }
    }

    /// Queues a streamed message's latest text; an unsent older one is replaced.
    pub fn push_update(&self, key: u64, streamed: &Rc<StreamedText>) {
        if self.is_closing() {
            return;
        }
        let pushed = self.queue.borrow_mut().push_update(key, streamed.clone());
        self.after_push(pushed);
    }

    /// The frame this device gets for a streamed text, made as the writer sends it: for an
    /// append device only what follows what it was last sent (the whole text at offset 0 when
    /// it has nothing of this generation), costing the appended part; for a v1 device the
    /// shared whole-text frame, or nothing when it would pass the device's budget
    /// ([`WHOLE_TEXT_UPDATE_FACTOR`]).
    pub fn render_update(&self, key: u64, streamed: &StreamedText) -> Option<FrameText> {
        let text = streamed.text.as_str();
        let mut sent = self.sent.borrow_mut();
        let had = sent.iter().position(|s| s.key == key);
        let before = had.map(|i| sent[i]);
        let mut now = SentText {
            key,
            generation: streamed.generation,
            bytes: text.len(),
            chars: 0,
            spent: before.map_or(0, |s| s.spent),
        };
        let frame = if self.append_updates.get() {
            let (from, at) = match before {
                Some(s)
                    if s.generation == streamed.generation
                        && s.bytes <= text.len()
                        && text.is_char_boundary(s.bytes) =>
                {
                    (s.bytes, s.chars)
                }
                _ => (0, 0),
            };
            let appended = &text[from..];
            now.chars = at + appended.chars().count() as u64;
            // A continuation extends a message this connection was already sent whole, with
            // its lane, so it carries neither; nor its id while no other message's update came
            // between: at five updates a second the envelope costs as much as the text
            // (docs/protocol.md, `update_append`). This runs as the writer sends, so "the
            // previous update" is the one the device read last.
            let frame = if at == 0 {
                Frame::message_update_append(&streamed.message_id, appended, at)
                    .in_lane(&streamed.chat_id, streamed.thread_id.as_deref())
            } else if self.last_update.borrow().as_deref() == Some(&streamed.message_id) {
                Frame::message_update_continued(appended, at)
            } else {
                Frame::message_update_append(&streamed.message_id, appended, at)
            };
            encode_text(frame.encode())
        } else {
            let first = before.is_none();
            let spent = now.spent + text.len();
            if !first && !streamed.settles && spent > WHOLE_TEXT_UPDATE_FACTOR * text.len() {
                return None;
            }
            now.spent = spent;
            streamed.full.clone()
        };
        match had {
            Some(i) => sent[i] = now,
            None => {
                if sent.len() >= APPEND_STREAMS_TRACKED {
                    sent.remove(0);
                }
                sent.push(now);
            }
        }
        let mut last = self.last_update.borrow_mut();
        if last.as_deref() != Some(&streamed.message_id) {
            *last = Some(streamed.message_id.clone());
        }
        Some(frame)
    }

    /// Encodes and queues one frame meant for this connection only.
    pub fn push_frame(&self, frame: &Frame) {
        let text = encode_text(frame.encode());
        self.push(&text, frame.delivery(), None);
    }

    /// Queues a media pull; its binary frames go out when the writer reaches it, in order with
    /// everything else, so a client knows the binary frames after its `media.pull` and before
    /// the matching `media.pull.end` are that file's bytes.
    pub fn push_pull(&self, path: std::path::PathBuf, id: Option<i64>) {
        let pushed = self.queue.borrow_mut().push(Outbound::Pull { path, id });
        self.after_push(pushed);
    }

    /// Queues a `sync` replay; from now until it ends, outboxed frames are left to it.
    pub fn push_replay(&self, cursor: u64, id: Option<i64>) {
        self.mode.set(Mode::CatchingUp);
        let pushed = self
            .queue
            .borrow_mut()
            .push(Outbound::Replay { cursor, id });
        self.after_push(pushed);
    }

    /// Wakes the writer, or closes a connection whose queue overflowed.
    fn after_push(&self, pushed: Pushed) {
        match pushed {
            Pushed::Queued | Pushed::Coalesced => self.wake.notify_one(),
            Pushed::Overflow => {
                warn!(conn = self.conn_id, device = %self.device_id, "device is not reading fast enough; disconnecting it (it will catch up with sync)");
                self.close(CloseReason::SlowConsumer);
            }
        }
    }

    /// The writer's next item, in queue order.
    pub fn pop(&self) -> Option<Outbound> {
        self.queue.borrow_mut().pop()
    }

    /// Resolves once something was queued or closing was requested (the writer's idle wait).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Whether the hub queues outboxed frames here or leaves them to the replay.
    pub fn mode(&self) -> Mode {
        self.mode.get()
    }

    /// The replay has caught up: outboxed frames are queued here again.
    pub fn set_live(&self) {
        self.mode.set(Mode::Live);
    }

    /// Frames replaced by a newer one, for the disconnect log line.
    pub fn coalesced(&self) -> u64 {
        self.queue.borrow().coalesced
    }

    /// Asks the writer to close the socket; the first reason wins.
    pub fn close(&self, reason: CloseReason) {
        if self.closing.get().is_none() {
            self.closing.set(Some(reason));
        }
        self.wake.notify_one();
        self.closed.notify_waiters();
    }

    /// Resolves once closing has been requested.
    pub async fn wait_closing(&self) {
        loop {
            let notified = self.closed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_closing() {
                return;
            }
            notified.await;
        }
    }

    /// Why the connection is closing, once it is.
    pub fn closing(&self) -> Option<CloseReason> {
        self.closing.get()
    }

    /// Closing without sending what is still queued.
    pub fn must_abort(&self) -> bool {
        self.closing.get().is_some_and(|r| !r.drains())
    }

    /// Closing was requested: nothing more is queued.
    pub fn is_closing(&self) -> bool {
        self.closing.get().is_some()
    }
}

/// Turns an encoded frame into the socket's text type once, so fan-out shares one buffer.
pub fn encode_text(bytes: Bytes) -> FrameText {
    Utf8Bytes::try_from(bytes).expect("serde_json writes UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(generation: u64, text: &str, settles: bool) -> StreamedText {
        streamed_in("msg_1", generation, text, settles)
    }

    fn streamed_in(message_id: &str, generation: u64, text: &str, settles: bool) -> StreamedText {
        StreamedText {
            message_id: message_id.into(),
            chat_id: "default".into(),
            thread_id: None,
            generation,
            text: text.into(),
            full: encode_text(Frame::message_update(message_id, text).encode()),
            settles,
        }
    }

    fn envelope(frame: &FrameText) -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(frame.as_str()).unwrap()
    }

    /// Renders what the writer would send next, as the writer does.
    fn write_next(o: &Outlet) -> Option<FrameText> {
        match o.pop()? {
            Outbound::Update { key, streamed } => o.render_update(key, &streamed),
            _ => panic!("only updates were queued"),
        }
    }

    fn payload(frame: &FrameText) -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(frame.as_str()).unwrap()["payload"].clone()
    }

    #[test]
    fn append_updates_carry_what_the_device_lacks_and_replace_on_a_rewrite() {
        let o = Outlet::new(1, "d".into());
        o.set_append_updates(true);
        let first = o.render_update(7, &streamed(1, "héllo", false)).unwrap();
        assert_eq!(payload(&first)["append_at"], 0);
        assert_eq!(payload(&first)["text"], "héllo");
        // Offsets count characters, not bytes.
        let next = o
            .render_update(7, &streamed(1, "héllo wörld", false))
            .unwrap();
        assert_eq!(payload(&next)["append_at"], 5);
        assert_eq!(payload(&next)["text"], " wörld");
        // A new generation (a cut, the answer restarting after a tool) is sent whole.
        let rewritten = o.render_update(7, &streamed(2, "héllo", false)).unwrap();
        assert_eq!(payload(&rewritten)["append_at"], 0);
        assert_eq!(payload(&rewritten)["text"], "héllo");
        // Another stream has its own offsets.
        let other = o.render_update(8, &streamed(1, "x", false)).unwrap();
        assert_eq!(payload(&other)["append_at"], 0);
    }

    #[test]
    fn a_continuation_names_its_message_only_after_another_ones_update() {
        let o = Outlet::new(1, "d".into());
        o.set_append_updates(true);
        let a = |t: &str| streamed_in("msg_a", 1, t, false);
        let b = |t: &str| streamed_in("msg_b", 1, t, false);
        let first = envelope(&o.render_update(1, &a("one")).unwrap());
        assert_eq!(first["payload"]["message_id"], "msg_a");
        assert_eq!(first["chat_id"], "default");
        let cont = envelope(&o.render_update(1, &a("one two")).unwrap());
        assert_eq!(cont["payload"]["append_at"], 3);
        assert!(cont["payload"].get("message_id").is_none(), "{cont}");
        assert!(cont.get("chat_id").is_none(), "{cont}");
        // Another message's update in between, here its first (whole) one: the next
        // continuation of the first must say whose it is, and only that one.
        o.render_update(2, &b("x"));
        let named = envelope(&o.render_update(1, &a("one two three")).unwrap());
        assert_eq!(named["payload"]["message_id"], "msg_a");
        assert_eq!(named["payload"]["append_at"], 7);
        assert!(named.get("chat_id").is_none(), "{named}");
        let bare = envelope(&o.render_update(1, &a("one two three four")).unwrap());
        assert!(bare["payload"].get("message_id").is_none(), "{bare}");
        // A continuation of the other after that names it too.
        let other = envelope(&o.render_update(2, &b("xy")).unwrap());
        assert_eq!(other["payload"]["message_id"], "msg_b");
        assert_eq!(other["payload"]["append_at"], 1);
    }

    #[test]
    fn the_previous_update_is_the_one_written_not_the_one_queued_last() {
        let o = Outlet::new(1, "d".into());
        o.set_append_updates(true);
        o.push_update(1, &Rc::new(streamed_in("msg_a", 1, "a", false)));
        write_next(&o).unwrap();
        // Queued: a's next state, then b's; a's newer state replaces its older one in place, so
        // it is written before b's although it was queued after it.
        o.push_update(1, &Rc::new(streamed_in("msg_a", 1, "ab", false)));
        o.push_update(2, &Rc::new(streamed_in("msg_b", 1, "x", false)));
        o.push_update(1, &Rc::new(streamed_in("msg_a", 1, "abc", false)));
        let a = envelope(&write_next(&o).unwrap());
        assert_eq!(a["payload"]["text"], "bc");
        assert!(a["payload"].get("message_id").is_none(), "{a}");
        let b = envelope(&write_next(&o).unwrap());
        assert_eq!(b["payload"]["message_id"], "msg_b");
        assert!(o.pop().is_none());
        o.push_update(1, &Rc::new(streamed_in("msg_a", 1, "abcd", false)));
        let a = envelope(&write_next(&o).unwrap());
        assert_eq!(
            a["payload"]["message_id"], "msg_a",
            "b's update came between"
        );
        // A new connection (a reconnect) starts over: whole, named, with its lane.
        let again = Outlet::new(2, "d".into());
        again.set_append_updates(true);
        let first = envelope(
            &again
                .render_update(1, &streamed_in("msg_a", 1, "abcde", false))
                .unwrap(),
        );
        assert_eq!(first["payload"]["append_at"], 0);
        assert_eq!(first["payload"]["message_id"], "msg_a");
        assert_eq!(first["chat_id"], "default");
    }

    #[test]
    fn a_forgotten_stream_is_sent_whole_again() {
        let o = Outlet::new(1, "d".into());
        o.set_append_updates(true);
        o.render_update(0, &streamed(1, "ab", false));
        for key in 1..=APPEND_STREAMS_TRACKED as u64 {
            o.render_update(key, &streamed(1, "x", false));
        }
        let again = o.render_update(0, &streamed(1, "abc", false)).unwrap();
        assert_eq!(payload(&again)["append_at"], 0);
        assert_eq!(payload(&again)["text"], "abc");
    }

    #[test]
    fn whole_text_updates_stay_within_their_budget_unless_the_stream_pauses() {
        let o = Outlet::new(1, "d".into());
        let mut text = String::new();
        let mut sent = 0;
        for _ in 0..1000 {
            text.push_str("word ");
            if let Some(f) = o.render_update(1, &streamed(1, &text, false)) {
                assert!(payload(&f).get("append_at").is_none());
                sent += text.len();
            }
            assert!(sent <= WHOLE_TEXT_UPDATE_FACTOR * text.len() + 5);
        }
        // A state the stream pauses on always goes out.
        assert!(o.render_update(1, &streamed(1, &text, true)).is_some());
        // The first update of a stream always goes out, however small.
        assert!(o.render_update(2, &streamed(1, "a", false)).is_some());
    }
}
