//! The per-device outlet: where the hub puts frames for one connection, and how it asks that
//! connection to end. It sits below both the hub (which pushes and closes) and the connection
//! (which drains it onto the socket), so neither needs the other to talk about a device.
//!
//! An outlet knows nothing of sockets: closing is said with a [`CloseReason`], and the
//! connection turns that into the WebSocket close frame.

pub mod queue;

use std::cell::{Cell, RefCell};

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
