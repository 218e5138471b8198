//! The sled keys of lane-keyed records (`lane_prefix`: the layout-1 prefix of a lane), shared by
//! the subjects that keep one record per lane and by the engine's migration and backups.

use super::base::{from_json, Result};
use crate::protocol::Lane;

/// The layout-1 sled key prefix of a lane (`chat_id 0x00 thread_id 0x00`): still the key of
/// the `todos` and `sessions` trees, and of history entries in backups.
pub(in crate::store) fn lane_prefix(lane: &Lane) -> Vec<u8> {
    let mut k = Vec::with_capacity(lane.chat_id.len() + 24);
    k.extend_from_slice(lane.chat_id.as_bytes());
    k.push(0);
    if let Some(t) = &lane.thread_id {
        k.extend_from_slice(t.as_bytes());
    }
    k.push(0);
    k
}

pub(in crate::store) fn message_key(lane: &Lane, seq: u64) -> Vec<u8> {
    let mut k = lane_prefix(lane);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub(in crate::store) fn lane_from_prefix(prefix: &[u8]) -> Option<Lane> {
    let mut parts = prefix.split(|b| *b == 0);
    let chat = std::str::from_utf8(parts.next()?).ok()?;
    let thread = std::str::from_utf8(parts.next()?).ok()?;
    Some(Lane::new(chat, (!thread.is_empty()).then_some(thread)))
}

/// Every record of a tree keyed by lane (`lane_prefix`): one per lane, so bounded by the
/// directory. `what` names the record in a damage report.
pub(in crate::store) fn per_lane<T: serde::de::DeserializeOwned>(
    tree: &sled::Tree,
    what: &'static str,
) -> Result<Vec<(Lane, T)>> {
    let mut out = Vec::new();
    for item in tree.iter() {
        let (k, v) = item?;
        if let Some(lane) = lane_from_prefix(&k) {
            out.push((lane, from_json(&v, what)?));
        }
    }
    Ok(out)
}
