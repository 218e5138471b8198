//! Property tests of a connection's outbound queue (`src/outlet/queue.rs`), against what
//! docs/backpressure.md and the module promise, for random interleavings of pushes and pops:
//!
//! - never-dropped frames (and replays and media pulls) are never lost, duplicated or
//!   reordered; the only way one is not delivered is the overflow policy: `push` answers
//!   `Overflow` (the connection is then closed with 1013 and the device catches up by `sync`),
//!   the queue is emptied at once, and every later push answers `Overflow` too;
//! - an overflow happens only when the queue is full and the frame cannot coalesce;
//! - a popped coalescable frame is the newest one pushed for its key at pop time (latest wins),
//!   and a replacement keeps its predecessor's place: items come out in the order their slots
//!   were taken;
//! - ephemeral frames are delivered in order while the device keeps up (same overflow rule);
//! - memory: never more than `QUEUE_CAPACITY` items, and the frame bytes alive are exactly those
//!   of the frames still queued (a replaced frame or an overflowed queue frees its bytes at once).
//!
//! The model below is written from those promises, not from the code: a list of slots, each
//! holding the newest frame for its key.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use iris_gateway::outlet::{OutQueue, Outbound, Pushed, QUEUE_CAPACITY};
use iris_gateway::protocol::Delivery;
use proptest::prelude::*;
use tokio_tungstenite::tungstenite::Utf8Bytes;

thread_local! {
    /// Bytes of test frames not yet dropped, on this test's thread.
    static LIVE_FRAME_BYTES: Cell<usize> = const { Cell::new(0) };
}

/// A frame's buffer that counts itself in [`LIVE_FRAME_BYTES`] until it is dropped.
struct Tracked(Vec<u8>);

impl Tracked {
    fn frame(n: u64, len: usize) -> Utf8Bytes {
        // The frame number first, so a popped frame says which push it came from.
        let mut text = format!("{n:08}");
        text.extend(std::iter::repeat_n('x', len));
        LIVE_FRAME_BYTES.with(|c| c.set(c.get() + text.len()));
        let bytes = Bytes::from_owner(Tracked(text.into_bytes()));
        Utf8Bytes::try_from(bytes).expect("ASCII")
    }
}

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        LIVE_FRAME_BYTES.with(|c| c.set(c.get() - self.0.len()));
    }
}

fn live_frame_bytes() -> usize {
    LIVE_FRAME_BYTES.with(Cell::get)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    NeverDropped,
    Coalescable,
    Ephemeral,
}

impl Class {
    fn delivery(self) -> Delivery {
        match self {
            Class::NeverDropped => Delivery::NeverDropped,
            Class::Coalescable => Delivery::Coalescable,
            Class::Ephemeral => Delivery::Ephemeral,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// `push_frame` of a frame `len` bytes long. Keys come from a small set so they collide;
    /// any class may carry one (the API allows it), but only coalescable frames coalesce.
    Frame {
        class: Class,
        key: Option<u64>,
        len: usize,
    },
    /// `push` of a `sync` replay or a media pull: never dropped either.
    Replay,
    Pull,
    /// The writer takes up to this many items.
    Pop(usize),
}

fn op(push_weight: u32, pop_weight: u32) -> impl Strategy<Value = Op> {
    let class = prop_oneof![
        Just(Class::NeverDropped),
        Just(Class::Coalescable),
        Just(Class::Ephemeral),
    ];
    let frame = (class, prop::option::weighted(0.8, 0u64..6), 0usize..200)
        .prop_map(|(class, key, len)| Op::Frame { class, key, len });
    prop_oneof![
        push_weight => frame,
        1 => Just(Op::Replay),
        1 => Just(Op::Pull),
        pop_weight => (1usize..40).prop_map(Op::Pop),
    ]
}

/// What the model expects of one slot of the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    /// Frame number, its class, and the key it coalesces under (coalescable frames only).
    Frame {
        n: u64,
        class: Class,
        key: Option<u64>,
        bytes: usize,
    },
    Replay(u64),
    Pull(u64),
}

#[derive(Default)]
struct Model {
    slots: VecDeque<Item>,
    overflowed: bool,
    /// Never-dropped items (frames, replays, pulls) in push order, and those delivered.
    never_dropped_pushed: Vec<u64>,
    never_dropped_popped: Vec<u64>,
    ephemeral_pushed: Vec<u64>,
    ephemeral_popped: Vec<u64>,
    /// The newest frame pushed under each coalescing key.
    newest: HashMap<u64, u64>,
    next: u64,
}

impl Model {
    fn queued_bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|i| match i {
                Item::Frame { bytes, .. } => *bytes,
                _ => 0,
            })
            .sum()
    }
}

