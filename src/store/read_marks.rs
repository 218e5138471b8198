//! The household's read state: per lane, the message it has been read up to (the
//! `read.receipt` extension). One small record per lane, written only through `commit`
//! (`Change::MarkRead`), so a marker a device was told of is on disk.

use serde::{Deserialize, Serialize};

use super::base::Result;
use super::engine::handle::Store;
use super::keys::{lane_from_prefix, lane_prefix, per_lane};
use crate::protocol::Lane;

/// Where a lane is read up to. `ts` is the message's own, so a later receipt for an older
/// message is recognised without reading history again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadMark {
    pub message_id: String,
    pub ts: i64,
}

impl ReadMark {
    /// Whether this marker is past `other`: later by the messages' timestamps, the id
    /// breaking a tie so two messages of one millisecond have one order.
    pub fn is_past(&self, other: &ReadMark) -> bool {
        (self.ts, &self.message_id) > (other.ts, &other.message_id)
    }
}

impl Store {
    /// Every lane's read marker (one record per lane; lanes are bounded by the directory).
    pub fn read_marks(&self) -> Result<Vec<(Lane, ReadMark)>> {
        per_lane(&self.t()?.read_marks, "read marker")
    }
}

/// The record's key: the lane's, as the other per-lane trees have it.
pub(super) fn key(lane: &Lane) -> Vec<u8> {
    lane_prefix(lane)
}

/// Whether a stored marker's lane is in the channel or thread `id` (deleted with it).
pub(super) fn in_entry(k: &[u8], id: &str) -> bool {
    lane_from_prefix(k)
        .is_some_and(|lane| lane.chat_id == id || lane.thread_id.as_deref() == Some(id))
}

#[cfg(test)]
mod tests {
    use super::super::tests::temp_store;
    use super::super::Change;
    use super::*;

    fn mark(id: &str, ts: i64) -> ReadMark {
        ReadMark {
            message_id: id.into(),
            ts,
        }
    }

    #[test]
    fn one_marker_per_lane_survives_a_reopen_and_goes_with_its_entry() {
        let (dir, store) = temp_store();
        let flat = Lane::new("default", None);
        let thread = Lane::new("default", Some("thr_1"));
        let other = Lane::new("chan_2", None);
        store
            .commit(&[
                Change::MarkRead(flat.clone(), mark("msg_1", 1)),
                Change::MarkRead(flat.clone(), mark("msg_2", 2)),
                Change::MarkRead(thread.clone(), mark("msg_3", 3)),
                Change::MarkRead(other.clone(), mark("msg_4", 4)),
            ])
            .unwrap();
        store.sync_blocking().unwrap();
        drop(store);
        let store = Store::open(dir.path(), 1 << 20, std::time::Duration::from_secs(1)).unwrap();
        let mut marks = store.read_marks().unwrap();
        marks.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            marks,
            vec![
                (other.clone(), mark("msg_4", 4)),
                (flat, mark("msg_2", 2)),
                (thread, mark("msg_3", 3)),
            ]
        );
        // Deleting the thread takes its marker; deleting a channel takes its lanes'.
        store
            .commit(&[
                Change::DeleteChannel("thr_1".into()),
                Change::DeleteChannel("default".into()),
            ])
            .unwrap();
        assert_eq!(store.read_marks().unwrap(), vec![(other, mark("msg_4", 4))]);
    }

    #[test]
    fn a_marker_is_past_another_by_time_then_id() {
        assert!(mark("msg_b", 2).is_past(&mark("msg_a", 1)));
        assert!(!mark("msg_a", 1).is_past(&mark("msg_b", 2)));
        assert!(mark("msg_b", 1).is_past(&mark("msg_a", 1)));
        assert!(!mark("msg_a", 1).is_past(&mark("msg_a", 1)));
    }
}
