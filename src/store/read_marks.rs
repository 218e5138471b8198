//! The household's read state: per lane, the message it has been read up to (the
//! `read.receipt` extension). One small record per lane, written only through `commit`
//! (`Change::MarkRead`), so a marker a device was told of is on disk.

use serde::{Deserialize, Serialize};

use super::history::{lane_from_prefix, lane_prefix};
use super::{from_json, Result, Store};
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
        let mut out = Vec::new();
        for item in self.t()?.read_marks.iter() {
            let (k, v) = item?;
            if let Some(lane) = lane_from_prefix(&k) {
                out.push((lane, from_json(&v, "read marker")?));
            }
        }
        Ok(out)
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
