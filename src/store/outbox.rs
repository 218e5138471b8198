//! The outbox: every frame that changes what devices hold, under its cursor, for `sync`.
//!
//! Keys are cursors as big-endian u64, so sled's key order is cursor order and a replay is one
//! range scan. The outbox is bounded by count (`store.outbox_retain_frames`); history keeps the
//! messages themselves, so pruning only limits how far back `sync` can replay. Pruning a frame
//! also drops its entries in `frame_of` and `message_frames`, which therefore stay as small as
//! the outbox.

use bytes::Bytes;

use super::{Result, Store};

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
            out.push((super::u64_from(&k), Bytes::copy_from_slice(&v)));
        }
        Ok(out)
    }

    /// The oldest cursor still replayable (0 when the outbox is empty).
    pub fn outbox_tail(&self) -> Result<u64> {
        Ok(self
            .t()?
            .outbox
            .first()?
            .map(|(k, _)| super::u64_from(&k))
            .unwrap_or(0))
    }

    /// Drops the oldest frames so at most `retain` remain. Cheap when nothing is over: one
    /// lookup of the first key. Returns how many were dropped.
    pub fn prune_outbox(&self, retain: u64) -> Result<u64> {
        let head = self.cursor_head()?;
        let t = self.t()?;
        let keep_from = head.saturating_sub(retain) + 1;
        let mut dropped = 0;
        while let Some((k, _)) = t.outbox.first()? {
            if super::u64_from(&k) >= keep_from {
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
}
