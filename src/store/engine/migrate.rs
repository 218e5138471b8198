//! Layout 1 → 2, once, on open: history, its ids, the search index and media uses move from
//! sled to the history database; everything else stays in sled as it was.
//!
//! 1. A new history database is built from sled's `messages` tree (each message keeps its
//!    position `seq`, so order within lanes and across them is unchanged; the search index is
//!    rebuilt from the text by FTS5) and `media_uses`, then checkpointed (fsynced).
//! 2. sled's `message_frames` keeps only frames still in the outbox, and gets `frame_of`.
//! 3. The layout record becomes 2, and sled is flushed: from here on the store is layout 2.
//! 4. The old trees (`messages`, `message_ids`, `search`, `media_uses`) are dropped.
//!
//! A crash before 3 leaves a layout-1 store whose half-built database is thrown away and built
//! again at the next start; a crash after 3 leaves old trees that the next open drops
//! (`drop_leftovers`). Devices, tokens, channels, sessions, todos, pending turns, media records,
//! the outbox and its cursors are not touched at all.

use std::path::Path;

use super::commit::META_JOURNAL_V2;
use super::handle::Sled;
use crate::protocol::{HistoryMessage, Lane};
use crate::store::base::{from_json, u64_from, Result, StoreError, META_LAYOUT};
use crate::store::sql::{self, History};

/// Layout-1 trees that layout 2 keeps in the history database instead.
const OLD_TREES: &[&str] = &["messages", "message_ids", "search", "media_uses"];
/// Messages per SQLite transaction while migrating.
const BATCH: usize = 5000;

/// A layout-1 history key: `chat_id 0x00 thread_id 0x00 seq(u64 BE)`.
pub(in crate::store) fn split_key(key: &[u8]) -> Option<(Lane, u64)> {
    let at = key.len().checked_sub(8)?;
    let lane = crate::store::keys::lane_from_prefix(&key[..at])?;
    Some((lane, u64_from(&key[at..])))
}

pub(in crate::store) fn from_layout1(dir: &Path, s: &Sled) -> Result<History> {
    let started = std::time::Instant::now();
    let hist_dir = dir.join(sql::HISTORY_DIR);
    // A database left by a migration that did not finish: built again from sled.
    if hist_dir.exists() {
        std::fs::remove_dir_all(&hist_dir).map_err(|e| StoreError::open_io(dir, e))?;
    }
    let hist = History::open(&sql::history_path(dir), true)?;
    let messages = s.db.open_tree("messages")?;
    let mut rows: Vec<(Lane, u64, HistoryMessage)> = Vec::with_capacity(BATCH);
    let mut count = 0u64;
    for item in messages.iter() {
        let (k, v) = item?;
        let Some((lane, seq)) = split_key(&k) else {
            continue;
        };
        rows.push((lane, seq, from_json(&v, "history message")?));
        if rows.len() == BATCH {
            count += rows.len() as u64;
            hist.import(&rows, &[])?;
            rows.clear();
        }
    }
    count += rows.len() as u64;
    let mut uses = Vec::new();
    for item in s.db.open_tree("media_uses")?.iter() {
        let (k, _) = item?;
        let mut parts = k.splitn(2, |b| *b == 0);
        if let (Some(media), Some(message)) = (parts.next(), parts.next()) {
            uses.push((
                String::from_utf8_lossy(media).into_owned(),
                String::from_utf8_lossy(message).into_owned(),
            ));
        }
    }
    hist.import(&rows, &uses)?;
    hist.set_applied(0)?;
    if hist.checkpoint()?.is_none() {
        return Err(StoreError::Closed(
            "the new history database could not be checkpointed during the migration".into(),
        ));
    }
    std::fs::File::open(&hist_dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::open_io(dir, e))?;
    super::kill_points::kill_point("migrate-history-built", None);

    // Only frames still in the outbox can be tombstoned: the rest of `message_frames` goes.
    let tail = s
        .outbox
        .first()?
        .map(|(k, _)| u64_from(&k))
        .unwrap_or(u64::MAX);
    for item in s.message_frames.iter() {
        let (id, list) = item?;
        let live: Vec<u8> = list
            .chunks(8)
            .filter(|c| u64_from(c) >= tail)
            .flatten()
            .copied()
            .collect();
        if live.is_empty() {
            s.message_frames.remove(&id)?;
            continue;
        }
        for c in live.chunks(8) {
            s.frame_of.insert(c, id.as_ref())?;
        }
        if live.len() != list.len() {
            s.message_frames.insert(&id, live)?;
        }
    }
    s.meta.insert(META_JOURNAL_V2, &0u64.to_be_bytes())?;
    super::kill_points::kill_point("migrate-frames", Some(&s.db));
    // Layout 2 here; `init_layout` then upgrades it to 3 like any layout-2 store.
    s.meta.insert(META_LAYOUT, &2u64.to_be_bytes())?;
    s.db.flush()?;
    super::kill_points::kill_point("migrate-layout2", None);
    drop_leftovers(s)?;
    tracing::info!(
        messages = count,
        media_uses = uses.len(),
        ms = started.elapsed().as_millis() as u64,
        "store migrated from layout 1: history, search and media uses are now in {}",
        sql::history_path(dir).display()
    );
    Ok(hist)
}

/// Drops layout-1 trees a layout-2 store still has (a crash right after the layout record
/// changed).
pub(in crate::store) fn drop_leftovers(s: &Sled) -> Result<()> {
    let names = s.db.tree_names();
    let mut dropped = false;
    for name in OLD_TREES {
        if names.iter().any(|n| n.as_ref() == name.as_bytes()) {
            s.db.drop_tree(name.as_bytes())?;
            dropped = true;
        }
    }
    if dropped {
        s.db.flush()?;
    }
    Ok(())
}
