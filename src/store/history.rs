//! Per-lane message history, paged newest-first without scanning the whole store.
//!
//! Key: `chat_id 0x00 thread_id 0x00 seq(u64 BE)`, with an empty thread_id for a channel's flat
//! lane. Ids cannot contain NUL (protocol::is_valid_id), so a lane's messages are exactly one key
//! prefix and a page is one reverse range scan of `limit + 1` keys: its cost does not depend on
//! how much history is stored. `message_ids` maps a message id back to its key.

use crate::protocol::{HistoryMessage, Lane};

use super::{from_json, Result, Store};

/// One page of a lane's history, in chronological order.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryPage {
    pub messages: Vec<HistoryMessage>,
    pub has_more: bool,
}

pub(super) fn lane_prefix(lane: &Lane) -> Vec<u8> {
    let mut k = Vec::with_capacity(lane.chat_id.len() + 24);
    k.extend_from_slice(lane.chat_id.as_bytes());
    k.push(0);
    if let Some(t) = &lane.thread_id {
        k.extend_from_slice(t.as_bytes());
    }
    k.push(0);
    k
}

pub(super) fn message_key(lane: &Lane, seq: u64) -> Vec<u8> {
    let mut k = lane_prefix(lane);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn lane_from_prefix(prefix: &[u8]) -> Option<Lane> {
    let mut parts = prefix.split(|b| *b == 0);
    let chat = std::str::from_utf8(parts.next()?).ok()?;
    let thread = std::str::from_utf8(parts.next()?).ok()?;
    Some(Lane::new(chat, (!thread.is_empty()).then_some(thread)))
}

impl Store {
    /// The page of up to `limit` messages older than `before` (newest page when `None`).
    /// `Ok(None)` when `before` is not a message of this lane.
    pub fn history_page(
        &self,
        lane: &Lane,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Option<HistoryPage>> {
        let prefix = lane_prefix(lane);
        let upper = match before {
            Some(id) => match self.t()?.message_ids.get(id.as_bytes())? {
                Some(key) if key.starts_with(&prefix) => key.to_vec(),
                _ => return Ok(None),
            },
            None => {
                let mut end = prefix.clone();
                end.extend_from_slice(&u64::MAX.to_be_bytes());
                end.push(0xff);
                end
            }
        };
        let mut newest_first = Vec::with_capacity(limit + 1);
        for item in self
            .t()?
            .messages
            .range(prefix.as_slice()..upper.as_slice())
            .rev()
            .take(limit + 1)
        {
            let (_, v) = item?;
            newest_first.push(from_json::<HistoryMessage>(&v, "history message")?);
        }
        let has_more = newest_first.len() > limit;
        newest_first.truncate(limit);
        newest_first.reverse();
        Ok(Some(HistoryPage {
            messages: newest_first,
            has_more,
        }))
    }

    /// The stored message with this id, if any (used to tell "unknown" from "other lane").
    pub fn message(&self, message_id: &str) -> Result<Option<(Lane, HistoryMessage)>> {
        let Some(key) = self.t()?.message_ids.get(message_id.as_bytes())? else {
            return Ok(None);
        };
        let Some(v) = self.t()?.messages.get(&key)? else {
            return Ok(None);
        };
        let lane_len = key.len().saturating_sub(8);
        let lane = lane_from_prefix(&key[..lane_len]).unwrap_or_else(|| Lane::new("", None));
        Ok(Some((lane, from_json(&v, "history message")?)))
    }

    /// Removes every message of a channel (all its lanes) or of one thread, with its search
    /// postings, and turns its outbox frames into `tombstone(message_id)`. Used when a channel or
    /// thread is deleted; idempotent, so a crash half-way is finished by the next call.
    pub fn purge_history(
        &self,
        chat_id: &str,
        thread_id: Option<&str>,
        tombstone: impl Fn(&str) -> bytes::Bytes,
    ) -> Result<(usize, Vec<String>)> {
        let mut prefix = chat_id.as_bytes().to_vec();
        prefix.push(0);
        if let Some(t) = thread_id {
            prefix.extend_from_slice(t.as_bytes());
            prefix.push(0);
        }
        self.writable()?;
        let mut removed = 0;
        let mut media = Vec::new();
        let t = self.t()?;
        for item in t.messages.scan_prefix(&prefix) {
            let (k, v) = item?;
            if let Ok(m) = from_json::<HistoryMessage>(&v, "history message") {
                media.extend(m.media.iter().map(|r| r.media_id.clone()));
                self.commit(&[super::Change::DeleteMessage {
                    tombstone: tombstone(&m.message_id),
                    message_id: m.message_id,
                }])?;
            }
            t.messages.remove(k)?;
            removed += 1;
        }
        Ok((removed, media))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{msg, temp_store};
    use super::super::Change;
    use super::*;

    #[test]
    fn pages_newest_first_without_overlap() {
        let (_d, s) = temp_store();
        let lane = Lane::new("default", None);
        let other = Lane::new("default", Some("thr_1"));
        for i in 0..7 {
            s.commit(&[
                Change::PutMessage(lane.clone(), msg(&format!("m{i}"), "x")),
                Change::PutMessage(other.clone(), msg(&format!("t{i}"), "y")),
            ])
            .unwrap();
        }
        let p1 = s.history_page(&lane, None, 3).unwrap().unwrap();
        let ids = |p: &HistoryPage| {
            p.messages
                .iter()
                .map(|m| m.message_id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&p1), ["m4", "m5", "m6"]);
        assert!(p1.has_more);
        let p2 = s.history_page(&lane, Some("m4"), 3).unwrap().unwrap();
        assert_eq!(ids(&p2), ["m1", "m2", "m3"]);
        let p3 = s.history_page(&lane, Some("m1"), 3).unwrap().unwrap();
        assert_eq!(ids(&p3), ["m0"]);
        assert!(!p3.has_more);
        // A thread's id is not a valid cursor in its parent's flat lane.
        assert!(s.history_page(&lane, Some("t3"), 3).unwrap().is_none());
        let gone = |_: &str| bytes::Bytes::from_static(b"{\"v\":1,}");
        assert_eq!(
            s.purge_history("default", Some("thr_1"), gone).unwrap().0,
            7
        );
        assert!(s.message("t1").unwrap().is_none());
        assert!(s.message("m1").unwrap().is_some());
    }
}