fn frame_number(text: &Utf8Bytes) -> u64 {
    text.as_str()[..8].parse().expect("a test frame")
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let base = live_frame_bytes();
    let mut q = OutQueue::default();
    let mut m = Model::default();
    for op in ops {
        match op {
            Op::Frame { class, key, len } => {
                let n = m.next;
                m.next += 1;
                let text = Tracked::frame(n, len);
                let bytes = text.len();
                let pushed = q.push_frame(text, class.delivery(), key);
                let coalesce_key = key.filter(|_| class == Class::Coalescable);
                let target = coalesce_key.and_then(|k| {
                    m.slots
                        .iter()
                        .position(|i| matches!(i, Item::Frame { key: Some(sk), .. } if *sk == k))
                });
                let expected = if m.overflowed {
                    Pushed::Overflow
                } else if target.is_some() {
                    Pushed::Coalesced
                } else if m.slots.len() == QUEUE_CAPACITY {
                    Pushed::Overflow
                } else {
                    Pushed::Queued
                };
                prop_assert_eq!(pushed, expected, "push of frame {} ({:?})", n, class);
                match class {
                    Class::NeverDropped => m.never_dropped_pushed.push(n),
                    Class::Ephemeral => m.ephemeral_pushed.push(n),
                    Class::Coalescable => {}
                }
                if let Some(k) = coalesce_key {
                    m.newest.insert(k, n);
                }
                let item = Item::Frame {
                    n,
                    class,
                    key: coalesce_key,
                    bytes,
                };
                match pushed {
                    Pushed::Queued => m.slots.push_back(item),
                    Pushed::Coalesced => m.slots[target.expect("a target")] = item,
                    Pushed::Overflow => {
                        m.overflowed = true;
                        m.slots.clear();
                    }
                }
            }
            Op::Replay | Op::Pull => {
                let n = m.next;
                m.next += 1;
                let (outbound, item) = if matches!(op, Op::Replay) {
                    (
                        Outbound::Replay {
                            cursor: n,
                            id: None,
                        },
                        Item::Replay(n),
                    )
                } else {
                    (
                        Outbound::Pull {
                            path: format!("/media/{n}").into(),
                            id: None,
                        },
                        Item::Pull(n),
                    )
                };
                let pushed = q.push(outbound);
                let full = m.overflowed || m.slots.len() == QUEUE_CAPACITY;
                let expected = if full {
                    Pushed::Overflow
                } else {
                    Pushed::Queued
                };
                prop_assert_eq!(pushed, expected, "push of item {}", n);
                m.never_dropped_pushed.push(n);
                if pushed == Pushed::Queued {
                    m.slots.push_back(item);
                } else {
                    m.overflowed = true;
                    m.slots.clear();
                }
            }
            Op::Pop(count) => {
                for _ in 0..count {
                    let got = q.pop();
                    let want = m.slots.pop_front();
                    let (got, want) = match (got, want) {
                        (None, None) => break,
                        (Some(g), Some(w)) => (g, w),
                        (g, w) => {
                            return Err(TestCaseError::fail(format!(
                                "popped {g:?}, the model expected {w:?}"
                            )))
                        }
                    };
                    match (&got, &want) {
                        (Outbound::Frame { text, .. }, Item::Frame { n, class, key, .. }) => {
                            let got_n = frame_number(text);
                            prop_assert_eq!(got_n, *n, "popped the wrong frame");
                            match class {
                                Class::NeverDropped => m.never_dropped_popped.push(got_n),
                                Class::Ephemeral => m.ephemeral_popped.push(got_n),
                                Class::Coalescable => {}
                            }
                            if let Some(k) = key {
                                // Latest wins: nothing newer was pushed under this key.
                                prop_assert_eq!(m.newest.get(k), Some(&got_n), "stale update");
                            }
                        }
                        (Outbound::Replay { cursor, .. }, Item::Replay(n)) => {
                            prop_assert_eq!(*cursor, *n);
                            m.never_dropped_popped.push(*n);
                        }
                        (Outbound::Pull { path, .. }, Item::Pull(n)) => {
                            let want = format!("/media/{n}");
                            prop_assert_eq!(path.to_str(), Some(want.as_str()));
                            m.never_dropped_popped.push(*n);
                        }
                        (g, w) => {
                            return Err(TestCaseError::fail(format!(
                                "popped {g:?}, the model expected {w:?}"
                            )))
                        }
                    }
                    drop(got);
                }
            }
        }
        // Bounded memory: the slot count, and the frame bytes alive are the queued ones.
        prop_assert!(q.len() <= QUEUE_CAPACITY);
        prop_assert_eq!(q.len(), m.slots.len());
        prop_assert_eq!(q.is_empty(), m.slots.is_empty());
        prop_assert_eq!(
            live_frame_bytes() - base,
            m.queued_bytes(),
            "frame bytes alive differ from the frames queued"
        );
        // Never-dropped and ephemeral items come out in push order, each once.
        prop_assert!(m.never_dropped_pushed.starts_with(&m.never_dropped_popped));
        prop_assert!(m.ephemeral_pushed.starts_with(&m.ephemeral_popped));
    }
    // Drain what is left: unless the overflow policy fired, every never-dropped item arrives.
    while let Some(item) = q.pop() {
        if let Outbound::Frame { text, .. } = &item {
            let n = frame_number(text);
            if m.never_dropped_pushed.contains(&n) {
                m.never_dropped_popped.push(n);
            }
        } else if let Outbound::Replay { cursor: n, .. } = item {
            m.never_dropped_popped.push(n);
        } else if let Outbound::Pull { path, .. } = &item {
            let n = path.to_str().and_then(|p| p.strip_prefix("/media/"));
            m.never_dropped_popped
                .push(n.and_then(|n| n.parse().ok()).expect("a test pull"));
        }
    }
    if !m.overflowed {
        prop_assert_eq!(&m.never_dropped_popped, &m.never_dropped_pushed);
    } else {
        // The policy fired: the queue was emptied and stays closed to new frames.
        prop_assert!(m.never_dropped_pushed.starts_with(&m.never_dropped_popped));
        prop_assert_eq!(
            q.push_frame(Tracked::frame(0, 0), Delivery::NeverDropped, None),
            Pushed::Overflow
        );
        prop_assert!(q.pop().is_none());
    }
    drop(q);
    prop_assert_eq!(live_frame_bytes(), base, "frame bytes outlived the queue");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    })]

    /// A device that mostly keeps up: pushes and pops in similar measure.
    #[test]
    fn a_reader_that_keeps_up(ops in prop::collection::vec(op(4, 3), 0..800)) {
        run(ops)?;
    }

    /// A stalled or slow reader: pushes far outnumber pops, so the queue fills, coalesces and
    /// overflows.
    #[test]
    fn a_slow_reader(ops in prop::collection::vec(op(30, 1), 100..800)) {
        run(ops)?;
    }
}

/// The scenario the fix in queue.rs is about, spelled out: a never-dropped frame that carries
/// a key is not replaced by a later update with that key.
#[test]
fn a_never_dropped_frame_with_a_key_is_not_coalesced_away() {
    let mut q = OutQueue::default();
    q.push_frame(Tracked::frame(1, 0), Delivery::NeverDropped, Some(7));
    assert_eq!(
        q.push_frame(Tracked::frame(2, 0), Delivery::Coalescable, Some(7)),
        Pushed::Queued
    );
    let popped: Vec<u64> = std::iter::from_fn(|| q.pop())
        .map(|o| match o {
            Outbound::Frame { text, .. } => frame_number(&text),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(popped, [1, 2]);
}
