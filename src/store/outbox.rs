//! The outbox: every frame that changes what devices hold, under its cursor, for `sync`.
//!
//! Keys are cursors as big-endian u64, so sled's key order is cursor order and a replay is one
//! range scan. The outbox is bounded by count (`store.outbox_retain_frames`); history keeps the
//! messages themselves, so pruning only limits how far back `sync` can replay. Pruning a frame
//! also drops its entries in `frame_of` and `message_frames`, which therefore stay as small as
//! the outbox.
//!
//! Cursors never go backwards, not even across a restore: the restored store's head is raised
//! above every cursor the replaced store issued (`raise_cursor_head`), and the cursors skipped
//! that way are kept as a *gap* (`meta/cursor_gaps`). They name frames of the replaced store
//! that this one never had, so a device whose `sync` cursor falls in a gap, or beyond the head,
//! is told to reload instead of being replayed what follows (docs/protocol.md, "sync").

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::base::Result;
use super::engine::handle::Store;

/// The gaps left by restores, in `meta` (JSON, oldest first).
const META_GAPS: &[u8] = b"cursor_gaps";
/// Gaps kept: one per restore; the oldest go first (by then far below the outbox's tail, where a
/// device is replayed from the tail and reloads anyway).
const MAX_GAPS: usize = 32;

/// Cursors `from + 1 ..= to` were issued by a store a restore replaced, not by this one; this
/// store's history continues from `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorGap {
    pub from: u64,
    pub to: u64,
}

impl Store {
    /// Up to `max` frames with `after < cursor <= upto`, oldest first.
    pub fn outbox_range(&self, after: u64, upto: u64, max: usize) -> Result<Vec<(u64, Bytes)>> {
        if after >= upto {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(max.min(64));
        let start = (after + 1).to_be_bytes();
        let end = upto.to_be_bytes();
        for item in self.t()?.outbox.range(start..=end).take(max) {
            let (k, v) = item?;
            out.push((super::base::u64_from(&k), Bytes::copy_from_slice(&v)));
        }
        Ok(out)
    }

    /// The oldest cursor still replayable (0 when the outbox is empty).
    pub fn outbox_tail(&self) -> Result<u64> {
        Ok(self
            .t()?
            .outbox
            .first()?
            .map(|(k, _)| super::base::u64_from(&k))
            .unwrap_or(0))
    }

    /// The gaps restores left in the cursors (oldest first).
    pub fn cursor_gaps(&self) -> Result<Vec<CursorGap>> {
        match self.t()?.meta.get(META_GAPS)? {
            Some(v) => super::base::from_json(&v, "cursor gaps"),
            None => Ok(Vec::new()),
        }
    }

    /// Where this store's history continues for a device whose cursor names a frame it never
    /// had (a cursor in a restore's gap): that device must reload rather than be replayed.
    pub fn forked_at(&self, cursor: u64) -> Result<Option<u64>> {
        Ok(self
            .cursor_gaps()?
            .iter()
            .find(|g| g.from < cursor && cursor <= g.to)
            .map(|g| g.from))
    }

    /// After a restore: moves the cursor head up to `floor` (never down), recording the cursors
    /// skipped as a gap in the same sled batch. Returns the gap, if the head moved.
    pub fn raise_cursor_head(&self, floor: u64) -> Result<Option<CursorGap>> {
        self.writable()?;
        let t = self.t()?;
        let mut heads = t
            .heads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if floor <= heads.cursor {
            return Ok(None);
        }
        let gap = CursorGap {
            from: heads.cursor,
            to: floor,
        };
        let mut gaps = self.cursor_gaps()?;
        gaps.push(gap);
        if gaps.len() > MAX_GAPS {
            gaps.remove(0);
        }
        let (raised, record) = super::engine::commit::raised_record(*heads, floor);
        let mut batch = sled::Batch::default();
        batch.insert(META_GAPS, super::base::to_json(&gaps));
        batch.insert(super::engine::commit::META_COMMIT, record);
        self.note_failure(t.meta.apply_batch(batch))?;
        *heads = raised;
        Ok(Some(gap))
    }

    /// Drops the oldest frames so at most `retain` remain. Cheap when nothing is over: one
    /// lookup of the first key. Returns how many were dropped.
    pub fn prune_outbox(&self, retain: u64) -> Result<u64> {
        let head = self.cursor_head()?;
        let t = self.t()?;
        // Gaps only lower where to keep from: with the first frame at or above the point that
        // ignores them, nothing is over, and the gaps need not be read.
        let tail = t
            .outbox
            .first()?
            .map_or(u64::MAX, |(k, _)| super::base::u64_from(&k));
        if tail > head.saturating_sub(retain) {
            return Ok(0);
        }
        let gaps = self.cursor_gaps()?;
        let keep_from = keep_from(head, retain, &gaps);
        let mut dropped = 0;
        while let Some((k, _)) = t.outbox.first()? {
            if super::base::u64_from(&k) >= keep_from {
                break;
            }
            if dropped == 0 {
                self.writable()?;
            }
            // The frame's message loses one replayable frame to tombstone if it is deleted. The
            // outbox entry goes last: a crash half-way leaves it, and the next prune finishes.
            if let Some(id) = t.frame_of.remove(&k)? {
                if let Some(list) = t.message_frames.get(&id)? {
                    let rest: Vec<u8> = list
                        .chunks(8)
                        .filter(|c| *c != &k[..])
                        .flatten()
                        .copied()
                        .collect();
                    if rest.is_empty() {
                        t.message_frames.remove(&id)?;
                    } else {
                        t.message_frames.insert(&id, rest)?;
                    }
                }
            }
            t.outbox.remove(&k)?;
            dropped += 1;
        }
        Ok(dropped)
    }
}

/// The lowest cursor kept so that `retain` frames remain below `head`: the cursors in gaps
/// hold no frame, so they do not count.
fn keep_from(head: u64, retain: u64, gaps: &[CursorGap]) -> u64 {
    // Walking down from the head, counting the cursors that hold frames. Gaps are kept oldest
    // first, and each lies above the last (the head only rises).
    let (mut pos, mut needed) = (head, retain);
    for g in gaps.iter().rev() {
        if g.from >= pos {
            continue;
        }
        let real = pos - g.to.min(pos);
        if needed <= real {
            break;
        }
        needed -= real;
        pos = g.from;
    }
    pos.saturating_sub(needed) + 1
}

#[cfg(test)]
mod tests {
    use super::super::tests::temp_store;
    use super::super::Change;
    use bytes::Bytes;

