//! A connection's outbound queue: fixed capacity, coalescing, never silently lossy.
//!
//! The queue holds shared, already-encoded frames (one encoding is fanned out to every device),
//! so its memory is `QUEUE_CAPACITY` pointers plus whatever frames are in flight anyway. When a
//! device reads slower than the agent streams:
//! - a `message.update` / `tool.progress` replaces the unsent one with the same key (latest wins);
//! - anything else that does not fit marks the queue overflowed: the connection is closed and
//!   the device catches up with `sync`, which replays every outboxed frame it missed. Nothing the
//!   schema calls never-dropped is discarded while the device stays connected.

use std::rc::Rc;

use heapless::Deque;

use super::{FrameText, StreamedText};
use crate::protocol::Delivery;

/// Frames a connection may have waiting. At a 60 ms demo pace a turn emits ~20 frames per
/// second, so 128 slots absorb several seconds of a stalled reader before coalescing is needed.
pub const QUEUE_CAPACITY: usize = 128;

/// One item waiting to be written.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// An encoded text frame; `key` is set for coalescable frames.
    Frame { text: FrameText, key: Option<u64> },
    /// The latest text of a streamed message (`message.update`, coalescable by `key`): each
    /// device's form of it (whole text, or what it lacks) is made when the writer takes it,
    /// since only then is it known what the device has.
    Update {
        key: u64,
        streamed: Rc<StreamedText>,
    },
    /// Replay the outbox after `cursor`, then send `sync.done` answering request `id`.
    Replay { cursor: u64, id: Option<i64> },
    /// Stream a media file as binary frames, then `media.pull.end` answering request `id`.
    Pull {
        path: std::path::PathBuf,
        id: Option<i64>,
    },
}

/// What `push` did with a frame; `Overflow` means the connection must be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    Coalesced,
    Overflow,
}

#[derive(Default)]
pub struct OutQueue {
    items: Deque<Outbound, QUEUE_CAPACITY>,
    /// Frames replaced by a newer one (a gauge for benchmarks and `/status`).
    pub coalesced: u64,
    overflowed: bool,
}

impl OutQueue {
    /// Queues a text frame; a coalescable one replaces its unsent twin with the same key.
    pub fn push_frame(&mut self, text: FrameText, delivery: Delivery, key: Option<u64>) -> Pushed {
        if self.overflowed {
            return Pushed::Overflow;
        }
        // Only a coalescable frame keeps its key: a never-dropped or ephemeral frame pushed with
        // one (the API allows it) must not be replaced later by an update with the same key,
        // which would lose it silently (found by tests/queue_properties.rs).
        let key = key.filter(|_| delivery == Delivery::Coalescable);
        if let (Delivery::Coalescable, Some(k)) = (delivery, key) {
            for item in self.items.iter_mut() {
                if let Outbound::Frame {
                    text: t,
                    key: Some(existing),
                } = item
                {
                    if *existing == k {
                        *t = text;
                        self.coalesced += 1;
                        return Pushed::Coalesced;
                    }
                }
            }
        }
        self.push(Outbound::Frame { text, key })
    }

    /// Queues a streamed message's latest text, replacing its unsent predecessor in place.
    pub fn push_update(&mut self, key: u64, streamed: Rc<StreamedText>) -> Pushed {
        if self.overflowed {
            return Pushed::Overflow;
        }
        for item in self.items.iter_mut() {
            if let Outbound::Update {
                key: k,
                streamed: s,
            } = item
            {
                if *k == key {
                    *s = streamed;
                    self.coalesced += 1;
                    return Pushed::Coalesced;
                }
            }
        }
        self.push(Outbound::Update { key, streamed })
    }

    /// Queues any item; a full queue overflows and empties itself.
    pub fn push(&mut self, item: Outbound) -> Pushed {
        if self.overflowed {
            return Pushed::Overflow;
        }
        match self.items.push_back(item) {
            Ok(()) => Pushed::Queued,
            Err(_) => {
                // Free the memory now; the connection is about to be closed anyway.
                self.items.clear();
                self.overflowed = true;
                Pushed::Overflow
            }
        }
    }

    /// The oldest item, for the writer.
    pub fn pop(&mut self) -> Option<Outbound> {
        self.items.pop_front()
    }

    /// Items waiting (at most [`QUEUE_CAPACITY`]).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Nothing waits.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::Utf8Bytes;

    fn b(s: &'static str) -> Utf8Bytes {
        Utf8Bytes::from_static(s)
    }

    #[test]
    fn updates_coalesce_in_place_and_keep_order() {
        let mut q = OutQueue::default();
        q.push_frame(b("start"), Delivery::Ephemeral, None);
        q.push_frame(b("u1"), Delivery::Coalescable, Some(7));
        q.push_frame(b("tool"), Delivery::NeverDropped, None);
        assert_eq!(
            q.push_frame(b("u2"), Delivery::Coalescable, Some(7)),
            Pushed::Coalesced
        );
        q.push_frame(b("other"), Delivery::Coalescable, Some(8));
        let order: Vec<_> = std::iter::from_fn(|| q.pop())
            .map(|o| match o {
                Outbound::Frame { text, .. } => text.as_str().to_owned(),
                Outbound::Replay { .. } | Outbound::Pull { .. } | Outbound::Update { .. } => {
                    "other".into()
                }
            })
            .collect();
        assert_eq!(order, ["start", "u2", "tool", "other"]);
        assert_eq!(q.coalesced, 1);
    }

    #[test]
    fn a_full_queue_overflows_instead_of_dropping_quietly() {
        let mut q = OutQueue::default();
        for _ in 0..QUEUE_CAPACITY {
            assert_eq!(
                q.push_frame(b("m"), Delivery::NeverDropped, None),
                Pushed::Queued
            );
        }
        // An update with no unsent twin needs a slot of its own.
        assert_eq!(
            q.push_frame(b("u"), Delivery::Coalescable, Some(1)),
            Pushed::Overflow
        );
        assert!(q.is_empty());
        assert_eq!(
            q.push_frame(b("m"), Delivery::NeverDropped, None),
            Pushed::Overflow
        );
    }

    #[test]
    fn coalescing_at_capacity_does_not_overflow() {
        let mut q = OutQueue::default();
        q.push_frame(b("u"), Delivery::Coalescable, Some(1));
        for _ in 1..QUEUE_CAPACITY {
            q.push_frame(b("m"), Delivery::NeverDropped, None);
        }
        assert_eq!(
            q.push_frame(b("u2"), Delivery::Coalescable, Some(1)),
            Pushed::Coalesced
        );
        assert_eq!(q.len(), QUEUE_CAPACITY);
    }
}
