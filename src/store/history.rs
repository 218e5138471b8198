//! Per-lane message history, paged newest-first without scanning the whole store.
//!
//! The messages live in the history database (`sql.rs`): one row each, with its lane and its
//! position (`seq`, arrival order), and an index on (lane, seq), so a page is one index range
//! read of `limit + 1` rows: its cost does not depend on how much history is stored.

use std::time::Duration;

use crate::protocol::{HistoryMessage, Lane};

use super::base::Result;
use super::engine::handle::Store;

/// One page of a lane's history, in chronological order.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryPage {
    pub messages: Vec<HistoryMessage>,
    pub has_more: bool,
}

impl Store {
    /// The page of up to `limit` messages older than `before` (newest page when `None`), read
    /// on the query thread; with how long that took. `Ok(None)` when `before` is not a message
    /// of this lane: then also the lane it belongs to, if any.
    pub async fn query_history_page(
        &self,
        lane: Lane,
        before: Option<String>,
        limit: usize,
    ) -> Result<(std::result::Result<HistoryPage, Option<Lane>>, Duration)> {
        self.query(move |q| {
            Ok(match page_in(q, &lane, before.as_deref(), limit)? {
                Some(page) => Ok(page),
                None => Err(match &before {
                    Some(id) => q.locate(id)?.map(|(l, _)| l),
                    None => None,
                }),
            })
        })
        .await
    }

    /// `query_history_page` on this thread (tools, tests): it first applies what the journal
    /// holds, so not for the event loop.
    pub fn history_page(
        &self,
        lane: &Lane,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Option<HistoryPage>> {
        self.query_blocking(|q| page_in(q, lane, before, limit))
    }

    /// The stored message with this id, if any (used to tell "unknown" from "other lane").
    pub fn message(&self, message_id: &str) -> Result<Option<(Lane, HistoryMessage)>> {
        self.query_blocking(|q| q.message(message_id))
    }

    /// As [`Store::message`], read on the query thread (for requests from devices).
    pub async fn query_message(
        &self,
        message_id: String,
    ) -> Result<Option<(Lane, HistoryMessage)>> {
        Ok(self.query(move |q| q.message(&message_id)).await?.0)
    }

    /// The media the stored messages among `ids` reference, read on the query thread.
    pub async fn query_media_of(&self, ids: Vec<String>) -> Result<Vec<String>> {
        let (media, _) = self
            .query(move |q| {
                let mut media = Vec::new();
                for id in &ids {
                    if let Some((_, m)) = q.message(id)? {
                        media.extend(m.media.into_iter().map(|r| r.media_id));
                    }
                }
                Ok(media)
            })
            .await?;
        Ok(media)
    }

    /// The id and media of every message of a channel (all its lanes) or of one thread, oldest
    /// first, read on the query thread: what deleting it must remove (`purge_changes`).
    pub async fn query_lane_contents(
        &self,
        chat_id: String,
        thread_id: Option<String>,
    ) -> Result<Vec<(String, Vec<String>)>> {
        let (doomed, _) = self
            .query(move |q| {
                Ok(q.lane_messages(&chat_id, thread_id.as_deref())?
                    .into_iter()
                    .map(|m| {
                        let media = m.media.into_iter().map(|r| r.media_id).collect();
                        (m.message_id, media)
                    })
                    .collect())
            })
            .await?;
        Ok(doomed)
    }

    /// Removes every message of a channel (all its lanes) or of one thread, with its search
    /// entries, and turns its outbox frames into `tombstone(message_id)`, on this thread, in
    /// one commit per message (tools and tests; the hub deletes in bounded batches through its
    /// committer instead: `query_lane_contents`, `purge_changes`). Idempotent, so a crash
    /// half-way is finished by the next call. The history database has the removal once the
    /// caller's next `sync` returns.
    pub fn purge_history(
        &self,
        chat_id: &str,
        thread_id: Option<&str>,
        tombstone: impl Fn(&str) -> bytes::Bytes,
    ) -> Result<(usize, Vec<String>)> {
        self.writable()?;
        let doomed = self.query_blocking(|q| q.lane_messages(chat_id, thread_id))?;
        let mut media = Vec::new();
        for m in &doomed {
            media.extend(m.media.iter().map(|r| r.media_id.clone()));
            self.commit(&[super::change::Change::DeleteMessage {
                tombstone: tombstone(&m.message_id),
                message_id: m.message_id.clone(),
            }])?;
        }
        self.commit(&[super::change::Change::PurgeHistory {
            chat_id: chat_id.to_owned(),
            thread_id: thread_id.map(str::to_owned),
        }])?;
        Ok((doomed.len(), media))
    }
}

/// The changes that delete `ids` (their outbox frames become `tombstone(id)`): one batch of a
/// channel's deletion.
pub fn purge_changes(
    ids: &[String],
    tombstone: impl Fn(&str) -> bytes::Bytes,
) -> Vec<super::change::Change> {
    ids.iter()
        .map(|id| super::change::Change::DeleteMessage {
            tombstone: tombstone(id),
            message_id: id.clone(),
        })
        .collect()
}

fn page_in(
    q: &super::sql_query::Query<'_>,
    lane: &Lane,
    before: Option<&str>,
    limit: usize,
) -> Result<Option<HistoryPage>> {
    let before = match before {
        Some(id) => match q.locate(id)? {
            Some((l, seq)) if &l == lane => Some(seq),
            _ => return Ok(None),
        },
        None => None,
    };
    let mut newest_first = q.page(lane, before, limit)?;
    let has_more = newest_first.len() > limit;
    newest_first.truncate(limit);
    newest_first.reverse();
    Ok(Some(HistoryPage {
        messages: newest_first,
        has_more,
    }))
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
        s.sync_blocking().unwrap();
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
        s.sync_blocking().unwrap();
        assert!(s.message("t1").unwrap().is_none());
        assert!(s.message("m1").unwrap().is_some());
    }
}