    #[test]
    fn range_and_prune() {
        let (_d, s) = temp_store();
        let frames: Vec<_> = (0..10)
            .map(|i| Change::Outbox(Bytes::from(format!("{{\"v\":1,\"n\":{i}}}")).into()))
            .collect();
        s.commit(&frames).unwrap();
        let r = s.outbox_range(3, 10, 4).unwrap();
        assert_eq!(r.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [4, 5, 6, 7]);
        assert!(s.outbox_range(10, 10, 4).unwrap().is_empty());
        assert_eq!(s.prune_outbox(4).unwrap(), 6);
        assert_eq!(s.outbox_tail().unwrap(), 7);
        // Cursors never go back after a prune.
        assert_eq!(s.commit(&frames[..1]).unwrap(), vec![11]);
    }

    #[test]
    fn a_raised_head_leaves_a_gap_that_pruning_does_not_count() {
        let (_d, s) = temp_store();
        let frame = |i: u64| Change::Outbox(Bytes::from(format!("{{\"v\":1,\"n\":{i}}}")).into());
        s.commit(&(0..3).map(frame).collect::<Vec<_>>()).unwrap();
        assert_eq!(s.raise_cursor_head(2).unwrap(), None, "never down");
        let gap = s.raise_cursor_head(1000).unwrap().unwrap();
        assert_eq!((gap.from, gap.to), (3, 1000));
        assert_eq!(s.cursor_head().unwrap(), 1000);
        assert_eq!(s.commit(&[frame(9)]).unwrap(), vec![1001]);
        assert_eq!(s.forked_at(3).unwrap(), None);
        assert_eq!(s.forked_at(4).unwrap(), Some(3));
        assert_eq!(s.forked_at(1000).unwrap(), Some(3));
        assert_eq!(s.forked_at(1001).unwrap(), None);
        // Four frames exist; keeping three drops only the oldest.
        assert_eq!(s.prune_outbox(3).unwrap(), 1);
        assert_eq!(s.outbox_tail().unwrap(), 2);
        assert_eq!(super::keep_from(1001, 3, &s.cursor_gaps().unwrap()), 2);
        assert_eq!(super::keep_from(10, 3, &[]), 8);
    }
}
